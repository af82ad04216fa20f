"""Stall views of a PC-sampling Dataset: per source line (a source view) and per kernel.

Pure functions over the Dataset that ``gpuscope.pc_sample`` returns (dims ``pc``, ``stall_reason``, ``kernel``;
pc coords ``function``, ``file``, ``line``, ``line_text``; stall_reason coord ``category``). matplotlib is
imported only inside the plot functions.
"""

from __future__ import annotations

import numpy as np
import xarray as xr

__all__ = ["line_stalls", "kernel_stalls", "plot_line_stalls", "plot_kernel_stalls", "CATEGORY_ORDER"]

#: Order (and colours) of the Top-Down categories in the plots.
CATEGORY_ORDER = ("issued", "frontend_fetch", "frontend_decode", "backend_core", "backend_memory", "other")
_COLORS = {
    "issued": "#4daf4a",
    "frontend_fetch": "#984ea3",
    "frontend_decode": "#c994c7",
    "backend_core": "#ff7f00",
    "backend_memory": "#377eb8",
    "other": "#999999",
}


def _by(samples: xr.DataArray, by: str) -> xr.DataArray:
    if by == "reason":
        return samples
    if by != "category":
        raise ValueError(f"by must be 'category' or 'reason', got {by!r}")
    grouped = samples.groupby("category").sum("stall_reason").rename(category="stall_category")
    order = [c for c in CATEGORY_ORDER if c in grouped["stall_category"].values]
    return grouped.sel(stall_category=order)


def line_stalls(ds: xr.Dataset, kernel: str | None = None, by: str = "reason") -> xr.DataArray:
    """Samples per source line of one kernel: dims ``source_line`` and ``stall_reason`` (or ``stall_category``).

    Lines are ordered by file and line number; coords ``file``, ``line``, ``line_text``. PCs without line info
    are grouped under line 0.

    Raises
    ------
    ValueError
        *kernel* is not in the Dataset, or it holds several kernels and none was named.
    """
    kernels = ds["kernel"].values.tolist()
    if kernel is None:
        if len(kernels) != 1:
            raise ValueError(f"the Dataset holds {len(kernels)} kernels; pass kernel= one of {kernels}")
        kernel = kernels[0]
    if kernel not in kernels:
        raise ValueError(f"kernel {kernel!r} is not in the Dataset; it holds {kernels}")
    sub = ds.where(ds["function"] == kernel, drop=True)
    keys = [f"{f}:{int(n)}" for f, n in zip(sub["file"].values, sub["line"].values)]
    samples = sub["samples"].assign_coords(source_line=("pc", keys)).groupby("source_line").sum("pc")
    first = {}
    for key, f, n, text in zip(keys, sub["file"].values, sub["line"].values, sub["line_text"].values):
        first.setdefault(key, (str(f), int(n), str(text)))
    order = sorted(first, key=lambda k: first[k][:2])
    samples = samples.sel(source_line=order).assign_coords(
        file=("source_line", [first[k][0] for k in order]),
        line=("source_line", np.array([first[k][1] for k in order], dtype=np.int64)),
        line_text=("source_line", [first[k][2] for k in order]),
        category=ds["category"],
    )
    samples.attrs = {"kernel": kernel, "units": "samples"}
    return _by(samples, by)


def kernel_stalls(ds: xr.Dataset, by: str = "category", normalize: bool = True) -> xr.DataArray:
    """Per-kernel stall breakdown: dims ``kernel`` and ``stall_category`` (or ``stall_reason``).

    With ``normalize``, each kernel's samples are percentages that sum to 100 (``units`` "percent").
    """
    counts = ds["kernel_samples"].assign_coords(category=ds["category"])
    out = _by(counts, by).astype(float)
    if normalize:
        total = out.sum(out.dims[1])
        out = 100 * out / total.where(total > 0)
    out.attrs = {"units": "percent" if normalize else "samples"}
    return out


def _colors(labels, by, categories=None):
    import matplotlib

    if by == "category":
        return [_COLORS.get(str(c), "#999999") for c in labels]
    cmap = matplotlib.colormaps["tab20"]
    return [cmap(i % 20) for i in range(len(labels))]


def _legend_beside(ax, by: str) -> None:
    """The legend to the right of the bars, never over them."""
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False,
              title="Top-Down category" if by == "category" else "stall reason", title_fontsize=8)
    ax.figure.tight_layout()


def plot_line_stalls(ds: xr.Dataset, kernel: str | None = None, by: str = "category", top: int = 20, ax=None,
                     min_fraction: float = 0.0):
    """A source view: one horizontal bar per source line (its text beside it), stacked by stall; the legend sits
    beside the bars.

    Parameters
    ----------
    ds : xarray.Dataset
        A PC-sampling Dataset.
    kernel : str, optional
        Kernel name (``ds.kernel``); needed when there are several.
    by : {"category", "reason"}
        Stack by Top-Down category or by CUPTI stall reason.
    top : int
        Show the lines with the most samples, at most this many, in source order.
    ax : matplotlib Axes, optional
    min_fraction : float
        Reasons with less than this fraction of the kernel's samples are left out of the legend.

    Returns
    -------
    matplotlib.figure.Figure
        The figure drawn into (``ax.figure`` when *ax* is given): every gpuscope plot returns its Figure
        (``fig.axes`` holds the panels, ``fig.savefig`` saves it).
    """
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    data = line_stalls(ds, kernel, by=by)
    dim = data.dims[1]
    keep = data.sum("source_line")
    keep = keep[keep > min_fraction * float(keep.sum())][dim].values
    data = data.sel({dim: keep})
    totals = data.sum(dim)
    chosen = np.sort(np.argsort(-totals.values, kind="stable")[:top])
    data = data.isel(source_line=chosen)
    if ax is None:
        _, ax = plt.subplots(figsize=(12, 0.4 * len(chosen) + 1.5))
    y = np.arange(len(chosen))[::-1]
    left = np.zeros(len(chosen))
    labels = data[dim].values.tolist()
    for label, color in zip(labels, _colors(labels, by)):
        values = data.sel({dim: label}).values.astype(float)
        ax.barh(y, values, left=left, color=color, label=label)
        left += values
    ticks = [f"{int(n):>4}  {text[:60]}" if n else "(no line info)"
             for n, text in zip(data["line"].values, data["line_text"].values)]
    ax.set_yticks(y, ticks, fontfamily="monospace", fontsize=8)
    ax.set_xlim(0, max(float(left.max(initial=0.0)), 1.0) * 1.04)  # the longest bar does not end on the frame
    ax.xaxis.set_major_formatter(matplotlib.ticker.EngFormatter(sep=""))  # 350k, not 350000 running together
    ax.set_xlabel("PC samples")
    ax.set_title(f"{data.attrs.get('kernel', '')}: stalls per source line")
    _legend_beside(ax, by)
    return ax.figure


def plot_kernel_stalls(ds: xr.Dataset, by: str = "category", normalize: bool = True, ax=None):
    """Stacked horizontal bars, one per kernel, of its samples by Top-Down category (or stall reason); the legend
    sits beside the bars.

    Returns
    -------
    matplotlib.figure.Figure
        The figure drawn into (``ax.figure`` when *ax* is given): every gpuscope plot returns its Figure
        (``fig.axes`` holds the panels, ``fig.savefig`` saves it).
    """
    import matplotlib.pyplot as plt

    data = kernel_stalls(ds, by=by, normalize=normalize)
    dim = data.dims[1]
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 0.6 * data.sizes["kernel"] + 1.5))
    y = np.arange(data.sizes["kernel"])[::-1]
    left = np.zeros(data.sizes["kernel"])
    labels = data[dim].values.tolist()
    for label, color in zip(labels, _colors(labels, by)):
        values = np.nan_to_num(data.sel({dim: label}).values.astype(float))
        ax.barh(y, values, left=left, color=color, label=label)
        left += values
    ax.set_yticks(y, data["kernel"].values.tolist(), fontsize=8)
    ax.set_xlabel("% of PC samples" if normalize else "PC samples")
    ax.set_title("Warp states per kernel (PC sampling)")
    _legend_beside(ax, by)
    return ax.figure
