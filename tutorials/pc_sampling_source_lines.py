"""Where do my Numba kernels stall? PC sampling down to the source line.

Run on a machine with an NVIDIA GPU, from the repository root::

    python3 tutorials/pc_sampling_source_lines.py [output-folder]

It samples a memory-bound kernel (``stream``) and a compute-bound one (``fma``) defined below, prints the hottest source lines with their stall reasons, and writes
``pc_lines_stream.png``, ``pc_lines_fma.png`` and ``pc_kernels.png``.
"""

import os
import sys

import matplotlib
import numpy as np
from numba import cuda

matplotlib.use("Agg")

import gpuscope  # noqa: E402
from gpuscope.metrics import pc_plot  # noqa: E402

N_STREAM = 1 << 24  # 64 MiB per float32 array: far beyond L2, so stream waits on DRAM
N_FMA = 1 << 20
THREADS = 256


@cuda.jit(lineinfo=True)  # lineinfo: PC samples map to source lines
def stream(x, y, z, a):
    i = cuda.grid(1)
    if i < x.size:
        z[i] = a * x[i] + y[i]  # two loads from DRAM, one store


@cuda.jit(lineinfo=True)
def fma(out, a, b):
    i = cuda.grid(1)
    if i < out.size:
        v0 = out[i]
        v1, v2, v3 = v0 + 1.0, v0 + 2.0, v0 + 3.0
        for _ in range(64):
            v0 = v0 * a + b  # four independent FMA chains
            v1 = v1 * a + b
            v2 = v2 * a + b
            v3 = v3 * a + b
        out[i] = v0 + v1 + v2 + v3


def run(n):
    """n launches, alternating stream and fma."""
    for k in range(n):
        if k % 2 == 0:
            stream[(N_STREAM + THREADS - 1) // THREADS, THREADS](x, y, z, np.float32(2.0))
        else:
            fma[(N_FMA + THREADS - 1) // THREADS, THREADS](acc, np.float32(0.999), np.float32(0.001))


out = sys.argv[1] if len(sys.argv) > 1 else "."
os.makedirs(out, exist_ok=True)

rng = np.random.default_rng(0)
x = cuda.to_device(rng.random(N_STREAM, dtype=np.float32))
y = cuda.to_device(rng.random(N_STREAM, dtype=np.float32))
z = cuda.device_array(N_STREAM, dtype=np.float32)
acc = cuda.to_device(np.ones(N_FMA, dtype=np.float32))
run(2)  # compiles and warms up: launches before the block are not sampled
cuda.synchronize()
with gpuscope.pc_sample(period=2**10, kernels=[stream, fma]) as pcs:
    run(20)
ds = pcs.dataset
print(f"{ds.attrs['total_samples']} samples, {ds.attrs['dropped_samples']} dropped")

# Per kernel: the share of each Top-Down category.
print(pc_plot.kernel_stalls(ds).to_pandas().round(3).to_string())

# Per source line: the three biggest warp states of the hottest lines.
for kernel in ds.kernel.values.tolist():
    lines = pc_plot.line_stalls(ds, kernel)
    total = lines.sum("stall_reason")
    print(f"\n{kernel}")
    for i in total.argsort().values[::-1][:3]:
        row = lines.isel(source_line=int(i))
        top = row.to_series().sort_values(ascending=False).head(3)
        states = ", ".join(f"{k} {v / float(total.sum()):.0%}" for k, v in top.items())
        print(f"  line {int(row.line):>4}  {str(row.line_text.item())[:50]:<50}  {states}")
    fig = pc_plot.plot_line_stalls(ds, kernel)
    fig.savefig(os.path.join(out, f"pc_lines_{kernel.rsplit('.', 1)[-1]}.png"), dpi=120)

fig = pc_plot.plot_kernel_stalls(ds)
fig.savefig(os.path.join(out, "pc_kernels.png"), dpi=120)
