"""Metric names and units: a full metric name's base and suffix, and the unit its suffix implies."""

from __future__ import annotations

__all__ = ["split_name", "units_of"]


def split_name(name: str) -> tuple[str, str]:
    """Split a full metric name into (base, suffix): the suffix starts at the first '.' after the '__'.

    >>> split_name("smsp__inst_executed.avg.per_cycle_active")
    ('smsp__inst_executed', '.avg.per_cycle_active')
    """
    unit_end = name.find("__")
    dot = name.find(".", unit_end + 2 if unit_end >= 0 else 0)
    return (name, "") if dot < 0 else (name[:dot], name[dot:])


def units_of(suffix: str, cupti_units: str) -> str:
    """The unit of a full metric: CUPTI's dimension unit, or what the suffix implies where CUPTI gives none.

    CUPTI leaves ratios' unit empty and gives rates the numerator's unit; ``.pct`` and ``.pct_of_peak_*`` are
    percentages, ``.ratio`` is a plain ratio, ``.per_second``/``.per_cycle_*`` are rates, and ``.peak_sustained``
    is the most the counter can count per cycle (CUPTI gives it the counter's unit, ncu says ``byte/cycle``).
    """
    if ".pct" in suffix:
        return "percent"
    if suffix.endswith(".peak_sustained") and cupti_units and "/" not in cupti_units:
        return f"{cupti_units}/cycle"
    if cupti_units:
        # CUPTI 13.1 gives the numerator's unit for rates (".per_second" -> "byte"); other versions and metrics give
        # the whole rate ("byte/second", "instruction/gpc_cycle"): a unit that has its denominator stays as it is
        if "/" in cupti_units:  # one denominator: "byte/second/second" (seen in H100 recordings) is byte/second
            numerator, denominator = cupti_units.split("/")[:2]
            if ".per_cycle" in suffix and denominator.endswith("_cycle"):
                denominator = "cycle"  # CUPTI 13.0 says "instruction/gpc_cycle" where 13.1 (and ncu) say per cycle
            return f"{numerator}/{denominator}"
        for rate, per in ((".per_second", "second"), (".per_cycle", "cycle")):
            if rate in suffix:
                return f"{cupti_units}/{per}"
        return cupti_units
    if suffix.endswith(".ratio") or suffix.endswith(".max_rate"):
        return "ratio"
    return ""
