"""Where the pass plan takes a kernel's duration from, checked on an H100 recording.

``tests/fixtures/range/replay_durations_gh100.npz`` (``probes/probe_replay_durations.py``, two machine
starts): the durations of the same 41 launches (a PyTorch training step, small CuPy and Numba kernels) from
gpuscope's kernel replay with the ``topdown`` plan's durations in the first pass and in the first stall pass, a
one-pass session, iteration mode, CUPTI's kernel records of the unprofiled launches, and ncu (its kernel replay of
the ``topdown`` set twice, once with the caches flushed, and the duration alone). ``bench_*``: the durations of
``benchmarks/bench_stalls_vs_ncu.py --only-kernel --rounds 2`` on the plan as it is (82 launches, a third machine
start): the plan's two rounds, CUPTI's schedule's and ncu's layout's, and ncu's kernel replay twice."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from gpuscope._gpu import metric_lists as lists

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "range" / "replay_durations_gh100.npz"


@pytest.fixture(scope="module")
def rec():
    f = np.load(FIXTURE)
    sources = [str(s) for s in f["sources"]]
    return {"ns": f["ns"], "of": lambda run, name: f["ns"][run, sources.index(name)]}


def _median_of_ratios(ns, length_ns, ref, lo, hi):
    """Median of *ns* / *ref* (per launch) over the launches *length_ns* puts between *lo* and *hi* us."""
    sel = (length_ns / 1e3 >= lo) & (length_ns / 1e3 < hi)
    return float(np.median(ns[sel] / ref[sel]))


def _median_ratio(rec, run, name, ref, lo, hi):
    of = rec["of"]
    return _median_of_ratios(of(run, name), of(run, "ncu_none_1"), of(run, ref), lo, hi)


@pytest.mark.parametrize("run", [0, 1])
def test_the_replays_first_pass_runs_short_kernels_slower_than_the_later_ones_and_than_ncu(rec, run):
    first, later, ncu = (_median_ratio(rec, run, n, "unprofiled", 0, 10) for n in
                         ("kernel_pass1", "kernel_pass3", "ncu_none_1"))
    assert first > ncu > later > 1  # 1.62-1.65, 1.39-1.40, 1.26-1.27: every profiled launch is slower than its own
    again = _median_ratio(rec, run, "ncu_none_2", "ncu_none_1", 0, 10)
    assert abs(again - 1) < 0.01  # ncu repeats its durations


@pytest.mark.parametrize("run", [0, 1])
def test_from_50_us_on_the_later_pass_gives_ncus_duration(rec, run):
    first, later = (_median_ratio(rec, run, n, "ncu_none_1", 50, np.inf) for n in ("kernel_pass1", "kernel_pass3"))
    assert abs(later - 1) <= 0.005 < first - 1  # 1.000 against 1.03


def test_ncus_first_pass_does_not_depend_on_its_cache_flush_and_the_replays_first_pass_is_slower_still(rec):
    """Cold caches alone do not make the first pass slower: ncu's durations with its caches flushed before each
    pass are its durations without."""
    assert abs(_median_ratio(rec, 1, "ncu_all", "ncu_none_1", 0, 10) - 1) < 0.01
    assert _median_ratio(rec, 1, "kernel_pass1", "ncu_all", 0, 10) > 1.05  # 1.07


def test_one_pass_sessions_of_both_tools_agree(rec):
    for run in (0, 1):
        assert abs(_median_ratio(rec, run, "kernel_single", "ncu_single", 0, 10) - 1) < 0.02


def test_the_topdown_plan_takes_the_duration_from_the_first_stall_pass():
    """The recording's ``kernel_pass3`` is the plan's own layout on GH100."""
    plan = lists.consistent_plan(tuple(lists.resolve("topdown", "GH100")), "GH100")
    assert "gpu__time_duration.sum" in plan.groups[2] and "sm__cycles_elapsed.max" in plan.groups[2]
    assert "gpu__time_duration.sum" not in plan.groups[0]


def test_the_plans_durations_against_ncus_in_the_benchmark_run():
    f = np.load(FIXTURE)
    names = [str(n) for n in f["bench_sources"]]
    ns = dict(zip(names, f["bench_ns"]))

    def median(name, lo, hi):
        return _median_of_ratios(ns[name], ns["ncu_1"], ns["ncu_1"], lo, hi)

    for plan in ("kernel_plan", "kernel_plan_r2"):
        assert abs(median(plan, 50, np.inf) - 1) < 0.005  # 1.001, 1.000
        assert 0.9 < median(plan, 0, 10) < 0.95 and 0.9 < median(plan, 10, 50) < 0.95  # the later pass: 7-9% below
    for first in ("kernel_cupti", "kernel_cupti_r2", "kernel_ncu", "kernel_ncu_r2"):  # ncu's layout: the first pass
        assert median(first, 0, 10) > 1.05 and median(first, 10, 50) > 1.05
    assert abs(median("ncu_2", 0, 10) - 1) < 0.005
