"""The consistent pass plan (gpuscope._gpu.pass_plan): groups of one pass each, no stall share in the first pass,
and the shares of short kernels recorded on an H200 (benchmarks/bench_stalls_vs_ncu.py) evaluated through it."""

from pathlib import Path

import numpy as np
import pytest

from gpuscope._gpu import metric_lists as lists
from gpuscope._gpu import pass_plan
from gpuscope.cupti import host
from gpuscope.cupti._types import ProfilerType

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "range"
TOPDOWN = tuple(lists.resolve("topdown", "GH100"))


def _passes(groups):
    with host.ProfilerHost("GH100", ProfilerType.RANGE_PROFILER) as h:
        for g in groups:
            h.add_pass_group(g)
        return host.num_passes(h.config_image())


def test_each_add_metrics_call_is_a_pass_group_of_its_own():
    three = [f"smsp__warp_issue_stalled_{r}_per_warp_active.pct" for r in ("wait", "barrier", "membar")]
    assert _passes([three]) == 2
    assert _passes([three, three]) == 4  # the same metrics twice: collected twice


def test_topdown_plan_keeps_the_shares_of_each_pass_over_its_own_counter_in_cuptis_number_of_passes():
    plan = lists.consistent_plan(TOPDOWN, "GH100")
    assert plan.passes == _passes(plan.groups) == 7 == lists.count_passes("topdown", "GH100", plan=False)
    assert lists.count_passes("topdown", "GH100") == 7  # what a session collects
    assert all(_passes([g]) == 1 for g in plan.groups)
    first, warmup = plan.groups[:2]
    # the launch as the program made it, which CUPTI's replay runs slower than any later pass: the instruction
    # counts alone, the same in every execution
    assert set(first) == {"smsp__inst_executed.sum", "smsp__inst_issued.sum", "smsp__thread_inst_executed.sum"}
    # the duration and elapsed cycles in the first stall pass, beside the anchor and the active cycles
    timed = ("sm__cycles_elapsed.max", "gpu__time_duration.sum")
    assert plan.groups[2][:2] == (pass_plan.ANCHOR, pass_plan.CYCLES) and set(timed) <= set(plan.groups[2])
    # the warm-up pass: the reasons that are rarely more than a point, over a warp-active counter of their own
    reasons = tuple(f"smsp__warps_issue_stalled_{r}.sum" for r in pass_plan.WARMUP_REASONS)
    assert warmup == (pass_plan.WARMUP_ANCHOR, *reasons)
    formulas = {m: (num, den, scale) for m, num, den, scale in plan.derived}
    for r in pass_plan.WARMUP_REASONS:
        assert formulas[f"smsp__warp_issue_stalled_{r}_per_warp_active.pct"] == (
            f"smsp__warps_issue_stalled_{r}.sum", pass_plan.WARMUP_ANCHOR, 50.0)  # the counter counts half
    assert formulas["smsp__warp_issue_stalled_wait_per_warp_active.pct"][1:] == (pass_plan.ANCHOR, 100.0)
    anchors = (pass_plan.ANCHOR, *pass_plan.SPREAD_ANCHORS)
    assert plan.anchors == anchors  # a warp-active counter of its own in each of the first four stall passes
    for k, group in enumerate(plan.groups[2:]):
        stalls = group[1:] if k < len(anchors) else group
        assert k >= len(anchors) or group[0] == anchors[k]
        assert all("stalled" in m or (k == 0 and m in (pass_plan.CYCLES, *timed)) for m in stalls)
    # every stall share once, in the warm-up pass or a stall pass
    collected = [m for g in plan.groups[1:] for m in g if "stalled" in m]
    assert len(collected) == len(set(collected)) == 18
    assert plan.requested == TOPDOWN + anchors + (pass_plan.WARMUP_ANCHOR,)  # the Dataset holds the anchors
    assert plan.attrs()["pass_anchors"] == list(anchors)  # the spread is the stall passes' alone


def test_with_other_sets_the_durations_still_go_to_the_first_stall_pass():
    """Issue 51: with other sets (``memory``, ``--set full``) the durations and cycle counts go with the anchor into
    the first stall pass, as with ``topdown`` alone (the first pass, the launch as the program made it, runs slower:
    ``--set full``'s durations were 1.16 times ncu's there); the first pass keeps the bytes and throughputs beside the
    instruction counts, and the warm-up pass its reasons. Chips without the warm-up pass keep them in the first."""
    timed = {"gpu__time_duration.sum", "sm__cycles_elapsed.max"}
    for extra in ("memory", "full"):
        metrics = TOPDOWN + tuple(m for m in lists.resolve(extra, "GH100") if m not in TOPDOWN)
        plan = lists.consistent_plan(metrics, "GH100")
        assert timed <= set(plan.groups[2]) and plan.groups[2][:2] == (pass_plan.ANCHOR, pass_plan.CYCLES)
        assert not timed & set(plan.groups[0]) and "smsp__inst_executed.sum" in plan.groups[0]
        assert plan.groups[1][0] == pass_plan.WARMUP_ANCHOR
        assert all(_passes([g]) == 1 for g in (plan.groups[:-1] if plan.several else plan.groups))
    assert "dram__bytes_read.sum" in lists.consistent_plan(
        TOPDOWN + tuple(m for m in lists.resolve("memory", "GH100") if m not in TOPDOWN), "GH100").groups[0]
    full = lists.consistent_plan(tuple(lists.resolve("full", "GH100")), "GH100")
    assert {"sm__cycles_elapsed.avg.per_second", "sm__cycles_active.avg"} <= set(full.groups[2])
    other = lists.consistent_plan(tuple(lists.resolve("topdown", "GA100")), "GA100")
    assert set(other.groups[0]) == timed  # no warm-up pass there


def test_a_requested_warp_active_counter_is_collected_once():
    """A session's Dataset lists the plan's counters among its metrics: planned again (a fixture's metric list),
    each stays in its own pass."""
    plan = lists.consistent_plan(TOPDOWN, "GH100")
    again = lists.consistent_plan(plan.requested, "GH100")
    assert again.groups == plan.groups and again.requested == plan.requested


def test_a_metric_of_several_passes_goes_in_a_last_group_and_the_stall_shares_keep_the_plan():
    """roofline's sm__ops_path_tensor_src_fp16.sum needs two passes on its own on GH100: it used to hand the whole
    list (``--set full``, ``topdown`` with ``roofline``) to CUPTI's schedule, stall shares of different passes."""
    several = "sm__ops_path_tensor_src_fp16.sum"
    metrics = TOPDOWN + tuple(m for m in lists.resolve("roofline", "GH100") if m not in TOPDOWN)
    assert several in metrics and _passes([[several]]) == 2
    plan = lists.consistent_plan(metrics, "GH100")
    assert plan is not None and plan.several and several in plan.groups[-1]  # with what no one-pass group took
    assert all(_passes([g]) == 1 for g in plan.groups[:-1])
    topdown = lists.consistent_plan(TOPDOWN, "GH100")
    assert plan.groups[2][0] == pass_plan.ANCHOR and plan.anchors == topdown.anchors
    stalls = lambda groups: [tuple(m for m in g if "stalled" in m) for g in groups]  # noqa: E731
    assert stalls(plan.groups[2:len(topdown.groups)]) == stalls(topdown.groups[2:])  # the same stall passes
    assert set(metrics) <= set(plan.requested) and set(plan.collected) >= set(metrics) - {
        m for m, *_ in plan.derived}
    last = _passes([plan.groups[-1]])
    assert lists.count_passes(list(metrics), "GH100") == _passes(plan.groups) == len(plan.groups) - 1 + last
    full = tuple(lists.resolve("full", "GH100"))
    assert lists.consistent_plan(full, "GH100").several
    assert lists.count_passes(list(full), "GH100") <= lists.count_passes(list(full), "GH100", plan=False) + 2


def test_spread_anchors_only_on_chips_where_they_were_checked():
    for chip in ("GA100", "AD102"):
        found = lists.consistent_plan(tuple(lists.resolve("topdown", chip)), chip)
        if found is not None:
            assert found.anchors == (pass_plan.ANCHOR,)
            assert found.requested == tuple(lists.resolve("topdown", chip)) + (pass_plan.ANCHOR,)


def test_values_divide_each_count_by_the_anchor():
    plan = lists.consistent_plan(TOPDOWN, "GH100")
    raw = np.arange(1, len(plan.collected) + 1, dtype=float)
    values = plan.values(raw)
    where = {m: i for i, m in enumerate(plan.collected)}
    m = "smsp__warp_issue_stalled_wait_per_warp_active.pct"
    assert values[TOPDOWN.index(m)] == pytest.approx(100 * raw[where["smsp__warps_issue_stalled_wait.sum"]]
                                                     / raw[where[pass_plan.ANCHOR]])
    raw[where[pass_plan.ANCHOR]] = 0
    assert np.isnan(plan.values(raw)[TOPDOWN.index(m)])


def test_no_plan_without_stall_shares():
    assert lists.consistent_plan(tuple(lists.resolve("launch", "GH100")), "GH100") is None


def _shares(name):
    f = np.load(FIXTURES / name)
    metrics = list(f["metrics"])
    stalls = [i for i, m in enumerate(metrics) if "stalled" in m]
    return f, f["values"][:, stalls].sum(axis=1)


def test_recorded_short_kernels_add_up_through_the_plan():
    """The image of CuPy 1 M-element kernels (3-8 us) and two long Numba kernels, collected with the plan of the time
    (8 passes, before the warm-up pass) on an H100, evaluated again here through its recorded groups: each share
    is its stall counter over the first stall pass's anchor, and the shares come near 100%."""
    f, total = _shares("short_kernels_plan_gh100.npz")
    groups = [str(g).split("|") for g in f["groups"]]
    collected, metrics = [str(m) for m in f["collected"]], [str(m) for m in f["metrics"]]
    assert len(groups) == 8 and groups[2][0] == pass_plan.ANCHOR
    with host.ProfilerHost("GH100", ProfilerType.RANGE_PROFILER) as h:
        for g in groups:
            h.add_pass_group(g)
        for i in range(len(f["values"])):
            raw = dict(zip(collected, h.evaluate(f["image"], i, collected)))
            for k, m in enumerate(metrics):
                if "_per_warp_active.pct" in m:
                    reason = m.removeprefix("smsp__warp_issue_stalled_").removesuffix("_per_warp_active.pct")
                    expected = 100 * raw[f"smsp__warps_issue_stalled_{reason}.sum"] / raw[pass_plan.ANCHOR]
                elif m in raw:
                    expected = raw[m]
                else:
                    continue  # the rates of counts: their formulas are checked above
                assert f["values"][i, k] == pytest.approx(expected, rel=1e-9), m
    assert np.median(total) > 85, total  # 88.7 recorded (CUPTI's schedule: see the next test)


def test_recorded_short_kernels_with_cuptis_schedule_do_not_add_up():
    _, planned = _shares("short_kernels_plan_gh100.npz")
    _, cupti = _shares("short_kernels_cupti_gh100.npz")
    assert np.median(np.abs(cupti - 100)) > 2 * np.median(np.abs(planned - 100)), (cupti, planned)


def _live_plans() -> dict:
    """Every chip's plan of every built-in range set, counted with the loaded CUPTI (no stored plans)."""
    from gpuscope._gpu.chips import list_chips

    out: dict = {}
    for chip in list_chips():
        cm = lists._chip_metrics(chip, lists.MetricKind.RANGE)

        def one_pass(names, chip=chip):
            return host.num_passes(lists.config_image(list(names), chip, "range")) == 1

        for name, mset in lists.metric_sets("range").items():
            metrics = tuple(lists.resolve(name, chip))
            found = pass_plan.plan(metrics, cm.has, one_pass, chip in pass_plan.SPREAD_CHIPS)
            if found is not None:
                groups = [list(g) for g in found.groups]
                if found.several:  # the last group needs several passes (metric_lists.consistent_plan)
                    groups[-1] = {"several": groups[-1]}
                out.setdefault(chip, {})["|".join(metrics)] = groups
    return out


def test_the_stored_plans_are_what_cupti_gives_today():
    assert lists._stored_plans() == _live_plans()


def test_every_stored_plan_is_taken_with_one_check(monkeypatch):
    """A session takes each built-in set's stored plan after one config of all its groups (two with a last group
    of several passes), instead of ~50-70 configs of the packing (0.13-0.18 s of a first session): the stored
    groups must answer every question the packing asks, including a stall group stored with a warp-active
    counter other than the one the packing tries it with, or with none."""
    asked = []
    counted = host.num_passes
    monkeypatch.setattr(host, "num_passes", lambda image: asked.append(1) or counted(image))
    stored = lists._stored_plans()
    assert "GH100" in stored and len(stored) > 20
    try:
        for chip, plans in stored.items():
            for key, groups in plans.items():
                lists.consistent_plan.cache_clear()
                asked.clear()
                found = lists.consistent_plan(tuple(key.split("|")), chip)
                several = isinstance(groups[-1], dict)
                assert len(asked) == 1 + several, (chip, key[:60], len(asked))
                assert [list(g) for g in found.groups] == [
                    g["several"] if isinstance(g, dict) else g for g in groups], chip
    finally:
        lists.consistent_plan.cache_clear()


def test_a_stored_plan_that_no_longer_holds_is_counted_again(monkeypatch):
    key = "|".join(TOPDOWN)
    stored = lists._stored_plans()["GH100"][key]
    wrong = [stored[0] + stored[2][1:]] + stored[1:2] + stored[3:]  # a lead group that needs two passes
    monkeypatch.setattr(lists, "_stored_plans", lambda: {"GH100": {key: wrong}})
    lists.consistent_plan.cache_clear()
    try:
        assert [list(g) for g in lists.consistent_plan(TOPDOWN, "GH100").groups] == stored
    finally:
        lists.consistent_plan.cache_clear()


if __name__ == "__main__":  # python tests/unit/test_pass_plan.py --update: write the stored plans
    import json
    import sys

    if sys.argv[1:] == ["--update"]:
        from gpuscope.cupti import _api

        path = Path(lists.__file__).resolve().parents[1] / "metrics" / "data" / "pass_plans.json"
        note = ("The consistent pass plans of the built-in range sets per chip, made with CUPTI "
                f"{'%d.%d' % _api.version()}'s host API by `python tests/unit/test_pass_plan.py --update`; a "
                "session checks a stored plan with one config before it uses it (gpuscope/_gpu/metric_lists.py).")
        path.write_text(json.dumps({"note": note, "plans": _live_plans()}, indent=1) + "\n")
        print("wrote", path)
