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

import numpy as np
import pandas as pd

__all__ = ["Report", "report", "GPU_TIME", "group_key", "topdown_per_launch"]

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


class Report(pd.DataFrame):
    """A DataFrame with a title and notes, printed as a readable table.

    Use it as any DataFrame (``report["bound_by"]``, ``report.to_csv(...)``); ``print(report)`` gives the
    fixed-width table and a notebook shows :meth:`_repr_html_`. Columns listed in ``attrs["fractions"]`` hold
    fractions (0-1) and print as percentages.
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
                out[col] = lambda v: "" if pd.isna(v) else f"{100 * v:.1f}%"
            elif pd.api.types.is_float_dtype(self[col].dtype):
                out[col] = _number
        return out

    def to_text(self, max_advice: int = 60) -> str:
        """The report as fixed-width text: title, table, notes."""
        frame = pd.DataFrame(self).copy()
        if "advice" in frame and max_advice:
            frame["advice"] = [a if len(a) <= max_advice else a[: max_advice - 3] + "..." for a in frame["advice"]]
        lines = [self.title] if self.title else []
        if len(frame):
            lines.append(frame.to_string(formatters=self._formatters(), na_rep="-", justify="right"))
        else:
            lines.append("(no rows)")
        lines += [f"note: {n}" for n in self.notes]
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


def _number(v) -> str:
    if pd.isna(v):
        return "-"
    a = abs(v)
    if a == 0 or 0.01 <= a < 1e6:
        return f"{v:,.3g}" if a < 100 else f"{v:,.0f}"
    return f"{v:.3g}"


def _new(frame: pd.DataFrame, title: str, notes, fractions=()) -> Report:
    out = Report(frame)
    out.attrs = {"title": title, "notes": list(notes), "fractions": [c for c in fractions if c in frame.columns]}
    return out


def _kind(ds) -> str:
    kind = ds.attrs.get("kind", "")
    if kind in ("range", "pm_sampling", "pc_sampling"):
        return kind
    if "range" in ds.dims:
        return "range"
    if "time" in ds.dims:
        return "pm_sampling"
    if "kernel_samples" in ds:
        return "pc_sampling"
    from .errors import NotGpuscopeDataError

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


# ---------------------------------------------------------------------------------------------------------------
# Range results


def group_key(ds) -> np.ndarray:
    """Per range, the row it belongs to: the kernel's readable name for launches (mangled symbols demangled), the
    range path for user ranges."""
    names = np.asarray(ds["name"].values).astype(str) if "name" in ds.coords else np.full(ds.sizes["range"], "")
    if "kernel" not in ds.coords:
        return names
    from ._names import demangle

    kernels = np.asarray(ds["kernel"].values).astype(str)
    unique, inverse = np.unique(kernels, return_inverse=True)
    readable = np.array([demangle(k) for k in unique.tolist()], dtype=object)[inverse].astype(str)
    return np.where(kernels != "", readable, names)


def topdown_per_launch(ds):
    """Top-Down nodes per range as fractions of peak, or None when the Dataset lacks the Top-Down metrics."""
    from .errors import MissingMetricsError
    from .metrics import topdown as td

    try:
        nodes = td.topdown(ds, check="ignore")
    except (MissingMetricsError, ValueError):
        return None
    ipc_max = float(nodes.attrs["topdown_ipc_max"])
    return nodes, ipc_max


def _verdict(row: dict) -> tuple[str, str, str]:
    """(bound_by, culprit, advice) from one kernel's Top-Down node values."""
    from .metrics import topdown as td

    level2 = [n for n in td.level_cut(2, row) if n != "retire"]
    values = {n: row[n] for n in level2 if np.isfinite(row[n])}
    if not values:
        return "", "", ""
    bound = max(values, key=values.get)
    children = {n.name: row[n.name] for n in td.NODES if n.parent == bound and n.name in row and np.isfinite(row[n.name])}
    culprit = max(children, key=children.get)[len(bound) + 1:] if children else ""
    return bound, culprit, next(n.description for n in td.NODES if n.name == bound)


def _range_report(ds, *, by: str | None = None) -> Report:
    from .metrics import topdown as td

    n = ds.sizes["range"]
    mode = str(ds.attrs.get("mode", ""))
    key = np.asarray(ds[by].values).astype(str) if by else group_key(ds)
    launches = "kernel" in ds.coords and bool((np.asarray(ds["kernel"].values).astype(str) != "").any())
    label = by or ("kernel" if launches else "range")  # the index is what the rows were grouped by
    notes = []
    frame = pd.DataFrame(index=pd.Index(list(dict.fromkeys(key.tolist())), name=label))
    frame["launches" if launches else "count"] = pd.Series(key).value_counts().reindex(frame.index).to_numpy()

    def per_group(values, how="sum"):
        s = pd.Series(np.asarray(values, dtype=float), index=key).groupby(level=0)
        return getattr(s, how)().reindex(frame.index).to_numpy()

    if GPU_TIME in ds:
        t = ds[GPU_TIME].values
        scale = 1e-9 if ds[GPU_TIME].attrs.get("units", "nanosecond") in ("nanosecond", "ns", "") else 1.0
        t = np.asarray(t, dtype=float) * scale
        frame["gpu_time_ms"] = per_group(t) * 1e3
        frame["mean_us"] = per_group(t, "mean") * 1e6
        frame["share"] = frame["gpu_time_ms"] / np.nansum(frame["gpu_time_ms"])
        share_of = "GPU time"
    elif "start_ns" in ds.coords and "end_ns" in ds.coords:
        wall = (ds["end_ns"].values - ds["start_ns"].values).astype(float) * 1e-9
        col = "launch_call_ms" if mode == "kernel" else "range_wall_ms"
        frame[col] = per_group(wall) * 1e3
        frame["share"] = frame[col] / np.nansum(frame[col])
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
        weighted = td.aggregate(nodes.assign_coords(_group=("range", key)), by="_group")
        rows = {str(k): {v: float(weighted[v].sel(_group=k)) / ipc_max for v in weighted.data_vars}
                for k in weighted["_group"].values}
        for node in td.level_cut(1):
            frame[node] = [rows[k].get(node, np.nan) for k in frame.index]
        verdicts = [_verdict(rows[k]) for k in frame.index]
        frame["bound_by"] = [v[0] for v in verdicts]
        frame["culprit"] = [v[1] for v in verdicts]
        frame["advice"] = [v[2] for v in verdicts]
        fractions += td.level_cut(1)
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
    what = "launch" if launches else "range"
    set_name = ds.attrs.get("metric_set") or _count(len(ds.attrs.get("metrics", [])) or len(ds.data_vars), "metric")
    title = (f"gpuscope report: {_count(n, what)}, {_count(len(frame), label)}, metric set {set_name}"
             + (f", {mode} mode" if mode else "") + f" ({_device_line(ds)})")
    if share_of:
        notes.insert(0, f"share: of the {share_of} of all rows.")
    return _new(frame, title, notes, fractions)


# ---------------------------------------------------------------------------------------------------------------
# PM sampling


def _scaled(metric: str, values):
    return values / 1e9 if metric.endswith(".per_second") else values


def _pm_report(ds, *, by: str | None = None) -> Report:
    metrics = [v for v in ds.data_vars if ds[v].dims == ("time",)]
    n = ds.sizes["time"]
    notes = []
    ranges = np.asarray(ds["range"].values).astype(str) if "range" in ds.coords else np.full(n, "")
    if by is None:
        by = "range" if (ranges != "").any() else "phase"
    if by == "range":
        key = np.where(ranges != "", ranges, "(no range)")
        label = "range"
    elif by == "phase":
        from .metrics.phases import phases

        ph = phases(ds)
        key = np.asarray(ph["phase"].values).astype(int)
        label = "phase"
        notes.append("phase: label from change-point detection (gpuscope.phases); equal labels look alike.")
    else:
        raise ValueError(f"by={by!r}: a PM sampling report is per 'range' or per 'phase'.")
    if "start_ns" in ds.coords and "end_ns" in ds.coords:
        length = (ds["end_ns"].values - ds["start_ns"].values).astype(float)
        length[0] = np.nan  # the first sample reaches back over the idle time before sampling began
        length = np.where(np.isnan(length), np.nanmedian(length) if n > 1 else np.nan, length)
    else:
        length = np.full(n, np.nan)
    frame = pd.DataFrame({"_key": key, "_len": length})
    for m in metrics:
        frame[m] = _scaled(m, np.asarray(ds[m].values, dtype=float))
    grouped = frame.groupby("_key", sort=False)
    out = pd.DataFrame({"samples": grouped.size()})
    out.index.name = label
    out["time_ms"] = grouped["_len"].sum() / 1e6
    out["share"] = out["time_ms"] / np.nansum(out["time_ms"])
    for m in metrics:
        out[SHORT_NAMES.get(m, m)] = grouped[m].mean()
    interval = ds.attrs.get("interval_ns")
    every = f" every {float(interval) / 1e3:g} us" if interval else ""
    title = f"gpuscope report: PM sampling, {_count(n, 'sample')}{every}, {_count(len(out), label)} ({_device_line(ds)})"
    notes.insert(0, "time_ms: summed sample lengths; metric columns: mean over the samples (GB/s for rates).")
    lost = ds.attrs.get("lost_samples")
    if lost:
        notes.append(f"{lost} samples were lost during collection (attrs['lost_samples']).")
    return _new(out, title, notes, ["share"])


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
        Range results (``Profiler.dataset``), a PM sampling series (``Sampler.dataset``) or PC samples
        (``PCSampler.dataset``), live or loaded with :func:`gpuscope.open_dataset`.
    by : str, optional
        Range results: a coordinate to group by (default: ``kernel`` for launches, ``name`` for user ranges).
        PM sampling: ``"range"`` (default when user ranges were open) or ``"phase"`` (change-point phases).
    top : int, optional
        PC sampling: how many stall reasons to show per kernel (default 3).

    Returns
    -------
    Report
        A pandas DataFrame, one row per kernel / range / phase, sorted by share of time. Range results: launches,
        ``gpu_time_ms`` (total), ``mean_us``, ``share``; with the Top-Down metrics ``retire``, ``divergence``,
        ``frontend``, ``backend`` (fractions of peak), ``bound_by``, ``culprit``, ``advice``; throughput metrics
        (``*.pct_of_peak*``) as means. Without ``gpu__time_duration.sum`` the time column is named for what it is
        (``launch_call_ms`` in kernel mode) and a note says so. ``print(report)`` shows a table with its notes.

    Raises
    ------
    gpuscope.errors.NotGpuscopeDataError
        *ds* is not a gpuscope Dataset.
    ValueError
        An unknown option or ``by`` value; a Dataset of several devices (report each
        :func:`gpuscope.select_device`).

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
    builders = {"range": (_range_report, {"by"}), "pm_sampling": (_pm_report, {"by"}), "pc_sampling": (_pc_report, {"top"})}
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


def _count(n: int, noun: str) -> str:
    """``1 kernel``, ``2 kernels``, ``3 launches``."""
    plural = noun + ("es" if noun.endswith(("ch", "sh", "s", "x")) else "s")
    return f"{n} {noun if n == 1 else plural}"
