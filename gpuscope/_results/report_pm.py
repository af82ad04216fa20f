"""The reports of PM sampling: one row per user range or phase of a series, or per phase of its Top-Down."""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpuscope._results.report_inputs import SHORT_NAMES, _device_line, _finite, _no_negative
from gpuscope._results.report_table import Report, _count, _new, _percent_columns
from gpuscope._results.report_topdown import _topdown_columns
from gpuscope._schema.labels import string_labels


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
        typical = np.nanmedian(np.where(length < 0, np.nan, length)) if n > 1 else np.nan
        length = _no_negative(np.where(np.isnan(length), typical, length), "end_ns - start_ns", "sample", notes)
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
    out["share"] = 100 * out["time_ms"] / total if total > 0 else np.nan
    for m in metrics:
        out[SHORT_NAMES.get(m, m)] = grouped[m].mean()
    interval = ds.attrs.get("interval_ns")
    every = f" every {float(interval) / 1e3:g} us" if interval else ""
    title = f"gpuscope report: PM sampling, {_count(n, 'sample')}{every}, {_count(len(out), label)} ({_device_line(ds)})"
    notes.insert(0, "time_ms: summed sample lengths; metric columns: mean over the samples (GB/s for rates).")
    lost = ds.attrs.get("lost_samples")
    if lost:
        notes.append(f"{lost} samples were lost during collection (attrs['lost_samples']).")
    return _new(out, title, notes, _percent_columns("share"), ("share", "time_ms", "samples", "segments"))


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
    frame["share"] = 100 * np.asarray(ds["phase_fraction"].values, dtype=float)
    attributed = np.asarray(ds["attributed_fraction"].values, dtype=float)
    frame["attributed"] = 100 * attributed
    values = {n: np.asarray(ds[n].values, dtype=float) for n in nodes}
    rows = {p: {n: float(values[n][i]) for n in nodes} for i, p in enumerate(frame.index)
            if attributed[i] > 0 and all(np.isfinite(values[n][i]) for n in td.level_cut(1, nodes))}
    percent = ["share", "attributed", *_topdown_columns(frame, rows)]
    # no range-profiled work in the phase; work whose Top-Down is not a number stays "no data"
    frame.loc[~(attributed > 0), "bound_by"] = "not attributed"
    by = ds.attrs.get("topdown_by", "")
    title = (f"gpuscope report: Top-Down per phase, {_count(len(frame), 'phase')}"
             + (f", joined by {by}" if by else "") + f" ({_device_line(ds)})")
    what = "kernels" if by == "kernels" else "user ranges"
    notes = [f"attributed: the part of the phase's time spent in {what} that were range-profiled (above 100% when "
             "kernels overlap); the Top-Down columns describe that work only, in percent of the SM's peak issue "
             f"rate (IPC_MAX {ipc_max:g}). A phase with no such work is 'not attributed': its Top-Down is unknown."]
    priority = ("share", "attributed", "bound_by", "culprit", "retire", "backend", "frontend", "divergence", "time_ms")
    return _new(frame, title, notes, _percent_columns(*percent), priority)
