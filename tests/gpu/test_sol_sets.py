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

STREAM, FMA = 0, 1


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
