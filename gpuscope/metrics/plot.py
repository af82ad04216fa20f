"""Plots of Top-Down and phase results. matplotlib is imported inside each function, never at import time.

Colours follow the hierarchy: every level-1 node has a colour family (retire green, divergence orange,
frontend blue, backend red) and its descendants take shades of it, so levels can be compared by colour.
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from . import topdown as _td

__all__ = ["hierarchy", "timeline", "topdown"]

_FAMILY = {"retire": "Greens", "divergence": "Oranges", "frontend": "Blues", "backend": "Reds"}
_LABEL_COORDS = ("name", "kernel")


def _pyplot():
    import matplotlib.pyplot as plt

    return plt


def _root(name: str) -> str:
    node = _td._BY_NAME[name]
    while node.parent:
        node = _td._BY_NAME[node.parent]
    return node.name


def _node_colors(names: list[str]) -> dict[str, tuple]:
    """Shades of the level-1 ancestor's colour map, darker for the first child."""
    import matplotlib

    colors, groups = {}, {}
    for n in names:
        groups.setdefault(_root(n), []).append(n)
    for root, members in groups.items():
        cmap = matplotlib.colormaps[_FAMILY[root]]
        for i, n in enumerate(members):
            colors[n] = cmap(0.75 - 0.5 * i / max(len(members) - 1, 1) if len(members) > 1 else 0.6)
    return colors


def _as_topdown(ds: xr.Dataset) -> xr.Dataset:
    """The Dataset itself when it already holds Top-Down nodes, else its Top-Down."""
    if any(n in _td._BY_NAME for n in ds.data_vars):
        return ds
    return _td.topdown(ds)


def _bar_labels(td: xr.Dataset, dim: str) -> list[str]:
    if dim in td.coords and td[dim].dims == (dim,):
        return [str(v) for v in np.asarray(td[dim])]
    for coord in _LABEL_COORDS:
        if coord in td.coords and td[coord].dims == (dim,):
            values = [str(v) for v in np.asarray(td[coord])]
            if "launch" in td.coords and len(set(values)) < len(values):
                values = [f"{v}#{int(k)}" for v, k in zip(values, np.asarray(td["launch"]), strict=True)]
            return values
    return [str(i) for i in range(td.sizes[dim])]


def topdown(ds: xr.Dataset, level=1, *, by: str | None = None, fraction: bool = False, ax=None):
    """Stacked Top-Down bars, one bar per range (or per group with ``by``).

    Parameters
    ----------
    ds : xarray.Dataset
        A Top-Down Dataset, or range results holding the ``topdown`` metric set (computed here).
    level : int or sequence of int
        Level(s) to show; one axes per level. Each bar stacks the level's cut, which sums to ``IPC_MAX``.
    by : str, optional
        Aggregate first (:func:`gpuscope.metrics.topdown.aggregate`), e.g. ``"kernel"``.
    fraction : bool
        Show percent of ``IPC_MAX`` instead of IPC.
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
        colors = _node_colors(cut)
        bottom = np.zeros(len(x))
        for name in cut:
            # Small negative values (replay from different passes) would stack downwards; draw them as 0.
            height = np.clip(np.atleast_1d(np.asarray(td[name], dtype=float)), 0, None) * scale
            axis.bar(x, height, bottom=bottom, color=colors[name], label=name, width=0.8 if len(x) < 60 else 1.0)
            bottom += np.nan_to_num(height)
        axis.set_xticks(x, labels, rotation=45 if len(x) > 6 else 0, ha="right" if len(x) > 6 else "center")
        if len(x) > 60:
            axis.set_xticks(x[:: len(x) // 20 + 1], [labels[i] for i in x[:: len(x) // 20 + 1]])
        axis.set_ylim(0, ipc_max * scale * 1.02)
        axis.set_ylabel("% of IPC_MAX" if fraction else f"IPC ({td.attrs.get('topdown_units', _td.UNITS)})")
        axis.set_title(f"Top-Down level {lv}")
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


def timeline(ds: xr.Dataset, metrics=None, *, dim: str | None = None, max_points: int = 5000, fig=None):
    """Metrics over time (or launches) with the phases shaded and the open user range as a band on top.

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
        Longer series are drawn as the mean of equal blocks (the shading stays exact).
    fig : matplotlib.figure.Figure, optional
        Figure to draw into (cleared); new by default.

    Returns
    -------
    matplotlib.figure.Figure

    Raises
    ------
    ValueError
        No sample dimension or nothing to plot.
    gpuscope.errors.MissingMetricsError
        A requested metric is not in ``ds``.
    """
    from .phases import _metric_names, _sample_dim

    plt = _pyplot()
    dim = _sample_dim(ds, dim)
    if metrics is None and "metric" in ds.coords:
        metrics = [str(m) for m in np.asarray(ds["metric"])]
    names = _metric_names(ds, dim, metrics)[:8] if metrics is None else _metric_names(ds, dim, metrics)
    x, xlabel, origin, per_unit = _sample_axis(ds, dim)
    bands = "range" in ds.coords and ds["range"].dims == (dim,) and dim != "range"
    rows = len(names) + bands
    if fig is None:
        fig = plt.figure(figsize=(10, 1.0 + 1.6 * len(names)))
    fig.clear()
    axes = fig.subplots(rows, 1, sharex=True, squeeze=False,
                        gridspec_kw={"height_ratios": [0.35] * bands + [1] * len(names)})[:, 0]
    block = max(1, len(x) // max_points)
    cut = len(x) // block * block or len(x)
    xs = x[:cut].reshape(-1, block).mean(1)
    phased = "segment_first" in ds
    cmap = plt.get_cmap("tab10")
    for axis, name in zip(axes[bands:], names, strict=True):
        y = np.asarray(ds[name], dtype=float)[:cut].reshape(-1, block).mean(1)
        axis.plot(xs, y, lw=0.8, color="black")
        units = ds[name].attrs.get("units", "")
        axis.set_ylabel(f"{name}\n({units})" if units else name, fontsize="x-small", rotation=0, ha="right")
        if phased:
            for first, stop, label in zip(ds["segment_first"].values, ds["segment_stop"].values,
                                          ds["segment_phase"].values, strict=True):
                right = x[stop] if stop < len(x) else x[-1] + (x[-1] - x[-2] if len(x) > 1 else 1)
                axis.axvspan(x[first], right, color=cmap(int(label) % 10), alpha=0.18, lw=0)
    if phased:
        handles = [plt.Rectangle((0, 0), 1, 1, color=cmap(int(p) % 10), alpha=0.4) for p in ds["phase_id"].values]
        axes[-1].legend(handles, [f"phase {int(p)}" for p in ds["phase_id"].values], fontsize="x-small",
                        ncol=min(len(handles), 8), loc="upper center", bbox_to_anchor=(0.5, -0.35), frameon=False)
    if bands:
        band = axes[0]
        values = np.asarray(ds["range"]).astype(str)
        names_seen = list(dict.fromkeys(values))
        for first, stop, value in _runs(values):
            right = x[stop] if stop < len(x) else x[-1]
            band.axvspan(x[first], right, color=plt.get_cmap("Set3")(names_seen.index(value) % 12), lw=0)
            if (right - x[first]) > 0.06 * (x[-1] - x[0] or 1):
                band.text((x[first] + right) / 2, 0.5, value, ha="center", va="center", fontsize="x-small")
        band.set_yticks([])
        band.set_ylabel("range", fontsize="x-small", rotation=0, ha="right")
    axes[-1].set_xlabel(xlabel)
    fig.tight_layout()
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
        Raw metrics lack what Top-Down needs, or there is no weight to average ranges with.
    """
    plt = _pyplot()
    td = _as_topdown(ds)
    if td.dims:
        td = _td.aggregate(td, by=None, dim=next(iter(td.dims)))
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
