"""PC-sampling records as a Dataset: samples per PC and source line, stall reasons in Top-Down categories.

CUPTI's stall-reason names are kept and grouped (:data:`STALL_REASONS`); every sample is accounted for
(:func:`sample_total`). Used on a block's records when it ends and on recorded fixtures, without a GPU.
"""

from __future__ import annotations

import numpy as np

__all__ = ["STALL_REASONS", "CUPTI_PREFIX", "graph_nodes", "pc_coords", "records_dataset", "sample_total",
           "source_map_attrs"]

#: Prefix of every stall-reason name CUPTI gives; the Dataset's ``stall_reason`` dim drops it.
CUPTI_PREFIX = "smsp__pcsamp_warps_issue_stalled_"

#: Warp state -> (Top-Down category, short description). Categories follow
#: :data:`gpuscope.metrics.topdown.STALL_PARENT` (the counter-based hierarchy), with ``issued`` for the two
#: states that are not stalls: ``selected`` (the warp issued) and ``not_selected`` (ready, another warp issued).
#: PC sampling says ``no_instructions`` where the counters say ``no_instruction``.
STALL_REASONS: dict[str, tuple[str, str]] = {
    "selected": ("issued", "the warp issued an instruction"),
    "not_selected": ("issued", "ready, but the scheduler issued another warp"),
    "no_instructions": ("frontend_fetch", "no instruction fetched yet, or an instruction cache miss"),
    "barrier": ("frontend_fetch", "waiting for sibling warps at a CTA barrier (__syncthreads)"),
    "membar": ("frontend_fetch", "waiting on a memory barrier"),
    "branch_resolving": ("frontend_fetch", "waiting for a branch target or the branch mask"),
    "sleeping": ("frontend_fetch", "all threads blocked, yielded or sleeping"),
    "misc": ("frontend_decode", "miscellaneous hardware reason"),
    "dispatch_stall": ("frontend_decode", "the dispatcher held the warp back (pipeline interlock)"),
    "math_pipe_throttle": ("backend_core", "waiting for an oversubscribed math pipe"),
    "wait": ("backend_core", "fixed-latency execution dependency (e.g. a dependent FMA)"),
    "gmma": ("backend_core", "waiting on a warpgroup MMA (Hopper tensor cores)"),
    "warpgroup_arrive": ("backend_core", "waiting at a warpgroup arrive barrier before a warpgroup MMA (Hopper)"),
    "long_scoreboard": ("backend_memory", "waiting for L1TEX data: global, local, texture"),
    "short_scoreboard": ("backend_memory", "waiting for MIO data: shared memory, special math"),
    "mio_throttle": ("backend_memory", "MIO instruction queue full"),
    "lg_throttle": ("backend_memory", "local/global memory instruction queue full"),
    "tex_throttle": ("backend_memory", "texture instruction queue full"),
    "drain": ("backend_memory", "after EXIT, waiting for memory writes to drain"),
    "imc_miss": ("backend_memory", "immediate constant cache miss"),
}


def _reason_table(cupti_names: list[str]):
    """Base states (without ``_not_issued``) in CUPTI's order, and name -> (column, is_not_issued)."""
    base: list[str] = []
    column: dict[str, tuple[int, bool]] = {}
    for full in cupti_names:
        if not full.startswith(CUPTI_PREFIX):
            continue  # smsp__pcsamp_sample_count, smsp__pcsamp_samples_data_dropped: counts, not warp states
        short = full[len(CUPTI_PREFIX):]
        not_issued = short.endswith("_not_issued")
        stem = short[: -len("_not_issued")] if not_issued else short
        if stem not in base:
            base.append(stem)
        column[full] = (base.index(stem), not_issued)
    return base, column


def sample_total(records, reason_indices, reason_names) -> int:
    """Every sample accounted for: those in the records, dropped ones, and those CUPTI could not attribute.

    A sample is counted once, in its warp state; the ``*_not_issued`` rows repeat samples already counted.
    CUPTI's own ``totalSamples`` (``records.total_samples``) is not used: on the H100 (CUPTI 13.0) it leaves out
    what a drain delivers in a process's first block and what ``cuptiPCSamplingDisable`` hands over, so at
    long periods it reports a few hundred samples where the records hold 10^5 (docs/pc-sampling.md).
    """
    _, column = _reason_table(list(reason_names))
    states = [int(i) for i, n in zip(reason_indices, reason_names) if n in column and not column[n][1]]
    delivered = int(np.sum(records.samples[np.isin(records.stall_reason_index, states)]))
    return delivered + int(records.dropped_samples) + int(records.non_user_kernel_samples)


def pc_coords(keys, source_map) -> dict[str, list]:
    """The coordinates along ``pc`` of (cubin CRC, mangled function, PC offset) keys, in their order, with the
    source lines *source_map* finds: the same in PC-sampling and source-counter Datasets."""
    from gpuscope._schema.names import kernel_name

    locations = [source_map.locate(crc, fn, off) for crc, fn, off in keys]
    return {
        "function": [kernel_name(fn) for _, fn, _ in keys],  # as every Dataset of the process names the kernel
        "mangled_name": [fn for _, fn, _ in keys],
        "pc_offset": [off for _, _, off in keys],
        "cubin_crc": [crc for crc, _, _ in keys],
        "file": [loc.file for loc in locations],
        "line": [loc.line for loc in locations],
        "line_text": [loc.text for loc in locations],
    }


def source_map_attrs(source_map) -> dict[str, str]:
    """The attrs naming the functions *source_map* found no line info or no cubin for."""
    from gpuscope._schema.names import kernel_name

    # comma-separated strings, not lists: an empty list does not survive netCDF
    return {"functions_without_lineinfo": ", ".join(sorted(kernel_name(f) for f in source_map.without_lineinfo)),
            "functions_without_cubin": ", ".join(sorted(kernel_name(f) for f in source_map.without_cubin))}


def graph_nodes(kernel_records) -> dict[str, list]:
    """The CUDA graph kernel nodes that ran, from kernel activity records (tuples as
    :class:`gpuscope.cupti.activity.KernelRecord`): one row per (graph id, node id), in the order they first ran,
    with the kernel's symbol, the node's executions and their GPU time (of those with an end time). Kernels
    launched on their own (graph id 0) are left out.

    PC records carry no launch (continuous mode: ``correlationId`` 0) and no node, so this table is what ties a
    kernel's samples to graph nodes: all of them, where one node ran the kernel.
    """
    rows: dict[tuple[int, int], list] = {}
    for r in kernel_records:
        if not r[10]:
            continue
        row = rows.setdefault((int(r[10]), int(r[11])), [str(r[0]), 0, 0])
        row[1] += 1
        if r[2] > r[1] > 0:
            row[2] += int(r[2] - r[1])
    return {"symbol": [row[0] for row in rows.values()], "graph_id": [g for g, _ in rows],
            "node_id": [n for _, n in rows], "executions": [row[1] for row in rows.values()],
            "gpu_ns": [row[2] for row in rows.values()]}


def records_dataset(records, reason_indices, reason_names, source_map, *, device_info=None, chip="", attrs=None,
                    launches=None, nodes=None):
    """Build the PC-sampling Dataset from raw records (:class:`gpuscope.cupti.pc_sampling.PCRecords`).

    Parameters
    ----------
    records : PCRecords
        Rows of (cubin CRC, PC offset, function, stall-reason index, samples), possibly repeated per PC.
    reason_indices, reason_names : sequence
        CUPTI's stall-reason table (``cuptiPCSamplingGetStallReasons``).
    source_map : gpuscope._pc_sampling.source.SourceMap
        Maps PCs to file and line.
    launches : dict, optional
        Mangled name -> launch calls of the kernel in the block (a graph's kernel nodes are none); None where they
        were not counted.
    nodes : dict, optional
        The graph kernel nodes that ran in the block (:func:`graph_nodes`); None where that is unknown.

    Returns
    -------
    xarray.Dataset
        See :func:`gpuscope._results.build.pc_sampling_dataset`.
    """
    from gpuscope._results import build as _results

    base, column = _reason_table(list(reason_names))
    by_index = {int(i): column[n] for i, n in zip(reason_indices, reason_names) if n in column}
    keys: dict[tuple[int, str, int], int] = {}
    samples_rows: list[tuple[int, int, bool, int]] = []
    for crc, fn, off, idx, n in zip(records.cubin_crc, records.function, records.pc_offset,
                                    records.stall_reason_index, records.samples):
        if int(idx) in by_index:
            row = keys.setdefault((int(crc), str(fn), int(off)), len(keys))
            samples_rows.append((row, *by_index[int(idx)], int(n)))
    samples = np.zeros((len(keys), len(base)), dtype=np.int64)
    not_issued = np.zeros_like(samples)
    for row, col, is_not_issued, n in samples_rows:
        (not_issued if is_not_issued else samples)[row, col] += n
    pcs = pc_coords(keys, source_map)
    reasons = {
        "name": base,
        "cupti_name": [CUPTI_PREFIX + b for b in base],
        "category": [STALL_REASONS.get(b, ("other", ""))[0] for b in base],
        "description": [STALL_REASONS.get(b, ("other", "not described by gpuscope"))[1] for b in base],
    }
    totals = {
        "total_samples": sample_total(records, reason_indices, reason_names),
        "cupti_total_samples": records.total_samples,
        "dropped_samples": records.dropped_samples,
        "non_user_kernel_samples": records.non_user_kernel_samples,
        "hardware_buffer_full": int(records.hardware_buffer_full),
    }
    extra = {**(attrs or {}), **source_map_attrs(source_map)}
    return _results.pc_sampling_dataset(pcs, samples, not_issued, reasons, totals, device_info, chip, extra,
                                        launches=launches, nodes=nodes)
