"""Ranges and decorators: profile a small Numba workload per region and per launch, save and reload it.

Run on a machine with an NVIDIA GPU:  python3 tutorials/ranges_and_decorators.py [out.nc]
"""

import sys

import numpy as np
from numba import cuda

import gpuscope as gs

N = 1 << 22


@gs.profile
@cuda.jit
def scale(x, a):
    i = cuda.grid(1)
    if i < x.size:
        x[i] *= a


@gs.profile
@cuda.jit
def shift(x, b):
    i = cuda.grid(1)
    if i < x.size:
        x[i] += b


def step(x):
    with gs.range("scale"):
        scale[N // 256, 256](x, 1.0001)
    with gs.range("shift"):
        shift[N // 256, 256](x, 0.5)


def main(out="ranges.nc"):
    x = cuda.to_device(np.ones(N, np.float32))
    step(x)  # compile outside the session

    # 1. A one-pass set: ranges and per-launch rows in one continuous pass.
    with gs.Profiler(["smsp__inst_executed.sum", "sm__ctas_launched.sum", "dram__bytes_read.sum"]) as prof:
        for _ in range(3):
            step(x)
    ds = prof.dataset
    print(ds[["smsp__inst_executed.sum", "sm__ctas_launched.sum"]].to_dataframe()[
        ["name", "kernel", "launch", "smsp__inst_executed.sum", "sm__ctas_launched.sum"]])

    # 2. A multi-pass set on a re-runnable function: gs.replay restores device memory between passes.
    metrics = ["sm__throughput.avg.pct_of_peak_sustained_elapsed", "gpu__time_duration.sum",
               "smsp__inst_executed.sum"]
    with gs.Profiler(metrics) as prof:
        print(f"{prof.passes} passes needed")
        gs.replay(step, x)
    print(prof.dataset[metrics].to_dataframe())

    # 3. A multi-pass set in a loop: pass k on iteration k mod cycles.
    with gs.Profiler(metrics) as prof:
        for _ in range(2 * prof.cycles):
            with gs.range("iteration"):
                step(x)
    ds = prof.dataset
    print(ds[["pass_group", "first_iteration", "iterations", metrics[0]]].to_dataframe())

    ds.to_netcdf(out, engine="h5netcdf")
    back = gs.open_dataset(out)
    print("saved and reloaded", out, "identical:", back.identical(ds))


if __name__ == "__main__":
    main(*sys.argv[1:])
