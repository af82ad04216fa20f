"""Top-Down analysis of NVIDIA GPU kernels, levels 1-3 (Saiz et al., ``seeds/topdown-paper-saiz-et-al.txt``).

Units
-----
Every node is a **percentage of the SM's peak issue rate**, ``IPC_MAX``, so every level sums to 100 and the
numbers are those of the report, the comparison and every file (docs/report.md#units). The formulas below give
IPCs in warp instructions per active cycle per SM, as in the paper; ``topdown`` divides them by ``IPC_MAX`` and
multiplies by 100. ``IPC_MAX`` is the number of dispatch units (warp schedulers, one per SM sub-partition) per SM,
which is 4 on every architecture from CC 7.0 to 12.x. The paper's metrics (Tables II and IV) are per-SMSP averages
(``smsp__*.avg.per_cycle_active``, at most 1 each); the paper nonetheless defines IPC_MAX per SM. We multiply the
per-SMSP averages by the SMSPs per SM so that both sides are per SM, which also matches ncu's "IPC"
(``sm__inst_executed.avg.per_cycle_active``). Each node has attrs ``level``, ``parent``, ``formula`` (in IPC),
``units`` (``"percent"``) and ``ipc_max``: ``value * ipc_max / 100`` is the node's IPC.

Formulas (paper equation numbers in brackets)
---------------------------------------------
``R = 4 * smsp__inst_executed.avg.per_cycle_active``, ``I = 4 * smsp__inst_issued.avg.per_cycle_active``,
``W = smsp__thread_inst_executed_per_inst_executed.ratio / 32``:

* ``retire = R * W`` (2); ``divergence_branch = R * (1 - W)`` (3); ``divergence_replay = I - R`` (4);
  ``divergence = branch + replay`` (5); ``STALL = IPC_MAX - divergence - retire = IPC_MAX - I`` (7).
* Every stall node is ``STALL * share`` (8-10, 12-14), where the share of a warp stall reason ``r`` is
  ``pct_r / sum(pct over all stall reasons)``. The paper calls its inputs "percentage of stalls", but the
  ``*_per_warp_active.pct`` metrics are percentages of warp-active cycles, and those include cycles in which the
  warp issued (``selected``) or was ready (``not_selected``). Normalising over the stall reasons is the paper's
  stated intent and makes every level sum to ``IPC_MAX`` (100%) exactly.

Which stall reason goes where is :data:`STALL_PARENT` (paper Tables VI and VIII) with two deliberate changes:
``wait`` (a fixed-latency *execution* dependency) is charged to ``backend_core``, as the paper's own tool does,
rather than to memory as Table VIII prints it; ``gmma`` (Hopper warpgroup MMA, not in the paper) is charged to
``backend_core``. ``selected`` and ``not_selected`` are not stalls: a warp in those states issued or could have,
so they never explain a lost issue slot. They are collected only to check that the stall reasons cover all
warp-active cycles (:data:`COVERAGE_TOLERANCE`); a gap there means a reason the set does not collect (``gmma``
on Hopper unless asked for) was significant, and gpuscope warns.

Which reasons each chip has is per architecture family (:mod:`gpuscope.metrics.architectures`, ``docs/support.md``):
``imc_miss`` exists from Volta to Hopper and not on Blackwell, ``gmma`` only on Hopper; the ``*_pipe_*`` reasons some
chips list (``long_scoreboard_pipe_l1tex``) are parts of another reason and are not added again.

Levels
------
A level's *cut* is its nodes plus the leaves of shallower levels (``retire`` has no children, so it belongs to
the level-2 and level-3 cuts; ``divergence_branch``/``divergence_replay`` to the level-3 cut). Every cut sums to
100 (:func:`check_levels`).

The nodes are data in :mod:`gpuscope.metrics.topdown_nodes`, the checks :mod:`gpuscope.metrics.topdown_checks`,
averaging over ranges :mod:`gpuscope.metrics.topdown_aggregate`; this module computes the hierarchy and lists the
metrics it needs, and every public name of the four is importable from here.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import xarray as xr

from gpuscope.errors import MissingMetricsError
from gpuscope.metrics.architectures import (
    ARCHITECTURES,
    IPC_EXECUTED,
    IPC_ISSUED,
    NOT_STALLS,
    STALL_PARENT,
    SUB_REASONS,
    THREADS_PER_INST,
    Architecture,
    architecture,
    stall_metric,
)
from gpuscope.metrics.topdown_aggregate import WEIGHT_METRICS, aggregate
from gpuscope.metrics.topdown_checks import (COVERAGE_TOLERANCE, LEVEL_TOLERANCE, SPREAD_TOLERANCE, _check_coverage,
                                             check_levels, pass_spread, warp_state_coverage)
from gpuscope.metrics.topdown_nodes import _BY_NAME, _IPC, FULL_SCALE, NODES, UNITS, Node, level_cut
from gpuscope.metrics.topdown_verdict import verdict_coordinates

__all__ = [
    "ARCHITECTURES",
    "COVERAGE_TOLERANCE",
    "FULL_SCALE",
    "LEVEL_TOLERANCE",
    "NODES",
    "NOT_STALLS",
    "STALL_PARENT",
    "SUB_REASONS",
    "WEIGHT_METRICS",
    "Architecture",
    "Node",
    "aggregate",
    "architecture",
    "check_levels",
    "level_cut",
    "required_metrics",
    "stall_metric",
    "topdown",
]

WARP_SIZE = 32


def _levels(levels) -> tuple[int, ...]:
    levels = (levels,) if isinstance(levels, int) else tuple(levels)
    if not levels or any(lv not in (1, 2, 3) for lv in levels):
        raise ValueError(f"levels must be a subset of (1, 2, 3), got {levels!r}")
    return levels


def _resolve(arch: Architecture, role: str) -> list[str]:
    """Metric names of a role; ``stalls`` means every stall reason the architecture collects by default."""
    if role == "stalls":
        return [stall_metric(r) for r in arch.stall_reasons]
    return [arch.metrics[role]] if role in arch.metrics else []


def required_metrics(compute_capability, levels=(1, 2, 3), *, optional: bool = False, coverage: bool = True):
    """The exact CUPTI metric names that Top-Down needs: the ``topdown`` metric set.

    Parameters
    ----------
    compute_capability : str, tuple or Architecture
        A chip (``"GB202"``) or a compute capability (``"9.0"``); see :mod:`gpuscope.metrics.architectures`.
    levels : int or sequence of int
        Levels to compute. Levels 1-3 need the same metrics (frontend/backend already need every stall reason
        for the shares), so this only matters for a future table that differs.
    optional : bool
        Add the optional stall reasons of the architecture (``gmma`` on CC 9.0).
    coverage : bool
        Add ``selected`` and ``not_selected``, which only feed the coverage check.

    Returns
    -------
    list of str
        For CC 9.0 and the defaults: the paper's three IPC metrics and 18 ``*_per_warp_active.pct`` metrics.

    Raises
    ------
    ValueError
        Unknown compute capability or bad levels.
    """
    arch = architecture(compute_capability)
    wanted = {lv for lv in _levels(levels)}
    names: list[str] = []
    for node in NODES:
        if node.level in wanted:
            for role in node.requires:
                names += _resolve(arch, role)
    if coverage:
        names += [stall_metric(r) for r in NOT_STALLS]
    if optional:
        names += list(arch.optional_metrics.values())
    return list(dict.fromkeys(names))


# ---------------------------------------------------------------------------------------------------------------
# Computing the hierarchy


def _arch_of(ds: xr.Dataset, arch) -> Architecture:
    """The table for *arch* if given, else for the Dataset's chip, else for its compute capability."""
    if arch is not None:
        return architecture(arch)
    chip, cc = ds.attrs.get("chip"), ds.attrs.get("compute_capability")
    if chip:
        try:
            return architecture(str(chip))
        except ValueError:
            if cc is None:
                raise
    if cc is None:
        raise ValueError(
            "the Dataset has no 'chip' or 'compute_capability' attribute; pass arch='GH100' (the GPU's chip) or "
            "arch='9.0' (its compute capability)"
        )
    return architecture(cc)


def _missing_error(missing: Sequence[str], arch: Architecture) -> MissingMetricsError:
    listing = "\n  ".join(missing)
    return MissingMetricsError(
        f"Top-Down needs {len(missing)} metric(s) that the Dataset does not have:\n  {listing}\n"
        f"Collect them with the 'topdown' metric set (e.g. gpuscope.Profiler(metrics='topdown')); "
        f"gpuscope.metrics.topdown.required_metrics('{arch.chips[0]}') lists it.",
        tuple(missing),
    )


def _inputs(ds: xr.Dataset, arch: Architecture) -> dict[str, xr.Variable | float]:
    """Inputs in the module's units: per-SM IPCs, warp efficiency in [0, 1], stall shares in [0, 1]."""
    needed = [m for role in (*_IPC, "stalls") for m in _resolve(arch, role)]
    missing = [m for m in needed if m not in ds.variables]
    if missing:
        raise _missing_error(missing, arch)

    def get(name: str) -> xr.Variable:
        # Variables, not DataArrays: the formulas below broadcast by dim name and skip index alignment, which
        # made up most of the time of a Top-Down on a few ranges (about 1 ms per operation, 250 operations).
        return ds[name].variable.astype(float)  # arithmetic below drops the metric's attrs

    per_sm = float(arch.smsp_per_sm)
    stall_pct = {r: get(m) for r in (*arch.stall_reasons, *arch.optional_stall_reasons) if (m := stall_metric(r)) in ds}
    total = sum(stall_pct.values())
    # No stalled warp at all leaves the split undefined, not zero.
    total = total.where(total > 0)
    v: dict[str, xr.Variable | float] = {
        "ipc_max": arch.ipc_max,
        "ipc_executed": get(IPC_EXECUTED) * per_sm,
        "ipc_issued": get(IPC_ISSUED) * per_sm,
        "warp_efficiency": get(THREADS_PER_INST) / WARP_SIZE,
    }
    v.update({f"share:{r}": pct / total for r, pct in stall_pct.items()})
    return v


def _quality(covered: xr.Variable | None, spread: xr.Variable | None, arch: Architecture, v: dict
             ) -> dict[str, xr.Variable]:
    """Per range, from *covered* (:func:`warp_state_coverage`) and *spread* (:func:`pass_spread`): the collected
    warp states (``warp_state_coverage``), how differently the stall passes ran (``pass_spread``), the lost issue
    slots that the stall nodes cannot place because of either (``topdown_uncertainty``, percent of peak), and
    ``consistent``.

    Every active warp-cycle is in exactly one warp state, so the states of one execution add up to 100%. Shares
    whose counters come from passes that ran differently do not (docs/topdown.md): the stall nodes divide
    ``IPC_MAX - issued IPC`` by shares that are off by about as much as the sum is, or as the passes' warp-active
    cycles differ."""
    if covered is None:
        return {}
    stall = (arch.ipc_max - v["ipc_issued"]).clip(min=0)
    miss = abs(covered - 100.0)
    coverage = covered.copy()
    coverage.attrs = {"units": UNITS, "description": "collected warp states as a share of warp-active cycles "
                      "(100% when every stall share comes from executions that agree)"}
    out = {"warp_state_coverage": coverage}
    off, rule = miss, "|warp_state_coverage - 100%|"
    consistent = miss <= COVERAGE_TOLERANCE
    if spread is not None:
        out["pass_spread"] = spread
        off = xr.Variable(miss.dims, np.fmax(np.asarray(miss), np.nan_to_num(np.asarray(spread), nan=0.0)))
        rule = f"max({rule}, pass_spread)"
        consistent = consistent & ~(spread > SPREAD_TOLERANCE)
    uncertainty = stall * off / arch.ipc_max  # percent of peak, as the nodes: (stall / IPC_MAX * 100) * off / 100
    uncertainty.attrs = {"units": UNITS, "ipc_max": arch.ipc_max, "description": "the share of peak issue slots the "
                         f"stall nodes cannot place: (IPC_MAX - issued IPC) / IPC_MAX * {rule}; "
                         "frontend/backend nodes and their children are uncertain by up to this much"}
    consistent.attrs = {"units": "bool", "description": f"warp_state_coverage within 100 +/- {COVERAGE_TOLERANCE:g}%"
                        + (f" and pass_spread at most {SPREAD_TOLERANCE:g}%" if spread is not None else "")
                        + ": the stall breakdown can be trusted; where False, no verdict is given"}
    out.update(topdown_uncertainty=uncertainty, consistent=consistent)
    return out


def _weight(ds: xr.Dataset) -> dict[str, xr.DataArray]:
    """The ``weight`` coordinate for :func:`aggregate`: the first of :data:`WEIGHT_METRICS` in *ds* (kernel length
    in SM cycles), under a name of its own so that the Top-Down merges with its input (a variable of one cannot be
    a coordinate of the other). None when *ds* has none, or already carries a weight (groups from aggregate)."""
    name = next((n for n in WEIGHT_METRICS if n in ds.data_vars), None)
    if name is None or "weight" in ds.coords:
        return {}
    weight = ds[name].copy()
    weight.attrs = {"units": ds[name].attrs.get("units", "cycle"), "metric": name,
                    "description": f"the range's length ({name}), by which gpuscope.aggregate weights it"}
    return {"weight": weight}


def topdown(ds: xr.Dataset, levels=(1, 2, 3), arch=None, *, check: str = "warn") -> xr.Dataset:
    """Top-Down hierarchy of every range (or sample) of a metrics Dataset.

    Parameters
    ----------
    ds : xarray.Dataset
        Range results (dim ``range``) or PM samples (dim ``time``) holding the ``topdown`` metric set
        (:func:`required_metrics`), one variable per exact CUPTI metric name.
    levels : int or sequence of int
        Levels to return (default all three).
    arch : str, tuple or Architecture, optional
        Compute capability; default ``ds.attrs["compute_capability"]``.
    check : {"warn", "raise", "ignore"}
        What to do when a level does not sum to 100 or a node is negative beyond
        :data:`LEVEL_TOLERANCE` (:func:`check_levels`), and when the collected warp states miss 100% by more
        than :data:`COVERAGE_TOLERANCE` points while an optional stall reason is missing (warn only). Passes that
        disagree raise no warning: the coordinates ``warp_state_coverage`` and ``consistent`` say which ranges
        they touch.

    Returns
    -------
    xarray.Dataset
        One variable per node (``retire``, ``divergence``, ``divergence_branch``, ... ``backend_memory_long_scoreboard``),
        in percent of the SM's peak issue rate (every level sums to 100), with attrs ``level``, ``parent``,
        ``formula`` (the IPC it is a percentage of), ``units``, ``ipc_max``, ``description``. Where ``ds`` has the
        ``selected`` and ``not_selected`` states, three coordinates per range: ``warp_state_coverage`` (%),
        ``topdown_uncertainty`` (percent of peak, as the nodes) and ``consistent`` (bool), see ``docs/topdown.md``.
        The input's dims and coordinates are kept (so the result aligns with ``ds`` and
        ``xr.merge([ds, result], compat="no_conflicts")`` holds both: ``compat`` given, xarray does not warn about
        each coordinate they share); the first weight metric (:data:`WEIGHT_METRICS`) in ``ds`` becomes the
        coordinate ``weight`` (attr ``metric`` names it), which :func:`aggregate` weights by. Dataset attrs: the input's, plus
        ``topdown_ipc_max``, ``topdown_units``, ``topdown_architecture``.

    Raises
    ------
    gpuscope.errors.MissingMetricsError
        ``ds`` lacks metrics the formulas need; the message lists them.
    ValueError
        Unknown compute capability, no ``compute_capability`` attribute and no ``arch``, bad ``levels`` or
        ``check``, or (with ``check="raise"``) levels that do not sum to 100.
    """
    if check not in ("warn", "raise", "ignore"):
        raise ValueError(f"check must be 'warn', 'raise' or 'ignore', got {check!r}")
    wanted = set(_levels(levels))
    table = _arch_of(ds, arch)
    v = _inputs(ds, table)
    percent = FULL_SCALE / table.ipc_max
    out = {}
    # All levels are computed so that the level sums can be checked; only the wanted ones are returned.
    for node in NODES:
        if any(r.startswith("stall:") and f"share:{r[6:]}" not in v for r in node.requires):
            continue  # an optional stall reason the Dataset does not have
        da = node.formula(v) * percent
        da.attrs = {
            "level": node.level,
            "parent": node.parent,
            "formula": node.expression,
            "units": UNITS,
            "ipc_max": table.ipc_max,
            "description": node.description,
        }
        out[node.name] = da
    covered = warp_state_coverage(ds, table)
    coords = _quality(covered, pass_spread(ds), table, v)  # coordinates: data_vars stay the nodes
    absent = [stall_metric(r) for r in table.optional_stall_reasons if stall_metric(r) not in ds]
    coords.update(verdict_coordinates(out, coords, absent))
    coords.update(_weight(ds))
    result = xr.Dataset(out, coords=ds.coords).assign_coords(coords)
    result.attrs = {
        **ds.attrs,
        "topdown_ipc_max": table.ipc_max,
        "topdown_units": UNITS,
        "topdown_architecture": table.name,
    }
    if check != "ignore":
        _check_coverage(ds, table, COVERAGE_TOLERANCE, covered)
        check_levels(result, on_error=check)
    return result.drop_vars([n for n in out if n in _BY_NAME and _BY_NAME[n].level not in wanted])
