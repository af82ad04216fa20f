"""The report of range results: one row per kernel (or user range), with time, share, Top-Down and throughputs."""

from __future__ import annotations

import numpy as np
import pandas as pd

from gpuscope._results.report_inputs import (SHORT_NAMES, _device_line, _finite, _no_negative, coverage_note,
                                             graph_note)
from gpuscope._results.report_table import Report, _count, _new, _percent_columns
from gpuscope._results.report_topdown import _topdown_columns, grouped_topdown, topdown_per_launch

__all__ = ["GPU_TIME", "group_key"]

#: The metric that is GPU time (ns) per launch or range.
GPU_TIME = "gpu__time_duration.sum"

#: DRAM bytes read and written, as each chip names them.
DRAM_BYTES = (("dram__bytes_read.sum", "dram__bytes_write.sum"), ("dram__bytes_op_read.sum", "dram__bytes_op_write.sum"))



#: What to do about launches without a verdict (the report's note; docs/topdown.md, "Launches without a verdict")
NO_VERDICT_NEXT = (
    "Next: a kernel's launches that have a verdict stand for it (gpuscope.topdown(ds) where decided); "
    "gpuscope.profile_fast_topdown(work) takes every kernel's stall shares from PC sampling, one pass with nothing "
    "to disagree; a longer run (more launches, or iteration mode over more iterations) gives each kernel more "
    "launches to draw on.")


def _no_verdict_label(nodes, rows) -> str:
    """The bound_by cell of a row none of whose launches has a verdict: why, by how much (its worst launch)."""
    from gpuscope.metrics import topdown as td

    spread = nodes["pass_spread"].values[rows] if "pass_spread" in nodes.coords else np.array([np.nan])
    cover = nodes["warp_state_coverage"].values[rows]
    if np.isfinite(spread).any() and np.nanmax(spread) > td.SPREAD_TOLERANCE:
        return f"no verdict: passes {np.nanmax(spread):.0f}% apart"
    if np.isfinite(cover).any():
        worst = cover[np.nanargmax(np.abs(cover - 100))]
        return f"no verdict: states cover {worst:.0f}%"
    return "no verdict: passes disagree"


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
        return 100 * frame[col] / total if total > 0 else np.nan

    if GPU_TIME in ds:
        t = ds[GPU_TIME].values
        scale = 1e-9 if ds[GPU_TIME].attrs.get("units", "nanosecond") in ("nanosecond", "ns", "") else 1.0
        t = _no_negative(np.asarray(t, dtype=float) * scale, GPU_TIME, what, notes)
        frame["gpu_time_ms"] = per_group(t) * 1e3
        frame["mean_us"] = per_group(t, "mean") * 1e6
        frame["share"] = share("gpu_time_ms")
        share_of = "GPU time"
    elif "start_ns" in ds.coords and "end_ns" in ds.coords:
        wall = _no_negative((ds["end_ns"].values - ds["start_ns"].values).astype(float) * 1e-9, "end_ns - start_ns",
                            what, notes)
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
    percent = ["share"] if share_of else []

    result = topdown_per_launch(ds)
    if result is not None:
        nodes, ipc_max = result
        rows, inconsistent = grouped_topdown(nodes, key)
        percent += _topdown_columns(frame, rows)
        notes.append(
            "Top-Down level 1 in percent of the SM's peak issue rate (IPC_MAX "
            f"{ipc_max:g}), weighted by kernel length in cycles; bound_by is the level-2 node that loses the most "
            "issue slots, culprit the stall reason under it (gpuscope.topdown for all nodes)."
        )
        if inconsistent.any():
            bad = sorted(set(key[inconsistent].tolist()) - set(rows))
            for k in bad:
                if k in frame.index:
                    frame.loc[k, "bound_by"] = _no_verdict_label(nodes, key == k)
            cover = nodes["warp_state_coverage"].values[inconsistent]
            why = []
            if (np.abs(cover - 100) > td.COVERAGE_TOLERANCE).any():
                why.append(f"warp states covering {np.nanmin(cover):.0f}-{np.nanmax(cover):.0f}% of warp-active "
                           f"cycles (not 100 +/- {td.COVERAGE_TOLERANCE:g}%)")
            if "pass_spread" in nodes.coords:
                spread = nodes["pass_spread"].values[inconsistent]
                if (spread > td.SPREAD_TOLERANCE).any():
                    why.append(f"stall passes whose active warp-cycles differ by up to {np.nanmax(spread):.0f}% "
                               f"(pass_spread over {td.SPREAD_TOLERANCE:g}%)")
            close = " whose verdict does not lead the next node by more than that leaves uncertain" \
                if "decided" in nodes.coords else ""
            notes.append(
                f"{int(inconsistent.sum())} launch(es) left out of the Top-Down columns: "
                + " or ".join(why or ["passes that disagree"]) + close
                + ", so no verdict is given for them (columns decided and no_verdict of gpuscope.topdown"
                + (f"; rows with none left: {', '.join(bad[:5])}" if bad else "") + "). " + NO_VERDICT_NEXT)
        if "decided" in nodes.coords:
            kept = nodes["decided"].values.astype(bool) & ~nodes["consistent"].values.astype(bool)
            if kept.any():
                notes.append(
                    f"{int(kept.sum())} launch(es) whose passes disagree keep their verdict: it leads the next "
                    "level-2 node by more than the disagreement leaves uncertain (decided, verdict_margin; a culprit "
                    "that does not lead by as much shows as undecided).")
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
    graphs, coverage = graph_note(ds), coverage_note(ds)
    if graphs:
        title += f". {graphs}."
    if coverage:
        title += f". {coverage[0].upper()}{coverage[1:]}."
    if share_of:
        notes.insert(0, f"share: of the {share_of} of all rows.")
    return _new(frame, title, notes, _percent_columns(*percent), _RANGE_PRIORITY)


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
