"""The Profiler Host API through the real libcupti, with no GPU and no driver."""

import ctypes
import types

import numpy as np
import pytest

from gpuscope.cupti import _api, host
from gpuscope.cupti._types import MetricType, ProfilerType

# Base metric counts per (chip, profiler type) measured on CUPTI 13.0 and 13.1 (COUNTER, RATIO, THROUGHPUT).
BASE_COUNTS = {
    (13, 1): {("GH100", 0): (3389, 205, 56), ("GH100", 1): (614, 605, 63), ("GA100", 0): (2876, 160, 26),
              ("TU102", 0): (1618, 151, 27)},
    (13, 0): {("GH100", 0): (3389, 205, 56), ("GH100", 1): (611, 605, 63), ("GA100", 0): (2876, 160, 26),
              ("TU102", 0): (1618, 151, 27)},
}
AVAILABILITY = "tests/fixtures/gh100_counter_availability_range.npy"


@pytest.fixture(scope="module")
def gh100():
    with host.ProfilerHost("GH100", ProfilerType.RANGE_PROFILER) as h:
        yield h


def test_supported_chips_include_current_generations():
    chips = host.supported_chips()
    assert {"GH100", "GA100", "AD102", "TU102"} <= set(chips)
    assert "gh100" not in chips


@pytest.mark.parametrize("chip,ptype", [("GH100", 0), ("GH100", 1), ("GA100", 0), ("TU102", 0)])
def test_base_metric_counts(chip, ptype):
    with host.ProfilerHost(chip, ProfilerType(ptype)) as h:
        counts = tuple(len(h.base_metrics(t)) for t in MetricType)
    expected = BASE_COUNTS.get(_api.version(), {}).get((chip, ptype))
    if expected is None:
        assert all(c > 0 for c in counts)
    else:
        assert counts == expected


def test_sub_metrics_per_type(gh100):
    assert len(gh100.sub_metrics("sm__cycles_elapsed.avg", MetricType.COUNTER)) == 44
    assert set(gh100.sub_metrics("smsp__thread_inst_executed_per_inst_executed.ratio", MetricType.RATIO)) == {
        ".max_rate", ".pct", ".ratio"}
    assert len(gh100.sub_metrics("sm__throughput.avg.pct_of_peak_sustained_elapsed", MetricType.THROUGHPUT)) == 8


def test_metric_properties(gh100):
    p = gh100.metric_properties("sm__throughput.avg.pct_of_peak_sustained_elapsed")
    assert p.description == "SM throughput assuming ideal load balancing across SMSPs"
    assert (p.hw_unit, p.units, p.metric_type) == ("sm", "percent", MetricType.THROUGHPUT)
    assert gh100.metric_properties("gpu__time_duration.sum").units == "nanosecond"


def test_config_image_and_passes():
    metrics = ["sm__cycles_elapsed.avg", "smsp__inst_executed.sum", "sm__throughput.avg.pct_of_peak_sustained_elapsed"]
    image = host.config_image("GH100", ProfilerType.RANGE_PROFILER, metrics)
    assert image.dtype == np.uint8 and image.size > 1000
    assert host.num_passes(image) == 8  # sm__throughput needs 8 passes on its own
    assert host.num_passes(host.config_image("GH100", ProfilerType.RANGE_PROFILER, metrics[:2])) == 1
    # PM sampling must be single-pass: sm__throughput is far from it.
    assert host.num_passes(host.config_image("GH100", ProfilerType.PM_SAMPLING, metrics)) > 1


def test_real_counter_availability_gives_same_passes():
    availability = np.load(AVAILABILITY)
    metrics = ["smsp__inst_executed.avg.per_cycle_active", "smsp__warp_issue_stalled_wait_per_warp_active.pct",
               "dram__bytes_read.sum"]
    offline = host.num_passes(host.config_image("GH100", ProfilerType.RANGE_PROFILER, metrics))
    real = host.num_passes(host.config_image("GH100", ProfilerType.RANGE_PROFILER, metrics, availability))
    assert offline == real == 1


def test_max_metrics_per_pass():
    assert host.max_metrics_per_pass("GH100", ProfilerType.RANGE_PROFILER) == 88
    assert host.max_metrics_per_pass("GH100", ProfilerType.PM_SAMPLING) == 248


def test_closed_host_refuses_calls():
    h = host.ProfilerHost("GA100")
    h.close()
    h.close()  # twice is fine
    with pytest.raises(ValueError, match="closed"):
        h.base_metrics(MetricType.COUNTER)


def test_evaluate_rejects_garbage_image(gh100):
    from gpuscope.errors import CounterDataImageError

    with pytest.raises(CounterDataImageError, match="not a CUPTI counter-data image"):
        gh100.evaluate(np.zeros(64, dtype=np.uint8), 0, ["smsp__inst_executed.sum"])


@pytest.mark.parametrize("metric_set", ["launch", "speed-of-light", "topdown", "fast-topdown"])
def test_pm_availability_image_gives_the_range_profilers_config(metric_set):
    """gpuscope.Profiler builds its config with PM sampling's availability image (the range profiler's query
    stops CUPTI 13.0 from delivering PC sampling records): on the H100's images both give the same bytes."""
    import gpuscope as gs

    pm = np.load("tests/fixtures/gh100_counter_availability_pm.npy")
    rng = np.load(AVAILABILITY)
    metrics = gs.metric_set(metric_set).metrics
    a = host.config_image("GH100", ProfilerType.RANGE_PROFILER, metrics, pm)
    b = host.config_image("GH100", ProfilerType.RANGE_PROFILER, metrics, rng)
    assert a.tobytes() == b.tobytes()


def test_counter_availability_is_queried_once_per_device(monkeypatch):
    """Every session needs the availability image; CUPTI's query takes about 0.1 s on the H100, so gpuscope keeps
    it per device (read-only) and asks again only with cached=False."""
    from gpuscope.cupti import profiler

    calls = []
    image = np.load("tests/fixtures/gh100_counter_availability_pm.npy")

    def query(p):
        calls.append(int(p.deviceIndex))
        if p.pCounterAvailabilityImage:
            ctypes.memmove(p.pCounterAvailabilityImage, image.ctypes.data, image.size)
        else:
            p.counterAvailabilityImageSize = image.size

    monkeypatch.setattr(profiler, "_pm", types.SimpleNamespace(cuptiPmSamplingGetCounterAvailability=query))
    monkeypatch.setattr(profiler, "_pm_availability", {})
    first = profiler.pm_counter_availability(1)
    assert calls == [1, 1] and first.tobytes() == image.tobytes() and not first.flags.writeable
    assert profiler.pm_counter_availability(1) is first and calls == [1, 1]
    profiler.pm_counter_availability(2)
    assert calls == [1, 1, 2, 2]
    again = profiler.pm_counter_availability(1, cached=False)
    assert calls[-2:] == [1, 1] and again.tobytes() == image.tobytes()
