"""Plots over time: sampled metrics with phases shaded and range bands (:func:`timeline`), Top-Down per phase.

matplotlib is imported inside each function, never at import time; colours from :mod:`gpuscope.metrics.plot_colors`,
the per-phase bars from :mod:`gpuscope.metrics.plot_bars`.
"""

from __future__ import annotations

import itertools
import textwrap
import warnings

import numpy as np
import xarray as xr

from gpuscope._schema.labels import string_labels
from gpuscope.errors import GpuscopeWarning
from gpuscope.metrics import topdown as _td
from gpuscope.metrics.plot_bars import DPI, FONT, WIDTH, topdown
from gpuscope.metrics.plot_colors import _label_colors, _phase_colors, _pyplot, _range_colors

__all__ = ["BAND", "MAX_PANELS", "phase_topdown", "short_label", "timeline"]

#: Percentiles of the band :func:`timeline` draws around each pixel column's mean.
BAND = (25.0, 75.0)
#: Panels :func:`timeline` draws at most when not told which metrics (a warning names the others).
MAX_PANELS = 8
_BAND_ALPHA, _PHASE_ALPHA = 0.35, 0.18
#: Lines of FONT-point text: their height in inches, and the characters a caption line holds across WIDTH.
_LINE, _CAPTION_CHARS = 1.3 * FONT / 72, 110
_LEGEND_COLUMNS = 4


def _sample_axis(ds: xr.Dataset, dim: str) -> tuple[np.ndarray, str, float, float]:
    """x values of the samples, the axis label, and how to map a position (ns or index) onto x."""
    if dim == "time" and np.issubdtype(ds["time"].dtype, np.number):
        t0 = float(ds["time"][0])
        return (np.asarray(ds["time"], dtype=float) - t0) / 1e6, "time (ms)", t0, 1e-6
    if "launch" in ds.coords and ds["launch"].dims == (dim,):
        return np.asarray(ds["launch"], dtype=float), "launch", 0.0, 1.0
    return np.arange(ds.sizes[dim], dtype=float), dim, 0.0, 1.0


def _runs(values: np.ndarray) -> list[tuple[int, int, object]]:
    """(first, stop, value) of every run of equal values."""
    if len(values) == 0:
        return []
    change = np.flatnonzero(values[1:] != values[:-1]) + 1
    bounds = np.concatenate([[0], change, [len(values)]])
    return [(int(a), int(b), values[a]) for a, b in itertools.pairwise(bounds)]


def short_label(name: str, units: str = "") -> str:
    """A short axis label for a CUPTI metric name, with its unit: ``dram__read_throughput.avg.pct_of_peak_\
sustained_elapsed`` -> ``dram read throughput (% of peak)``."""
    base, _, rollup = name.partition(".")
    words = base.replace("__", " ").replace("_", " ").replace(" realtime", "")
    if rollup.endswith(("pct_of_peak_sustained_elapsed", "pct_of_peak_sustained_active")):
        unit = "% of peak"
    elif rollup.endswith(".per_second") and units:  # CUPTI versions write byte, byte/second or byte/second/second
        unit = "GB/s" if _rate_scale(name, units) != 1 else units.split("/")[0] + "/s"
    else:
        unit = {"percent": "%"}.get(units, units.replace("second", "s"))
    return f"{words} ({unit})" if unit else words


def _rate_scale(name: str, units: str) -> float:
    """What a metric's values are multiplied by to be drawn: bytes per second in GB/s, as the report and the HTML
    report show them (:mod:`gpuscope._results.report_inputs`); 1 for everything else."""
    return 1e-9 if name.endswith(".per_second") and units.split("/")[0] in ("byte", "bytes", "B") else 1.0


def _blocks(x: np.ndarray, y: np.ndarray, n: int, band=BAND):
    """x centre, mean and the *band* percentiles of *n* (about) equal blocks of samples: what a pixel column
    shows. NaN and inf samples are left out; a block without a finite sample is NaN."""
    edges = np.linspace(0, len(x), min(n, len(x)) + 1).astype(int)
    starts = edges[:-1][np.diff(edges) > 0]
    counts = np.diff(np.append(starts, len(x)))
    xs = np.add.reduceat(x, starts) / counts
    offset = np.arange(counts.max())
    grid = np.where(offset < counts[:, None], y[np.minimum(starts[:, None] + offset, len(y) - 1)], np.nan)
    grid[~np.isfinite(grid)] = np.nan
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a block without a finite sample stays NaN
        mean = np.nanmean(grid, axis=1)
        lo, hi = np.nanpercentile(grid, band, axis=1) if band is not None else (mean, mean)
    return xs, mean, lo, hi


def _timeline_metrics(ds: xr.Dataset, dim: str, metrics) -> tuple[list[str], dict, dict]:
    """(metrics to draw, their values with inf as NaN, what is not drawn and why: {reason: [names]}).

    Without *metrics*: the metrics phases were detected in, else every numeric 1-D variable; at most
    ``MAX_PANELS`` of those that vary, with a warning naming the others.
    """
    from gpuscope.metrics.phases import _metric_names

    given = metrics is not None
    if metrics is None and "metric" in ds.coords:
        metrics = [str(m) for m in np.asarray(ds["metric"])]
    names = _metric_names(ds, dim, metrics)
    columns = {n: np.asarray(ds[n], dtype=float) * _rate_scale(n, ds[n].attrs.get("units", "")) for n in names}
    columns = {n: np.where(np.isfinite(v), v, np.nan) for n, v in columns.items()}
    empty = [n for n in names if np.isnan(columns[n]).all()]
    constant = [n for n in names if n not in empty and not np.nanmax(columns[n]) > np.nanmin(columns[n])]
    varying = [n for n in names if n not in empty and n not in constant]
    if not varying:
        raise ValueError(f"every metric to plot is constant over {dim!r} or has no finite value: "
                         f"{constant + empty}")
    limited = [] if given else varying[MAX_PANELS:]
    if limited:
        warnings.warn(f"timeline draws {MAX_PANELS} of the {len(varying)} metrics that vary; not drawn: "
                      f"{', '.join(limited)}. Pass metrics=[...] to choose which.", GpuscopeWarning, stacklevel=3)
    skipped = {f"constant, not drawn: {'; '.join(f'{n} = {np.nanmax(columns[n]):g}' for n in constant)}": constant,
               f"no finite value, not drawn: {', '.join(empty)}": empty,
               f"not drawn (at most {MAX_PANELS} panels; pass metrics= to choose): {', '.join(limited)}": limited}
    return [n for n in varying if n not in limited], columns, {k: v for k, v in skipped.items() if v}


def _series(ds: xr.Dataset, dim: str) -> dict[str, np.ndarray]:
    """Sample indices of each line: one per kernel for per-launch results of several kernels (a line through
    interleaved kernels would zig-zag between them), else one line of all samples."""
    if dim == "range" and "kernel" in ds.coords and ds["kernel"].dims == (dim,):
        kernels = np.asarray(ds["kernel"]).astype(str)
        if len(set(kernels.tolist())) > 1:
            return {k: np.flatnonzero(kernels == k) for k in dict.fromkeys(kernels.tolist())}
    return {"": np.arange(ds.sizes[dim])}


def _value_ticks(axis, values: np.ndarray) -> None:
    """Ticks without an offset or exponent above the axis (where the metric's name is): 150M for large values,
    0.0015 for small ones."""
    import matplotlib.ticker

    top = np.nanmax(np.abs(values))
    if top >= 1e4:
        axis.yaxis.set_major_formatter(matplotlib.ticker.EngFormatter(sep=""))
    elif 0 < top < 1e-2:
        axis.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%.3g"))


def timeline(ds: xr.Dataset, metrics=None, *, dim: str | None = None, max_points: int = 1000, band=BAND,
             fig=None):
    """Metrics over time (or launches) with the phases shaded and the open user range as a band on top.

    Each panel shows, per pixel column (one of ``max_points`` blocks of samples), the mean as a line and the
    ``band`` percentiles of the column's samples as a grey band: the spread of the samples without the
    synchronisation dips of real PM data drawing a comb down to 0 (``band=(0, 100)`` draws minimum to maximum).
    Per-launch results of several kernels get one line per kernel, in the kernel's colour. Panels are labelled
    with a short name and unit (:func:`short_label`), with the full CUPTI name above each panel. Metrics that are
    constant or have no finite value get no panel; the figure's caption lists them. A phase that lies mostly in
    one user range has that range's colour.

    Parameters
    ----------
    ds : xarray.Dataset
        PM samples (dim ``time``) or range results, ideally the output of
        :func:`gpuscope.metrics.phases.phases` (phases are shaded when it is).
    metrics : str or list of str, optional
        Variables to draw, one panel each. Default: the metrics phases were detected in, else every numeric
        1-D variable along the sample dimension; at most ``MAX_PANELS`` (8) of those that vary, and a
        ``GpuscopeWarning`` and the caption name the others.
    dim : str, optional
        Sample dimension; default ``time``, else ``range``.
    max_points : int
        Number of blocks (about the plot's width in pixels).
    band : (float, float) or None
        Percentiles of each block's samples drawn as the band; None draws no band.
    fig : matplotlib.figure.Figure, optional
        Figure to draw into (cleared); new by default.

    Returns
    -------
    matplotlib.figure.Figure

    Raises
    ------
    ValueError
        No sample dimension, nothing to plot, every metric is constant or without a finite value, or *band* is
        not two percentiles.
    gpuscope.errors.MissingMetricsError
        A requested metric is not in ``ds``.

    Warns
    -----
    gpuscope.errors.GpuscopeWarning
        More than ``MAX_PANELS`` metrics vary and none were chosen: which are not drawn.
    """
    from gpuscope.metrics.phases import _sample_dim

    if band is not None and not (isinstance(band, (tuple, list)) and len(band) == 2
                                 and all(isinstance(b, (int, float)) for b in band) and 0 <= band[0] < band[1] <= 100):
        raise ValueError(f"band must be None or two percentiles (low, high) with 0 <= low < high <= 100, e.g. "
                         f"(25, 75) or (0, 100) for minimum to maximum; got {band!r}")
    dim = _sample_dim(ds, dim)
    names, columns, skipped = _timeline_metrics(ds, dim, metrics)
    x, xlabel, _, _ = _sample_axis(ds, dim)
    lines = _series(ds, dim)
    line_colors = _label_colors(list(lines)) if len(lines) > 1 else {"": "black"}
    bands = "range" in ds.coords and ds["range"].dims == (dim,) and dim != "range"
    range_values = string_labels(ds["range"]) if bands else np.array([], dtype=str)
    phased = "segment_first" in ds
    phase_colors = _phase_colors(ds) if phased else {}
    blocks = {(name, kernel): _blocks(x[idx], columns[name][idx], max_points, band)
              for name in names for kernel, idx in lines.items()}
    banded = band is not None and any(np.any(hi > lo) for _, _, lo, hi in blocks.values())
    caption = "\n".join(textwrap.fill(text, _CAPTION_CHARS) for text in skipped)
    legend = _timeline_legend(lines, line_colors, band if banded else None, len(x) <= 60, phase_colors)
    rows = -(-len(legend[0]) // _LEGEND_COLUMNS)
    # the margins under the panels, in inches: the legend's rows, then the caption's lines
    legend_h, caption_h = rows * _LINE + 0.1, (caption.count("\n") + 1) * _LINE if caption else 0.0
    if fig is None:
        fig = _pyplot().figure(figsize=(WIDTH, 1.0 + 0.4 * bands + 1.15 * len(names) + legend_h + caption_h), dpi=DPI)
    fig.clear()
    axes = fig.subplots(len(names) + bands, 1, sharex=True, squeeze=False,
                        gridspec_kw={"height_ratios": [0.35] * bands + [1] * len(names)})[:, 0]
    for axis, name in zip(axes[bands:], names, strict=True):
        for kernel in lines:
            xs, mean, lo, hi = blocks[name, kernel]
            if band is not None and np.any(hi > lo):
                axis.fill_between(xs, lo, hi, color=line_colors[kernel], alpha=_BAND_ALPHA, lw=0, step="mid",
                                  zorder=1.5)  # above the phases' shading, which must not hide it
            axis.plot(xs, mean, lw=0.8, color=line_colors[kernel], marker="." if len(xs) <= 60 else None)
        axis.set_ylabel(_panel_label(short_label(name, ds[name].attrs.get("units", ""))), fontsize=FONT,
                        rotation=0, ha="right", va="center")
        axis.set_title(name, loc="left", fontsize=FONT, pad=2)  # the full name, above the traces
        axis.tick_params(labelsize=FONT)
        _value_ticks(axis, columns[name])
        if phased:
            for first, stop, label in zip(ds["segment_first"].values, ds["segment_stop"].values,
                                          ds["segment_phase"].values, strict=True):
                right = x[stop] if stop < len(x) else x[-1] + (x[-1] - x[-2] if len(x) > 1 else 1)
                axis.axvspan(x[first], right, color=phase_colors[int(label)], alpha=_PHASE_ALPHA, lw=0, zorder=0)
    if bands:
        _range_strip(axes[0], x, range_values, _range_colors(range_values))
    axes[-1].set_xlabel(xlabel, fontsize=FONT + 1)
    axes[-1].tick_params(labelsize=FONT)
    height = fig.get_figheight()
    fig.legend(*legend, fontsize=FONT, ncol=_LEGEND_COLUMNS, loc="lower center", frameon=False,
               bbox_to_anchor=(0.5, caption_h / height))
    if caption:
        fig.text(0.01, 0.005, caption, fontsize=FONT, va="bottom")
    fig.tight_layout(rect=(0, (legend_h + caption_h) / height, 1, 1))
    return fig


def _panel_label(label: str) -> str:
    """A panel's short label in lines of at most 20 characters, its unit on a line of its own."""
    words, sep, unit = label.rpartition(" (")
    return textwrap.fill(words, 20) + f"\n({unit}" if sep else textwrap.fill(label, 20)


def _timeline_legend(lines: dict, line_colors: dict, band, markers: bool, phase_colors: dict):
    """Handles and labels of the timeline's legend, each drawn as the plot draws what it stands for."""
    plt = _pyplot()
    handles = [plt.Line2D([], [], color=c, lw=0.8, marker="." if markers else None) for c in line_colors.values()]
    labels = list(lines) if len(lines) > 1 else ["mean per pixel column"]
    if band is not None:
        handles.append(plt.Rectangle((0, 0), 1, 1, color=next(iter(line_colors.values())), alpha=_BAND_ALPHA, lw=0))
        labels.append(f"{band[0]:g}-{band[1]:g}th percentile of its samples")
    handles += [plt.Rectangle((0, 0), 1, 1, color=c, alpha=_PHASE_ALPHA, lw=0) for c in phase_colors.values()]
    labels += [f"phase {p}" for p in phase_colors]
    return handles, labels


def _range_strip(axis, x: np.ndarray, values: np.ndarray, colors: dict) -> None:
    """The open user range as grey stretches, each named where its name fits inside it."""
    width = axis.get_position().width * axis.figure.get_figwidth() * 72  # points, before the layout: about
    for first, stop, value in _runs(values):
        right = x[stop] if stop < len(x) else x[-1]
        if value:
            axis.axvspan(x[first], right, color=colors[value], alpha=0.6, lw=0)
        span = (right - x[first]) / ((x[-1] - x[0]) or 1) * width
        if value and span > 0.62 * FONT * len(value) + 4:  # the name fits, with its margins
            axis.text((x[first] + right) / 2, 0.5, value, ha="center", va="center", fontsize=FONT)
    axis.set_yticks([])
    axis.set_ylabel("range", fontsize=FONT, rotation=0, ha="right", va="center")


def phase_topdown(phases: xr.Dataset, per_phase: xr.Dataset, level=1, *, metric: str | None = None,
                  max_points: int = 1000, fig=None):
    """Top-Down over time: the phases as bands over a sampled metric, and a stacked Top-Down bar per phase.

    Parameters
    ----------
    phases : xarray.Dataset
        ``gpuscope.phases(samples)``.
    per_phase : xarray.Dataset
        ``gpuscope.dynamic(td, phases=phases)``: the Top-Down of each phase.
    level : int
        Top-Down level of the bars (1, 2 or 3).
    metric : str, optional
        The sampled metric drawn above the bands; default the first metric phases were detected in that varies.
    max_points : int
        Blocks of samples drawn (about the width in pixels).
    fig : matplotlib.figure.Figure, optional
        Figure to draw into (cleared); new by default.

    Returns
    -------
    matplotlib.figure.Figure
        Two axes: the timeline (phase colours as in :func:`timeline`) and the bars, labelled ``phase <id>`` with
        the phase's share of the run; a phase without profiled work (idle) has no bar and says so.

    Raises
    ------
    ValueError
        *per_phase* is not the Top-Down of these phases (different phase ids).
    gpuscope.errors.MissingMetricsError
        *metric* is not in *phases*.
    """
    from gpuscope.metrics.phases import _metric_names

    plt = _pyplot()
    if per_phase.attrs.get("kind") != "topdown_by_phase":
        raise ValueError("per_phase must be gpuscope.dynamic(td, phases=phases)")
    ids = np.asarray(phases["phase_id"]).tolist()
    if np.asarray(per_phase["phase_id"]).tolist() != ids:
        raise ValueError("per_phase was computed from other phases (phase ids differ): pass the phases Dataset "
                         "it came from")
    if metric is None:
        candidates = [str(m) for m in np.asarray(phases["metric"])] if "metric" in phases.coords else None
        names = _metric_names(phases, "time", candidates)
        varying = [n for n in names if np.nanmax(np.asarray(phases[n], dtype=float), initial=-np.inf)
                   > np.nanmin(np.asarray(phases[n], dtype=float), initial=np.inf)]
        metric = (varying or names)[0]
    else:
        _metric_names(phases, "time", [metric])
    x, xlabel, _, _ = _sample_axis(phases, "time")
    colors = _phase_colors(phases)
    if fig is None:
        fig = plt.figure(figsize=(WIDTH, 6.5), dpi=DPI)
    fig.clear()
    top, bottom = fig.subplots(2, 1, gridspec_kw={"height_ratios": [1, 1.6]})
    units = phases[metric].attrs.get("units", "")
    xs, mean, lo, hi = _blocks(x, np.asarray(phases[metric], dtype=float) * _rate_scale(metric, units), max_points)
    top.fill_between(xs, lo, hi, color="0.6", alpha=0.5, lw=0, step="mid", zorder=1.5)
    top.plot(xs, mean, lw=0.8, color="black")
    for first, stop, label in zip(phases["segment_first"].values, phases["segment_stop"].values,
                                  phases["segment_phase"].values, strict=True):
        right = x[stop] if stop < len(x) else x[-1]
        top.axvspan(x[first], right, color=colors[int(label)], alpha=0.3, lw=0, zorder=0)
    top.set_ylabel(_panel_label(short_label(metric, units)), fontsize=FONT)
    top.set_xlabel(xlabel, fontsize=FONT + 1)
    top.tick_params(labelsize=FONT)
    top.set_title("phases over time", fontsize=FONT + 2)
    bars = per_phase.assign_coords(weight=("phase_id", np.asarray(per_phase["phase_duration"], dtype=float)))
    nodes = [n for n in bars.data_vars if n in _td._BY_NAME]
    topdown(bars[nodes], level, sort=False, ax=bottom)
    labels = []
    for p in ids:
        empty = bool(np.all(np.isnan([float(bars[n].sel(phase_id=p)) for n in nodes])))
        labels.append(f"phase {p}" + ("\n(no profiled work)" if empty else ""))
    bottom.set_xticks(np.arange(len(ids)), labels, rotation=0, fontsize=FONT)
    for tick, p in zip(bottom.get_xticklabels(), ids, strict=True):
        tick.set_bbox({"facecolor": colors[int(p)], "alpha": 0.4, "edgecolor": "none", "pad": 1.5})
    by = per_phase.attrs.get("topdown_by", "")
    bottom.set_title(f"Top-Down level {level} per phase (joined by {by})", fontsize=FONT + 2)
    fig.tight_layout()
    return fig
