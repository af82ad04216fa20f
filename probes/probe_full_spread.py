"""Probe: do the other sets' counters in the stall passes make ``--set full``'s passes disagree (issue 51)?

``benchmarks/bench_verdicts.py`` measured ``pass_spread`` of 19-30% at the median with ``full`` against 3.4-6% with
``topdown`` alone, on the same stall passes. This runs ``full`` in kernel mode on the short-kernel workload
(``benchmarks/short_kernels.py``: a PyTorch MLP step, CuPy and Numba kernels) with the pass plan as it is (the other
sets' counters fill the stall passes' spare room) and with ``pass_plan.PACK_STALL_PASSES = False`` (they go to the
second pass and the last group, after the stall passes), each in a process of its own, ``--rounds`` sessions of one
step each, and prints per variant the passes, ``pass_spread`` median and p90, the GPU time with a verdict
(``decided``) and with passes that agree (``consistent``), and the cost per launch.

    source tests/gpu/device_env.sh; python3 probes/probe_full_spread.py --rounds 1
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def child(packed: bool, rounds: int) -> dict:
    sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]
    from gpuscope._gpu import metric_lists, pass_plan

    pass_plan.PACK_STALL_PASSES = packed
    metric_lists.consistent_plan.cache_clear()
    import gpuscope as gs
    from short_kernels import Work

    work = Work()
    work.step()
    work.step()
    out = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        with gs.Profiler(metrics="full", mode="kernel") as prof:
            work.step()
        wall = time.perf_counter() - t0
        ds = prof.dataset
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            td = gs.topdown(ds, check="ignore")
        dur = ds["gpu__time_duration.sum"].values
        spread = td["pass_spread"].values
        out.append({"passes": prof.passes, "launches": int(ds.sizes["range"]), "ms_per_launch": 1e3 * wall / ds.sizes["range"],
                    "spread_median": float(np.nanmedian(spread)), "spread_p90": float(np.nanpercentile(spread, 90)),
                    "decided_time": float(dur[td["decided"].values].sum() / dur.sum()),
                    "consistent_time": float(dur[td["consistent"].values].sum() / dur.sum()),
                    "groups": ds.attrs.get("pass_groups", [])})
    return {"packed": packed, "rounds": out}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--child", choices=["packed", "pure"])
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child == "packed", args.rounds)))
        return
    for variant in ("packed", "pure"):
        proc = subprocess.run([sys.executable, __file__, "--child", variant, "--rounds", str(args.rounds)],
                              capture_output=True, text=True, timeout=300)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        if not lines:
            print(f"{variant}: rc {proc.returncode}: {proc.stderr[-600:]}")
            continue
        for k, r in enumerate(json.loads(lines[-1])["rounds"]):
            print(f"{variant} round {k}: {r['passes']} passes, {r['launches']} launches, spread median "
                  f"{r['spread_median']:.1f} p90 {r['spread_p90']:.1f}, decided {100 * r['decided_time']:.0f}% "
                  f"consistent {100 * r['consistent_time']:.0f}% of GPU time, {r['ms_per_launch']:.0f} ms/launch")
        print(f"{variant} groups: " + " || ".join(g[:160] for g in r["groups"][2:7]))


if __name__ == "__main__":
    main()
