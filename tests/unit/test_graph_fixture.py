"""CUDA graph kernel nodes profiled one by one, on a recording from an H200 (JAX 0.11.2, CUPTI 13.0): three steps of a
jitted MLP training step (XLA autotuning off), each one graph launch of 29 kernel nodes, profiled with
``gs.Profiler("topdown", mode="kernel")`` in graph node mode (``benchmarks/bench_graphs_vs_ncu.py``,
tests/fixtures/range/graph_nodes_jax_gh100.npz)."""

import warnings
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import gpuscope as gs
from gpuscope._range_profiling.graph_replay import combine_graph_rows

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "range" / "graph_nodes_jax_gh100.npz"
STALL = "smsp__warp_issue_stalled_{}_per_warp_active.pct"


@pytest.fixture(scope="module")
def recorded():
    f = np.load(FIXTURE)
    metrics = [str(m) for m in f["metrics"]]
    graph = f["graph"]
    ds = xr.Dataset({m: ("range", f["values"][:, i]) for i, m in enumerate(metrics)},
                    coords={"kernel": ("range", f["kernels"].astype(str)), "graph_exec": ("range", graph[:, 0]),
                            "graph_launch": ("range", graph[:, 1]), "graph_node": ("range", graph[:, 2])},
                    attrs={"compute_capability": "9.0", "pass_plan": "consistent",
                           "pass_anchors": [str(a) for a in f["pass_anchors"]]})
    return ds, f


def _nodes(ds):
    return ds.isel(range=np.flatnonzero(ds["graph_launch"].values >= 0))


def test_every_graph_launch_gives_a_row_per_kernel_node_in_the_same_order(recorded):
    ds = _nodes(recorded[0])
    launches = sorted(set(ds["graph_launch"].values.tolist()))
    assert len(launches) == 3
    per = [ds.isel(range=np.flatnonzero(ds["graph_launch"].values == k)) for k in launches]
    n = per[0].sizes["range"]
    assert n >= 20 and all(p.sizes["range"] == n for p in per)
    for p in per:
        assert p["graph_node"].values.tolist() == list(range(n))  # every node once, in the graph's order
        assert p["kernel"].values.tolist() == per[0]["kernel"].values.tolist()
    assert len(set(ds["graph_exec"].values.tolist())) == 1


def test_the_nodes_topdown_is_made_from_the_recorded_values(recorded):
    ds = _nodes(recorded[0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        td = gs.topdown(ds, check="ignore")
    ok = td["consistent"].values.astype(bool)
    dur = ds["gpu__time_duration.sum"].values
    assert ok.mean() > 0.5 and dur[ok].sum() > 0.9 * dur.sum()  # recorded: 60% of the nodes, 97% of GPU time
    level1 = td["retire"] + td["divergence"] + td["frontend"] + td["backend"]
    np.testing.assert_allclose(level1.values, 100, atol=1e-6)
    decided = td["decided"].values.astype(bool)
    assert (decided >= ok).all() and dur[decided].sum() >= dur[ok].sum()
    assert (td["no_verdict"].values[decided] == "").all() and (td["no_verdict"].values[~decided] != "").all()


def test_graph_rows_combine_the_nodes_of_each_launch(recorded):
    """graphs="graph": one row per launch, durations added, shares weighted by the nodes' durations."""
    ds = _nodes(recorded[0])
    metrics = [m for m in ds.data_vars]
    rows = [{"kernel": str(k), "graph_exec": int(e), "graph_launch": int(g), "graph_node": int(n), "launch": i,
             "start_ns": 0, "end_ns": 0, "values": [float(ds[m].values[i]) for m in metrics]}
            for i, (k, e, g, n) in enumerate(zip(ds["kernel"].values, ds["graph_exec"].values,
                                                 ds["graph_launch"].values, ds["graph_node"].values))]
    combined = combine_graph_rows(rows, metrics)
    assert len(combined) == 3
    dur = ds["gpu__time_duration.sum"].values
    share = STALL.format("long_scoreboard")
    for row, k in zip(combined, sorted(set(ds["graph_launch"].values.tolist()))):
        mine = ds["graph_launch"].values == k
        assert row["graph_nodes"] == mine.sum()
        assert row["values"][metrics.index("gpu__time_duration.sum")] == pytest.approx(dur[mine].sum())
        expected = np.sum(ds[share].values[mine] * dur[mine]) / dur[mine].sum()
        assert row["values"][metrics.index(share)] == pytest.approx(expected)
