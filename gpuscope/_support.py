"""What gpuscope supports on a chip: its Top-Down family, each built-in set as the chip collects it, and what was
verified on hardware (``gpuscope metrics --chip X --support``, ``gpuscope check``, ``docs/support.md``).

Works offline: everything but the hardware column comes from the loaded CUPTI's host API.
"""

from __future__ import annotations

import dataclasses

from . import _catalog
from .errors import UnsupportedChipError
from .metrics import architectures

__all__ = ["HARDWARE_VERIFIED", "SetSupport", "ChipSupport", "chip_support", "format_support"]

#: Chips gpuscope was run on, and what was checked there. Every other chip was checked offline only (host API).
HARDWARE_VERIFIED = {
    "GH100": "H100 80GB HBM3 and H200 (CUPTI 13.0): GPU test suite, every set collected, Top-Down against "
             "Nsight Compute",
}


@dataclasses.dataclass(frozen=True)
class SetSupport:
    """One built-in set on one chip."""

    name: str
    kind: str
    metrics: tuple[str, ...]
    substituted: dict
    left_out: tuple[str, ...]
    passes: int | None  # None: the chip cannot be profiled for this kind by the loaded CUPTI
    error: str = ""

    @property
    def status(self) -> str:
        if self.error:
            return "unsupported"
        return "complete" if not self.substituted and not self.left_out else "reduced"


@dataclasses.dataclass(frozen=True)
class ChipSupport:
    """A chip as gpuscope supports it with the loaded CUPTI."""

    chip: str
    cupti: str
    family: str
    compute_capabilities: str
    schedulers_per_sm: int | None
    ipc_max: float | None
    stall_reasons: tuple[str, ...]
    sets: tuple[SetSupport, ...]
    hardware: str  # what was verified on this chip's hardware, "" if only offline

    def as_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["sets"] = [{**dataclasses.asdict(s), "status": s.status} for s in self.sets]
        out["verified"] = "hardware" if self.hardware else "offline (CUPTI host API)"
        return out


def _set_support(name: str, chip: str) -> SetSupport:
    mset = _catalog.metric_set(name)
    try:
        res = _catalog.resolution(name, chip, mset.kind)
        passes = _catalog.count_passes(list(res.metrics), chip, mset.kind)
    except UnsupportedChipError as exc:
        return SetSupport(name, mset.kind, (), {}, (), None, str(exc))
    return SetSupport(name, mset.kind, res.metrics, res.substituted, res.left_out, passes)


def chip_support(chip: str) -> ChipSupport:
    """What each built-in set collects on *chip*, its Top-Down table, and what was verified on hardware.

    Parameters
    ----------
    chip : str
        A CUPTI chip name or a product name (``"GB202"``, ``"rtx 5090"``).

    Raises
    ------
    UnsupportedChipError
        The loaded CUPTI does not know the chip; the message names the close matches.
    """
    from .cupti import _api

    chip = _catalog._check_chip(_catalog.canonical_chip(chip))
    try:
        arch = architectures.for_chip(chip)
        family, ccs, smsp, ipc = arch.name, arch.cc_text, arch.smsp_per_sm, arch.ipc_max
        reasons = (*arch.stall_reasons, *arch.optional_stall_reasons)
    except architectures.UnknownChipError:
        family, ccs, smsp, ipc, reasons = "no Top-Down table (newer than this gpuscope)", "", None, None, ()
    sets = tuple(_set_support(name, chip) for name in _catalog.metric_sets())
    return ChipSupport(chip, "%d.%d" % _api.version(), family, ccs, smsp, ipc, reasons, sets,
                       HARDWARE_VERIFIED.get(chip, ""))


def format_support(s: ChipSupport) -> str:
    """The text ``gpuscope metrics --chip X --support`` prints."""
    lines = [f"{s.chip}: {s.family}" + (f", compute capability {s.compute_capabilities}" if s.compute_capabilities
                                          else "") + f" (CUPTI {s.cupti})"]
    if s.ipc_max is not None:
        lines.append(f"  Top-Down: {s.schedulers_per_sm} warp schedulers per SM, IPC_MAX {s.ipc_max:g}; "
                     f"{len(s.stall_reasons)} stall reasons")
    lines.append("  verified: " + (f"on hardware: {s.hardware}" if s.hardware else
                                   "offline only (CUPTI host API: metrics resolve, passes counted, config images "
                                   "built); not run on this GPU"))
    lines.append("  sets:")
    for st in s.sets:
        head = f"    {st.name:<15} {st.kind:<8} {st.status:<11}"
        if st.error:
            lines.append(f"{head} {st.error}")
            continue
        lines.append(f"{head} {st.passes} pass{'es' if st.passes != 1 else ''}, {len(st.metrics)} metrics")
        for original, used in st.substituted.items():
            lines.append(f"        {original} -> {', '.join(used)}")
        for original in st.left_out:
            lines.append(f"        {original}: left out (no equivalent on {s.chip})")
    return "\n".join(lines)
