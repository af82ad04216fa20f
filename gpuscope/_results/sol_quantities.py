"""The speed-of-light quantities of each launch (roofline, memory workload, instructions), for compare and the trace.

:func:`per_launch` runs the analyses of :mod:`gpuscope.metrics` on a range Dataset, row by row, and names each
quantity ``<analysis>.<variable>.<label>`` after the variable it is: ``roofline.flop_rate.fp64`` is
``gs.roofline(ds)["flop_rate"].sel(precision="fp64")``, ``memory.hit_rate.L2`` is
``gs.memory_workload(ds)["hit_rate"].sel(level="L2")``. An analysis whose metrics the Dataset lacks gives nothing.
Occupancy is not here: its measured part is the ``occupancy`` set's own metric
(``sm__warps_active.avg.pct_of_peak_sustained_active``), which compare and the trace carry as a metric, and its
theoretical part is a property of the launch, not a measurement (:func:`gpuscope.occupancy`, from the registers and
shared memory that kernel, iteration and auto modes record for each launch), not one of these quantities.
"""

from __future__ import annotations

import numpy as np

__all__ = ["per_launch"]

#: Per analysis: (its function's name in gpuscope.metrics, the variables taken, the label dim of each).
_TAKEN = (
    ("roofline", "roofline", (("flop_rate", "precision"), ("achieved_fraction", "precision"),
                              ("bandwidth", "level"))),
    ("memory", "memory_workload", (("bandwidth", "level"), ("hit_rate", "level"), ("busy", "level"))),
    ("instructions", "instruction_mix", (("pipe_utilization", "pipe"), ("threads_per_inst", None))),
)
#: The units the analyses use, as the report and compare write them.
_UNITS = {"percent": "%"}


def _analyses():
    from gpuscope.metrics import instruction_mix, memory_workload, roofline

    return {"roofline": roofline.roofline, "memory_workload": memory_workload.memory_workload,
            "instruction_mix": instruction_mix.instruction_mix}


#: What says whether a label carries anything: a precision that did work, a pipe that ran (levels always do).
_WORK = {"precision": "flop", "pipe": "pipe_instructions"}


def per_launch(ds, dim: str = "range") -> tuple[dict[str, np.ndarray], dict[str, str], set[str]]:
    """Every speed-of-light quantity of each row of *ds* that its metrics allow.

    Returns
    -------
    (values, units, percent)
        ``values``: quantity -> one float per row (NaN where a row has none); ``units``: quantity -> its unit
        (``"%"``, ``"FLOP/second"``, ``"byte/second"``, ``"ratio"``, ``"thread/instruction"``); ``percent``: the
        quantities in percent (hit rates, busy shares, pipe utilisation), whose changes compare counts in points.
        Precisions without work and pipes without instructions in any row are left out; so are analyses whose
        metrics *ds* lacks.
    """
    from gpuscope.errors import MissingMetricsError

    values: dict[str, np.ndarray] = {}
    units: dict[str, str] = {}
    functions = _analyses()
    for name, function, variables in _TAKEN:
        try:
            out = functions[function](ds, dim=dim)
        except MissingMetricsError:
            continue
        for var, label_dim in variables:
            unit = str(out[var].attrs.get("units", ""))
            unit = _UNITS.get(unit, unit)
            labels = [None] if label_dim is None else out[label_dim].values.astype(str).tolist()
            for label in labels:
                da = out[var] if label is None else out[var].sel({label_dim: label})
                data = np.asarray(da.values, dtype=float)
                work = _WORK.get(label_dim)
                if not np.isfinite(data).any() or (work and not (out[work].sel({label_dim: label}) > 0).any()):
                    continue
                key = f"{name}.{var}" + ("" if label is None else f".{label}")
                values[key], units[key] = data, unit
    return values, units, {k for k, u in units.items() if u == "%"}
