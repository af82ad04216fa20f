"""The source-counters Dataset: SASS-metric counts per instruction (kernel, PC offset), with its source line.

The layout matches the PC-sampling Dataset's ``pc`` dim (:func:`gpuscope._results.build.pc_sampling_dataset`:
``function``, ``mangled_name``, ``pc_offset``, ``cubin_crc``, ``file``, ``line``, ``line_text``), so that
:func:`gpuscope.source` joins the two per source line.
"""

from __future__ import annotations

import numpy as np

__all__ = ["UNITS", "source_counters_dataset"]

#: Every SASS metric gpuscope collects counts instruction executions (warp-level, or one per thread).
UNITS = "instruction"


def source_counters_dataset(pcs: dict, values, metrics: list[str], descriptions: list[str], launches: dict,
                            device_info=None, chip: str = "", attrs: dict | None = None):
    """SASS-metric counts by instruction, with per-kernel launch counts.

    Schema: dims ``pc`` and ``kernel``.

    * one variable per metric (dim ``pc``), named by its exact CUPTI name (``smsp__sass_inst_executed``: warp-level
      executions of the instruction; ``smsp__sass_thread_inst_executed``: the threads active at each;
      ``smsp__sass_thread_inst_executed_pred_on``: those of them whose predicate was on), summed over every launch
      in the block; attrs ``units`` ("instruction"), ``description`` (CUPTI's), ``metric_type`` ("counter").
    * pc coords as the PC-sampling Dataset's: ``function`` (the kernel's name, as every Dataset of the process
      names it), ``mangled_name``, ``pc_offset`` (bytes from the function's start, of the unpatched code),
      ``cubin_crc`` (hex string), ``file`` ("" when unknown), ``line`` (0 when unknown), ``line_text``.
    * kernel coords: ``kernel_qualname``, ``kernel_mangled_name``, ``launches`` (launches counted in the block;
      -1 where launches were not counted).
    * attrs: device and versions, ``kind="source_counters"``, ``metrics``, plus *attrs*.

    Parameters
    ----------
    pcs : dict
        Lists for the pc coords (``function``, ``mangled_name``, ``pc_offset``, ``cubin_crc``, ``file``, ``line``,
        ``line_text``).
    values : array (pc, metric)
        Counts.
    launches : dict or None
        Mangled kernel name -> launches counted; None when launches were not counted.
    """
    import xarray as xr

    from gpuscope._results.build import _pm_device_attrs
    from gpuscope._schema.names import demangle

    values = np.asarray(values, dtype=np.int64).reshape(-1, len(metrics))
    pc_coords = {
        "function": ("pc", np.asarray(pcs["function"], dtype=str)),
        "mangled_name": ("pc", np.asarray(pcs["mangled_name"], dtype=str)),
        "pc_offset": ("pc", np.asarray(pcs["pc_offset"], dtype=np.int64), {"units": "byte"}),
        "cubin_crc": ("pc", np.asarray([f"{int(c):#018x}" for c in pcs["cubin_crc"]], dtype=str)),
        "file": ("pc", np.asarray(pcs["file"], dtype=str)),
        "line": ("pc", np.asarray(pcs["line"], dtype=np.int64)),
        "line_text": ("pc", np.asarray(pcs["line_text"], dtype=str)),
    }
    kernels = np.unique(pc_coords["function"][1])
    mangled: dict[str, str] = {}
    for f, m in zip(pc_coords["function"][1], pc_coords["mangled_name"][1]):
        mangled.setdefault(str(f), str(m))
    counted = [-1 if launches is None else int(launches.get(mangled[k], 0)) for k in kernels]
    data_vars = {
        name: xr.DataArray(values[:, i], dims=("pc",),
                           attrs={"units": UNITS, "description": descriptions[i], "metric_type": "counter"})
        for i, name in enumerate(metrics)
    }
    coords = {
        **pc_coords,
        "kernel": ("kernel", kernels.astype(str)),
        "kernel_qualname": ("kernel", np.asarray([demangle(mangled[k]) for k in kernels], dtype=str)),
        "kernel_mangled_name": ("kernel", np.asarray([mangled[k] for k in kernels], dtype=str)),
        "launches": ("kernel", np.asarray(counted, dtype=np.int64)),
    }
    all_attrs = {"kind": "source_counters", **_pm_device_attrs(device_info, chip), "metrics": list(metrics)}
    all_attrs.update(attrs or {})
    return xr.Dataset(data_vars, coords=coords, attrs=all_attrs)
