"""Metric lists as a chip collects them: set and metric names resolved and checked, config images, passes counted.

A named set (:mod:`gpuscope.metrics.catalog`) is resolved for the chip: its alternatives where the chip lacks a
metric (or, for PM sampling, where it does not fit the one pass), with what was substituted or left out. Names are
checked against the chip's catalog (:mod:`gpuscope._gpu.catalog`).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
from collections.abc import Iterable, Sequence

from gpuscope._gpu.catalog import MetricKind, _chip_metrics, _kind
from gpuscope._gpu.chips import resolve_chip
from gpuscope.errors import UnknownMetricError
from gpuscope.metrics import catalog as _sets

__all__ = [
    "config_image",
    "count_passes",
    "expand",
    "max_metrics_per_pass",
    "metric_set",
    "metric_sets",
    "resolution",
    "resolve",
    "split_list",
]


def forget_hosts() -> None:
    """Drop the cached host objects (CUPTI is being detached: they belong to the CUPTI that goes away)."""
    _chip_metrics.cache_clear()
    _set_on_chip.cache_clear()
    consistent_plan.cache_clear()


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
    cm = _chip_metrics(resolve_chip(chip), kind)
    sets = _sets.all_sets()
    out: list[str] = []
    substituted: dict = {}
    left_out: list[str] = []
    units_changed: dict = {}
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
            units_changed.update(on_chip.units_changed)
            left_out += [m for m in on_chip.left_out if m not in left_out]
            out += [cm.check(m) for m in on_chip.metrics if m not in out]
        elif "__" not in name and (close := difflib.get_close_matches(name, sets, n=3, cutoff=0.6)):
            raise UnknownMetricError(
                f"{name!r} is neither a metric nor a metric set. Did you mean the set {' or '.join(map(repr, close))}? "
                f"Metric sets: {', '.join(sets)}.", name, tuple(close))
        elif name not in out:
            out.append(cm.check(name))
    return _sets.SetOnChip(tuple(out), substituted, tuple(left_out), units_changed)


@functools.cache
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

    on_chip = _sets.get_set(name).on_chip(cm.has, fits)
    if not on_chip.substituted:
        return on_chip
    # the sets are named as on GH100: a substitute in other units than its original there measures something else
    reference = _chip_metrics(_sets.REFERENCE_CHIP, kind)
    changed = {}
    for original, group in on_chip.substituted.items():
        before = reference.info(original).units
        after = sorted({cm.info(m).units for m in group})
        if after != [before] and [_same_sectors(u) for u in after] != [_same_sectors(before)]:
            changed[original] = (before, ", ".join(after))
    return dataclasses.replace(on_chip, units_changed=changed)


def _same_sectors(unit: str) -> str:
    """The unit with the "sys" of syslts__ sectors taken off: Blackwell's system-memory L2 slices count the same
    32-byte sectors as lts__ (unit ``sysl2_sector`` against ``l2_sector``)."""
    return unit.removeprefix("sys")


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
        No names, a name that is neither a metric (``unit__...``) nor a set (a typo such as ``topdwn``: the
        message names the closest sets), sets of both kinds, or a set of the other kind than *kind*.
    """
    names = split_list(items)
    if not names:
        raise ValueError("No metrics given: name metrics or metric sets, separated by commas.")
    sets = _sets.all_sets()
    for name in names:
        if name not in sets and "__" not in name:  # every CUPTI metric is unit__name: this is a set's name
            try:
                _sets.get_set(name)
            except KeyError as exc:
                raise ValueError(exc.args[0]) from None
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


@functools.lru_cache(maxsize=64)
def consistent_plan(metrics: tuple[str, ...], chip: str):
    """The :class:`gpuscope._gpu.pass_plan.PassPlan` of resolved *metrics* on *chip* (None: CUPTI schedules them).
    Made once per list and chip (about 0.2 s of host-API pass counts for the ``topdown`` set)."""
    from gpuscope._gpu import pass_plan
    from gpuscope.cupti import host

    cm = _chip_metrics(resolve_chip(chip), MetricKind.RANGE)
    stored = _stored_plans().get(cm.chip, {}).get("|".join(metrics))
    if stored is not None:
        # the greedy packing again, asking the stored groups instead of CUPTI (a last group stored as
        # {"several": [...]} needs several passes); one config of all groups then checks that each is still one
        # pass under the loaded CUPTI (the last, of several, as many as on its own)
        several = list(stored[-1]["several"]) if stored and isinstance(stored[-1], dict) else None
        groups = [frozenset(g) for g in (stored[:-1] if several is not None else stored)]
        found = pass_plan.plan(metrics, cm.has, functools.partial(_fits_a_stored_group, groups),
                               cm.chip in pass_plan.SPREAD_CHIPS)
        expected = [set(g) for g in groups] + ([set(several)] if several is not None else [])
        if found is not None and [set(g) for g in found.groups] == expected:
            passes = len(groups) + (host.num_passes(config_image(several, cm.chip, "range")) if several else 0)
            if host.num_passes(grouped_config_image(found.groups, cm.chip)) == passes:
                return found

    return pass_plan.plan(metrics, cm.has, functools.partial(_one_pass, cm.chip), cm.chip in pass_plan.SPREAD_CHIPS)


def _one_pass(chip: str, names) -> bool:
    """Whether *names* fit in one range-profiler pass on *chip* on their own (the host API's pass count)."""
    from gpuscope.cupti import host

    return host.num_passes(config_image(list(names), chip, "range")) == 1


@functools.lru_cache(maxsize=16)
def ncu_layout_plan(metrics: tuple[str, ...], chip: str):
    """The :func:`gpuscope._gpu.pass_plan.ncu_plan` of resolved *metrics* on *chip* (``pass_groups="ncu"``).

    Raises
    ------
    ValueError
        Nsight Compute's layout was not measured on *chip*, or *metrics* hold no warp-stall share it places.
    """
    from gpuscope._gpu import pass_plan

    cm = _chip_metrics(resolve_chip(chip), MetricKind.RANGE)
    layout = pass_plan.NCU_LAYOUTS.get(cm.chip)
    if layout is None:
        raise ValueError(f"pass_groups='ncu': Nsight Compute's pass layout was measured on "
                         f"{', '.join(sorted(pass_plan.NCU_LAYOUTS))} only, not on {cm.chip}; use the default "
                         "pass_groups=None (each share's counters in one pass) or 'cupti'.")
    found = pass_plan.ncu_plan(metrics, layout, functools.partial(_one_pass, cm.chip))
    if found is None:
        raise ValueError("pass_groups='ncu' lays out the warp-stall shares of the 'topdown' set "
                         "(smsp__warp_issue_stalled_*_per_warp_active.pct); these metrics hold none it places.")
    return found


def _fits_a_stored_group(groups, names) -> bool:
    """Whether *names* is one pass by the stored *groups*: a subset of one of them, where the packing's
    :data:`~gpuscope._gpu.pass_plan.ANCHOR` may join any stall group (the packing tries each stall group with
    ``ANCHOR``, and only at the end gives the groups after the first their own counter of active warps,
    :data:`~gpuscope._gpu.pass_plan.SPREAD_ANCHORS`, or none where there are more groups than counters)."""
    from gpuscope._gpu import pass_plan

    warp = {pass_plan.ANCHOR, *pass_plan.SPREAD_ANCHORS}
    names = set(names)
    core, anchors = names - warp, names & warp

    def stalls(g) -> bool:
        return any(m.startswith("smsp__warps_issue_stalled_") for m in g)

    return any(core <= g and (anchors <= g or (anchors == {pass_plan.ANCHOR} and stalls(g))) for g in groups)


@functools.cache
def _stored_plans() -> dict:
    """``{chip: {"|".join(metrics): groups}}``: the plans of the built-in sets, made offline with CUPTI's host API
    (``python tests/unit/test_pass_plan.py --update``) so that a session need not count ~50 configs (0.3 s)."""
    import json
    from importlib import resources

    try:
        text = resources.files("gpuscope.metrics").joinpath("data/pass_plans.json").read_text()
    except FileNotFoundError:
        return {}
    return json.loads(text)["plans"]


def checked_groups(groups, metrics: Sequence[str]) -> tuple[tuple[str, ...], ...]:
    """*groups* (sequences of metric names) checked against the session's *metrics*, as a hashable tuple; metrics
    in no group form one more group at the end. None or empty gives ``()`` (CUPTI schedules all metrics)."""
    if not groups:
        return ()
    if isinstance(groups, str) or not all(isinstance(g, (list, tuple)) for g in groups):
        raise TypeError("pass_groups must be a list of lists of metric names.")
    known = set(metrics)
    out, seen = [], set()
    for group in groups:
        unknown = [m for m in group if m not in known]
        if unknown:
            raise ValueError(f"pass_groups names metrics the session does not collect: {unknown[:5]}; add them to "
                             "metrics= too.")
        if group:
            out.append(tuple(group))
            seen.update(group)
    rest = tuple(m for m in metrics if m not in seen)
    if rest:
        out.append(rest)
    return tuple(out)


def count_passes(metrics, chip: str | None = None, kind: str | None = None, counter_availability=None, *,
                 plan: bool = True) -> int:
    """How many passes (replays) a session needs to collect *metrics* (a set name or a list).

    Where the list holds warp-stall shares (the ``topdown`` set), sessions collect it with gpuscope's consistent
    pass plan (:mod:`gpuscope._gpu.pass_plan`), which takes as many passes as CUPTI's own schedule for the
    ``topdown`` set on GH100 (7) and one or two more elsewhere; ``plan=False`` gives CUPTI's own count.

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

    chip = resolve_chip(chip)
    if kind is None:
        metrics, kind = expand(metrics)
    names = resolve(metrics, chip, kind)
    if plan and _kind(kind) is MetricKind.RANGE:
        found = consistent_plan(tuple(names), chip)
        if found is not None:
            return host.num_passes(grouped_config_image(found.groups, chip, counter_availability))
    return host.num_passes(config_image(names, chip, kind, counter_availability))


def grouped_config_image(groups, chip: str, counter_availability=None):
    """The range profiler's config image of *groups*, each a pass group of its own (one ConfigAddMetrics call)."""
    from gpuscope.cupti import host
    from gpuscope.cupti._types import ProfilerType

    with host.ProfilerHost(chip, ProfilerType.RANGE_PROFILER, counter_availability) as h:
        for group in groups:
            h.add_pass_group(group)
        return h.config_image()


def max_metrics_per_pass(chip: str | None = None, kind: str = "range", counter_availability=None) -> int:
    """The most hardware metrics one pass can hold on *chip*."""
    from gpuscope.cupti import host
    from gpuscope.cupti._types import ProfilerType

    chip = resolve_chip(chip)
    ptype = ProfilerType.RANGE_PROFILER if _kind(kind) is MetricKind.RANGE else ProfilerType.PM_SAMPLING
    return host.max_metrics_per_pass(chip, ptype, counter_availability)
