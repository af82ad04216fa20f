"""The Profiler Host API through the real libcupti, with no GPU and no driver."""

import ctypes
import types
from pathlib import Path

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
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"  # not the working folder: tests run from anywhere
AVAILABILITY = FIXTURES / "gh100_counter_availability_range.npy"


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

    pm = np.load(FIXTURES / "gh100_counter_availability_pm.npy")
    rng = np.load(AVAILABILITY)
    metrics = gs.metric_set(metric_set).metrics
    a = host.config_image("GH100", ProfilerType.RANGE_PROFILER, metrics, pm)
    b = host.config_image("GH100", ProfilerType.RANGE_PROFILER, metrics, rng)
    assert a.tobytes() == b.tobytes()


def _fake_pm_availability(monkeypatch, calls=None):
    """CUPTI's PM counter-availability query answered with the recorded H100 image (device indices asked go to
    *calls*); returns the image."""
    from gpuscope.cupti import profiler

    image = np.load(FIXTURES / "gh100_counter_availability_pm.npy")

    def query(p):
        if calls is not None:
            calls.append(int(p.deviceIndex))
        if p.pCounterAvailabilityImage:
            ctypes.memmove(p.pCounterAvailabilityImage, image.ctypes.data, image.size)
        else:
            p.counterAvailabilityImageSize = image.size

    monkeypatch.setattr(profiler, "_pm", types.SimpleNamespace(cuptiPmSamplingGetCounterAvailability=query))
    monkeypatch.setattr(profiler, "_pm_availability", {})
    return image


def test_counter_availability_is_queried_once_per_device(monkeypatch):
    """Every session needs the availability image; CUPTI's query takes about 0.1 s on the H100, so gpuscope keeps
    it per device (read-only) and asks again only with cached=False."""
    from gpuscope.cupti import profiler

    calls = []
    image = _fake_pm_availability(monkeypatch, calls)
    first = profiler.pm_counter_availability(1)
    assert calls == [1, 1] and first.tobytes() == image.tobytes() and not first.flags.writeable
    assert profiler.pm_counter_availability(1) is first and calls == [1, 1]
    profiler.pm_counter_availability(2)
    assert calls == [1, 1, 2, 2]
    again = profiler.pm_counter_availability(1, cached=False)
    assert calls[-2:] == [1, 1] and again.tobytes() == image.tobytes()


@pytest.mark.parametrize("image,why", [
    (b"", "(0 bytes) is not a CUPTI counter-availability image: it is too short to hold one"),
    (bytes(range(64)), "its root table offset (50462976) does not point inside it"),
    (np.zeros(9184, np.uint8), "its root table offset (0) does not point inside it"),
    (np.arange(9184, dtype=np.int64), "must be bytes or a 1-D numpy uint8 array"),
    ([16, 0, 0, 0], "must be bytes or a 1-D numpy uint8 array"),
])
def test_garbage_availability_is_refused_before_cupti_sees_it(child_checks, image, why):
    from gpuscope.errors import ImageError

    with pytest.raises(ImageError, match=why.replace("(", r"\(").replace(")", r"\)")):
        host.ProfilerHost("GH100", ProfilerType.RANGE_PROFILER, image)
    with pytest.raises(ValueError, match="Pass the image exactly as|must be bytes"):  # a ValueError too
        host.max_metrics_per_pass("GH100", ProfilerType.PM_SAMPLING, image)
    assert child_checks == []  # refused by its structure: no child process needed


def test_an_availability_image_of_another_chip_is_refused(child_checks):
    from gpuscope.errors import ImageError

    with pytest.raises(ImageError, match="is a counter-availability image of GH100, not of GA100"):
        host.config_image("GA100", ProfilerType.RANGE_PROFILER, ["sm__cycles_elapsed.max"], np.load(AVAILABILITY))
    assert child_checks == []


def test_a_foreign_availability_image_is_read_in_a_child_once(child_checks):
    image = np.load(AVAILABILITY)
    assert host.max_metrics_per_pass("GH100", ProfilerType.RANGE_PROFILER, image) == 76
    assert host.max_metrics_per_pass("GH100", ProfilerType.RANGE_PROFILER, image.tobytes()) == 76  # same content
    host.ProfilerHost("GH100", ProfilerType.RANGE_PROFILER, image).close()
    assert child_checks == [("counter_availability", "GH100", ("sm__cycles_elapsed.max",), 0, 9184)]
    host.ProfilerHost("GH100", ProfilerType.PM_SAMPLING, image).close()  # tried with each host type
    assert child_checks[1:] == [("counter_availability", "GH100", ("sm__cycles_elapsed.max",), 1, 9184)]


def test_config_images_cupti_made_are_trusted_others_checked(child_checks):
    from gpuscope.errors import ImageError

    config = host.config_image("GH100", ProfilerType.RANGE_PROFILER, ["sm__cycles_elapsed.max"])
    assert host.num_passes(config) == 1 and child_checks == []
    assert host.num_passes(config.copy()) == 1 and child_checks == [("config", "GH100", (), None, config.size)]
    with pytest.raises(ImageError, match="config .0 bytes. is not a CUPTI config image: it is too short"):
        host.num_passes(np.zeros(0, np.uint8))
    with pytest.raises(ImageError, match="does not carry CUPTI's identifier LOPC at byte 4"):
        host.num_passes(np.zeros_like(config))


def test_device_availability_images_are_trusted(monkeypatch, child_checks):
    from gpuscope.cupti import _images, profiler

    _fake_pm_availability(monkeypatch)
    device = profiler.pm_counter_availability(0)
    assert _images.is_trusted(device, _images.Kind.AVAILABILITY)
    host.ProfilerHost("GH100", ProfilerType.PM_SAMPLING, device).close()
    assert child_checks == []  # CUPTI's own image: no child process
