"""Phase detection on H100 recordings with known phases (tests/fixtures/phases, see its README.md).

Tolerances are the measured results of docs/measurements_phases.md with a margin, so a change of the detector
that makes any recording worse fails here.
"""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from gpuscope.metrics.phases import phases

ROOT = Path(__file__).resolve().parents[2]


def _module(name, path):
    spec = importlib.util.spec_from_file_location(name, ROOT / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


rec = _module("phase_recordings", "tests/fixtures/phases/recordings.py")
bench = _module("bench_phases", "benchmarks/bench_phases.py")

# Recordings whose every boundary is found with no false one; the others have one extra change point each at a
# short slow-down of a streaming phase (see docs/measurements_phases.md).
EXACT = ("idle_gaps", "launch_bound", "periodic_sync")


@pytest.fixture(scope="module")
def scores():
    return dict(bench.real())


@pytest.mark.parametrize("name", rec.NAMES)
def test_phase_count_boundaries_and_labels_match_the_workload(scores, name):
    r = scores[name]
    assert r["phases"] == r["kinds"] or (name == "cupy_gemm" and r["phases"] == r["kinds"] + 1)
    assert r["max_error_ms"] <= 0.6  # every true boundary found within 0.6 ms (6 samples)
    assert r["ari"] >= 0.98
    assert r["f1"] == 1.0 if name in EXACT else r["f1"] >= 0.8
    assert r["found"] <= r["boundaries"] + 1


def test_idle_is_one_phase(scores):
    assert scores["idle_gaps"]["idle_labels"] == 1


def test_slow_drift_is_one_segment_not_a_staircase():
    ds = rec.load("slow_drift")
    ph = phases(ds, topdown=False)
    drift = np.asarray(ds["span"]) == 1
    first = np.asarray(ph.segment_first)
    inside = first[(first > np.flatnonzero(drift)[0] + 10) & (first < np.flatnonzero(drift)[-1] - 10)]
    assert inside.size == 0
    assert len(np.unique(np.asarray(ph.phase)[drift])) == 1
    # Without the minimum change, binary segmentation cuts the drift into steps.
    raw = phases(ds, topdown=False, min_change=0)
    first = np.asarray(raw.segment_first)
    assert ((first > np.flatnonzero(drift)[0] + 10) & (first < np.flatnonzero(drift)[-1] - 10)).sum() >= 3


def test_first_sample_reach_back_is_clipped():
    ds = rec.load("idle_gaps")
    dur = np.asarray(ds.end_ns - ds.start_ns, dtype=float)
    assert dur[0] > 1e9 > 100 * np.median(dur)  # the recording's first sample reaches back over 1 s
    clipped, raw = phases(ds, topdown=False), phases(ds, topdown=False, clip_first=False)
    total = float(clipped.phase_duration.sum())
    assert total == pytest.approx(dur[1:].sum() + np.median(dur[1:]), rel=1e-6)
    assert float(raw.phase_duration.sum()) == pytest.approx(dur.sum(), rel=1e-6)
    assert float(clipped.phase_fraction[0]) < 0.01 < float(raw.phase_fraction[0])


def test_min_change_must_not_be_negative():
    with pytest.raises(ValueError, match="min_change"):
        phases(rec.load("lengths"), min_change=-0.1)
