"""GPU time with a verdict, by mode and set, and the Top-Down and section values against Nsight Compute, launch by
launch (issue 51).

Run on the GPU machine from the repository root (PyTorch, CuPy and Numba are workloads there, not dependencies):

    source tests/gpu/device_env.sh; python3 benchmarks/bench_verdicts.py --out $OUT/verdicts

For each workload of ``benchmarks/short_kernels.py`` (``--workloads``: ``transformer``, a transformer layer's training
step with cuBLAS GEMMs, the step of the issue; ``short``, a PyTorch MLP step, CuPy and Numba kernels), in one
process after a warm-up session: gpuscope's kernel mode with ``topdown`` (``--reps`` steps) and with ``full`` (one
step), and iteration mode with ``topdown`` (one step's launches); then, in child processes over the same launches,
ncu with the ``topdown`` metrics twice and with the ``full`` set's metrics twice (``--clock-control none
--cache-control none``). Per gpuscope run: the share of GPU time (ncu's durations) and of launches with a verdict
(``decided``) and with passes that agree (``consistent``), ``pass_spread`` median and p90; against ``ncu_1``, by
length bucket, the median over launches of the largest Top-Down level-2 node difference (points of peak issue
slots, the shares over their sum) and of the largest raw stall-share difference, and whether the level-2 verdict is
ncu's, with ``ncu_2`` against ``ncu_1`` the yardstick. For ``full``: each section value's median difference from ncu's
(percentage points for percentages, percent for the rest) beside ncu's own, and the duration's ratio. Writes
``verdicts.json`` and prints the tables.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_stalls_vs_ncu import BUCKETS, shares, topdown_nodes, verdicts  # noqa: E402
from short_kernels import WORKLOADS, run_ncu  # noqa: E402

#: Section values compared with ncu's (``full``): percentages in points, the others in percent of ncu's.
SECTIONS = ("sm__throughput.avg.pct_of_peak_sustained_elapsed",
            "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
            "l1tex__throughput.avg.pct_of_peak_sustained_active", "lts__throughput.avg.pct_of_peak_sustained_elapsed",
            "dram__throughput.avg.pct_of_peak_sustained_elapsed", "sm__warps_active.avg.pct_of_peak_sustained_active",
            "lts__t_sector_hit_rate.pct", "l1tex__t_sector_hit_rate.pct",
            "smsp__inst_executed.avg.per_cycle_active", "sm__warps_active.avg.per_cycle_active",
            "smsp__inst_executed.sum", "dram__bytes_read.sum", "gpu__time_duration.sum", "sm__cycles_elapsed.max")


#: Steps an auto-mode session runs beyond --reps: the loop is found after three repeats, then one step per pass.
AUTO_STEPS = 12


def collect(work, reps, metrics, mode):
    """A session's rows: every metric, and gs.topdown's quality coordinates of each launch."""
    import gpuscope as gs

    t0 = time.perf_counter()
    with gs.Profiler(metrics=metrics, mode=mode) as prof:
        for _ in range(reps + (prof.passes + 1 if mode == "iteration" else 0) + (AUTO_STEPS if mode == "auto" else 0)):
            work.step()
            if mode == "iteration":
                prof.step()
    ds = prof.dataset
    wall = time.perf_counter() - t0
    if "passes_from_earlier_group" in ds.coords:  # one complete pass group: one step's launches
        ds = ds.isel(range=np.flatnonzero(ds["passes_from_earlier_group"].values == 0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        td = gs.topdown(ds, check="ignore")
    rows = [{"kernel": str(k)} for k in ds["kernel"].values]
    for m in ds.data_vars:
        if ds[m].dims == ("range",) and np.issubdtype(ds[m].dtype, np.number):
            for row, v in zip(rows, ds[m].values):
                row[m] = float(v)
    for c in ("pass_spread", "consistent", "decided", "culprit_decided", "verdict_margin", "topdown_uncertainty"):
        if c in td.coords:
            for row, v in zip(rows, td[c].values):
                row[c] = float(v)
    return {"rows": rows, "wall_s": wall, "passes": prof.passes, "launches": len(rows), "mode": mode}


def _nodes(rows, metrics):
    return topdown_nodes({m: np.array([r.get(m, np.nan) for r in rows], dtype=float) for m in metrics})


def _rates(rows, weights, agrees=None) -> dict:
    """The verdict rates of a run's *rows*: the share of *weights* (GPU time) and of launches that are ``decided``,
    ``consistent`` and ``culprit_decided``, each flag's agreement with ncu where *agrees* (per row) is given, and
    ``pass_spread``'s median and p90."""
    entry = {}
    for flag in ("decided", "consistent", "culprit_decided"):
        if flag in rows[0]:
            ok = np.array([bool(r[flag]) for r in rows])
            entry[f"{flag}_time"] = float(np.nansum(weights[ok]) / np.nansum(weights))
            entry[f"{flag}_launches"] = float(ok.mean())
            if agrees is not None:
                entry[f"verdict_agrees_{flag}"] = float(agrees[ok].mean()) if ok.any() else None
    if "pass_spread" in rows[0]:
        sp = np.array([r["pass_spread"] for r in rows])
        entry["spread_median"], entry["spread_p90"] = float(np.nanmedian(sp)), float(np.nanpercentile(sp, 90))
    return entry


def verdict_table(results, topdown_metrics):
    """Per gpuscope run: the verdict rates, and the agreement with ncu_1 by bucket (ncu_2 the yardstick)."""
    ref = results.get("ncu_1", {}).get("rows")
    if not ref:
        return {}
    dur = np.array([r["gpu__time_duration.sum"] for r in ref]) / 1e3
    base2, base_sh = _nodes(ref, topdown_metrics)[2], shares(ref)
    base_verdict = verdicts(ref, topdown_metrics)
    table = {}
    for name, res in results.items():
        rows = res.get("rows")
        if not rows or name == "ncu_1" or name.startswith("ncu_full"):
            continue
        entry = {"launches": len(rows), "wall_s": res.get("wall_s"), "passes": res.get("passes")}
        if name.startswith("auto"):  # its rows are the loop's iterations as found (no launch order to pair with
            # ncu's): the verdict rates, weighted by its own durations
            own = np.array([r.get("gpu__time_duration.sum", np.nan) for r in rows])
            table[name] = {**entry, **_rates(rows, own)}
            continue
        n = min(len(rows), len(ref))
        if len(rows) > len(ref):
            table[name] = {"error": f"{len(rows)} rows against ncu's {len(ref)}"}
            continue
        mine2 = _nodes(rows, topdown_metrics)[2]
        node_diff = np.nanmax(np.abs(mine2[1] - base2[1][:n]), axis=1)
        share_diff = np.nanmax(np.abs(shares(rows) - base_sh[:n]), axis=1)
        verdict = verdicts(rows, topdown_metrics)
        agrees = np.array([verdict[i] == base_verdict[i] for i in range(n)])
        w = dur[:n]
        entry.update(launches=n, **_rates(rows, w, agrees))
        entry["verdict_agrees_all"] = float(agrees.mean())
        own = np.array([r.get("gpu__time_duration.sum", np.nan) for r in rows]) / 1e3
        for label, lo, hi in BUCKETS:
            sel = (w >= lo) & (w < hi)
            if sel.any():
                entry[label] = {"n": int(sel.sum()), "node_diff": float(np.median(node_diff[sel])),
                                "share_diff": float(np.median(share_diff[sel])),
                                "duration_ratio": float(np.nanmedian(own[sel] / w[sel]))}
        table[name] = entry
    return table


def section_table(results, metrics):
    """gpuscope's full set against ncu_full_1 per section value (ncu_full_2 the yardstick): median and max of the
    per-launch difference."""
    ref = results.get("ncu_full_1", {}).get("rows")
    if not ref:
        return {}
    out = {}
    for name in ("kernel_full", "ncu_full_2"):
        rows = results.get(name, {}).get("rows")
        if not rows or len(rows) != len(ref):
            out[name] = {"error": f"{len(rows or [])} rows against ncu's {len(ref)}"}
            continue
        entry = {}
        for m in metrics:
            a = np.array([r.get(m, np.nan) for r in rows], dtype=float)
            b = np.array([r.get(m, np.nan) for r in ref], dtype=float)
            if not np.isfinite(a).any() or not np.isfinite(b).any():
                continue
            with np.errstate(invalid="ignore", divide="ignore"):
                d = np.abs(a - b) if m.endswith(".pct") or "pct_of_peak" in m else 100 * np.abs(a - b) / np.abs(b)
            if np.isfinite(d).any():
                entry[m] = {"median": float(np.nanmedian(d)), "max": float(np.nanmax(d))}
        out[name] = entry
    return out


def run_workload(name, args, out):
    import gpuscope as gs

    topdown = list(gs.metric_set("topdown").metrics)
    from gpuscope._gpu import metric_lists

    full = list(metric_lists.resolve("full", "GH100"))  # the chip these runs are made on (H100, H200)
    work = WORKLOADS[name]()
    work.step()
    work.step()
    results = {}
    t0 = time.perf_counter()
    collect(work, 1, topdown, "kernel")  # a first session costs more: thrown away
    print(f"[{name}] warm-up session {time.perf_counter() - t0:.1f} s", flush=True)

    def run(label, make):
        try:
            results[label] = res = make()
            print(f"[{name}] {label}: {res['launches']} rows, {res['passes']} passes, {res['wall_s']:.1f} s", flush=True)
        except Exception as exc:  # one failed run leaves the others
            results[label] = {"error": repr(exc)}
            print(f"[{name}] {label}: {exc!r}", flush=True)

    run("kernel_topdown", lambda: collect(work, args.reps, topdown, "kernel"))
    run("kernel_full", lambda: collect(work, 1, "full", "kernel"))
    run("iteration_topdown", lambda: collect(work, 1, topdown, "iteration"))
    run("auto_topdown", lambda: collect(work, 0, topdown, "auto"))
    gs.release()  # the kept profiler would make ncu's child wait for the counters
    child = [str(Path(__file__).resolve().parent / "short_kernels.py"), "workload", "--workload", name]
    for k in (1, 2):
        for label, metrics, reps in (("ncu", topdown, args.reps), ("ncu_full", full, 1)):
            if metrics is None or (label == "ncu_full" and args.no_ncu_full):
                continue
            try:
                res = run_ncu(args.ncu, metrics, reps, child=[*child, "--reps", str(reps)])
                res["launches"] = len(res["rows"])
                results[f"{label}_{k}"] = res
                print(f"[{name}] {label}_{k}: {len(res['rows'])} rows, {res['wall_s']:.1f} s", flush=True)
            except Exception as exc:
                results[f"{label}_{k}"] = {"error": repr(exc)}
                print(f"[{name}] {label}_{k}: {exc!r}", flush=True)
    # kernel_full is one step: its rows against the first step of ncu's topdown runs
    verdicts = verdict_table(results, topdown)
    sections = section_table(results, [m for m in SECTIONS if full is None or m in full])
    (out / f"verdicts_{name}.json").write_text(json.dumps({"results": results, "verdicts": verdicts,
                                                           "sections": sections}))
    return verdicts, sections


def print_tables(name, verdicts, sections):
    print(f"\n## {name}: verdicts and the Top-Down against ncu_1 (ncu_2 the yardstick)")
    print("| run | launches | passes | GPU time with a verdict | launches with one | consistent (time) | culprit "
          "(time) | spread median / p90 | verdict = ncu_1 | " + " | ".join(
              f"{b[0]}: n, level-2 node diff, share diff, duration ratio" for b in BUCKETS) + " |")
    print("|" + "---|" * (9 + len(BUCKETS)))
    for run, e in verdicts.items():
        if "error" in e:
            print(f"| {run} | {e['error']} |")
            continue
        pct = lambda k: "-" if e.get(k) is None else f"{100 * e[k]:.0f}%"  # noqa: E731
        buckets = " | ".join(f"{e[b[0]]['n']}, {e[b[0]]['node_diff']:.1f}, {e[b[0]]['share_diff']:.1f}, "
                             f"{e[b[0]]['duration_ratio']:.2f}" if b[0] in e else "-" for b in BUCKETS)
        spread = f"{e['spread_median']:.1f} / {e['spread_p90']:.1f}" if "spread_median" in e else "-"
        print(f"| {run} | {e['launches']} | {e.get('passes') or '-'} | {pct('decided_time')} | "
              f"{pct('decided_launches')} | {pct('consistent_time')} | {pct('culprit_decided_time')} | {spread} | "
              f"{pct('verdict_agrees_all')} | {buckets} |")
    if sections:
        print(f"\n## {name}: full set's section values against ncu_full_1 (median / max per launch; points for "
              "percentages, % of ncu's for the rest)")
        print("| metric | gpuscope | ncu_2 (yardstick) |")
        print("|---|---|---|")
        metrics = sorted({m for e in sections.values() if "error" not in e for m in e})
        for m in metrics:
            cells = []
            for run in ("kernel_full", "ncu_full_2"):
                v = sections.get(run, {}).get(m)
                cells.append(f"{v['median']:.1f} / {v['max']:.1f}" if v else "-")
            print(f"| {m} | {cells[0]} | {cells[1]} |")
        for run in ("kernel_full", "ncu_full_2"):
            if "error" in sections.get(run, {}):
                print(f"{run}: {sections[run]['error']}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workloads", default="transformer,short")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--ncu", default=shutil.which("ncu") or "/usr/local/cuda/bin/ncu")
    ap.add_argument("--no-ncu-full", action="store_true", help="skip ncu's runs of the full set (the slowest)")
    ap.add_argument("--out", default="verdicts_out")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tables = {}
    for name in args.workloads.split(","):
        tables[name] = run_workload(name, args, out)
    for name, (rates, sections) in tables.items():
        print_tables(name, rates, sections)


if __name__ == "__main__":
    main()
