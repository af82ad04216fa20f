"""Hopper's warpgroup-MMA stall reason (``gmma``, optional on CC 9.0) on recordings from an H200 (CUPTI 13.0, PyTorch
2.11): the transformer step of ``benchmarks/short_kernels.py`` (69 launches, 11 cuBLAS ``nvjet`` GEMMs) in kernel
mode with the ``topdown`` set, and again with the gmma metric added (``probes/probe_gmma_coverage.py``,
tests/fixtures/range/transformer_topdown_gh100.nc and transformer_topdown_gmma_gh100.nc); and the captured PyTorch
graph's nodes (tests/fixtures/range/graph_nodes_torch_gh100.npz, ``benchmarks/bench_graphs_vs_ncu.py``)."""

import warnings
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import gpuscope as gs

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "range"
GMMA = "smsp__warp_issue_stalled_gmma_per_warp_active.pct"


def _topdown(ds):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return gs.topdown(ds, check="ignore")


@pytest.fixture(scope="module")
def steps():
    plain = gs.open_dataset(FIXTURES / "transformer_topdown_gh100.nc")
    with_gmma = gs.open_dataset(FIXTURES / "transformer_topdown_gmma_gh100.nc")
    assert plain["kernel"].values.tolist() == with_gmma["kernel"].values.tolist()  # the same launches, in order
    gemm = np.array(["nvjet" in k for k in plain["kernel"].values.astype(str)])
    assert gemm.sum() == 11
    return plain, with_gmma, gemm


def test_the_gemms_missing_warp_states_are_their_gmma_stalls(steps):
    plain, with_gmma, gemm = steps
    gap = 100 - _topdown(plain)["warp_state_coverage"].values[gemm]
    share = with_gmma[GMMA].values[gemm]
    assert gap.max() > 13  # three GEMMs miss 14-20% of their warp-active cycles without gmma
    np.testing.assert_allclose(gap, share, atol=2.5)  # and that is their gmma share, launch by launch
    covered = _topdown(with_gmma)["warp_state_coverage"].values
    assert np.all(np.abs(covered[gemm] - 100) <= gs.metrics.topdown.COVERAGE_TOLERANCE)


def test_gmma_goes_to_backend_core_and_the_verdicts_hold(steps):
    plain, with_gmma, gemm = steps
    a, b = _topdown(plain), _topdown(with_gmma)
    assert "backend_core_gmma" in b and "backend_core_gmma" not in a
    big = gemm & (with_gmma[GMMA].values > 10)
    assert big.sum() == 3
    # the shares over their own sum gave gmma's cycles to every node in proportion: backend_core gains
    assert (b["backend_core"].values[big] > a["backend_core"].values[big] + 3).all()
    for td in (a, b):
        assert td["decided"].values[gemm].all()
        level2 = ["frontend", "divergence", "backend_core", "backend_memory"]
        lead = np.array(level2)[np.argmax(np.stack([td[n].values for n in level2]), axis=0)]
        assert set(lead[gemm]) == {"backend_memory"}


def _graph_nodes():
    f = np.load(FIXTURES / "graph_nodes_torch_gh100.npz")
    metrics = [str(m) for m in f["metrics"]]
    ds = xr.Dataset({m: ("range", f["values"][:, i]) for i, m in enumerate(metrics)},
                    coords={"kernel": ("range", f["kernels"].astype(str)), "graph_launch": ("range", f["graph"][:, 1])},
                    attrs={"compute_capability": "9.0", "pass_plan": "consistent",
                           "pass_anchors": [str(a) for a in f["pass_anchors"]]})
    return ds, f


def test_a_launch_left_without_a_verdict_by_missing_warp_states_is_told_to_collect_gmma():
    ds, _ = _graph_nodes()
    td = _topdown(ds)
    why = td["no_verdict"].values.astype(str)
    short = ~td["decided"].values.astype(bool) & (td["warp_state_coverage"].values < 95)
    gemm = np.array(["nvjet" in k for k in ds["kernel"].values.astype(str)])
    assert (short & gemm).sum() >= 6  # the graph's GEMMs: 78-84% covered, their leading nodes closer than that
    assert all(f"collect {GMMA} too" in w for w in why[short])
    assert not any("collect" in w for w in why[~short])
    # with the metric there, nothing is left to collect: the message says only what fell short
    ds[GMMA] = ("range", np.zeros(ds.sizes["range"]))
    assert not any("collect" in w for w in _topdown(ds)["no_verdict"].values.astype(str))


def test_ncu_sees_the_same_gap_on_the_graphs_gemms():
    """The gap is the counters', not gpuscope's: ncu's 18 warp states of the same nodes, collected without gmma, sum
    to as little (the fixture holds ncu's values of each node beside gpuscope's)."""
    ds, f = _graph_nodes()
    names = [str(m) for m in f["ncu_metrics"]]
    states = [i for i, m in enumerate(names) if "warp_issue_stalled" in m]
    assert len(states) == 18
    ncu = np.nansum(f["ncu_1"][:, states], axis=1)
    ours = _topdown(ds)["warp_state_coverage"].values
    pairs = f["pairs"].astype(int)
    gemm = np.array(["nvjet" in k for k in ds["kernel"].values.astype(str)])[pairs[:, 0]]
    np.testing.assert_allclose(ours[pairs[gemm, 0]], ncu[pairs[gemm, 1]], atol=4)
    assert np.median(ncu[pairs[gemm, 1]]) < 90
