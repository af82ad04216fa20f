"""Tutorial: sample a workload with distinct phases and plot the hardware metrics over time.

Run on a machine with an NVIDIA GPU (Numba installed)::

    python tutorials/sampling_phases.py --out sampling_phases.png

The workload has four phases, each inside a ``gpuscope.range``: a memory-bound streaming kernel, a
compute-bound FMA chain, an idle pause, and both kernels mixed. ``gpuscope.sample`` reads the GPU's
performance monitors every 50 µs in the background; afterwards ``s.dataset`` is an xarray Dataset with one
variable per metric along ``time`` and a ``range`` coordinate naming the phase each sample fell into. The
script prints per-phase means, saves the series as netCDF and as a Perfetto trace, detects phases without
being told the ranges (``gpuscope.metrics.phases``), and plots everything.
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="sampling_phases.png")
    ap.add_argument("--interval", default="100us")
    ap.add_argument("--seconds", type=float, default=0.5, help="length of each phase")
    args = ap.parse_args()

    from numba import cuda

    import gpuscope as gs

    @cuda.jit
    def stream(a, b, c):
        i = cuda.grid(1)
        if i < c.size:
            c[i] = a[i] + 2.0 * b[i]

    @cuda.jit
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

    def run(kind, seconds):
        t0, k = time.perf_counter(), 0
        while time.perf_counter() - t0 < seconds:
            if kind in ("stream", "mixed") and (kind == "stream" or k % 2 == 0):
                stream[(n + 255) // 256, 256](a, b, c)
            else:
                fma[((1 << 20) + 255) // 256, 256](x, 2000)
            k += 1
            if k % 20 == 0:
                cuda.synchronize()
        cuda.synchronize()

    run("mixed", 0.05)  # compile before sampling
    with gs.sample(metrics="pm-default", interval=args.interval) as s:
        with gs.range("stream"):
            run("stream", args.seconds)
        with gs.range("fma"):
            run("fma", args.seconds)
        with gs.range("idle"):
            time.sleep(args.seconds)
        with gs.range("mixed"):
            run("mixed", args.seconds)
    ds = s.dataset
    print(ds)
    print(f"{ds.sizes['time']} samples, trigger={ds.attrs['trigger']}, lost={ds.attrs['lost_samples']}")

    metrics = list(ds.attrs["metrics"])
    # The first sample starts before sampling did (it covers idle time before Start): leave it out of means.
    means = ds[metrics].isel(time=slice(1, None)).groupby("range").mean()
    print(means.to_dataframe().round(1).T.to_string())

    try:
        ds.to_netcdf("sampling_phases.nc", engine="h5netcdf")
    except ImportError as exc:
        print(f"netCDF not written ({exc}); pip install h5netcdf")
    gs.to_chrome_trace(ds, "sampling_phases.trace.json")  # open in https://ui.perfetto.dev

    try:  # phase detection from the metrics alone, for comparison with the ranges
        from gpuscope.metrics.phases import phases

        ph = phases(ds.isel(time=slice(1, None)), metrics[:6])
        print(ph)
    except Exception as exc:  # the analysis layer is optional for this tutorial
        print(f"phase detection skipped: {exc}")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = metrics[:6]
    fig, axes = plt.subplots(len(shown), 1, sharex=True, figsize=(10, 1.6 * len(shown)))
    t_ms = ds["time"].values / 1e6
    colors = dict(zip(["stream", "fma", "idle", "mixed"], ["#cde", "#edc", "#eee", "#dec"]))
    for ax, name in zip(axes, shown):
        ax.plot(t_ms[1:], ds[name].values[1:], lw=0.7)
        ax.set_ylabel(name.split("__")[1].split(".")[0][:18], fontsize=7)
        for span in gs.spans(ds).itertuples():  # the user ranges, ns from the session start
            ax.axvspan(span.start / 1e6, span.end / 1e6, color=colors.get(span.path, "#eee"), zorder=0)
    axes[0].set_title(f"gpuscope.sample(pm-default, {args.interval}) on {ds.attrs.get('device_name', '')}")
    axes[-1].set_xlabel("time since sampling started (ms)")
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}, sampling_phases.nc, sampling_phases.trace.json")


if __name__ == "__main__":
    main()
