"""Overhead of gpuscope.range on short regions, profiling every execution or every k-th (sample_every).

Run on the GPU machine from the repository root:

    source tests/gpu/device_env.sh; python3 benchmarks/bench_range_overhead.py --region-ms 1 --iterations 400

A region is a run of streaming-kernel launches lasting about ``--region-ms`` followed by a synchronize (what a
training step looks like to the GPU). The loop is timed plain and inside a one-pass ``gpuscope.Profiler`` whose
top-level range wraps each region; medians of 3 repetitions.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--region-ms", type=float, default=1.0)
    ap.add_argument("--iterations", type=int, default=400)
    ap.add_argument("--every", type=int, nargs="+", default=[1, 10, 40, 100])
    args = ap.parse_args()

    import gpuscope as gs
    from gpuscope._commands import demo as _demo
    from numba import cuda

    work = _demo.build_workload(n=1 << 22)
    work.launch("stream")
    cuda.synchronize()
    t = time.perf_counter()
    for _ in range(50):
        work.launch("stream")
    cuda.synchronize()
    per_launch = (time.perf_counter() - t) / 50
    launches = max(1, round(args.region_ms / 1e3 / per_launch))

    def region():
        for _ in range(launches):
            work.launch("stream")
        cuda.synchronize()

    def plain():
        t = time.perf_counter()
        for _ in range(args.iterations):
            region()
        return time.perf_counter() - t

    def profiled(every):
        with gs.Profiler(metrics=["smsp__inst_executed.sum", "dram__bytes_read.sum"], sample_every=every):
            t = time.perf_counter()
            for _ in range(args.iterations):
                with gs.range("step"):
                    region()
            return time.perf_counter() - t

    base = statistics.median(plain() for _ in range(3))
    print(f"region: {launches} launches, {base / args.iterations * 1e3:.3f} ms plain")
    print("| sample_every | ms per region | overhead |")
    print("|---|---|---|")
    for every in args.every:
        t = statistics.median(profiled(every) for _ in range(3))
        print(f"| {every} | {t / args.iterations * 1e3:.3f} | {100 * (t / base - 1):+.1f}% |")


if __name__ == "__main__":
    main()
