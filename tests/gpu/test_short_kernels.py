"""Stall breakdowns of real short library kernels (PyTorch training step, CuPy 1 M-element kernels) add up and agree
with Nsight Compute on the same launches, recorded in the same test run (``benchmarks/bench_stalls_vs_ncu.py``
gives the full table)."""

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import gpuscope as gs

pytest.importorskip("torch")
pytest.importorskip("cupy")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "probes"))

from probe_pass_consistency import PCT, REASONS, Work, run_ncu  # noqa: E402

METRICS = list(gs.metric_set("topdown").metrics)


@pytest.fixture(scope="module")
def work():
    w = Work()
    w.step()
    w.step()
    return w


def _shares(ds):
    return np.stack([ds[PCT.format(r)].values for r in REASONS], axis=1)


@pytest.mark.parametrize("mode", ["kernel", "iteration"])
def test_stall_shares_of_short_kernels_add_up(work, mode):
    with gs.Profiler(metrics="topdown", mode=mode) as prof:
        for _ in range(1 + (prof.passes + 1 if mode == "iteration" else 0)):
            work.step()
            if mode == "iteration":
                prof.step()
    ds = prof.dataset
    assert ds.attrs["pass_plan"] == "consistent" and prof.passes == len(ds.attrs["pass_groups"])
    total = _shares(ds).sum(axis=1)
    short = ds["gpu__time_duration.sum"].values < 10e3
    assert short.sum() >= 10  # the workload is mostly kernels under 10 us
    # measured (docs/measurements.md): median 92% in kernel mode, 97% in iteration mode; CUPTI's schedule 69%
    assert abs(np.median(total) - 100) <= (10 if mode == "kernel" else 5), np.round(np.sort(total), 1)
    td = gs.topdown(ds, check="ignore")
    assert {"warp_state_coverage", "pass_spread", "topdown_uncertainty", "consistent"} <= set(td.coords)
    np.testing.assert_allclose(td["warp_state_coverage"].values, total, rtol=1e-9)
    anchors = ds.attrs["pass_anchors"]
    assert len(anchors) == 4 and all(a in ds for a in anchors)  # one warp-active counter per stall pass
    spread = td["pass_spread"].values
    long = ds["gpu__time_duration.sum"].values >= 50e3
    # the passes of long kernels run alike (0.5% measured), those of 2-10 us kernels less (11% median)
    assert np.nanmax(spread[long], initial=0) < 5, np.round(spread, 1)


def test_cupti_schedule_is_what_went_wrong(work):
    """The same launches with CUPTI's own schedule: the shares of short kernels miss 100% (the issue's finding)."""
    with gs.Profiler(metrics="topdown", mode="kernel", pass_groups="cupti") as prof:
        work.step()
    total = _shares(prof.dataset).sum(axis=1)
    assert np.median(total) < 85, np.round(np.sort(total), 1)


@pytest.mark.skipif(shutil.which("ncu") is None, reason="ncu is not installed")
def test_agrees_with_ncu_launch_by_launch(work):
    with gs.Profiler(metrics="topdown", mode="kernel") as prof:
        work.step()
    ds = prof.dataset
    gs.release()  # ncu's child needs the counters
    ncu = run_ncu(shutil.which("ncu"), METRICS, 1)["rows"]
    assert len(ncu) == ds.sizes["range"]
    ref = np.array([[r[PCT.format(x)] for x in REASONS] for r in ncu])
    diff = np.abs(_shares(ds) - ref).max(axis=1)
    dur = np.array([r["gpu__time_duration.sum"] for r in ncu]) / 1e3
    # ncu's own run-to-run difference is 1-2 points (median) on these kernels; CUPTI's schedule gave 14-19, the
    # plan 4-6 (docs/measurements.md)
    assert np.median(diff[dur < 10]) < 10, np.round(diff, 1)
    assert np.median(diff[dur >= 10]) < 10, np.round(diff, 1)
    # the launches gpuscope calls consistent are the ones that agree (measured under 10 us: 1.1 points median
    # against 4.3 for the others)
    ok = gs.topdown(ds, check="ignore")["consistent"].values.astype(bool)
    assert ok.any() and (~ok).any()
    assert np.median(diff[ok]) < np.median(diff[~ok]), (np.round(diff[ok], 1), np.round(diff[~ok], 1))
