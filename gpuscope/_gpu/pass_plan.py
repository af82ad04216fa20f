"""Pass plans for stall breakdowns: each ratio's counters in one pass, the main ones out of a replay's first two.

CUPTI schedules a metric list into passes as it likes: for the ``topdown`` set on GH100 it puts
``smsp__warps_active`` (the denominator of every ``*_per_warp_active.pct`` stall share) in one pass and the 18
stall counters in the others, so 17 of the 18 shares divide counts of different executions. On kernels of a few
microseconds the executions differ. Under CUPTI kernel replay, the active warps of kernels under 10 us, pass by
pass against ncu's (``probes/probe_pass_position.py``, H200): 1.59 times in the first pass (the launch as the
program made it), 1.20 in the second, then 1.00, 0.99, 0.96 and 0.91-0.92; on longer kernels 1.24, 1.09, then 1.00.
The shares summed to 40-80% of warp-active cycles instead of 100%.

A :class:`PassPlan` collects instead, for the same requested metrics:

* a **first lead group**: the requested metrics that are neither stall shares nor per-cycle rates (durations,
  cycle counts): the launch as the program made it; on the :data:`SPREAD_CHIPS` also the instruction counts
  (``smsp__inst_executed.sum``, ``smsp__inst_issued.sum``, ``smsp__thread_inst_executed.sum``), which do not
  depend on how an execution went, where they fit, and there the first pass keeps the counts alone where the
  others fit in the first stall pass (for the ``topdown`` set: the duration and elapsed cycles, see below);
* a **second group**, the replay's warm-up: on those chips the :data:`WARMUP_REASONS` (``misc``, ``sleeping``,
  ``tex_throttle``: rarely more than a point) over a warp-active counter of that pass, :data:`WARMUP_ANCHOR`; on
  the others, or where the counts do not fit the first pass, the instruction counts;
* **stall groups**, one pass each: a few ``smsp__warps_issue_stalled_<reason>.sum`` counters, the largest reasons
  first; the first also holds the anchor ``sm__warps_active.sum`` (the denominator of every other share) and
  ``smsp__cycles_active.sum``, the next ones each a warp-active counter of their own (:data:`SPREAD_ANCHORS`).

The second pass runs a short kernel longer than the later ones (on the H100, 1.2 times the active warp-cycles at
the median under 10 us, 1.0 from 50 us on: tests/fixtures/range/plan7_rounds_gh100.npz), so only reasons that
weigh little go there, each over that pass's own count. The ``topdown`` set then takes 7 passes on GH100, as many as
CUPTI's own schedule (8 with the instruction counts in a pass of their own and the three reasons in the last stall
passes); on two interleaved rounds of 82 launches, both plans differed from ncu alike (2.7-3.5 against 3.4-3.7
points under 10 us, each from the other by 1.1, each from its own other round by 1.2 and 1.8) and the 7-pass plan
cost what CUPTI's schedule costs (65-69 against 66-71 ms a launch; docs/measurements.md).

The first pass is not the program's launch as it runs unprofiled, either: CUPTI's kernel replay runs it slower
than ncu runs its first pass (by 8% at the median under 10 us; ncu's durations do not change when it flushes the
caches before each pass, so cold caches alone do not explain it). Durations of the same 33 launches under 10 us
against CUPTI's kernel records of the program's own (median, H100, ``probes/probe_replay_durations.py``,
tests/fixtures/range/replay_durations_gh100.npz): 1.62-1.65 times in the plan's first pass, 1.26-1.27 in its
first stall pass, ncu 1.39-1.40; 10-50 us 1.48-1.53, 1.04-1.11 and 1.38-1.42; from 50 us on all within 5%.
So on GH100 the ``topdown`` set's duration and elapsed cycles go with the anchor and ``smsp__cycles_active.sum``
into the first stall pass (with other sets too, ``--set full`` included: the first stall pass keeps room for them
while the other sets' counters fill the passes, so that their duration is not the first pass's, which made
``--set full``'s durations 1.16 times ncu's and its IPC 0.87 times): nearer the program's own, 7-9% below ncu's under 50 us where the first pass was 6-10%
above, and equal to ncu's from 50 us on (1.00 against 1.01-1.03), at no extra pass.

Each group is one ``cuptiProfilerHostConfigAddMetrics`` call, which CUPTI schedules on its own and appends
(:meth:`gpuscope.cupti.host.ProfilerHost.add_pass_group`); the plan checks that every group is one pass, but for
a **last group** of the requested metrics that need several passes on their own (on GH100
``sm__ops_path_tensor_src_fp16.sum`` of the ``roofline`` set), which CUPTI schedules inside that group: such a
metric no longer hands the whole list to CUPTI's schedule (``--set full`` and ``roofline`` with ``topdown`` then
kept the stall shares of different passes). The
requested metrics are computed from the collected counters (:meth:`PassPlan.values`), with CUPTI's definitions:
``smsp__warp_issue_stalled_<r>_per_warp_active.pct = 100 * smsp__warps_issue_stalled_<r>.sum / warps active``
(counted per SM: ``sm__warps_active`` counts the same warp-cycles as ``smsp__warps_active``, within 1-3% on the
probe's kernels, which the Top-Down's normalisation over stall reasons cancels),
``smsp__<x>.avg.per_cycle_active = smsp__<x>.sum / smsp__cycles_active.sum`` and
``smsp__thread_inst_executed_per_inst_executed.ratio = smsp__thread_inst_executed.sum / smsp__inst_executed.sum``.

**Per-pass denominators.** CUPTI evaluates a counter collected in several groups to one value, so one counter cannot
give each pass its own denominator. GH100 has several counters of active warp-cycles, though, which agree when
collected in one pass (``sm__warps_active_realtime`` and ``sm__warps_active_shader_cs_realtime`` equal
``sm__warps_active`` to 0.1% at the median, within 1.3% on 2 us kernels; ``tpc__warps_active_shader_cs_realtime``
within 0.8%, but it makes every kernel replay dearer: ``probes/probe_anchors.py``, H100). One of them in
each of the second and third stall passes measures how alike the passes ran: their spread, ``pass_spread`` of
:func:`gpuscope.metrics.topdown.topdown`, is 0.5-1.1% (median) on kernels of 50 us and more and 5% under 10 us
(with the tpc counter in a fourth pass, 0.5% and 11%), and it ranks the launches whose shares disagree with ncu's
(Spearman 0.71 with four anchors): under 10 us, the launches it passes (40-43 of 66 with three anchors, 23-35 with
four) differ from ncu by 2.2 points (median of the largest share difference; 1.1-2.0 with four), the others by
5.8-8.2. Dividing each pass's counts by its own pass's counter was measured too and agrees with
ncu no better (median largest difference 2.6 against 2.7 points under 10 us) while its sums scatter more (80%
within 100 +/- 5% against 92%), and in iteration mode too, against ncu's application replay (4.0 against 3.9 points,
70% within 100 +/- 5% against 79%, on tests/fixtures/range/iteration_vs_ncu_app_gh100.npz): the stall counts of the
later passes follow the first pass's anchor better than
their own counters, so every share divides by the first stall pass's ``sm__warps_active.sum`` and the other
anchors are the check. The Dataset holds them (``pass_anchors`` attr), and the check is in the data:
``warp_state_coverage`` must be 100 +/- 5% and ``pass_spread`` at most 10%, and rows where they are not are
flagged (``consistent``).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence

import numpy as np

__all__ = ["ANCHOR", "CYCLES", "NCU_ANCHOR", "NCU_LAYOUTS", "SPREAD_ANCHORS", "WARMUP_ANCHOR", "PassPlan", "ncu_plan",
           "plan"]

#: The denominator collected with every stall group: active warp-cycles, counted per SM (it fits beside three stall
#: counters on GH100 where ``smsp__warps_active`` fits beside two, so the plan needs no more passes than CUPTI's).
ANCHOR = "sm__warps_active.sum"
#: Counters of active warp-cycles that CUPTI collects as counters of their own, one in each stall pass after the
#: first, in this order: the spread of their values over the anchor's is the spread of the passes' executions.
#: (``tpc__warps_active_shader_cs_realtime.sum``, which agrees as well, was the third until it was found to make
#: every kernel replay dearer: 90-92 ms a launch against 73-77 with any of the others, on the 82 launches of
#: ``benchmarks/bench_stalls_vs_ncu.py``, H100; docs/measurements.md.)
SPREAD_ANCHORS = ("sm__warps_active_realtime.sum", "sm__warps_active_shader_cs_realtime.sum")
#: The chips on which the :data:`SPREAD_ANCHORS` were checked to count what ``sm__warps_active`` counts, in one pass
#: (``sm__warps_active_shader_cs`` counts half of it on GH100: a counter of the same name need not agree elsewhere).
SPREAD_CHIPS = frozenset({"GH100"})
#: The denominator of the stall reasons of the warm-up pass (the second: a replay's first), one more counter of
#: active warp-cycles, checked on the :data:`SPREAD_CHIPS` only: it counts half of what ``sm__warps_active`` counts
#: (0.5000 in one pass, ``probes/probe_anchors.py``), hence :data:`WARMUP_SCALE`.
WARMUP_ANCHOR = "sm__warps_active_shader_cs.sum"
WARMUP_SCALE = 50.0
#: The stall reasons the warm-up pass collects over its own :data:`WARMUP_ANCHOR`: those that are rarely more than a
#: point of a kernel's warp-active cycles (on the 82 launches of ``benchmarks/bench_stalls_vs_ncu.py``, H100: at
#: most 0.2, 1.6 and 0.0%), three that fit one pass beside the anchor on GH100.
WARMUP_REASONS = ("misc", "sleeping", "tex_throttle")
#: The denominator of the per-cycle-active rates (IPC): cycles in which an SMSP had a warp active.
CYCLES = "smsp__cycles_active.sum"
#: Whether the other sets' counters (``--set full``) may fill the stall passes' spare room; where False they go to the
#: second pass or to the last group that CUPTI schedules, after the stall passes (a measurement's switch:
#: ``probes/probe_full_spread.py``).
PACK_STALL_PASSES = True
#: Collected in the second lead group when no instruction count is asked for: a pass that holds no ratio.
FILLER = "smsp__inst_executed.sum"
_STALL = re.compile(r"^smsp__warp_issue_stalled_(\w+)_per_warp_active\.pct$")
_PER_CYCLE = re.compile(r"^(smsp__\w+)\.avg\.per_cycle_active$")
_THREAD_RATIO = ("smsp__thread_inst_executed_per_inst_executed.ratio", "smsp__thread_inst_executed.sum",
                 "smsp__inst_executed.sum")
_DURATION = "gpu__time_duration.sum"
#: What the first stall pass takes with the plan's durations (``timed_later``): the launch's duration, its cycle
#: counts and its clocks, which the replay's first pass (the launch as the program made it) runs slower than any
#: later pass: durations, elapsed and active cycles, clock rates, and IPC-like rates over them.
_TIMED = re.compile(r"^(gpu__time_duration|\w+__cycles_(elapsed|active))\.(sum|max|min|avg)(\.per_second)?$")
#: Stall reasons in the order they take the stall passes: the ones that are large on short kernels first. Passes
#: after the second run alike within a few percent, drifting (active warps of kernels under 10 us against ncu's:
#: 1.00, 0.99, 0.96, then 0.91-0.92), so the early ones are the ones to spend on the reasons that weigh most.
FIRST_REASONS = ("long_scoreboard", "imc_miss", "wait", "short_scoreboard", "selected", "not_selected",
                 "no_instruction", "math_pipe_throttle", "mio_throttle", "lg_throttle", "barrier")


@dataclasses.dataclass(frozen=True)
class PassPlan:
    """What a session collects for a requested metric list, in which pass groups, and how it gets back.

    Attributes
    ----------
    requested : tuple of str
        The metrics the Dataset holds, in order.
    collected : tuple of str
        The metrics CUPTI evaluates from the counter data (raw counts, the anchor, the other requested metrics).
    groups : tuple of tuple of str
        The pass groups, lead group first; each is one pass, but for the last where :attr:`several`.
    derived : tuple of (str, str, str, float)
        ``(requested, numerator, denominator, scale)``: ``requested = scale * numerator / denominator``.
    anchors : tuple of str
        The warp-active counters of the stall passes, in pass order (:data:`ANCHOR` first); also requested, so
        that the Dataset holds them.
    several : bool
        The last group holds metrics that need several passes on their own, which CUPTI schedules (no ratio of
        the plan reads them).
    """

    requested: tuple[str, ...]
    collected: tuple[str, ...]
    groups: tuple[tuple[str, ...], ...]
    derived: tuple[tuple[str, str, str, float], ...]
    anchors: tuple[str, ...] = ()
    several: bool = False
    name: str = "consistent"

    def __post_init__(self):
        where = {m: i for i, m in enumerate(self.collected)}
        formulas = {d[0]: d for d in self.derived}
        index = []
        for m in self.requested:
            if m in formulas:
                _, num, den, scale = formulas[m]
                index.append((where[num], where[den], scale))
            else:
                index.append((where[m], -1, 1.0))
        object.__setattr__(self, "_index", tuple(index))

    @property
    def passes(self) -> int:
        """Passes of the one-pass groups (the several passes of a last group :attr:`several` count as one)."""
        return len(self.groups)

    def values(self, raw: np.ndarray) -> np.ndarray:
        """The requested metrics' values (float64, in :attr:`requested` order) from *raw*, the values of
        :attr:`collected` of one range. A ratio whose denominator is 0 is NaN (no active warps or cycles)."""
        raw = np.asarray(raw, dtype=np.float64)
        out = np.empty(len(self.requested))
        for k, (num, den, scale) in enumerate(self._index):
            if den < 0:
                out[k] = raw[num]
            else:
                d = raw[den]
                out[k] = scale * raw[num] / d if d > 0 else np.nan
        return out

    def formulas(self) -> dict[str, str]:
        """Requested metric -> how it was computed (for the Dataset's attrs)."""
        return {m: (f"{scale:g} * {num} / {den}" if scale != 1 else f"{num} / {den}")
                for m, num, den, scale in self.derived}

    def attrs(self) -> dict:
        """Dataset attrs that record the plan: the groups, one string per pass, lead first."""
        return {"pass_plan": self.name, "pass_groups": [", ".join(g) for g in self.groups],
                "pass_anchors": list(self.anchors)}


def plan(metrics: Sequence[str], has: Callable[[str], bool], one_pass: Callable[[Sequence[str]], bool],
         spread: bool = False) -> PassPlan | None:
    """The consistent plan for *metrics*, or None where CUPTI's own schedule is as good (no stall shares asked
    for, or the chip lacks the counters).

    Parameters
    ----------
    metrics : sequence of str
        Resolved metric names, as the session collects them.
    has : callable
        ``has(name)``: whether the chip knows a full metric name.
    one_pass : callable
        ``one_pass(names)``: whether *names* fit in one pass on their own (the host API's pass count of a config
        with that one group).
    spread : bool
        Collect the :data:`SPREAD_ANCHORS` (on the chips of :data:`SPREAD_CHIPS`).
    """
    if spread:  # the durations beside the first stall pass's anchor where they fit there, else in the first pass
        asked: dict[tuple[str, ...], bool] = {}

        def once(names) -> bool:  # the second try asks mostly what the first asked: each group counted once
            key = tuple(names)
            if key not in asked:
                asked[key] = one_pass(names)
            return asked[key]

        found = _plan(metrics, has, once, spread, timed_later=True)
        return found if found is not False else _plan(metrics, has, once, spread, timed_later=False)
    return _plan(metrics, has, one_pass, spread, timed_later=False)


def _plan(metrics, has, one_pass, spread: bool, timed_later: bool) -> PassPlan | None | bool:
    """:func:`plan`; with *timed_later*, the first lead group's metrics (durations, cycle counts: *timed*) go to
    the first stall pass and the first pass holds the instruction counts alone, or False where they do not fit
    there (or the plan has no warm-up pass)."""
    metrics = list(dict.fromkeys(metrics))
    own = (*SPREAD_ANCHORS, WARMUP_ANCHOR) if spread else ()  # the plan's warp-active counters besides ANCHOR
    stalls = {m: found.group(1) for m in metrics if (found := _STALL.match(m))}
    if not stalls or not has(ANCHOR):
        return None
    derived: list[tuple[str, str, str, float]] = []
    first: list[str] = []  # the launch as the program made it
    counts: list[str] = []  # the second pass: instruction counts, the same in every execution
    rest: list[str] = []  # the requested metrics that are neither stall shares nor rates of counts
    items: list[str] = []  # what the stall passes collect beside the anchor
    several: list[str] = []  # metrics no one-pass group has room for: a last group, which CUPTI schedules
    for m in metrics:
        if m in stalls:
            raw = f"smsp__warps_issue_stalled_{stalls[m]}.sum"
            if not has(raw):
                return None
            derived.append((m, raw, ANCHOR, 100.0))
            items.append(raw)
        elif (pc := _PER_CYCLE.match(m)) and has(f"{pc.group(1)}.sum") and has(CYCLES):
            derived.append((m, f"{pc.group(1)}.sum", CYCLES, 1.0))
            counts.append(f"{pc.group(1)}.sum")
            items.append(CYCLES)  # the sort below puts it in the first stall pass
        elif m == _THREAD_RATIO[0] and has(_THREAD_RATIO[1]) and has(_THREAD_RATIO[2]):
            derived.append((m, _THREAD_RATIO[1], _THREAD_RATIO[2], 1.0))
            counts += [_THREAD_RATIO[1], _THREAD_RATIO[2]]
        elif m != ANCHOR and m not in own:  # the plan's own counters are placed below
            rest.append(m)
    others: list[str] = []  # for the spare room of the count and stall passes, else the last group
    counts = list(dict.fromkeys(counts))
    timed: list[str] = []  # with timed_later, for the first stall pass: durations and cycle counts
    if timed_later:
        timed = [m for m in rest if _TIMED.match(m)] or ([_DURATION] if has(_DURATION) else [])
        rest = [m for m in rest if m not in timed]
    for m in rest:  # in the first pass where they fit (beside the counts, where the timed ones leave it to them)
        if one_pass([*(counts if timed_later else ()), *first, m]):
            first.append(m)
        else:
            others.append(m)
    if not first and not timed and has(_DURATION):
        first = [_DURATION]
    filler = [] if counts or not has(FILLER) else [FILLER]
    if not (first or timed) or not (counts or filler) or not one_pass(counts or filler):
        return None
    if timed_later and not counts:
        return False
    rank = {f"smsp__warps_issue_stalled_{r}.sum": k for k, r in enumerate(FIRST_REASONS)}
    items = sorted(dict.fromkeys(items), key=lambda m: (m != CYCLES, rank.get(m, len(rank))))  # stable
    second = counts or filler  # the second pass: instruction counts (else a filler), no ratio
    warmup = [_stall(r) for r in WARMUP_REASONS if _stall(r) in items]
    if (spread and warmup and has(WARMUP_ANCHOR)
            and one_pass([*first, *counts])
            and one_pass([WARMUP_ANCHOR, *warmup])):
        # the counts join the first pass; the second takes the warm-up reasons over a warp-active counter of its own
        first, second = [*first, *counts], [WARMUP_ANCHOR, *warmup]
        items = [m for m in items if m not in warmup]
        derived = [(m, num, WARMUP_ANCHOR, WARMUP_SCALE) if num in warmup else (m, num, den, scale)
                   for m, num, den, scale in derived]
    elif timed_later:
        return False
    else:
        warmup = []
    groups: list[list[str]] = []
    for item in items:  # the first stall group keeps room for the timed metrics (timed_later)
        for k, g in enumerate(groups):
            if one_pass([ANCHOR, *g, item, *(timed if k == 0 else ())]):
                g.append(item)
                break
        else:
            if not one_pass([ANCHOR, item]):
                return None  # a stall counter that needs several passes on its own: CUPTI schedules the list
            groups.append([item])

    def anchor_of(k: int) -> list[str]:  # the warp-active counter stall pass k will hold (tried with it)
        if k == 0:
            return [ANCHOR]
        return [SPREAD_ANCHORS[k - 1]] if spread and k <= len(SPREAD_ANCHORS) and has(SPREAD_ANCHORS[k - 1]) else []

    for m in others:  # the second pass, the stall passes, else a last group that CUPTI schedules
        if one_pass([*second, m]):
            second.append(m)
            continue
        for k, g in enumerate(groups if PACK_STALL_PASSES else ()):
            if one_pass([*anchor_of(k), *g, m, *(timed if k == 0 else ())]):
                g.append(m)
                break
        else:
            several.append(m)
    if timed_later:  # the first pass keeps the counts and what needs no other pass's execution, not the timed ones
        if not groups or not one_pass([ANCHOR, *groups[0], *timed]):
            return False
        groups[0] += timed
    stall_groups, anchors = [], []
    for k, g in enumerate(groups):  # packed with ANCHOR in each: a warp-active counter fits beside every group
        anchor = next(iter(anchor_of(k)), None)
        if anchor is not None and k > 0 and not one_pass([anchor, *g]):
            anchor = None
        stall_groups.append(tuple(g) if anchor is None else (anchor, *g))
        anchors += [anchor] if anchor is not None else []
    for m in metrics:  # a requested anchor that no pass took (fewer stall passes than anchors, no warm-up pass)
        if m in own and m not in (*anchors, *second):
            if not one_pass([*first, m]):
                return False if timed_later else None
            first.append(m)
    all_groups = (tuple(first), tuple(second), *stall_groups) + ((tuple(several),) if several else ())
    collected = tuple(dict.fromkeys(m for g in all_groups for m in g))
    counted = [*anchors, *([WARMUP_ANCHOR] if warmup else [])]  # the Dataset holds the warp-active counters
    requested = tuple(metrics) + tuple(a for a in counted if a not in metrics)
    return PassPlan(requested, collected, all_groups, tuple(derived), tuple(anchors), bool(several))


def _stall(reason: str) -> str:
    return f"smsp__warps_issue_stalled_{reason}.sum"


#: The denominator of Nsight Compute's stall shares: active warp-cycles counted per SMSP.
NCU_ANCHOR = "smsp__warps_active.sum"
#: Nsight Compute's pass layout of the ``topdown`` set's counters, by chip, in pass order (``pass_groups="ncu"``).
#: Measured on an H100 with ncu's kernel replay (``probes/probe_ncu_passes.py``: a kernel whose work
#: grows with the time since its launch, so that each counter's value tells the pass that collected it). Every
#: counter ncu's ratios are made of stood in one of six passes, each doing about 1.5 times the work of the one
#: before (instructions, cycles and the duration; wait and sleeping; the denominator with dispatch_stall,
#: branch_resolving and barrier; math_pipe_throttle, long_scoreboard and lg_throttle; membar, not_selected, misc;
#: no_instruction, selected and short_scoreboard). mio_throttle came with the first pass, where CUPTI cannot add it
#: to one pass: it goes to the first with room. imc_miss, drain and tex_throttle, which that kernel could not make
#: grow, are where CUPTI has room for them, imc_miss in the second pass: with it in a last pass instead, the shares
#: of kernels under 10 us differed from ncu's by 5.4 points (median of the largest difference) against 2.0
#: (docs/measurements.md). 7 passes, as CUPTI's own schedule of the set.
NCU_LAYOUTS = {
    "GH100": (
        ("gpu__time_duration.sum", "sm__cycles_elapsed.max", "smsp__inst_executed.sum", "smsp__inst_issued.sum",
         "smsp__thread_inst_executed.sum", CYCLES),
        (_stall("wait"), _stall("sleeping"), _stall("imc_miss")),
        (NCU_ANCHOR, _stall("dispatch_stall"), _stall("branch_resolving"), _stall("barrier")),
        (_stall("math_pipe_throttle"), _stall("long_scoreboard"), _stall("lg_throttle")),
        (_stall("membar"), _stall("not_selected"), _stall("misc"), _stall("mio_throttle")),
        (_stall("no_instruction"), _stall("selected"), _stall("short_scoreboard")),
        (_stall("drain"), _stall("tex_throttle")),
    ),
}


def ncu_plan(metrics: Sequence[str], layout: Sequence[Sequence[str]],
             one_pass: Callable[[Sequence[str]], bool]) -> PassPlan | None:
    """The stall shares of *metrics* collected in Nsight Compute's pass *layout* (:data:`NCU_LAYOUTS`), each share
    its stall counter over :data:`NCU_ANCHOR` whichever passes they came from, as ncu computes it: the values of a
    launch then agree with ncu's launch by launch, its inconsistencies on kernels of a few microseconds included.
    None where *metrics* hold no stall share or one whose counter the layout lacks. The other requested metrics
    join the first pass where they fit, else a last group that CUPTI schedules."""
    metrics = list(dict.fromkeys(metrics))
    placed = {m for g in layout for m in g}
    derived: list[tuple[str, str, str, float]] = []
    rest: list[str] = []
    for m in metrics:
        if found := _STALL.match(m):
            raw = _stall(found.group(1))
            if raw not in placed:
                return None
            derived.append((m, raw, NCU_ANCHOR, 100.0))
        elif (pc := _PER_CYCLE.match(m)) and f"{pc.group(1)}.sum" in placed:
            derived.append((m, f"{pc.group(1)}.sum", CYCLES, 1.0))
        elif m == _THREAD_RATIO[0]:
            derived.append((m, _THREAD_RATIO[1], _THREAD_RATIO[2], 1.0))
        elif m not in placed:
            rest.append(m)
    if not any(_STALL.match(d[0]) for d in derived):
        return None
    first, several = list(layout[0]), []
    for m in rest:
        (first if one_pass([*first, m]) else several).append(m)
    groups = (tuple(first), *(tuple(g) for g in layout[1:])) + ((tuple(several),) if several else ())
    collected = tuple(dict.fromkeys(m for g in groups for m in g))
    return PassPlan(tuple(metrics), collected, groups, tuple(derived), (), bool(several), name="ncu")
