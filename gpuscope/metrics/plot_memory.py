"""The memory chart: the memory hierarchy as a diagram with the traffic on its edges, in the manner of Nsight
Compute's (``ds.gpuscope.plot.memory_chart()``).

matplotlib is imported inside the function, never at import time. Logical spaces (green, as ncu draws them): the
global, local and shared memory the kernel's instructions address, each box with the warp load and store
instructions that address it; physical units (blue): the L1/TEX cache, shared memory, L2, device and system memory.
Between units, the upper arrow carries what is read (towards the SM), the lower one what is written, in bytes, and
the requests where the unit counts them. A unit's box gives its hit rate and how busy it was (percent of its peak);
the busiest has a red frame. Every text is 8 pt in a 7 in wide figure (a page's width), and the diagram is drawn
to scale so that an edge's labels run along it.
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from gpuscope.metrics import memory_workload as _mw
from gpuscope.metrics.plot_bars import DPI, FONT, WIDTH, _bar_labels, _brief, _brief_labels
from gpuscope.metrics.plot_colors import _pyplot
from gpuscope.metrics.plot_roofline import si

__all__ = ["memory_chart"]

_LOGICAL, _PHYSICAL = "#cfe8c6", "#cfdff2"
#: Boxes: name -> (x, y) centre, label, colour; four columns (spaces, L1 and shared memory, L2, off-chip memory) on
#: a 10 x 5.6 canvas drawn to scale (equal aspect), so that an edge's labels turn exactly as the edge does.
_BOXES = {
    "global": ((0.75, 4.5), "Global", _LOGICAL),
    "local": ((0.75, 2.9), "Local", _LOGICAL),
    "shared_space": ((0.75, 1.0), "Shared", _LOGICAL),
    "L1/TEX": ((3.5, 3.7), "L1/TEX Cache", _PHYSICAL),
    "shared": ((3.5, 1.0), "Shared Memory", _PHYSICAL),
    "L2": ((6.3, 3.7), "L2 Cache", _PHYSICAL),
    "DRAM": ((9.25, 4.8), "Device Memory", _PHYSICAL),
    "system": ((9.25, 2.4), "System Memory", _PHYSICAL),
}
_W, _H = 1.5, 1.1
_MARGIN = 0.12


def _row(mw: xr.Dataset, row: str, select) -> tuple[xr.Dataset, str]:
    """The row *select* picks (a label or a position; the only row when None), and its label."""
    labels = _bar_labels(mw, row)
    if select is None:
        if mw.sizes[row] != 1:
            raise ValueError(f"the Dataset has {mw.sizes[row]} rows along {row!r}: pick one with select= (a label "
                             f"of {labels[:8]}{' ...' if len(labels) > 8 else ''}, or a position)")
        index = 0
    elif isinstance(select, (int, np.integer)) and not isinstance(select, bool):
        index = int(select)
    elif str(select) in labels:
        index = labels.index(str(select))
    elif str(select) in _brief_labels(labels):  # a C++ kernel by its function's name
        index = _brief_labels(labels).index(str(select))
    else:
        raise ValueError(f"select={select!r} is neither a position nor a label of the rows along {row!r}: {labels}")
    return mw.isel({row: index}), labels[index]


def _box(ax, key: str, lines: list[str], busiest: bool):
    from matplotlib.patches import FancyBboxPatch

    (x, y), title, color = _BOXES[key]
    ax.add_patch(FancyBboxPatch((x - _W / 2, y - _H / 2), _W, _H, boxstyle="round,pad=0.02,rounding_size=0.08",
                                facecolor=color, edgecolor="#c0392b" if busiest else "0.35",
                                linewidth=2.2 if busiest else 0.9))
    ax.text(x, y + _H / 2 - 0.1, title, ha="center", va="top", fontsize=FONT, fontweight="bold")
    if lines:
        ax.text(x, y - 0.12, "\n".join(lines), ha="center", va="center", fontsize=FONT, linespacing=1.2)


def _edge(ax, a: str, b: str, above: str, below: str, both: bool = True):
    """Arrows between boxes *a* (nearer the SM) and *b*: reads from b to a above, writes from a to b below."""
    (xa, ya), (xb, yb) = _BOXES[a][0], _BOXES[b][0]
    start, end = np.array([xa + _W / 2, ya]), np.array([xb - _W / 2, yb])
    normal = np.array([-(end - start)[1], (end - start)[0]])
    normal = 0.09 * normal / np.hypot(*normal)
    style = {"arrowstyle": "-|>", "mutation_scale": 9, "linewidth": 1.0, "color": "0.3"}
    mid = (start + end) / 2
    angle = float(np.degrees(np.arctan2(*(end - start)[::-1])))
    if both:
        ax.annotate("", xy=start + normal, xytext=end + normal, arrowprops=style)
        ax.annotate("", xy=end - normal, xytext=start - normal, arrowprops=style)
    else:
        ax.annotate("", xy=end, xytext=start, arrowprops=style)
    for text, side in ((above, 1), (below, -1)):
        if text:
            ax.text(*(mid + side * 1.4 * normal), text, ha="center", va="bottom" if side > 0 else "top",
                    fontsize=FONT, rotation=angle, rotation_mode="anchor", color="0.1", linespacing=1.15)


def _count(value, unit: str) -> str:
    """A number with an SI prefix and its unit: bytes as ``3 GB``, counts as ``30 M inst``."""
    if value is None or not np.isfinite(value):
        return "-"
    return si(float(value), unit) if unit == "B" else f"{si(float(value), '').strip()} {unit}"


def memory_chart(ds: xr.Dataset, select=None, *, by: str | None = "kernel", ax=None, title: str | None = None):
    """The memory chart of one kernel (or range): instructions, requests and bytes on the edges, hit rates and the
    busy share of each unit in its box.

    Parameters
    ----------
    ds : xarray.Dataset
        Range results holding the ``memory`` set, or the output of
        :func:`gpuscope.metrics.memory_workload.memory_workload`.
    select : str or int, optional
        Which row: a label (the kernel name, a C++ kernel's function name alone, or the range path with
        ``by=None``) or a position; needed when there is more than one.
    by : str or None
        Combine the ranges per value of this coordinate (``"kernel"``, default) first; None keeps every range.
        Ignored when *ds* is already a memory workload.
    ax : matplotlib.axes.Axes, optional
        Axes to draw on; a new figure otherwise.
    title : str, optional
        The title; default names the row and the busiest unit.

    Returns
    -------
    matplotlib.figure.Figure
        The figure drawn into (``ax.figure`` when *ax* is given): every gpuscope plot returns its Figure
        (``fig.axes`` holds the panels, ``fig.savefig`` saves it).

    Raises
    ------
    ValueError
        *select* names no row, or is missing while there are several rows.
    gpuscope.errors.MissingMetricsError
        *ds* lacks the ``memory`` set's metrics.
    """
    plt = _pyplot()
    mw = ds if "busy" in ds.data_vars else _mw.memory_workload(ds, by=by if by in ds.coords else None)
    row = next(d for d in mw["busy"].dims if d != "level")
    one, label = _row(mw, row, select)
    if ax is None:
        _, ax = plt.subplots(figsize=(WIDTH, 4.7), dpi=DPI, layout="constrained")
    # the outer boxes reach 0 and 10, their frames a line's width further: a margin keeps them whole
    ax.set_xlim(-_MARGIN, 10 + _MARGIN)
    ax.set_ylim(-0.3, 5.5)
    ax.set_aspect("equal")
    ax.set_axis_off()

    def value(name, level):
        return float(one[name].sel(level=level))

    busiest = str(one["busiest_level"].values)

    def unit_lines(level):
        lines = []
        hit, busy = value("hit_rate", level), value("busy", level)
        if np.isfinite(hit):
            lines.append(f"hit {hit:.1f}%")
        if np.isfinite(busy):
            lines.append(f"busy {busy:.1f}%")
        return lines

    loads = {s: float(one["load_instructions"].sel(space=s)) for s in _mw.SPACES}
    stores = {s: float(one["store_instructions"].sel(space=s)) for s in _mw.SPACES}
    for key, space in (("global", "global"), ("local", "local"), ("shared_space", "shared")):
        # the kernel's warp instructions that address the space
        _box(ax, key, [f"ld {_count(loads[space], 'inst')}", f"st {_count(stores[space], 'inst')}"], False)
    shared_lines = unit_lines("shared")
    conflicts = float(one["shared_bank_conflicts"])
    if np.isfinite(conflicts):
        shared_lines.append(f"{_count(conflicts, 'bank')}\nconflicts")
    for level, lines in (("L1/TEX", unit_lines("L1/TEX")), ("shared", shared_lines), ("L2", unit_lines("L2")),
                         ("DRAM", unit_lines("DRAM")), ("system", unit_lines("system"))):
        _box(ax, level, lines, busiest == level)

    def traffic(level, requests=True):
        read, write = value("read_bytes", level), value("write_bytes", level)
        req = value("requests", level) if requests else np.nan
        above = (f"{_count(req, 'req')}\n" if np.isfinite(req) else "") + f"read {_count(read, 'B')}"
        return above, f"write {_count(write, 'B')}"

    for space in ("global", "local"):
        _edge(ax, space, "L1/TEX", _count(float(one["l1_requests"].sel(space=space)), "req"),
              _count(float(one["l1_bytes"].sel(space=space)), "B"), both=False)
    _edge(ax, "shared_space", "shared", f"{_count(value('requests', 'shared'), 'req')}",
          f"{_count(value('bytes', 'shared'), 'B')}", both=False)
    _edge(ax, "L1/TEX", "L2", *traffic("L2"))
    _edge(ax, "L2", "DRAM", *traffic("DRAM", requests=False))
    _edge(ax, "L2", "system", *traffic("system", requests=False))
    share = float(one["busiest_share"]) if "busiest_share" in one else np.nan
    headline = f"busiest: {busiest}, {share:.1f}% of its peak" if busiest else "no unit's peak known"
    ax.set_title(title if title is not None else f"Memory chart: {_brief(label)} ({headline})", fontsize=FONT + 2)
    ax.text(0.0, -0.1, "green: the memory spaces the kernel's warp instructions (inst) address; blue: hardware units, "
            "busy in\n% of the unit's peak. Upper arrow: read (towards the SM), lower: written. req = requests, "
            "B = bytes.",
            fontsize=FONT, color="0.3", va="top")
    return ax.figure
