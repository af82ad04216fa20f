"""Named metric sets, kept as data in ``data/metric_sets.json``.

Each set has a kind (``"range"`` for the range profiler, ``"sampling"`` for PM sampling), a description, its
exact CUPTI metric names as GH100 spells them, what a chip without one of them collects instead (its
*alternatives*), and the pass count CUPTI computed for it per chip and CUPTI version (checked by the tests against
the loaded CUPTI). A set may instead join other sets (``full``: every range set): its metrics are theirs in order,
without repeats, and their alternatives are its own. Pure data: nothing here loads CUPTI; :meth:`MetricSet.on_chip`
takes the chip's metric list as a predicate.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
from importlib import resources

__all__ = ["REFERENCE_CHIP", "MetricSet", "SetOnChip", "all_sets", "get_set", "set_names"]

#: The chip whose names the sets use, and on which every set was checked against Nsight Compute.
REFERENCE_CHIP = "GH100"


@dataclasses.dataclass(frozen=True)
class SetOnChip:
    """A metric set as one chip collects it.

    Attributes
    ----------
    metrics : tuple of str
        What the chip collects, in the set's order (a substitute takes its original's place).
    substituted : dict
        Set metric -> the chip's metrics that stand in for it.
    left_out : tuple of str
        Set metrics the chip has no equivalent for.
    units_changed : dict
        Substituted set metric -> (its unit, the substitute's unit) where they differ: the chip measures another
        quantity in its place (PCIe bytes per second become percent of the link's peak on GB100), so values do not
        compare with other chips'.
    """

    metrics: tuple[str, ...]
    substituted: dict
    left_out: tuple[str, ...]
    units_changed: dict = dataclasses.field(default_factory=dict)

    @property
    def complete(self) -> bool:
        """Whether the chip collects the set exactly as named."""
        return not self.substituted and not self.left_out

    def attrs(self) -> dict:
        """Dataset attrs that say what changed (empty for a complete set): ``metric_set_substituted`` as
        ``"original -> substitute"`` strings, ``metric_set_left_out``, and ``metric_set_units_changed`` as
        ``"original (unit) -> substitute (unit)"`` strings for substitutes that measure something else."""
        out: dict = {}
        if self.substituted:
            out["metric_set_substituted"] = [f"{k} -> {', '.join(v)}" for k, v in self.substituted.items()]
        if self.left_out:
            out["metric_set_left_out"] = list(self.left_out)
        if self.units_changed:
            out["metric_set_units_changed"] = [self.unit_change(k) for k in self.units_changed]
        return out

    def unit_change(self, original: str) -> str:
        """``"pcie__read_bytes.sum.per_second (byte/second) -> pcie__throughput.avg.pct_of_peak_sustained_elapsed
        (percent)"``: what a substitute in other units measures instead of *original*."""
        before, after = self.units_changed[original]
        return f"{original} ({before}) -> {', '.join(self.substituted[original])} ({after})"


@dataclasses.dataclass(frozen=True)
class MetricSet:
    """A named list of metrics.

    Attributes
    ----------
    name : str
    kind : str
        ``"range"`` (range profiler) or ``"sampling"`` (PM sampling).
    description : str
    metrics : tuple of str
        Exact CUPTI metric names.
    passes : dict
        ``{chip: {cupti_version: passes}}`` as CUPTI computed them, e.g. ``{"GH100": {"13.1": 7}}``.
    alternatives : dict
        Metric -> groups of metrics, tried in order on a chip that lacks it; the first group the chip has in full
        stands in for it; with none (or no groups), it is left out.
    sets : tuple of str
        The sets this one joins (empty for a set of its own metrics).
    """

    name: str
    kind: str
    description: str
    metrics: tuple[str, ...]
    passes: dict
    alternatives: dict = dataclasses.field(default_factory=dict)
    sets: tuple[str, ...] = ()

    def on_chip(self, has, fits=lambda group: True) -> SetOnChip:
        """The set as a chip collects it.

        *has(name)* says whether the chip has a complete metric name; *fits(group)* whether a group of metrics can
        be collected in the set's kind on its own (PM sampling: in one pass). A metric with alternatives that the
        chip lacks, or that does not fit, is replaced by the first group that the chip has and that fits.

        A metric the chip lacks and the set gives no alternatives for stays in the list, so that resolving it
        raises with CUPTI's close matches (the tests make sure no built-in set does that on a listed chip).
        """
        metrics: list[str] = []
        substituted: dict[str, tuple[str, ...]] = {}
        left_out: list[str] = []
        for name in self.metrics:
            if name not in self.alternatives or (has(name) and fits((name,))):
                metrics.append(name)
                continue
            group = next((tuple(g) for g in self.alternatives[name] if all(has(m) for m in g) and fits(tuple(g))),
                         None)
            if group is None:
                left_out.append(name)
            else:
                substituted[name] = group
                metrics += group
        return SetOnChip(tuple(dict.fromkeys(metrics)), substituted, tuple(left_out))

    def recorded_passes(self, chip: str, cupti_version: str) -> int | None:
        """The pass count recorded for *chip* and CUPTI *cupti_version* ("13.1"), or None if not recorded."""
        return self.passes.get(chip, {}).get(cupti_version)


@functools.cache
def all_sets() -> dict[str, MetricSet]:
    """Every named metric set, by name."""
    text = resources.files("gpuscope.metrics").joinpath("data/metric_sets.json").read_text()
    raw = json.loads(text)["sets"]
    out = {
        name: MetricSet(name, s["kind"], s["description"], tuple(s["metrics"]), s.get("passes", {}),
                        {m: tuple(tuple(g) for g in groups) for m, groups in s.get("alternatives", {}).items()})
        for name, s in raw.items() if "sets" not in s
    }
    for name, s in raw.items():
        if "sets" in s:
            parts = [out[p] for p in s["sets"]]
            out[name] = MetricSet(name, s["kind"], s["description"],
                                  tuple(dict.fromkeys(m for p in parts for m in p.metrics)), s.get("passes", {}),
                                  {m: g for p in reversed(parts) for m, g in p.alternatives.items()}, tuple(s["sets"]))
    return {name: out[name] for name in raw}


def set_names() -> list[str]:
    """Names of the metric sets."""
    return list(all_sets())


def get_set(name: str) -> MetricSet:
    """The metric set called *name*.

    Raises
    ------
    KeyError
        No set has that name; the message lists the sets.
    """
    try:
        return all_sets()[name]
    except KeyError:
        close = difflib.get_close_matches(str(name), all_sets(), n=3, cutoff=0.6)
        hint = f" Did you mean {' or '.join(map(repr, close))}?" if close else ""
        raise KeyError(f"No metric set called {name!r}.{hint} Metric sets: {', '.join(all_sets())}.") from None
