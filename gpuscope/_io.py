"""Saving and exporting gpuscope Datasets: netCDF save/load, Perfetto/Chrome-trace export."""

from __future__ import annotations

import json
import math
import os

import numpy as np

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
        *ds* is not a PM sampling dataset, or a metric is not in it.
    """
    if ds.attrs.get("kind") != "pm_sampling" or "time" not in ds.dims:
        raise ValueError("to_chrome_trace exports PM sampling datasets (from gpuscope.sample); this one is not.")
    names = list(metrics) if metrics is not None else list(ds.attrs["metrics"])
    missing = [m for m in names if m not in ds.data_vars]
    if missing:
        raise ValueError(f"Not in this dataset: {missing}. It has: {list(ds.attrs['metrics'])}.")
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
    threads = sorted(set(ds["span_thread"].values.tolist())) if "span" in ds.dims else []
    tids = {thread: i + 1 for i, thread in enumerate(threads)}
    for thread, tid in tids.items():
        events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": f"ranges (thread {thread})"}})
    if "span" in ds.dims:
        for p, thread, s, e in zip(
            ds["span_path"].values.tolist(),
            ds["span_thread"].values.tolist(),
            ds["span_start_ns"].values.tolist(),
            ds["span_end_ns"].values.tolist(),
        ):
            events.append(
                {
                    "name": p.rsplit("/", 1)[-1],
                    "ph": "X",
                    "pid": pid,
                    "tid": tids[thread],
                    "ts": (s - t0) / 1e3,
                    "dur": (e - s) / 1e3,
                    "args": {"path": p},
                }
            )
    trace = {"traceEvents": events, "displayTimeUnit": "ns", "otherData": {"gpuscope": "pm_sampling"}}
    if path is not None:
        with open(path, "w") as f:
            json.dump(trace, f)
    return trace


# ---------------------------------------------------------------------------------------------------------
# netCDF (HDF5 through h5netcdf): lossless round trip of every gpuscope Dataset
# ---------------------------------------------------------------------------------------------------------


def save_dataset(ds, path: str | os.PathLike) -> None:
    """Write a gpuscope Dataset to netCDF-4 (the same as ``ds.to_netcdf(path, engine="h5netcdf")``).

    Raises
    ------
    ValueError
        An attribute holds a value netCDF cannot store (gpuscope's own datasets never do).
    """
    ds.to_netcdf(path, engine="h5netcdf")


def open_dataset(path: str | os.PathLike):
    """Load a Dataset saved with :func:`save_dataset` or ``ds.to_netcdf``, fully into memory.

    List attributes (e.g. ``metrics``) come back as lists, so ``xr.testing.assert_identical`` holds between the
    saved and the loaded Dataset.

    Raises
    ------
    FileNotFoundError
        No file at *path*.
    """
    import xarray as xr

    if not os.path.exists(path):
        raise FileNotFoundError(f"No gpuscope dataset at {os.fspath(path)!r}.")
    with xr.open_dataset(path, engine="h5netcdf") as ds:
        ds = ds.load()
    for key, value in list(ds.attrs.items()):
        if isinstance(value, np.ndarray):
            ds.attrs[key] = value.tolist()
    return ds
