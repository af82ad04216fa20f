"""The roofline, memory, occupancy and instructions sets as an H100 recorded them (CUPTI 13.0, driver 580.159.04),
with Nsight Compute's values of the same launches in the same run (tests/fixtures/sol_h100, from
``benchmarks/record_sol_sets.py --out ...``: one session per set, then ncu on the same step in a child process).

The same workload as tests/unit/test_sol_fixtures.py (the H200 recording, which holds the detailed comparison):
Numba ``stream`` and ``fma``, a CuPy fp16 GEMM (cuBLAS's nvjet kernel) and a CuPy sum (two cub kernels). Here every
analysis and both charts run on H100 data, and the sessions recorded each launch's registers and shared memory
themselves (``registers_per_thread``, ``shared_memory_static``, ``shared_memory_dynamic``), so the occupancy needs
no arguments.
"""

import json
from pathlib import Path

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import gpuscope as gs  # noqa: E402
import gpuscope.metrics.accessor  # noqa: E402, F401  (registers ds.gpuscope)
from benchmarks import record_sol_sets as rs  # noqa: E402
from benchmarks.record_sol_sets import COUNTS, DISPATCHED, FMA, GEMM, GEMM_POLLING, REDUCE, STREAM  # noqa: E402

FIXTURES = Path(__file__).parents[1] / "fixtures" / "sol_h100"
SETS = ("roofline", "memory", "occupancy", "instructions")
PIPES = ("alu", "cbu", "fma", "fp64", "lsu", "tensor", "uniform", "xu")


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def recording(name: str):
    ds = gs.open_dataset(FIXTURES / f"sol_{name}_gh100.nc")
    return ds, json.loads((FIXTURES / f"ncu_{name}.json").read_text())["rows"]


def analyses(name: str):
    """gpuscope's analysis of its recording (registers and shared memory as the session recorded them), the same
    analysis of ncu's raw values, and ncu's sections: dicts per launch, keyed as record_sol_sets prints them."""
    ds, rows = recording(name)
    regs = ds["registers_per_thread"].values.tolist()
    smem = (ds["shared_memory_static"] + ds["shared_memory_dynamic"]).values.tolist()
    return (rs.analysed(name, ds, regs, smem), rs.analysed(name, rs.ncu_dataset(ds, rows), regs, smem),
            [rs.section_values(name, r) for r in rows])


@pytest.mark.parametrize("name", SETS)
def test_the_recordings_are_ncus_launches_and_count_what_ncu_counts(name):
    ds, rows = recording(name)
    assert rs.matched(ds, rows) == []
    assert (ds.attrs["device_name"], ds.attrs["chip"], ds.attrs["cupti_version"]) == ("NVIDIA H100 80GB HBM3",
                                                                                      "GH100", "13.0")
    counts = [m for m in ds.data_vars if m.startswith(COUNTS) and not m.endswith(".peak_sustained")
              and m not in DISPATCHED]
    assert counts
    for m in counts:
        launches = [i for i in range(5) if not (i == GEMM and m.startswith(GEMM_POLLING))]
        np.testing.assert_array_equal(np.asarray(ds[m].values, dtype=float)[launches],
                                      np.array([rows[i][m] for i in launches]), err_msg=m)


def test_the_sessions_recorded_ncus_launch_statistics():
    """Registers per thread (the driver's count of those used; ncu's allocated, rounded up to 8), static and dynamic
    shared memory per block (cuBLAS's GEMM asks for 213,188 bytes dynamic), and from them, without arguments, the
    theoretical occupancy, its limits and the waves of ncu's Occupancy and Launch Statistics sections."""
    ds, rows = recording("occupancy")
    registers = ds["registers_per_thread"].values
    assert registers.tolist() == [16, 14, 168, 32, 32]
    assert ((registers + 7) // 8 * 8).tolist() == [r["launch__registers_per_thread"] for r in rows]
    assert ds["shared_memory_static"].values.tolist() == [r["launch__shared_mem_per_block_static"] for r in rows]
    assert ds["shared_memory_dynamic"].values.tolist() == [r["launch__shared_mem_per_block_dynamic"] for r in rows]
    assert ds["shared_memory_dynamic"].values[GEMM] == 213188
    oc = gs.occupancy(ds)
    for launch, row in enumerate(rows):
        assert float(oc.theoretical_occupancy[launch]) == row["sm__maximum_warps_per_active_cycle_pct"]
        for limit, theirs in (("registers", "registers"), ("shared_memory", "shared_mem"), ("warps", "warps"),
                              ("blocks", "blocks")):
            assert float(oc.block_limit.sel(limit=limit)[launch]) == row[f"launch__occupancy_limit_{theirs}"]
        assert abs(float(oc.waves_per_sm[launch]) - row["launch__waves_per_multiprocessor"]) <= 0.005
    ours, _, sections = analyses("occupancy")
    for launch in (STREAM, FMA, GEMM, REDUCE):  # achieved: what the warps did, in each tool's run
        assert abs(ours[launch]["achieved_occupancy"] - sections[launch]["achieved_occupancy"]) <= 3


def test_memory_and_instruction_formulas_give_ncus_sections():
    _, same, sections = analyses("memory")
    for launch in range(5):
        for level in ("L1/TEX", "L2"):
            assert abs(same[launch][f"hit_rate {level}"] - sections[launch][f"hit_rate {level}"]) <= 0.005
    ours, same, sections = analyses("instructions")
    for launch in range(5):
        for pipe in PIPES:
            quantity = f"pipe_utilization {pipe}"
            assert abs(same[launch][quantity] - sections[launch][quantity]) <= 0.005, (launch, quantity)
    for launch in (STREAM, FMA, GEMM, REDUCE):  # the launches' active cycles in each run: within 2 % here
        for pipe in PIPES:
            quantity = f"pipe_utilization {pipe}"
            if same[launch][quantity] >= 1:
                assert abs(ours[launch][quantity] / same[launch][quantity] - 1) <= 0.02, (launch, quantity)
    assert [x["busiest_pipe"] for x in ours] == [x["busiest_pipe"] for x in same] == ["alu", "alu", "tensor", "lsu",
                                                                                      "alu"]


def test_roofline_and_memory_workload_of_the_recording():
    ds, rows = recording("roofline")
    ours, theirs = gs.roofline(ds), gs.roofline(rs.ncu_dataset(ds, rows))
    for launch in (STREAM, FMA):  # Numba's kernels compute in float64
        a = float(ours["flop_rate"].sel(precision="fp64")[launch])
        b = float(theirs["flop_rate"].sel(precision="fp64")[launch])
        assert a > 0 and abs(a / b - 1) < 0.1
    assert str(ours["bound"].sel(precision="fp64").values[STREAM]) == "DRAM"
    a, b = (float(x["flop_rate"].sel(precision="tensor")[GEMM]) for x in (ours, theirs))
    assert a > 5e14 and abs(a / b - 1) < 0.05  # the GEMM's tensor FLOP/s: 753 TFLOP/s here
    mw, _ = recording("memory")
    busiest = gs.memory_workload(mw).busiest_level.values
    assert [str(busiest[i]) for i in (STREAM, GEMM, REDUCE)] == ["DRAM", "L1/TEX", "DRAM"]


def test_both_charts_draw_the_recording(tmp_path):
    roofline = recording("roofline")[0].gpuscope.plot.roofline()
    ax = roofline.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log" and len(ax.lines) >= 4
    roofline.savefig(tmp_path / "roofline.png")
    chart = recording("memory")[0].gpuscope.plot.memory_chart(select="stream")
    ax = chart.axes[0]
    assert ax.get_title() == "Memory chart: stream (busiest: DRAM, 79.1% of its peak)"
    # the same program's requests and bytes as on the H200 (tests/unit/test_sol_fixtures.py), the H100's hit rates
    assert {"ld 1.05 M inst\nst 524 k inst", "201 MB", "1.57 M req\nread 134 MB", "write 67.1 MB",
            "hit 0.0%\nbusy 11.7%", "hit 33.7%\nbusy 29.8%", "busy 79.1%"} <= {t.get_text() for t in ax.texts}
    chart.savefig(tmp_path / "memory_chart.png")
    assert (tmp_path / "roofline.png").stat().st_size > 10_000 and (tmp_path / "memory_chart.png").stat().st_size
