"""Probe: how active warps look in each pass position of a kernel replay, against ncu on the same launches.

Run on the GPU machine from the repository root:

    source tests/gpu/device_env.sh; python3 probes/probe_pass_position.py --out $OUT/position

The ``topdown`` set's consistent pass plan (``gpuscope._gpu.pass_plan``) with one more group, holding only
``smsp__warps_active.sum``, put at position k = 0..7 of the pass list: that counter is collected in that pass only,
so its value is the active warp-cycles of the k-th pass of each launch's kernel replay. The stall groups carry
``sm__warps_active.sum`` (a counter in several groups, which CUPTI evaluates to one value). The workload is
``probe_pass_consistency.Work``; ncu (``--clock-control none --cache-control none``) runs the same launches. Writes
``position.json`` and prints, per k, the median ratio of ``smsp__warps_active.sum`` to ncu's for kernels under 10 us
and the median sum of the stall counts over it.
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

from probe_pass_consistency import Work, run_ncu, session  # noqa: E402

WA = "smsp__warps_active.sum"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--ncu", default=shutil.which("ncu") or "/usr/local/cuda/bin/ncu")
    ap.add_argument("--out", default="position_out")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import gpuscope as gs
    from gpuscope._gpu import metric_lists as lists

    topdown = list(gs.metric_set("topdown").metrics)
    work = Work()
    work.step()
    work.step()
    plan = lists.consistent_plan(tuple(lists.resolve("topdown", "GH100")), "GH100")
    results = {}
    for k in range(len(plan.groups) + 1):
        groups = [list(g) for g in plan.groups]
        groups.insert(k, [WA])
        metrics = list(dict.fromkeys(m for g in groups for m in g))
        res = session(work, args.reps, metrics, groups)
        res.pop("config")
        results[f"at_{k}"] = res
        print(f"at_{k}: {len(res['rows'])} rows, {res['passes']} passes, {res['wall_s']:.1f} s", flush=True)
    gs.release()
    results["ncu"] = run_ncu(args.ncu, topdown + [WA], args.reps)
    (out / "position.json").write_text(json.dumps(results))
    ncu = results["ncu"]["rows"]
    dur = np.array([r["gpu__time_duration.sum"] for r in ncu]) / 1e3
    short = dur < 10
    ref = np.array([r[WA] for r in ncu])
    print("| smsp__warps_active at pass | / ncu, median < 10 us | >= 10 us | stall counts / it, median < 10 us | "
          "stall counts / sm__warps_active |")
    print("|---|---|---|---|---|")
    for k in range(len(plan.groups) + 1):
        rows = results[f"at_{k}"]["rows"]
        if len(rows) != len(ncu):
            print(f"| {k} | {len(rows)} rows against {len(ncu)} |")
            continue
        wa = np.array([r[WA] for r in rows])
        stalls = np.array([sum(v for m, v in r.items() if m.startswith("smsp__warps_issue_stalled_")) for r in rows])
        sm = np.array([r["sm__warps_active.sum"] for r in rows])
        print(f"| {k} | {np.median(wa[short] / ref[short]):.3f} | {np.median(wa[~short] / ref[~short]):.3f} | "
              f"{100 * np.median(stalls[short] / wa[short]):.1f}% | {100 * np.median(stalls[short] / sm[short]):.1f}% |")


if __name__ == "__main__":
    main()
