"""Named metric sets, kept as data in ``data/metric_sets.json``.

Each set has a kind (``"range"`` for the range profiler, ``"sampling"`` for PM sampling), a description, its
exact CUPTI metric names, and the pass count CUPTI computed for it per chip and CUPTI version (checked by the
tests against the loaded CUPTI). Pure data: nothing here loads CUPTI.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from importlib import resources

__all__ = ["MetricSet", "get_set", "set_names", "all_sets"]


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
    """

    name: str
    kind: str
    description: str
    metrics: tuple[str, ...]
    passes: dict

    def recorded_passes(self, chip: str, cupti_version: str) -> int | None:
        """The pass count recorded for *chip* and CUPTI *cupti_version* ("13.1"), or None if not recorded."""
        return self.passes.get(chip, {}).get(cupti_version)


@functools.cache
def all_sets() -> dict[str, MetricSet]:
    """Every named metric set, by name."""
    text = resources.files("gpuscope.metrics").joinpath("data/metric_sets.json").read_text()
    raw = json.loads(text)["sets"]
    return {
        name: MetricSet(name, s["kind"], s["description"], tuple(s["metrics"]), s.get("passes", {}))
        for name, s in raw.items()
    }


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
        raise KeyError(f"No metric set called {name!r}. Metric sets: {', '.join(all_sets())}.") from None
