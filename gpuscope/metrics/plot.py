"""Plots of Top-Down and phase results. matplotlib is imported inside each function, never at import time.

Colours follow the hierarchy: every level-2 node has its own colour family (retire green, divergence orange,
frontend fetch blue, decode grey, backend core red, backend memory purple) and level-3 nodes take shades of
their parent's family spread as far apart as the family allows, so levels can be compared by colour. Ranges
and phases share one palette: a phase that lies mostly in one user range takes that range's colour.
"""

from __future__ import annotations

import textwrap
import warnings

import numpy as np
import xarray as xr

from gpuscope._schema.labels import string_labels
from gpuscope.errors import GpuscopeWarning, MissingMetricsError
from gpuscope.metrics import topdown as _td
from gpuscope.metrics.topdown_aggregate import _weights

__all__ = ["hierarchy", "timeline", "topdown", "phase_topdown", "short_label"]

_FAMILY = {
    "retire": "Greens", "divergence": "Oranges", "divergence_branch": "Oranges", "divergence_replay": "YlOrBr_light",
    "frontend": "Blues", "frontend_fetch": "Blues", "frontend_decode": "Greys",
    "backend": "Reds", "backend_core": "Reds", "backend_memory": "Purples",
}
_LABEL_COORDS = ("name", "kernel")
_DIM_LABEL = {"range": "kernel launch or user range", "phase_id": "phase"}
#: Nodes below this share of IPC_MAX in every bar are drawn as one grey "other" segment.
NEGLIGIBLE = 0.005
_OTHER_COLOR = (0.88, 0.88, 0.85, 1.0)
_PALETTE = "tab10"
#: Percentiles of the band :func:`timeline` draws around each pixel column's mean.
BAND = (25.0, 75.0)
#: Panels :func:`timeline` draws at most when not told which metrics (a warning names the others).
MAX_PANELS = 8


def _pyplot():
    import matplotlib.pyplot as plt

    return plt


def _family(name: str) -> str:
    """The colour family of a node: its own, else its level-2 ancestor's, else its level-1 ancestor's."""
    node = _td._BY_NAME[name]
    while node.name not in _FAMILY:
        node = _td._BY_NAME[node.parent]
    return node.name


def _node_colors(names: list[str]) -> dict[str, tuple]:
    """One colour per node: shades of its family's colour map, spread over [0.35, 0.85] among the members."""
    import matplotlib

    colors, groups = {}, {}
    for n in names:
        groups.setdefault(_family(n), []).append(n)
    for family, members in groups.items():
        name = _FAMILY[family]
        cmap = matplotlib.colormaps[name.removesuffix("_light")]
        top = 0.35 if name.endswith("_light") else 0.85  # a light family stays apart from its dark sibling
        for i, n in enumerate(members):
            colors[n] = cmap(top - 0.5 * i / (len(members) - 1) if len(members) > 1 else top - 0.2)
    return colors


def _label_colors(labels) -> dict:
    """Colour per label (range path or phase), in order of first appearance, "" (no range) left white."""
    plt = _pyplot()
    cmap = plt.get_cmap(_PALETTE)
    seen = [v for v in dict.fromkeys(labels) if v != ""]
    return {v: cmap(i % cmap.N) for i, v in enumerate(seen)}


def _as_topdown(ds: xr.Dataset) -> xr.Dataset:
    """The Dataset itself when it already holds Top-Down nodes, else its Top-Down."""
    if any(n in _td._BY_NAME for n in ds.data_vars):
        return ds
    return _td.topdown(ds)


def _bar_labels(td: xr.Dataset, dim: str) -> list[str]:
    """Bar labels: the dim's coordinate (range path, kernel), else name/kernel; repeated labels get ``#launch``."""
    values = None
    for coord in (dim, *_LABEL_COORDS):
        if coord in td.coords and td[coord].dims == (dim,):
            values = [str(v) for v in np.asarray(td[coord])]
            break
    if values is None:
        return [str(i) for i in range(td.sizes[dim])]
    if len(set(values)) < len(values):
        if "launch" in td.coords and td["launch"].dims == (dim,):
            return [f"{v}#{int(k)}" for v, k in zip(values, np.asarray(td["launch"]), strict=True)]
        return [f"{v}#{i}" for i, v in enumerate(values)]
    return values


def _time_share(td: xr.Dataset, dim: str) -> tuple[np.ndarray | None, str]:
    """Each bar's share of the total weight, None when there is no weight; and what the weight is ("SM cycles"
    or "time")."""
    weight = "weight" if "weight" in td.coords and td["weight"].dims == (dim,) else None
    try:
        w = _weights(td, weight, dim)
    except MissingMetricsError:
        return None, ""
    what = "SM cycles" if "cycle" in str(getattr(w, "attrs", {}).get("units", "")) else "time"
    w = np.asarray(w, dtype=float)
    total = np.nansum(w)
    return (w / total if total > 0 and w.shape == (td.sizes[dim],) else None), what


def _collapse(cut: list[str], td: xr.Dataset, ipc_max: float) -> tuple[list[str], list[str]]:
    """(nodes to draw, nodes below NEGLIGIBLE of IPC_MAX in every bar, drawn as one "other" segment)."""
    small = [n for n in cut if _td._BY_NAME[n].level == 3
             and np.nanmax(np.abs(np.atleast_1d(np.asarray(td[n], dtype=float))), initial=0) < NEGLIGIBLE * ipc_max]
    return [n for n in cut if n not in small], small


def topdown(ds: xr.Dataset, level=1, *, by: str | None = None, fraction: bool = False, sort: bool | None = None,
            ax=None):
    """Stacked Top-Down bars, one bar per range (or per group with ``by``), annotated with each bar's time share.

    The x-axis label says what the bars are and what the number above each is (its share of all the SM cycles,
    or of the time where there is no cycle count), so it stays explained when the caller replaces the title.

    Parameters
    ----------
    ds : xarray.Dataset
        A Top-Down Dataset, or range results holding the ``topdown`` metric set (computed here).
    level : int or sequence of int
        Level(s) to show; one axes per level. Each bar stacks the level's cut, which sums to ``IPC_MAX``.
        Level-3 nodes below 0.5% of ``IPC_MAX`` in every bar are merged into one grey "other" segment.
    by : str, optional
        Aggregate first (:func:`gpuscope.metrics.topdown.aggregate`), e.g. ``"kernel"``.
    fraction : bool
        Show percent of ``IPC_MAX`` instead of IPC.
    sort : bool, optional
        Order bars by time share, largest first. Default: sort groups (aggregated data), keep ranges in
        their order (launch order, as :func:`gpuscope.metrics.phase_topdown.dynamic` returns them).
    ax : matplotlib.axes.Axes or sequence of them, optional
        Where to draw; new figure by default.

    Returns
    -------
    matplotlib.axes.Axes or numpy.ndarray of Axes
        One Axes per level (an array when several levels are drawn).

    Raises
    ------
    ValueError
        The Dataset is not one-dimensional after aggregation, or a level is not available.
    gpuscope.errors.MissingMetricsError
        Raw metrics lack what Top-Down needs.
    """
    plt = _pyplot()
    td = _as_topdown(ds)
    if by is not None:
        td = _td.aggregate(td, by=by)
    levels = [level] if isinstance(level, int) else list(level)
    if len(td.dims) > 1:
        raise ValueError(f"expected one dimension of bars, got {list(td.dims)}; select or aggregate first")
    dim = next(iter(td.dims), None)
    share, what = _time_share(td, dim) if dim else (None, "")
    if share is not None and (sort if sort is not None else dim != "range"):
        td = td.isel({dim: np.argsort(-share, kind="stable")})
        share, what = _time_share(td, dim)
    axes = np.atleast_1d(ax) if ax is not None else np.atleast_1d(
        plt.subplots(len(levels), 1, figsize=(max(6, 0.5 * td.sizes.get(dim, 1) + 3), 3.2 * len(levels)),
                     squeeze=False)[1][:, 0]
    )
    ipc_max = float(td.attrs.get("topdown_ipc_max", 4.0))
    scale = 100.0 / ipc_max if fraction else 1.0
    labels = _bar_labels(td, dim) if dim else ["all"]
    x = np.arange(len(labels))
    for axis, lv in zip(axes, levels, strict=True):
        cut = _td.level_cut(lv, td.data_vars)
        if not any(_td._BY_NAME[n].level == lv for n in cut):
            raise ValueError(f"level {lv} is not in this Top-Down Dataset")
        drawn, small = _collapse(cut, td, ipc_max)
        colors = _node_colors(drawn)
        bottom = np.zeros(len(x))
        width = 0.8 if len(x) < 60 else 1.0
        for name in drawn + (["other"] if small else []):
            # Small negative values (replay from different passes) would stack downwards; draw them as 0.
            parts = [name] if name != "other" else small
            height = sum(np.clip(np.atleast_1d(np.asarray(td[n], dtype=float)), 0, None) for n in parts) * scale
            label = name if name != "other" else f"other ({len(small)} nodes < {NEGLIGIBLE:.1%} each)"
            axis.bar(x, height, bottom=bottom, color=colors.get(name, _OTHER_COLOR), label=label, width=width)
            bottom += np.nan_to_num(height)
        if share is not None and len(x) <= 60:
            for xi, top, sh in zip(x, bottom, share, strict=True):
                axis.text(xi, top, f"{sh:.0%}" if sh >= 0.01 else f"{sh:.1%}", ha="center", va="bottom",
                          fontsize="x-small")
        axis.set_xticks(x, labels, rotation=45 if len(x) > 6 else 0, ha="right" if len(x) > 6 else "center")
        if len(x) > 60:
            axis.set_xticks(x[:: len(x) // 20 + 1], [labels[i] for i in x[:: len(x) // 20 + 1]])
        axis.set_ylim(0, ipc_max * scale * 1.1)
        axis.set_ylabel("% of IPC_MAX" if fraction else f"IPC ({td.attrs.get('topdown_units', _td.UNITS)})")
        axis.set_title(f"Top-Down level {lv}")
        xlabel = _DIM_LABEL.get(dim, dim or "")
        if share is not None and len(x) <= 60:
            xlabel += f"; the number above a bar is its share of all the {what}"
        axis.set_xlabel(textwrap.fill(xlabel, int(9 * axis.figure.get_figwidth())), fontsize="small")
        axis.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize="small", frameon=False)
    axes[0].figure.tight_layout()
    return axes[0] if len(axes) == 1 else axes


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
    return [(int(a), int(b), values[a]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


def short_label(name: str, units: str = "") -> str:
    """A short axis label for a CUPTI metric name, with its unit: ``dram__read_throughput.avg.pct_of_peak_\
sustained_elapsed`` -> ``dram read throughput (% of peak)``."""
    base, _, rollup = name.partition(".")
    words = base.replace("__", " ").replace("_", " ").replace(" realtime", "")
    if rollup.endswith("pct_of_peak_sustained_elapsed") or rollup.endswith("pct_of_peak_sustained_active"):
        unit = "% of peak"
    elif rollup.endswith(".per_second") and units:  # CUPTI versions write byte, byte/second or byte/second/second
        unit = units.split("/")[0] + "/s"
    else:
        unit = {"percent": "%"}.get(units, units.replace("second", "s"))
    return f"{words} ({unit})" if unit else words


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


def _phase_colors(ds: xr.Dataset, dim: str, range_colors: dict) -> dict:
    """Colour per phase: the colour of the user range holding most of its samples, when no larger phase took
    it; otherwise the next palette colour no range uses."""
    plt = _pyplot()
    cmap = plt.get_cmap(_PALETTE)
    phase = np.asarray(ds["phase"])
    ranges = string_labels(ds["range"]) if "range" in ds.coords and ds["range"].dims == (dim,) else None
    ids = [int(p) for p in np.asarray(ds["phase_id"])]
    sizes = {p: int(np.sum(phase == p)) for p in ids}
    colors, taken = {}, set()
    for p in sorted(ids, key=lambda p: -sizes[p]):
        if ranges is not None and sizes[p]:
            names, counts = np.unique(ranges[phase == p], return_counts=True)
            best = names[np.argmax(counts)]
            if best in range_colors and counts.max() > sizes[p] / 2 and best not in taken:
                colors[p] = range_colors[best]
                taken.add(best)
    free = (cmap(i % cmap.N) for i in range(len(range_colors), len(range_colors) + len(ids)))
    for p in ids:
        colors.setdefault(p, next(free))
    return colors


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
    columns = {n: np.asarray(ds[n], dtype=float) for n in names}
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

    plt = _pyplot()
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
    range_colors = _label_colors(range_values)
    phased = "segment_first" in ds
    phase_colors = _phase_colors(ds, dim, range_colors) if phased else {}
    caption = "\n".join(textwrap.fill(text, 200) for text in skipped)
    if fig is None:
        fig = plt.figure(figsize=(10, 1.6 + 1.3 * len(names) + 0.12 * caption.count("\n")))
    fig.clear()
    axes = fig.subplots(len(names) + bands, 1, sharex=True, squeeze=False,
                        gridspec_kw={"height_ratios": [0.35] * bands + [1] * len(names)})[:, 0]
    banded = False
    for axis, name in zip(axes[bands:], names, strict=True):
        for kernel, idx in lines.items():
            xs, mean, lo, hi = _blocks(x[idx], columns[name][idx], max_points, band)
            if band is not None and np.any(hi > lo):
                axis.fill_between(xs, lo, hi, color=line_colors[kernel], alpha=0.25, lw=0, step="mid")
                banded = True
            axis.plot(xs, mean, lw=0.8, color=line_colors[kernel], marker="." if len(xs) <= 60 else None)
        axis.set_ylabel(textwrap.fill(short_label(name, ds[name].attrs.get("units", "")), 36), fontsize="x-small",
                        rotation=0, ha="right", va="center")
        axis.set_title(name, loc="left", fontsize="xx-small", pad=2)  # the full name, above the traces
        _value_ticks(axis, columns[name])
        if phased:
            for first, stop, label in zip(ds["segment_first"].values, ds["segment_stop"].values,
                                          ds["segment_phase"].values, strict=True):
                right = x[stop] if stop < len(x) else x[-1] + (x[-1] - x[-2] if len(x) > 1 else 1)
                axis.axvspan(x[first], right, color=phase_colors[int(label)], alpha=0.25, lw=0)
    handles = [plt.Line2D([], [], color=c, lw=1.5, marker="." if len(x) <= 60 else None) for c in line_colors.values()]
    labels = list(lines) if len(lines) > 1 else ["mean per pixel column"]
    if banded:
        handles.append(plt.Rectangle((0, 0), 1, 1, color="0.6", alpha=0.5))
        labels.append(f"{band[0]:g}-{band[1]:g}th percentile of its samples")
    if phased:
        handles += [plt.Rectangle((0, 0), 1, 1, color=phase_colors[int(p)], alpha=0.5) for p in ds["phase_id"].values]
        labels += [f"phase {int(p)}" for p in ds["phase_id"].values]
    axes[-1].legend(handles, labels, fontsize="x-small", ncol=min(len(handles), 6), loc="upper center",
                    bbox_to_anchor=(0.5, -0.45), frameon=False)
    if bands:
        band_axis = axes[0]
        for first, stop, value in _runs(range_values):
            right = x[stop] if stop < len(x) else x[-1]
            if value:
                band_axis.axvspan(x[first], right, color=range_colors[value], alpha=0.6, lw=0)
            if value and (right - x[first]) > 0.06 * (x[-1] - x[0] or 1):
                band_axis.text((x[first] + right) / 2, 0.5, value, ha="center", va="center", fontsize="x-small")
        band_axis.set_yticks([])
        band_axis.set_ylabel("range", fontsize="x-small", rotation=0, ha="right", va="center")
    axes[-1].set_xlabel(xlabel)
    if caption:
        fig.text(0.01, 0.005, caption, fontsize="xx-small", va="bottom")
    height = fig.get_figheight()
    fig.tight_layout(rect=(0, (0.1 + 0.1 * (caption.count("\n") + 1)) / height if caption else 0, 1, 1))
    return fig


def hierarchy(ds: xr.Dataset, *, fraction: bool = True, ax=None):
    """The Top-Down tree as an icicle chart: one row per level, each node as wide as its value.

    Ranges are first averaged with :func:`gpuscope.metrics.topdown.aggregate` (``by=None``). Boxes wide enough
    carry their name and value; a legend beside the chart lists every node of at least ``NEGLIGIBLE`` of
    ``IPC_MAX`` with its value (slivers included) and counts the smaller ones.

    Parameters
    ----------
    ds : xarray.Dataset
        A Top-Down Dataset (or range results with the ``topdown`` metric set).
    fraction : bool
        Label nodes in percent of ``IPC_MAX`` (else IPC).
    ax : matplotlib.axes.Axes, optional

    Returns
    -------
    matplotlib.axes.Axes

    Raises
    ------
    gpuscope.errors.MissingMetricsError
        Raw metrics lack what Top-Down needs, or there is no weight to average ranges with (per-group
        results of :func:`gpuscope.metrics.topdown.aggregate` carry theirs in the ``weight`` coordinate).
    """
    plt = _pyplot()
    td = _as_topdown(ds)
    over = next(iter(td.dims), None)
    if td.dims:
        dim = next(iter(td.dims))
        # aggregated groups carry their summed weight; ranges find theirs (cycles, else duration)
        weight = "weight" if "weight" in td.coords and td["weight"].dims == (dim,) else None
        td = _td.aggregate(td, by=None, weight=weight, dim=dim)
    ipc_max = float(td.attrs.get("topdown_ipc_max", 4.0))
    names = [n for n in td.data_vars if n in _td._BY_NAME]
    values = {n: max(float(td[n]), 0.0) for n in names}
    colors = _node_colors(names)
    if ax is None:
        ax = plt.subplots(figsize=(13, 4.5))[1]
    # Lay children out inside their parent's span, left to right, in hierarchy order.
    cursor = {"": 0.0}  # where the next child of each node starts
    handles, labels, small = [], [], 0
    for node in _td.NODES:
        if node.name not in values:
            continue
        start, width = cursor.get(node.parent, 0.0), values[node.name]
        cursor[node.parent] = start + width
        cursor[node.name] = start
        bar = ax.barh(-node.level, width, left=start, height=0.9, color=colors[node.name], edgecolor="white")
        if width > 0.06 * ipc_max:  # narrower boxes cannot hold a readable label: the legend names them
            text = f"{100 * width / ipc_max:.0f}%" if fraction else f"{width:.2f}"
            label = node.name.removeprefix(node.parent + "_") if node.parent else node.name
            ax.text(start + width / 2, -node.level, f"{label}\n{text}", ha="center", va="center", fontsize="x-small")
        if width >= NEGLIGIBLE * ipc_max:
            handles.append(bar)
            labels.append(f"{node.name}  {f'{100 * width / ipc_max:.1f}%' if fraction else f'{width:.3f}'}")
        else:
            small += 1
    if small:
        handles.append(plt.Rectangle((0, 0), 1, 1, color="white"))
        labels.append(f"({small} nodes < {NEGLIGIBLE:.1%} each not listed)")
    ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="x-small", frameon=False,
              ncol=2 if len(handles) > 16 else 1, title=f"node, {'% of IPC_MAX' if fraction else 'IPC'}",
              title_fontsize="x-small")
    ax.set_xlim(0, ipc_max)
    ax.set_yticks([-1, -2, -3], ["level 1", "level 2", "level 3"])
    ax.set_xlabel(f"IPC ({_td.UNITS}); IPC_MAX = {ipc_max:g}")
    ax.set_title("Top-Down hierarchy" + (f" (weighted mean over the {over} dimension)" if over else ""))
    ax.figure.tight_layout()
    return ax


def phase_topdown(phases: xr.Dataset, per_phase: xr.Dataset, level=1, *, metric: str | None = None,
                  fraction: bool = False, max_points: int = 1000, fig=None):
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
    fraction : bool
        Bars in percent of ``IPC_MAX`` instead of IPC.
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
    ranges = string_labels(phases["range"]) if "range" in phases.coords else np.array([], dtype=str)
    colors = _phase_colors(phases, "time", _label_colors(ranges))
    if fig is None:
        fig = plt.figure(figsize=(10, 6.5))
    fig.clear()
    top, bottom = fig.subplots(2, 1, gridspec_kw={"height_ratios": [1, 1.6]})
    xs, mean, lo, hi = _blocks(x, np.asarray(phases[metric], dtype=float), max_points)
    top.fill_between(xs, lo, hi, color="0.6", alpha=0.5, lw=0, step="mid")
    top.plot(xs, mean, lw=0.8, color="black")
    for first, stop, label in zip(phases["segment_first"].values, phases["segment_stop"].values,
                                  phases["segment_phase"].values, strict=True):
        right = x[stop] if stop < len(x) else x[-1]
        top.axvspan(x[first], right, color=colors[int(label)], alpha=0.3, lw=0)
    top.set_ylabel(short_label(metric, phases[metric].attrs.get("units", "")), fontsize="x-small")
    top.set_xlabel(xlabel)
    top.set_title("phases over time", fontsize="small")
    bars = per_phase.assign_coords(weight=("phase_id", np.asarray(per_phase["phase_duration"], dtype=float)))
    nodes = [n for n in bars.data_vars if n in _td._BY_NAME]
    topdown(bars[nodes], level, fraction=fraction, sort=False, ax=bottom)
    labels = []
    for p in ids:
        empty = bool(np.all(np.isnan([float(bars[n].sel(phase_id=p)) for n in nodes])))
        labels.append(f"phase {p}" + ("\n(no profiled work)" if empty else ""))
    bottom.set_xticks(np.arange(len(ids)), labels, rotation=0, fontsize="x-small")
    for tick, p in zip(bottom.get_xticklabels(), ids, strict=True):
        tick.set_bbox({"facecolor": colors[int(p)], "alpha": 0.4, "edgecolor": "none", "pad": 1.5})
    by = per_phase.attrs.get("topdown_by", "")
    bottom.set_title(f"Top-Down level {level} per phase (joined by {by})", fontsize="small")
    fig.tight_layout()
    return fig

