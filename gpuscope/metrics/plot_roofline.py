"""The hierarchical roofline chart: a precision's peak work and each memory level's bandwidth as ceilings, kernels as
points, as Nsight Compute draws it (``ds.gpuscope.plot.roofline()``).

matplotlib is imported inside the function, never at import time. Each kernel (or range) has one colour and one
point per memory level, all at its achieved FLOP/s: a point's distance below the sloped ceiling of its level, at
its intensity, is what better locality at that level could gain. The ceilings are drawn at the median peak of the
rows that did work of the precision (the peaks scale with the clocks measured in each range; a tensor peak is that
of the paths that ran). Two legends: the kernels (colours), and the levels and ceilings (markers and lines), placed
outside the axes so that no point is hidden.
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from gpuscope.metrics import roofline as _rl
from gpuscope.metrics.plot_bars import _bar_labels, _brief_labels
from gpuscope.metrics.plot_colors import _pyplot

__all__ = ["roofline", "si"]

_MARKERS = {"L1": "^", "L2": "s", "DRAM": "o"}
_LINESTYLES = {"L1": ":", "L2": "--", "DRAM": "-"}
_PRECISION_TEXT = {"fp64": "FP64", "fp32": "FP32", "fp16": "FP16 (FMA pipe)", "tensor": "Tensor"}
_PREFIXES = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def si(value: float, unit: str, digits: int = 3) -> str:
    """*value* with an SI prefix: ``si(3.35e12, "B/s")`` -> ``"3.35 TB/s"``."""
    if value is None or not np.isfinite(value):
        return f"- {unit}"
    for scale, prefix in _PREFIXES:
        if abs(value) >= scale:
            return f"{value / scale:.{digits}g} {prefix}{unit}"
    return f"{value:.{digits}g} {unit}"


def _slope_angle(ax) -> float:
    """The on-screen angle, in degrees, of a line of slope 1 on the log-log axes as they are laid out now."""
    x0, y0 = ax.get_xlim()[0], ax.get_ylim()[0]
    (px0, py0), (px1, py1) = ax.transData.transform([(x0, y0), (x0 * 10, y0 * 10)])
    return float(np.degrees(np.arctan2(py1 - py0, px1 - px0)))


def _as_roofline(ds: xr.Dataset, by: str | None) -> tuple[xr.Dataset, str]:
    out = ds if "flop_rate" in ds.data_vars else _rl.roofline(ds, by=by)
    row = next(d for d in out["flop_rate"].dims if d != "precision")
    return out, row


def roofline(ds: xr.Dataset, precision: str | None = None, *, by: str | None = "kernel", ax=None,
             title: str | None = None):
    """The hierarchical roofline of one precision, every kernel (or range) as a point per memory level.

    Parameters
    ----------
    ds : xarray.Dataset
        Range results holding the ``roofline`` set, or the output of :func:`gpuscope.metrics.roofline.roofline`.
    precision : str, optional
        ``"fp64"``, ``"fp32"``, ``"fp16"`` or ``"tensor"``; default the one with the most FLOPs over all rows.
    by : str or None
        Combine the ranges per value of this coordinate (``"kernel"``, default) before plotting; None plots
        every range. Ignored when *ds* is already a roofline.
    ax : matplotlib.axes.Axes, optional
        Axes to draw on; a new figure otherwise.
    title : str, optional
        The title; default names the precision and the device.

    Returns
    -------
    matplotlib.figure.Figure
        The figure drawn into (``ax.figure`` when *ax* is given): every gpuscope plot returns its Figure
        (``fig.axes`` holds the panels, ``fig.savefig`` saves it).

    Raises
    ------
    ValueError
        *precision* is not one the Dataset has, or no row did any work of it.
    gpuscope.errors.MissingMetricsError
        *ds* lacks the ``roofline`` set's metrics.
    """
    plt = _pyplot()
    from matplotlib.ticker import EngFormatter

    rl, row = _as_roofline(ds, by if by in ds.coords else None)
    precisions = [str(p) for p in rl["precision"].values]
    totals = rl["flop"].sum(row)
    if precision is None:
        precision = str(totals.idxmax("precision").values)
    if precision not in precisions:
        raise ValueError(f"precision={precision!r} is not in the roofline; it has {precisions}")
    one = rl.sel(precision=precision)
    rate = np.asarray(one["flop_rate"], dtype=float)
    worked = np.isfinite(rate) & (rate > 0)
    if not worked.any():
        raise ValueError(f"no row did {precision} work (FLOPs are 0 or missing); precisions with work: "
                         f"{[p for p in precisions if float(totals.sel(precision=p)) > 0]}")
    if ax is None:  # a fixed layout: the slope labels' angles are measured on it
        fig, ax = plt.subplots(figsize=(9.5, 5.2))
        fig.subplots_adjust(left=0.15, right=0.63, bottom=0.11, top=0.92)
    levels = [str(lv) for lv in rl["level"].values]
    peak = float(np.nanmedian(np.asarray(one["peak_flop_rate"], dtype=float)[worked]))  # tensor: the paths that ran
    bandwidth = {lv: float(np.nanmedian(rl["peak_bandwidth"].sel(level=lv))) for lv in levels}
    intensity = one["intensity"].transpose(row, "level")
    shown = np.asarray(intensity)[worked]
    finite = shown[np.isfinite(shown) & (shown > 0)]
    ridges = [peak / bw for bw in bandwidth.values() if bw > 0]
    lo = min([*finite, *ridges]) / 8
    hi = max([*finite, *ridges]) * 8
    x = np.geomspace(lo, hi, 256)
    bottom = min(np.nanmin(rate[worked]) / 10, peak / 1e3)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(bottom, peak * 3)
    for lv in levels:
        bw = bandwidth[lv]
        if not bw > 0:
            continue
        ax.plot(x, np.minimum(x * bw, peak), color="0.25", linewidth=1.2, linestyle=_LINESTYLES.get(lv, "-"))
        ridge = peak / bw
        at = max(lo * 1.5, ridge / 30)  # on the slope, left of the ridge
        if at < ridge / 2:
            ax.annotate(f"{lv} {si(bw, 'B/s')}", (at, at * bw), xytext=(0, 3), textcoords="offset points",
                        fontsize=8, color="0.25", rotation=_slope_angle(ax), rotation_mode="anchor")
    ax.axhline(peak, color="black", linewidth=1.6)
    ax.annotate(f"{_PRECISION_TEXT.get(precision, precision)} peak {si(peak, 'FLOP/s')}", (hi, peak),
                xytext=(-4, 4), textcoords="offset points", ha="right", fontsize=8)
    labels = _brief_labels(_bar_labels(rl, row))
    colors = plt.get_cmap("tab10" if len(labels) <= 10 else "tab20")
    kernel_handles = []
    for i in np.flatnonzero(worked):
        color = colors(i % colors.N)
        xs = np.asarray(intensity.isel({row: i}), dtype=float)
        ok = np.isfinite(xs) & (xs > 0)
        ax.plot(xs[ok], np.full(ok.sum(), rate[i]), color=color, linewidth=0.8, alpha=0.6)
        for lv, xv in zip(levels, xs, strict=True):
            if np.isfinite(xv) and xv > 0:
                ax.plot([xv], [rate[i]], marker=_MARKERS.get(lv, "o"), color=color, markersize=7,
                        markeredgecolor="black", markeredgewidth=0.5, linestyle="none")
        bound = str(one["bound"].values[i])
        sep = "\n" if len(labels[i]) > 24 else ": "  # a long name on a line of its own, to stay in the figure
        kernel_handles.append(plt.Line2D([], [], color=color, marker="o", linestyle="none", markersize=7,
                                         label=f"{labels[i]}{sep}{si(rate[i], 'FLOP/s')}, {bound}-bound"))
    ax.yaxis.set_major_formatter(EngFormatter(unit="FLOP/s"))
    ax.set_xlabel("Arithmetic intensity [FLOP/byte]")
    ax.set_ylabel(f"Performance ({_PRECISION_TEXT.get(precision, precision)})")
    ax.grid(True, which="major", linewidth=0.4, alpha=0.5)
    device = ds.attrs.get("device_name") or ds.attrs.get("chip") or ""
    ax.set_title(title if title is not None else f"Roofline, {_PRECISION_TEXT.get(precision, precision)}"
                 + (f" ({device})" if device else ""))
    level_handles = [plt.Line2D([], [], color="0.3", marker=_MARKERS.get(lv, "o"), linestyle=_LINESTYLES.get(lv, "-"),
                                markersize=7, label=f"{lv} ({si(bandwidth[lv], 'B/s')})") for lv in levels]
    level_handles.append(plt.Line2D([], [], color="black", linewidth=1.6,
                                    label=f"{_PRECISION_TEXT.get(precision, precision)} peak {si(peak, 'FLOP/s')}"))
    first = ax.legend(handles=kernel_handles, title="kernel (achieved, bound)", loc="upper left",
                      bbox_to_anchor=(1.02, 1.0), fontsize=8, title_fontsize=8, frameon=False)
    ax.add_artist(first)
    ax.legend(handles=level_handles, title="ceilings; marker: intensity at", loc="lower left",
              bbox_to_anchor=(1.02, 0.0), fontsize=8, title_fontsize=8, frameon=False)
    return ax.figure
