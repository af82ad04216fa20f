"""The Top-Down hierarchy as data: every node with its parent, level, inputs, formula and description.

The formulas and units are explained in :mod:`gpuscope.metrics.topdown`, which computes them; level-3 nodes are
``<level-2 parent>_<stall reason>``, one per reason of :data:`~gpuscope.metrics.architectures.STALL_PARENT`. The
formulas give IPCs, as in the paper; a node's value is that IPC in percent of ``IPC_MAX``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence

import xarray as xr

from gpuscope.metrics.architectures import STALL_PARENT

__all__ = ["FULL_SCALE", "NODES", "UNITS", "Node", "level_cut"]

#: The unit of every node: percent of the SM's peak issue rate (``IPC_MAX`` warp instructions per cycle), the
#: convention of every table and file gpuscope writes (docs/report.md#units). ``value * ipc_max / 100`` is the IPC.
UNITS = "percent"
#: What every level's cut sums to.
FULL_SCALE = 100.0

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
    """Nodes that together make up the whole (100% of ``IPC_MAX``) at ``level``: its nodes plus the leaves of
    shallower levels.

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
