"""The Dataset schema: dims, coordinates and tables of gpuscope Datasets, conversion of older files, long format.

The layout every builder (:mod:`gpuscope._results.build`) writes and every reader relies on; analysis reads
Datasets through it. Schema versions: :data:`SCHEMA_VERSION`, converted by :func:`upgrade`.
"""

from __future__ import annotations

import numpy as np

from gpuscope._schema.units import split_name, units_of


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


#: The execution table of a PM sampling Dataset recorded with ``kernels=True``: one entry per kernel execution.
EXEC_ATTRS = ("exec_kernel", "exec_symbol", "exec_start_ns", "exec_end_ns", "exec_stream", "exec_correlation")


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


SAMPLE_RANGE_ATTRS = {"description": "innermost user range open at the sample's midpoint, '' where none"}


SAMPLE_SPAN_ATTRS = {"description": "index of that range execution in the attrs span_*, -1 where none"}


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
    :func:`gpuscope._gpu.catalog.units_of`.
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
            ds = ds.assign_coords(span=("time", span, SAMPLE_SPAN_ATTRS))
    if ds.attrs.get("kind") == "pm_sampling":
        for name in SPAN_ATTRS:
            ds.attrs[name] = _as_list(ds.attrs.get(name, []))
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
