"""The metric catalog: list, search and describe a chip's metrics.

Works offline through CUPTI's Profiler Host API: give ``chip="GH100"`` on a machine without a GPU; with a GPU
and no ``chip``, the chip of device 0 is used (:mod:`gpuscope._gpu.chips`). Metric sets and lists are resolved
for a chip, and their passes counted, in :mod:`gpuscope._gpu.metric_lists`.

A full metric name is a *base* name plus a *sub-metric* suffix that depends on the base metric's type:
``smsp__inst_executed`` (a counter) + ``.avg.per_cycle_active``; ``smsp__warp_issue_stalled_wait_per_warp_active``
(a ratio) + ``.pct``; ``sm__throughput`` (a throughput) + ``.avg.pct_of_peak_sustained_elapsed``.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import fnmatch
import functools
import re
import threading

from gpuscope._gpu.chips import resolve_chip
from gpuscope._schema.units import split_name, units_of
from gpuscope.errors import CuptiNotSupportedError, UnknownMetricError, UnsupportedChipError

__all__ = [
    "MetricKind",
    "MetricInfo",
    "list_metrics",
    "search_metrics",
    "describe_metric",
    "split_name",
    "units_of",
    "is_internal",
    "descriptions",
]


class MetricKind(str, enum.Enum):
    """Which profiler a metric list is for."""

    RANGE = "range"  # the Range Profiler: per kernel launch or user range, may take several passes
    SAMPLING = "sampling"  # PM sampling: over time, must fit in one pass


# Suffix shown in examples and used to ask CUPTI 12.x (which wants full names) about a base metric.
_EXAMPLE_SUFFIX = {"COUNTER": ".sum", "RATIO": ".ratio", "THROUGHPUT": ".avg.pct_of_peak_sustained_elapsed"}
_ROLLUP_HELP = {
    "COUNTER": "a counter needs a rollup: .sum, .avg, .min or .max (then optionally .per_second, "
    ".per_cycle_active, .pct_of_peak_sustained_elapsed, ...)",
    "RATIO": "a ratio needs .ratio, .pct or .max_rate",
    "THROUGHPUT": "a throughput needs a rollup and a peak, e.g. .avg.pct_of_peak_sustained_elapsed",
}


@dataclasses.dataclass(frozen=True)
class MetricInfo:
    """One metric as the catalog describes it.

    Attributes
    ----------
    name : str
        The name as asked for (base name or full name).
    base : str
        The base metric name.
    suffix : str
        The sub-metric suffix ("" for a base name).
    metric_type : str
        ``"COUNTER"``, ``"RATIO"`` or ``"THROUGHPUT"``.
    description, units, hw_unit : str
        CUPTI's description, dimension unit (e.g. ``"percent"``, ``"byte"``) and hardware unit (e.g. ``"sm"``).
    """

    name: str
    base: str
    suffix: str
    metric_type: str
    description: str
    units: str
    hw_unit: str


class _ChipMetrics:
    """Everything the catalog knows about one (chip, kind) pair, fetched from CUPTI once."""

    def __init__(self, chip: str, kind: MetricKind):
        from gpuscope.cupti import host
        from gpuscope.cupti._types import MetricType, ProfilerType

        self.chip, self.kind = chip, kind
        profiler_type = ProfilerType.RANGE_PROFILER if kind is MetricKind.RANGE else ProfilerType.PM_SAMPLING
        try:
            self.host = host.ProfilerHost(chip, profiler_type)
        except CuptiNotSupportedError:
            from gpuscope.cupti import _api

            # CUPTI 12.x lists chips it cannot profile (GV11B; Maxwell, Pascal and Tegra X1/X2 on 12.6)
            raise UnsupportedChipError(
                f"CUPTI {'%d.%d' % _api.version()} lists {chip} but cannot profile it ({kind.value} profiling: "
                "cuptiProfilerHostInitialize says CUPTI_ERROR_NOT_SUPPORTED). docs/support.md lists the chips each "
                "CUPTI profiles.") from None
        self.types: dict[str, str] = {}
        for metric_type in MetricType:
            for base in self.host.base_metrics(metric_type):
                self.types[base] = metric_type.name
        self._suffixes: dict[str, frozenset[str]] = {}
        self._lock = threading.Lock()

    def suffixes(self, metric_type: str) -> frozenset[str]:
        """Valid sub-metric suffixes for a metric type (CUPTI gives the same list for every metric of a type)."""
        from gpuscope.cupti._types import MetricType

        with self._lock:
            if metric_type not in self._suffixes:
                example = next(b for b, t in self.types.items() if t == metric_type)
                subs = self.host.sub_metrics(example + _EXAMPLE_SUFFIX[metric_type], MetricType[metric_type])
                self._suffixes[metric_type] = frozenset(subs)
            return self._suffixes[metric_type]

    def full_names(self, base: str) -> list[str]:
        return sorted(base + s for s in self.suffixes(self.types[base]))

    def check(self, name: str) -> str:
        """Return *name* if it is a complete metric name for this chip, else raise UnknownMetricError."""
        base, suffix = split_name(name)
        metric_type = self.types.get(base)
        where = f"{self.chip} ({self.kind.value} profiling)"
        if metric_type is None:
            close = difflib.get_close_matches(base, self.types, n=5, cutoff=0.6)
            other = self._other_kind_has(base)
            msg = f"Unknown metric {name!r} on {where}."
            if other:
                msg += f" It exists for {other.value} profiling, not {self.kind.value}."
            if close:
                msg += " Closest metrics: " + ", ".join(close) + "."
            msg += " Search with: gpuscope metrics --chip %s --search <part of the name>." % self.chip
            raise UnknownMetricError(msg, name, tuple(close))
        valid = self.suffixes(metric_type)
        if suffix in valid:
            return name
        example = base + _EXAMPLE_SUFFIX[metric_type]
        if not suffix:
            raise UnknownMetricError(
                f"{name!r} is a {metric_type.lower()} base name, not a complete metric: {_ROLLUP_HELP[metric_type]} "
                f"(e.g. {example}). List them with: gpuscope metrics --chip {self.chip} --describe {base}",
                name,
                (example,),
            )
        close = [base + s for s in difflib.get_close_matches(suffix, valid, n=5, cutoff=0.5)]
        raise UnknownMetricError(
            f"{name!r}: {suffix!r} is not a sub-metric of the {metric_type.lower()} {base} on {where}; "
            + ("closest: " + ", ".join(close) if close else _ROLLUP_HELP[metric_type])
            + ".",
            name,
            tuple(close),
        )

    def has(self, name: str) -> bool:
        """Whether *name* is a complete metric name on this chip."""
        base, suffix = split_name(name)
        metric_type = self.types.get(base)
        return metric_type is not None and suffix in self.suffixes(metric_type)

    def _other_kind_has(self, base: str) -> MetricKind | None:
        other = MetricKind.SAMPLING if self.kind is MetricKind.RANGE else MetricKind.RANGE
        try:
            return other if base in _chip_metrics(self.chip, other).types else None
        except Exception:
            return None

    def info(self, name: str) -> MetricInfo:
        base, suffix = split_name(name)
        if suffix or base not in self.types:
            self.check(name)  # a complete name must be valid; an unknown base raises with suggestions
        metric_type = self.types[base]
        props = self.host.metric_properties(name if suffix else base + _EXAMPLE_SUFFIX[metric_type])
        units = units_of(suffix, props.units) if suffix else ""  # a base name's unit depends on the suffix
        return MetricInfo(name, base, suffix, metric_type, props.description, units, props.hw_unit)


@functools.lru_cache(maxsize=None)
def _chip_metrics(chip: str, kind: MetricKind) -> _ChipMetrics:
    return _ChipMetrics(chip, kind)


def _kind(kind) -> MetricKind:
    try:
        return MetricKind(kind)
    except ValueError:
        raise ValueError(f"kind={kind!r}: use 'range' (range profiler) or 'sampling' (PM sampling).") from None


def list_metrics(chip: str | None = None, kind: str = "range", metric_type: str | None = None, full: bool = False,
                 internal: bool = True):
    """Metric names of a chip.

    Parameters
    ----------
    chip : str, optional
        CUPTI chip name (``gpuscope.list_chips()``); default: the chip of GPU 0.
    kind : {"range", "sampling"}
        Range profiler or PM sampling: the two know different metrics.
    metric_type : {"counter", "ratio", "throughput"}, optional
        Only base metrics of this type.
    full : bool
        Expand every base name with all its sub-metric suffixes (about 150,000 names on GH100).
    internal : bool
        Include CUPTI's internal-only names (:func:`is_internal`); ``gpuscope metrics`` leaves them out.

    Returns
    -------
    list of str
        Sorted names.

    Raises
    ------
    UnsupportedChipError, NoGpuError, CuptiNotFoundError
    """
    cm = _chip_metrics(resolve_chip(chip), _kind(kind))
    wanted = None if metric_type is None else metric_type.upper()
    if wanted is not None and wanted not in _EXAMPLE_SUFFIX:
        raise ValueError(f"metric_type={metric_type!r}: use 'counter', 'ratio' or 'throughput'.")
    bases = sorted(b for b, t in cm.types.items() if wanted in (None, t) and (internal or not is_internal(b)))
    if not full:
        return bases
    return [n for b in bases for n in cm.full_names(b)]


def is_internal(name: str) -> bool:
    """Whether a base metric is one of CUPTI's internal-only names (Nsight's ``<UNIT>.TriageCompute.*`` groups
    and ``*_internal_activity``), which the catalog hides unless asked for."""
    return ".TriageCompute." in name or name.startswith("TriageCompute.") or name.endswith("_internal_activity")


def _cache_dir():
    import os
    from pathlib import Path

    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "gpuscope"


def descriptions(chip: str | None = None, kind: str = "range") -> dict[str, str]:
    """Base metric name -> CUPTI's description, for every metric of *chip*.

    CUPTI answers one metric at a time (about 3 ms each, 10 s for a chip's 3,650 range metrics), so the table is
    kept in ``$XDG_CACHE_HOME/gpuscope/`` (default ``~/.cache/gpuscope``) per chip, kind and CUPTI version. A kept
    table that is not one description (str) per metric of the chip is read again from CUPTI and replaced.
    """
    import json
    import sys

    from gpuscope.cupti import _api

    cm = _chip_metrics(resolve_chip(chip), _kind(kind))
    with cm._lock:
        cached = getattr(cm, "_descriptions", None)
    if cached is not None:
        return cached
    path = _cache_dir() / f"descriptions-{cm.chip}-{cm.kind.value}-cupti{'%d.%d' % _api.version()}.json"
    table = None
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        pass
    kept = isinstance(table, dict) and set(table) == set(cm.types) and all(isinstance(v, str) for v in table.values())
    if not kept:  # none yet, another CUPTI's metrics, or a file edited or cut short: read again
        print(f"gpuscope: reading {len(cm.types)} metric descriptions from CUPTI once (about "
              f"{len(cm.types) * 3 // 1000 + 1} s); kept in {path}", file=sys.stderr)
        table = {b: cm.host.metric_properties(b + _EXAMPLE_SUFFIX[t]).description for b, t in cm.types.items()}
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(table))
            tmp.replace(path)
        except OSError:
            pass  # a read-only home: search works, only slower next time
    with cm._lock:
        cm._descriptions = table
    return table


def search_metrics(pattern: str, chip: str | None = None, kind: str = "range", *, descriptions_too: bool = False,
                   internal: bool = False) -> list[MetricInfo]:
    """Base metrics whose name (or description) matches *pattern*, with their descriptions.

    *pattern* is a case-insensitive substring, or a shell glob if it contains ``*``, ``?`` or ``[``.

    Parameters
    ----------
    descriptions_too : bool
        Also match CUPTI's descriptions (``"scoreboard"``, ``"bytes read"``); name matches come first. The first
        such search of a chip reads every description from CUPTI once, about 10 s (see :func:`descriptions`);
        ``gpuscope metrics --search`` does this unless given ``--names-only``.
    internal : bool
        Include CUPTI's internal-only names (:func:`is_internal`).

    Raises
    ------
    UnsupportedChipError, NoGpuError, CuptiNotFoundError
    """
    cm = _chip_metrics(resolve_chip(chip), _kind(kind))
    if any(ch in pattern for ch in "*?["):
        rx = re.compile(fnmatch.translate(pattern), re.IGNORECASE)
        match = lambda text: bool(rx.match(text))  # noqa: E731
    else:
        match = lambda text: pattern.lower() in text.lower()  # noqa: E731
    bases = [b for b in sorted(cm.types) if internal or not is_internal(b)]
    hits = [b for b in bases if match(b)]
    if descriptions_too:
        text = descriptions(cm.chip, cm.kind.value)
        hits += [b for b in bases if b not in hits and match(text.get(b, ""))]
    return [cm.info(b) for b in hits]


def describe_metric(name: str, chip: str | None = None, kind: str = "range") -> MetricInfo:
    """Description, units and type of one metric (a base name or a full name).

    Raises
    ------
    UnknownMetricError
        The chip has no such metric; the message names the closest ones.
    """
    return _chip_metrics(resolve_chip(chip), _kind(kind)).info(name)


def sub_metrics(name: str, chip: str | None = None, kind: str = "range") -> list[str]:
    """All complete names for a base metric (base + each valid suffix)."""
    cm = _chip_metrics(resolve_chip(chip), _kind(kind))
    base, _ = split_name(name)
    if base not in cm.types:
        cm.check(base)
    return cm.full_names(base)
