"""PM sampling and ``gpuscope.range`` on a launch-bound loop: what they cost the user's Python loop.

Run on the GPU machine from the repository root::

    source tests/gpu/device_env.sh
    python3 benchmarks/bench_pm_launch_bound.py --out $OUT/pm_launch_bound.json

Workload: a CuPy loop of 4 launches a step on 64 KiB arrays (about 46 us a step on the H200: the GPU waits for
Python), with two ``gpuscope.range`` a step ("step" and "step/inner") or none, synchronised every 64 steps. Cases,
each ``--seconds`` long and interleaved ``--reps`` times in one process:

- ``plain``: no ranges, no session; ``ranges``: the ranges, no session (what a range costs by itself);
- ``PM``: inside ``gs.sample("pm-fast", interval="20us")`` (the decode thread waking every 10 ms, the default),
  without ranges; ``PM, ranges``: with them;
- ``PM, ranges, decode 50 ms``: the same, the decode thread waking every 50 ms.

Prints, per case, the median time a step and the median over the reps of its difference from ``plain`` and (for
the sampled cases with ranges) from ``ranges`` of the same rep: the sampler's own cost on a loop that has ranges.
``--source DIR`` imports gpuscope from DIR instead of this tree (an earlier version, for a before/after in one run).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def cupy_loop(gs):
    """``loop(seconds, ranges) -> us per step``."""
    import cupy as cp

    x = cp.ones(1 << 14, cp.float32)
    y = cp.empty_like(x)
    device = cp.cuda.Device()

    def first():
        cp.multiply(x, 0.5, out=y)
        cp.add(y, 0.5, out=x)

    def second():
        cp.multiply(x, 2.0, out=y)
        cp.subtract(y, x, out=x)

    def loop(seconds: float, ranges: bool) -> float:
        steps = 0
        began = time.perf_counter()
        end = began + seconds
        while True:
            if ranges:
                for _ in range(64):
                    with gs.range("step"):
                        first()
                        with gs.range("inner"):
                            second()
            else:
                for _ in range(64):
                    first()
                    second()
            device.synchronize()
            steps += 64
            now = time.perf_counter()
            if now >= end:
                return (now - began) / steps * 1e6

    loop(0.3, False)  # CuPy compiles its kernels
    loop(0.3, True)
    return loop


CASES = (("plain", False, False, None), ("ranges", False, True, None), ("PM", True, False, None),
         ("PM, ranges", True, True, None), ("PM, ranges, decode 50 ms", True, True, 0.05))


def run(seconds: float, reps: int) -> dict:
    import gpuscope as gs

    loop = cupy_loop(gs)
    rows = []
    with gs.sample("pm-fast", interval="20us"):  # the first session's set-up (workers, images) is not the loop's
        loop(0.3, True)
    for rep in range(reps):
        for name, pm, ranges, period in CASES:
            if pm:
                options = {} if period is None else {"decode_period": period}
                with gs.sample("pm-fast", interval="20us", **options) as s:
                    us = loop(seconds, ranges)
                decoder = s._decoder
                row = {"decode_period_s": s.decode_period, "samples": int(s.dataset.sizes["time"]), "lost": int(s.lost_samples),
                       "decode_us_per_sample": round(decoder.decode_seconds / max(1, decoder.decoded_samples) * 1e6, 2)}
            else:
                us, row = loop(seconds, ranges), {}
            rows.append({"case": name, "rep": rep, "us_per_step": round(us, 3), **row})
            print(f"rep {rep} {name:<26} {us:8.2f} us/step {row}", flush=True)
    return {"gpuscope": gs.__file__, "version": gs.__version__, "rows": rows, "summary": summary(rows)}


def summary(rows: list) -> dict:
    by = {}
    for row in rows:
        by.setdefault(row["rep"], {})[row["case"]] = row["us_per_step"]
    out = {}
    for name, _, ranges, _ in CASES:
        steps = [rep[name] for rep in by.values() if name in rep]
        if not steps:
            continue
        entry = {"us_per_step": round(statistics.median(steps), 2),
                 "over_plain_pct": round(statistics.median(rep[name] / rep["plain"] * 100 - 100
                                                           for rep in by.values() if name in rep), 2)}
        if ranges and name != "ranges":
            entry["over_ranges_pct"] = round(statistics.median(rep[name] / rep["ranges"] * 100 - 100
                                                               for rep in by.values() if name in rep), 2)
        out[name] = entry
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("pm_launch_bound.json"))
    p.add_argument("--seconds", type=float, default=3.0, help="length of each case")
    p.add_argument("--reps", type=int, default=5, help="interleaved repetitions of the cases")
    p.add_argument("--source", type=Path, help="import gpuscope from this folder (default: this tree)")
    args = p.parse_args(argv)
    sys.path.insert(0, str(args.source or ROOT))
    result = run(args.seconds, args.reps)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1))
    print(f"\ngpuscope from {result['gpuscope']}")
    print(f"{'case':<26} {'us/step':>8} {'vs plain':>9} {'vs ranges':>10}")
    for name, entry in result["summary"].items():
        vs_ranges = f"{entry['over_ranges_pct']:+.2f}%" if "over_ranges_pct" in entry else ""
        print(f"{name:<26} {entry['us_per_step']:8.2f} {entry['over_plain_pct']:+8.2f}% {vs_ranges:>10}")


if __name__ == "__main__":
    main()
