"""Build xarray Datasets from decoded CUPTI data: the only module that knows the Dataset schema.

Attrs hold only str, int, float and lists of them, so ``Dataset.to_netcdf`` round-trips them losslessly.
"""

from __future__ import annotations

import datetime

import numpy as np

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
):
    """A PM sampling time series.

    Schema: dim ``time`` (int64 ns from the session start to each sample's end, attrs units="ns"); coords
    ``start_ns``/``end_ns`` (CUPTI timestamps of each sample, ns) and ``range`` (innermost user range open at
    the sample's midpoint, "" where none); one variable per metric (exact CUPTI name) with attrs ``units``,
    ``description``, ``metric_type``, ``hw_unit``. User ranges themselves lie along dim ``span``:
    ``span_path``, ``span_thread``, ``span_start_ns``, ``span_end_ns`` (CUPTI timestamps). Attrs: device and
    versions, ``kind="pm_sampling"``, ``metrics``, ``session_start_ns``, plus *attrs* (interval, trigger,
    lost samples, ...).
    """
    import xarray as xr

    start_ns = np.asarray(start_ns, dtype=np.int64)
    end_ns = np.asarray(end_ns, dtype=np.int64)
    values = np.asarray(values, dtype=np.float64).reshape(len(metrics), start_ns.size)
    time = xr.DataArray(end_ns - np.int64(session_start_ns), dims="time", attrs={"units": "ns"})
    data_vars = {}
    for name, row in zip(metrics, values):
        data_vars[name] = xr.DataArray(row, dims="time", attrs=dict(properties.get(name, {})))
    data_vars["span_path"] = xr.DataArray(np.array([s.path for s in spans], dtype=str), dims="span")
    data_vars["span_thread"] = xr.DataArray(np.array([s.thread for s in spans], dtype=np.int64), dims="span")
    data_vars["span_start_ns"] = xr.DataArray(
        np.array([s.start_ns for s in spans], dtype=np.int64), dims="span", attrs={"units": "ns"}
    )
    data_vars["span_end_ns"] = xr.DataArray(
        np.array([s.end_ns for s in spans], dtype=np.int64), dims="span", attrs={"units": "ns"}
    )
    coords = {
        "time": time,
        "start_ns": xr.DataArray(start_ns, dims="time", attrs={"units": "ns", "clock": "cuptiGetTimestamp"}),
        "end_ns": xr.DataArray(end_ns, dims="time", attrs={"units": "ns", "clock": "cuptiGetTimestamp"}),
        "range": xr.DataArray(np.asarray(ranges, dtype=str).reshape(start_ns.shape), dims="time"),
    }
    all_attrs = {"kind": "pm_sampling", **_pm_device_attrs(device_info, chip)}
    all_attrs.update(metrics=list(metrics), session_start_ns=int(session_start_ns))
    all_attrs.update(attrs or {})
    return xr.Dataset(data_vars, coords=coords, attrs=all_attrs)


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
    * attrs: device and versions, ``kind="pc_sampling"``, ``total_samples``, ``dropped_samples``,
      ``non_user_kernel_samples``, ``hardware_buffer_full`` (0/1), plus *attrs* (period, collection mode).
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
    "launch": (np.int64, -1, {"description": "launch index: in the session (kernel mode) or in the iteration "
                                             "(iteration mode); -1 for user ranges"}),
    "start_ns": (np.int64, -1, {"units": "ns", "clock": "cuptiGetTimestamp"}),
    "end_ns": (np.int64, -1, {"units": "ns", "clock": "cuptiGetTimestamp"}),
    "pass_group": (np.int64, 0, {"description": "which group of passes (replays or loop iterations) gave the values"}),
    "first_iteration": (np.int64, -1, {"description": "first execution of this path that fed the pass group"}),
    "iterations": (np.int64, 1, {"description": "executions of this path (one per pass) that fed the pass group"}),
}


def range_dataset(records, metrics, properties, device_info=None, chip: str = "", attrs: dict | None = None):
    """Range-profiler results.

    Schema: dim ``range`` (one row per profiled range: a user range, or one kernel launch); one variable per
    metric (exact CUPTI name, float64) with attrs ``units``, ``description``, ``metric_type``, ``hw_unit``;
    coords :data:`RANGE_COORDS` plus ``grid`` and ``block`` (range, ``xyz``) launch dimensions (0 where
    unknown). Attrs: device and versions, ``kind="range"``, ``metrics``, plus *attrs* (metric set, mode,
    passes, ...).

    Parameters
    ----------
    records : sequence of dict
        One per range: ``values`` (one float per metric) and any of the coord names, ``grid``, ``block``.
    metrics : sequence of str
        The metric names, in the order of each record's ``values``.
    properties : dict
        metric name -> attrs dict.
    """
    import xarray as xr

    records = list(records)
    metrics = list(metrics)
    values = np.array([r["values"] for r in records], dtype=np.float64).reshape(len(records), len(metrics))
    coords = {}
    for name, (dtype, fill, cattrs) in RANGE_COORDS.items():
        column = [r.get(name, fill) for r in records]
        coords[name] = xr.DataArray(np.array(column, dtype=dtype).reshape(len(records)), dims="range", attrs=cattrs)
    for name in ("grid", "block"):
        dims3 = np.array([tuple(r.get(name) or (0, 0, 0)) for r in records], dtype=np.int64).reshape(len(records), 3)
        coords[name] = xr.DataArray(dims3, dims=("range", "xyz"), attrs={"description": f"launch {name} (x, y, z)"})
    coords["xyz"] = xr.DataArray(np.array(["x", "y", "z"]), dims="xyz")
    data_vars = {
        m: xr.DataArray(values[:, i], dims="range", attrs=dict(properties.get(m, {}))) for i, m in enumerate(metrics)
    }
    all_attrs = {"kind": "range", **_pm_device_attrs(device_info, chip)}
    all_attrs.update(metrics=metrics)
    all_attrs.update(attrs or {})
    return xr.Dataset(data_vars, coords=coords, attrs=all_attrs)
