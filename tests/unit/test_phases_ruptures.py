"""The ruptures comparison of benchmarks/bench_phases.py on the H100 recordings (skipped without ruptures)."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("ruptures")

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_phases", ROOT / "benchmarks" / "bench_phases.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _penalised_sse(z, cps, pen):
    bounds = np.concatenate([[0], cps, [len(z)]])
    sse = sum(((z[a:b] - z[a:b].mean(axis=0)) ** 2).sum() for a, b in zip(bounds[:-1], bounds[1:]))
    return sse + pen * len(cps)


def test_kernelcpd_linear_is_the_exact_optimum_of_gpuscopes_cost(bench):
    """Same L2 cost and penalty on each recording's standardised block means: ruptures' KernelCPD (exact) reaches
    a penalised error at most that of gpuscope's binary segmentation (greedy, then refined); after gpuscope's
    pruning and labelling both give the same phases."""
    from gpuscope.metrics import phases as ph

    rec = bench.recordings()
    detect = bench.ruptures_change_points("KernelCPD linear", 1.0)
    for name in rec.NAMES:
        ds = rec.load(name)
        metrics = [m for m in ds.data_vars if ds[m].dims == ("time",)]
        x = np.stack([ds[m].values.astype(float) for m in metrics], axis=1)
        block = len(x) // 1000
        z = ph.standardize(x[: len(x) // block * block].reshape(-1, block, len(metrics)).mean(axis=1))
        pen = ph.default_penalty(len(z), z.shape[1])
        ours = _penalised_sse(z, ph.change_points(z, penalty=pen, standardized=True), pen)
        exact = _penalised_sse(z, detect(z, penalty=pen, standardized=True), pen)
        assert exact <= ours * (1 + 1e-9), name
    ds = rec.load("periodic_sync")
    own = bench.phases(ds, topdown=False)
    with bench.detector("KernelCPD linear", 1.0):
        theirs = bench.phases(ds, topdown=False)
    assert own.segment_phase.values.tolist() == theirs.segment_phase.values.tolist()
    assert np.abs(own.segment_first.values - theirs.segment_first.values).max() <= 2 * own.attrs["phases_resolution"]


def test_swapped_detector_scores_and_is_restored(bench):
    from gpuscope.metrics import phases as ph

    own = ph.change_points
    rec = bench.recordings()
    ds = rec.load("idle_gaps")
    with bench.detector("KernelCPD rbf", 0.1):
        assert ph.change_points is not own
        r = bench.score(ds, bench.phases(ds, topdown=False), rec)
    assert ph.change_points is own
    assert (r["phases"], r["kinds"], r["idle_labels"]) == (3, 3, 1)  # stream, fma, idle; idle is one phase
    assert r["f1"] == 1.0 and r["max_error_ms"] < 1.0
