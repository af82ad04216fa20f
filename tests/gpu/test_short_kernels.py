"""Stall breakdowns of real short library kernels (PyTorch training step, CuPy 1 M-element kernels) add up and agree
with Nsight Compute on the same launches, recorded in the same test run (``benchmarks/bench_stalls_vs_ncu.py``
gives the full table)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import gpuscope as gs

pytest.importorskip("torch")
pytest.importorskip("cupy")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from short_kernels import PCT, REASONS, Work, run_ncu  # noqa: E402

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
    assert len(anchors) == 3 and all(a in ds for a in anchors)  # a warp-active counter in each of 3 stall passes
    # the warm-up pass's own counter (counting half): a replay's second pass runs short kernels longer (1.2 times
    # the active warps at the median on the H100), those of 50 us and more alike
    warm = 2 * ds["sm__warps_active_shader_cs.sum"].values / ds["sm__warps_active.sum"].values
    assert np.all(np.abs(warm[ds["gpu__time_duration.sum"].values >= 50e3] - 1) < 0.1), np.round(warm, 2)
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


# gpuscope's side runs in a fresh process, as ncu's does: in the pytest process, after test_cupy_kernels
# (test_range_profiling.py) had profiled CuPy kernels, imc_miss of the 2-10 us launches came out 8 points lower and
# long_scoreboard 3 higher, three times out of three, while a plain process with the same history did not move
# (docs/measurements.md, "What a process's history does to short kernels")
CHILD = r"""
import json, sys
sys.path.insert(0, {probes!r})
import numpy as np
import gpuscope as gs
from short_kernels import PCT, REASONS, Work

work = Work()
work.step()
work.step()
with gs.Profiler(metrics="topdown", mode="kernel", pass_groups={groups!r}) as prof:
    work.step()
ds = prof.dataset
td = gs.topdown(ds, check="ignore")
print(json.dumps({{"shares": np.stack([ds[PCT.format(r)].values for r in REASONS], axis=1).tolist(),
                  "consistent": td["consistent"].values.astype(bool).tolist(),
                  "kernels": [str(k) for k in ds.kernel.values],
                  "passes": prof.passes,
                  "attrs": {{k: ds.attrs[k] for k in ("replay_ms_per_launch", "pass_plan") if k in ds.attrs}}}}))
"""


def _child(groups=None) -> dict:
    probes = str(Path(__file__).resolve().parents[2] / "benchmarks")
    proc = subprocess.run([sys.executable, "-c", CHILD.format(probes=probes, groups=groups)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(shutil.which("ncu") is None, reason="ncu is not installed")
def test_agrees_with_ncu_launch_by_launch():
    gs.release()  # the children need the counters
    got = _child()
    ncu = run_ncu(shutil.which("ncu"), METRICS, 1)["rows"]
    layout = _child("ncu")  # Nsight Compute's pass layout, in the same run
    shares, ok = np.array(got["shares"]), np.array(got["consistent"])
    assert len(ncu) == len(shares)
    ref = np.array([[r[PCT.format(x)] for x in REASONS] for r in ncu])
    diff = np.abs(shares - ref).max(axis=1)
    dur = np.array([r["gpu__time_duration.sum"] for r in ncu]) / 1e3
    explained = _explain(shares, ref, diff, ok, ncu, got["attrs"])
    print(explained)  # shown with -s
    if os.environ.get("GPUSCOPE_TEST_RECORD"):  # both sides' shares, to tell which one moved
        Path(os.environ["GPUSCOPE_TEST_RECORD"]).write_text(json.dumps(
            {"gpuscope": shares.tolist(), "ncu": ref.tolist(), "duration_us": dur.tolist(),
             "kernels": [r["kernel"] for r in ncu]}))
    # ncu's own run-to-run difference is 1-3 points (median) on these kernels; CUPTI's schedule gave 14-19, the
    # plan 1-4 (docs/measurements.md)
    assert np.median(diff[dur < 10]) < 10, explained
    assert np.median(diff[dur >= 10]) < 10, explained
    # the launches gpuscope calls consistent are the ones that agree (measured under 10 us: 1.1 points median
    # against 4.3 for the others)
    assert ok.any() and (~ok).any(), explained
    assert np.median(diff[ok]) < np.median(diff[~ok]), explained
    # with ncu's own layout (pass_groups="ncu"), gpuscope's short-kernel shares add up about as rarely as ncu's do
    # (measured: within 100 +/- 5% on 59-61% of launches under 10 us, ncu's 58%, the consistent plan's 94%)
    assert layout["attrs"]["pass_plan"] == "ncu" and layout["passes"] == 7
    theirs = np.array(layout["shares"])
    short = dur < 10

    def within(s):
        return float(np.mean(np.abs(s[short].sum(axis=1) - 100) <= 5))

    assert abs(within(theirs) - within(ref)) < abs(within(shares) - within(ref)), (within(theirs), within(ref))
    assert np.median(np.abs(theirs - ref).max(axis=1)[short]) < 10, np.round(np.abs(theirs - ref).max(axis=1), 1)


def _explain(shares, ref, diff, ok, ncu, attrs):
    """What a failure shows: the differences, the reasons they come from, and the worst launches."""
    signed = shares - ref
    by_reason = {r: round(float(np.mean(signed[:, i])), 1) for i, r in enumerate(REASONS)
                 if abs(np.mean(signed[:, i])) >= 0.5}
    worst = [(ncu[i]["kernel"][:60], round(float(diff[i]), 1), REASONS[int(np.argmax(np.abs(signed[i])))])
             for i in np.argsort(diff)[::-1][:5]]
    return (f"consistent {np.round(diff[ok], 1)}, the others {np.round(diff[~ok], 1)}; mean gpuscope - ncu by "
            f"reason {by_reason}; worst {worst}; session attrs {attrs}")
