"""The answer at the end of a run: one table per Dataset, one row per kernel (or user range, or phase).

:func:`report` reads any gpuscope Dataset: range results (dim ``range``: per launch or per user range), PM sampling
(dim ``time``) and PC sampling (dims ``pc``/``kernel``). The result is a :class:`Report`, a pandas DataFrame with a
title and notes that prints as a fixed-width table and renders as HTML in a notebook.

Top-Down columns are fractions of the SM's peak issue rate (IPC / IPC_MAX), computed with
:func:`gpuscope.metrics.topdown.topdown` and weighted per kernel with :func:`gpuscope.metrics.topdown.aggregate`.
The verdict ``bound_by`` is the level-2 node (level-1 ``retire`` excluded) that loses the most issue slots; its
``culprit`` is the stall reason (level-3 node) under it that loses the most.
"""

from __future__ import annotations

import html
import shutil
import textwrap

import numpy as np
import pandas as pd

from gpuscope._schema.labels import string_labels

__all__ = ["Report", "report", "raw_text", "GPU_TIME", "group_key", "topdown_per_launch"]

#: The metric that is GPU time (ns) per launch or range.
GPU_TIME = "gpu__time_duration.sum"

#: DRAM bytes read and written, as each chip names them.
DRAM_BYTES = (("dram__bytes_read.sum", "dram__bytes_write.sum"), ("dram__bytes_op_read.sum", "dram__bytes_op_write.sum"))

#: Short column labels for metrics that often appear in reports.
SHORT_NAMES = {
    "gr__cycles_active.avg.pct_of_peak_sustained_elapsed": "GR active %",
    "sm__cycles_active.avg.pct_of_peak_sustained_elapsed": "SM active %",
    "sm__inst_executed_realtime.avg.pct_of_peak_sustained_elapsed": "SM issue %",
    "sm__pipe_tensor_cycles_active_realtime.avg.pct_of_peak_sustained_elapsed": "tensor %",
    "dram__read_throughput.avg.pct_of_peak_sustained_elapsed": "DRAM read %",
    "dram__write_throughput.avg.pct_of_peak_sustained_elapsed": "DRAM write %",
    "pcie__read_bytes.sum.per_second": "PCIe read GB/s",
    "pcie__write_bytes.sum.per_second": "PCIe write GB/s",
    "pcie__throughput.avg.pct_of_peak_sustained_elapsed": "PCIe %",
    "dramc__read_throughput.avg.pct_of_peak_sustained_elapsed": "DRAM read %",
    "dramc__write_throughput.avg.pct_of_peak_sustained_elapsed": "DRAM write %",
    "mcc__dram_throughput_op_read.avg.pct_of_peak_sustained_elapsed": "DRAM read %",
    "mcc__dram_throughput_op_write.avg.pct_of_peak_sustained_elapsed": "DRAM write %",
    "dram__bytes_op_read.sum.per_second": "DRAM read B/s",
    "dram__bytes_op_write.sum.per_second": "DRAM write B/s",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "SM %",
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed": "memory %",
    "l1tex__throughput.avg.pct_of_peak_sustained_active": "L1 %",
    "lts__throughput.avg.pct_of_peak_sustained_elapsed": "L2 %",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "DRAM %",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "occupancy %",
}

_FRACTION = "fraction"  # column attribute: values in [0, 1], printed as percentages
_SEP = "  "  # between the columns of a printed table
_MIN_WIDTH = 20  # narrower than this, no table can be laid out
_PROSE = 100  # title, advice and notes wrap here on wider terminals: long lines of prose are hard to read


class Report(pd.DataFrame):
    """A DataFrame with a title and notes, printed as a readable table that fits the terminal.

    Use it as any DataFrame (``report["bound_by"]``, ``report.to_csv(...)``); ``print(report)`` gives the
    fixed-width table (:meth:`to_text`) and a notebook shows :meth:`_repr_html_`. Columns listed in
    ``attrs["fractions"]`` hold fractions (0-1) and print as percentages; ``attrs["priority"]`` orders the columns
    from the most to the least important, for a terminal too narrow for all of them.
    """

    @property
    def _constructor(self):
        return Report

    @property
    def title(self) -> str:
        return self.attrs.get("title", "")

    @property
    def notes(self) -> list[str]:
        return list(self.attrs.get("notes", []))

    def _formatters(self) -> dict:
        fractions = set(self.attrs.get("fractions", []))
        out = {}
        for col in self.columns:
            if col in fractions:
                out[col] = _percent
            elif pd.api.types.is_float_dtype(self[col].dtype):
                out[col] = _number
        return out

    def to_text(self, width: int | None = None) -> str:
        """The report as text no wider than *width*: title, table, advice, notes.

        Parameters
        ----------
        width : int, optional
            Characters per line (at least 20). Default: the terminal's width (``COLUMNS`` when set, else the
            terminal's, else 80), as :func:`shutil.get_terminal_size` finds it.

        Returns
        -------
        str
            The title, advice and notes wrapped to *width* (at most 100); the table with the columns that fit, the
            least important left out first and named in a note (the DataFrame keeps them all: ``to_csv``,
            ``gpuscope show --csv``); row labels too long for the table shortened with ``...``; the ``advice``
            column in full under the table, once per verdict.

        Raises
        ------
        ValueError
            *width* is below 20.
        """
        width = _width(width)
        frame = pd.DataFrame(self)
        prose = min(width, _PROSE)
        lines = _wrap(self.title, prose) if self.title else []
        notes = self.notes
        if len(frame):
            table, hidden, shortened = _layout(frame, self._formatters(), self.attrs.get("priority", ()), width)
            lines += table
            if hidden:
                notes.append(f"not shown at {width} characters: {', '.join(map(str, hidden))}; every column is in "
                             "the DataFrame (--csv FILE on the command line writes them all; a wider terminal shows "
                             "more).")
            if shortened:
                notes.append("row labels shortened with '...' in the middle to fit; --csv FILE has them in full.")
            lines += _advice(frame, prose)
        else:
            lines.append("(no rows)")
        for note in notes:
            lines += _wrap(note, prose, "note: ", "      ")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.to_text()

    def __repr__(self) -> str:
        return self.to_text()

    def _repr_html_(self) -> str:
        body = pd.DataFrame(self).to_html(formatters=self._formatters(), na_rep="-", escape=True)
        head = f"<p><b>{html.escape(self.title)}</b></p>" if self.title else ""
        notes = "".join(f"<li>{html.escape(n)}</li>" for n in self.notes)
        return head + body + (f"<ul>{notes}</ul>" if notes else "")


def _width(width: int | None) -> int:
    if width is None:
        return max(_MIN_WIDTH, shutil.get_terminal_size().columns)
    if not isinstance(width, (int, np.integer)) or width < _MIN_WIDTH:
        raise ValueError(f"width must be a whole number of characters, at least {_MIN_WIDTH}; got {width!r}")
    return int(width)


def _wrap(text: str, width: int, first: str = "", rest: str = "") -> list[str]:
    return textwrap.wrap(text, width, initial_indent=first, subsequent_indent=rest, break_on_hyphens=False) or [""]


def _number(v) -> str:
    if pd.isna(v):
        return "-"
    a = abs(v)
    if a == 0 or 0.01 <= a < 1e6:
        return f"{v:,.3g}" if a < 100 else f"{v:,.0f}"
    return f"{v:.3g}"


def _percent(v) -> str:
    """A fraction as a percentage; a positive one too small for one decimal is "<0.1%", never "0.0%"."""
    if pd.isna(v):
        return "-"
    return "<0.1%" if 0 < v < 0.0005 else f"{100 * v:.1f}%"


def _text(v) -> str:
    return "" if v is None or (isinstance(v, float) and np.isnan(v)) else str(v)


def _shorten(label: str, width: int) -> str:
    """*label* within *width*, its middle cut out: names that share a prefix (a module, a template) still differ
    at their ends."""
    if len(label) <= width:
        return label
    if width <= 3:
        return label[:width]
    head = (width - 3 + 1) // 2
    return label[:head] + "..." + label[len(label) - (width - 3 - head):]


def _layout(frame: pd.DataFrame, formatters: dict, priority, width: int) -> tuple[list[str], list, bool]:
    """The table's lines within *width*, the columns left out to fit, and whether row labels were shortened.

    Columns are taken in order of importance (*priority*, then the frame's order) while they fit; the row labels
    get at least half the width (or what they need), and whatever the chosen columns leave over.
    """
    levels = [[_text(v) for v in frame.index.get_level_values(i)] for i in range(frame.index.nlevels)]
    for i in range(len(levels) - 1):  # a MultiIndex prints each outer label once, as pandas does
        levels[i] = [v if r == 0 or any(levels[j][r] != levels[j][r - 1] for j in range(i + 1)) else ""
                     for r, v in enumerate(levels[i])]
    names = [_text(n) for n in frame.index.names]
    natural = [max([len(n), *map(len, lab)]) for n, lab in zip(names, levels)]
    share = (width - len(_SEP) * (len(levels) - 1)) // len(levels)
    label_w = [min(w, max(len(n), width // 2 // len(levels), 4), share) for n, w in zip(names, natural)]
    cells = {c: [formatters.get(c, _text)(v) for v in frame[c].tolist()] for c in frame.columns if c != "advice"}
    col_w = {c: max(len(str(c)), *map(len, v)) for c, v in cells.items()}
    used = sum(label_w) + len(_SEP) * (len(levels) - 1)
    chosen = set()
    for c in [c for c in priority if c in cells] + [c for c in cells if c not in priority]:
        if used + len(_SEP) + col_w[c] <= width:
            chosen.add(c)
            used += len(_SEP) + col_w[c]
    for i, w in enumerate(natural):  # what the columns leave over goes to the row labels
        grow = min(width - used, w - label_w[i])
        label_w[i] += grow
        used += grow
    shown = [c for c in cells if c in chosen]
    right = {c: pd.api.types.is_numeric_dtype(frame[c].dtype) or c in formatters for c in shown}

    def line(labels, values) -> str:
        parts = [_shorten(v, w).ljust(w) for v, w in zip(labels, label_w)]
        parts += [v.rjust(col_w[c]) if right[c] else v.ljust(col_w[c]) for c, v in zip(shown, values)]
        return _SEP.join(parts).rstrip()

    out = [line(names, [str(c) for c in shown])]
    out += [line([lab[r] for lab in levels], [cells[c][r] for c in shown]) for r in range(len(frame))]
    hidden = [c for c in frame.columns if c not in chosen and c != "advice"]
    return out, hidden, any(n > w for n, w in zip(natural, label_w))


def _advice(frame: pd.DataFrame, width: int) -> list[str]:
    """The advice column in full, wrapped, once per verdict with the rows it is for."""
    if "advice" not in frame:
        return []
    verdicts = frame["bound_by"] if "bound_by" in frame else pd.Series("", index=frame.index)
    numbered = pd.api.types.is_integer_dtype(frame.index.dtype)  # "phase 1", not a bare "1"
    rows: dict = {}
    for label, bound, advice in zip(frame.index, verdicts, frame["advice"]):
        if advice:
            rows.setdefault((bound, advice), []).append(f"{frame.index.name} {label}" if numbered else str(label))
    out = ["advice:"] if rows else []
    for (bound, advice), labels in rows.items():
        which = ", ".join(labels[:3]) + (f" and {len(labels) - 3} more" if len(labels) > 3 else "")
        out += _wrap(f"{bound} ({which}): {advice}", width, "  ", "    ")
    return out


def _new(frame: pd.DataFrame, title: str, notes, fractions=(), priority=()) -> Report:
    out = Report(frame)
    out.attrs = {"title": title, "notes": list(notes), "fractions": [c for c in fractions if c in frame.columns],
                 "priority": [c for c in priority if c in frame.columns]}
    return out


def _kind(ds) -> str:
    kind = ds.attrs.get("kind", "")
    if kind in ("range", "pm_sampling", "pc_sampling", "topdown_by_phase"):
        return kind
    if "range" in ds.dims:
        return "range"
    if "time" in ds.dims:
        return "pm_sampling"
    if "kernel_samples" in ds:
        return "pc_sampling"
    from gpuscope.errors import NotGpuscopeDataError

    raise NotGpuscopeDataError(
        "This is not a gpuscope Dataset: it has no 'kind' attribute and none of the dims 'range' (range "
        f"profiling), 'time' (PM sampling) or a 'kernel_samples' variable (PC sampling). Its dims: {list(ds.dims)}."
    )


def _device_line(ds) -> str:
    a = ds.attrs
    parts = [str(a.get("device_name") or a.get("chip") or "unknown GPU")]
    if a.get("chip"):
        parts.append(f"chip {a['chip']}")
    if a.get("cupti_version"):
        parts.append(f"CUPTI {a['cupti_version']}")
    if a.get("created"):
        parts.append(f"recorded {a['created']}")
    return ", ".join(parts)


def _finite(ds, dim: str, what: str):
    """*ds* with NaN in place of every NaN or inf of its metrics along *dim* (missing, not a number to sum), and
    a note that counts them per metric.

    Raises
    ------
    ValueError
        No metric holds a single finite value: there is nothing to report.
    """
    n = ds.sizes[dim]
    metrics = [m for m in ds.data_vars if ds[m].dims == (dim,) and np.issubdtype(ds[m].dtype, np.number)]
    bad = {m: int(n - np.isfinite(ds[m].values).sum()) for m in metrics}
    if metrics and n and all(b == n for b in bad.values()):
        raise ValueError(f"This Dataset holds no measurement: every value of its {_count(len(metrics), 'metric')} "
                         f"in its {_count(n, what)} is NaN or inf (a failed or damaged recording). There is nothing "
                         "to report; profile again.")
    missing = {m: b for m, b in bad.items() if b}
    if not missing:
        return ds, []
    ds = ds.assign({m: ds[m].where(np.isfinite(ds[m])) for m in missing})
    listed = sorted(missing.items(), key=lambda mb: -mb[1])
    text = ", ".join(f"{m} in {b} of {n}" for m, b in listed[:3]) + (
        f" and {len(listed) - 3} more metrics" if len(listed) > 3 else "")
    return ds, [f"no data (NaN or inf) for {text} {_plural(what)}: left out of sums and means; '-' or 'no data' "
                "where no value is left."]


# ---------------------------------------------------------------------------------------------------------------
# Range results


def group_key(ds) -> np.ndarray:
    """Per range, the row it belongs to: the kernel's readable name for launches (mangled symbols demangled), the
    range path for user ranges."""
    names = np.asarray(ds["name"].values).astype(str) if "name" in ds.coords else np.full(ds.sizes["range"], "")
    if "kernel" not in ds.coords:
        return names
    from gpuscope._schema.names import demangle

    kernels = np.asarray(ds["kernel"].values).astype(str)
    unique, inverse = np.unique(kernels, return_inverse=True)
    readable = np.array([demangle(k) for k in unique.tolist()], dtype=object)[inverse].astype(str)
    return np.where(kernels != "", readable, names)


def topdown_per_launch(ds):
    """Top-Down nodes per range as fractions of peak, or None when the Dataset lacks the Top-Down metrics."""
    from gpuscope.errors import MissingMetricsError
    from gpuscope.metrics import topdown as td

    try:
        nodes = td.topdown(ds, check="ignore")
    except (MissingMetricsError, ValueError):
        return None
    ipc_max = float(nodes.attrs["topdown_ipc_max"])
    return nodes, ipc_max


def _verdict(row: dict | None) -> tuple[str, str, str]:
    """(bound_by, culprit, advice) from one row's Top-Down node values; "no data" where none is finite."""
    from gpuscope.metrics import topdown as td

    level2 = [n for n in td.level_cut(2, row or {}) if n != "retire"]
    values = {n: row[n] for n in level2 if np.isfinite(row[n])}
    if not values:
        return "no data", "", ""
    bound = max(values, key=values.get)
    children = {n.name: row[n.name] for n in td.NODES if n.parent == bound and n.name in row and np.isfinite(row[n.name])}
    culprit = max(children, key=children.get)[len(bound) + 1:] if children else ""
    return bound, culprit, next(n.description for n in td.NODES if n.name == bound)


def _topdown_columns(frame: pd.DataFrame, rows: dict, ipc_max: float) -> list[str]:
    """Top-Down level 1 (fractions of peak), bound_by, culprit and advice per row of *frame*, from *rows*: row
    label -> node values in IPC (a row without any is "no data", never a number)."""
    from gpuscope.metrics import topdown as td

    level1 = td.level_cut(1)
    for node in level1:
        frame[node] = [rows.get(k, {}).get(node, np.nan) / ipc_max for k in frame.index]
    verdicts = [_verdict(rows.get(k)) for k in frame.index]
    frame["bound_by"] = [v[0] for v in verdicts]
    frame["culprit"] = [v[1] for v in verdicts]
    frame["advice"] = [v[2] for v in verdicts]
    return level1


#: The columns of a range report, most important first: what a narrow terminal keeps.
_RANGE_PRIORITY = ("share", "gpu_time_ms", "launch_call_ms", "range_wall_ms", "bound_by", "culprit", "retire",
                   "backend", "frontend", "divergence", "launches", "count", "mean_us")


def _range_report(ds, *, by: str | None = None) -> Report:
    from gpuscope.metrics import topdown as td

    n = ds.sizes["range"]
    mode = str(ds.attrs.get("mode", ""))
    key = np.asarray(ds[by].values).astype(str) if by else group_key(ds)
    launches = "kernel" in ds.coords and bool((np.asarray(ds["kernel"].values).astype(str) != "").any())
    what = "launch" if launches else "range"
    label = by or ("kernel" if launches else "range")  # the index is what the rows were grouped by
    set_label = _metric_set(ds)
    ds, notes = _finite(ds, "range", what)
    frame = pd.DataFrame(index=pd.Index(list(dict.fromkeys(key.tolist())), name=label))
    frame["launches" if launches else "count"] = pd.Series(key).value_counts().reindex(frame.index).to_numpy()

    def per_group(values, how="sum"):
        s = pd.Series(np.asarray(values, dtype=float), index=key).groupby(level=0)
        out = s.sum(min_count=1) if how == "sum" else getattr(s, how)()  # a group of NaN sums to NaN, not 0
        return out.reindex(frame.index).to_numpy()

    def share(col):
        total = np.nansum(frame[col])
        return frame[col] / total if total > 0 else np.nan

    if GPU_TIME in ds:
        t = ds[GPU_TIME].values
        scale = 1e-9 if ds[GPU_TIME].attrs.get("units", "nanosecond") in ("nanosecond", "ns", "") else 1.0
        t = np.asarray(t, dtype=float) * scale
        frame["gpu_time_ms"] = per_group(t) * 1e3
        frame["mean_us"] = per_group(t, "mean") * 1e6
        frame["share"] = share("gpu_time_ms")
        share_of = "GPU time"
    elif "start_ns" in ds.coords and "end_ns" in ds.coords:
        wall = (ds["end_ns"].values - ds["start_ns"].values).astype(float) * 1e-9
        col = "launch_call_ms" if mode == "kernel" else "range_wall_ms"
        frame[col] = per_group(wall) * 1e3
        frame["share"] = share(col)
        share_of = col
        notes.append(
            f"No {GPU_TIME} in this Dataset: '{col}' is end_ns - start_ns, "
            + ("the host time of each launch call including CUPTI's replay passes, not GPU time."
               if mode == "kernel" else "host wall time of each range, including CUPTI's cost at its boundaries,"
               " not GPU time.")
            + f" Collect {GPU_TIME} (the 'launch', 'speed-of-light' and 'topdown' sets have it) for GPU time."
        )
    else:
        share_of = ""
    fractions = ["share"] if share_of else []

    result = topdown_per_launch(ds)
    if result is not None:
        nodes, ipc_max = result
        # a launch whose Top-Down is not a number (NaN or inf inputs) is left out, not averaged in as 0
        valid = np.logical_and.reduce([np.isfinite(nodes[n].values) for n in td.level_cut(1)])
        rows = {}
        if valid.any():
            kept = nodes.isel(range=np.flatnonzero(valid)).assign_coords(_group=("range", key[valid]))
            weighted = td.aggregate(kept, by="_group")
            rows = {str(k): {v: float(weighted[v].sel(_group=k)) for v in weighted.data_vars}
                    for k in weighted["_group"].values}
        fractions += _topdown_columns(frame, rows, ipc_max)
        notes.append(
            "Top-Down level 1 as fractions of the SM's peak issue rate (IPC_MAX "
            f"{ipc_max:g}), weighted by kernel length in cycles; bound_by is the level-2 node that loses the most "
            "issue slots, culprit the stall reason under it (gpuscope.topdown for all nodes)."
        )
    throughput = [m for m in ds.data_vars if ds[m].dims == ("range",) and ".pct_of_peak" in m]
    for m in throughput:
        frame[SHORT_NAMES.get(m, m)] = per_group(ds[m].values, "mean")
    # GB20x names its DRAM byte counters dram__bytes_op_read/_op_write (the launch set substitutes them there)
    dram = next(([r, w] for r, w in DRAM_BYTES if {r, w} <= set(ds.data_vars)), None)
    if GPU_TIME in ds and dram:
        moved = per_group(ds[dram[0]].values + ds[dram[1]].values)
        frame["DRAM GB/s"] = moved / (frame["gpu_time_ms"].to_numpy() * 1e-3) / 1e9
    if share_of and "share" in frame:
        frame = frame.sort_values("share", ascending=False, kind="stable")
    title = (f"gpuscope report: {_count(n, what)}, {_count(len(frame), label)}, {set_label}"
             + (f", {mode} mode" if mode else "") + f" ({_device_line(ds)})")
    if share_of:
        notes.insert(0, f"share: of the {share_of} of all rows.")
    return _new(frame, title, notes, fractions, _RANGE_PRIORITY)


def _metric_set(ds) -> str:
    """What the title says was collected: the set asked for by name, else the built-in sets the metrics hold
    (``metric set topdown + 1 metric``), else the number of metrics."""
    if ds.attrs.get("metric_set"):
        return f"metric set {ds.attrs['metric_set']}"
    from gpuscope.metrics.catalog import all_sets

    metrics = set(ds.attrs.get("metrics") or [m for m in ds.data_vars if ds[m].dims == ("range",)])
    held = {name: set(on.metrics) for name, s in all_sets().items() if s.kind == "range"
            for on in [s.on_chip(metrics.__contains__)] if not on.left_out and set(on.metrics) <= metrics}
    names, covered = [], set()
    while True:  # the sets that cover the most, largest first
        name = max(held, key=lambda k: len(held[k] - covered), default=None)
        if name is None or not held[name] - covered:
            break
        names.append(name)
        covered |= held.pop(name)
    extra = len(metrics - covered)
    if not names:
        return _count(extra, "metric")
    return f"metric set {','.join(names)}" + (f" + {_count(extra, 'metric')}" if extra else "")


# ---------------------------------------------------------------------------------------------------------------
# PM sampling


def _scaled(metric: str, values):
    return values / 1e9 if metric.endswith(".per_second") else values


#: Variables along ``time`` that label the samples rather than measure them (``gpuscope.phases`` adds ``phase``):
#: the report groups by them and never averages them.
_LABELS = ("phase",)


def _pm_report(ds, *, by: str | None = None) -> Report:
    n = ds.sizes["time"]
    if n == 0:
        lost = int(ds.attrs.get("lost_samples", 0) or 0)
        raise ValueError(f"this PM sampling Dataset holds no sample ({lost} were lost during collection: "
                         "attrs['lost_samples']), so there is nothing to report; `gpuscope show` prints such a file "
                         "as 'no samples'.")
    labelled = "phase" in ds.data_vars and ds["phase"].dims == ("time",)
    measured, notes = _finite(ds.drop_vars([v for v in _LABELS if v in ds.data_vars]), "time", "sample")
    metrics = [v for v in measured.data_vars if measured[v].dims == ("time",)]
    ranges = string_labels(ds["range"].values) if "range" in ds.coords else np.full(n, "")
    if by is None:
        by = "range" if (ranges != "").any() and not labelled else "phase"
    if by == "range":
        key = np.where(ranges != "", ranges, "(no range)")
        label = "range"
    elif by == "phase":
        if labelled:  # the labels gpuscope.phases gave: reported as they are, never found again
            key = np.asarray(ds["phase"].values).astype(int)
            notes.append("phase: the labels of gpuscope.phases that this Dataset holds; equal labels look alike; "
                         "segments: the stretches of consecutive samples with the label.")
        else:
            from gpuscope.metrics.phases import phases

            key = np.asarray(phases(ds)["phase"].values).astype(int)
            notes.append("phase: label from change-point detection (gpuscope.phases); equal labels look alike; "
                         "segments: the stretches of consecutive samples with the label.")
        label = "phase"
    else:
        raise ValueError(f"by={by!r}: a PM sampling report is per 'range' or per 'phase'.")
    if "start_ns" in ds.coords and "end_ns" in ds.coords:
        length = (ds["end_ns"].values - ds["start_ns"].values).astype(float)
        length[0] = np.nan  # the first sample reaches back over the idle time before sampling began
        length = np.where(np.isnan(length), np.nanmedian(length) if n > 1 else np.nan, length)
    else:
        length = np.full(n, np.nan)
    frame = pd.DataFrame({"_key": key, "_len": length, "_starts": np.r_[True, key[1:] != key[:-1]]})
    for m in metrics:
        frame[m] = _scaled(m, np.asarray(measured[m].values, dtype=float))
    grouped = frame.groupby("_key", sort=False)
    out = pd.DataFrame({"samples": grouped.size()})
    out.index.name = label
    if by == "phase":
        out["segments"] = grouped["_starts"].sum()
    out["time_ms"] = grouped["_len"].sum(min_count=1) / 1e6
    total = np.nansum(out["time_ms"])
    out["share"] = out["time_ms"] / total if total > 0 else np.nan
    for m in metrics:
        out[SHORT_NAMES.get(m, m)] = grouped[m].mean()
    interval = ds.attrs.get("interval_ns")
    every = f" every {float(interval) / 1e3:g} us" if interval else ""
    title = f"gpuscope report: PM sampling, {_count(n, 'sample')}{every}, {_count(len(out), label)} ({_device_line(ds)})"
    notes.insert(0, "time_ms: summed sample lengths; metric columns: mean over the samples (GB/s for rates).")
    lost = ds.attrs.get("lost_samples")
    if lost:
        notes.append(f"{lost} samples were lost during collection (attrs['lost_samples']).")
    return _new(out, title, notes, ["share"], ("share", "time_ms", "samples", "segments"))


# ---------------------------------------------------------------------------------------------------------------
# Top-Down per phase


def _phase_topdown_report(ds) -> Report:
    """One row per phase of ``gpuscope.dynamic(td, phases=ph)``: its share of the run, how much of it has a
    Top-Down, and that Top-Down; a phase with none says "not attributed"."""
    from gpuscope.metrics import topdown as td

    ipc_max = float(ds.attrs.get("topdown_ipc_max", 4.0))
    nodes = [n.name for n in td.NODES if n.name in ds.data_vars]
    frame = pd.DataFrame(index=pd.Index(np.asarray(ds["phase_id"].values).astype(int), name="phase"))
    frame["time_ms"] = np.asarray(ds["phase_duration"].values, dtype=float) / 1e6
    frame["share"] = np.asarray(ds["phase_fraction"].values, dtype=float)
    attributed = np.asarray(ds["attributed_fraction"].values, dtype=float)
    frame["attributed"] = attributed
    values = {n: np.asarray(ds[n].values, dtype=float) for n in nodes}
    rows = {p: {n: float(values[n][i]) for n in nodes} for i, p in enumerate(frame.index)
            if attributed[i] > 0 and all(np.isfinite(values[n][i]) for n in td.level_cut(1, nodes))}
    fractions = ["share", "attributed", *_topdown_columns(frame, rows, ipc_max)]
    # no range-profiled work in the phase; work whose Top-Down is not a number stays "no data"
    frame.loc[~(attributed > 0), "bound_by"] = "not attributed"
    by = ds.attrs.get("topdown_by", "")
    title = (f"gpuscope report: Top-Down per phase, {_count(len(frame), 'phase')}"
             + (f", joined by {by}" if by else "") + f" ({_device_line(ds)})")
    what = "kernels" if by == "kernels" else "user ranges"
    notes = [f"attributed: the part of the phase's time spent in {what} that were range-profiled (above 100% when "
             "kernels overlap); the Top-Down columns describe that work only, as fractions of the SM's peak issue "
             f"rate (IPC_MAX {ipc_max:g}). A phase with no such work is 'not attributed': its Top-Down is unknown."]
    return _new(frame, title, notes, fractions, ("share", "attributed", "bound_by", "culprit", "retire", "backend",
                                                 "frontend", "divergence", "time_ms"))


# ---------------------------------------------------------------------------------------------------------------
# PC sampling


def _pc_report(ds, *, top: int = 3) -> Report:
    counts = ds["kernel_samples"]
    reasons = np.asarray(counts["stall_reason"].values).astype(str)
    kernels = np.asarray(counts["kernel"].values).astype(str)
    values = np.asarray(counts.values, dtype=float)
    total = values.sum(axis=1)
    issued = np.isin(reasons, ("selected",))
    out = pd.DataFrame(index=pd.Index(kernels, name="kernel"))
    out["samples"] = total.astype(np.int64)
    out["share"] = total / total.sum() if total.sum() else np.nan
    out["issued"] = values[:, issued].sum(axis=1) / np.where(total > 0, total, np.nan)
    stalls = np.where(issued | np.isin(reasons, ("not_selected",)), 0.0, values)
    for i in range(top):
        names, pct = [], []
        for k in range(len(kernels)):
            order = np.argsort(-stalls[k], kind="stable")
            j = order[i] if i < len(order) else None
            ok = j is not None and stalls[k, j] > 0 and total[k] > 0
            names.append(reasons[j] if ok else "")
            pct.append(stalls[k, j] / total[k] if ok else np.nan)
        out[f"stall_{i + 1}"] = names
        out[f"stall_{i + 1}_share"] = pct
    out = out.sort_values("samples", ascending=False, kind="stable")
    title = (f"gpuscope report: PC sampling, {int(ds.attrs.get('total_samples', total.sum()))} samples, "
             f"{_count(len(out), 'kernel')} ({_device_line(ds)})")
    notes = ["issued: share of samples that found the warp issuing (selected); stall_N: the N-th most sampled "
             "stall reason and its share of the kernel's samples (gpuscope.fast_topdown for the hierarchy)."]
    dropped = int(ds.attrs.get("dropped_samples", 0) or 0)
    if dropped:
        notes.append(f"{dropped} samples were dropped by the hardware buffer.")
    fractions = ["share", "issued", *[f"stall_{i + 1}_share" for i in range(top)]]
    return _new(out, title, notes, fractions)


# ---------------------------------------------------------------------------------------------------------------


def report(ds, **options) -> Report:
    """A readable per-kernel (or per-range, per-phase) summary of any gpuscope Dataset.

    Parameters
    ----------
    ds : xarray.Dataset
        Range results (``Profiler.dataset``), a PM sampling series (``Sampler.dataset``, or its
        :func:`gpuscope.phases`), PC samples (``PCSampler.dataset``) or a Top-Down per phase
        (``gpuscope.dynamic(td, phases=ph)``), live or loaded with :func:`gpuscope.open_dataset`.
    by : str, optional
        Range results: a coordinate to group by (default: ``kernel`` for launches, ``name`` for user ranges).
        PM sampling: ``"range"`` (default when user ranges were open) or ``"phase"`` (default for a
        :func:`gpuscope.phases` result, whose labels it uses; otherwise the phases are found first).
    top : int, optional
        PC sampling: how many stall reasons to show per kernel (default 3).

    Returns
    -------
    Report
        A pandas DataFrame, one row per kernel / range / phase, sorted by share of time. Range results: launches,
        ``gpu_time_ms`` (total), ``mean_us``, ``share``; with the Top-Down metrics ``retire``, ``divergence``,
        ``frontend``, ``backend`` (fractions of peak), ``bound_by``, ``culprit``, ``advice``; throughput metrics
        (``*.pct_of_peak*``) as means. Without ``gpu__time_duration.sum`` the time column is named for what it is
        (``launch_call_ms`` in kernel mode) and a note says so. NaN and inf values are missing data: left out of
        sums and means and counted in a note; a row without a Top-Down says ``bound_by`` "no data" (Top-Down per
        phase: "not attributed") and gets no advice. ``print(report)`` shows a table that fits the terminal
        (:meth:`Report.to_text`) with its notes.

    Raises
    ------
    gpuscope.errors.NotGpuscopeDataError
        *ds* is not a gpuscope Dataset.
    ValueError
        An unknown option or ``by`` value; a Dataset of several devices (report each
        :func:`gpuscope.select_device`); a Dataset whose metrics are all NaN or inf (nothing to report).

    Examples
    --------
    >>> ds = gpuscope.open_dataset("out.nc")
    >>> print(gpuscope.report(ds))
    >>> gpuscope.report(ds)["bound_by"]
    """
    kind = _kind(ds)
    if "device" in ds.dims:
        held = ds["device"].values.tolist() if "device" in ds.coords else list(range(ds.sizes["device"]))
        raise ValueError(f"This Dataset holds the samples of devices {held} (dim 'device'); report one at a time: "
                         f"gpuscope.report(gpuscope.select_device(ds, {held[0]})) (gpuscope show does each).")
    builders = {"range": (_range_report, {"by"}), "pm_sampling": (_pm_report, {"by"}),
                "pc_sampling": (_pc_report, {"top"}), "topdown_by_phase": (_phase_topdown_report, set())}
    build, allowed = builders[kind]
    unknown = set(options) - allowed
    if unknown:
        raise ValueError(f"report() of a {kind} Dataset takes {sorted(allowed)}, not {sorted(unknown)}.")
    if kind == "range" and options.get("by") and options["by"] not in ds.coords:
        raise ValueError(f"by={options['by']!r} is not a coordinate of the Dataset; coordinates: {list(ds.coords)}")
    if kind == "range" and ds.sizes.get("range", 0) == 0:
        return _new(pd.DataFrame(index=pd.Index([], name="kernel")),
                    f"gpuscope report: nothing was profiled ({_device_line(ds)})",
                    ["The Dataset has no ranges: no kernel launch or range matched while the session was open."])
    return build(ds, **options)


def raw_text(ds, width: int | None = None) -> str:
    """Every value of every numeric variable of *ds* with its unit, row by row (``gpuscope show --page raw``).

    One block per position along the variables' first dimension (a launch, a sample, a PC), headed by its
    coordinates, then one line per variable: ``name  value  unit`` (a variable with more dimensions gives one line
    per value, its name followed by the other coordinates in brackets). Values are printed as they are, NaN and
    inf included. ``gpuscope.to_dataframe(ds)`` is the same as a table.

    Raises
    ------
    gpuscope.errors.NotGpuscopeDataError
        *ds* is not a gpuscope Dataset.
    ValueError
        *width* is below 20.
    """
    width = _width(width)
    _kind(ds)
    sizes = ", ".join(f"{d}: {n}" for d, n in ds.sizes.items())
    lines = _wrap(f"gpuscope raw values ({sizes}; {_device_line(ds)})", min(width, _PROSE))
    groups: dict = {}
    for v in ds.data_vars:
        if np.issubdtype(ds[v].dtype, np.number) or ds[v].dtype == bool:
            groups.setdefault(ds[v].dims[:1], []).append(v)
    for dims, names in groups.items():
        dim = dims[0] if dims else None
        size = ds.sizes[dim] if dim else 1
        heads = _raw_heads(ds, dim, size)
        entries = [entry for v in names for entry in _raw_entries(ds, v)]
        name_w = max(len(e[0]) for e in entries)
        value_w = max(len(t) for e in entries for t in e[1])
        # one aligned line per value where all fit; else each value on a line of its own under its name
        one_line = all(2 + name_w + 2 + value_w + 2 + len(e[2]) <= width for e in entries)
        for i in range(size):
            lines.append("")
            lines += _wrap(heads[i], width, "", "    ")
            for name, texts, unit in entries:
                if one_line:
                    lines.append(f"  {name.ljust(name_w)}  {texts[i].rjust(value_w)}  {unit}".rstrip())
                else:
                    lines += textwrap.wrap(name, width, initial_indent="  ", subsequent_indent="  ")
                    lines += _wrap(f"{texts[i]} {unit}", width, "      ", "      ")
    return "\n".join(lines)


def _raw_heads(ds, dim, size: int) -> list[str]:
    """Each block's heading: the position along *dim* and every coordinate along it."""
    if dim is None:
        return ["(values without a dimension)"]
    own = np.asarray(ds[dim].values).astype(str) if dim in ds.coords else np.arange(size).astype(str)
    others = [(c, np.asarray(ds[c].values).astype(str)) for c in ds.coords if ds[c].dims == (dim,) and c != dim]
    return [f"{dim} {own[i]}" + "".join(f", {c} {values[i] or repr('')}" for c, values in others)
            for i in range(size)]


def _raw_entries(ds, name: str) -> list[tuple[str, list[str], str]]:
    """(label, the value's text at each position along the first dimension, unit) per value of one variable."""
    var = ds[name]
    unit = str(var.attrs.get("units", ""))
    values = np.asarray(var.values)
    if values.ndim <= 1:
        return [(name, [_raw_value(x) for x in values.reshape(-1)], unit)]
    rest = var.dims[1:]
    labels = [np.asarray(ds[d].values).astype(str) if d in ds.coords else np.arange(ds.sizes[d]).astype(str)
              for d in rest]
    return [(f"{name}[{','.join(lab[j] for lab, j in zip(labels, idx))}]",
             [_raw_value(x) for x in values[(slice(None), *idx)]], unit)
            for idx in np.ndindex(*values.shape[1:])]


def _raw_value(x) -> str:
    if isinstance(x, (bool, np.bool_)):
        return str(bool(x))
    if np.issubdtype(type(x), np.integer):
        return f"{int(x):,}"
    return f"{float(x):,.6g}"


def _plural(noun: str) -> str:
    return noun + ("es" if noun.endswith(("ch", "sh", "s", "x")) else "s")


def _count(n: int, noun: str) -> str:
    """``1 kernel``, ``2 kernels``, ``3 launches``."""
    return f"{n} {noun if n == 1 else _plural(noun)}"
