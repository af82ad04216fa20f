"""Saving and exporting gpuscope Datasets: netCDF save/load, Perfetto/Chrome-trace export."""

from __future__ import annotations

import json
import math
import os

import numpy as np

from . import _results, _validate

def _dataset_arg(ds, what: str) -> None:
    import xarray as xr

    if not isinstance(ds, xr.Dataset):
        hint = " (load a file first with gpuscope.open_dataset)" if isinstance(ds, (str, os.PathLike)) else ""
        raise ValueError(f"{what} an xarray.Dataset as ds{hint}; got {type(ds).__name__}")


def _path_arg(path, what: str) -> None:
    if path is None:
        raise ValueError(f"{what} (path=, a str or pathlib.Path); got None")
    _validate.path(path, "path")


# ---------------------------------------------------------------------------------------------------------
# Perfetto / Chrome trace (JSON "Trace Event Format"): PM sampling series as counters, user ranges as slices
# ---------------------------------------------------------------------------------------------------------


def to_chrome_trace(ds, path: str | os.PathLike | None = None, metrics=None) -> dict:
    """Export a PM sampling Dataset as a Chrome/Perfetto trace: one counter track per metric, user ranges as
    slices on their threads. Times are µs from the session start.

    Open the file at https://ui.perfetto.dev or chrome://tracing.

    Parameters
    ----------
    ds : xarray.Dataset
        A dataset from ``gpuscope.sample`` (``attrs["kind"] == "pm_sampling"``), e.g. loaded from netCDF.
    path : str or PathLike, optional
        Where to write the JSON. Without it nothing is written.
    metrics : list of str, optional
        The metrics to export (default: all).

    Returns
    -------
    dict
        The trace (``{"traceEvents": [...], ...}``).

    Raises
    ------
    ValueError
        *ds* is not a PM sampling dataset (None included), a metric is not in it, or *metrics* is empty.
    TypeError
        *path* is not a str or PathLike; *metrics* is not a name or a list of names.
    """
    _dataset_arg(ds, "to_chrome_trace exports")
    if path is not None:
        _validate.path(path, "path")
    if metrics is not None:
        metrics = _validate.names(metrics, "metrics")
    if ds.attrs.get("kind") != "pm_sampling" or "time" not in ds.dims:
        raise ValueError("to_chrome_trace exports PM sampling datasets (from gpuscope.sample); this one is not.")
    known = _results._as_list(ds.attrs["metrics"])  # a file read without gpuscope has one metric as a str
    names = ([metrics] if isinstance(metrics, str) else list(metrics)) if metrics is not None else known
    missing = [m for m in names if m not in ds.data_vars]
    if missing:
        raise ValueError(f"Not in this dataset: {missing}. It has: {known}.")
    t0 = int(ds.attrs["session_start_ns"])
    pid = int(ds.attrs.get("device_index", 0))
    label = f"gpuscope: {ds.attrs.get('device_name', ds.attrs.get('chip', 'GPU'))}"
    events = [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": label}}]
    # a sample's value holds from its start; the first sample's start may reach back before the session
    starts = (np.maximum(ds["start_ns"].values.astype(np.int64), t0) - t0) / 1e3
    for name in names:
        unit = ds[name].attrs.get("units", "")
        track = f"{name} ({unit})" if unit else name
        for ts, value in zip(starts.tolist(), ds[name].values.tolist()):
            events.append(
                {"name": track, "ph": "C", "pid": pid, "tid": 0, "ts": ts, "args": {"value": None if math.isnan(value) else value}}
            )
    table = _results.spans(ds)
    tids = {thread: i + 1 for i, thread in enumerate(sorted(set(table["thread"].tolist())))}
    for thread, tid in tids.items():
        events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": f"ranges (thread {thread})"}})
    for p, thread, s, e in zip(table["path"].tolist(), table["thread"].tolist(), table["start_ns"].tolist(),
                               table["end_ns"].tolist()):
        events.append({"name": p.rsplit("/", 1)[-1], "ph": "X", "pid": pid, "tid": tids[thread],
                       "ts": (s - t0) / 1e3, "dur": (e - s) / 1e3, "args": {"path": p}})
    trace = {"traceEvents": events, "displayTimeUnit": "ns", "otherData": {"gpuscope": "pm_sampling"}}
    if path is not None:
        with open(path, "w") as f:
            json.dump(trace, f)
    return trace


# ---------------------------------------------------------------------------------------------------------
# netCDF (HDF5 through h5netcdf): lossless round trip of every gpuscope Dataset
# ---------------------------------------------------------------------------------------------------------


#: Dataset attr in which :func:`save_dataset` records the attrs netCDF cannot store as they are.
ATTR_TYPES = "gpuscope_attr_types"


def _encode_attr(value):
    """(netCDF-safe value, type tag or None when stored as it is)."""
    if value is None:
        return "", "none"
    if isinstance(value, (bool, np.bool_)):
        return int(value), "bool"
    if isinstance(value, dict):
        return json.dumps(value), "json"
    if isinstance(value, (list, tuple, np.ndarray)):
        items = list(value.tolist() if isinstance(value, np.ndarray) else value)
        if not items:
            return "", "list"
        if all(isinstance(v, (bool, np.bool_)) for v in items):
            return np.asarray(items, dtype=np.int8), "bool_list"
        if all(isinstance(v, str) for v in items):
            return items, "list"
        if all(isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_)) for v in items):
            return np.asarray(items), "list"
        raise ValueError(f"a list attr must hold only str, only numbers or only bools, got {items[:5]!r}; "
                         "convert it (e.g. to a JSON string) before saving")
    if isinstance(value, (str, int, float, np.integer, np.floating)):
        return value, None
    raise ValueError(f"netCDF cannot store an attr of type {type(value).__name__} ({value!r}); use str, numbers, "
                     "bool, None, lists of those, or a dict (saved as JSON)")


def _decode_attr(value, tag: str):
    if tag == "none":
        return None
    if tag == "bool":
        return bool(value)
    if tag == "json":
        return json.loads(value)
    items = _results._as_list(value)
    return [bool(v) for v in items] if tag == "bool_list" else items


def save_dataset(ds, path: str | os.PathLike) -> None:
    """Write a gpuscope Dataset to a netCDF-4 file (HDF5, through h5netcdf), losslessly.

    :func:`open_dataset` reads it back identical, indexes and attrs included. Attrs that netCDF cannot store
    as they are (bool, None, lists, which come back as a scalar when they have one element, dicts) are encoded,
    and the Dataset attr ``gpuscope_attr_types`` (a JSON dict ``{variable or "": {attr: type}}``) records how
    to decode them; other readers see ``0``/``1`` for bools, ``""`` for None and ``[]``, and JSON text for
    dicts.

    Parameters
    ----------
    ds : xarray.Dataset
        Any Dataset; gpuscope's own are the usual case.
    path : str or PathLike
        File to write (overwritten).

    Raises
    ------
    ValueError
        *ds* is not a Dataset (None included), *path* is None, or an attribute holds a value that cannot be stored
        (an object, a list of mixed types); the message names it.
    TypeError
        *path* is not a str or PathLike.
    """
    _dataset_arg(ds, "save_dataset writes")
    _path_arg(path, "save_dataset needs a path to write to")
    out = ds.copy(deep=False)
    tags = {}
    for owner, attrs in [("", out.attrs)] + [(str(k), out[k].attrs) for k in out.variables]:
        encoded = {}
        for key, value in attrs.items():
            if key == ATTR_TYPES and owner == "":
                continue
            try:
                encoded[key], tag = _encode_attr(value)
            except ValueError as err:
                raise ValueError(f"attr {key!r} of {owner or 'the Dataset'}: {err}") from None
            if tag:
                tags.setdefault(owner, {})[key] = tag
        if owner == "":
            out.attrs = encoded
        else:
            out[owner].attrs = encoded
    if tags:
        out.attrs[ATTR_TYPES] = json.dumps(tags, sort_keys=True)
    out.to_netcdf(path, engine="h5netcdf")


def open_dataset(path: str | os.PathLike):
    """Load a Dataset saved with :func:`save_dataset` (or ``ds.to_netcdf``), fully into memory.

    Attrs come back with the types they were saved with (see :func:`save_dataset`); the indexes of the
    schema (``name`` and ``kernel`` of range results) are restored; files of an older gpuscope layout (grid and
    block along an ``xyz`` dim, user ranges along a ``span`` dim: gpuscope 0.1) are converted to the current
    one, exactly (:func:`gpuscope._results.upgrade`). So ``xr.testing.assert_identical`` holds between a saved
    and the loaded Dataset.

    Parameters
    ----------
    path : str or PathLike
        A netCDF-4 file.

    Returns
    -------
    xarray.Dataset

    Raises
    ------
    FileNotFoundError
        No file at *path*.
    ValueError
        *path* is None.
    TypeError
        *path* is not a str or PathLike (an integer would be read as an open file descriptor).
    """
    import xarray as xr

    _path_arg(path, "open_dataset needs a path")
    if not os.path.exists(path):
        raise FileNotFoundError(f"No gpuscope dataset at {os.fspath(path)!r}.")
    with xr.open_dataset(path, engine="h5netcdf") as ds:
        ds = ds.load()
    tags = json.loads(ds.attrs.pop(ATTR_TYPES, "{}"))
    for owner, attrs in [("", ds.attrs)] + [(str(k), ds[k].attrs) for k in ds.variables]:
        for key, value in list(attrs.items()):
            tag = tags.get(owner, {}).get(key)
            if tag:
                attrs[key] = _decode_attr(value, tag)
            elif isinstance(value, np.ndarray):
                attrs[key] = value.tolist()
    if "metrics" in ds.attrs:  # files from before gpuscope_attr_types: one metric came back as a str
        ds.attrs["metrics"] = _results._as_list(ds.attrs["metrics"])
    return _results.upgrade(ds)
