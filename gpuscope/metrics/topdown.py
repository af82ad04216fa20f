"""Top-Down analysis of NVIDIA GPU kernels, levels 1-3 (Saiz et al., ``seeds/topdown-paper-saiz-et-al.txt``).

Units
-----
Every node is an IPC in **warp instructions per active cycle per SM**. ``IPC_MAX`` is the number of dispatch
units (warp schedulers, one per SM sub-partition) per SM, which is 4 on every architecture from CC 7.0 to 12.x.
The paper's metrics (Tables II and IV) are per-SMSP averages (``smsp__*.avg.per_cycle_active``, at most 1 each);
the paper nonetheless defines IPC_MAX per SM. We multiply the per-SMSP averages by the SMSPs per SM so that both
sides are per SM, which also matches ncu's "IPC" (``sm__inst_executed.avg.per_cycle_active``). Each node has attrs
``level``, ``parent``, ``formula``, ``units`` and ``ipc_max``; divide by ``ipc_max`` for a fraction of peak.

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
  stated intent and makes every level sum to ``IPC_MAX`` exactly.

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
``IPC_MAX`` (:func:`check_levels`).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np
import xarray as xr

from gpuscope._util import validate as _validate
from gpuscope.errors import GpuscopeWarning, MissingMetricsError
from gpuscope.metrics.architectures import (ARCHITECTURES, IPC_EXECUTED, IPC_ISSUED, NOT_STALLS, STALL_PARENT, SUB_REASONS,
                            THREADS_PER_INST, Architecture, architecture, stall_metric)

__all__ = [
    "ARCHITECTURES",
    "COVERAGE_TOLERANCE",
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
UNITS = "warp inst/cycle/SM"

#: Percentage points by which the collected warp states may miss (or exceed) 100% before gpuscope warns.
#: Values from different replay passes do not add up exactly, so this cannot be tight.
COVERAGE_TOLERANCE = 5.0

#: Fraction of IPC_MAX by which a level cut may miss IPC_MAX, or a node may go below zero, before
#: :func:`check_levels` complains. Replay (issued - executed) is a small difference of numbers from different
#: passes, so it can come out slightly negative.
LEVEL_TOLERANCE = 0.02

#: Metrics that weight ranges in :func:`aggregate`, first found wins; kernel length in cycles, as the paper does.
WEIGHT_METRICS = ("sm__cycles_elapsed.max", "sm__cycles_elapsed.avg", "sm__cycles_elapsed.sum")

# ---------------------------------------------------------------------------------------------------------------
# The hierarchy, as data

Inputs = Mapping[str, "xr.Variable | float"]


@dataclasses.dataclass(frozen=True)
class Node:
    """One node of the hierarchy.

    Attributes
    ----------
    name, parent : str
        Node name and its parent's name (``""`` for level 1).
    level : int
        1, 2 or 3.
    requires : tuple of str
        Input roles: ``ipc_executed``, ``threads_per_inst``, ``ipc_issued``, ``stalls`` (all stall reasons of
        the architecture, for the shares) and ``stall:<reason>``.
    formula : callable
        Pure function of the prepared inputs (see :func:`_inputs`: ``xarray.Variable`` objects) returning a
        Variable.
    expression : str
        The formula as text, stored in the node's ``formula`` attribute.
    description : str
        What the node means and what to do when it is large.
    """

    name: str
    parent: str
    level: int
    requires: tuple[str, ...]
    formula: Callable[[Inputs], xr.Variable]
    expression: str
    description: str


def _retire(v: Inputs) -> xr.Variable:
    return v["ipc_executed"] * v["warp_efficiency"]


def _branch(v: Inputs) -> xr.Variable:
    return v["ipc_executed"] * (1.0 - v["warp_efficiency"])


def _replay(v: Inputs) -> xr.Variable:
    return v["ipc_issued"] - v["ipc_executed"]


def _divergence(v: Inputs) -> xr.Variable:
    return _branch(v) + _replay(v)


def _stall(v: Inputs) -> xr.Variable:
    return v["ipc_max"] - _divergence(v) - _retire(v)


def _stall_part(reasons: Sequence[str]) -> Callable[[Inputs], xr.Variable]:
    """STALL times the summed shares of ``reasons`` (those the Dataset has; optional ones may be absent)."""

    def formula(v: Inputs) -> xr.Variable:
        return _stall(v) * sum(v[f"share:{r}"] for r in reasons if f"share:{r}" in v)

    return formula


def _reasons_under(node: str) -> tuple[str, ...]:
    return tuple(r for r, parent in STALL_PARENT.items() if parent == node or parent.startswith(node + "_"))


_IPC = ("ipc_executed", "threads_per_inst", "ipc_issued")
_STALL_TEXT = "(IPC_MAX - IPC_ISSUED) * sum(share of {})"

_STALL_NODE_TEXT = {
    "frontend": (
        1,
        "",
        "Warps could not issue because no instruction was ready to go: fetch, synchronisation, dispatch. "
        "Look at the level-2 split.",
    ),
    "backend": (
        1,
        "",
        "Warps could not issue because an operand or an execution resource was not ready. The usual bottleneck; "
        "look at core vs memory.",
    ),
    "frontend_fetch": (
        2,
        "frontend",
        "No instruction fetched, or the warp waits at a barrier, memory barrier, branch or sleep. Large for very "
        "short kernels (less than a wave), big jumps in code, unbalanced work before __syncthreads().",
    ),
    "frontend_decode": (
        2,
        "frontend",
        "Dispatch conflicts and miscellaneous hardware stalls (register bank conflicts). Rarely actionable "
        "beyond changing the instruction mix.",
    ),
    "backend_core": (
        2,
        "backend",
        "An execution pipe is oversubscribed (math_pipe_throttle), a fixed-latency dependency (wait) or a "
        "warpgroup MMA (gmma). Balance the instruction mix, add independent work (ILP), raise occupancy.",
    ),
    "backend_memory": (
        2,
        "backend",
        "Waiting on the memory system: L1TEX/global data (long_scoreboard), shared memory/MIO (short_scoreboard, "
        "mio_throttle), queues (lg/tex throttle), constant cache (imc_miss). Improve locality and coalescing, use "
        "shared memory, issue fewer and wider accesses.",
    ),
}

_REASON_TEXT = {
    "no_instruction": "waiting to be selected to fetch an instruction or on an instruction cache miss",
    "barrier": "waiting for sibling warps at a CTA barrier",
    "membar": "waiting on a memory barrier",
    "branch_resolving": "waiting for a branch target to be computed",
    "sleeping": "all threads blocked, yielded or sleeping",
    "misc": "miscellaneous hardware reason",
    "dispatch_stall": "the dispatcher held the warp back",
    "math_pipe_throttle": "waiting for an oversubscribed execution pipe",
    "wait": "fixed-latency execution dependency",
    "gmma": "waiting on a warpgroup MMA (Hopper tensor cores)",
    "long_scoreboard": "waiting for L1TEX data (global, local, surface, texture)",
    "imc_miss": "immediate constant cache miss",
    "mio_throttle": "MIO instruction queue full (shared memory, special math, dynamic branches)",
    "drain": "after EXIT, waiting for memory writes to drain",
    "lg_throttle": "local/global instruction queue full",
    "short_scoreboard": "waiting for MIO data (mostly shared memory)",
    "tex_throttle": "texture instruction queue full",
}


def _build_nodes() -> tuple[Node, ...]:
    nodes = [
        Node(
            "retire",
            "",
            1,
            ("ipc_executed", "threads_per_inst"),
            _retire,
            "IPC_EXECUTED * WARP_EFFICIENCY",
            "Useful work: instructions executed, weighted by the fraction of active threads. Higher is better.",
        ),
        Node(
            "divergence",
            "",
            1,
            _IPC,
            _divergence,
            "divergence_branch + divergence_replay",
            "Issue slots spent on inactive threads or re-issued instructions.",
        ),
        Node(
            "divergence_branch",
            "divergence",
            2,
            ("ipc_executed", "threads_per_inst"),
            _branch,
            "IPC_EXECUTED * (1 - WARP_EFFICIENCY)",
            "Threads of a warp idle because of divergent branches or partial warps. Make branches uniform per warp, "
            "sort work so that neighbouring threads take the same path, use block sizes that are multiples of 32.",
        ),
        Node(
            "divergence_replay",
            "divergence",
            2,
            ("ipc_executed", "ipc_issued"),
            _replay,
            "IPC_ISSUED - IPC_EXECUTED",
            "Instructions issued more than once (e.g. bank conflicts, too few functional units). Near zero on most "
            "kernels; may come out slightly negative, being a difference of numbers from different passes.",
        ),
    ]
    for name, (level, parent, text) in _STALL_NODE_TEXT.items():
        reasons = _reasons_under(name)
        nodes.append(
            Node(name, parent, level, (*_IPC, "stalls"), _stall_part(reasons), _STALL_TEXT.format(reasons), text)
        )
    for reason, parent in STALL_PARENT.items():
        nodes.append(
            Node(
                f"{parent}_{reason}",
                parent,
                3,
                (*_IPC, "stalls", f"stall:{reason}"),
                _stall_part((reason,)),
                f"(IPC_MAX - IPC_ISSUED) * share of {reason}",
                f"Stall reason {reason}: {_REASON_TEXT[reason]}.",
            )
        )
    return tuple(sorted(nodes, key=lambda n: n.level))


#: Every node, level 1 first. Level-3 nodes are ``<level-2 parent>_<stall reason>``.
NODES: tuple[Node, ...] = _build_nodes()
_BY_NAME = {n.name: n for n in NODES}


def level_cut(level: int, names: Iterable[str] | None = None) -> list[str]:
    """Nodes that together make up ``IPC_MAX`` at ``level``: its nodes plus the leaves of shallower levels.

    Parameters
    ----------
    level : int
        1, 2 or 3.
    names : iterable of str, optional
        Only consider these nodes (e.g. the variables of a Top-Down Dataset); default all of :data:`NODES`.

    Returns
    -------
    list of str
    """
    names = set(_BY_NAME) if names is None else set(names)
    parents = {_BY_NAME[n].parent for n in names if n in _BY_NAME}
    return [
        n.name
        for n in NODES
        if n.name in names and (n.level == level or (n.level < level and n.name not in parents))
    ]


# ---------------------------------------------------------------------------------------------------------------
# Metric sets


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


def _check_coverage(ds: xr.Dataset, arch: Architecture, tolerance: float) -> None:
    """Warn when the collected warp states do not add up to ~100% of warp-active cycles."""
    if not all(stall_metric(r) in ds for r in NOT_STALLS):
        return
    reasons = (*arch.stall_reasons, *arch.optional_stall_reasons, *NOT_STALLS)
    present = [stall_metric(r) for r in reasons if stall_metric(r) in ds]
    covered = sum(ds[m].astype(float) for m in present)
    worst = float(np.nanmax(np.abs(np.asarray(covered) - 100.0), initial=0.0))
    if worst > tolerance:
        absent = [stall_metric(r) for r in arch.optional_stall_reasons if stall_metric(r) not in ds]
        hint = f" Collect {', '.join(absent)} too (required_metrics(..., optional=True))." if absent else ""
        warnings.warn(
            f"The collected warp states cover {float(np.nanmin(covered)):.1f}-{float(np.nanmax(covered)):.1f}% "
            f"of warp-active cycles, not 100% (tolerance {tolerance} points): stall reasons that were not "
            f"collected, or passes that disagree, make the frontend/backend split approximate.{hint}",
            GpuscopeWarning,
            stacklevel=3,
        )


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
        What to do when a level does not sum to ``IPC_MAX`` or a node is negative beyond
        :data:`LEVEL_TOLERANCE` (:func:`check_levels`), and when the collected warp states miss 100% by more
        than :data:`COVERAGE_TOLERANCE` points (warn only).

    Returns
    -------
    xarray.Dataset
        One variable per node (``retire``, ``divergence``, ``divergence_branch``, ... ``backend_memory_long_scoreboard``),
        in warp instructions per active cycle per SM, with attrs ``level``, ``parent``, ``formula``, ``units``,
        ``ipc_max``, ``description``. The input's dims and coordinates are kept; weight metrics
        (:data:`WEIGHT_METRICS`) present in ``ds`` become coordinates so that :func:`aggregate` finds them. Dataset
        attrs: the input's, plus ``topdown_ipc_max``, ``topdown_units``, ``topdown_architecture``.

    Raises
    ------
    gpuscope.errors.MissingMetricsError
        ``ds`` lacks metrics the formulas need; the message lists them.
    ValueError
        Unknown compute capability, no ``compute_capability`` attribute and no ``arch``, bad ``levels`` or
        ``check``, or (with ``check="raise"``) levels that do not sum to ``IPC_MAX``.
    """
    if check not in ("warn", "raise", "ignore"):
        raise ValueError(f"check must be 'warn', 'raise' or 'ignore', got {check!r}")
    wanted = set(_levels(levels))
    table = _arch_of(ds, arch)
    v = _inputs(ds, table)
    out = {}
    # All levels are computed so that the level sums can be checked; only the wanted ones are returned.
    for node in NODES:
        if any(r.startswith("stall:") and f"share:{r[6:]}" not in v for r in node.requires):
            continue  # an optional stall reason the Dataset does not have
        da = node.formula(v)
        da.attrs = {
            "level": node.level,
            "parent": node.parent,
            "formula": node.expression,
            "units": UNITS,
            "ipc_max": table.ipc_max,
            "description": node.description,
        }
        out[node.name] = da
    coords = {name: ds[name] for name in WEIGHT_METRICS if name in ds.data_vars}
    result = xr.Dataset(out, coords=ds.coords).assign_coords(coords)
    result.attrs = {
        **ds.attrs,
        "topdown_ipc_max": table.ipc_max,
        "topdown_units": UNITS,
        "topdown_architecture": table.name,
    }
    if check != "ignore":
        _check_coverage(ds, table, COVERAGE_TOLERANCE)
        check_levels(result, on_error=check)
    return result.drop_vars([n for n in out if _BY_NAME[n].level not in wanted])


def check_levels(td: xr.Dataset, tolerance: float = LEVEL_TOLERANCE, on_error: str = "raise") -> dict[int, float]:
    """Check that every level cut of a Top-Down Dataset sums to ``IPC_MAX`` and no node is negative.

    Parameters
    ----------
    td : xarray.Dataset
        Output of :func:`topdown` (or :func:`aggregate` of it).
    tolerance : float
        Allowed error as a fraction of ``IPC_MAX``.
    on_error : {"raise", "warn"}
        Raise ``ValueError`` or emit a :class:`~gpuscope.errors.GpuscopeWarning`.

    Returns
    -------
    dict
        Level -> largest absolute deviation of its cut from ``IPC_MAX`` (NaN entries are ignored).

    Raises
    ------
    ValueError
        With ``on_error="raise"``, when a check fails; or when ``td`` has no Top-Down nodes.
    """
    names = [n for n in td.data_vars if n in _BY_NAME]
    if not names:
        raise ValueError("not a Top-Down Dataset: none of its variables is a Top-Down node")
    ipc_max = float(td.attrs.get("topdown_ipc_max", td[names[0]].attrs.get("ipc_max", 4.0)))
    limit = tolerance * ipc_max
    deviations, problems = {}, []
    for level in sorted({_BY_NAME[n].level for n in names}):
        cut = level_cut(level, names)
        total = sum(td[n] for n in cut)
        dev = float(np.nanmax(np.abs(np.asarray(total) - ipc_max), initial=0.0))
        deviations[level] = dev
        if dev > limit:
            problems.append(f"level {level} ({' + '.join(cut)}) misses IPC_MAX={ipc_max:g} by up to {dev:.3g}")
    for n in names:
        low = float(np.nanmin(np.asarray(td[n]), initial=0.0))
        if low < -limit:
            problems.append(f"{n} goes down to {low:.3g}")
    if problems:
        text = (
            "Top-Down consistency check failed (tolerance "
            f"{tolerance:.0%} of IPC_MAX): " + "; ".join(problems) + ". The input metrics disagree with each "
            "other (different passes or ranges combined?)."
        )
        if on_error == "raise":
            raise ValueError(text)
        warnings.warn(text, GpuscopeWarning, stacklevel=3)
    return deviations


# ---------------------------------------------------------------------------------------------------------------
# Aggregation and dynamic analysis


def _weights(ds: xr.Dataset, weight, dim: str) -> xr.Variable:
    if isinstance(weight, xr.DataArray):
        return weight
    names = WEIGHT_METRICS if weight is None else (weight,)
    for name in names:
        if name in ds.variables:
            return ds[name].astype(float)
    if weight is None and "start_ns" in ds.coords and "end_ns" in ds.coords:
        return (ds["end_ns"] - ds["start_ns"]).astype(float)
    raise MissingMetricsError(
        f"no weight for aggregating over {dim!r}: the Dataset has none of {', '.join(names)}"
        + (" and no start_ns/end_ns coordinates" if weight is None else "")
        + ". Collect sm__cycles_elapsed.max with the metrics, or pass weight=<DataArray>.",
        tuple(names),
    )


def _check_weight(ds: xr.Dataset, weight, dim: str) -> None:
    """Refuse a weight that would average silently wrong: an array without dims, a name that is not there."""
    along = [str(n) for n in (*ds.data_vars, *ds.coords) if dim in ds[n].dims and np.issubdtype(ds[n].dtype, np.number)]
    allowed = f"None, the name of a variable or coordinate along {dim!r} (e.g. {along[:3]}), or a DataArray along {dim!r}"
    if weight is None:
        return
    if isinstance(weight, xr.DataArray):
        if dim not in weight.dims or weight.sizes[dim] != ds.sizes.get(dim):
            raise ValueError(f"weight must be {allowed} with {ds.sizes.get(dim)} values; got a DataArray with sizes "
                             f"{dict(weight.sizes)}.")
        return
    if not isinstance(weight, str):
        hint = f" (wrap an array: xr.DataArray(values, dims={dim!r}))" if isinstance(weight, (np.ndarray, list)) else ""
        raise TypeError(f"weight must be {allowed}{hint}; got {type(weight).__name__}.")
    if weight not in ds.variables:
        raise ValueError(f"weight must be {allowed}; got {weight!r}, which is not in the Dataset.")


def aggregate(ds: xr.Dataset, by: str | None = "kernel", weight=None, dim: str = "range") -> xr.Dataset:
    """Length-weighted mean over ranges, per group: the paper's per-kernel (or whole-run) Top-Down.

    Aggregate the Top-Down Dataset, not the raw metrics: node values are linear in the weights, so the
    weighted means still sum to ``IPC_MAX``; products like ``R * W`` of averaged metrics would not be the
    averages of the products.

    Parameters
    ----------
    ds : xarray.Dataset
        Usually the output of :func:`topdown` on range results.
    by : str or None
        Coordinate along ``dim`` to group by (``"kernel"`` for auto ranges, ``"name"`` for user ranges);
        None averages everything into one value.
    weight : str or xarray.DataArray, optional
        Variable or coordinate name, or values along ``dim``. Default: the first of :data:`WEIGHT_METRICS`
        present (kernel length in SM cycles, as the paper weights), else the range duration ``end_ns - start_ns``.
    dim : str
        The dimension to aggregate over.

    Returns
    -------
    xarray.Dataset
        The data variables averaged, with dim ``by`` (or none); variable and Dataset attrs kept; coordinates
        ``weight`` (summed weight) and ``count`` (ranges) per group.

    Raises
    ------
    TypeError
        ``ds`` is not a Dataset; ``weight`` is neither a name nor a DataArray (wrap a numpy array:
        ``xr.DataArray(values, dims="range")``).
    ValueError
        ``dim`` or ``by`` not in ``ds``; ``weight`` names nothing in ``ds`` or is a DataArray not along ``dim``.
    gpuscope.errors.MissingMetricsError
        No weight can be found.
    """
    ds = _validate.dataset(ds, "ds")
    _check_weight(ds, weight, dim)
    if dim not in ds.dims:
        raise ValueError(f"the Dataset has no dimension {dim!r} (dims: {list(ds.dims)})")
    if by is not None and by not in ds.coords:
        raise ValueError(f"no coordinate {by!r} to group by; coordinates: {list(ds.coords)}")
    w = _weights(ds, weight, dim)
    # per-range coords (and axes such as the launch shape's 'xyz' that only they use) do not survive averaging
    data = ds.drop_vars([c for c in ds.coords if c != by])
    weighted = data * w
    if by is None:
        total, wsum, count = weighted.sum(dim), w.sum(dim), ds.sizes[dim]
    else:
        total = weighted.groupby(by).sum(dim)
        wsum = w.drop_vars([c for c in w.coords if c != by]).assign_coords({by: ds[by]}).groupby(by).sum(dim)
        count = ds[by].groupby(ds[by]).count()
    out = (total / wsum).assign_coords(weight=wsum, count=count)
    for name in out.data_vars:
        out[name].attrs = ds[name].attrs
    out.attrs = dict(ds.attrs)
    return out
