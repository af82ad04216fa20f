"""The Dataset schema: dims, coordinates and tables of gpuscope Datasets, conversion of older files, long format.

The layout every builder (:mod:`gpuscope._results.build`) writes and every reader relies on; analysis reads
Datasets through it. Schema versions: :data:`SCHEMA_VERSION`, converted by :func:`upgrade`.
"""

from __future__ import annotations

import numpy as np

from gpuscope._schema.units import split_name, units_of

#: Version of the Dataset layout, stored in ``attrs["gpuscope_schema"]``; :func:`upgrade` converts older ones.
#: Version 1 (files without the attr) held grid/block along an ``xyz`` dim and the user ranges as data variables
#: along ``span``; version 2 held the span and execution tables as list attrs and each sample's span index as the
#: coordinate ``span``; version 3 holds the tables as coordinates along ``span`` and ``execution``
#: (:data:`SPAN_TABLE`, :data:`EXEC_TABLE`) and each sample's span index as ``span_index``; version 4 indexes
#: range results by row number (``range`` = 0, 1, ..., unique), where version 3 and older repeated the path;
#: version 5 holds the tables as Dataset attrs, one 1-D array per column (the Dataset's variables are all along
#: the samples, so ``ds.to_dataframe()`` has one row per sample), and files hold them as netCDF groups
#: (:data:`TABLE_GROUPS`); version 6 names each execution's kernel as every Dataset of the process names it
#: (``exec_kernel``, short) and keeps its qualified name in the column ``exec_kernel_qualname`` (version 5's
#: ``exec_kernel``). Version 6 later added the columns ``exec_graph_id`` and ``exec_graph_node_id``
#: (:data:`GRAPH_COLUMNS`), which a reader that does not know them ignores; :func:`upgrade` gives tables written
#: without them -1 (unknown) there.
SCHEMA_VERSION = 6

_CUPTI_NS = {"units": "ns", "clock": "cuptiGetTimestamp"}

#: The span table of a PM sampling Dataset: one Dataset attr per column (a 1-D array), one entry per execution of
#: a user range (``gpuscope.range``), ordered by start. name -> (dtype, attrs of the column in a file).
SPAN_TABLE = {
    "span_path": (object, {"description": "path of the user range, levels joined by '/'"}),
    "span_thread": (np.int64, {"description": "host thread that entered the range (threading.get_ident)"}),
    "span_start_ns": (np.int64, {**_CUPTI_NS, "description": "when the range was entered"}),
    "span_end_ns": (np.int64, {**_CUPTI_NS, "description": "when the range was left (the session's end for a "
                                                           "range still open then)"}),
}

#: The execution table of a PM sampling Dataset recorded with ``kernels=True``: one Dataset attr per column (a
#: 1-D array), one entry per kernel execution on the GPU. name -> (dtype, attrs of the column in a file).
EXEC_TABLE = {
    "exec_kernel": (object, {"description": "the kernel's name, as the kernel coordinate of range results and PC "
                                            "samples of the same process names it"}),
    "exec_kernel_qualname": (object, {"description": "the kernel's qualified name (module.function, "
                                                     "ns::kernel<float>)"}),
    "exec_symbol": (object, {"description": "the kernel's symbol as the driver has it"}),
    "exec_start_ns": (np.int64, {**_CUPTI_NS, "description": "the kernel's start on the GPU"}),
    "exec_end_ns": (np.int64, {**_CUPTI_NS, "description": "the kernel's end on the GPU"}),
    "exec_stream": (np.int64, {"description": "CUDA stream the kernel ran on (CUPTI's streamId)"}),
    "exec_correlation": (np.int64, {"description": "CUPTI's correlation id of the launch call (the kernels of one "
                                                   "CUDA graph launch share that call's)"}),
    "exec_graph_id": (np.int64, {"description": "CUPTI's id of the CUDA graph that ran the kernel (graphId of its "
                                                "activity record), 0 for a kernel launched on its own, -1 where "
                                                "unknown (recorded before gpuscope read it)"}),
    "exec_graph_node_id": (np.int64, {"description": "CUPTI's id of the graph's kernel node that ran the kernel "
                                                     "(graphNodeId), 0 for a kernel launched on its own, -1 where "
                                                     "unknown (recorded before gpuscope read it)"}),
}

#: The column of the execution table that versions 1 to 5 lacked (their ``exec_kernel`` held the qualified name).
QUALNAME = "exec_kernel_qualname"

#: The columns of the execution table that files written before gpuscope read CUPTI's graph ids lack; :func:`upgrade`
#: fills them with this value (unknown), which no recorded execution has (CUPTI's ids are unsigned, 0 for none).
GRAPH_COLUMNS = ("exec_graph_id", "exec_graph_node_id")
UNKNOWN_GRAPH = -1

#: Column names of the span and execution tables (Dataset attrs).
SPAN_VARS = tuple(SPAN_TABLE)
EXEC_VARS = tuple(EXEC_TABLE)

#: What merged Datasets add to each table: a column saying whose the row is (``span_rank``, ``exec_device``).
ORIGINS = ("rank", "device")

#: The tables as a saved file holds them: netCDF group -> (the table's dim in the group, its columns). The group
#: holds one variable per column along the dim, with the attrs of :data:`SPAN_TABLE` / :data:`EXEC_TABLE`.
TABLE_GROUPS = {"spans": ("span", SPAN_TABLE), "executions": ("execution", EXEC_TABLE)}

#: The per-sample coordinate (along ``time``) that says which span each sample lies in.
SPAN_INDEX = "span_index"


def _prefix(table: dict) -> str:
    return next(iter(table)).split("_", 1)[0] + "_"


def _columns(table: dict) -> tuple[str, ...]:
    """Every column *table* may have: its own, then those of :data:`ORIGINS`."""
    return (*table, *(_prefix(table) + origin for origin in ORIGINS))


#: Every Dataset attr that holds a table column.
TABLE_ATTRS = frozenset(_columns(SPAN_TABLE) + _columns(EXEC_TABLE))


def table_attrs(table: dict, columns: dict) -> dict:
    """The Dataset attrs of the table *table* (:data:`SPAN_TABLE` or :data:`EXEC_TABLE`) from *columns* (column
    name -> sequence of values; every column of *table*, and of :data:`ORIGINS` if any): strings as object arrays
    of str, numbers as int64 arrays.

    Raises
    ------
    ValueError
        The columns differ in length.
    """
    out = {}
    for name in _columns(table):
        if name not in columns and name not in table:
            continue
        values = columns[name]
        if table.get(name, (np.int64,))[0] is object:
            data = np.empty(len(values), dtype=object)
            data[:] = [str(v) for v in values]
        else:
            data = np.asarray(values, dtype=np.int64).reshape(-1)
        out[name] = data
    if len({len(v) for v in out.values()}) > 1:
        lengths = ", ".join(f"{k} {len(v)}" for k, v in out.items())
        raise ValueError(f"the columns of the {_prefix(table)[:-1]} table differ in length ({lengths})")
    return out


def _held(table: dict, columns: dict) -> dict:
    """*table* without the columns an older gpuscope did not write where *columns* lack them: :data:`QUALNAME` (a
    table of schema 5 or older, whose ``exec_kernel`` :func:`upgrade` names again) and :data:`GRAPH_COLUMNS`
    (:func:`upgrade` fills them)."""
    return {name: spec for name, spec in table.items() if name in columns or name not in (QUALNAME, *GRAPH_COLUMNS)}


def table_columns(ds, table: dict) -> dict | None:
    """The columns of *table* that *ds* holds (name -> 1-D array), or None where it holds no such table."""
    if next(iter(table)) not in ds.attrs:
        return None
    return {name: np.asarray(ds.attrs[name]) for name in _columns(table) if name in ds.attrs}


def table_groups(ds):
    """*ds* without its tables, and the tables as the groups of a file hold them (:data:`TABLE_GROUPS`): one
    Dataset per table, a variable per column along the table's dim. Times keep the clock of the samples'
    ``start_ns`` (the wall clock for merged ranks)."""
    import xarray as xr

    clock = ds["start_ns"].attrs.get("clock") if "start_ns" in ds.variables else None
    groups = {}
    for group, (dim, table) in TABLE_GROUPS.items():
        columns = table_columns(ds, table)
        if columns is None:
            continue
        variables = {}
        for name, values in columns.items():
            attrs = dict(table[name][1]) if name in table else {
                "description": f"the {name[len(_prefix(table)):]} whose table the row comes from"}
            if clock and "clock" in attrs:
                attrs["clock"] = clock
            variables[name] = xr.Variable(dim, values, attrs)
        groups[group] = xr.Dataset(variables)
    rest = ds.copy()
    rest.attrs = {k: v for k, v in ds.attrs.items() if k not in TABLE_ATTRS}
    return rest, groups


def join_tables(ds, groups: dict):
    """*ds* with the tables of *groups* (group name -> Dataset, as :func:`table_groups` gives them and a file's
    groups hold them) as its attrs."""
    for group, (_, table) in TABLE_GROUPS.items():
        if group in groups:
            found = groups[group]
            columns = {n: found[n].values for n in _columns(table) if n in found}
            ds = ds.assign_attrs(table_attrs(_held(table, columns), columns))
    return ds


def has_executions(ds) -> bool:
    """Whether *ds* (PM samples, or phases of them) holds the execution table of ``gpuscope.sample(kernels=True)``."""
    return "exec_start_ns" in ds.attrs


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


def kernel_executions(ds):
    """The kernels that ran on the GPU during a PM sampling session (``gpuscope.sample(kernels=True)``), one row
    per execution, with GPU start and end times on the samples' clock.

    The table is the Dataset's execution table: the attrs ``exec_kernel``, ``exec_kernel_qualname``,
    ``exec_symbol``, ``exec_start_ns``, ``exec_end_ns``, ``exec_stream``, ``exec_correlation``,
    ``exec_graph_id`` and ``exec_graph_node_id``, one array per column (:data:`EXEC_TABLE`).

    Parameters
    ----------
    ds : xarray.Dataset
        A PM sampling Dataset recorded with ``kernels=True`` (or the phases Dataset computed from one, or several
        of them combined by :func:`gpuscope.merge_ranks` or :func:`gpuscope.combine_devices`).

    Returns
    -------
    pandas.DataFrame
        Index ``execution``; columns ``kernel`` (its name, as the ``kernel`` coordinate of range results and PC
        samples of the same process), ``kernel_qualname`` (``module.function``), ``symbol`` (as the driver has
        it), ``start_ns``, ``end_ns`` (CUPTI timestamps), ``start``/``end`` (ns
        from the session start, on the scale of the ``time`` coordinate), ``duration_ns``, ``stream``,
        ``correlation`` (CUPTI's id of the launch call: the kernels of one CUDA graph launch share it),
        ``graph_id`` and ``graph_node_id`` (CUPTI's ids of the graph and of its kernel node that ran the kernel; 0
        for a kernel launched on its own, -1 in files recorded before gpuscope read them). Sorted by start. Of a
        combined Dataset, also ``rank`` or ``device`` (which one ran the kernel; times from
        ``attrs["time_origin_ns"]``).

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
    if not hasattr(ds, "attrs") or ds.attrs.get("kind") != "pm_sampling":
        raise ValueError("kernel_executions() reads a PM sampling Dataset (from gpuscope.sample); this is not one.")
    ds = _current(ds)
    if not has_executions(ds):
        raise ValueError("This PM sampling Dataset has no kernel executions: record it with "
                         "gpuscope.sample(..., kernels=True) (or gpuscope run --sample SET --kernel-times).")
    table = _table_frame(ds, EXEC_TABLE, "exec_")
    table["duration_ns"] = table["end_ns"] - table["start_ns"]
    table = table.sort_values("start_ns", kind="stable").reset_index(drop=True)
    table.index.name = "execution"
    first = ["kernel", "kernel_qualname", "symbol", "start_ns", "end_ns", "start", "end", "duration_ns", "stream",
             "correlation", "graph_id", "graph_node_id"]
    return table[first + [c for c in table.columns if c not in first]]


SAMPLE_RANGE_ATTRS = {"description": "innermost user range open at the sample's midpoint, '' where none"}


SAMPLE_SPAN_ATTRS = {"description": "row of the span table (gpuscope.spans; attrs span_path, span_start_ns, ...) of "
                                    "the innermost user range open at the sample's midpoint, -1 where none"}


def spans(ds):
    """The user ranges recorded during a PM sampling session, one row per execution of a range.

    The table is the Dataset's span table: the attrs ``span_path``, ``span_thread``, ``span_start_ns`` and
    ``span_end_ns``, one array per column (:data:`SPAN_TABLE`).

    Parameters
    ----------
    ds : xarray.Dataset
        A PM sampling Dataset (from :func:`gpuscope.sample` or :func:`gpuscope.open_dataset`; also the phases
        Dataset computed from one, or several combined by :func:`gpuscope.merge_ranks` or
        :func:`gpuscope.combine_devices`).

    Returns
    -------
    pandas.DataFrame
        Index ``span`` (the row that the samples' ``span_index`` coordinate refers to); columns ``path``,
        ``thread``, ``start_ns``, ``end_ns`` (CUPTI timestamps) and ``start``/``end`` (ns from the session start,
        on the scale of the ``time`` coordinate). Of Datasets merged across ranks, also ``rank`` (times from
        ``attrs["time_origin_ns"]``).

    Raises
    ------
    ValueError
        *ds* is not a PM sampling Dataset.

    Examples
    --------
    >>> ts = gpuscope.open_dataset("series.nc")                 # doctest: +SKIP
    >>> gpuscope.spans(ts).groupby("path").size()              # doctest: +SKIP
    """
    if not hasattr(ds, "attrs") or ds.attrs.get("kind") != "pm_sampling":
        raise ValueError("spans() reads the user ranges of a PM sampling Dataset (from gpuscope.sample); "
                         "this is not one.")
    table = _table_frame(_current(ds), SPAN_TABLE, "span_")
    table.index.name = "span"
    return table


def _current(ds):
    """*ds* in the current schema: a Dataset of an older one (or an execution table from before the graph ids) that
    was not read through gpuscope.open_dataset is converted (:func:`upgrade`)."""
    current = ds.attrs.get("gpuscope_schema") == SCHEMA_VERSION and (
        not has_executions(ds) or all(name in ds.attrs for name in GRAPH_COLUMNS))
    return ds if current else upgrade(ds)


def _table_frame(ds, table: dict, prefix: str):
    """The table *table* of *ds* as a DataFrame: its columns without *prefix*, ``start``/``end`` (ns from the
    origin of ``time``), then the columns of :data:`ORIGINS` it has (``span_rank`` -> ``rank``). A table the
    Dataset does not hold is empty."""
    import pandas as pd

    columns = table_columns(ds, table) or {}
    frame = pd.DataFrame({
        name[len(prefix):]: pd.Series(columns.get(name, []), dtype=str if dtype is object else dtype)
        for name, (dtype, _) in table.items()
    })
    t0 = int(ds.attrs["time_origin_ns"] if "time_origin_ns" in ds.attrs else ds.attrs["session_start_ns"])
    frame["start"] = frame["start_ns"] - t0
    frame["end"] = frame["end_ns"] - t0
    for name, values in columns.items():
        if name not in table:
            frame[name[len(prefix):]] = values
    return frame


def _as_list(value) -> list:
    """An attr that should be a list: netCDF readers return one-element lists as scalars."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return list(value)
    if isinstance(value, str) and value == "":
        return []
    return [value.item() if isinstance(value, np.generic) else value]


#: Dataset attrs that record the SM's resource limits (the CUDA device attributes an occupancy calculation needs),
#: written with the device's other attrs; :func:`gpuscope.metrics.occupancy.occupancy` reads them.
SM_LIMIT_ATTRS = {
    "sm_max_threads": "threads resident per SM at most (CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)",
    "sm_max_blocks": "blocks resident per SM at most (CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR)",
    "sm_registers": "32-bit registers per SM (CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR)",
    "block_max_registers": "32-bit registers one block may use (CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK)",
    "sm_shared_memory_bytes": "shared memory per SM, bytes (CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)",
    "block_reserved_shared_memory_bytes": "shared memory the system reserves per block, bytes "
                                          "(CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK)",
}


#: Coordinates of a range dataset: name -> (dtype, fill value for "unknown", attrs).
RANGE_COORDS = {
    "name": (str, "", {"description": "range path, levels joined by '/'"}),
    "depth": (np.int64, 0, {"description": "nesting depth, 1 for a top-level range"}),
    "parent": (str, "", {"description": "path of the enclosing range, '' at top level"}),
    "kernel": (str, "", {"description": "kernel name of an auto range or decorated launch, '' otherwise"}),
    "symbol": (str, "", {"description": "the kernel's symbol as the driver reports it (kernel and iteration modes)"}),
    "launch": (np.int64, -1, {"description": "the launch's ID: kernel replay, which launch of the session on its "
                                             "device it was, from 0, counting launches the filters left out; "
                                             "iteration replay, the same ID of its first pass's launch where auto "
                                             "mode found the loop, else its position in the iteration; user mode, "
                                             "the decorated launch's index; -1 for user ranges or where unknown"}),
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


#: What each launch asks of an SM, for the theoretical occupancy (:func:`gpuscope.metrics.occupancy.occupancy`):
#: name -> (dtype, fill value for "unknown", attrs). Kernel, iteration and auto modes record them for every launch
#: row: the registers and static shared memory from the driver for the launched function (``cuFuncGetAttribute``,
#: asked once per function and session when the rows are built: Nsight Compute's
#: ``launch__registers_per_thread`` and ``launch__shared_mem_per_block_static``), the dynamic shared memory from the
#: launch call. -1 for user ranges and decorated launches in user mode, where the driver could not be asked (the
#: function's module was unloaded first), and in files written before gpuscope recorded them (which lack the coords).
RESOURCE_COORDS = {
    "registers_per_thread": (np.int64, -1, {
        "units": "register/thread", "description": "registers per thread of the launched function "
                                                   "(CU_FUNC_ATTRIBUTE_NUM_REGS), -1 where unknown (user ranges)"}),
    "shared_memory_static": (np.int64, -1, {
        "units": "byte/block", "description": "statically allocated shared memory per block of the launched "
                                              "function (CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES), -1 where unknown"}),
    "shared_memory_dynamic": (np.int64, -1, {
        "units": "byte/block", "description": "dynamic shared memory per block the launch call asked for "
                                              "(sharedMemBytes), -1 where unknown (user ranges)"}),
}


def index(ds):
    """*ds* with the index its schema promises: range results get the ``range`` dimension coordinate, the row
    number of each range (0, 1, ..., unique, kept by ``isel``, so that Datasets derived from one another align).
    Other datasets, and range results that have it, are returned as they are.
    """
    if "range" in ds.dims and "range" not in ds.coords:
        ds = ds.assign_coords(range=("range", np.arange(ds.sizes["range"], dtype=np.int64), dict(RANGE_INDEX_ATTRS)))
    return ds


#: Attrs of the ``range`` index of range results.
RANGE_INDEX_ATTRS = {"description": "row number of the range (a user range or kernel launch) in the results: unique, "
                                    "so Datasets derived from these (gpuscope.topdown) align and merge with them; "
                                    "select by path or kernel with ds.isel(range=ds.kernel.isin([...]))"}


def upgrade(ds):
    """Convert a Dataset of an older gpuscope schema to the current one (:data:`SCHEMA_VERSION`); a current one
    is returned as it is. The Dataset given is left as it was.

    Version 1 (gpuscope 0.1 files, e.g. the shipped ``gpuscope/data/*.nc``) held ``grid``/``block`` as
    (range, xyz) coords and the user ranges as data variables along a ``span`` dim. Version 2 held the span table
    and the execution table (``kernels=True``) of PM samples as list attrs (``span_path``, ..., ``exec_kernel``,
    ...) and each sample's span index as the coordinate ``span``. Version 3 holds the tables as coordinates along
    the dims ``span`` and ``execution`` (:data:`SPAN_TABLE`, :data:`EXEC_TABLE`) and each sample's span index as
    the coordinate ``span_index``. Versions 1 to 3 indexed range results by path (``range`` repeated ``name``,
    not unique); version 4 indexes them by row number (:func:`index`). Version 5 holds the tables as Dataset
    attrs, one 1-D array per column, so that every variable lies along the samples. Version 6 names each
    execution's kernel as range results do (``fma``) in ``exec_kernel`` and keeps the qualified name
    (``module.fma``, the ``exec_kernel`` of versions 2 to 5) in ``exec_kernel_qualname``. The conversion is exact:
    the values move, none is recomputed except the per-sample span index of version 1, which is derived as
    :func:`gpuscope._results.build.sampling_dataset` derives it, the row numbers of range results, and the names
    of version 6, given within the file as a process gives them (:class:`~gpuscope._schema.names.KernelNames`:
    short where that is unambiguous). Execution tables written before gpuscope read CUPTI's graph ids get
    ``exec_graph_id`` and ``exec_graph_node_id`` of -1 (unknown: not recomputed, not guessed). Metric
    units written by an older gpuscope (``byte/second/second``, ``instruction/gpc_cycle/cycle``) are corrected
    with :func:`gpuscope._gpu.catalog.units_of`.
    """
    version = ds.attrs.get("gpuscope_schema")
    if isinstance(version, (int, np.integer)) and not isinstance(version, bool) and version > SCHEMA_VERSION:
        from gpuscope._version import __version__
        from gpuscope.errors import NotGpuscopeDataError

        raise NotGpuscopeDataError(
            f"This Dataset says it was written in gpuscope schema {int(version)}, newer than this gpuscope "
            f"({__version__}) reads (up to {SCHEMA_VERSION}): read it with the gpuscope that wrote it, or a newer one.")
    ds = ds.copy()  # shallow: no values are copied, and the caller's attrs stay as they were
    if "xyz" in ds.dims:
        ds = ds.assign_coords({
            f"{what}_{axis}": ("range", ds[what].sel(xyz=axis).values.astype(np.int64), SHAPE_COORDS[f"{what}_{axis}"][2])
            for what in ("grid", "block") if what in ds.variables
            for axis in "xyz"
        }).drop_vars([v for v in ("grid", "block", "xyz") if v in ds.variables])
    if ds.attrs.get("kind") == "pm_sampling":
        ds = _upgrade_tables(ds)
    if "range" in ds.dims and "range" in ds.coords and ds["range"].dtype.kind not in "iu":  # versions 1-3: paths
        ds = ds.drop_vars("range")  # index() below numbers the rows
    for name, variable in ds.data_vars.items():  # written before units_of was fixed: byte/second/second
        units = variable.attrs.get("units")
        if ("metric_type" in variable.attrs and isinstance(units, str) and "/" in units
                and units != units_of(split_name(str(name))[1], units)):
            variable.attrs["units"] = units_of(split_name(str(name))[1], units)
    if ds.attrs.get("kind") in ("range", "pm_sampling") and ds.attrs.get("gpuscope_schema") != SCHEMA_VERSION:
        ds.attrs = {"kind": ds.attrs["kind"], "gpuscope_schema": SCHEMA_VERSION,
                    **{k: v for k, v in ds.attrs.items() if k not in ("kind", "gpuscope_schema")}}
    return index(ds)


def _upgrade_tables(ds):
    """The span and execution tables of PM samples of schema version 1 to 5 as version 6 holds them (attrs of
    1-D arrays; the execution table with :data:`QUALNAME` and :data:`GRAPH_COLUMNS`, -1 where a file lacks them);
    those of version 5 and 6 as arrays where a reader gave lists (netCDF attrs)."""
    if "span" in ds.variables and ds["span"].dims != ("span",):  # version 2: each sample's span index
        ds = ds.rename_vars({"span": SPAN_INDEX})
    if any(name in ds.data_vars for name in SPAN_VARS):  # version 1: the span table as data variables
        columns = {name: ds[name].values if name in ds.variables else [] for name in SPAN_VARS}
        ds = ds.drop_dims("span").assign_attrs(table_attrs(SPAN_TABLE, columns))
        if SPAN_INDEX not in ds.variables and "time" in ds.dims and "start_ns" in ds.coords:
            mid = (ds["start_ns"].values.astype(np.int64) + ds["end_ns"].values.astype(np.int64)) // 2
            where = innermost_span(mid, columns["span_start_ns"], columns["span_end_ns"])
            ds = ds.assign_coords({SPAN_INDEX: ("time", where)})
    for dim, table in TABLE_GROUPS.values():
        if any(name in ds.variables for name in table):  # versions 3 and 4: coordinates along the table's dim
            columns = {name: ds[name].values for name in _columns(table) if name in ds.variables}
            ds = ds.drop_dims(dim).assign_attrs(table_attrs(_held(table, columns), columns))
        elif any(not isinstance(ds.attrs[name], np.ndarray) for name in table if name in ds.attrs):
            # version 2 (list attrs), or version 5 read by a netCDF reader that gives lists
            columns = {name: _as_list(ds.attrs.get(name, [])) for name in _columns(table)
                       if name in ds.attrs or (name in table and name not in (QUALNAME, *GRAPH_COLUMNS))}
            ds = ds.assign_attrs(table_attrs(_held(table, columns), columns))
    if SPAN_INDEX in ds.variables and ds.attrs.get("gpuscope_schema", 1) != SCHEMA_VERSION:
        ds[SPAN_INDEX].attrs = {**ds[SPAN_INDEX].attrs, **SAMPLE_SPAN_ATTRS}
    executions = table_columns(ds, EXEC_TABLE)
    if executions is None or all(name in executions for name in (QUALNAME, *GRAPH_COLUMNS)):
        return ds
    columns = dict(executions)
    if QUALNAME not in executions:  # versions 1 to 5: exec_kernel held qualified names
        from gpuscope._schema.names import KernelNames

        names = KernelNames()
        qualnames = [str(q) for q in executions["exec_kernel"]]
        columns.update({"exec_kernel": [names.name(q) for q in qualnames], QUALNAME: qualnames})
    for name in GRAPH_COLUMNS:  # written before gpuscope read CUPTI's graph ids: unknown
        columns.setdefault(name, np.full(len(executions["exec_start_ns"]), UNKNOWN_GRAPH, dtype=np.int64))
    ds.attrs = {k: v for k, v in ds.attrs.items() if k not in executions}  # the columns in the table's order
    return ds.assign_attrs(table_attrs(EXEC_TABLE, columns))


def to_dataframe(ds, metrics=None):
    """A gpuscope Dataset in long format: one row per observation of one metric.

    ``ds.to_dataframe()`` gives the wide format (one row per range or sample, one column per metric); this
    gives the tidy one that seaborn and ``groupby`` like.

    The span and execution tables of PM samples (Dataset attrs) are not in it: each sample's ``span_index`` and
    ``range`` are, and :func:`spans` and :func:`kernel_executions` give the tables.

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
            tables = ("; the span and execution tables are gpuscope.spans(ds) and gpuscope.kernel_executions(ds)"
                      if any(m in SPAN_TABLE or m in EXEC_TABLE for m in unknown) else "")
            raise ValueError(f"not numeric data variables of this Dataset: {unknown}; it has {numeric}{tables}")
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
