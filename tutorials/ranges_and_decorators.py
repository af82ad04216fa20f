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


def launch_both(x):
    scale[N // 256, 256](x, 1.0001)
    shift[N // 256, 256](x, 0.5)


def show(ds, metrics):
    for i in range(ds.sizes["range"]):
        values = ", ".join(f"{m}={float(ds[m][i]):.4g}" for m in metrics)
        print(f"  {str(ds.name[i].values):14s} kernel={str(ds.kernel[i].values) or '-':6s} "
              f"launch={int(ds.launch[i]):3d} group={int(ds.pass_group[i])} {values}")


def main(out="ranges.nc"):
    x = cuda.to_device(np.ones(N, np.float32))
    launch_both(x)  # compile outside the sessions
    cheap = ["smsp__inst_executed.sum", "sm__ctas_launched.sum", "dram__bytes_read.sum"]

    print("1. decorated launches, a one-pass set: one row per launch")
    with gs.Profiler(cheap) as prof:
        for _ in range(2):
            launch_both(x)
    show(prof.dataset, cheap)

    print("2. a loop of named steps with the launches nested inside (max_depth=2: 2 cycles per result)")
    with gs.Profiler(cheap, max_depth=2) as prof:
        for _ in range(2 * prof.cycles):
            with gs.range("step"):
                launch_both(x)
    show(prof.dataset, cheap)

    metrics = ["sm__throughput.avg.pct_of_peak_sustained_elapsed", "gpu__time_duration.sum",
               "smsp__inst_executed.sum"]
    print("3. a multi-pass set on a re-runnable function: gs.replay restores device memory between passes")
    with gs.Profiler(metrics) as prof:
        print(f"   {prof.passes} passes")
        gs.replay(launch_both, x, name="step")
    show(prof.dataset, metrics)

    print("4. the same set in a loop: pass k on iteration k mod cycles")
    with gs.Profiler(metrics) as prof:
        for _ in range(2 * prof.cycles):
            with gs.range("iteration"):
                launch_both(x)
    ds = prof.dataset
    show(ds, metrics)

    try:
        gs.save_dataset(ds, out)
    except ImportError:  # h5netcdf is needed to write netCDF-4
        print("h5netcdf is not installed: pip install h5netcdf to save datasets")
        return
    print("saved and reloaded", out, "identical:", gs.open_dataset(out).identical(ds))


if __name__ == "__main__":
    main(*sys.argv[1:])
