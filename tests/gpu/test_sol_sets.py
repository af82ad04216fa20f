"""The roofline sets on the H100 beside the Top-Down, and against ncu on the same launches in the same run (the
workload of ``benchmarks/record_sol_sets.py``: Numba ``stream`` and ``fma``, a CuPy fp16 GEMM, a CuPy sum)."""

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import gpuscope as gs

pytest.importorskip("cupy")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import record_sol_sets as rs  # noqa: E402
# what the same program counts alike in both tools, as tests/unit/test_sol_fixtures.py compares it on the H200
# recording (the dispatch-decided fmaheavy split and the GEMM's barrier polling aside)
from record_sol_sets import COUNTS, DISPATCHED, FMA, GEMM, GEMM_POLLING, STREAM  # noqa: E402


@pytest.fixture(scope="module")
def work():
    w = rs.Work()
    w.step()  # compiled, loaded and warm before any session
    return w


def test_topdown_with_roofline_fp_memory_and_occupancy_takes_one_pass_more(work):
    with gs.Profiler(["topdown", "roofline-fp", "memory", "occupancy"], mode="kernel") as prof:
        work.step()
    ds = prof.dataset
    assert prof.passes == 9 == gs.count_passes("topdown", chip="GH100") + 1
    assert ds.attrs["pass_plan"] == "consistent"
    rl = gs.roofline(ds)
    assert list(rl["precision"].values) == ["fp64", "fp32", "fp16"]
    fp64 = rl["flop_rate"].sel(precision="fp64").values  # Numba's kernels compute in float64
    assert fp64[FMA] > 0 and np.isfinite(rl["peak_flop_rate"].values).all()
    td = gs.topdown(ds, check="ignore")
    assert td["consistent"].values[[STREAM, FMA]].all()  # kernels of 100 us and more: the passes run alike
    mw = gs.memory_workload(ds)
    assert mw.sizes["range"] == ds.sizes["range"] == 5


@pytest.mark.skipif(shutil.which("ncu") is None, reason="ncu is not installed")
def test_roofline_fp_counts_equal_ncus(work):
    with gs.Profiler("roofline-fp", mode="kernel") as prof:
        work.step()
    ds = prof.dataset
    gs.release()  # ncu's child needs the counters
    metrics = list(gs.metric_set("roofline-fp").metrics)
    rows = rs.run_ncu(shutil.which("ncu"), metrics, [])["rows"]
    assert not rs.matched(ds, rows)
    counts = [m for m in metrics if m.startswith("smsp__sass_") or m == "dram__bytes.sum.peak_sustained"]
    for m in counts:
        ours, theirs = ds[m].values, np.array([r[m] for r in rows])
        # executed work is the same work in both tools (the GEMM's barrier loops vary by 0.5%: tests/unit/
        # test_sol_fixtures.py)
        np.testing.assert_allclose(ours, theirs, rtol=0.01, atol=1, err_msg=m)
    ours, theirs = gs.roofline(ds), gs.roofline(rs.ncu_dataset(ds, rows))
    for launch in (STREAM, FMA):  # FLOP/s by the launch's duration in each tool's run: within a few percent
        a = ours["flop_rate"].sel(precision="fp64").values[launch]  # Numba's kernels compute in float64
        b = theirs["flop_rate"].sel(precision="fp64").values[launch]
        assert a > 0
        assert abs(a / b - 1) < 0.1, (launch, a, b)


@pytest.mark.skipif(shutil.which("ncu") is None, reason="ncu is not installed")
def test_the_four_sets_count_what_ncu_counts_in_the_same_run(work):
    sets = ["roofline", "memory", "occupancy", "instructions"]
    with gs.Profiler(sets, mode="kernel") as prof:
        work.step()
    ds = prof.dataset
    gs.release()  # ncu's child needs the counters
    metrics = list(dict.fromkeys(m for s in sets for m in gs.metric_set(s).metrics))
    rows = rs.run_ncu(shutil.which("ncu"), metrics, [])["rows"]
    assert not rs.matched(ds, rows)
    counts = [m for m in map(str, ds.data_vars) if m.startswith(COUNTS) and not m.endswith(".peak_sustained")
              and m not in DISPATCHED]
    assert len(counts) >= 30
    for m in counts:
        launches = [i for i in range(len(rows)) if not (i == GEMM and m.startswith(GEMM_POLLING))]
        ours = np.asarray(ds[m].values, dtype=float)[launches]
        theirs = np.array([rows[i][m] for i in launches])
        np.testing.assert_array_equal(ours, theirs, err_msg=m)
    # every analysis runs on the session's Dataset
    assert gs.roofline(ds).sizes["precision"] >= 4  # with the tensor paths
    assert gs.instruction_mix(ds).sizes["range"] == len(rows)
