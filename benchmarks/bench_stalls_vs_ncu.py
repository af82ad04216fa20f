"""Stall breakdowns of short library kernels against Nsight Compute, launch by launch, by kernel length.

Run on the GPU machine from the repository root (PyTorch and CuPy are installed there; they are test workloads,
not gpuscope dependencies):

    source tests/gpu/device_env.sh; python3 benchmarks/bench_stalls_vs_ncu.py --out $OUT/stalls

The workload is :class:`probe_pass_consistency.Work` (``benchmarks/probes/``): a PyTorch training step (MLP block, bf16 autocast, fused
AdamW), CuPy 1 M-element elementwise kernels, a reduction and a small GEMM, and two long Numba kernels; ``--reps``
steps after two warm-up steps. gpuscope collects the ``topdown`` set in kernel mode and in iteration mode, each with
its consistent pass plan (the default) and with CUPTI's own schedule (``pass_groups="cupti"``, what gpuscope did
before); ``ncu --clock-control none --cache-control none`` collects the same metrics on the same launches, twice.
Per launch: the largest difference over the 18 ``*_per_warp_active.pct`` stall shares (percentage points), the sum
of the shares, and the level-2 verdict of the Top-Down, against ``ncu_1``; ``ncu_2`` against ``ncu_1`` is the
yardstick. Writes ``stalls.json`` (every row) and ``fixture_*.npz`` (one rep's CuPy and Numba launches with
``max_ranges=8``: the counter-data image, config and metric lists, for CPU tests), and prints the table.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent / "probes"))  # its workload is the probe's

from probe_pass_consistency import PCT, REASONS, ImageTap, Work, run_ncu  # noqa: E402

BUCKETS = (("< 10 us", 0, 10), ("10-50 us", 10, 50), (">= 50 us", 50, np.inf))


def collect(work, reps, metrics, mode, pass_groups):
    import gpuscope as gs

    t0 = time.perf_counter()
    with gs.Profiler(metrics=metrics, mode=mode, pass_groups=pass_groups) as prof:
        for _ in range(reps + (prof.passes + 1 if mode == "iteration" else 0)):
            work.step()
            if mode == "iteration":
                prof.step()
    ds = prof.dataset
    wall = time.perf_counter() - t0
    rows = [{"kernel": str(k)} for k in ds["kernel"].values]
    anchors = [a for a in ds.attrs.get("pass_anchors", []) if a in ds and a not in metrics]
    for m in [*metrics, *anchors]:
        for row, v in zip(rows, ds[m].values):
            row[m] = float(v)
    td = gs.topdown(ds, check="ignore")
    for c in ("pass_spread", "consistent"):
        if c in td.coords:
            for row, v in zip(rows, td[c].values):
                row[c] = float(v)
    return {"rows": rows, "wall_s": wall, "passes": prof.passes, "pass_plan": ds.attrs.get("pass_plan", ""),
            "launches": len(rows), "pass_anchors": anchors}


def fixture(work, metrics, pass_groups, path):
    """One rep's CuPy and Numba launches in kernel mode, the image kept for the CPU tests."""
    import gpuscope as gs

    with ImageTap() as tap:
        with gs.Profiler(metrics=metrics, mode="kernel", pass_groups=pass_groups, max_ranges=8,
                         kernels="regex:cupy|DeviceReduce|gemm|stream|fma") as prof:
            work.step()
        ds = prof.dataset
    plan = prof._plan
    metrics = list(plan.requested) if plan else metrics  # with the pass anchors
    np.savez_compressed(path, image=tap.images[-1], config=np.asarray(prof._config),
                        metrics=np.array(metrics), collected=np.array(plan.collected if plan else metrics),
                        kernels=np.array([str(k) for k in ds["kernel"].values]),
                        values=np.array([[float(ds[m].values[i]) for m in metrics] for i in range(ds.sizes["range"])]),
                        groups=np.array(["|".join(g) for g in (plan.groups if plan else prof._groups)]))
    return len(tap.images)


def verdicts(rows, metrics):
    import xarray as xr

    import gpuscope as gs
    from gpuscope._results.report_topdown import _verdict

    ds = xr.Dataset({m: ("range", [r[m] for r in rows]) for m in metrics}, attrs={"compute_capability": "9.0"})
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        td = gs.topdown(ds, check="ignore")
    names = [n for n in td.data_vars if "level" in td[n].attrs]
    return [_verdict({n: float(td[n].values[i]) for n in names})[0] for i in range(len(rows))]


def compare(results, metrics):
    ref = results["ncu_1"]["rows"]
    dur = np.array([r["gpu__time_duration.sum"] for r in ref]) / 1e3
    share = lambda rows: np.array([[r[PCT.format(x)] for x in REASONS] for r in rows])  # noqa: E731
    base = share(ref)
    ref_verdict = verdicts(ref, metrics)
    table = {}
    for name, res in results.items():
        if name == "ncu_1" or "rows" not in res:
            continue
        rows = res["rows"]
        n = len(rows)  # iteration mode: one step's launches, compared with ncu's first step
        if n > len(ref):
            table[name] = {"error": f"{len(rows)} rows against ncu's {len(ref)}"}
            continue
        s = share(rows)
        diff = np.nanmax(np.abs(s - base[:n]), axis=1)
        total = np.nansum(s, axis=1)
        verdict = verdicts(rows, metrics)
        dur_n = dur[:n]
        entry = {"launches": len(rows), "wall_s": res["wall_s"], "ms_per_launch": 1e3 * res["wall_s"] / len(rows)}
        consistent = np.array([bool(r.get("consistent", True)) for r in rows])
        for label, lo, hi in BUCKETS:
            sel = (dur_n >= lo) & (dur_n < hi)
            if sel.any():
                entry[label] = {"n": int(sel.sum()), "median_max_diff": float(np.median(diff[sel])),
                                "max_max_diff": float(np.max(diff[sel])), "sum_median": float(np.median(total[sel])),
                                "sum_within_5": float(np.mean(np.abs(total[sel] - 100) <= 5)),
                                "verdict_agrees": float(np.mean([verdict[i] == ref_verdict[i]
                                                                 for i in np.flatnonzero(sel)]))}
                if "consistent" in rows[0]:  # the launches gpuscope gives a verdict for, and the others
                    ok, bad = sel & consistent, sel & ~consistent
                    entry[label].update(
                        consistent=int(ok.sum()),
                        median_max_diff_consistent=float(np.median(diff[ok])) if ok.any() else None,
                        median_max_diff_inconsistent=float(np.median(diff[bad])) if bad.any() else None,
                        verdict_agrees_consistent=float(np.mean([verdict[i] == ref_verdict[i]
                                                                 for i in np.flatnonzero(ok)])) if ok.any() else None)
        table[name] = entry
    return table


def print_table(table):
    print("| run | bucket | launches | median max diff (pp) | max | shares sum, median | within 100 +/- 5 | "
          "verdict = ncu_1 |")
    print("|---|---|---|---|---|---|---|---|")
    for name, entry in table.items():
        for label, _, _ in BUCKETS:
            b = entry.get(label)
            if b:
                print(f"| {name} | {label} | {b['n']} | {b['median_max_diff']:.1f} | {b['max_max_diff']:.1f} | "
                      f"{b['sum_median']:.1f} | {100 * b['sum_within_5']:.0f}% | {100 * b['verdict_agrees']:.0f}% |")
    print("launches gpuscope calls consistent (pass_spread <= 10%, shares within 100 +/- 5%), and the others:")
    for name, entry in table.items():
        for label, _, _ in BUCKETS:
            b = entry.get(label)
            if b and "consistent" in b:
                fmt = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
                print(f"  {name} {label}: {b['consistent']} of {b['n']} consistent, median max diff "
                      f"{fmt(b['median_max_diff_consistent'])} (the others {fmt(b['median_max_diff_inconsistent'])})"
                      f", verdict = ncu_1 on consistent {fmt(100 * b['verdict_agrees_consistent'] if b['verdict_agrees_consistent'] is not None else None)}%")
    print("cost (wall of the whole session / launches):")
    for name, entry in table.items():
        if "ms_per_launch" in entry:
            print(f"  {name}: {entry['wall_s']:.1f} s, {entry['ms_per_launch']:.1f} ms/launch")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--ncu", default=shutil.which("ncu") or "/usr/local/cuda/bin/ncu")
    ap.add_argument("--out", default="stalls_out")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import gpuscope as gs

    metrics = list(gs.metric_set("topdown").metrics)
    work = Work()
    work.step()
    work.step()
    results = {}
    for mode in ("kernel", "iteration"):
        for label, groups in (("plan", None), ("cupti", "cupti")):
            name = f"{mode}_{label}"
            try:
                results[name] = collect(work, args.reps, metrics, mode, groups)
                print(f"{name}: {results[name]['launches']} rows, {results[name]['passes']} passes, "
                      f"{results[name]['wall_s']:.1f} s", flush=True)
            except Exception as exc:
                results[name] = {"error": repr(exc)}
                print(f"{name}: {exc!r}", flush=True)
    for label, groups in (("plan", None), ("cupti", "cupti")):
        try:
            fixture(work, metrics, groups, out / f"fixture_{label}.npz")
        except Exception as exc:
            print(f"fixture {label}: {exc!r}", flush=True)
    gs.release()  # the kept profiler would make ncu's child wait for the counters
    for k in (1, 2):
        try:
            results[f"ncu_{k}"] = run_ncu(args.ncu, metrics, args.reps)
            print(f"ncu_{k}: {len(results[f'ncu_{k}']['rows'])} rows, {results[f'ncu_{k}']['wall_s']:.1f} s",
                  flush=True)
        except Exception as exc:
            results[f"ncu_{k}"] = {"error": repr(exc)}
            print(f"ncu_{k}: {exc!r}", flush=True)
    (out / "stalls.json").write_text(json.dumps(results))
    table = compare(results, metrics)
    (out / "table.json").write_text(json.dumps(table, indent=1))
    print_table(table)


if __name__ == "__main__":
    main()
