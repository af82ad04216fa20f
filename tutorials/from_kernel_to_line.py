"""Why is my kernel slow? From the kernel (Top-Down), to the level of memory (roofline, memory workload), to the line
(instruction counts beside PC-sampling stalls), on two Numba kernels.

Run on a machine with an NVIDIA GPU, from the repository root::

    python3 tutorials/from_kernel_to_line.py [output-folder]

``scaled_copy`` computes ``out[i] = a * x[i] + b``; ``scaled_gather`` computes the same from ``x[(33 * i) % n]``, so
the 32 threads of a warp read 32 floats 132 bytes apart instead of 128 bytes side by side. The script

1. profiles both in one kernel-replay session of ``topdown``, ``roofline-fp``, ``memory`` and ``occupancy`` (9
   passes on an H100: the roofline of the CUDA cores comes with the memory view at no pass more) and prints the
   Top-Down report: which kernel, and which part of the SM it waits on;
2. prints each kernel's roofline (FLOP/s, arithmetic intensity at L1, L2 and DRAM, the ceiling that bounds it) and
   memory workload (the busiest level, hit rates, bytes per L1/TEX request: 128 when a warp's loads coalesce);
3. prints occupancy: what the launch allows (from the registers per thread and shared memory the session recorded
   for each launch) and what the SMs achieved;
4. runs the step again under ``gpuscope.profile_source`` (PC sampling, then SASS instruction counts) and prints each
   kernel's hottest source lines with their executions and stall samples;

and writes ``roofline.png`` and ``memory_chart.png``. :func:`explain` does steps 2-4's printing from the Datasets,
so the same analysis runs on a recording (``tests/unit/test_tutorial_kernel_to_line.py`` runs it on the H200
recordings of ``tests/fixtures/sol``).
"""

import os
import sys

import matplotlib
import numpy as np

matplotlib.use("Agg")

import gpuscope as gs  # noqa: E402
from gpuscope.metrics.plot_roofline import si  # noqa: E402  (3.35e12, "B/s") -> "3.35 TB/s"

N = 1 << 24  # 64 MiB per float32 array: far beyond L2
THREADS = 256
STRIDE = 33


def collect():
    """Profile the two kernels on the GPU: the session's Dataset and the source tables."""
    from numba import cuda

    @cuda.jit(lineinfo=True)  # lineinfo: instructions and PC samples map to source lines
    def scaled_copy(out, x, a, b):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = a * x[i] + b  # a warp reads 32 neighbouring floats: one 128-byte request

    @cuda.jit(lineinfo=True)
    def scaled_gather(out, x, a, b):
        i = cuda.grid(1)
        if i < out.size:
            out[i] = a * x[(STRIDE * i) % x.size] + b  # 32 floats 132 bytes apart: a sector each

    x = cuda.to_device(np.random.default_rng(0).random(N, dtype=np.float32))
    out = cuda.device_array_like(x)
    a, b = np.float32(2.0), np.float32(1.0)  # float32 arguments keep the arithmetic in fp32
    blocks = (N + THREADS - 1) // THREADS

    def step():
        scaled_copy[blocks, THREADS](out, x, a, b)
        scaled_gather[blocks, THREADS](out, x, a, b)
        cuda.synchronize()

    step()  # compile and load outside the session
    with gs.Profiler(["topdown", "roofline-fp", "memory", "occupancy"], mode="kernel") as prof:
        step()
    print(f"{prof.passes} passes per launch ({len(prof.metrics)} metrics)\n")
    tables = gs.profile_source(step, period=2**10, kernels=[scaled_copy, scaled_gather])
    return prof.dataset, tables


def explain(ds, tables=None, out=".", registers=None):
    """Print (and return) what the profile says, kernel by kernel, and write the two figures into *out*.

    The occupancy takes each launch's registers per thread and shared memory from the Dataset, where a kernel-mode
    session records them; *registers* (as :func:`gpuscope.occupancy` takes them) gives them for a Dataset that
    does not hold them.
    """
    lines = []
    say = lines.append
    rl = gs.roofline(ds, by="kernel")
    mw = gs.memory_workload(ds, by="kernel")
    for kernel in [str(k) for k in rl["kernel"].values]:
        r, m = rl.sel(kernel=kernel), mw.sel(kernel=kernel)
        say(f"== {kernel}")
        precision = str(r["dominant_precision"].values)
        if precision:
            p = r.sel(precision=precision)
            intensity = ", ".join(f"{level} {float(p['intensity'].sel(level=level)):.3g}"
                                  for level in [str(v) for v in p["level"].values])
            say(f"  roofline ({precision}): {si(float(p['flop_rate']), 'FLOP/s')} of "
                f"{si(float(p['peak_flop_rate']), 'FLOP/s')}; FLOP/byte: {intensity}; bound: {str(p['bound'].values)}"
                f" ({float(p['achieved_fraction']) * 100:.0f}% of what that ceiling allows)")
        hits = ", ".join(f"{level} {float(m['hit_rate'].sel(level=level)):.0f}%" for level in ("L1/TEX", "L2"))
        say(f"  memory: busiest {str(m['busiest_level'].values)} at {float(m['busiest_share']):.0f}% of its peak; "
            f"hit rates {hits}; DRAM {si(float(m['bandwidth'].sel(level='DRAM')), 'B/s')}")
        requests = float(m["l1_requests"].sel(space="global"))
        if requests > 0:  # 128 bytes per request when a warp's 32 float loads coalesce
            say(f"  global memory: {float(m['l1_bytes'].sel(space='global')) / requests:.0f} bytes per L1/TEX request")
    recorded = "registers_per_thread" in ds.coords and bool((ds["registers_per_thread"] >= 0).any())
    if registers is not None or recorded:
        occ = gs.occupancy(ds, registers=registers)
        for i, kernel in enumerate(str(k) for k in ds["kernel"].values):
            say(f"== {kernel} (launch {i}): occupancy {float(occ['theoretical_occupancy'][i]):.0f}% allowed "
                f"(limited by {str(occ['limited_by'].values[i])}), {float(occ['achieved_occupancy'][i]):.0f}% achieved")
    for kernel, table in (tables or {}).items():
        if "samples" not in table or table.sizes.get("source_line", 0) == 0:
            continue
        hot = table.sortby("samples", ascending=False).isel(source_line=slice(0, 3))
        say(f"== {kernel}: hottest lines")
        for j in range(hot.sizes["source_line"]):
            row = hot.isel(source_line=j)
            stalls = row["stall_samples"]
            top = str(stalls["stall_reason"].values[int(np.argmax(stalls.values))]) if float(stalls.sum()) else "-"
            executed = (f", {float(row['smsp__sass_inst_executed']):.0f} warp instructions executed"
                        if "smsp__sass_inst_executed" in row else "")  # the counters' side, where it ran
            say(f"  line {int(row['line'])}: {int(row['samples'])} samples (most: {top}){executed}: "
                f"{str(row['line_text'].values).strip()}")
    os.makedirs(out, exist_ok=True)
    figure = ds.gpuscope.plot.roofline().figure  # the precision that did the most work
    figure.savefig(os.path.join(out, "roofline.png"), dpi=120, bbox_inches="tight")
    busiest = str(rl["kernel"].values[int(np.argmax(mw["busiest_share"].values))])
    figure = ds.gpuscope.plot.memory_chart(busiest).figure
    figure.savefig(os.path.join(out, "memory_chart.png"), dpi=120, bbox_inches="tight")
    text = "\n".join(lines)
    print(text)
    return text


if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    ds, tables = collect()
    print(gs.report(ds))  # 1. which kernel, and what its warps wait on (Top-Down)
    explain(ds, tables, out)
    print(f"\nwrote {os.path.join(out, 'roofline.png')} and {os.path.join(out, 'memory_chart.png')}")
