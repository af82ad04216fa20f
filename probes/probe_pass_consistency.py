"""Probe: where stall shares of short kernels go wrong, pass by pass, against ncu on the same launches.

Run on the GPU machine from the repository root (PyTorch and CuPy installed there; neither is a gpuscope
dependency):

    source tests/gpu/device_env.sh; python3 probes/probe_pass_consistency.py --out $OUT/probe

The workload (``workload()``) is one PyTorch training step of a small MLP block (bf16 autocast, fused AdamW: about
30 launches of 2-50 us), five CuPy launches on 1 M elements (elementwise, a reduction, a small GEMM) and the two
long Numba kernels of ``benchmarks/workloads.py`` (stream ~0.2 ms, FMA ~0.5 ms), repeated ``--reps`` times after
one warm-up. Every session is kernel mode (CUPTI kernel replay), launch by launch:

* ``topdown``: the ``topdown`` set as CUPTI schedules it (7 passes) plus ``smsp__warps_active.sum``;
* ``grouped``: the raw counters in pass groups of our own, each with its own denominator
  (``sm__warps_active.sum``), three stall reasons per group, every group one pass;
* ``grouped_pct``: the set's ``*_per_warp_active.pct`` metrics two per group (each ratio's counters in one pass);
* ``single_<k>``: each group of ``grouped`` as a session of its own (one pass): the value of each counter in the
  pass that collected it, to compare with what the grouped image evaluates to;
* ``ncu_1``, ``ncu_2``: ``ncu --clock-control none --cache-control none`` on the same launches, twice.

Writes ``probe.json`` (per session and launch: kernel name and every value) and ``images_<session>.npz`` (the
counter-data images and the config image of ``topdown`` and ``grouped``, for CPU tests), and prints a summary.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # benchmarks/: workloads, the benchmarks reused
sys.path.insert(0, str(Path(__file__).resolve().parent))

from short_kernels import DENOM, PCT, RAW, REASONS, ImageTap, Work, run_ncu, session, workload  # noqa: E402,F401


def raw_groups():
    groups = [[RAW.format(r) for r in REASONS[i:i + 3]] + list(DENOM) for i in range(0, len(REASONS), 3)]
    groups.append(["smsp__inst_executed.sum", "smsp__inst_issued.sum", "smsp__thread_inst_executed.sum",
                   "smsp__cycles_active.sum", "smsp__warps_active.sum", *DENOM])
    return groups


def summary(results):
    """Per session: the stall-share sum and the largest share difference to ncu_1, by duration bucket."""
    ncu = results["ncu_1"]["rows"]
    dur = np.array([r["gpu__time_duration.sum"] for r in ncu]) / 1e3  # us

    def shares_pct(rows):
        return np.array([[r.get(PCT.format(x), np.nan) for x in REASONS] for r in rows])

    def shares_grouped(rows):
        return np.array([[100 * r[RAW.format(x)] / r["sm__warps_active.sum"] for x in REASONS] for r in rows])

    ref = shares_pct(ncu)
    out = {}
    for name, res in results.items():
        if name.startswith("single") or "rows" not in res:
            continue
        rows = res["rows"]
        if len(rows) != len(ncu):
            out[name] = f"{len(rows)} rows against ncu's {len(ncu)}"
            continue
        s = shares_grouped(rows) if name == "grouped" else shares_pct(rows)
        diff = np.nanmax(np.abs(s - ref), axis=1)
        total = np.nansum(s, axis=1)
        buckets = {}
        for label, sel in (("<10us", dur < 10), ("10-50us", (dur >= 10) & (dur < 50)), (">=50us", dur >= 50),
                           ("all", dur >= 0)):
            if sel.any():
                buckets[label] = {"n": int(sel.sum()), "median_max_diff": float(np.median(diff[sel])),
                                  "max_max_diff": float(np.max(diff[sel])),
                                  "sum_median": float(np.median(total[sel])),
                                  "sum_within_5": float(np.mean(np.abs(total[sel] - 100) <= 5))}
        out[name] = buckets
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", nargs="?", default="probe")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--ncu", default=shutil.which("ncu") or "/usr/local/cuda/bin/ncu")
    ap.add_argument("--out", default="probe_out")
    args = ap.parse_args()
    if args.mode == "workload":
        workload(args.reps, profile_start=True)
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import gpuscope as gs

    topdown = list(gs.metric_set("topdown").metrics)
    work = Work()
    work.step()
    work.step()
    results = {}
    groups = raw_groups()
    flat = list(dict.fromkeys(m for g in groups for m in g))
    pct_groups = [[PCT.format(r) for r in REASONS[i:i + 2]] for i in range(0, len(REASONS), 2)]
    plan = [("topdown", topdown + ["smsp__warps_active.sum"], None, True),
            ("grouped", flat, groups, True),
            ("grouped_pct", topdown + ["smsp__warps_active.sum"], pct_groups, False)]
    plan += [(f"single_{k}", g, None, False) for k, g in enumerate(groups)]
    for name, metrics, grp, keep in plan:
        try:
            if keep:
                with ImageTap() as tap:
                    res = session(work, args.reps, metrics, grp, tap)
                np.savez_compressed(out / f"images_{name}.npz", config=np.asarray(res.pop("config")),
                                    **{f"image_{i}": im for i, im in enumerate(tap.images)})
            else:
                res = session(work, args.reps, metrics, grp)
                res.pop("config")
            res["metrics"], res["groups"] = metrics, grp
            results[name] = res
            print(f"{name}: {len(res['rows'])} rows, {res['passes']} passes, {res['wall_s']:.1f} s", flush=True)
        except Exception as exc:  # a probe: record and go on
            results[name] = {"error": repr(exc)}
            print(f"{name}: {exc!r}", flush=True)
    ncu_metrics = topdown + ["smsp__warps_active.sum"]
    for k in (1, 2):
        try:
            results[f"ncu_{k}"] = run_ncu(args.ncu, ncu_metrics, args.reps)
            print(f"ncu_{k}: {len(results[f'ncu_{k}']['rows'])} rows, {results[f'ncu_{k}']['wall_s']:.1f} s")
        except Exception as exc:
            results[f"ncu_{k}"] = {"error": repr(exc)}
            print(f"ncu_{k}: {exc!r}")
    (out / "probe.json").write_text(json.dumps(results))
    try:
        print(json.dumps(summary(results), indent=1))
    except Exception as exc:
        print("summary failed:", repr(exc))


if __name__ == "__main__":
    main()
