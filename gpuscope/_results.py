"""Build xarray Datasets from decoded CUPTI data: the only module that knows the Dataset schema.

Attrs hold only str, int, float and lists of them, so ``Dataset.to_netcdf`` round-trips them losslessly.
"""

from __future__ import annotations

import datetime

import numpy as np

from ._labels import string_labels

# ---------------------------------------------------------------------------------------------------------
# PM sampling: a time series
# ---------------------------------------------------------------------------------------------------------


def _pm_device_attrs(device_info, chip: str) -> dict:
    from . import _device
    from ._version import __version__
    from .cupti import _api

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
    return attrs


def rank_attrs(info=None) -> dict:
    """Attrs ``rank``, ``local_rank``, ``world_size``, ``host``, ``launcher`` of this process (or of *info*, a
    :class:`gpuscope._ranks.RankInfo`). Launcher variables that make no sense do not cost the profile: they give
    rank -1, launcher "unknown" and a warning."""
    import warnings

    from . import _ranks
    from .errors import GpuscopeWarning, RankDetectionError

    if info is None:
        try:
            info = _ranks.rank_info()
        except RankDetectionError as e:
            warnings.warn(f"gpuscope could not tell this process's rank, so the Dataset records rank -1: {e}",
                          GpuscopeWarning, stacklevel=3)
            import socket

            info = _ranks.RankInfo(-1, -1, -1, -1, socket.gethostname(), "unknown")
    return info.attrs()


def with_rank(ds, info):
    """*ds* (a shallow copy) with the rank attrs of *info*: for engines that know the rank better than the
    environment of the process that built *ds* (a Dask worker, an MPI communicator)."""
    ds = ds.copy()
    ds.attrs.update(rank_attrs(info))
    return ds


#: Attrs of a PM sampling dataset that hold the user-range table, one list entry per range ("span").
SPAN_ATTRS = ("span_path", "span_thread", "span_start_ns", "span_end_ns")

#: Version of the Dataset layout, stored in ``attrs["gpuscope_schema"]``. Files without it (version 1) hold
#: grid/block along an ``xyz`` dim and user ranges along a ``span`` dim; :func:`upgrade` converts them.
SCHEMA_VERSION = 2


def innermost_span(times_ns, starts_ns, ends_ns) -> np.ndarray:
    """For each time, the index of the innermost span open then (-1 where none).

    "Innermost" is the most recently entered span still open (with spans on several threads, the latest push of
    any thread). At equal times a span that ends is closed before one that starts is opened, and a time sees
    the events at that time. The loop runs over spans, not times, so millions of samples cost one
    ``searchsorted``.
    """
    times_ns = np.asarray(times_ns, dtype=np.int64)
    starts_ns = np.asarray(starts_ns, dtype=np.int64)
    ends_ns = np.asarray(ends_ns, dtype=np.int64)
    n = starts_ns.size
    if n == 0:
        return np.full(times_ns.shape, -1, dtype=np.int64)
    # events sorted by (time, pop before push, span)
    when = np.concatenate([starts_ns, ends_ns])
    is_push = np.concatenate([np.ones(n, dtype=np.int64), np.zeros(n, dtype=np.int64)])
    which = np.concatenate([np.arange(n), np.arange(n)])
    order = np.lexsort((which, is_push, when))
    state = np.full(2 * n + 1, -1, dtype=np.int64)  # innermost span after the first k events
    open_spans: dict[int, None] = {}  # insertion-ordered: the last key is the innermost
    for k, e in enumerate(order, start=1):
        if is_push[e]:
            open_spans[int(which[e])] = None
        else:
            open_spans.pop(int(which[e]), None)
        state[k] = next(reversed(open_spans)) if open_spans else -1
    return state[np.searchsorted(when[order], times_ns, side="right")]


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

    Schema: one dim, ``time`` (int64 ns from the session start to each sample's end, attrs units="ns"), so
    ``ds.to_dataframe()`` has one row per sample. Coords ``start_ns``/``end_ns`` (CUPTI timestamps of each
    sample, ns), ``range`` (path of the innermost user range open at the sample's midpoint, "" where none) and
    ``span`` (index of that range in the span table, -1 where none); one variable per metric (exact CUPTI
    name) with attrs ``units``, ``description``, ``metric_type``, ``hw_unit``. The user ranges themselves (the
    span table: one entry per execution of a range) are lists in the attrs :data:`SPAN_ATTRS`: ``span_path``,
    ``span_thread``, ``span_start_ns``, ``span_end_ns`` (CUPTI timestamps); :func:`spans` gives them as a
    table. Attrs: device and versions, ``kind="pm_sampling"``, ``metrics``, ``session_start_ns``, plus *attrs*
    (interval, trigger, lost samples, ...).

    Parameters
    ----------
    ranges : sequence of str or None
        Path of the innermost range per sample; None derives it from *spans* at each sample's midpoint.
    spans : sequence
        Objects with ``path``, ``thread``, ``start_ns`` and ``end_ns``.
    executions : dict, optional
        Kernel executions recorded while sampling (``gpuscope.sample(kernels=True)``): ``records`` (tuples as
        :class:`gpuscope.cupti.activity.KernelRecord`), ``dropped``, ``errors``, ``other_devices``. They become the
        execution table, lists in the attrs :data:`EXEC_ATTRS` (:func:`kernel_executions` gives it as a table),
        and the counts ``kernel_records_dropped``, ``kernel_records_incomplete`` (no end time: still running when
        flushed), ``kernel_records_other_devices``, ``kernel_record_errors``.
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
    all_attrs.update(metrics=list(metrics), session_start_ns=int(session_start_ns), **table)
    all_attrs.update(attrs or {})
    if executions is not None:
        all_attrs.update(_execution_attrs(executions))
    return xr.Dataset(data_vars, coords=coords, attrs=all_attrs)


def sample_coords(start_ns, end_ns, session_start_ns: int, table: dict, ranges=None) -> dict:
    """The per-sample coordinates of a PM sampling Dataset (see :func:`sampling_dataset`): ``time``, ``start_ns``,
    ``end_ns``, ``range`` and ``span``, from the samples' CUPTI timestamps and the span table *table* (lists
    keyed by :data:`SPAN_ATTRS`); *ranges* None derives each sample's range path from the table."""
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
                              attrs=_SAMPLE_RANGE_ATTRS),
        "span": xr.DataArray(span, dims="time", attrs=_SAMPLE_SPAN_ATTRS),
    }


#: The execution table of a PM sampling Dataset recorded with ``kernels=True``: one entry per kernel execution.
EXEC_ATTRS = ("exec_kernel", "exec_symbol", "exec_start_ns", "exec_end_ns", "exec_stream", "exec_correlation")


def _execution_attrs(executions: dict) -> dict:
    from ._names import demangle

    complete = [r for r in executions["records"] if r[1] > 0 and r[2] >= r[1]]
    names: dict[str, str] = {}
    return {
        "kernel_records": 1,
        "exec_kernel": [names.setdefault(r[0], demangle(r[0])) for r in complete],
        "exec_symbol": [str(r[0]) for r in complete],
        "exec_start_ns": [int(r[1]) for r in complete],
        "exec_end_ns": [int(r[2]) for r in complete],
        "exec_stream": [int(r[5]) for r in complete],
        "exec_correlation": [int(r[9]) for r in complete],
        "kernel_records_dropped": int(executions.get("dropped", 0)),
        "kernel_records_incomplete": len(executions["records"]) - len(complete),
        "kernel_records_other_devices": int(executions.get("other_devices", 0)),
        "kernel_record_errors": "; ".join(executions.get("errors", [])[:10]),
    }


def kernel_executions(ds):
    """The kernels that ran on the GPU during a PM sampling session (``gpuscope.sample(kernels=True)``), one row
    per execution, with GPU start and end times on the samples' clock.

    Parameters
    ----------
    ds : xarray.Dataset
        A PM sampling Dataset recorded with ``kernels=True`` (or the phases Dataset computed from one).

    Returns
    -------
    pandas.DataFrame
        Index ``execution``; columns ``kernel`` (readable name, as the ``kernel`` coordinate of range results),
        ``symbol`` (as the driver has it), ``start_ns``, ``end_ns`` (CUPTI timestamps), ``start``/``end`` (ns
        from the session start, on the scale of the ``time`` coordinate), ``duration_ns``, ``stream`` and
        ``correlation`` (CUPTI's id of the launch call). Sorted by start.

    Raises
    ------
    ValueError
        *ds* is not a PM sampling Dataset, or was recorded without ``kernels=True``.

    Examples
    --------
    >>> with gpuscope.sample(kernels=True) as s:                # doctest: +SKIP
    ...     run()
    >>> gpuscope.kernel_executions(s.dataset).groupby("kernel").duration_ns.sum()   # doctest: +SKIP
    """
    import pandas as pd

    if not hasattr(ds, "attrs") or ds.attrs.get("kind") != "pm_sampling":
        raise ValueError("kernel_executions() reads a PM sampling Dataset (from gpuscope.sample); this is not one.")
    if "exec_start_ns" not in ds.attrs:
        raise ValueError("This PM sampling Dataset has no kernel executions: record it with "
                         "gpuscope.sample(..., kernels=True) (or gpuscope run --sample SET --kernel-times).")
    t0 = int(ds.attrs["session_start_ns"])
    table = pd.DataFrame({
        "kernel": pd.Series(_as_list(ds.attrs["exec_kernel"]), dtype=str),
        "symbol": pd.Series(_as_list(ds.attrs["exec_symbol"]), dtype=str),
        "start_ns": pd.Series(_as_list(ds.attrs["exec_start_ns"]), dtype=np.int64),
        "end_ns": pd.Series(_as_list(ds.attrs["exec_end_ns"]), dtype=np.int64),
        "stream": pd.Series(_as_list(ds.attrs["exec_stream"]), dtype=np.int64),
        "correlation": pd.Series(_as_list(ds.attrs["exec_correlation"]), dtype=np.int64),
    })
    table["start"] = table["start_ns"] - t0
    table["end"] = table["end_ns"] - t0
    table["duration_ns"] = table["end_ns"] - table["start_ns"]
    table = table.sort_values("start_ns", kind="stable").reset_index(drop=True)
    table.index.name = "execution"
    return table[["kernel", "symbol", "start_ns", "end_ns", "start", "end", "duration_ns", "stream", "correlation"]]


_SAMPLE_RANGE_ATTRS = {"description": "innermost user range open at the sample's midpoint, '' where none"}
_SAMPLE_SPAN_ATTRS = {"description": "index of that range execution in the attrs span_*, -1 where none"}


def spans(ds):
    """The user ranges recorded during a PM sampling session, one row per execution of a range.

    Parameters
    ----------
    ds : xarray.Dataset
        A PM sampling Dataset (from :func:`gpuscope.sample` or :func:`gpuscope.open_dataset`).

    Returns
    -------
    pandas.DataFrame
        Index ``span`` (the number the samples' ``span`` coordinate refers to); columns ``path``, ``thread``,
        ``start_ns``, ``end_ns`` (CUPTI timestamps) and ``start``/``end`` (ns from the session start, on the
        scale of the ``time`` coordinate).

    Raises
    ------
    ValueError
        *ds* is not a PM sampling Dataset.

    Examples
    --------
    >>> ts = gpuscope.open_dataset("series.nc")                 # doctest: +SKIP
    >>> gpuscope.spans(ts).groupby("path").size()              # doctest: +SKIP
    """
    import pandas as pd

    if not hasattr(ds, "attrs") or ds.attrs.get("kind") != "pm_sampling":
        raise ValueError("spans() reads the user ranges of a PM sampling Dataset (from gpuscope.sample); "
                         "this is not one.")
    if "span" in ds.dims:  # a Dataset of schema version 1 that was not read through gpuscope.open_dataset
        ds = upgrade(ds)
    t0 = int(ds.attrs["session_start_ns"])
    table = pd.DataFrame({
        "path": pd.Series(_as_list(ds.attrs.get("span_path", [])), dtype=str),
        "thread": pd.Series(_as_list(ds.attrs.get("span_thread", [])), dtype=np.int64),
        "start_ns": pd.Series(_as_list(ds.attrs.get("span_start_ns", [])), dtype=np.int64),
        "end_ns": pd.Series(_as_list(ds.attrs.get("span_end_ns", [])), dtype=np.int64),
    })
    table["start"] = table["start_ns"] - t0
    table["end"] = table["end_ns"] - t0
    table.index.name = "span"
    return table


def _as_list(value) -> list:
    """An attr that should be a list: netCDF readers return one-element lists as scalars."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return list(value)
    if isinstance(value, str) and value == "":
        return []
    return [value.item() if isinstance(value, np.generic) else value]


# ---------------------------------------------------------------------------------------------------------
# PC sampling: samples by PC and stall reason
# ---------------------------------------------------------------------------------------------------------


def pc_sampling_dataset(pcs: dict, samples, samples_not_issued, reasons: dict, totals: dict, device_info=None,
                        chip: str = "", attrs: dict | None = None):
    """PC samples by program counter and warp state, with per-kernel totals.

    Schema: dims ``pc``, ``stall_reason`` and ``kernel``.

    * ``samples`` (pc, stall_reason): samples that found a warp at that PC in that state;
      ``samples_not_issued`` (pc, stall_reason): the subset in which its scheduler issued nothing (latency
      samples). ``kernel_samples`` (kernel, stall_reason): ``samples`` summed per kernel.
    * pc coords: ``function`` (as the user wrote it), ``mangled_name``, ``pc_offset`` (bytes from the function
      start), ``cubin_crc`` (hex string), ``file`` ("" when unknown), ``line`` (0 when unknown), ``line_text``.
    * stall_reason coords (the dim holds CUPTI's name without ``smsp__pcsamp_warps_issue_stalled_``):
      ``cupti_name``, ``description``, ``category`` (Top-Down node: frontend_fetch, frontend_decode,
      backend_core, backend_memory; ``issued`` for selected/not_selected; ``other``).
    * kernel coords: ``kernel_mangled_name``.
    * attrs: device and versions, ``kind="pc_sampling"``, ``total_samples`` (delivered + dropped + non-user:
      every sample accounted for), ``cupti_total_samples`` (CUPTI's own counter, an undercount on CUPTI 13.0),
      ``dropped_samples``, ``non_user_kernel_samples`` (samples CUPTI could not attribute to a kernel: no
      records), ``hardware_buffer_full`` (0/1), plus *attrs* (period, collection mode).
    """
    import xarray as xr

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
              "kernel_mangled_name": ("kernel", np.asarray([mangled[k] for k in kernels], dtype=str))}
    all_attrs = {"kind": "pc_sampling", **_pm_device_attrs(device_info, chip)}
    all_attrs.update({k: int(v) for k, v in totals.items()})
    all_attrs.update(attrs or {})
    return xr.Dataset(data_vars, coords=coords, attrs=all_attrs)


# ---------------------------------------------------------------------------------------------------------
# Range profiling: one row per user range or kernel launch
# ---------------------------------------------------------------------------------------------------------

#: Coordinates of a range dataset: name -> (dtype, fill value for "unknown", attrs).
RANGE_COORDS = {
    "name": (str, "", {"description": "range path, levels joined by '/'"}),
    "depth": (np.int64, 0, {"description": "nesting depth, 1 for a top-level range"}),
    "parent": (str, "", {"description": "path of the enclosing range, '' at top level"}),
    "kernel": (str, "", {"description": "kernel name of an auto range or decorated launch, '' otherwise"}),
    "symbol": (str, "", {"description": "the kernel's symbol as the driver reports it (kernel and iteration modes)"}),
    "launch": (np.int64, -1, {"description": "the launch's ID: kernel replay, which launch of the session on its "
                                             "device it was, from 0, counting launches the filters left out; "
                                             "iteration replay, its position in the iteration; user mode, the "
                                             "decorated launch's index; -1 for user ranges or where unknown"}),
    "start_ns": (np.int64, -1, {"units": "ns", "clock": "cuptiGetTimestamp"}),
    "end_ns": (np.int64, -1, {"units": "ns", "clock": "cuptiGetTimestamp"}),
    "pass_group": (np.int64, 0, {"description": "which group of passes (replays or loop iterations) gave the values"}),
    "first_iteration": (np.int64, -1, {"description": "first execution of this path that fed the pass group"}),
    "iterations": (np.int64, 1, {"description": "executions of this path (one per pass) that fed the pass group"}),
}


#: Launch shape coords: ``grid_x`` ... ``block_z`` (0 where unknown, e.g. for user ranges).
SHAPE_COORDS = {
    f"{what}_{axis}": (np.int64, 0, {"description": f"launch {what} size along {axis}, 0 for user ranges"})
    for what in ("grid", "block")
    for axis in "xyz"
}

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


def range_dataset(records, metrics, properties, device_info=None, chip: str = "", attrs: dict | None = None):
    """Range-profiler results.

    Schema: dim ``range`` (one row per profiled range: a user range, or one kernel launch), so
    ``ds.to_dataframe()`` has one row per range; one variable per metric (exact CUPTI name, float64) with attrs
    ``units``, ``description``, ``metric_type``, ``hw_unit``; one scalar coord per range for each of
    :data:`RANGE_COORDS`, :data:`SHAPE_COORDS` (``grid_x`` ... ``block_z``) and any other scalar key the
    records carry. The ``range`` dimension coordinate repeats ``name`` as an index: ``ds.sel(range="step/fwd")``
    returns every row of that path (several for a kernel launched several times), and ``ds.to_dataframe()`` is
    indexed by path like a pandas table (the other coords, ``name`` and ``kernel`` included, are columns). Attrs: device and versions, ``kind="range"``, ``metrics``, plus
    *attrs* (metric set, mode, passes, ...).

    Parameters
    ----------
    records : sequence of dict
        One per range: ``values`` (one float per metric), any of the coord names, ``grid`` and ``block``
        (3-tuples or None), and any further scalar keys (stored as coords of the same name).
    metrics : sequence of str
        The metric names, in the order of each record's ``values``.
    properties : dict
        metric name -> attrs dict.
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
    extra = sorted({k for r in records for k in r} - _RECORD_KEYS - set(coords))
    for key in extra:
        coords[key] = xr.DataArray(_extra_coord(key, [r.get(key) for r in records]), dims="range")
    data_vars = {
        m: xr.DataArray(values[:, i], dims="range", attrs=dict(properties.get(m, {}))) for i, m in enumerate(metrics)
    }
    all_attrs = {"kind": "range", "gpuscope_schema": SCHEMA_VERSION, **_pm_device_attrs(device_info, chip)}
    all_attrs.update(metrics=metrics)
    all_attrs.update(attrs or {})
    return index(xr.Dataset(data_vars, coords=coords, attrs=all_attrs))


# ---------------------------------------------------------------------------------------------------------
# Indexes, conversion of older files, long format
# ---------------------------------------------------------------------------------------------------------


def index(ds):
    """*ds* with the index its schema promises: range results get the ``range`` dimension coordinate (the
    ``name`` of each row; non-unique). Other datasets, and range results that have it, are returned as they are.
    """
    if "range" in ds.dims and "range" not in ds.coords and "name" in ds.coords and ds["name"].dims == ("range",):
        ds = ds.assign_coords(range=("range", ds["name"].values, _RANGE_INDEX_ATTRS))
    return ds


_RANGE_INDEX_ATTRS = {"description": "range path (the name coordinate) as an index: sel(range=path) gives every "
                                     "row of that path"}


def upgrade(ds):
    """Convert a Dataset of an older gpuscope schema to the current one; a current one is returned as is.

    Version 1 (gpuscope 0.1 files, e.g. the shipped ``gpuscope/data/*.nc``) held ``grid``/``block`` as
    (range, xyz) coords and the user ranges as variables along a ``span`` dim, so ``to_dataframe()`` crossed
    every row with every ``xyz`` or span. The conversion is exact: the values move, none is recomputed except
    each sample's ``span`` index, which is derived as :func:`sampling_dataset` derives it. Metric units written by
    an older gpuscope (``byte/second/second``, ``instruction/gpc_cycle/cycle``) are corrected with
    :func:`gpuscope._catalog.units_of`.
    """
    if "xyz" in ds.dims:
        ds = ds.assign_coords({
            f"{what}_{axis}": ("range", ds[what].sel(xyz=axis).values.astype(np.int64), SHAPE_COORDS[f"{what}_{axis}"][2])
            for what in ("grid", "block") if what in ds.variables
            for axis in "xyz"
        }).drop_vars([v for v in ("grid", "block", "xyz") if v in ds.variables])
    if "span" in ds.dims:
        table = {name: ds[name].values.tolist() for name in SPAN_ATTRS if name in ds.variables}
        ds = ds.drop_vars([v for v in ds.variables if ds[v].dims == ("span",)])
        ds.attrs.update({name: table.get(name, []) for name in SPAN_ATTRS})
        if "time" in ds.dims and "start_ns" in ds.coords:
            mid = (ds["start_ns"].values.astype(np.int64) + ds["end_ns"].values.astype(np.int64)) // 2
            span = innermost_span(mid, ds.attrs["span_start_ns"], ds.attrs["span_end_ns"])
            ds = ds.assign_coords(span=("time", span, _SAMPLE_SPAN_ATTRS))
    if ds.attrs.get("kind") == "pm_sampling":
        for name in SPAN_ATTRS:
            ds.attrs[name] = _as_list(ds.attrs.get(name, []))
    from ._catalog import split_name, units_of

    for name, variable in ds.data_vars.items():  # written before units_of was fixed: byte/second/second
        units = variable.attrs.get("units")
        if ("metric_type" in variable.attrs and isinstance(units, str) and "/" in units
                and units != units_of(split_name(str(name))[1], units)):
            variable.attrs["units"] = units_of(split_name(str(name))[1], units)
    if ds.attrs.get("kind") in ("range", "pm_sampling") and "gpuscope_schema" not in ds.attrs:
        ds.attrs = {"kind": ds.attrs["kind"], "gpuscope_schema": SCHEMA_VERSION,
                    **{k: v for k, v in ds.attrs.items() if k != "kind"}}
    return index(ds)


def to_dataframe(ds, metrics=None):
    """A gpuscope Dataset in long format: one row per observation of one metric.

    ``ds.to_dataframe()`` gives the wide format (one row per range or sample, one column per metric); this
    gives the tidy one that seaborn and ``groupby`` like.

    Parameters
    ----------
    ds : xarray.Dataset
        Any gpuscope Dataset: range results, a PM time series, a Top-Down or phases result, PC samples.
    metrics : str or sequence of str, optional
        The data variables to include (default: every numeric data variable).

    Returns
    -------
    pandas.DataFrame
        Columns: the dimension(s) of each observation (``range``, ``time``, ...), every coordinate along them
        (``name``, ``kernel``, ``launch``, ``start_ns``, ...), then ``metric`` (the variable's name),
        ``value`` and ``unit`` (its ``units`` attr, "" where it has none). Variables with different dimensions
        are stacked one after the other; a coordinate that a block does not have is missing (NaN) there.

    Raises
    ------
    ValueError
        *ds* is not a Dataset, or a requested metric is not a numeric data variable of it.

    Examples
    --------
    >>> launches = gpuscope.open_dataset("launches.nc")                       # doctest: +SKIP
    >>> long = gpuscope.to_dataframe(launches)                                # doctest: +SKIP
    >>> long.groupby(["kernel", "metric"])["value"].median()                  # doctest: +SKIP
    """
    import pandas as pd
    import xarray as xr

    if not isinstance(ds, xr.Dataset):
        raise ValueError(f"to_dataframe takes an xarray.Dataset, got {type(ds).__name__}")
    numeric = [v for v in ds.data_vars if np.issubdtype(ds[v].dtype, np.number) or ds[v].dtype == bool]
    if metrics is None:
        names = numeric
    else:
        names = [metrics] if isinstance(metrics, str) else list(metrics)
        unknown = [m for m in names if m not in numeric]
        if unknown:
            raise ValueError(f"not numeric data variables of this Dataset: {unknown}; it has {numeric}")
    blocks = {}
    for name in names:
        blocks.setdefault(ds[name].dims, []).append(name)
    frames = []
    for dims, group in blocks.items():
        sub = ds[group]
        sub = sub.drop_vars([c for c in sub.coords if not set(sub[c].dims) <= set(dims)])
        if dims:
            wide = sub.to_dataframe().reset_index()
        else:
            wide = pd.DataFrame({**{c: [sub[c].item()] for c in sub.coords}, **{v: [sub[v].item()] for v in group}})
        ids = [c for c in wide.columns if c not in group]
        long = wide.melt(id_vars=ids, value_vars=group, var_name="metric", value_name="value")
        long["unit"] = long["metric"].map({v: str(ds[v].attrs.get("units", "")) for v in group})
        frames.append(long)
    if not frames:
        return pd.DataFrame(columns=["metric", "value", "unit"])
    return pd.concat(frames, ignore_index=True)
