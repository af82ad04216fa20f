"""pass_spread and consistent on a real recording: 82 launches of a PyTorch training step, CuPy 1 M-element kernels
and two long Numba kernels, collected with the consistent pass plan in kernel mode on an H100, beside ncu's values
for the same launches, twice (``benchmarks/bench_stalls_vs_ncu.py``, tests/fixtures/range/stalls_vs_ncu_gh100.npz)."""

import warnings
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import gpuscope as gs
from gpuscope._gpu import pass_plan
from gpuscope._results.report import report
from gpuscope.metrics import topdown_checks

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "range" / "stalls_vs_ncu_gh100.npz"
REASONS = ("no_instruction", "barrier", "membar", "branch_resolving", "sleeping", "misc", "dispatch_stall",
           "math_pipe_throttle", "long_scoreboard", "imc_miss", "mio_throttle", "drain", "lg_throttle",
           "short_scoreboard", "wait", "tex_throttle", "selected", "not_selected")
PCT = "smsp__warp_issue_stalled_{}_per_warp_active.pct"
#: The warp-active counters of the recording, one per stall pass (the plan then had a third spread anchor)
RECORDED_ANCHORS = [pass_plan.ANCHOR, *pass_plan.SPREAD_ANCHORS, "tpc__warps_active_shader_cs_realtime.sum"]


@pytest.fixture(scope="module")
def recorded():
    f = np.load(FIXTURE)
    metrics = [str(m) for m in f["metrics"]]
    ds = xr.Dataset({m: ("range", f["values"][:, i]) for i, m in enumerate(metrics)},
                    coords={"kernel": ("range", f["kernels"].astype(str))},
                    attrs={"compute_capability": "9.0", "pass_plan": "consistent",
                           "pass_anchors": [str(a) for a in f["pass_anchors"]]})
    ncu_metrics = [str(m) for m in f["ncu_metrics"]]

    def shares(rows):
        return np.stack([rows[:, ncu_metrics.index(PCT.format(r))] for r in REASONS], axis=1)

    dur = f["ncu_1"][:, ncu_metrics.index("gpu__time_duration.sum")] / 1e3
    return ds, shares(f["ncu_1"]), shares(f["ncu_2"]), dur


def _ours(ds):
    return np.stack([ds[PCT.format(r)].values for r in REASONS], axis=1)


def test_the_recording_holds_one_anchor_per_stall_pass(recorded):
    ds = recorded[0]
    assert ds.attrs["pass_anchors"] == RECORDED_ANCHORS
    spread = topdown_checks.pass_spread(ds)
    values = np.stack([ds[a].values for a in ds.attrs["pass_anchors"]])
    np.testing.assert_allclose(spread.values, 100 * (values.max(0) - values.min(0)) / values[0])
    assert spread.attrs["units"] == "percent" and spread.attrs["anchors"] == ds.attrs["pass_anchors"]


def test_no_spread_without_anchors_of_separate_passes(recorded):
    ds = recorded[0]
    assert topdown_checks.pass_spread(ds.drop_vars(RECORDED_ANCHORS[1:])) is None
    no_attr = ds.copy()
    no_attr.attrs = {"compute_capability": "9.0"}  # CUPTI's own schedule: the counters may share a pass
    assert topdown_checks.pass_spread(no_attr) is None
    assert "pass_spread" not in gs.topdown(no_attr, check="ignore").coords


def test_spread_is_small_on_long_kernels_and_large_on_short_ones(recorded):
    ds, _, _, dur = recorded
    spread = gs.topdown(ds, check="ignore")["pass_spread"].values
    assert np.nanmax(spread[dur >= 50]) < 5  # 0.1-2% recorded
    assert np.median(spread[dur < 10]) > 2 * np.median(spread[dur >= 10])


def test_consistent_launches_are_the_ones_that_agree_with_ncu(recorded):
    """Under 10 us, the launches gpuscope calls consistent differ from ncu's values by no more than ncu's own
    run-to-run difference + 1 point (median of the largest share difference); the others by several points."""
    ds, ncu1, ncu2, dur = recorded
    td = gs.topdown(ds, check="ignore")
    ok = td["consistent"].values.astype(bool)
    diff = np.abs(_ours(ds) - ncu1).max(axis=1)
    yardstick = np.abs(ncu2 - ncu1).max(axis=1)
    short = dur < 10
    assert 0.25 < ok[short].mean() < 0.75  # 31 of 66 recorded
    assert ok[~short].all()
    assert np.median(diff[short & ok]) <= np.median(yardstick[short]) + 1, np.round(diff[short & ok], 1)
    assert np.median(diff[short & ~ok]) > 2 * np.median(diff[short & ok])
    covered = td["warp_state_coverage"].values
    assert np.mean(np.abs(covered[short] - 100) <= 5) >= 0.9  # 92% recorded; ncu's own: 59%


def test_uncertainty_grows_with_the_spread(recorded):
    ds = recorded[0]
    td = gs.topdown(ds, check="ignore")
    stall = 100 - td["retire"].values  # not exact (divergence, replay), an upper bound of the stall nodes' slots
    spread, miss = td["pass_spread"].values, np.abs(td["warp_state_coverage"].values - 100)
    u = td["topdown_uncertainty"].values
    assert (u <= stall * np.fmax(spread, miss) / 100 + 1e-9).all()
    wide = spread > miss
    assert np.corrcoef(u[wide], (stall * spread / 100)[wide])[0, 1] > 0.99
    assert "pass_spread" in td["topdown_uncertainty"].attrs["description"]


def test_report_gives_no_verdict_for_launches_whose_passes_differ(recorded):
    ds = recorded[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = report(ds)
    note = next(n for n in r.notes if "left out of the Top-Down columns" in n)
    assert "pass_spread over 10%" in note
    n_bad = int((~gs.topdown(ds, check="ignore")["decided"].values.astype(bool)).sum())
    assert note.startswith(f"{n_bad} launch(es)") and n_bad >= 1


def test_each_launch_without_a_verdict_says_why_and_the_report_says_what_to_do(recorded):
    """Issue 51: never a bare 'inconsistent'. no_verdict names the failed check and by how much, on every launch
    without a verdict and on none with one; a kernel with no launch left shows why in bound_by, and the note says
    what to do next."""
    ds = recorded[0]
    td = gs.topdown(ds, check="ignore")
    ok = td["decided"].values.astype(bool)
    why = td["no_verdict"].values
    assert (why[ok] == "").all() and (why[~ok] != "").all() and (~ok).sum() >= 1
    spread = td["pass_spread"].values
    for text, s, c, m, u in zip(why[~ok], spread[~ok], td["warp_state_coverage"].values[~ok],
                                td["verdict_margin"].values[~ok], td["topdown_uncertainty"].values[~ok]):
        assert ("pass_spread over 10%" in text) == (s > 10)
        assert (f"ran {s:.0f}% apart" in text) == (s > 10)
        assert ("warp states cover" in text) == (abs(c - 100) > 5)
        assert f"{m:.1f} points apart, within the {u:.1f} points" in text
    # a kernel all of whose launches lack a verdict: bound_by says why
    one = ds.isel(range=np.flatnonzero(~ok)[:3])
    one = one.assign_coords(kernel=("range", ["k"] * one.sizes["range"]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = report(one)
    assert r.loc["k", "bound_by"].startswith("no verdict: ")
    assert "inconsistent" not in r["bound_by"].tolist()
    note = next(n for n in r.notes if "left out of the Top-Down columns" in n)
    assert "profile_fast_topdown" in note and "no_verdict" in note


def _bench():
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_stalls_vs_ncu.py"
    spec = importlib.util.spec_from_file_location("bench_stalls_vs_ncu", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_topdown_a_user_reads_is_as_close_to_ncus_as_ncu_is_to_itself_plus_a_point(recorded):
    """The Top-Down nodes (percent of peak issue slots) made from gpuscope's values against the same Top-Down made
    from ncu's: within ncu's own run-to-run difference + 1 point to a tenth (median of the largest node difference,
    every level and length); the 18 raw shares are not (2.4 points against 0.9 + 1 under 10 us): what is left
    there is mostly the warp-active count each tool divides by, which the Top-Down normalises away."""
    ds, ncu1, ncu2, dur = recorded
    table = _bench().nodes_from_fixture(FIXTURE)
    assert set(table) == {1, 2, 3} and table[3]["< 10 us"]["n"] == (dur < 10).sum() == 66
    for level, buckets in table.items():
        assert set(buckets) == {"< 10 us", "10-50 us", ">= 50 us"}
        for label, b in buckets.items():
            assert b["ours"] <= b["ncu"] + 1.1, (level, label, b)  # 1.59 against 0.52 recorded, level 3 < 10 us
    raw = np.median(np.abs(_ours(ds) - ncu1).max(axis=1)[dur < 10])
    raw_ncu = np.median(np.abs(ncu2 - ncu1).max(axis=1)[dur < 10])
    assert raw > raw_ncu + 1.3 and table[3]["< 10 us"]["ours"] < raw - 0.5  # 2.4 against 0.9; nodes 1.6


def test_a_verdict_that_leads_by_more_than_the_passes_disagree_is_given(recorded):
    """Issue 51: passes that disagree make the stall nodes uncertain by topdown_uncertainty points; a launch whose
    level-2 verdict leads the next node by more keeps it (decided). On this recording (35 of 82 launches with
    passes that disagree, mostly memory-bound elementwise kernels) 80 launches keep a verdict, 100% of the GPU
    time, and every verdict equals ncu's on the same launch; 66 keep a culprit, every one ncu's too."""
    from gpuscope._results.report_topdown import _verdict

    ds = recorded[0]
    f = np.load(FIXTURE)
    ncu = xr.Dataset({str(m): ("range", f["ncu_1"][:, i]) for i, m in enumerate(f["ncu_metrics"])},
                     attrs={"compute_capability": "9.0"})
    td = gs.topdown(ds, check="ignore")
    ours = td["decided"].values.astype(bool)
    consistent = td["consistent"].values.astype(bool)
    assert (ours >= consistent).all() and ours.sum() == 80 and consistent.sum() == 47
    margin, unc = td["verdict_margin"].values, td["topdown_uncertainty"].values
    assert (margin[ours & ~consistent] > unc[ours & ~consistent]).all()
    assert (margin[~ours] <= unc[~ours]).all()
    culprit = td["culprit_decided"].values.astype(bool)
    assert (culprit <= ours).all() and culprit.sum() == 66
    ref = gs.topdown(ncu, check="ignore")
    names = list(td.data_vars)

    def verdict(t, i):
        return _verdict({n: float(t[n].values[i]) for n in names})[:2]

    dur = recorded[3]
    assert dur[ours].sum() / dur.sum() > 0.99 > dur[consistent].sum() / dur.sum()
    for i in np.flatnonzero(ours):
        mine, theirs = verdict(td, i), verdict(ref, i)
        assert mine[0] == theirs[0]
        assert not culprit[i] or mine[1] == theirs[1]
