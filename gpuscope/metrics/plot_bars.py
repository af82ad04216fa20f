"""Top-Down as bars: stacked bars per range, group or phase (:func:`topdown`) and the tree as an icicle chart.

matplotlib is imported inside each function, never at import time; colours from :mod:`gpuscope.metrics.plot_colors`.
"""

from __future__ import annotations

import textwrap

import numpy as np
import xarray as xr

from gpuscope._schema.names import brief_name
from gpuscope.errors import MissingMetricsError
from gpuscope.metrics import topdown as _td
from gpuscope.metrics.plot_colors import _OTHER_COLOR, _node_colors, _pyplot, node_words
from gpuscope.metrics.topdown_aggregate import _weights

__all__ = ["NEGLIGIBLE", "hierarchy", "topdown"]

_LABEL_COORDS = ("name", "kernel")
_DIM_LABEL = {"range": "kernel launch or user range", "phase_id": "phase"}
#: Level-3 nodes below this many percent of IPC_MAX in every bar are drawn as one grey "other" segment; a segment
#: below it in every bar has no visible bar, and no legend entry.
NEGLIGIBLE = 0.5
#: Default figure width (inches, a two-column paper figure) and resolution of the saved PNG; every text is at least
#: FONT points at that size.
WIDTH, DPI, FONT = 7.0, 150, 8
#: Bars of :func:`topdown` that keep a name each (slanted 8 pt names need about 12 pt apart on the ~4.4 in of bars
#: a WIDTH figure leaves; more bars name every n-th), and that keep their share above them (a "12%" needs ~20 pt).
_NAMED_BARS, _SHARED_BARS = 26, 16


def _as_topdown(ds: xr.Dataset) -> xr.Dataset:
    """The Dataset itself when it already holds Top-Down nodes, else its Top-Down."""
    if any(n in _td._BY_NAME for n in ds.data_vars):
        return ds
    return _td.topdown(ds)


def _bar_labels(td: xr.Dataset, dim: str) -> list[str]:
    """Bar labels: the dim's coordinate (kernel, phase), else name/kernel (range results, whose index is a row
    number); repeated labels get ``#launch``."""
    values = None
    for coord in _LABEL_COORDS if dim == "range" else (dim, *_LABEL_COORDS):
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


def _brief(label: str) -> str:
    """A row label with the kernel's :func:`~gpuscope._schema.names.brief_name` (a ``#launch`` suffix kept)."""
    head, sep, launch = label.rpartition("#")
    return brief_name(head) + sep + launch if sep and launch.isdigit() else brief_name(label)


def _brief_labels(labels: list[str]) -> list[str]:
    """Labels for a legend: each one :func:`_brief`, and in full where two would read alike (C++ kernels that
    differ only in their scope or template arguments)."""
    brief = [_brief(v) for v in labels]
    return [b if brief.count(b) == 1 else v for v, b in zip(labels, brief, strict=True)]


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


def _collapse(cut: list[str], td: xr.Dataset) -> tuple[list[str], list[str]]:
    """(nodes to draw, nodes below NEGLIGIBLE percent in every bar, drawn as one "other" segment)."""
    small = [n for n in cut if _td._BY_NAME[n].level == 3
             and np.nanmax(np.abs(np.atleast_1d(np.asarray(td[n], dtype=float))), initial=0) < NEGLIGIBLE]
    return [n for n in cut if n not in small], small


def topdown(ds: xr.Dataset, level=1, *, by: str | None = None, sort: bool | None = None, ax=None):
    """Stacked Top-Down bars, one bar per range (or per group with ``by``), annotated with each bar's time share.

    The x-axis label says what the bars are and what the number above each is (its share of all the SM cycles,
    or of the time where there is no cycle count), so it stays explained when the caller replaces the title.

    Parameters
    ----------
    ds : xarray.Dataset
        A Top-Down Dataset, or range results holding the ``topdown`` metric set (computed here).
    level : int or sequence of int
        Level(s) to show; one axes per level. Each bar stacks the level's cut, which sums to 100% of ``IPC_MAX``
        (the nodes' unit). Level-3 nodes below 0.5% in every bar are merged into one grey "other" segment.
    by : str, optional
        Aggregate first (:func:`gpuscope.metrics.topdown.aggregate`), e.g. ``"kernel"``.
    sort : bool, optional
        Order bars by time share, largest first. Default: sort groups (aggregated data), keep ranges in
        their order (launch order, as :func:`gpuscope.metrics.phase_topdown.dynamic` returns them).
    ax : matplotlib.axes.Axes or sequence of them, optional
        Where to draw; new figure by default.

    Returns
    -------
    matplotlib.figure.Figure
        The figure drawn into, one Axes per level in ``fig.axes`` (``ax``'s figure when *ax* is given): every
        gpuscope plot returns its Figure (``fig.savefig`` saves it).

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
        plt.subplots(len(levels), 1, figsize=(WIDTH, 2.9 * len(levels)), squeeze=False, dpi=DPI,
                     layout="constrained")[1][:, 0]
    )
    ipc_max = float(td.attrs.get("topdown_ipc_max", 4.0))
    labels = _bar_labels(td, dim) if dim else ["all"]
    x = np.arange(len(labels))
    for axis, lv in zip(axes, levels, strict=True):
        cut = _td.level_cut(lv, td.data_vars)
        if not any(_td._BY_NAME[n].level == lv for n in cut):
            raise ValueError(f"level {lv} is not in this Top-Down Dataset")
        drawn, small = _collapse(cut, td)
        colors = _node_colors(drawn)
        bottom = np.zeros(len(x))
        width = 0.8 if len(x) < 60 else 1.0
        shown = []  # the segments with a visible bar, bottom-up
        for name in drawn + (["other"] if small else []):
            # Small negative values (replay from different passes) would stack downwards; draw them as 0.
            parts = [name] if name != "other" else small
            height = sum(np.clip(np.atleast_1d(np.asarray(td[n], dtype=float)), 0, None) for n in parts)
            label = node_words(name) if name != "other" else f"other ({len(small)} nodes < {NEGLIGIBLE:g}% each)"
            bars = axis.bar(x, height, bottom=bottom, color=colors.get(name, _OTHER_COLOR), label=label, width=width)
            if np.nanmax(np.nan_to_num(height), initial=0) >= NEGLIGIBLE:
                shown.append(bars)
            bottom += np.nan_to_num(height)
        if share is not None and len(x) <= _SHARED_BARS:
            for xi, top, sh in zip(x, bottom, share, strict=True):
                axis.text(xi, top, f"{sh:.0%}" if sh >= 0.01 else f"{sh:.1%}", ha="center", va="bottom",
                          fontsize=FONT)
        named = x[:: -(-len(x) // _NAMED_BARS)]
        axis.set_xticks(named, [labels[i] for i in named], rotation=45 if len(x) > 6 else 0,
                        ha="right" if len(x) > 6 else "center", rotation_mode="anchor" if len(x) > 6 else "default")
        axis.tick_params(labelsize=FONT)
        axis.set_ylim(0, _td.FULL_SCALE * 1.1)
        axis.set_ylabel(f"% of peak issue rate\n(IPC_MAX {ipc_max:g})", fontsize=FONT + 1)
        axis.set_title(f"Top-Down level {lv}", fontsize=FONT + 2)
        xlabel = _DIM_LABEL.get(dim, dim or "")
        if len(named) < len(x):
            xlabel += f" (one in {named[1] - named[0]} named)"
        if share is not None and len(x) <= _SHARED_BARS:
            xlabel += f"; the number above a bar is its share of all the {what}"
        axis.set_xlabel(textwrap.fill(xlabel, int(13 * axis.figure.get_figwidth())), fontsize=FONT)
        # top entry = top segment: the legend reads bottom-up as the stack builds
        axis.legend(shown[::-1], [b.get_label() for b in shown[::-1]], loc="center left", bbox_to_anchor=(1.0, 0.5),
                    fontsize=FONT, frameon=False)
    return axes[0].figure


def hierarchy(ds: xr.Dataset, *, ax=None):
    """The Top-Down tree as an icicle chart: one row per level, each node as wide as its value.

    Ranges are first averaged with :func:`gpuscope.metrics.topdown.aggregate` (``by=None``). Boxes wide enough
    carry their name and value; a legend beside the chart lists every node of at least ``NEGLIGIBLE`` percent of
    ``IPC_MAX`` with its value (slivers included) and counts the smaller ones.

    Parameters
    ----------
    ds : xarray.Dataset
        A Top-Down Dataset (or range results with the ``topdown`` metric set).
    ax : matplotlib.axes.Axes, optional

    Returns
    -------
    matplotlib.figure.Figure
        The figure drawn into (``ax.figure`` when *ax* is given): every gpuscope plot returns its Figure
        (``fig.axes`` holds the panels, ``fig.savefig`` saves it).

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
        ax = plt.subplots(figsize=(WIDTH, 3.6), dpi=DPI, layout="constrained")[1]
    # Lay children out inside their parent's span, left to right, in hierarchy order.
    cursor = {"": 0.0}  # where the next child of each node starts
    parents = {node.parent for node in _td.NODES if node.name in values}
    deepest = max((node.level for node in _td.NODES if node.name in values), default=1)
    handles, labels, small, boxed = [], [], 0, []
    for node in _td.NODES:
        if node.name not in values:
            continue
        start, width = cursor.get(node.parent, 0.0), values[node.name]
        cursor[node.parent] = start + width
        cursor[node.name] = start
        # A node without children (retire) reaches down to the deepest row: no blank space under it.
        rows = 1 + (deepest - node.level if node.name not in parents else 0)
        middle = -(node.level + node.level + rows - 1) / 2
        bar = ax.barh(middle, width, left=start, height=rows - 0.1, color=colors[node.name], edgecolor="white")
        label = node.name.removeprefix(node.parent + "_").replace("_", " ")
        boxed.append((ax.text(start + width / 2, middle, f"{label}\n{width:.0f}%", ha="center", va="center",
                              fontsize=FONT), bar.patches[0]))
        if width >= NEGLIGIBLE:
            handles.append(bar)
            labels.append(f"{node_words(node.name)}  {width:.1f}%")
        else:
            small += 1
    if small:
        handles.append(plt.Rectangle((0, 0), 1, 1, color="white"))
        labels.append(f"({small} nodes < {NEGLIGIBLE:g}% each not listed)")
    ax.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=FONT, frameon=False,
              ncol=2 if len(handles) > 16 else 1, title="node, % of peak issue rate", title_fontsize=FONT)
    ax.set_xlim(0, _td.FULL_SCALE)
    ax.set_ylim(-deepest - 0.5, -0.5)
    ax.set_yticks(list(range(-1, -deepest - 1, -1)), [f"level {lv}" for lv in range(1, deepest + 1)])
    ax.tick_params(labelsize=FONT)
    # two short lines each: the legend beside the chart leaves it narrow on a small figure of the caller's
    ax.set_xlabel(f"% of the SM's peak issue rate\n(IPC_MAX = {ipc_max:g} warp instructions per cycle)", fontsize=FONT)
    ax.set_title("Top-Down hierarchy" + (f"\nweighted mean over the {over} dimension" if over else ""),
                 fontsize=FONT + 1, loc="left")
    ax.figure.draw_without_rendering()  # the figure's own layout (the caller's, or ours) places the boxes
    renderer = ax.figure.canvas.get_renderer()
    for text, box in boxed:  # a name wider than its box would run over its neighbours: the legend names it
        if text.get_window_extent(renderer).width > box.get_window_extent(renderer).width - 2:
            text.remove()
    return ax.figure
