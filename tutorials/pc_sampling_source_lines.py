"""Where do my Numba kernels stall? PC sampling down to the source line.

Run on a machine with an NVIDIA GPU, from the repository root::

    python3 tutorials/pc_sampling_source_lines.py [output-folder]

It samples a memory-bound kernel (``stream``) and a compute-bound one (``fma``) from
``benchmarks/bench_pc_sampling.py``, prints the hottest source lines with their stall reasons, and writes
``pc_lines_stream.png``, ``pc_lines_fma.png`` and ``pc_kernels.png``.
"""

import os
import sys

import matplotlib

matplotlib.use("Agg")

import gpuscope  # noqa: E402
from benchmarks import bench_pc_sampling as B  # noqa: E402
from gpuscope.metrics import pc_plot  # noqa: E402

out = sys.argv[1] if len(sys.argv) > 1 else "."
os.makedirs(out, exist_ok=True)

work = B.Workload()  # compiles and warms up: launches before the block are not sampled
with gpuscope.pc_sample(period=2**10, kernels=[B.stream, B.fma]) as pcs:
    work.run(20)
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
    ax = pc_plot.plot_line_stalls(ds, kernel)
    ax.figure.tight_layout()
    ax.figure.savefig(os.path.join(out, f"pc_lines_{kernel.rsplit('.', 1)[-1]}.png"), dpi=120)

ax = pc_plot.plot_kernel_stalls(ds)
ax.figure.tight_layout()
ax.figure.savefig(os.path.join(out, "pc_kernels.png"), dpi=120)
