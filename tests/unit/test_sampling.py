"""PM sampling without a GPU: interval parsing, trigger choice, single-pass check with the GH100 availability
image, range alignment, loss counting, the Dataset schema, netCDF round trip and the Chrome-trace export."""

import datetime
import json
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from gpuscope._results import trace as _trace
from gpuscope._results import build as _results
from gpuscope._pm_sampling import sampler as _sampling
from gpuscope._pm_sampling import timeline as _timeline
from gpuscope._pm_sampling import plan as _plan
from gpuscope._pm_sampling.api import sample as gs_sample
from gpuscope._pm_sampling.timeline import Span
from gpuscope._schema.dataset import SCHEMA_VERSION
from gpuscope.errors import NotSinglePassError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
AVAILABILITY = np.load(FIXTURES / "gh100_counter_availability_pm.npy")


@pytest.mark.parametrize(
    "text, expected",
    [
        ("20us", (20_000, "ns")),
        ("20 µs", (20_000, "ns")),
        ("0.5ms", (500_000, "ns")),
        ("1e-4s", (100_000, "ns")),
        ("750ns", (750, "ns")),
        (1500, (1500, "ns")),
        (datetime.timedelta(microseconds=100), (100_000, "ns")),
        ("20000cycles", (20_000, "cycles")),
    ],
)
def test_parse_interval(text, expected):
    assert _plan.parse_interval(text) == expected


@pytest.mark.parametrize("bad", ["20", "20 parsecs", "-5us", "0us", "", float("nan")])
def test_parse_interval_rejects(bad):
    with pytest.raises(ValueError):
        _plan.parse_interval(bad)


def test_parse_interval_type():
    with pytest.raises(TypeError):
        _plan.parse_interval([20])


@pytest.mark.parametrize("interval, says", [
    (1.5, "1.5 ns). A number without a unit is ns: give a unit (e.g. '1.5us' for µs) or a whole number of ns, e.g. 2"),
    (20_000.5, "(20000.5 ns)"),
    ("1.5ns", "Give a whole number of ns, e.g. 2"),
    ("0.0000015ms", "(1.5 ns)"),
])
def test_a_fraction_of_a_ns_is_refused_not_rounded(interval, says):
    """CUPTI takes the interval in whole ns: interval=1.5 became 2 ns without a word."""
    with pytest.raises(ValueError, match="whole number of nanoseconds") as info:
        _plan.parse_interval(interval)
    assert says in str(info.value)


def test_a_fraction_of_a_cycle_is_refused_not_rounded():
    with pytest.raises(ValueError, match="whole number of cycles"):
        _plan.parse_interval("2.5cycles")
    assert _plan.parse_interval("2e4cycles") == (20_000, "cycles")


@pytest.mark.parametrize("text, ns", [("1e-4s", 100_000), ("0.3us", 300), ("0.1ms", 100_000), (2e4, 20_000)])
def test_decimal_intervals_are_whole_ns_despite_float_error(text, ns):
    assert _plan.parse_interval(text) == (ns, "ns")  # 0.3 * 1000 is 300.00000000000006 in floats


@pytest.mark.parametrize("interval", [900, "500ns", "0.5us"])
def test_an_interval_below_a_microsecond_is_refused_by_sample_itself(interval):
    """Refused at gs.sample(...), before any CUDA call (it used to wait for start(), on the GPU)."""
    with pytest.raises(ValueError, match="shorter than gpuscope allows") as info:
        gs_sample(interval=interval)
    assert repr(interval) in str(info.value) and "a number without a unit is ns" in str(info.value)


def test_a_decode_period_that_would_spin_is_refused():
    """decode_period=1e-9 made the decode thread spin (a decode every wake-up, the GIL taken from the user)."""
    with pytest.raises(ValueError, match="decode_period must be at least 0.001 s; got 1e-09") as info:
        gs_sample(decode_period=1e-9)
    assert "spinning" in str(info.value)
    assert gs_sample(decode_period=0.001).decode_period == 0.001


def test_trigger_per_chip():
    assert _plan.choose_trigger("GH100") is _plan.Trigger.TIME
    assert _plan.choose_trigger("GA102") is _plan.Trigger.TIME
    assert _plan.choose_trigger("GA100") is _plan.Trigger.SYSCLK
    assert _plan.choose_trigger("TU102") is _plan.Trigger.SYSCLK


def test_sampler_rejects_bad_arguments_before_touching_the_gpu():
    with pytest.raises(ValueError, match="interval"):
        gs_sample(interval="fast")
    with pytest.raises(ValueError, match="device"):
        gs_sample(device=-1)
    with pytest.raises(ValueError, match="hardware_buffer_size"):
        gs_sample(hardware_buffer_size=1024)
    with pytest.raises(RuntimeError, match="after the"):
        gs_sample().dataset


def test_pm_default_is_single_pass_on_gh100():
    from gpuscope._gpu import metric_lists as _lists

    metrics = _lists.resolve("pm-default", "GH100", "sampling")
    _plan.check_single_pass(metrics, "GH100", AVAILABILITY)  # does not raise
    assert _lists.count_passes(metrics, "GH100", "sampling", AVAILABILITY) == 1


def test_multi_pass_message_says_what_to_drop_and_how_to_split():
    metrics = [
        "sm__throughput.avg.pct_of_peak_sustained_elapsed",
        "gr__cycles_active.avg.pct_of_peak_sustained_elapsed",
        "dram__throughput.avg.pct_of_peak_sustained_elapsed",
    ]
    with pytest.raises(NotSinglePassError) as info:
        _plan.check_single_pass(metrics, "GH100", AVAILABILITY)
    err = info.value
    assert isinstance(err, ValueError)
    assert err.passes > 1
    assert err.drop == ("sm__throughput.avg.pct_of_peak_sustained_elapsed",)
    assert err.groups == (tuple(metrics[1:]),)
    assert "Drop these" in str(err) and "sm__throughput" in str(err)


def test_innermost_range_nested_and_threads():
    spans = [Span("a", 1, 10, 100), Span("a/b", 1, 20, 50), Span("c", 2, 40, 60)]
    times = np.array([5, 15, 25, 45, 55, 70, 200, 50])
    assert _timeline.innermost_ranges(times, spans).tolist() == ["", "a", "a/b", "c", "c", "a", "", "c"]
    assert _timeline.innermost_ranges(times, []).tolist() == [""] * len(times)


def test_range_recorder_pairs_per_thread_and_closes_open_ranges():
    host = iter(range(100, 200, 10))
    rec = _sampling._RangeRecorder(lambda: 1000, host_clock=lambda: next(host))  # anchor (100+110)//2=105 -> 1000
    rec.log((120, True, "a", 1))
    rec.log((125, True, "x", 2))
    rec.log((130, True, "a/b", 1))
    rec.log((135, False, "y", 2))  # popped on thread 2: x
    rec.log((140, False, "a/b", 1))
    rec.log((150, True, "a/c", 1))  # never popped
    rec.log((160, False, "z", 3))  # a pop whose push came before the recorder: left out
    spans = rec.spans(open_until_ns=5000)
    assert [(s.path, s.thread, s.start_ns, s.end_ns) for s in spans] == [
        ("a", 1, 1015, 5000), ("x", 2, 1020, 1030), ("a/b", 1, 1025, 1035), ("a/c", 1, 1045, 5000)]


def test_ranges_reach_the_stamp_log_on_the_host_clock_and_the_recorder_follows_a_drift(monkeypatch):
    """PM sampling's recorder is a stamp log of gs.range (issue 52, item 13: a listener's dispatch and
    cuptiGetTimestamp cost 1.5 us a push inside the user's loop): a push and a pop append the host clock, CUPTI's
    is read only at the anchors; between them a stamp takes the offset interpolated, so a host clock running
    400 ppm fast against CUPTI's is followed."""
    from gpuscope._range_profiling import ranges as _ranges

    now = [0]
    cupti_reads = []

    def cupti():
        cupti_reads.append(now[0])
        return 5_000_000 + now[0] * 10_000 // 10_004  # the host clock runs 400 ppm fast

    monkeypatch.setattr(_ranges, "_now", lambda: now[0])
    rec = _sampling._RangeRecorder(cupti, host_clock=lambda: now[0])
    _ranges.add_stamp_log(rec.log)
    try:
        for t in range(0, 50_000_000, 100_000):  # a range every 100 us for 50 ms, anchors every 10 ms
            now[0] = t
            with _ranges.range("step"):
                now[0] = t + 50_000
            if (t + 100_000) % 10_000_000 == 0:
                rec.anchor()  # the decode thread's drain
        with _ranges.range("outer"):  # pushed and popped after the log is removed: only its push is there
            _ranges.remove_stamp_log(rec.log)
    finally:
        _ranges.remove_stamp_log(rec.log)
    assert _ranges._stamp_logs == ()
    assert len(cupti_reads) == 6  # made, and five drains: not one a range
    spans = rec.spans(open_until_ns=99)
    truth = [5_000_000 + (t * 10_000 // 10_004) for t in range(0, 50_000_000, 100_000)]
    assert [s.path for s in spans] == ["step"] * 500 + ["outer"] and spans[-1].end_ns == 99
    assert max(abs(s.start_ns - t) for s, t in zip(spans, truth)) <= 2


def test_count_lost_from_gaps():
    start = np.array([0, 10, 20, 60, 70])
    end = np.array([10, 20, 30, 70, 80])
    assert _timeline.count_lost(start, end, 10) == 3  # 30..60 is missing
    assert _timeline.count_lost(start[:3], end[:3], 10) == 0
    assert _timeline.count_lost(start[:3], end[:3], 10, session_end_ns=80) == 4  # 30..70 never came, 70..80 was in flight


def _synthetic():
    metrics = ["sm__cycles_active.avg.pct_of_peak_sustained_elapsed", "pcie__read_bytes.sum.per_second"]
    start = np.arange(5, dtype=np.int64) * 1000 + 10_000
    end = start + 1000
    spans = [Span("step", 7, 11_500, 14_000), Span("step/fwd", 7, 12_000, 13_000)]
    ranges = _timeline.innermost_ranges((start + end) // 2, spans)
    props = {
        metrics[0]: {"units": "percent", "description": "# of cycles with at least one warp in flight"},
        metrics[1]: {"units": "byte/second", "description": "# of bytes of PCIe read data"},
    }
    return _results.sampling_dataset(
        values=np.arange(10.0).reshape(2, 5),
        metrics=metrics,
        properties=props,
        start_ns=start,
        end_ns=end,
        ranges=ranges,
        spans=spans,
        session_start_ns=10_200,
        chip="GH100",
        attrs={"interval_ns": 1000, "trigger": "time", "lost_samples": 0, "overflows": 0, "decode_errors": ""},
    )


def test_dataset_schema():
    ds = _synthetic()
    assert ds.sizes == {"time": 5}  # the user ranges are a table in the attrs, one array per column
    assert ds.attrs["span_path"].tolist() == ["step", "step/fwd"] and ds.attrs["span_thread"].tolist() == [7, 7]
    assert ds["span_index"].values.tolist() == [-1, 0, 1, 0, -1] and ds["span_index"].dims == ("time",)
    assert all(ds[v].dims == ("time",) for v in ds.data_vars) and ds.attrs["gpuscope_schema"] == SCHEMA_VERSION
    assert len(ds.to_dataframe()) == 5  # one row per sample
    assert ds["time"].values.tolist() == [800, 1800, 2800, 3800, 4800]
    assert ds["time"].dtype == np.int64 and ds["time"].attrs["units"] == "ns"
    assert ds["range"].values.tolist() == ["", "step", "step/fwd", "step", ""]
    assert ds["sm__cycles_active.avg.pct_of_peak_sustained_elapsed"].attrs["units"] == "percent"
    assert ds["pcie__read_bytes.sum.per_second"].values.tolist() == [5.0, 6.0, 7.0, 8.0, 9.0]
    assert ds.attrs["kind"] == "pm_sampling" and ds.attrs["chip"] == "GH100" and ds.attrs["trigger"] == "time"


def test_netcdf_round_trip(tmp_path):
    ds = _synthetic()
    path = tmp_path / "series.nc"
    ds.to_netcdf(path, engine="h5netcdf")
    with xr.open_dataset(path, engine="h5netcdf") as back:
        xr.testing.assert_identical(back.load(), ds)


def test_chrome_trace(tmp_path):
    ds = _synthetic()
    trace = _trace.to_chrome_trace(ds, tmp_path / "t.json")
    assert json.loads((tmp_path / "t.json").read_text()) == trace
    counters = [e for e in trace["traceEvents"] if e["ph"] == "C"]
    assert len(counters) == 10
    first = [e for e in counters if e["name"].startswith("sm__cycles_active")]
    assert first[0]["name"].endswith("(percent)")
    assert [e["ts"] for e in first] == [0.0, 0.8, 1.8, 2.8, 3.8]  # µs from the session start, clipped at 0
    assert [e["args"]["value"] for e in first] == [0.0, 1.0, 2.0, 3.0, 4.0]
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert [(e["name"], e["ts"], e["dur"], e["args"]["path"]) for e in slices] == [
        ("step", 1.3, 2.5, "step"),
        ("fwd", 1.8, 1.0, "step/fwd"),
    ]
    only = _trace.to_chrome_trace(ds, metrics=["pcie__read_bytes.sum.per_second"])
    assert len([e for e in only["traceEvents"] if e["ph"] == "C"]) == 5
    with pytest.raises(ValueError, match="Not in this dataset"):
        _trace.to_chrome_trace(ds, metrics=["nope"])
    with pytest.raises(ValueError, match="PM sampling"):
        _trace.to_chrome_trace(xr.Dataset())

