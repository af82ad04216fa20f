"""Evaluate a PM sampling counter-data image recorded on the H100 (CUPTI 13.0, pm-default at 100 µs, a streaming
then an FMA phase) with the real CUPTI host API on the CPU, and compare with the values the H100 computed."""

from pathlib import Path

import numpy as np
import pytest

from gpuscope._results import build as _results
from gpuscope._pm_sampling import series as _series
from gpuscope._pm_sampling import timeline as _timeline
from gpuscope.cupti import pm_sampling as pm

HERE = Path(__file__).resolve().parents[1] / "fixtures"


def test_counter_data_info_offline(pm_recording):
    meta, image, stamps = pm_recording
    info = pm.counter_data_info(image)
    assert info.total == meta["total"] == 400
    assert info.completed == meta["completed"] == len(stamps) == 261


def test_evaluation_matches_the_device(pm_recording):
    meta, image, stamps = pm_recording
    availability = np.load(HERE / "gh100_counter_availability_pm.npy")
    series = _series.evaluate_images(meta["chip"], meta["metrics"], [image], [stamps], availability)
    assert series.values.shape == (8, 261)
    for i, name in enumerate(meta["metrics"]):
        np.testing.assert_allclose(series.values[i], meta["values_device"][name], rtol=1e-9, atol=1e-9)
    assert series.properties["sm__cycles_active.avg.pct_of_peak_sustained_elapsed"]["units"] == "percent"
    assert series.properties["pcie__read_bytes.sum.per_second"]["units"] == "byte/second"
    # 100 µs samples, back to back; the first one reaches back before sampling started
    assert (series.start_ns[1:] == series.end_ns[:-1]).all()
    assert np.median(np.diff(series.start_ns[1:])) == pytest.approx(100_000, abs=100)
    assert series.start_ns[0] < meta["session_start_ns"] < series.end_ns[0]
    sm = series.values[meta["metrics"].index("sm__cycles_active.avg.pct_of_peak_sustained_elapsed")]
    assert 80 < np.median(sm[1:]) <= 100  # the GPU was busy throughout this image


def test_dataset_from_the_recording(pm_recording):
    meta, image, stamps = pm_recording
    series = _series.evaluate_images(meta["chip"], meta["metrics"], [image], [stamps])
    spans = [_timeline.Span(p, 1, s, e) for p, s, e in meta["spans"]]
    ds = _results.sampling_dataset(
        values=series.values,
        metrics=meta["metrics"],
        properties=series.properties,
        start_ns=series.start_ns,
        end_ns=series.end_ns,
        ranges=_timeline.innermost_ranges((series.start_ns + series.end_ns) // 2, spans),
        spans=spans,
        session_start_ns=meta["session_start_ns"],
        chip=meta["chip"],
    )
    assert ds.sizes["time"] == 261
    assert ds["time"].values[0] == series.end_ns[0] - meta["session_start_ns"]
    assert set(np.unique(ds["range"].values)) <= {"", "stream", "fma"}
    assert (ds["range"].values[5:] == "stream").sum() > 200  # this image holds the streaming phase


def test_fast_evaluator_matches_evaluate(pm_recording):
    from gpuscope.cupti import host
    from gpuscope.cupti._types import ProfilerType

    meta, image, stamps = pm_recording
    metrics = meta["metrics"]
    with host.ProfilerHost(meta["chip"], ProfilerType.PM_SAMPLING) as h:
        expected = np.array([h.evaluate(image, i, metrics) for i in range(261)])
        out = np.full((300, len(metrics)), -1.0)
        evaluator = h.evaluator(metrics)
        evaluator.evaluate_into(image, 0, 200, out)
        evaluator.evaluate_into(image, 200, 61, out[200:])
        np.testing.assert_array_equal(out[:261], expected)  # bit for bit
        assert (out[261:] == -1.0).all()  # nothing written past count
        part = np.empty((5, len(metrics)))
        evaluator.evaluate_into(image, 17, 5, part)
        np.testing.assert_array_equal(part, expected[17:22])
        with pytest.raises(ValueError, match="shape"):
            evaluator.evaluate_into(image, 0, 10, np.empty((5, len(metrics))))
        with pytest.raises(ValueError, match="float64"):
            evaluator.evaluate_into(image, 0, 1, np.empty((1, len(metrics)), dtype=np.float32))
    with pytest.raises(ValueError, match="closed"):
        evaluator.evaluate_into(image, 0, 1, part)


def test_sample_times_into_checks_out(pm_recording):
    _, image, _ = pm_recording
    with pytest.raises(ValueError, match="shape"):
        pm.sample_times_into(0, image, 0, 3, np.empty((2, 2), dtype=np.int64))
    with pytest.raises(ValueError, match="int64"):
        pm.sample_times_into(0, image, 0, 1, np.empty((1, 2)))
