"""What gpuscope supports on a chip: its Top-Down family, each built-in set as the chip collects it, and what was
verified on hardware (``gpuscope metrics --chip X --support``, ``gpuscope check``, ``docs/support.md``).

Works offline: everything but the hardware column comes from the loaded CUPTI's host API.
"""

from __future__ import annotations

import dataclasses

from gpuscope._gpu import chips as _chips
from gpuscope._gpu import metric_lists as _lists
from gpuscope.errors import UnsupportedChipError
from gpuscope.metrics import architectures

__all__ = ["HARDWARE_VERIFIED", "SetSupport", "ChipSupport", "chip_support", "format_support"]

#: Chips gpuscope was run on, and what was checked there. Every other chip was checked offline only (host API).
HARDWARE_VERIFIED = {
    "GH100": "H100 80GB HBM3 and H200 (CUPTI 13.0): GPU test suite, every set collected but roofline, memory, "
             "occupancy and instructions (offline so far), Top-Down against Nsight Compute",
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
    units_changed: dict = dataclasses.field(default_factory=dict)  # substituted -> (its unit, the substitute's)

    def substitution(self, original: str, short=lambda m: m) -> str:
        """``"a -> b"``, with the units where the substitute measures something else: ``"a -> b (another quantity:
        byte/second -> percent)"``."""
        text = f"{short(original)} -> {', '.join(short(m) for m in self.substituted[original])}"
        if original in self.units_changed:
            text += " (another quantity: {} -> {})".format(*self.units_changed[original])
        return text

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
    mset = _lists.metric_set(name)
    try:
        res = _lists.resolution(name, chip, mset.kind)
        passes = _lists.count_passes(list(res.metrics), chip, mset.kind)
    except UnsupportedChipError as exc:
        return SetSupport(name, mset.kind, (), {}, (), None, str(exc))
    return SetSupport(name, mset.kind, res.metrics, res.substituted, res.left_out, passes,
                      units_changed=res.units_changed)


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
    from gpuscope.cupti import _api

    chip = _chips.resolve_chip(chip)
    try:
        arch = architectures.for_chip(chip)
        family, ccs, smsp, ipc = arch.name, arch.cc_text, arch.smsp_per_sm, arch.ipc_max
        reasons = (*arch.stall_reasons, *arch.optional_stall_reasons)
    except architectures.UnknownChipError:
        family, ccs, smsp, ipc, reasons = "no Top-Down table (newer than this gpuscope)", "", None, None, ()
    sets = tuple(_set_support(name, chip) for name in _lists.metric_sets())
    return ChipSupport(chip, "%d.%d" % _api.version(), family, ccs, smsp, ipc, reasons, sets,
                       HARDWARE_VERIFIED.get(chip, ""))


def format_support(s: ChipSupport) -> str:
    """The text ``gpuscope metrics --chip X --support`` prints."""
    lines = [f"{s.chip}: {s.family}" + (f", compute capability {s.compute_capabilities}" if s.compute_capabilities
                                          else "") + f" (CUPTI {s.cupti})"]
    if s.ipc_max is not None:
        optional = architectures.for_chip(s.chip).optional_stall_reasons
        lines.append(f"  Top-Down: {s.schedulers_per_sm} warp schedulers per SM, IPC_MAX {s.ipc_max:g}; "
                     f"{len(s.stall_reasons) - len(optional)} stall reasons"
                     + (f" + optional {', '.join(optional)}" if optional else "")
                     + ", and the states selected and not_selected (not stalls)")
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
        for original in st.substituted:
            lines.append(f"        {st.substitution(original)}")
        for original in st.left_out:
            lines.append(f"        {original}: left out (no equivalent on {s.chip})")
    return "\n".join(lines)


def _short(metric: str) -> str:
    return metric.split(".")[0]


def support_markdown() -> str:
    """The generated tables of ``docs/support.md`` for the loaded CUPTI (``tests/unit/test_support_doc.py`` checks
    that the page holds them; regenerate with ``python -c "from gpuscope._gpu import support as _support;
    print(_support.support_markdown())"``)."""
    from gpuscope.metrics.architectures import ARCHITECTURES, NOT_STALLS, STALL_PARENT, SUB_REASONS

    chips = _chips.list_chips()
    tables = [a for a in ARCHITECTURES if any(c in chips for c in a.chips)]
    out = ["### Architecture families", "",
           "| family | chips | compute capability | warp schedulers per SM | IPC_MAX | stall reasons | "
           "verified |", "|---|---|---|---|---|---|---|"]
    for a in tables:
        listed = [c for c in a.chips if c in chips]
        verified = "hardware (" + HARDWARE_VERIFIED[listed[0]].split(" (")[0] + ")" if any(
            c in HARDWARE_VERIFIED for c in listed) else "offline"
        extra = f" + optional {', '.join(a.optional_stall_reasons)}" if a.optional_stall_reasons else ""
        out.append(f"| {a.name} | {', '.join(listed)} | {a.cc_text} | {a.smsp_per_sm} | {a.ipc_max:g} | "
                   f"{len(a.stall_reasons)}{extra} | {verified} |")
    out += ["", "### Stall reasons and their Top-Down node", "",
            "`x`: the chip lists the reason and the `topdown` set collects it; `opt`: listed, collected only when "
            "asked (`required_metrics(chip, optional=True)`); `part`: listed by some chips of the family as a part "
            "of its parent reason, not collected (its cycles are in the parent's node); `-`: the chips do not have "
            "it.", "",
            "| reason | level-3 node | " + " | ".join(a.name for a in tables) + " |",
            "|---|---|" + "---|" * len(tables)]
    for reason in (*STALL_PARENT, *SUB_REASONS, *NOT_STALLS):
        if reason in NOT_STALLS:
            node = "none: not a stall (coverage check only)"
        elif reason in SUB_REASONS:
            node = f"part of `{STALL_PARENT[SUB_REASONS[reason]]}_{SUB_REASONS[reason]}`"
        else:
            node = f"`{STALL_PARENT[reason]}_{reason}`"

        def mark(a):
            if reason in NOT_STALLS or reason in a.stall_reasons:
                return "x"
            if reason in a.optional_stall_reasons:
                return "opt"
            return "part" if reason in a.sub_reasons else "-"

        out.append(f"| `{reason}` | {node} | " + " | ".join(mark(a) for a in tables) + " |")
    names = list(_lists.metric_sets())
    out += ["", "### Built-in sets on each chip", "",
            "Passes a session needs (for `topdown`, gpuscope's consistent pass plan: docs/topdown.md), as CUPTI's "
            "host API counts them without a device (every counter assumed free). **complete**: "
            "the set as named; otherwise what the chip collects instead (`a -> b`) or leaves out (`-a`), by base "
            "name.", "", "| chip | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for chip in chips:
        info = chip_support(chip)
        cells = []
        for st in info.sets:
            if st.error:
                cells.append("not profilable")
                continue
            if _lists.metric_set(st.name).sets:  # a set of sets changes what they change, in their columns
                cells.append(f"{st.passes}p {st.status}" + (" as its sets" if st.status == "reduced" else ""))
                continue
            text = f"{st.passes}p complete" if st.status == "complete" else f"{st.passes}p reduced:"
            notes = [st.substitution(k, _short) for k in st.substituted]
            notes += [f"-{_short(m)}" for m in st.left_out]
            notes = list(dict.fromkeys(notes))  # by base name: a counter and its .peak_sustained read as one
            cells.append(" ".join([text, "; ".join(notes)]).strip())
        out.append(f"| {chip} | " + " | ".join(cells) + " |")
    return "\n".join(out)
