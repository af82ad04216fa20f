"""Phase detection on H100 recordings with known phases (tests/fixtures/phases, see its README.md), and on the
shipped ``gpuscope demo`` recording.

The assertions are issue 15's aims, which every recording meets (docs/measurements.md, "Phase detection on H100
recordings"), so a change of the detector that makes any recording miss them fails here.
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


@pytest.fixture(scope="module")
def scores():
    return dict(bench.real())


@pytest.mark.parametrize("name", rec.SCORED)
def test_phase_count_boundaries_and_labels_match_the_workload(scores, name):
    r = scores[name]
    assert r["phases"] == r["kinds"]  # exact phase count (the demo's fma and divergent are one kind)
    assert r["max_error_ms"] <= 1.0  # every true boundary found within 1 ms (10 samples)
    assert r["f1"] >= 0.95
    assert r["ari"] >= 0.98


def test_idle_is_one_phase(scores):
    assert scores["idle_gaps"]["idle_labels"] == 1


def _core_labels(ds, ph, span):
    """Phase labels of the samples of ``span``, without 2 ms at its edges (the GPU starts late)."""
    t = np.asarray(ds["time"], dtype=float)
    inside = (np.asarray(ds["span_index"]) == span) & (t >= t[np.asarray(ds["span_index"]) == span][0] + 2e6)
    inside &= t <= t[np.asarray(ds["span_index"]) == span][-1] - 2e6
    return set(np.asarray(ph.phase)[inside].tolist())


def test_demo_stream_is_one_phase_and_fma_divergent_another():
    ds = rec.load(rec.DEMO)
    ph = phases(ds, topdown=False)
    stream, fma, divergent = (_core_labels(ds, ph, k) for k in range(3))
    assert len(stream) == 1 and fma == divergent and len(fma) == 1 and stream != fma
    # Without the excursion pass, the stream's few-ms slow-downs and the FMA's stalls become phases of their own.
    raw = phases(ds, topdown=False, excursion=0)
    assert len(_core_labels(ds, raw, 0)) > 1 and len(_core_labels(ds, raw, 1)) > 1


def test_excursion_keeps_short_real_phases():
    """The 5 ms streaming phases inside long FMA phases of ``lengths`` are as short as the demo's slow-downs but
    over six times as far from the FMA phase as it ever goes by itself: they stay up to factor 6."""
    ds = rec.load("lengths")
    for factor in (2.0, 5.0):
        r = bench.score(ds, phases(ds, topdown=False, excursion=factor), rec)
        assert (r["phases"], r["found"], r["f1"]) == (2, 6, 1.0)


def test_slow_drift_is_one_segment_not_a_staircase():
    ds = rec.load("slow_drift")
    ph = phases(ds, topdown=False)
    drift = np.asarray(ds["span_index"]) == 1
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
    # The reach-back counts only in raw: the first sample's phase is longer by it there, by nothing else.
    first = int(clipped.phase[0])
    extra = float(raw.phase_duration[first] - clipped.phase_duration[first])
    assert extra == pytest.approx(dur[0] - np.median(dur[1:]), rel=1e-6)
    assert float(raw.phase_fraction[first]) > 0.5 > float(clipped.phase_fraction[first])


@pytest.mark.parametrize("param", ["min_change", "excursion"])
def test_thresholds_must_not_be_negative(param):
    with pytest.raises(ValueError, match=param):
        phases(rec.load("lengths"), **{param: -0.1})


def test_five_launches_of_one_kernel_are_one_phase():
    """The demo's five launches of each kernel agree to 0.005% in retire (2.99153-2.99167 for fma): too short a
    series to tell a change from noise, and one phase."""
    import warnings

    import gpuscope as gs

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gs.GpuscopeWarning)  # the recording's coverage warning
        td = gs.topdown(gs.open_dataset(Path(gs.__file__).parent / "data" / "demo_launches.nc"))
    for kernel in ("stream", "fma", "divergent"):
        with pytest.warns(gs.GpuscopeWarning, match="5 samples along 'range' are too few"):
            out = phases(gs.dynamic(td, kernel))
        assert out.sizes["phase_id"] == 1 and out.sizes["segment"] == 1, kernel


def test_pm_samples_with_a_fifth_inf_give_the_phases_of_the_clean_ones():
    """Issue 24: 20% inf in every metric of the demo recording gave a numpy RuntimeWarning and one phase."""
    import warnings

    import gpuscope as gs

    ds = rec.load(rec.DEMO)
    clean = phases(ds, topdown=False)
    bad = np.random.default_rng(0).random(ds.sizes["time"]) < 0.2
    dirty = ds.copy()
    for name in ds.data_vars:
        dirty[name] = ds[name].where(~bad, np.inf)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with pytest.warns(gs.GpuscopeWarning, match=f"{bad.sum()} of {bad.size} samples have NaN or inf"):
            out = phases(dirty, topdown=False)
    assert out.attrs["phases_excluded_samples"] == bad.sum()
    assert out.sizes["phase_id"] == clean.sizes["phase_id"] == 2
    assert np.abs(out.segment_first.values - clean.segment_first.values).max() <= 10  # within 1 ms
    assert np.isfinite(out.phase_mean).all()
