"""The hierarchical roofline chart: a precision's peak work and each memory level's bandwidth as ceilings, kernels as
points, as Nsight Compute draws it (``ds.gpuscope.plot.roofline()``).

matplotlib is imported inside the function, never at import time. Each kernel (or range) has one colour and one
point per memory level, all at its achieved FLOP/s: a point's distance below the sloped ceiling of its level, at
its intensity, is what better locality at that level could gain. The ceilings are drawn at the median peak of the
rows that did work of the precision (the peaks scale with the clocks measured in each range; a tensor peak is that
of the paths that ran). Two legends, outside the axes so that no point is hidden: the ceilings (line styles, each
level's bandwidth, and the marker of its points) beside the chart, the kernels (colours) under it.
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from gpuscope.metrics import roofline as _rl
from gpuscope.metrics.plot_bars import DPI, FONT, WIDTH, _bar_labels, _brief_labels
from gpuscope.metrics.plot_colors import _pyplot

__all__ = ["roofline", "si"]

_MARKERS = {"L1": "^", "L2": "s", "DRAM": "o"}
_LINESTYLES = {"L1": ":", "L2": "--", "DRAM": "-"}
_PRECISION_TEXT = {"fp64": "FP64", "fp32": "FP32", "fp16": "FP16 (FMA pipe)", "tensor": "Tensor"}
_PREFIXES = ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))
#: A kernel achieving less than this share of the lowest ceiling above it is not said to be bound by that ceiling
#: (it is far from every roof: latency, launch or occupancy limits it, which a roofline does not show).
FAR_BELOW = 0.005


def si(value: float, unit: str, digits: int = 3) -> str:
    """*value* with an SI prefix: ``si(3.35e12, "B/s")`` -> ``"3.35 TB/s"``."""
    if value is None or not np.isfinite(value):
        return f"- {unit}"
    for scale, prefix in _PREFIXES:
        if abs(value) >= scale:
            return f"{value / scale:.{digits}g} {prefix}{unit}"
    return f"{value:.{digits}g} {unit}"


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
    own = ax is None
    if own:
        ax = plt.figure(figsize=(WIDTH, 4.2 + 0.3 * worked.sum()), dpi=DPI, layout="constrained").subplots()
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
    for lv in levels:  # each named in the ceilings' legend, with its bandwidth
        if bandwidth[lv] > 0:
            ax.plot(x, np.minimum(x * bandwidth[lv], peak), color="0.25", linewidth=1.2,
                    linestyle=_LINESTYLES.get(lv, "-"))
    ax.axhline(peak, color="black", linewidth=1.6)
    ax.annotate(f"{_PRECISION_TEXT.get(precision, precision)} peak {si(peak, 'FLOP/s')}", (hi, peak),
                xytext=(-4, 4), textcoords="offset points", ha="right", fontsize=FONT)
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
        sep = "\n" if len(labels[i]) > 40 else ": "  # a long name on a line of its own, to stay in the figure
        bound = _bound_text(str(one["bound"].values[i]), rate[i], xs, levels, bandwidth, peak)
        kernel_handles.append(plt.Line2D([], [], color=color, marker="o", linestyle="none", markersize=7,
                                         label=f"{labels[i]}{sep}{si(rate[i], 'FLOP/s')}, {bound}"))
    ax.yaxis.set_major_formatter(EngFormatter(unit="FLOP/s"))
    ax.tick_params(labelsize=FONT)
    ax.set_xlabel("Arithmetic intensity [FLOP/byte]", fontsize=FONT + 1)
    ax.set_ylabel(f"Performance ({_PRECISION_TEXT.get(precision, precision)})", fontsize=FONT + 1)
    ax.grid(True, which="major", linewidth=0.4, alpha=0.5)
    device = ds.attrs.get("device_name") or ds.attrs.get("chip") or ""
    ax.set_title(title if title is not None else f"Roofline, {_PRECISION_TEXT.get(precision, precision)}"
                 + (f" ({device})" if device else ""), fontsize=FONT + 2)
    level_handles = [plt.Line2D([], [], color="0.25", marker=_MARKERS.get(lv, "o"), linestyle=_LINESTYLES.get(lv, "-"),
                                markersize=6, label=f"{lv} {si(bandwidth[lv], 'B/s')}") for lv in levels
                     if bandwidth[lv] > 0]
    level_handles.append(plt.Line2D([], [], color="black", linewidth=1.6,
                                    label=f"{_PRECISION_TEXT.get(precision, precision)} peak\n{si(peak, 'FLOP/s')}"))
    # the ceilings beside the chart; the kernels, whose names are long, under it across the figure
    left_out = int((~worked).sum())
    heading = "kernel: achieved, bound" if row == "kernel" or by == "kernel" else "range: achieved, bound"
    if left_out:  # a reader must not take the drawn kernels for all of them
        heading += (f"\n({left_out} of {worked.size} {'kernels' if 'kernel' in heading else 'ranges'} did no "
                    f"{_PRECISION_TEXT.get(precision, precision)} work: not drawn)")
    kernels = {"handles": kernel_handles, "title": heading, "fontsize": FONT, "title_fontsize": FONT,
               "frameon": False, "alignment": "left", "ncol": 1 if len(kernel_handles) <= 4 else 2}
    if own:  # constrained layout makes room for a figure legend "outside"
        ax.figure.legend(loc="outside lower left", **kernels)
    else:
        ax.add_artist(ax.legend(loc="upper left", bbox_to_anchor=(-0.12, -0.13), **kernels))
    ax.legend(handles=level_handles, title="ceiling; marker:\nintensity at", loc="upper left",
              bbox_to_anchor=(1.01, 1.0), fontsize=FONT, title_fontsize=FONT, frameon=False)
    return ax.figure


def _bound_text(bound: str, rate: float, intensity: np.ndarray, levels: list[str], bandwidth: dict,
                peak: float) -> str:
    """``"DRAM-bound"``, or, for a point under :data:`FAR_BELOW` of the lowest ceiling at its intensities, how far
    below that ceiling it is: such a kernel is bound by none of them."""
    roofs = [min(float(x) * bandwidth[lv], peak) for lv, x in zip(levels, intensity, strict=True)
             if np.isfinite(x) and x > 0 and bandwidth.get(lv, 0) > 0]
    if not roofs or rate >= FAR_BELOW * min(roofs):
        return f"{bound}-bound"
    return f"{100 * rate / min(roofs):.2g}% of its lowest ceiling ({bound}): far below every roof"
