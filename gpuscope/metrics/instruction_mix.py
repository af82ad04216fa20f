"""Instruction statistics of range results: the executed mix by pipe and by class, and each pipe's utilisation.

Nsight Compute's Instruction Statistics and the pipe utilisation of its Compute Workload Analysis, from the
``instructions`` set, per range (or per group with ``by=``, rows combined by :mod:`gpuscope.metrics.combine`):

* ``pipe_instructions``: warp instructions each pipe executed (``smsp__inst_executed_pipe_<pipe>.sum``) and
  ``pipe_share``, their percent of all executed warp instructions. ``fmaheavy`` is a part of ``fma`` (the heavy
  half of the FMA pipe, Ampere GA10x and later): it has a share of its own and is not added again.
* ``pipe_utilization``: a pipe's instructions over the most it can take in the SMs' active cycles,
  ``count / (sm__inst_executed_pipe_<pipe>.sum.peak_sustained x sm__cycles_active.avg)``; the tensor pipe's from
  its active cycles (``sm__pipe_tensor_cycles_active``), since one tensor instruction keeps it busy for several.
  ``busiest_pipe`` is the most utilised.
* ``class_instructions``: thread instructions by class, predicated on (``smsp__sass_thread_inst_executed_op_<class>
  _pred_on.sum``: fp64, fp32, fp16, integer, bit, conversion, control, memory, misc, uniform,
  inter_thread_communication) and ``class_share``, their percent of the thread instructions the classes count.
* ``inst_executed``, ``inst_issued``, ``threads_per_inst`` (active threads per executed warp instruction, 32
  without divergence) and ``pred_on_threads_per_inst`` (those whose predicate was true).
"""

from __future__ import annotations

import numpy as np
import xarray as xr

from gpuscope.metrics.combine import along, combine, metric, plain, require

__all__ = ["PIPES", "SUB_PIPES", "CLASSES", "instruction_mix"]

_SET = "instructions"
#: The pipes of the ``instructions`` set.
PIPES = ("adu", "alu", "cbu", "fma", "fmaheavy", "fp64", "lsu", "tensor", "tex", "uniform", "xu")
#: Pipes that are a part of another (their instructions are in it too).
SUB_PIPES = {"fmaheavy": "fma"}
#: Thread-instruction classes of the ``instructions`` set.
CLASSES = ("fp64", "fp32", "fp16", "integer", "bit", "conversion", "control", "memory", "misc", "uniform",
           "inter_thread_communication")
_ACTIVE = "sm__cycles_active.avg"
_TENSOR_CYCLES = "sm__pipe_tensor_cycles_active.sum"

_ATTRS = {
    "inst_executed": ("instruction", "warp instructions executed"),
    "inst_issued": ("instruction", "warp instructions issued"),
    "threads_per_inst": ("thread/instruction", "active threads per executed warp instruction"),
    "pred_on_threads_per_inst": ("thread/instruction", "threads with a true predicate per executed warp instruction"),
    "pipe_instructions": ("instruction", "warp instructions executed by the pipe"),
    "pipe_share": ("percent", "the pipe's warp instructions of all executed (fmaheavy: part of fma's)"),
    "pipe_utilization": ("percent", "the pipe's work of the most it can do in the SMs' active cycles"),
    "busiest_pipe": ("", "the most utilised pipe"),
    "class_instructions": ("instruction", "thread instructions of the class, predicate true"),
    "class_share": ("percent", "the class's thread instructions of those the classes count"),
}


def instruction_mix(ds: xr.Dataset, by: str | None = None, dim: str = "range") -> xr.Dataset:
    """The executed instruction mix by pipe and by class, and each pipe's utilisation, per range or group.

    Parameters
    ----------
    ds : xarray.Dataset
        Range results holding the ``instructions`` set.
    by : str, optional
        Combine the ranges of each value of this coordinate first (``"kernel"``).
    dim : str
        The dimension of the ranges.

    Returns
    -------
    xarray.Dataset
        Along the rows: ``inst_executed``, ``inst_issued``, ``threads_per_inst``, ``pred_on_threads_per_inst``,
        ``busiest_pipe``; along the rows and ``pipe`` (:data:`PIPES`): ``pipe_instructions``, ``pipe_share``,
        ``pipe_utilization``; along the rows and ``class`` (:data:`CLASSES`): ``class_instructions``,
        ``class_share``. NaN for a pipe or class the chip has no counter for. Units and descriptions in attrs; row
        coordinates and Dataset attrs kept.

    Raises
    ------
    TypeError
        *ds* is not a Dataset.
    ValueError
        *by* or *dim* is not in *ds*.
    gpuscope.errors.MissingMetricsError
        The Dataset lacks the executed instructions or the SM active cycles (it holds no ``instructions`` set).
    """
    ds = combine(ds, by, dim)
    row = by or dim
    core = require(ds, ["smsp__inst_executed.sum", _ACTIVE], _SET, "the instruction statistics")
    executed, active = plain(core["smsp__inst_executed.sum"]), plain(core[_ACTIVE])

    def m(name):
        return along(metric(ds, name, _SET), executed)

    with np.errstate(divide="ignore", invalid="ignore"):
        counts = xr.concat([m(f"smsp__inst_executed_pipe_{p}.sum") for p in PIPES], xr.DataArray(list(PIPES),
                           dims="pipe"), coords="minimal")
        peaks = xr.concat([m(f"sm__inst_executed_pipe_{p}.sum.peak_sustained") for p in PIPES],
                          xr.DataArray(list(PIPES), dims="pipe"), coords="minimal")
        utilization = 100 * counts / (peaks * active)
        tensor = 100 * m(_TENSOR_CYCLES) / (m(_TENSOR_CYCLES + ".peak_sustained") * active)
        utilization = xr.where((utilization["pipe"] == "tensor") & tensor.notnull(), tensor, utilization)
        classes = xr.concat([m(f"smsp__sass_thread_inst_executed_op_{c}_pred_on.sum") for c in CLASSES],
                            xr.DataArray(list(CLASSES), dims="class"), coords="minimal")
        class_share = 100 * classes / classes.sum("class", min_count=1)
        threads = m("smsp__thread_inst_executed.sum") / executed
        pred_on = m("smsp__thread_inst_executed_pred_on.sum") / executed
    known = utilization.notnull().any("pipe")
    busiest = utilization.fillna(-np.inf).argmax("pipe")
    busiest_pipe = xr.DataArray(np.asarray(PIPES)[busiest.values], dims=busiest.dims, coords=busiest.coords)
    out = xr.Dataset({
        "inst_executed": executed, "inst_issued": m("smsp__inst_issued.sum"),
        "threads_per_inst": threads, "pred_on_threads_per_inst": pred_on,
        "pipe_instructions": counts, "pipe_share": 100 * counts / executed, "pipe_utilization": utilization,
        "busiest_pipe": busiest_pipe.where(known, "").astype(str),
        "class_instructions": classes, "class_share": class_share,
    })
    out = out.assign_coords({n: c for n, c in ds.coords.items() if c.dims == (row,)}).transpose(row, ...)
    for name, (units, description) in _ATTRS.items():
        out[name].attrs = {"units": units, "description": description} if units else {"description": description}
    out.attrs = dict(ds.attrs)
    return out
