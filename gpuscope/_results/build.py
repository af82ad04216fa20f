"""Build xarray Datasets from decoded CUPTI data, in the layout that :mod:`gpuscope._schema.dataset` defines.

Attrs hold only str, int, float and lists of them, so ``Dataset.to_netcdf`` round-trips them losslessly.
"""

from __future__ import annotations

import datetime

import numpy as np

from gpuscope._schema.dataset import (
    EXEC_TABLE,
    RANGE_COORDS,
    RESOURCE_COORDS,
    SAMPLE_RANGE_ATTRS,
    SAMPLE_SPAN_ATTRS,
    SCHEMA_VERSION,
    SHAPE_COORDS,
    SPAN_INDEX,
    SPAN_TABLE,
    UNKNOWN_GRAPH,
    index,
    innermost_span,
    table_attrs,
)
from gpuscope._schema.labels import string_labels
from gpuscope._schema.pc_kernels import GRAPH_NODE_COORDS, KERNEL_LAUNCH_COORDS

# ---------------------------------------------------------------------------------------------------------
# PM sampling: a time series
# ---------------------------------------------------------------------------------------------------------


def _pm_device_attrs(device_info, chip: str) -> dict:
    from gpuscope._gpu import device as _device
    from gpuscope._version import __version__
    from gpuscope.cupti import _api

    attrs = {
        "chip": chip,
        "gpuscope_version": __version__,
        "cupti_version": _api.library().version_string,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    attrs.update(rank_attrs())
    driver = _device.driver_version()
    if driver:
        attrs["driver_cuda_version"] = "%d.%d" % driver
    if device_info is not None:
        attrs.update(
            device_index=int(device_info.index),
            device_name=device_info.name,
            compute_capability=device_info.compute_capability_str,
            sm_count=int(device_info.sm_count),
            sm_clock_khz=int(device_info.sm_clock_khz),
            memory_clock_khz=int(device_info.memory_clock_khz),
            memory_bytes=int(device_info.memory_bytes),
        )
        attrs.update({k: int(v) for k, v in getattr(device_info, "sm_limits", {}).items()})
    return attrs


def rank_attrs(info=None) -> dict:
    """Attrs ``rank``, ``local_rank``, ``world_size``, ``host``, ``launcher`` of this process (or of *info*, a
    :class:`gpuscope._results.ranks.RankInfo`). Launcher variables that make no sense do not cost the profile: they give
    rank -1, launcher "unknown" and a warning."""
    import warnings

    from gpuscope._results import job as _job
    from gpuscope.errors import GpuscopeWarning, RankDetectionError

    if info is None:
        try:
            info = _job.rank_info()
        except RankDetectionError as e:
            warnings.warn(f"gpuscope could not tell this process's rank, so the Dataset records rank -1: {e}",
                          GpuscopeWarning, stacklevel=3)
            import socket

            info = _job.RankInfo(-1, -1, -1, -1, socket.gethostname(), "unknown")
    return info.attrs()


def with_rank(ds, info):
    """*ds* (a shallow copy) with the rank attrs of *info*: for engines that know the rank better than the
    environment of the process that built *ds* (a Dask worker, an MPI communicator)."""
    ds = ds.copy()
    ds.attrs.update(rank_attrs(info))
    return ds


def sampling_dataset(
    values,
    metrics,
    properties,
    start_ns,
    end_ns,
    ranges,
    spans,
    session_start_ns: int,
    device_info=None,
    chip: str = "",
    attrs: dict | None = None,
    executions: dict | None = None,
):
    """A PM sampling time series.

    Schema (version :data:`~gpuscope._schema.dataset.SCHEMA_VERSION`):

    * dim ``time`` (int64 ns from the session start to each sample's end, attrs units="ns"), one variable per
      metric along it (exact CUPTI name) with attrs ``units``, ``description``, ``metric_type``, ``hw_unit``;
      per-sample coords ``start_ns``/``end_ns`` (CUPTI timestamps of each sample, ns), ``range`` (path of the
      innermost user range open at the sample's midpoint, "" where none) and ``span_index`` (that range's row
      in the span table, -1 where none).
    * attrs: device and versions, ``kind="pm_sampling"``, ``gpuscope_schema``, ``metrics``,
      ``session_start_ns``, plus *attrs* (interval, trigger, lost samples, ...), then the span table, one entry
      per execution of a user range, one attr per column of :data:`~gpuscope._schema.dataset.SPAN_TABLE`
      (``span_path``, ``span_thread``, ``span_start_ns``, ``span_end_ns``: 1-D arrays;
      :func:`~gpuscope._schema.dataset.spans` gives it as a DataFrame), and with *executions* the execution
      table (:func:`with_executions`).

    Every variable lies along ``time``, so ``ds.to_dataframe()`` has one row per sample.

    Parameters
    ----------
    ranges : sequence of str or None
        Path of the innermost range per sample; None derives it from *spans* at each sample's midpoint.
    spans : sequence
        Objects with ``path``, ``thread``, ``start_ns`` and ``end_ns``.
    executions : dict, optional
        Kernel executions recorded while sampling (``gpuscope.sample(kernels=True)``), as
        :func:`with_executions` takes them.
    """
    import xarray as xr

    start_ns = np.asarray(start_ns, dtype=np.int64)
    end_ns = np.asarray(end_ns, dtype=np.int64)
    values = np.asarray(values, dtype=np.float64).reshape(len(metrics), start_ns.size)
    table = {
        "span_path": [str(s.path) for s in spans],
        "span_thread": [int(s.thread) for s in spans],
        "span_start_ns": [int(s.start_ns) for s in spans],
        "span_end_ns": [int(s.end_ns) for s in spans],
    }
    data_vars = {
        name: xr.DataArray(row, dims="time", attrs=dict(properties.get(name, {})))
        for name, row in zip(metrics, values)
    }
    coords = sample_coords(start_ns, end_ns, session_start_ns, table, ranges)
    all_attrs = {"kind": "pm_sampling", "gpuscope_schema": SCHEMA_VERSION, **_pm_device_attrs(device_info, chip)}
    all_attrs.update(metrics=list(metrics), session_start_ns=int(session_start_ns))
    all_attrs.update(attrs or {})
    all_attrs.update(table_attrs(SPAN_TABLE, table))
    ds = xr.Dataset(data_vars, coords=coords, attrs=all_attrs)
    return ds if executions is None else with_executions(ds, executions)


def sample_coords(start_ns, end_ns, session_start_ns: int, table: dict, ranges=None) -> dict:
    """The per-sample coordinates of a PM sampling Dataset (see :func:`sampling_dataset`): ``time``, ``start_ns``,
    ``end_ns``, ``range`` and ``span_index``, from the samples' CUPTI timestamps and the span table *table* (lists
    keyed by the names of :data:`~gpuscope._schema.dataset.SPAN_TABLE`); *ranges* None derives each sample's
    range path from the table."""
    import xarray as xr

    start_ns = np.asarray(start_ns, dtype=np.int64)
    end_ns = np.asarray(end_ns, dtype=np.int64)
    span = innermost_span((start_ns + end_ns) // 2, table["span_start_ns"], table["span_end_ns"])
    if ranges is None:
        ranges = np.array(list(table["span_path"]) + [""], dtype=object)[span]  # index -1 picks the ""
    return {
        "time": xr.DataArray(end_ns - np.int64(session_start_ns), dims="time", attrs={"units": "ns"}),
        "start_ns": xr.DataArray(start_ns, dims="time", attrs={"units": "ns", "clock": "cuptiGetTimestamp"}),
        "end_ns": xr.DataArray(end_ns, dims="time", attrs={"units": "ns", "clock": "cuptiGetTimestamp"}),
        "range": xr.DataArray(string_labels(ranges, missing="").reshape(start_ns.shape), dims="time",
                              attrs=SAMPLE_RANGE_ATTRS),
        SPAN_INDEX: xr.DataArray(span, dims="time", attrs=dict(SAMPLE_SPAN_ATTRS)),
    }


def with_executions(ds, executions: dict):
    """*ds* (PM samples) with the kernel executions recorded while sampling (``gpuscope.sample(kernels=True)``).

    *executions*: ``records`` (tuples as :class:`gpuscope.cupti.activity.KernelRecord`; a tuple that ends before
    its graph ids gives -1, unknown, there), ``dropped``, ``errors``, ``other_devices``. The records with an end
    time become the execution table, one attr per column of :data:`~gpuscope._schema.dataset.EXEC_TABLE`
    (``exec_kernel``, the name every Dataset of the process gives the kernel, ``exec_kernel_qualname``,
    ``exec_symbol``, ``exec_start_ns``, ``exec_end_ns``, ``exec_stream``, ``exec_correlation``,
    ``exec_graph_id``, ``exec_graph_node_id``: 1-D arrays;
    :func:`~gpuscope._schema.dataset.kernel_executions` gives it as a DataFrame). Attrs: ``kernel_records`` (1)
    and the counts ``kernel_records_dropped``, ``kernel_records_incomplete`` (no end time: still running when
    flushed), ``kernel_records_other_devices``, ``kernel_record_errors``, then the table's columns.
    """
    from gpuscope._schema.names import demangle, kernel_name

    complete = [r for r in executions["records"] if r[1] > 0 and r[2] >= r[1]]
    # symbol -> (its name in the process, its qualified name)
    names = {symbol: (kernel_name(symbol), demangle(symbol)) for symbol in dict.fromkeys(r[0] for r in complete)}
    columns = {
        "exec_kernel": [names[r[0]][0] for r in complete],
        "exec_kernel_qualname": [names[r[0]][1] for r in complete],
        "exec_symbol": [str(r[0]) for r in complete],
        "exec_start_ns": [int(r[1]) for r in complete],
        "exec_end_ns": [int(r[2]) for r in complete],
        "exec_stream": [int(r[5]) for r in complete],
        "exec_correlation": [int(r[9]) for r in complete],
        "exec_graph_id": [int(r[10]) if len(r) > 10 else UNKNOWN_GRAPH for r in complete],
        "exec_graph_node_id": [int(r[11]) if len(r) > 11 else UNKNOWN_GRAPH for r in complete],
    }
    return ds.assign_attrs({
        "kernel_records": 1,
        "kernel_records_dropped": int(executions.get("dropped", 0)),
        "kernel_records_incomplete": len(executions["records"]) - len(complete),
        "kernel_records_other_devices": int(executions.get("other_devices", 0)),
        "kernel_record_errors": "; ".join(executions.get("errors", [])[:10]),
        **table_attrs(EXEC_TABLE, columns),
    })


# ---------------------------------------------------------------------------------------------------------
# PC sampling: samples by PC and stall reason
# ---------------------------------------------------------------------------------------------------------


def pc_sampling_dataset(pcs: dict, samples, samples_not_issued, reasons: dict, totals: dict, device_info=None,
                        chip: str = "", attrs: dict | None = None, launches: dict | None = None,
                        nodes: dict | None = None):
    """PC samples by program counter and warp state, with per-kernel totals.

    Schema: dims ``pc``, ``stall_reason`` and ``kernel``.

    * ``samples`` (pc, stall_reason): samples that found a warp at that PC in that state;
      ``samples_not_issued`` (pc, stall_reason): the subset in which its scheduler issued nothing (latency
      samples). ``kernel_samples`` (kernel, stall_reason): ``samples`` summed per kernel.
    * pc coords: ``function`` (the kernel's name, as ``kernel`` and every Dataset of the process name it:
      :func:`gpuscope._schema.names.kernel_names`), ``mangled_name``, ``pc_offset`` (bytes from the function
      start), ``cubin_crc`` (hex string), ``file`` ("" when unknown), ``line`` (0 when unknown), ``line_text``.
    * stall_reason coords (the dim holds CUPTI's name without ``smsp__pcsamp_warps_issue_stalled_``):
      ``cupti_name``, ``description``, ``category`` (Top-Down node: frontend_fetch, frontend_decode,
      backend_core, backend_memory; ``issued`` for selected/not_selected; ``other``).
    * kernel coords: ``kernel_qualname`` (the qualified name: ``module.function``, ``ns::kernel<float>``),
      ``kernel_mangled_name``, and from *launches* and *nodes* the coords of
      :data:`~gpuscope._schema.pc_kernels.KERNEL_LAUNCH_COORDS` (``kernel_launches``, ``kernel_graph_nodes``,
      ``kernel_graph_id``, ``kernel_graph_node_id``).
    * dim ``graph_node`` where *nodes* has a row (the CUDA graph kernel nodes that ran in the block, from
      :func:`gpuscope._pc_sampling.records.graph_nodes`): coords ``node_kernel`` (as ``kernel`` names it) and
      :data:`~gpuscope._schema.pc_kernels.GRAPH_NODE_COORDS` (``node_graph_id``, ``node_id``: CUPTI's ids,
      ``node_executions``, ``node_gpu_ns``).
    * attrs: device and versions, ``kind="pc_sampling"``, ``total_samples`` (delivered + dropped + non-user:
      every sample accounted for), ``cupti_total_samples`` (CUPTI's own counter, an undercount on CUPTI 13.0),
      ``dropped_samples``, ``non_user_kernel_samples`` (samples CUPTI could not attribute to a kernel: no
      records), ``hardware_buffer_full`` (0/1), plus *attrs* (period, collection mode).
    """
    import xarray as xr

    from gpuscope._schema.names import demangle

    n_reasons = len(reasons["name"])
    samples = np.asarray(samples, dtype=np.int64).reshape(-1, n_reasons)
    samples_not_issued = np.asarray(samples_not_issued, dtype=np.int64).reshape(-1, n_reasons)
    pc_coords = {
        "function": ("pc", np.asarray(pcs["function"], dtype=str)),
        "mangled_name": ("pc", np.asarray(pcs["mangled_name"], dtype=str)),
        "pc_offset": ("pc", np.asarray(pcs["pc_offset"], dtype=np.int64), {"units": "byte"}),
        "cubin_crc": ("pc", np.asarray(["%#018x" % int(c) for c in pcs["cubin_crc"]], dtype=str)),
        "file": ("pc", np.asarray(pcs["file"], dtype=str)),
        "line": ("pc", np.asarray(pcs["line"], dtype=np.int64)),
        "line_text": ("pc", np.asarray(pcs["line_text"], dtype=str)),
    }
    reason_coords = {
        "stall_reason": ("stall_reason", np.asarray(reasons["name"], dtype=str)),
        "cupti_name": ("stall_reason", np.asarray(reasons["cupti_name"], dtype=str)),
        "description": ("stall_reason", np.asarray(reasons["description"], dtype=str)),
        "category": ("stall_reason", np.asarray(reasons["category"], dtype=str)),
    }
    kernels, kernel_of_pc = np.unique(pc_coords["function"][1], return_inverse=True)
    mangled = {}
    for f, m in zip(pc_coords["function"][1], pc_coords["mangled_name"][1]):
        mangled.setdefault(f, m)
    per_kernel = np.zeros((kernels.size, n_reasons), dtype=np.int64)
    np.add.at(per_kernel, kernel_of_pc, samples)
    data_vars = {
        "samples": xr.DataArray(samples, dims=("pc", "stall_reason"),
                                attrs={"units": "samples", "description": "PC samples per warp state"}),
        "samples_not_issued": xr.DataArray(
            samples_not_issued, dims=("pc", "stall_reason"),
            attrs={"units": "samples", "description": "samples in which the warp's scheduler issued nothing"}),
        "kernel_samples": xr.DataArray(per_kernel, dims=("kernel", "stall_reason"),
                                       attrs={"units": "samples", "description": "samples per kernel"}),
    }
    coords = {**pc_coords, **reason_coords, "kernel": ("kernel", kernels.astype(str)),
              "kernel_qualname": ("kernel", np.asarray([demangle(mangled[k]) for k in kernels], dtype=str)),
              "kernel_mangled_name": ("kernel", np.asarray([mangled[k] for k in kernels], dtype=str)),
              **_kernel_launch_coords(kernels.astype(str).tolist(), launches, nodes)}
    all_attrs = {"kind": "pc_sampling", **_pm_device_attrs(device_info, chip)}
    all_attrs.update({k: int(v) for k, v in totals.items()})
    all_attrs.update(attrs or {})
    return xr.Dataset(data_vars, coords=coords, attrs=all_attrs)


def _kernel_launch_coords(kernels: list[str], launches: dict | None, nodes: dict | None) -> dict:
    """The coords of :data:`~gpuscope._schema.pc_kernels.KERNEL_LAUNCH_COORDS` for *kernels* (their names in the
    process), and the ``graph_node`` table where *nodes* has rows (see :func:`pc_sampling_dataset`). Launches and
    nodes, keyed by symbol, meet the kernels by name, as every Dataset of the process names them."""
    from gpuscope._schema.names import kernel_name

    counts: dict[str, int] = {}
    for symbol, n in (launches or {}).items():
        counts[kernel_name(symbol)] = counts.get(kernel_name(symbol), 0) + int(n)
    count = [UNKNOWN_GRAPH if launches is None else counts.get(k, 0) for k in kernels]
    if nodes is None:
        unknown = [UNKNOWN_GRAPH] * len(kernels)
        per_kernel = {"kernel_graph_nodes": unknown, "kernel_graph_id": unknown, "kernel_graph_node_id": unknown}
    else:
        rows: dict[str, list[int]] = {}
        for i, symbol in enumerate(nodes["symbol"]):
            rows.setdefault(kernel_name(symbol), []).append(i)
        mine = [rows.get(k, []) for k in kernels]
        graphs = [{nodes["graph_id"][i] for i in m} for m in mine]
        per_kernel = {
            "kernel_graph_nodes": [len(m) for m in mine],
            "kernel_graph_id": [0 if not g else next(iter(g)) if len(g) == 1 else UNKNOWN_GRAPH for g in graphs],
            "kernel_graph_node_id": [0 if not m else nodes["node_id"][m[0]] if len(m) == 1 else UNKNOWN_GRAPH
                                     for m in mine],
        }
    coords = {name: ("kernel", np.asarray(values, dtype=np.int64), {"description": KERNEL_LAUNCH_COORDS[name]})
              for name, values in {"kernel_launches": count, **per_kernel}.items()}
    if nodes is not None and nodes["symbol"]:
        coords["node_kernel"] = ("graph_node", np.asarray([kernel_name(s) for s in nodes["symbol"]], dtype=str),
                                 {"description": "the kernel the node ran, as the kernel dim names it"})
        for name, (key, attrs) in GRAPH_NODE_COORDS.items():
            coords[name] = ("graph_node", np.asarray(nodes[key], dtype=np.int64), dict(attrs))
    return coords


# ---------------------------------------------------------------------------------------------------------
# Range profiling: one row per user range or kernel launch
# ---------------------------------------------------------------------------------------------------------


_RECORD_KEYS = {"values", "grid", "block"}


def _extra_coord(key: str, column: list):
    """dtype, fill and values of a coordinate for a record key gpuscope does not know (e.g. from a newer
    session): scalars only, missing entries filled by type."""
    present = [v for v in column if v is not None]
    if not all(np.ndim(v) == 0 for v in present):
        raise ValueError(f"range record key {key!r} holds a non-scalar value; range coords are one scalar per range")
    if all(isinstance(v, (bool, np.bool_)) for v in present):
        dtype, fill = bool, False
    elif all(isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) for v in present):
        dtype, fill = np.int64, -1
    elif all(isinstance(v, (int, float, np.integer, np.floating)) for v in present):
        dtype, fill = np.float64, np.nan
    else:
        dtype, fill = str, ""
    return np.array([fill if v is None else v for v in column], dtype=dtype)


def range_dataset(records, metrics, properties, device_info=None, chip: str = "", attrs: dict | None = None,
                  device_attrs: dict | None = None):
    """Range-profiler results.

    Schema: dim ``range`` (one row per profiled range: a user range, or one kernel launch), so
    ``ds.to_dataframe()`` has one row per range; one variable per metric (exact CUPTI name, float64) with attrs
    ``units``, ``description``, ``metric_type``, ``hw_unit``; one scalar coord per range for each of
    :data:`RANGE_COORDS`, :data:`SHAPE_COORDS` (``grid_x`` ... ``block_z``), :data:`RESOURCE_COORDS`
    (``registers_per_thread``, ``shared_memory_static``, ``shared_memory_dynamic``: -1 where a record does not
    give them) and any other scalar key the records carry. The ``range`` dimension coordinate is the row number
    (0, 1, ..., unique; :func:`index`), so Datasets computed from these (:func:`gpuscope.topdown`) align and merge
    with them; select by path or kernel through the coordinates (``ds.isel(range=ds.kernel.isin(["fma",
    "stream"]))``). Attrs: device and versions, ``kind="range"``, ``metrics``, plus *attrs* (metric set, mode,
    passes, ...).

    Parameters
    ----------
    records : sequence of dict
        One per range: ``values`` (one float per metric), any of the coord names, ``grid`` and ``block``
        (3-tuples or None), and any further scalar keys (stored as coords of the same name).
    metrics : sequence of str
        The metric names, in the order of each record's ``values``.
    properties : dict
        metric name -> attrs dict.
    device_attrs : dict, optional
        The device's, CUPTI's and gpuscope's attrs as made where the session ran (default: made here, from
        *device_info* and *chip*; ``gpuscope run``'s results process gets them from the run).
    """
    import xarray as xr

    records = list(records)
    metrics = list(metrics)
    n = len(records)
    values = np.array([r["values"] for r in records], dtype=np.float64).reshape(n, len(metrics))
    coords = {}
    for name, (dtype, fill, cattrs) in RANGE_COORDS.items():
        column = [r.get(name, fill) for r in records]
        coords[name] = xr.DataArray(np.array(column, dtype=dtype).reshape(n), dims="range", attrs=cattrs)
    for what in ("grid", "block"):
        shape = np.array([tuple(r.get(what) or (0, 0, 0)) for r in records], dtype=np.int64).reshape(n, 3)
        for i, axis in enumerate("xyz"):
            name = f"{what}_{axis}"
            coords[name] = xr.DataArray(shape[:, i], dims="range", attrs=SHAPE_COORDS[name][2])
    for name, (dtype, fill, cattrs) in RESOURCE_COORDS.items():
        column = [fill if r.get(name) is None else r[name] for r in records]
        coords[name] = xr.DataArray(np.array(column, dtype=dtype).reshape(n), dims="range", attrs=dict(cattrs))
    extra = sorted({k for r in records for k in r} - _RECORD_KEYS - set(coords))
    for key in extra:
        coords[key] = xr.DataArray(_extra_coord(key, [r.get(key) for r in records]), dims="range")
    data_vars = {
        m: xr.DataArray(values[:, i], dims="range", attrs=dict(properties.get(m, {}))) for i, m in enumerate(metrics)
    }
    device = _pm_device_attrs(device_info, chip) if device_attrs is None else device_attrs
    all_attrs = {"kind": "range", "gpuscope_schema": SCHEMA_VERSION, **device}
    all_attrs.update(metrics=metrics)
    all_attrs.update(attrs or {})
    return index(xr.Dataset(data_vars, coords=coords, attrs=all_attrs))


# ---------------------------------------------------------------------------------------------------------
# Indexes, conversion of older files, long format
# ---------------------------------------------------------------------------------------------------------


