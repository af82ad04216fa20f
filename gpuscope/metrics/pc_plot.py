"""Stall views of a PC-sampling Dataset: per source line (a source view) and per kernel.

Pure functions over the Dataset that ``gpuscope.pc_sample`` returns (dims ``pc``, ``stall_reason``, ``kernel``;
pc coords ``function``, ``file``, ``line``, ``line_text``; stall_reason coord ``category``). matplotlib is
imported only inside the plot functions.
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from gpuscope.metrics import topdown as _td
from gpuscope.metrics.plot_bars import DPI, FONT, WIDTH
from gpuscope.metrics.plot_colors import _OTHER_COLOR, _node_colors, node_words

__all__ = ["CATEGORY_ORDER", "ISSUED_WORDS", "NEGLIGIBLE", "kernel_stalls", "line_stalls", "plot_kernel_stalls",
           "plot_line_stalls"]
#: Characters of a source line's text beside its bar (longer lines end in an ellipsis).
_LINE_CHARS = 32

#: Order of the Top-Down categories in the plots; each takes the colour of its Top-Down node in the Top-Down plots
#: (issued: retire's), so that a PC-sampling figure and a Top-Down figure read alike.
CATEGORY_ORDER = ("issued", "frontend_fetch", "frontend_decode", "backend_core", "backend_memory", "other")
_NODE = {"issued": "retire"}
#: The ``issued`` category in words: it holds the samples of a warp that issued (``selected``, what the report's
#: ``issued`` column counts) and of one that was ready while another issued (``not_selected``): no stall.
ISSUED_WORDS = "selected or ready (no stall)"
#: A stall whose every segment is below this percentage of the longest bar has no visible bar: it joins one grey
#: "other" segment, and the legend counts it there.
NEGLIGIBLE = 1.0


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


def _colors(labels: list[str], by: str) -> list:
    if by == "category":
        nodes = [_NODE.get(str(c), str(c)) for c in labels]
        colors = _node_colors([n for n in nodes if n in _td._BY_NAME])
        return [colors.get(n, _OTHER_COLOR) for n in nodes]
    import matplotlib

    cmap = matplotlib.colormaps["tab20"]
    return [cmap(i % 20) for i in range(len(labels))]


def _blank():
    """A legend handle that draws nothing: the entry is a line of text."""
    from matplotlib.patches import Rectangle

    return Rectangle((0, 0), 1, 1, color="white")


def _new_axes(height: float):
    """Axes of a new figure WIDTH wide, laid out by matplotlib's constrained layout (which makes room for a figure
    legend under the bars)."""
    import matplotlib.pyplot as plt

    return plt.figure(figsize=(WIDTH, height), dpi=DPI, layout="constrained").subplots()


def _stacked_bars(ax, data: xr.DataArray, rows: str, by: str, own: bool) -> float:
    """Horizontal bars along *rows*, stacked by the other dimension, those with no visible segment gathered in one
    grey "other" segment; the legend names what has a visible segment, under the bars in a figure of the plot's
    own (*own*, the bars keep the width), else beside them. Returns the longest bar."""
    dim = next(d for d in data.dims if d != rows)
    values = np.nan_to_num(data.transpose(rows, dim).values.astype(float))
    longest = float(values.sum(axis=1).max(initial=0.0))
    labels = [str(v) for v in data[dim].values]
    shown = values.max(axis=0, initial=0.0) >= NEGLIGIBLE / 100 * longest
    y = np.arange(data.sizes[rows])[::-1]
    left = np.zeros(len(y))
    for label, color, column in zip(labels, _colors(labels, by), values.T, strict=True):
        if shown[labels.index(label)]:
            ax.barh(y, column, left=left, color=color, label=_words(label))
            left += column
    handles, names = ax.get_legend_handles_labels()
    if not shown.all():
        hidden = [_words(lab) for lab, s in zip(labels, shown, strict=True) if not s]
        rest = values[:, ~shown].sum(axis=1)
        bars = ax.barh(y, rest, left=left, color=_OTHER_COLOR)
        what = ", ".join(hidden) if len(hidden) <= 2 else f"{len(hidden)} more"
        if rest.max() >= NEGLIGIBLE / 100 * longest:  # together they show
            handles.append(bars)
            names.append(f"other: {what} (each < {NEGLIGIBLE:g}%)")
        else:  # a line of text: nothing of theirs is visible
            handles.append(_blank())
            names.append(f"({what} < {NEGLIGIBLE:g}%, not visible)")
    ax.tick_params(labelsize=FONT)
    where = {"loc": "outside lower center", "ncol": 3} if own else {"loc": "upper left", "bbox_to_anchor": (1.01, 1.0)}
    (ax.figure.legend if own else ax.legend)(handles, names, fontsize=FONT, frameon=False, title_fontsize=FONT,
                                             title="Top-Down category" if by == "category" else "stall reason", **where)
    return longest


def plot_line_stalls(ds: xr.Dataset, kernel: str | None = None, by: str = "category", top: int = 20, ax=None,
                     min_fraction: float = 0.0):
    """A source view: one horizontal bar per source line (its text beside it), stacked by stall; the legend sits
    under the bars (beside them in a given *ax*).

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
    import matplotlib.ticker

    data = line_stalls(ds, kernel, by=by)
    dim = data.dims[1]
    keep = data.sum("source_line")
    keep = keep[keep > min_fraction * float(keep.sum())][dim].values
    data = data.sel({dim: keep})
    totals = data.sum(dim)
    chosen = np.sort(np.argsort(-totals.values, kind="stable")[:top])
    data = data.isel(source_line=chosen)
    own = ax is None
    if own:
        ax = _new_axes(0.3 * len(chosen) + 0.17 * (len(keep) + 2) / 3 + 1.3)
    longest = _stacked_bars(ax, data, "source_line", by, own)
    ticks = [f"{int(n):>4}  {_clip(text, _LINE_CHARS)}" if n else "(no line info)"
             for n, text in zip(data["line"].values, data["line_text"].values)]
    ax.set_yticks(np.arange(len(chosen))[::-1], ticks, fontfamily="monospace", fontsize=FONT)
    ax.set_xlim(0, max(longest, 1.0) * 1.04)  # the longest bar does not end on the frame
    ax.xaxis.set_major_formatter(matplotlib.ticker.EngFormatter(sep=""))  # 350k, not 350000 running together
    ax.set_xlabel("PC samples\n" + _attribution_note(ds, data.attrs.get("kernel", "")), fontsize=FONT)
    ax.set_title(f"{data.attrs.get('kernel', '')}: stalls per source line", fontsize=FONT + 2)
    return ax.figure


def _words(label: str) -> str:
    """A category or stall reason as words in a legend."""
    return ISSUED_WORDS if label == "issued" else node_words(label)


def _attribution_note(ds: xr.Dataset, kernel: str) -> str:
    """Why lines that write little hold many samples: a sample counts at the line the line table gives its
    instruction, and optimised code gives the loop header (or an inlined call such as ``cuda.grid``) the
    instructions of the lines around it. Names the line that holds the most instructions."""
    import textwrap

    lines = ds["line"].values[ds["function"].values == kernel]
    note = ("A sample counts at the source line that the line table gives its instruction; optimised code unrolls "
            "loops and inlines calls (cuda.grid), whose instructions often carry the loop header's or the call's "
            "line, so a bar can hold work written on the lines around it.")
    if len(lines):
        values, counts = np.unique(lines, return_counts=True)
        most = int(np.argmax(counts))
        note += f" Line {int(values[most])} holds {int(counts[most])} of the {len(lines)} sampled instructions."
    return textwrap.fill(note, 75)


def _clip(text: str, n: int) -> str:
    """*text* in at most *n* characters, an ellipsis where it was cut."""
    return text if len(text) <= n else text[: n - 1] + "\u2026"


def plot_kernel_stalls(ds: xr.Dataset, by: str = "category", normalize: bool = True, ax=None):
    """Stacked horizontal bars, one per kernel, of its samples by Top-Down category (or stall reason); the legend
    sits under the bars (beside them in a given *ax*).

    Returns
    -------
    matplotlib.figure.Figure
        The figure drawn into (``ax.figure`` when *ax* is given): every gpuscope plot returns its Figure
        (``fig.axes`` holds the panels, ``fig.savefig`` saves it).
    """

    data = kernel_stalls(ds, by=by, normalize=normalize)
    own = ax is None
    if own:
        ax = _new_axes(0.45 * data.sizes["kernel"] + 0.17 * (data.sizes[data.dims[1]] + 2) / 3 + 1.3)
    _stacked_bars(ax, data, "kernel", by, own)
    ax.set_yticks(np.arange(data.sizes["kernel"])[::-1], data["kernel"].values.tolist(), fontsize=FONT)
    ax.set_xlabel("% of PC samples" if normalize else "PC samples", fontsize=FONT + 1)
    ax.set_title("Warp states per kernel (PC sampling)", fontsize=FONT + 2)
    return ax.figure
