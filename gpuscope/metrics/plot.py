"""Plots of Top-Down and phase results. matplotlib is imported inside each function, never at import time.

Colours follow the hierarchy: every level-2 node has its own colour family (retire green, divergence orange,
frontend fetch blue, decode grey, backend core red, backend memory purple) and level-3 nodes take shades of
their parent's family spread as far apart as the family allows, so levels can be compared by colour. Ranges
and phases share one palette: a phase that lies mostly in one user range takes that range's colour.
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from . import topdown as _td

__all__ = ["hierarchy", "timeline", "topdown", "phase_topdown", "short_label"]

_FAMILY = {
    "retire": "Greens", "divergence": "Oranges", "divergence_branch": "Oranges", "divergence_replay": "YlOrBr_light",
    "frontend": "Blues", "frontend_fetch": "Blues", "frontend_decode": "Greys",
    "backend": "Reds", "backend_core": "Reds", "backend_memory": "Purples",
}
_LABEL_COORDS = ("name", "kernel")
#: Nodes below this share of IPC_MAX in every bar are drawn as one grey "other" segment.
NEGLIGIBLE = 0.005
_OTHER_COLOR = (0.88, 0.88, 0.85, 1.0)
_PALETTE = "tab10"


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


def _time_share(td: xr.Dataset, dim: str) -> np.ndarray | None:
    """Each bar's share of the total weight (time in SM cycles or ns), None when there is no weight."""
    weight = "weight" if "weight" in td.coords and td["weight"].dims == (dim,) else None
    try:
        w = np.asarray(_td._weights(td, weight, dim), dtype=float)
    except _td.MissingMetricsError:
        return None
    total = np.nansum(w)
    return w / total if total > 0 and w.shape == (td.sizes[dim],) else None


def _collapse(cut: list[str], td: xr.Dataset, ipc_max: float) -> tuple[list[str], list[str]]:
    """(nodes to draw, nodes below NEGLIGIBLE of IPC_MAX in every bar, drawn as one "other" segment)."""
    small = [n for n in cut if _td._BY_NAME[n].level == 3
             and np.nanmax(np.abs(np.atleast_1d(np.asarray(td[n], dtype=float))), initial=0) < NEGLIGIBLE * ipc_max]
    return [n for n in cut if n not in small], small


def topdown(ds: xr.Dataset, level=1, *, by: str | None = None, fraction: bool = False, sort: bool | None = None,
            ax=None):
    """Stacked Top-Down bars, one bar per range (or per group with ``by``), annotated with each bar's time share.

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
        their order (launch order, as :func:`gpuscope.metrics.topdown.dynamic` returns them).
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
    share = _time_share(td, dim) if dim else None
    if share is not None and (sort if sort is not None else dim != "range"):
        td = td.isel({dim: np.argsort(-share, kind="stable")})
        share = _time_share(td, dim)
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
        axis.set_title(f"Top-Down level {lv}" + (" (labels: share of time)" if share is not None else ""))
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
    else:
        unit = {"percent": "%"}.get(units, units.replace("second", "s"))
    return f"{words} ({unit})" if unit else words


def _blocks(x: np.ndarray, y: np.ndarray, n: int):
    """x centre, mean, min and max of *n* (about) equal blocks: what a pixel column shows."""
    edges = np.linspace(0, len(x), min(n, len(x)) + 1).astype(int)
    starts = edges[:-1][np.diff(edges) > 0]
    xs = np.add.reduceat(x, starts) / np.diff(np.append(starts, len(x)))
    valid = np.add.reduceat(~np.isnan(y), starts)  # NaN samples are left out; an all-NaN block stays NaN
    mean = np.where(valid > 0, np.add.reduceat(np.nan_to_num(y), starts) / np.maximum(valid, 1), np.nan)
    return xs, mean, np.fmin.reduceat(y, starts), np.fmax.reduceat(y, starts)


def _phase_colors(ds: xr.Dataset, dim: str, range_colors: dict) -> dict:
    """Colour per phase: the colour of the user range holding most of its samples, when no larger phase took
    it; otherwise the next palette colour no range uses."""
    plt = _pyplot()
    cmap = plt.get_cmap(_PALETTE)
    phase = np.asarray(ds["phase"])
    ranges = np.asarray(ds["range"]).astype(str) if "range" in ds.coords and ds["range"].dims == (dim,) else None
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


def timeline(ds: xr.Dataset, metrics=None, *, dim: str | None = None, max_points: int = 1000, fig=None):
    """Metrics over time (or launches) with the phases shaded and the open user range as a band on top.

    Each panel shows, per pixel column (one of ``max_points`` blocks of samples), the mean as a line and the
    minimum-maximum as a band, so short spikes stay visible without thousands of raw samples merging into a
    solid block. Panels are labelled with a short name and unit (:func:`short_label`), the full CUPTI name is
    the panel's legend. Metrics that are constant over the whole series get no panel: the figure's caption lists
    them with their value. A phase that lies mostly in one user range has that range's colour.

    Parameters
    ----------
    ds : xarray.Dataset
        PM samples (dim ``time``) or range results, ideally the output of
        :func:`gpuscope.metrics.phases.phases` (phases are shaded when it is).
    metrics : str or list of str, optional
        Variables to draw, one row each; default the metrics phases were detected in, else every numeric
        1-D variable along the sample dimension (at most 8).
    dim : str, optional
        Sample dimension; default ``time``, else ``range``.
    max_points : int
        Number of blocks (about the plot's width in pixels).
    fig : matplotlib.figure.Figure, optional
        Figure to draw into (cleared); new by default.

    Returns
    -------
    matplotlib.figure.Figure

    Raises
    ------
    ValueError
        No sample dimension, nothing to plot, or every metric is constant.
    gpuscope.errors.MissingMetricsError
        A requested metric is not in ``ds``.
    """
    from .phases import _metric_names, _sample_dim

    plt = _pyplot()
    dim = _sample_dim(ds, dim)
    if metrics is None and "metric" in ds.coords:
        metrics = [str(m) for m in np.asarray(ds["metric"])]
    names = _metric_names(ds, dim, metrics)[:8] if metrics is None else _metric_names(ds, dim, metrics)
    columns = {n: np.asarray(ds[n], dtype=float) for n in names}
    constant = [n for n in names if not np.nanmax(columns[n], initial=-np.inf) > np.nanmin(columns[n], initial=np.inf)]
    names = [n for n in names if n not in constant]
    if not names:
        raise ValueError(f"every metric to plot is constant over {dim!r}: {constant}")
    x, xlabel, origin, per_unit = _sample_axis(ds, dim)
    bands = "range" in ds.coords and ds["range"].dims == (dim,) and dim != "range"
    range_values = np.asarray(ds["range"]).astype(str) if bands else np.array([], dtype=str)
    range_colors = _label_colors(range_values)
    phased = "segment_first" in ds
    phase_colors = _phase_colors(ds, dim, range_colors) if phased else {}
    rows = len(names) + bands
    if fig is None:
        fig = plt.figure(figsize=(10, 1.2 + 1.3 * len(names)))
    fig.clear()
    axes = fig.subplots(rows, 1, sharex=True, squeeze=False,
                        gridspec_kw={"height_ratios": [0.35] * bands + [1] * len(names)})[:, 0]
    for axis, name in zip(axes[bands:], names, strict=True):
        xs, mean, lo, hi = _blocks(x, columns[name], max_points)
        if np.any(hi > lo):
            axis.fill_between(xs, lo, hi, color="0.6", alpha=0.5, lw=0, step="mid")
        (line,) = axis.plot(xs, mean, lw=0.8, color="black")
        axis.set_ylabel(short_label(name, ds[name].attrs.get("units", "")), fontsize="x-small", rotation=0,
                        ha="right", va="center")
        axis.legend([line], [name], loc="upper right", fontsize="xx-small", frameon=False, handlelength=0)
        if phased:
            for first, stop, label in zip(ds["segment_first"].values, ds["segment_stop"].values,
                                          ds["segment_phase"].values, strict=True):
                right = x[stop] if stop < len(x) else x[-1] + (x[-1] - x[-2] if len(x) > 1 else 1)
                axis.axvspan(x[first], right, color=phase_colors[int(label)], alpha=0.25, lw=0)
    if phased:
        handles = [plt.Rectangle((0, 0), 1, 1, color=phase_colors[int(p)], alpha=0.5) for p in ds["phase_id"].values]
        axes[-1].legend(handles, [f"phase {int(p)}" for p in ds["phase_id"].values], fontsize="x-small",
                        ncol=min(len(handles), 8), loc="upper center", bbox_to_anchor=(0.5, -0.45), frameon=False)
    if bands:
        band = axes[0]
        for first, stop, value in _runs(range_values):
            right = x[stop] if stop < len(x) else x[-1]
            if value:
                band.axvspan(x[first], right, color=range_colors[value], alpha=0.6, lw=0)
            if value and (right - x[first]) > 0.06 * (x[-1] - x[0] or 1):
                band.text((x[first] + right) / 2, 0.5, value, ha="center", va="center", fontsize="x-small")
        band.set_yticks([])
        band.set_ylabel("range", fontsize="x-small", rotation=0, ha="right", va="center")
    axes[-1].set_xlabel(xlabel)
    if constant:
        fig.text(0.01, 0.005, "constant, not drawn: " + "; ".join(
            f"{n} = {columns[n][0]:g}" for n in constant), fontsize="xx-small", va="bottom", wrap=True)
    fig.tight_layout(rect=(0, 0.03 if constant else 0, 1, 1))
    return fig


def hierarchy(ds: xr.Dataset, *, fraction: bool = True, ax=None):
    """The Top-Down tree as an icicle chart: one row per level, each node as wide as its value.

    Ranges are first averaged with :func:`gpuscope.metrics.topdown.aggregate` (``by=None``).

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
        ax = plt.subplots(figsize=(12, 3.5))[1]
    # Lay children out inside their parent's span, left to right, in hierarchy order.
    cursor = {"": 0.0}  # where the next child of each node starts
    for node in _td.NODES:
        if node.name not in values:
            continue
        start, width = cursor.get(node.parent, 0.0), values[node.name]
        cursor[node.parent] = start + width
        cursor[node.name] = start
        ax.barh(-node.level, width, left=start, height=0.9, color=colors[node.name], edgecolor="white")
        if width > 0.06 * ipc_max:  # narrower boxes cannot hold a readable label
            text = f"{100 * width / ipc_max:.0f}%" if fraction else f"{width:.2f}"
            label = node.name.removeprefix(node.parent + "_") if node.parent else node.name
            ax.text(start + width / 2, -node.level, f"{label}\n{text}", ha="center", va="center", fontsize="x-small")
    ax.set_xlim(0, ipc_max)
    ax.set_yticks([-1, -2, -3], ["level 1", "level 2", "level 3"])
    ax.set_xlabel(f"IPC ({_td.UNITS}); IPC_MAX = {ipc_max:g}")
    ax.set_title("Top-Down hierarchy")
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
    from .phases import _metric_names

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
    ranges = np.asarray(phases["range"]).astype(str) if "range" in phases.coords else np.array([], dtype=str)
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
    bottom.set_title(f"Top-Down level {level} per phase (joined by {by}; labels: share of the run)", fontsize="small")
    fig.tight_layout()
    return fig

