"""What every report reads from a Dataset: its kind, its device, short names of its metrics, its missing values."""

from __future__ import annotations

import numpy as np

from gpuscope._results.report_table import _count, _plural

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


def graph_launches_text(count: int) -> str:
    """``10 CUDA graph launches``, ``1 CUDA graph launch``."""
    return f"{count} CUDA graph launch{'' if count == 1 else 'es'}"


def listed_kernels(executions: dict, most: int = 6) -> str:
    """``gemm x10, relu x10, reduce x10`` from kernel name -> executions (the *most* first, then how many more)."""
    items = [f"{name} x{n}" for name, n in executions.items()]
    return ", ".join(items[:most]) + (f" and {len(items) - most} more" if len(items) > most else "")


def graph_note(ds) -> str:
    """What range results say first of the CUDA graph launches their session could not profile (attrs
    ``graph_launches``, ``graph_kernels``, ``graph_kernels_unavailable``), or ``""``."""
    launches = int(ds.attrs.get("graph_launches", 0) or 0)
    if not launches:
        return ""
    text = f"{graph_launches_text(launches)} not profiled"
    executions = ds.attrs.get("graph_kernels")
    if isinstance(executions, dict) and executions:
        return f"{text} (kernels: {listed_kernels(executions)})"
    why = ds.attrs.get("graph_kernels_unavailable")
    return f"{text} (their kernels not named: {why})" if why else text


#: The reasons of gpuscope._range_profiling.coverage.REASONS, as the report's first lines say them.
_WHY = {"searching": "while it searched for the loop", "between_iterations": "between the loop's iterations",
        "loop_changed": "in a pass group given up when the loop changed",
        "unmatched": "in iterations that launched other kernels",
        "incomplete_group": "in the last pass group, short of the set's passes"}


def coverage_note(ds) -> str:
    """What auto mode, following the launch stream, profiled of what it saw (attrs ``launches_seen``,
    ``launches_profiled`` and, once it found a loop, ``launches_from_the_loop``...: gpuscope._range_profiling.coverage),
    and the launches of a last pass group completed from the group before (iteration replay in any mode), or ``""``."""
    unsafe = unprofiled_note(ds.attrs)
    text = _coverage_text(ds)
    return "; ".join(t for t in (text, unsafe) if t)


#: The launches a per-launch session ran unprofiled rather than block the program, by attr: (what, the rest).
_UNPROFILED = {
    "launches_concurrent": ("launch", "from other threads ran unprofiled while a profiled launch was in flight"),
    "launches_overlapped": ("profiled launch", "without a row, overlapped by another thread's launch"),
    "launches_captured": ("launch", "recorded into a CUDA graph by stream capture (they run as its nodes)"),
    "launches_host_waiting": ("launch", "waiting for the host or behind one that does (XLA's autotuning timer: "
                                        "replaying them would stall) ran unprofiled"),
    "launches_before_start": ("launch", "from other threads before the profiler had started"),
    "launches_exit_unheard": ("launch", "whose call's exit was not heard (the session paused between "
                                        "iterations while it ran; its baton was freed)"),
}


def unprofiled_note(attrs) -> str:
    """The launches a per-launch session let run unprofiled because it could not profile them safely (Dataset
    attrs of :data:`_UNPROFILED`), or ``""``."""
    parts = []
    for key, (what, rest) in _UNPROFILED.items():
        n = int(attrs.get(key, 0) or 0)
        if n:
            parts.append(f"{n:,} {what}{'' if n == 1 else 'es'} {rest} ({key})")
    return "; ".join(parts)


def _coverage_text(ds) -> str:
    completed = int(ds.attrs.get("launches_completed_from_earlier_group", 0) or 0)
    last = (f"{completed:,} launch{'' if completed == 1 else 'es'} in the last pass group, with up to "
            f"{int(ds.attrs.get('passes_from_earlier_group', 0) or 0)} of their passes from the group before "
            "(passes_from_earlier_group)") if completed > 0 else ""
    seen, profiled = ds.attrs.get("launches_seen"), ds.attrs.get("launches_profiled")
    if seen is None or profiled is None or int(seen) <= 0:
        return last
    seen, profiled = int(seen), int(profiled)
    text = f"auto mode profiled {profiled:,} of the {seen:,} launches it saw ({100 * profiled / seen:.0f}%)"
    total = int(ds.attrs.get("launches_from_the_loop", 0) or 0)
    if total > 0:
        ours = int(ds.attrs["launches_profiled_from_the_loop"])
        text += (f"; from the loop's first iteration (launch {int(ds.attrs['loop_first_launch'])}) on, {ours:,} of "
                 f"{total:,} ({100 * ours / total:.0f}%)")
    if last:
        text += f"; {last}"
    why = ds.attrs.get("launches_unprofiled_by_reason")
    if isinstance(why, dict) and why:
        text += "; not profiled: " + ", ".join(f"{int(n):,} {_WHY.get(reason, reason.replace('_', ' '))}"
                                               for reason, n in why.items())
    return text


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


def _no_negative(durations, label: str, what: str, notes: list) -> np.ndarray:
    """*durations* (float) with NaN in place of each negative one, and a note that counts them. No recording holds
    a negative duration (an edited or damaged file does): summed, it would give shares below 0 and above 100%."""
    durations = np.array(durations, dtype=float)
    negative = durations < 0
    if negative.any():
        durations[negative] = np.nan
        notes.append(f"negative {label} in {int(negative.sum())} of {len(durations)} {_plural(what)} (impossible: "
                     "the data was edited or damaged): left out of times and shares.")
    return durations
