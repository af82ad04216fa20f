"""The metric catalog: list, search and describe a chip's metrics, resolve metric sets, count passes.

Works offline through CUPTI's Profiler Host API: give ``chip="GH100"`` on a machine without a GPU; with a GPU
and no ``chip``, the chip of device 0 is used.

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
from collections.abc import Iterable, Sequence

from gpuscope._schema.units import split_name, units_of
from gpuscope.errors import CuptiNotSupportedError, NoGpuError, UnknownMetricError, UnsupportedChipError
from gpuscope.metrics import catalog as _sets

__all__ = [
    "MetricKind",
    "MetricInfo",
    "list_chips",
    "list_metrics",
    "search_metrics",
    "describe_metric",
    "count_passes",
    "max_metrics_per_pass",
    "metric_sets",
    "metric_set",
    "resolve",
    "resolution",
    "config_image",
    "split_name",
    "units_of",
    "canonical_chip",
    "is_internal",
    "descriptions",
    "split_list",
    "expand",
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


def forget_hosts() -> None:
    """Drop the cached host objects (CUPTI is being detached: they belong to the CUPTI that goes away)."""
    _chip_metrics.cache_clear()
    _set_on_chip.cache_clear()


def list_chips() -> list[str]:
    """Chip names the loaded CUPTI can profile (e.g. ``"GH100"`` for the H100)."""
    from gpuscope.cupti import host

    return host.supported_chips()


#: Product names (lower case) -> CUPTI chip name, for the command line (``--chip h100``).
CHIP_ALIASES = {
    "h100": "GH100", "h200": "GH100", "h800": "GH100", "gh200": "GH100", "h20": "GH100",
    "a100": "GA100", "a800": "GA100", "a30": "GA100",
    "a10": "GA102", "a40": "GA102", "a6000": "GA102", "rtx a6000": "GA102", "rtx 3090": "GA102", "rtx 3080": "GA102",
    "a16": "GA107", "a2": "GA107", "rtx 3070": "GA104", "rtx 3060": "GA106",
    "l40": "AD102", "l40s": "AD102", "l20": "AD102", "rtx 4090": "AD102", "rtx 6000 ada": "AD102",
    "rtx 4080": "AD103", "l4": "AD104", "rtx 4070": "AD104", "rtx 4060": "AD107",
    "t4": "TU104", "rtx 2080": "TU104", "rtx 2080 ti": "TU102", "titan rtx": "TU102", "rtx 8000": "TU102",
    "b200": "GB100", "b100": "GB100", "gb200": "GB100",
    "b300": "GB110", "gb300": "GB110",
    "rtx 5090": "GB202", "rtx pro 6000": "GB202", "rtx 5080": "GB203", "rtx 5070": "GB205",
}


def canonical_chip(chip: str) -> str:
    """A chip name as CUPTI spells it, from any case or a product name (``"h100"`` -> ``"GH100"``).

    Names that are neither a chip nor a known product come back unchanged (:func:`list_metrics` and friends then
    say which chips exist).
    """
    text = " ".join(chip.strip().lower().replace("geforce", "").replace("nvidia", "").split())
    for c in list_chips():
        if c.lower() == text:
            return c
    return CHIP_ALIASES.get(text, chip)


def _check_chip(chip: str | None, device: int = 0) -> str:
    if chip is None:
        return _device_chip(device)
    chips = list_chips()
    if chip in chips:
        return chip
    hint = ""
    upper = [c for c in chips if c.lower() == chip.lower()]
    if upper:
        hint = f" Chip names are case-sensitive: did you mean {upper[0]!r}?"
    elif chip.strip().lower() in CHIP_ALIASES:
        hint = f" {chip} is a product; its chip is {CHIP_ALIASES[chip.strip().lower()]!r}."
    else:
        close = difflib.get_close_matches(chip.upper(), chips, n=3, cutoff=0.5)
        if close:
            hint = " Closest: " + ", ".join(close) + "."
    raise UnsupportedChipError(f"Chip {chip!r} is not supported by the loaded CUPTI.{hint} Supported: {', '.join(chips)}.")


@functools.lru_cache(maxsize=None)
def _device_chip(device: int) -> str:
    from gpuscope.cupti import profiler

    try:
        from gpuscope._gpu import device as _device

        _device.device_count()
    except NoGpuError as exc:
        raise NoGpuError(f"{exc} Pass chip= (e.g. chip='GH100'); gpuscope metrics --chips lists them.") from None
    profiler.initialize()
    try:
        return profiler.chip_name(device)
    finally:
        profiler.deinitialize()


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
    cm = _chip_metrics(_check_chip(chip), _kind(kind))
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
    kept in ``$XDG_CACHE_HOME/gpuscope/`` (default ``~/.cache/gpuscope``) per chip, kind and CUPTI version.
    """
    import json
    import sys

    from gpuscope.cupti import _api

    cm = _chip_metrics(_check_chip(chip), _kind(kind))
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
    if not isinstance(table, dict) or set(table) != set(cm.types):
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
    cm = _chip_metrics(_check_chip(chip), _kind(kind))
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
    return _chip_metrics(_check_chip(chip), _kind(kind)).info(name)


def sub_metrics(name: str, chip: str | None = None, kind: str = "range") -> list[str]:
    """All complete names for a base metric (base + each valid suffix)."""
    cm = _chip_metrics(_check_chip(chip), _kind(kind))
    base, _ = split_name(name)
    if base not in cm.types:
        cm.check(base)
    return cm.full_names(base)


def metric_sets(kind: str | None = None):
    """The named metric sets (optionally only those for *kind*), by name."""
    sets = _sets.all_sets()
    return {n: s for n, s in sets.items() if kind is None or s.kind == _kind(kind).value}


def metric_set(name: str):
    """One named metric set (``launch``, ``speed-of-light``, ``topdown``, ``pm-default``, ...).

    Raises
    ------
    KeyError
        No set has that name.
    """
    return _sets.get_set(name)


def resolve(metrics: str | Iterable[str], chip: str | None = None, kind: str = "range") -> list[str]:
    """Turn a metric-set name or a list of names into a checked list of full metric names.

    A set is resolved for the chip (:func:`resolution` says what it substituted or left out); duplicates are
    dropped, order kept.

    Raises
    ------
    UnknownMetricError
        A name is unknown on *chip* for *kind*, or incomplete; the message names close matches.
    ValueError
        A named set is for the other kind of profiling, or the list is empty.
    """
    return list(resolution(metrics, chip, kind).metrics)


def resolution(metrics: str | Iterable[str], chip: str | None = None, kind: str = "range"):
    """Like :func:`resolve`, with what the chip collects instead of the sets' own metrics.

    Set names (alone or among metric names) become the set as the chip collects it
    (:meth:`gpuscope.metrics.catalog.MetricSet.on_chip`): a metric the chip lacks is replaced by the chip's
    equivalent, or left out where it has none.

    Returns
    -------
    gpuscope.metrics.catalog.SetOnChip
        ``metrics`` (checked full names), ``substituted`` (set metric -> what stands in), ``left_out``;
        ``.attrs()`` gives the Dataset attrs that record them.

    Raises
    ------
    UnknownMetricError, ValueError, TypeError
        As :func:`resolve`.
    """
    kind = _kind(kind)
    names = [metrics] if isinstance(metrics, str) else list(metrics)
    if not names:
        raise ValueError("No metrics given.")
    cm = _chip_metrics(_check_chip(chip), kind)
    sets = _sets.all_sets()
    out: list[str] = []
    substituted: dict = {}
    left_out: list[str] = []
    for name in names:
        if not isinstance(name, str):
            raise TypeError(f"Metric names are strings, got {name!r}.")
        if name in sets:
            mset = sets[name]
            if mset.kind != kind.value:
                raise ValueError(
                    f"Metric set {name!r} is for {mset.kind} profiling, not {kind.value}. "
                    f"Sets for {kind.value}: {', '.join(metric_sets(kind.value))}."
                )
            on_chip = _set_on_chip(name, cm.chip, kind)
            substituted.update(on_chip.substituted)
            left_out += [m for m in on_chip.left_out if m not in left_out]
            out += [cm.check(m) for m in on_chip.metrics if m not in out]
        elif "__" not in name and (close := difflib.get_close_matches(name, sets, n=3, cutoff=0.6)):
            raise UnknownMetricError(
                f"{name!r} is neither a metric nor a metric set. Did you mean the set {' or '.join(map(repr, close))}? "
                f"Metric sets: {', '.join(sets)}.", name, tuple(close))
        elif name not in out:
            out.append(cm.check(name))
    return _sets.SetOnChip(tuple(out), substituted, tuple(left_out))


@functools.lru_cache(maxsize=None)
def _set_on_chip(name: str, chip: str, kind: MetricKind):
    """A built-in set as *chip* collects it: alternatives for what the chip lacks, and in PM sampling for what
    does not fit in its one pass on its own (Turing's DRAM throughput)."""
    cm = _chip_metrics(chip, kind)

    def fits(group) -> bool:
        if kind is MetricKind.RANGE:
            return True
        from gpuscope.cupti import host
        from gpuscope.errors import CuptiError

        try:
            return host.num_passes(config_image(list(group), chip, kind.value)) == 1
        except CuptiError:  # CUPTI 12.6 lists GA10B's mcc__* metrics for PM sampling but cannot configure them
            return False

    return _sets.get_set(name).on_chip(cm.has, fits)


def split_list(items: str | Iterable[str]) -> list[str]:
    """Names from command-line words: ``["a,b", "c"]`` -> ``["a", "b", "c"]`` (blanks dropped).

    A ``regex:`` entry runs to the end of its word, commas included (``regex:^(fma{1,2})$`` stays whole): put other
    names before it in the word, or in words of their own.
    """
    words = [items] if isinstance(items, str) else list(items)
    out = []
    for word in words:
        parts = word.split(",")
        for i, part in enumerate(parts):
            if part.strip().startswith("regex:"):
                out.append(",".join(parts[i:]).strip())
                break
            if part.strip():
                out.append(part.strip())
    return out


def expand(items: str | Iterable[str], kind: str | None = None) -> tuple[str | list[str], str]:
    """Comma-separated metric and set names -> (what :func:`resolve` takes, the kind of profiling).

    One set name stays a set name (so sessions can record it); several sets and names become one list in order,
    duplicates dropped, set names kept (:func:`resolve` takes each as the chip collects it). Without *kind*, the kind is the sets' kind (``pm-default`` means PM sampling), else range.

    Raises
    ------
    ValueError
        No names, or sets of both kinds, or a set of the other kind than *kind*.
    """
    names = split_list(items)
    if not names:
        raise ValueError("No metrics given: name metrics or metric sets, separated by commas.")
    sets = _sets.all_sets()
    kinds = {sets[n].kind for n in names if n in sets}
    if len(kinds) > 1:
        raise ValueError("Those sets mix range profiling and PM sampling metrics: "
                         + ", ".join(f"{n} ({sets[n].kind})" for n in names if n in sets) + ". Use one kind at a time.")
    inferred = kinds.pop() if kinds else "range"
    if kind is not None and _kind(kind).value != inferred and any(n in sets for n in names):
        wrong = [n for n in names if n in sets]
        raise ValueError(f"{', '.join(wrong)} is for {inferred} profiling, not {_kind(kind).value}. "
                         f"Sets for {_kind(kind).value}: {', '.join(metric_sets(_kind(kind).value))}.")
    kind = _kind(kind or inferred).value
    if len(names) == 1:
        return names[0], kind
    return list(dict.fromkeys(names)), kind  # set names stay: resolve() takes each set as the chip collects it


def config_image(metrics: Sequence[str], chip: str, kind: str = "range", counter_availability=None):
    """The CUPTI config image for already-resolved *metrics* (see :func:`resolve`)."""
    from gpuscope.cupti import host
    from gpuscope.cupti._types import ProfilerType

    kind = _kind(kind)
    ptype = ProfilerType.RANGE_PROFILER if kind is MetricKind.RANGE else ProfilerType.PM_SAMPLING
    return host.config_image(chip, ptype, list(metrics), counter_availability)


def count_passes(metrics, chip: str | None = None, kind: str | None = None, counter_availability=None) -> int:
    """How many passes (replays) CUPTI needs to collect *metrics* (a set name or a list).

    Parameters
    ----------
    metrics : str or list of str
        A metric-set name or metric names.
    chip : str, optional
        Default: the chip of GPU 0.
    kind : {"range", "sampling"}, optional
        PM sampling can only collect a one-pass list. Default: the kind of the sets named (``"pm-default"`` is
        PM sampling), else ``"range"``, as the command line infers it.
    counter_availability : bytes-like, optional
        The device's counter-availability image; without it CUPTI assumes every counter is free.

    Raises
    ------
    UnknownMetricError, UnsupportedChipError, NoGpuError
    gpuscope.errors.ImageError
        *counter_availability* is not a counter-availability image of *chip* that CUPTI can read (checked before
        CUPTI sees it: a damaged image used to crash the process).
    """
    from gpuscope.cupti import host

    chip = _check_chip(chip)
    if kind is None:
        metrics, kind = expand(metrics)
    names = resolve(metrics, chip, kind)
    return host.num_passes(config_image(names, chip, kind, counter_availability))


def max_metrics_per_pass(chip: str | None = None, kind: str = "range", counter_availability=None) -> int:
    """The most hardware metrics one pass can hold on *chip*."""
    from gpuscope.cupti import host
    from gpuscope.cupti._types import ProfilerType

    chip = _check_chip(chip)
    ptype = ProfilerType.RANGE_PROFILER if _kind(kind) is MetricKind.RANGE else ProfilerType.PM_SAMPLING
    return host.max_metrics_per_pass(chip, ptype, counter_availability)
