"""The 7-pass plan (instruction counts in the first pass, the warm-up pass with misc, sleeping and tex_throttle over a
warp-active counter of its own) on a real recording: two interleaved rounds, in one H100 process, of the plan, the
8-pass plan before it (as a layout: benchmarks/layouts/plan8_gh100.json), Nsight Compute's layout and CUPTI's
schedule, on the 82 launches of benchmarks/bench_stalls_vs_ncu.py, beside ncu's values for the same launches, twice
(tests/fixtures/range/plan7_rounds_gh100.npz: ``bench_stalls_vs_ncu.py --only-kernel --rounds 2 --layout
benchmarks/layouts/plan8_gh100.json``, then ``--rounds-fixture``)."""

from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import gpuscope as gs
from gpuscope._gpu import metric_lists, pass_plan

from .test_ncu_layout import _largest_difference

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "range" / "plan7_rounds_gh100.npz"


@pytest.fixture(scope="module")
def rec():
    return np.load(FIXTURE)


def _short(rec):
    return rec["duration_ns"] < 10e3


def _largest(a, b, where):
    """Median over the launches *where* of the largest difference over the 18 shares (points)."""
    return float(np.median(_largest_difference(a, b)[where]))


def test_the_recording_is_the_plan_of_today(rec):
    """The fixture's anchors are what the plan collects now: three stall passes with one each, and the warm-up
    pass's own counter."""
    plan = metric_lists.consistent_plan(tuple(gs.metric_set("topdown").metrics), "GH100")
    assert list(rec["plan_anchors"]) == list(plan.anchors)
    assert str(rec["warmup_anchor"]) == pass_plan.WARMUP_ANCHOR == plan.groups[1][0]
    assert list(rec["plan_metrics"]) == list(plan.requested)


@pytest.mark.parametrize("k", [1, 2])
def test_the_shares_of_short_kernels_add_up(rec, k):
    """The issue's aim of 100 +/- 5% on 90% of launches, met in both rounds (94%); ncu's own shares: 55%."""
    short = _short(rec)
    within = lambda s: np.mean(np.abs(s.sum(axis=1)[short] - 100) <= 5)  # noqa: E731
    assert within(rec[f"plan_{k}"]) >= 0.9
    assert within(rec["ncu_2"]) < 0.7  # what the yardstick does on these launches


def test_the_plan_measures_what_the_eight_pass_plan_measured(rec):
    """Round by round, the two plans differ per launch less than either differs from its own other round: moving the
    instruction counts and three small reasons into the first two passes changed nothing the rounds can tell
    (1.1 points against 1.2 and 1.8, under 10 us)."""
    short = _short(rec)
    own = max(_largest(rec["plan_1"], rec["plan_2"], short), _largest(rec["plan8_1"], rec["plan8_2"], short))
    for k in (1, 2):
        assert _largest(rec[f"plan_{k}"], rec[f"plan8_{k}"], short) <= own


def test_against_ncu_the_plan_is_as_close_as_the_eight_pass_plan(rec):
    """Median of the largest share difference against ncu under 10 us, the mean of the two rounds: 3.1 against the
    8-pass plan's 3.6 (ncu against itself: 1.2); from 10 us on both within ncu's noise + 1 point."""
    short, ref = _short(rec), rec["ncu_1"]
    mean = lambda name: np.mean([_largest(rec[f"{name}_{k}"], ref, short) for k in (1, 2)])  # noqa: E731
    assert mean("plan") <= mean("plan8")
    noise = _largest(rec["ncu_2"], ref, ~short)
    for k in (1, 2):
        assert _largest(rec[f"plan_{k}"], ref, ~short) <= noise + 1


def test_the_warmup_pass_runs_short_kernels_longer(rec):
    """The counter of the warm-up pass (the second: a replay's first) over the first stall pass's anchor: 1.2 times
    the active warp-cycles at the median on kernels under 10 us, as the pass-position probe found on the H200
    (1.20), and the same on kernels of 50 us and more (the counter counts half: doubled)."""
    names = list(rec["plan_metrics"])
    values = rec["plan_values"]
    ratio = 2 * values[:, names.index(pass_plan.WARMUP_ANCHOR)] / values[:, names.index(pass_plan.ANCHOR)]
    short, long = _short(rec), rec["duration_ns"] >= 50e3
    assert 1.1 < np.median(ratio[short]) < 1.35
    assert np.all(np.abs(ratio[long] - 1) < 0.1), ratio[long]


def test_the_launches_called_consistent_agree_with_ncu_better_than_the_others(rec):
    """gs.topdown on the plan's first round, with its three anchors: the short launches it calls consistent differ
    from ncu less than the others."""
    names = [str(m) for m in rec["plan_metrics"]]
    ds = xr.Dataset({m: ("range", rec["plan_values"][:, i]) for i, m in enumerate(names)},
                    attrs={"compute_capability": "9.0", "pass_plan": "consistent",
                           "pass_anchors": [str(a) for a in rec["plan_anchors"]]})
    td = gs.topdown(ds, check="ignore")
    consistent = td["consistent"].values.astype(bool)
    short = _short(rec)
    good, bad = short & consistent, short & ~consistent
    assert good.sum() >= 20 and bad.sum() >= 10
    assert _largest(rec["plan_1"], rec["ncu_1"], good) < _largest(rec["plan_1"], rec["ncu_1"], bad) / 2
