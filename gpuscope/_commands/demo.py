"""``gpuscope demo``: gpuscope's main job on a built-in workload.

A Numba workload of three kernels — a streaming kernel (memory-bound), a long FMA chain (core-bound) and the same
chain run by one thread of each warp (divergence-bound) — is profiled in two runs on the GPU:

1. per launch with the ``topdown`` metric set (the range profiler replays each launch for its 7 passes), then
   analysed with the Top-Down method, aggregated per kernel;
2. over time with PM sampling (``pm-default``) while each kernel runs for 0.6 s inside a ``gpuscope.range`` block,
   then split into phases by change-point detection. PM counters count warp instructions, so the FMA chain and
   its divergent twin look alike and the three ranges make two distinct phases; the report says so.

It prints a compact report and writes two figures and two netCDF files. On a machine without a GPU it runs the
same analysis on recordings made with this command on an H100, shipped in ``gpuscope/data/``, and says so.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import time
from pathlib import Path

import numpy as np

from gpuscope._commands.exits import EXIT_FILE
from gpuscope._results.report_inputs import SHORT_NAMES
from gpuscope._results.report_pm import _scaled
from gpuscope._results.report_table import _PROSE, _width, _wrap
from gpuscope._schema.labels import string_labels
from gpuscope.errors import install_hint

DATA = Path(__file__).parents[1] / "data"
RECORDED_LAUNCHES = DATA / "demo_launches.nc"
RECORDED_SERIES = DATA / "demo_timeseries.nc"
PHASES = ("stream", "fma", "divergent")


# ---------------------------------------------------------------------------------------------------------
# The workload (Numba kernels, compiled on first use)
# ---------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Workload:
    """Device arrays and the three kernels, launched through ``kernel[grid, block](...)``."""

    kernels: dict
    args: dict
    grids: dict
    block: int = 256

    def launch(self, name: str) -> None:
        self.kernels[name][self.grids[name], self.block](*self.args[name])


def kernels(decorate=None) -> dict:
    """The three kernels as Numba dispatchers, compiled on their first launch; *decorate*, if given, wraps each
    (e.g. ``gpuscope.profile``)."""
    from numba import cuda

    @cuda.jit(lineinfo=True)
    def stream(a, b, c):
        i = cuda.grid(1)
        if i < c.size:
            c[i] = a[i] + 2.0 * b[i]

    @cuda.jit(lineinfo=True)
    def fma(x, iters):
        i = cuda.grid(1)
        if i < x.size:
            v = x[i]
            for _ in range(iters):
                v = v * 1.000001 + 0.5
            x[i] = v

    @cuda.jit(lineinfo=True)
    def divergent(x, iters):
        # Only lane 0 of each warp runs the loop: the warp issues every instruction for one active thread.
        i = cuda.grid(1)
        if i < x.size:
            v = x[i]
            if i % 32 == 0:
                for _ in range(iters):
                    v = v * 1.000001 + 0.5
            x[i] = v

    found = {"stream": stream, "fma": fma, "divergent": divergent}
    return found if decorate is None else {k: decorate(v) for k, v in found.items()}


def ptx(cc: tuple[int, int] = (9, 0)) -> dict[str, str]:
    """The three kernels compiled to PTX for compute capability *cc*, without a GPU: what a machine with only the
    driver needs NVRTC and NVVM from pip for (the cu13 and cu12 extras bring them)."""
    from numba import cuda, float32, int64

    array = float32[::1]
    signatures = {"stream": (array, array, array), "fma": (array, int64), "divergent": (array, int64)}
    return {name: cuda.compile_ptx(k.py_func, signatures[name], cc=cc, lineinfo=True)[0]
            for name, k in kernels().items()}


def build_workload(n: int = 1 << 24, fma_iters: int = 2000, decorate=None) -> Workload:
    """Compile the demo kernels (:func:`kernels`) and allocate their data (about 200 MB of device memory)."""
    from numba import cuda

    rng = np.random.default_rng(0)
    a = cuda.to_device(rng.random(n, dtype=np.float32))
    b = cuda.to_device(rng.random(n, dtype=np.float32))
    c = cuda.device_array(n, np.float32)
    x = cuda.to_device(rng.random(n // 16, dtype=np.float32))
    y = cuda.to_device(rng.random(n // 16, dtype=np.float32))
    block = 256
    return Workload(
        kernels=kernels(decorate),
        args={"stream": (a, b, c), "fma": (x, fma_iters), "divergent": (y, fma_iters)},
        grids={"stream": (n + block - 1) // block, "fma": (n // 16 + block - 1) // block,
               "divergent": (n // 16 + block - 1) // block},
        block=block,
    )


# ---------------------------------------------------------------------------------------------------------
# Collection on the GPU
# ---------------------------------------------------------------------------------------------------------


def collect(launches_per_kernel: int = 5, phase_seconds: float = 0.6, interval: str = "100us", log=print):
    """Run the workload under the range profiler and then under PM sampling; return the two Datasets."""
    from numba import cuda

    import gpuscope as gs
    from gpuscope.metrics import topdown as td

    log("compiling the workload ...")
    work = build_workload(decorate=gs.profile)
    for name in PHASES:
        work.launch(name)
    cuda.synchronize()

    cc = "%d.%d" % cuda.get_current_device().compute_capability
    metrics = list(gs.metric_set("topdown").metrics)
    if td.architecture(cc).optional_stall_reasons:
        metrics += [td.stall_metric(r) for r in td.architecture(cc).optional_stall_reasons]
    with gs.Profiler(metrics=metrics, mode="kernel") as prof:
        log(f"Top-Down per launch: {len(metrics)} metrics, {prof.passes} passes, kernel replay ...")
        for _ in range(launches_per_kernel):
            for name in PHASES:
                work.launch(name)
        cuda.synchronize()
    launches = prof.dataset

    log(f"PM sampling every {interval} while the three phases run ({phase_seconds:.1f} s each) ...")
    with gs.sample(metrics="pm-default", interval=interval) as sampler:
        for name in PHASES:
            with gs.range(name):
                start = time.perf_counter()
                while time.perf_counter() - start < phase_seconds:
                    for _ in range(10):
                        work.launch(name)
                    cuda.synchronize()
    return launches, sampler.dataset


# ---------------------------------------------------------------------------------------------------------
# Analysis and report (the same for live and recorded data)
# ---------------------------------------------------------------------------------------------------------


def analyse(launches, series, outdir: Path, recorded: bool, out=None, width: int | None = None) -> dict:
    """Top-Down per kernel, phases of the time series, figures and netCDF files; print the report.

    The tables fit *width* characters (default: the terminal's width, as ``gpuscope show``).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    import gpuscope as gs
    from gpuscope._results.report import report
    from gpuscope._util import outputs
    from gpuscope.metrics import topdown as td

    outdir.mkdir(parents=True, exist_ok=True)
    prose = min(_width(width), _PROSE)

    def w(text: str, first: str = "", rest: str = "") -> None:  # a paragraph, wrapped to the terminal
        (out or sys.stdout).write("\n".join(_wrap(text, prose, first, rest)) + "\n")

    def table(title: str, rep) -> None:
        (out or sys.stdout).write(f"\n{title}{rep.to_text(width)}\n")

    attrs = launches.attrs
    where = "RECORDED" if recorded else "measured now"
    w(f"gpuscope demo — {where} on {attrs.get('device_name', attrs.get('device', '?'))} "
      f"(chip {attrs.get('chip', '?')}, CUPTI {attrs.get('cupti_version', '?')}, "
      f"recorded {attrs.get('created', '?')})")
    if recorded:
        w("Not measured on this machine: this is gpuscope's analysis of recordings shipped with the package "
          f"({RECORDED_LAUNCHES.name}, {RECORDED_SERIES.name}).", "  ", "  ")

    per_launch = td.topdown(launches)
    per_kernel = td.aggregate(per_launch, by="kernel")
    per_kernel_report = report(launches)
    w(f"Run 1, per launch: each kernel launched {per_kernel_report['launches'].max():.0f} times under the range "
      "profiler, which replays every launch once per pass; gpu_time_ms is their total.", "\n")
    table("Top-Down per kernel\n", per_kernel_report)
    verdicts = dict(zip(per_kernel_report.index, per_kernel_report["bound_by"]))

    # Segments within 2 noise sigmas of each other in every metric share a phase label (see docs/phases.md).
    ph = gs.phases(series, label_tolerance=2.0)
    n_phases = int(ph["phase"].max()) + 1 if ph.sizes.get("time") else 0
    segments_table, segments = _segments(series, ph, n_phases)
    seconds = float(series["time"].values[-1] - series["time"].values[0]) / 1e9
    w(f"Run 2, over time: a separate run of the same three kernels, each launched again and again for 0.6 s "
      f"inside a user range ({', '.join(PHASES)}), sampled with PM sampling for {seconds:.1f} s; the times below "
      "are milliseconds since sampling began.", "\n")
    table("", segments_table)
    per_phase = gs.dynamic(per_launch, phases=ph)  # each phase: the Top-Down of the work in it
    w("Both runs joined: each phase of run 2 gets the Top-Down of run 1's launches of the kernels that ran in it "
      "(by user range and kernel name).", "\n")
    table("Top-Down per phase\n", report(per_phase))

    def figure(fig):  # a figure's file, written as every output is (gpuscope/_util/outputs.py)
        def fill(tmp: str) -> None:
            fig.savefig(tmp, dpi=120, bbox_inches="tight", format="png")

        return functools.partial(outputs.write, fill=fill)

    fig = per_kernel.gpuscope.plot.topdown(level=2)
    fig.axes[0].set_title(f"Top-Down level 2 per kernel ({where}, {attrs.get('chip', '')})")
    topdown_fig = figure(fig)
    fig = ph.gpuscope.plot.timeline([v for v in series.data_vars if series[v].dims == ("time",)])
    fig.suptitle(f"PM sampling with detected phases ({where})", y=1.02)
    files = {outdir / "topdown.png": topdown_fig, outdir / "timeline.png": figure(fig),
             outdir / "launches.nc": functools.partial(gs.save_dataset, launches),
             outdir / "timeseries.nc": functools.partial(gs.save_dataset, series)}
    written, not_written = _write_files(files)
    plt.close("all")
    (out or sys.stdout).write("\n")
    if written:
        w(f"wrote {', '.join(map(str, written))}")
    for line in not_written:
        w(f"not written: {line}")
    return {"verdicts": verdicts, "phases": n_phases, "segments": segments, "not_written": not_written}


def _write_files(files: dict) -> tuple[list, list[str]]:
    """Write each file (path -> ``write(path)``); one that cannot be written (a full disk, a link or a device at its
    name) costs that file only. Returns the paths written and a line for each one that was not."""
    written, failed = [], []
    for path, write in files.items():
        try:
            write(path)
        except OSError as exc:
            failed.append(f"{path}: {exc.strerror or exc}")
        else:
            written.append(path)
    return written, failed


def _segments(series, ph, n_phases: int):
    """The segments between change points as a table (the mean of each metric in each; a segment under 1% of the
    run is a transient, counted in a note), and the (phase, user range) pairs that hold a tenth of a segment."""
    import pandas as pd

    from gpuscope._results.report_table import _new

    metrics = [v for v in series.data_vars if series[v].dims == ("time",)]
    t_all = series["time"].values
    ranges_all = string_labels(series["range"].values) if "range" in series.coords else np.full(t_all.size, "")
    short, segments, rows = [], [], {}
    for seg in range(ph.sizes["segment"]):
        first, stop = int(ph["segment_first"][seg]), int(ph["segment_stop"][seg])
        label = int(ph["segment_phase"][seg])
        if stop - first < 0.01 * t_all.size:  # under 1% of the run: a transient, counted below
            short.append(stop - first)
            continue
        names, counts = np.unique(ranges_all[first:stop], return_counts=True)
        main_range = str(names[np.argmax(counts)]) if len(names) else ""
        # every range holding a tenth of the segment: one segment may span ranges that look alike
        segments += [(label, str(r)) for r, c in zip(names, counts) if c >= 0.1 * (stop - first)]
        means = {SHORT_NAMES.get(m, m): float(_scaled(m, series[m].values[first:stop].mean())) for m in metrics}
        rows[seg] = {"from_ms": t_all[first] / 1e6, "to_ms": t_all[stop - 1] / 1e6, "phase": label,
                     "user range": main_range, **means}
    notes = []
    if short:
        notes.append(f"{len(short)} short segments of {sum(short)} samples in all (each under 1% of the run) are "
                     "not listed.")
    for label in sorted({lab for lab, _ in segments}):
        alike = sorted({r for lab, r in segments if lab == label and r})
        if len(alike) > 1:
            notes.append(f"user ranges {', '.join(alike)} look alike in these metrics (phase {label}): PM counters "
                         "count warp instructions and cannot see divergence; the per-kernel Top-Down above can.")
    frame = pd.DataFrame.from_dict(rows, orient="index").rename_axis("segment")
    title = (f"PM sampling: {series.sizes['time']} samples, {ph.sizes['segment']} segments between change points, "
             f"{n_phases} distinct phases (mean per segment; % of peak, PCIe in GB/s)")
    return _new(frame, title, notes, priority=("phase", "user range", "from_ms", "to_ms")), segments


def main(outdir: str = "gpuscope-demo", record_to: str | None = None, force_recorded: bool = False) -> int:
    """Entry point of ``gpuscope demo``."""
    import gpuscope as gs
    from gpuscope._gpu import device as _device

    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)  # fail before a GPU run, not after it
    live = False
    if not force_recorded:
        try:
            live = _device.device_count() > 0
        except gs.NoGpuError as exc:
            # its first clause, on stderr: a note, not the demo's output (which a pipe may read)
            print(f"No GPU: {exc.args[0].split(' (')[0].split('. ')[0].rstrip('.')}.", file=sys.stderr)
    if live and not _numba_cuda():
        print("A GPU is here, but Numba is not installed, and the demo's workload is Numba kernels. Install "
              f"gpuscope's extra for your driver, cu13 (CUDA 13) or cu12 (CUDA 12): {install_hint('cu13')}.")
        live = False
    if live:
        launches, series = collect()
        if record_to:
            Path(record_to).mkdir(parents=True, exist_ok=True)
            gs.save_dataset(launches, Path(record_to) / RECORDED_LAUNCHES.name)
            gs.save_dataset(_thin(series), Path(record_to) / RECORDED_SERIES.name)
    else:
        launches, series = gs.open_dataset(RECORDED_LAUNCHES), gs.open_dataset(RECORDED_SERIES)
    result = analyse(launches, series, outdir, recorded=not live)
    return EXIT_FILE if result["not_written"] else 0


def _numba_cuda() -> bool:
    """Whether Numba's CUDA target can be imported (it comes with the cu13 and cu12 extras, not with the core)."""
    try:
        import numba.cuda  # noqa: F401
    except ImportError:
        return False
    return True


def _thin(series, max_samples: int = 20000):
    """Keep a recording small enough to ship: every k-th sample."""
    step = max(1, int(np.ceil(series.sizes["time"] / max_samples)))
    return series.isel(time=slice(None, None, step))
