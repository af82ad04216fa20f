"""Tutorial: a workload with distinct phases, its hardware metrics over time, and the Top-Down of every phase.

Run on a machine with an NVIDIA GPU (Numba installed)::

    python tutorials/sampling_phases.py --out sampling_phases.png

The workload has four phases, each inside a ``gpuscope.range``: a memory-bound streaming kernel, a compute-bound
FMA chain, an idle pause, and both kernels mixed. The script

1. range-profiles a few launches of each kernel (``gpuscope.Profiler("topdown")``): *why* each kernel is slow;
2. runs the four phases under ``gpuscope.sample(kernels=True)``: the GPU's performance monitors every 100 µs and
   every kernel's start and end on the GPU, on one clock;
3. finds the phases from the metrics alone (``gpuscope.phases``), without being told the ranges;
4. gives each phase the Top-Down of the kernels that ran in it (``gpuscope.dynamic(td, phases=ph)``);
5. writes the figures, the Datasets (netCDF) and one Perfetto trace of everything.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="sampling_phases.png", help="figure of the metrics; a second one beside it")
    ap.add_argument("--interval", default="100us")
    ap.add_argument("--seconds", type=float, default=0.5, help="length of each phase")
    args = ap.parse_args()

    import matplotlib

    matplotlib.use("Agg")
    from numba import cuda

    import gpuscope as gs
    from gpuscope.metrics import plot

    @cuda.jit(lineinfo=True)
    def stream(a, b, c):
        i = cuda.grid(1)
        if i < c.size:
            c[i] = a[i] + 2.0 * b[i]

    @cuda.jit(lineinfo=True)
    def fma(x, n):
        i = cuda.grid(1)
        if i < x.size:
            v = x[i]
            for _ in range(n):
                v = v * 1.000001 + 0.5
            x[i] = v

    n = 16 << 20
    a, b = cuda.to_device(np.ones(n, np.float32)), cuda.to_device(np.ones(n, np.float32))
    c, x = cuda.device_array(n, np.float32), cuda.to_device(np.ones(1 << 20, np.float32))

    def launch(kind):
        if kind == "stream":
            stream[(n + 255) // 256, 256](a, b, c)
        else:
            fma[((1 << 20) + 255) // 256, 256](x, 2000)

    def run(kind, seconds):
        t0, k = time.perf_counter(), 0
        while time.perf_counter() - t0 < seconds:
            launch(kind if kind != "mixed" else ("stream", "fma")[k % 2])
            k += 1
            if k % 20 == 0:
                cuda.synchronize()
        cuda.synchronize()

    run("mixed", 0.05)  # compile before profiling

    # 1. Why each kernel is slow: Top-Down per launch (kernel replay, a few launches are enough)
    with gs.Profiler("topdown", mode="kernel") as prof:
        for _ in range(3):
            launch("stream")
            launch("fma")
        cuda.synchronize()
    td = gs.topdown(prof.dataset)
    print(gs.aggregate(td, by="kernel")[["retire", "divergence", "frontend", "backend"]].to_pandas().round(2))

    # 2. When the GPU does what: PM samples and kernel executions over the four phases
    with gs.sample(metrics="pm-default", interval=args.interval, kernels=True) as s:
        for phase in ("stream", "fma", "idle", "mixed"):
            with gs.range(phase):
                if phase == "idle":
                    time.sleep(args.seconds)
                else:
                    run(phase, args.seconds)
    ts = s.dataset
    print(f"{ts.sizes['time']} samples, {ts.attrs['lost_samples']} lost; "
          f"{len(gs.kernel_executions(ts))} kernel executions, {ts.attrs['kernel_records_dropped']} dropped")
    print(s.report())  # per user range: what the GPU did

    # 3. Phases from the metrics alone
    ph = gs.phases(ts)
    print(f"{ph.sizes['phase_id']} phases in {ph.sizes['segment']} segments")

    # 4. The Top-Down of every phase, from the kernels that ran in it
    per_phase = gs.dynamic(td, phases=ph)
    print(gs.report(per_phase))  # share of the run, the part with a Top-Down, and that Top-Down ("not attributed")

    # 5. Figures, files, one trace
    out = Path(args.out)
    ph.gpuscope.plot.timeline().savefig(out, dpi=120)
    topdown_png = out.with_name(out.stem + "_topdown" + out.suffix)
    plot.phase_topdown(ph, per_phase, level=2).savefig(topdown_png, dpi=120)
    try:
        gs.save_dataset(ts, out.with_suffix(".nc"))
        gs.save_dataset(prof.dataset, out.with_name(out.stem + "_launches.nc"))
    except ImportError as exc:
        print(f"netCDF not written ({exc}); pip install h5netcdf")
    trace = out.with_suffix(".trace.json")
    gs.to_perfetto(prof.dataset, ts, ph, path=trace)  # open in https://ui.perfetto.dev
    print(f"wrote {out}, {topdown_png}, {trace}")


if __name__ == "__main__":
    main()
