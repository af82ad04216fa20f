"""The ``roofline-fp`` set: the roofline of the CUDA cores without the tensor pipes, whose counters take a pass each
on GH100. Its analysis and plot on the H200 recording of tests/fixtures/sol (the ``roofline`` set's Dataset with the
tensor counters left out), and its pass counts beside ``topdown``, ``memory`` and ``occupancy`` from CUPTI's host
API (offline)."""

import warnings
from pathlib import Path

import matplotlib
import numpy as np
import pytest

import gpuscope as gs

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

FIXTURE = Path(__file__).parents[1] / "fixtures" / "sol" / "sol_roofline_gh100.nc"
TENSOR = "sm__ops_path_tensor_src_"


@pytest.fixture(scope="module")
def recorded():
    full = gs.open_dataset(FIXTURE)
    fp = full.drop_vars([v for v in full.data_vars if str(v).startswith(TENSOR)])
    return full, fp


def test_the_set_is_roofline_without_the_tensor_pipes():
    roofline, fp = gs.metric_set("roofline").metrics, gs.metric_set("roofline-fp").metrics
    assert list(fp) == [m for m in roofline if not m.startswith(TENSOR)]
    assert len(fp) == len(roofline) - 10  # five tensor paths, each with its peak


def test_its_analysis_is_the_rooflines_for_the_cuda_cores(recorded):
    full, fp = recorded
    assert set(gs.metric_set("roofline-fp").metrics) <= set(map(str, fp.data_vars))
    ours, theirs = gs.roofline(fp), gs.roofline(full)
    assert list(ours["precision"].values) == ["fp64", "fp32", "fp16"]
    for var in ("flop_rate", "peak_flop_rate"):
        np.testing.assert_allclose(ours[var].values, theirs[var].sel(precision=["fp64", "fp32", "fp16"]).values)


def test_its_plot_draws_the_cuda_core_charts(recorded):
    _, fp = recorded
    try:
        ax = fp.gpuscope.plot.roofline("fp64").axes[0]
        assert ax.get_title().startswith("Roofline, FP64")
        texts = [x.get_text() for x in ax.get_legend().texts] + [
            x.get_text() for legend in ax.figure.legends for x in legend.texts]
        # the same as the roofline set's chart (test_sol_fixtures.py)
        assert {"fma: 7.13 TFLOP/s, compute-bound", "stream: 533 GFLOP/s, DRAM-bound", "FP64 peak\n33.4 TFLOP/s"} <= set(
            texts)
        default = fp.gpuscope.plot.roofline().axes[0]  # the precision that did the most work, tensor aside
        assert not default.get_title().startswith("Roofline, Tensor")
        with pytest.raises((KeyError, ValueError)):
            fp.gpuscope.plot.roofline("tensor")
    finally:
        plt.close("all")


def test_beside_topdown_memory_and_occupancy_it_takes_no_pass_more_on_gh100():
    base = gs.count_passes(["topdown", "memory", "occupancy"], chip="GH100")
    assert gs.count_passes("topdown", chip="GH100") == 7 and base == 8
    assert gs.count_passes(["topdown", "roofline-fp", "memory", "occupancy"], chip="GH100") == base
    assert gs.count_passes(["topdown", "roofline", "memory", "occupancy"], chip="GH100") == 12
    assert gs.count_passes("roofline-fp", chip="GH100") == 2 < gs.count_passes("roofline", chip="GH100") == 5


def test_the_details_page_says_the_tensor_work_was_not_counted(recorded):
    full, fp = recorded
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours, theirs = str(gs.report(fp, page="details")), str(gs.report(full, page="details"))
    gemm = ours.split("nvjet_sm90_hsh_256x128_64x4_1x2_h_bz_coopA_NNT")[1]
    assert "none counted (no fp64, fp32 or fp16 work; the tensor pipes were not collected" in " ".join(gemm.split())
    assert "tensor FLOP/s" in theirs.split("nvjet_sm90_hsh_256x128_64x4_1x2_h_bz_coopA_NNT")[1]
    assert "none counted" not in theirs
