"""Overhead of PC sampling on a Numba workload, and the kernels the PC-sampling tests and docs use.

Run on a GPU from the repository root::

    python3 benchmarks/bench_pc_sampling.py --launches 200 --repeats 5 --periods 1024 32768

It times the same loop of launches (half memory-bound ``stream``, half compute-bound ``fma``) plain and inside
``gpuscope.pc_sample(period=...)`` for each period, and prints a Markdown table (median of ``--repeats``).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from numba import cuda

N_STREAM = 1 << 24  # 64 MiB per float32 array: far beyond L2, so stream waits on DRAM
N_FMA = 1 << 20
FMA_ITERS = 64
THREADS = 256


@cuda.jit(lineinfo=True)
def stream(x, y, z, a):
    i = cuda.grid(1)
    if i < x.size:
        z[i] = a * x[i] + y[i]  # STREAM_LINE: two loads from DRAM, one store


@cuda.jit(lineinfo=True)
def fma(out, a, b):
    i = cuda.grid(1)
    if i < out.size:
        v0 = out[i]
        v1 = v0 + 1.0
        v2 = v0 + 2.0
        v3 = v0 + 3.0
        for _ in range(FMA_ITERS):
            v0 = v0 * a + b  # FMA_LINE: four independent FMA chains
            v1 = v1 * a + b
            v2 = v2 * a + b
            v3 = v3 * a + b
        out[i] = v0 + v1 + v2 + v3


class Workload:
    """Device arrays and the two launches; ``run(n)`` launches n kernels alternating stream and fma.

    ``fresh=True`` uses new dispatchers of the two functions (new modules, same source lines), not launched yet:
    CUPTI maps a kernel for PC sampling only if it first sees it run inside a ``pc_sample`` block (or before any
    profiling in the process), so PC sampling these works whatever ran before in the process. ``kernels`` holds
    the two dispatchers in use.
    """

    def __init__(self, fresh: bool = False):
        rng = np.random.default_rng(0)
        self.x = cuda.to_device(rng.random(N_STREAM, dtype=np.float32))
        self.y = cuda.to_device(rng.random(N_STREAM, dtype=np.float32))
        self.z = cuda.device_array(N_STREAM, dtype=np.float32)
        self.out = cuda.to_device(np.ones(N_FMA, dtype=np.float32))
        if fresh:
            self.kernels = (cuda.jit(lineinfo=True)(stream.py_func), cuda.jit(lineinfo=True)(fma.py_func))
        else:
            self.kernels = (stream, fma)
            self.run(2)
            cuda.synchronize()

    def stream(self):
        self.kernels[0][(N_STREAM + THREADS - 1) // THREADS, THREADS](self.x, self.y, self.z, np.float32(2.0))

    def fma(self):
        self.kernels[1][(N_FMA + THREADS - 1) // THREADS, THREADS](self.out, np.float32(0.999), np.float32(0.001))

    def run(self, n: int):
        for k in range(n):
            (self.stream if k % 2 == 0 else self.fma)()


def source_line(marker: str) -> int:
    """Line number of the kernel line tagged ``marker`` in this file."""
    with open(__file__) as fh:
        for number, text in enumerate(fh, 1):
            if marker in text and "#" in text and "def " not in text and "marker" not in text:
                return number
    raise LookupError(marker)


def _time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv=None):
    import gpuscope

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--periods", type=int, nargs="+", default=[1024, 32768])
    args = parser.parse_args(argv)

    work = Workload()
    plain = _time(lambda: work.run(args.launches), args.repeats)
    rows = [("plain", plain, "", "", "")]
    for period in args.periods:
        last = {}

        def sampled():
            with gpuscope.pc_sample(period=period, kernels=[stream, fma]) as pcs:
                work.run(args.launches)
            last["pcs"] = pcs

        t = _time(sampled, args.repeats)
        rec = last["pcs"].records
        rows.append((f"pc_sample(period={period})", t, rec.total_samples, rec.dropped_samples,
                     f"{100 * (t / plain - 1):+.1f}%"))
    print(f"{args.launches} launches (alternating stream 3x64 MiB / fma), median of {args.repeats}")
    print("| run | wall time (ms) | samples | dropped | overhead |")
    print("|---|---|---|---|---|")
    for name, t, samples, dropped, over in rows:
        print(f"| {name} | {1e3 * t:.1f} | {samples} | {dropped} | {over} |")
    return rows


if __name__ == "__main__":
    main()
