"""Top-Down tables per architecture family: which warp stall reasons each chip has and where each one goes.

Pure data and lookups, no CUPTI. The stall lists were read from CUPTI's host API (``smsp__warp_issue_stalled_*``
base metrics of every chip CUPTI 13.1 lists, and of GV100 under CUPTI 12.x); ``tests/unit/test_support_matrix.py``
re-reads them from the installed CUPTI and fails when a chip has a reason that no node takes, or a table expects
a reason the chip lacks. ``docs/support.md`` prints these tables.

Every architecture from Volta to Blackwell has four warp schedulers per SM (one per SM sub-partition, SMSP), each
issuing at most one warp instruction per cycle, so ``IPC_MAX = 4`` warp instructions per cycle per SM everywhere
(NVIDIA's architecture whitepapers; the host API does not expose the scheduler count).
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping

from gpuscope.errors import UnsupportedChipError

__all__ = [
    "ARCHITECTURES",
    "NOT_STALLS",
    "STALL_PARENT",
    "SUB_REASONS",
    "Architecture",
    "UnknownChipError",
    "architecture",
    "for_chip",
    "stall_metric",
]

#: Level-2 Top-Down node that each warp stall reason is charged to (paper Tables VI and VIII, with ``wait`` under
#: core as the paper's tool does, and the reasons newer than the paper placed by what the hardware waits for).
STALL_PARENT: Mapping[str, str] = {
    "no_instruction": "frontend_fetch",
    "barrier": "frontend_fetch",
    "membar": "frontend_fetch",
    "branch_resolving": "frontend_fetch",
    "sleeping": "frontend_fetch",  # CC 7.0+: not in the paper (which stops at CC 7.2's table), a fetch-side wait
    "misc": "frontend_decode",
    "dispatch_stall": "frontend_decode",
    "math_pipe_throttle": "backend_core",
    "wait": "backend_core",
    "gmma": "backend_core",  # Hopper only: warpgroup MMA in flight on the tensor cores
    "long_scoreboard": "backend_memory",
    "imc_miss": "backend_memory",  # Volta to Hopper; Blackwell has no such counter
    "mio_throttle": "backend_memory",
    "drain": "backend_memory",
    "lg_throttle": "backend_memory",  # CC 7.0+: not in the paper's table, the local/global queue in front of L1TEX
    "short_scoreboard": "backend_memory",
    "tex_throttle": "backend_memory",
}

#: Warp states that are not stalls (the warp issued, or could have); collected only for the coverage check.
NOT_STALLS = ("selected", "not_selected")

#: Stall reasons that are a *part* of another reason (one pipe's share of it), listed by some chips. They are not
#: added to the shares, which would count their cycles twice: their cycles are already in the parent reason's
#: level-3 node (``backend_memory_long_scoreboard``, ``backend_memory_mio_throttle``).
SUB_REASONS: Mapping[str, str] = {
    "long_scoreboard_pipe_l1tex": "long_scoreboard",
    "mio_throttle_pipe_mio": "mio_throttle",
}

IPC_EXECUTED = "smsp__inst_executed.avg.per_cycle_active"
IPC_ISSUED = "smsp__inst_issued.avg.per_cycle_active"
THREADS_PER_INST = "smsp__thread_inst_executed_per_inst_executed.ratio"

# in STALL_PARENT's (the paper's) order, which required_metrics keeps
_WITH_IMC = tuple(r for r in STALL_PARENT if r != "gmma")
_COMMON = tuple(r for r in _WITH_IMC if r != "imc_miss")


def stall_metric(reason: str) -> str:
    """The CUPTI metric for a warp stall reason, in percent of warp-active cycles."""
    return f"smsp__warp_issue_stalled_{reason}_per_warp_active.pct"


class UnknownChipError(UnsupportedChipError):
    """No Top-Down table covers this chip or compute capability (a ``ValueError`` and a ``GpuscopeError``)."""


@dataclasses.dataclass(frozen=True)
class Architecture:
    """The Top-Down table of one architecture family.

    Attributes
    ----------
    name : str
        Family, e.g. ``"Ampere GA10x"``.
    chips : tuple of str
        CUPTI chip names of the family.
    compute_capabilities : tuple of (int, int)
        Compute capabilities of those chips.
    stall_reasons : tuple of str
        Stall reasons every chip of the family lists; the ``topdown`` set collects them and each feeds its node.
    optional_stall_reasons : tuple of str
        Stall reasons charged to the hierarchy when a Dataset has them, not part of the ``topdown`` set (``gmma``
        on Hopper: one more pass).
    sub_reasons : tuple of str
        Parts of another reason (:data:`SUB_REASONS`) that chips of the family list; not collected.
    smsp_per_sm : int
        Warp schedulers (SM sub-partitions) per SM, each issuing one warp instruction per cycle: ``IPC_MAX``.
    shared_memory_kib : tuple of int
        The shared-memory sizes (KiB per SM) the driver can configure an SM's unified L1/shared memory with for a
        launch, smallest first (the CUDA C++ Programming Guide, per compute capability); the occupancy's
        shared-memory block limit is counted against the one it picks.
    tegra : bool
        An integrated (Jetson / DRIVE / DGX Spark class) part: its memory counters are the memory controller's
        (``mcc__*``) or absent, it has no PCIe counters.
    source : str
        Where the table comes from.
    """

    name: str
    chips: tuple[str, ...]
    compute_capabilities: tuple[tuple[int, int], ...]
    stall_reasons: tuple[str, ...]
    optional_stall_reasons: tuple[str, ...] = ()
    sub_reasons: tuple[str, ...] = ()
    smsp_per_sm: int = 4
    shared_memory_kib: tuple[int, ...] = ()
    tegra: bool = False
    source: str = "smsp__warp_issue_stalled_* metrics of the host API, CUPTI 13.1"

    @property
    def ipc_max(self) -> float:
        """Warp instructions per cycle per SM at most: one per scheduler."""
        return float(self.smsp_per_sm)

    @property
    def cc_min(self) -> tuple[int, int]:
        return min(self.compute_capabilities)

    @property
    def cc_max(self) -> tuple[int, int]:
        return max(self.compute_capabilities)

    @property
    def cc_text(self) -> str:
        return ", ".join(f"{a}.{b}" for a, b in self.compute_capabilities)

    @property
    def metrics(self) -> dict[str, str]:
        """Role -> metric name for every input the ``topdown`` set collects on this family."""
        roles = {"ipc_executed": IPC_EXECUTED, "threads_per_inst": THREADS_PER_INST, "ipc_issued": IPC_ISSUED}
        roles.update({f"stall:{r}": stall_metric(r) for r in self.stall_reasons + NOT_STALLS})
        return roles

    @property
    def optional_metrics(self) -> dict[str, str]:
        return {f"stall:{r}": stall_metric(r) for r in self.optional_stall_reasons}

    def node_of(self, reason: str) -> str | None:
        """The level-3 node that takes a stall reason on this family (None for ``selected``/``not_selected``)."""
        if reason in NOT_STALLS:
            return None
        parent = SUB_REASONS.get(reason, reason)
        if parent not in (*self.stall_reasons, *self.optional_stall_reasons) or (
                reason in SUB_REASONS and reason not in self.sub_reasons):
            raise KeyError(f"{reason!r} is not a stall reason of {self.name}")
        return f"{STALL_PARENT[parent]}_{parent}"


# The shared-memory sizes an SM can be configured with, KiB (CUDA C++ Programming Guide, compute capabilities)
_VOLTA_SMEM = (0, 8, 16, 32, 64, 96)
_SMEM_100 = (0, 8, 16, 32, 64, 100)  # CC 8.6, 8.9, 12.x
_SMEM_164 = (*_SMEM_100, 132, 164)  # CC 8.0, 8.7
_SMEM_228 = (*_SMEM_164, 196, 228)  # CC 9.0, 10.x, 11.0

#: The tables, oldest first. Within a family the stall reasons are the same on every chip; only the
#: sub-reasons (parts of another reason) differ, and they are not collected.
ARCHITECTURES: tuple[Architecture, ...] = (
    Architecture("Volta", ("GV100", "GV11B"), ((7, 0), (7, 2)), _WITH_IMC, shared_memory_kib=_VOLTA_SMEM,
                 source="host API of CUPTI 12.6-12.9 (CUDA 13 dropped Volta; CUPTI lists GV11B, Xavier, but cannot "
                        "profile it)"),
    Architecture("Turing", ("TU102", "TU104", "TU106", "TU116", "TU117"), ((7, 5),), _WITH_IMC,
                 shared_memory_kib=(32, 64), sub_reasons=("mio_throttle_pipe_mio",)),
    Architecture("Ampere GA100", ("GA100",), ((8, 0),), _WITH_IMC, shared_memory_kib=_SMEM_164),
    Architecture("Ampere GA10x", ("GA102", "GA103", "GA104", "GA106", "GA107"), ((8, 6),), _WITH_IMC,
                 shared_memory_kib=_SMEM_100, sub_reasons=("long_scoreboard_pipe_l1tex", "mio_throttle_pipe_mio")),
    Architecture("Ampere Tegra (Orin)", ("GA10B",), ((8, 7),), _WITH_IMC, shared_memory_kib=_SMEM_164,
                 sub_reasons=("long_scoreboard_pipe_l1tex", "mio_throttle_pipe_mio"), tegra=True),
    Architecture("Ada", ("AD102", "AD103", "AD104", "AD106", "AD107"), ((8, 9),), _WITH_IMC,
                 shared_memory_kib=_SMEM_100, sub_reasons=("long_scoreboard_pipe_l1tex", "mio_throttle_pipe_mio")),
    Architecture("Hopper", ("GH100",), ((9, 0),), _WITH_IMC, optional_stall_reasons=("gmma",),
                 shared_memory_kib=_SMEM_228,
                 source="host API of CUPTI 13.1; verified on H100 and H200 hardware against Nsight Compute"),
    Architecture("Blackwell GB10x", ("GB100", "GB102", "GB110", "GB112"), ((10, 0), (10, 3)), _COMMON,
                 shared_memory_kib=_SMEM_228),
    Architecture("Blackwell Tegra (Thor)", ("GB10B",), ((11, 0), (10, 1)), _COMMON, shared_memory_kib=_SMEM_228,
                 tegra=True),
    Architecture("Blackwell GB20x", ("GB202", "GB203", "GB205", "GB206", "GB207"), ((12, 0),), _COMMON,
                 shared_memory_kib=_SMEM_100, sub_reasons=("long_scoreboard_pipe_l1tex", "mio_throttle_pipe_mio")),
    Architecture("Blackwell Tegra (GB20B, GB20C)", ("GB20B", "GB20C"), ((12, 1),), _COMMON,
                 shared_memory_kib=_SMEM_100, sub_reasons=("long_scoreboard_pipe_l1tex", "mio_throttle_pipe_mio"),
                 tegra=True),
)

_BY_CHIP = {chip: arch for arch in ARCHITECTURES for chip in arch.chips}
_BY_CC = {cc: arch for arch in ARCHITECTURES for cc in arch.compute_capabilities}


def _parse_cc(cc) -> tuple[int, int]:
    if isinstance(cc, tuple | list) and len(cc) == 2:
        return int(cc[0]), int(cc[1])
    text = str(cc).strip()
    major, _, minor = text.partition(".")
    try:
        return int(major), int(minor or 0)
    except ValueError:
        raise UnknownChipError(
            f"{cc!r} is neither a compute capability ('9.0', (9, 0)) nor a chip with a Top-Down table "
            f"({', '.join(_BY_CHIP)})") from None


def for_chip(chip: str) -> Architecture:
    """The Top-Down table of a CUPTI chip name (``"GH100"``, any case).

    Raises
    ------
    UnknownChipError
        No table covers the chip; the message names the close matches and what to do.
    """
    for known, arch in _BY_CHIP.items():
        if known.lower() == str(chip).strip().lower():
            return arch
    close = difflib.get_close_matches(str(chip).upper(), _BY_CHIP, n=3, cutoff=0.5)
    raise UnknownChipError(
        f"No Top-Down table for chip {chip!r}" + (f" (closest: {', '.join(close)})" if close else "")
        + f". Tables cover {', '.join(_BY_CHIP)}. A newer chip than this gpuscope knows: pass "
        "arch='<compute capability>' to gpuscope.topdown, or upgrade gpuscope.")


def architecture(chip_or_cc) -> Architecture:
    """The Top-Down table for a chip name or a compute capability.

    Parameters
    ----------
    chip_or_cc : str, tuple, float or Architecture
        ``"GB202"``, ``"9.0"``, ``(9, 0)``, ``9.0``; an :class:`Architecture` is returned as is.

    Raises
    ------
    UnknownChipError
        (a ``ValueError``) Malformed, or no table covers it (CUPTI's profiling API needs CC 7.0 or newer, and
        CUDA 13's CUPTI 7.5 or newer).
    """
    if isinstance(chip_or_cc, Architecture):
        return chip_or_cc
    if isinstance(chip_or_cc, str) and chip_or_cc.strip()[:1].isalpha():
        return for_chip(chip_or_cc)
    cc = _parse_cc(chip_or_cc)
    if cc in _BY_CC:
        return _BY_CC[cc]
    raise UnknownChipError(
        f"No Top-Down table for compute capability {cc[0]}.{cc[1]}; tables cover "
        + ", ".join(f"{a.cc_text} ({a.name})" for a in ARCHITECTURES)
        + ". CUPTI's profiling API needs CC 7.0 or newer (7.5 or newer with CUDA 13).")
