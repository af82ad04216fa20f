"""``gpuscope.sample(device="all" | [0, 1])`` without a GPU: each device's Sampler is faked by one that returns the
shipped H100 PM recording placed on that device (its sampling started later on the process's CUPTI clock); the
combining, the time base, the lifetimes and the checks of the device argument are the real code."""

import numpy as np
import pytest
import xarray as xr

import gpuscope as gs
from gpuscope import cli
from gpuscope._commands import demo as _demo
from gpuscope._gpu import device as _device
from gpuscope._pm_sampling import multi as _multi_sampling
from gpuscope._results import build as _results
from gpuscope._schema import dataset as _dataset
from gpuscope._pm_sampling import sampler as _sampling
from gpuscope.errors import GpuscopeError, SamplerBusyError

ACTIVE = "sm__cycles_active.avg.pct_of_peak_sustained_elapsed"
#: Device -> (ns its session started after device 0's, ns its samples lag device 0's, samples kept, losses).
PLACES = {0: (0, 0, 18019, {}),
          1: (1_500_000, 1_537_000, 17_500, {"lost_samples": 5, "overflows": 1, "decode_errors": "decode failed"}),
          2: (2_000_000, 2_011_000, 18_019, {})}
WALL_MINUS_CUPTI = 123_456_789  # one process: one link between the CUPTI clock and the wall clock


@pytest.fixture(scope="module")
def recording():
    return gs.open_dataset(_demo.RECORDED_SERIES)


def on_device(recording, device):
    """The recording as device *device*'s sampler would give it: samples and session start later by the device's
    lag, the span table (the process's user ranges) as it is, the range of each sample derived from it."""
    start_after, lag, kept, losses = PLACES[device]
    ds = recording.isel(time=slice(0, kept))
    table = {k: recording.attrs[k].tolist() for k in _dataset.SPAN_VARS}
    session = int(recording.attrs["session_start_ns"]) + start_after
    coords = _results.sample_coords(ds["start_ns"].values + lag, ds["end_ns"].values + lag, session, table)
    data = {m: xr.DataArray(ds[m].values, dims="time", attrs=dict(ds[m].attrs)) for m in ds.data_vars}
    attrs = {k: v for k, v in recording.attrs.items() if k not in _dataset.TABLE_ATTRS}
    attrs.update({"device_index": device, "session_start_ns": session,
                  "session_end_ns": int(recording.attrs["session_end_ns"]) + lag,
                  "wall_clock_ns": session + WALL_MINUS_CUPTI})  # the recording's own losses (73 samples) ...
    attrs.update(losses)  # ... or the device's
    attrs.update(_dataset.table_attrs(_dataset.SPAN_TABLE, table))
    return xr.Dataset(data, coords=coords, attrs=attrs)


class FakeSampler:
    """One device's Sampler: logs start and stop, fails where told, and gives the recording on its device."""

    log: list = []
    fail_start: set = set()
    fail_stop: set = set()
    recording = None

    def __init__(self, metrics="pm-default", interval="100us", device=0, **options):
        _sampling.Sampler(metrics, interval, device, **options)  # the real argument checks (no CUDA)
        self.device = device
        self.open = False

    def __enter__(self):
        self.log.append(("start", self.device))
        if self.device in self.fail_start:
            raise SamplerBusyError(f"A PM sampler is already running on device {self.device}")
        self.open = True
        return self

    def __exit__(self, *exc):
        self.log.append(("stop", self.device))
        self.open = False
        if self.device in self.fail_stop:
            raise GpuscopeError(f"cuptiPmSamplingStop failed on device {self.device}")
        return False

    @property
    def dataset(self):
        return on_device(self.recording, self.device)

    @property
    def lost_samples(self):
        return int(self.dataset.attrs["lost_samples"])


@pytest.fixture
def fake(monkeypatch, recording):
    FakeSampler.log, FakeSampler.fail_start, FakeSampler.fail_stop = [], set(), set()
    FakeSampler.recording = recording
    monkeypatch.setattr(_multi_sampling, "Sampler", FakeSampler)
    monkeypatch.setattr(_device, "device_count", lambda: 2)
    return FakeSampler


def still_open(sampler):
    return [s.device for s in sampler.samplers if s.open]


# ---------------------------------------------------------------------------------------------------------
# one Dataset, one time base


def test_two_devices_give_one_dataset_on_one_time_base(fake, recording):
    with gs.sample(device=[1, 0]) as s:
        assert s.running and s.devices == [0, 1]
    assert fake.log == [("start", 0), ("start", 1), ("stop", 1), ("stop", 0)]
    ds = s.dataset
    assert dict(ds.sizes) == {"device": 2, "sample": 18019} and ds["device"].values.tolist() == [0, 1]
    assert ds["samples"].values.tolist() == [18019, 17500]
    origin = int(recording.attrs["session_start_ns"])  # device 0 started first
    assert ds.attrs["time_origin_ns"] == ds.attrs["session_start_ns"] == origin
    assert ds.attrs["wall_clock_ns"] == origin + WALL_MINUS_CUPTI
    assert ds["session_start_ns"].values.tolist() == [origin, origin + 1_500_000]
    for d, n in [(0, 18019), (1, 17500)]:
        row, own = ds.sel(device=d), s.datasets[d]
        # CUPTI timestamps kept as they are (one clock in a process); time from the earliest start
        np.testing.assert_array_equal(row["end_ns"].values[:n], own["end_ns"].values)
        np.testing.assert_array_equal(row["time"].values[:n], own["end_ns"].values - origin)
        np.testing.assert_array_equal(row[ACTIVE].values[:n], own[ACTIVE].values)
        np.testing.assert_array_equal(row["range"].values[:n], own["range"].values)
        assert np.isnan(row[ACTIVE].values[n:]).all() and (row["time"].values[n:] == -1).all()
    # device 1's k-th sample is device 0's k-th, 1.537 ms later on the common time base
    lag = ds["time"].sel(device=1).values[:17500] - ds["time"].sel(device=0).values[:17500]
    assert (lag == 1_537_000).all()
    # each device's own Dataset comes back whole, and analyses take it
    for d in (0, 1):
        xr.testing.assert_identical(gs.select_device(ds, d), s.datasets[d])
    ph = gs.phases(gs.select_device(ds, 1))
    np.testing.assert_array_equal(ph["phase"].values, gs.phases(s.datasets[1])["phase"].values)
    assert gs.spans(ds)["path"].tolist() == ["stream", "fma", "divergent"]  # the process's ranges, kept
    assert gs.report(gs.select_device(ds, 0)).title.startswith("gpuscope report: PM sampling, 18019 samples")
    assert len(ds.attrs["span_path"]) == 3 and ds["span_index"].dims == ("device", "sample")
    frame = ds.to_dataframe()  # one row per (device, sample)
    assert len(frame) == 2 * 18019 and len(frame[frame["time"] >= 0]) == 18019 + 17500


def test_loss_counts_are_per_device_and_summed(fake, recording):
    with gs.sample(device="all") as s:
        pass
    ds = s.dataset
    assert ds["lost_samples"].values.tolist() == [73, 5]  # the recording lost 73; device 1 another 5
    assert ds.attrs["lost_samples"] == 78 == s.lost_samples
    assert ds["overflows"].values.tolist() == [0, 1] and ds.attrs["overflows"] == 1
    assert ds.attrs["decode_errors"] == "device 1: decode failed"
    assert ds.attrs["discarded_samples"] == 0 and ds["discarded_samples"].values.tolist() == [0, 0]
    assert gs.select_device(ds, 1).attrs["lost_samples"] == 5  # each device keeps its own count
    assert ds["device_name"].values.tolist() == ["NVIDIA H100 80GB HBM3"] * 2


def test_round_trip_and_each_device_on_the_command_line(fake, tmp_path, capsys):
    script = tmp_path / "work.py"
    script.write_text("print('script ran')\n")
    out = tmp_path / "both.nc"
    assert cli.main(["run", "--sample", "pm-default@100us", "--device", "all", "-o", str(out), str(script)]) == 0
    printed = capsys.readouterr().out
    assert fake.log == [("start", 0), ("start", 1), ("stop", 1), ("stop", 0)]
    assert "device 0:\ngpuscope report: PM sampling, 18019 samples" in printed
    assert "device 1:\ngpuscope report: PM sampling, 17500 samples" in printed
    back = gs.open_dataset(out)
    xr.testing.assert_identical(back, gs.combine_devices([on_device(fake.recording, d) for d in (0, 1)]))
    assert cli.main(["show", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "device 1:" in shown and "17500 samples" in shown
    fake.log.clear()
    assert cli.main(["run", "--sample", "pm-default", "--device", "1,0", str(script)]) == 0
    assert fake.log[:2] == [("start", 0), ("start", 1)]


def test_command_line_device_choices(fake, tmp_path, capsys):
    script = tmp_path / "work.py"
    script.write_text("pass\n")
    assert cli.main(["run", "--device", "all", str(script)]) == cli.EXIT_USAGE
    assert "--device all goes with --sample" in capsys.readouterr().err
    argv = ["run", "--sample", "pm-default", "--kernel-times", "--device", "0,1", str(script)]
    assert cli.main(argv) == cli.EXIT_USAGE
    assert "--kernel-times records the kernels of one device" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        cli.main(["run", "--sample", "pm-default", "--device", "gpu1", str(script)])
    assert exc.value.code == cli.EXIT_USAGE and "'all'" in capsys.readouterr().err
    assert cli.main(["run", "--sample", "pm-default", "--device", "0,0", str(script)]) == cli.EXIT_USAGE
    assert "names device 0 more than once" in capsys.readouterr().err
    assert not fake.log


# ---------------------------------------------------------------------------------------------------------
# lifetimes: never a session left open


def test_start_failure_on_device_1_stops_device_0(fake, monkeypatch):
    monkeypatch.setattr(_device, "device_count", lambda: 3)
    fake.fail_start = {1}
    ran = []
    s = gs.sample(device="all")
    with pytest.raises(SamplerBusyError, match="device 1"):
        with s:
            ran.append(True)
    assert not ran
    assert fake.log == [("start", 0), ("start", 1), ("stop", 0)]  # device 2 never started
    assert still_open(s) == [] and not s.running
    with pytest.raises(RuntimeError, match="No samples yet"):
        s.dataset
    s.stop()  # nothing left to stop
    assert fake.log == [("start", 0), ("start", 1), ("stop", 0)]


def test_exception_in_the_block_stops_both(fake):
    s = gs.sample(device=[0, 1])
    with pytest.raises(KeyError, match="from the workload"):
        with s:
            raise KeyError("from the workload")
    assert fake.log == [("start", 0), ("start", 1), ("stop", 1), ("stop", 0)]
    assert still_open(s) == []
    assert s.dataset.sizes["device"] == 2  # what was sampled before the failure is there


def test_stop_failure_on_one_device_still_stops_the_other(fake):
    fake.fail_stop = {1}
    s = gs.sample(device=[0, 1]).start()
    with pytest.raises(GpuscopeError, match="device 1"):
        s.stop()
    assert fake.log == [("start", 0), ("start", 1), ("stop", 1), ("stop", 0)]
    assert still_open(s) == []
    s.stop()  # safe twice
    assert len(fake.log) == 4
    with pytest.raises(RuntimeError, match="already started"):
        s.start()


# ---------------------------------------------------------------------------------------------------------
# the device argument


@pytest.mark.parametrize("device, needle, wrong_kind", [
    ("gpu0", "'gpu0' is not a device choice", True),
    ("0,1", "'0,1' is not a device choice", True),
    (b"\x00", "is not a device choice", True),
    ({0: "a"}, "is not a device choice", True),
    ([0, 1.0], "1.0 (float) is not a device index", True),
    ([0, True], "True (bool) is not a device index", True),
    ([0, "1"], "'1' (str) is not a device index", True),
    ([], "names no device", False),
    ([0, 0], "names device 0 more than once", False),
    ((1, 0, 1), "names device 1 more than once", False),
    ([0, -1], "-1 is not a device index", False),
    ([0, 1024], "1024 is not a device index", False),
])
def test_bad_device_values_name_the_choices_before_any_cuda(monkeypatch, device, needle, wrong_kind):
    def no_cuda():
        raise AssertionError("a bad device argument must be refused before any CUDA call")

    monkeypatch.setattr(_device, "device_count", no_cuda)
    with pytest.raises(ValueError) as exc:
        gs.sample(device=device)
    assert needle in str(exc.value) and "an int, 'all', or a list of distinct device indices" in str(exc.value)
    # a value of the wrong kind is also the TypeError that gs.sample(device="cuda:0") always raised
    assert isinstance(exc.value, TypeError) == wrong_kind


def test_devices_this_process_does_not_see_start_nothing(fake):
    s = gs.sample(device=[0, 2])
    with pytest.raises(ValueError, match=r"device 2 does not exist; this process sees 2 GPU\(s\): 0, 1"):
        s.start()
    assert fake.log == [] and s.samplers == []


def test_other_arguments_are_checked_for_every_device_up_front(monkeypatch):
    def no_cuda():
        raise AssertionError("no CUDA call while the arguments are checked")

    monkeypatch.setattr(_device, "device_count", no_cuda)
    with pytest.raises(ValueError, match="evaluate_in"):
        gs.sample(device="all", evaluate_in="gpu")
    with pytest.raises(ValueError, match="kernels=True records the kernel executions of one device"):
        gs.sample(device=[0, 1], kernels=True)
    assert gs.sample(device="ALL").devices == []  # known on start


def test_an_integer_device_is_one_sampler_as_before():
    s = gs.sample(device=1)
    assert type(s) is _sampling.Sampler and s.device == 1
    assert type(gs.sample(device=np.int64(0))) is _sampling.Sampler
    with pytest.raises(TypeError, match="device must be an integer"):
        gs.sample(device=1.5)
    assert isinstance(gs.sample(device=(0,)), gs.MultiSampler)  # a list, even of one, gives the device dim


# ---------------------------------------------------------------------------------------------------------
# combining and selecting


def test_combine_and_select_refuse_what_they_cannot_hold(recording):
    one = on_device(recording, 0)
    with pytest.raises(ValueError, match=r"one Dataset per device; their device_index attrs are \[0, 0\]"):
        gs.combine_devices([one, one])
    with pytest.raises(ValueError, match="got no Datasets"):
        gs.combine_devices([])
    with pytest.raises(ValueError, match="is not one device's PM samples"):
        gs.combine_devices([one, gs.open_dataset(_demo.RECORDED_LAUNCHES)])
    both = gs.combine_devices([one, on_device(recording, 2)])
    assert both["device"].values.tolist() == [0, 2]
    with pytest.raises(ValueError, match=r"device=1 is not in this Dataset; it holds devices \[0, 2\]"):
        gs.select_device(both, 1)
    with pytest.raises(ValueError, match="takes the samples of several devices"):
        gs.select_device(one, 0)
    with pytest.raises(ValueError, match=r"gpuscope.report\(gpuscope.select_device\(ds, 0\)\)"):
        gs.report(both)
    with pytest.raises(gs.RankMergeError, match="merge one device per rank"):
        gs.merge_ranks([both])
    assert [d.attrs["device_index"] for d in _multi_sampling.each_device(both)] == [0, 2]


def test_span_tables_that_differ_are_joined(recording):
    one, other = on_device(recording, 0), on_device(recording, 1)
    late = other.attrs["span_end_ns"].copy()
    late[-1] += 1  # the last range still open when device 1 stopped, later than device 0
    other = other.assign_attrs(span_end_ns=late)
    extra = _dataset.table_attrs(_dataset.SPAN_TABLE, {  # a range device 0 stopped before
        k: other.attrs[k].tolist() + [v] for k, v in zip(_dataset.SPAN_VARS, ["late", 7, late[-1] + 5, late[-1] + 9])})
    other = other.assign_attrs(extra)
    both = gs.combine_devices([one, other])
    assert "per_device_attrs_dropped" not in both.attrs
    table = gs.spans(both)  # each span once, identified by path, thread and start; the latest end
    assert table["path"].tolist() == ["stream", "fma", "divergent", "late"]
    assert table["end_ns"].tolist() == late.tolist() + [late[-1] + 9]
    np.testing.assert_array_equal(both["span_index"].sel(device=0).values[:18019], one["span_index"].values)
    for d, own in [(0, one), (1, other)]:
        mine = gs.select_device(both, d)
        np.testing.assert_array_equal(mine["span_index"].values, own["span_index"].values)
        assert gs.spans(mine)["path"].tolist() == table["path"].tolist()


def test_execution_tables_follow_one_another_with_their_device(recording):
    t0 = int(recording.attrs["session_start_ns"])
    runs = {d: [("k%d" % d, t0 + 1000 * i + d, t0 + 1000 * i + 500, d, 1, 7, (1, 1, 1), (1, 1, 1), 16, i)
                for i in range(3 + d)] for d in (0, 1)}
    parts = [_results.with_executions(on_device(recording, d), {"records": runs[d], "dropped": d, "errors": []})
             for d in (0, 1)]
    both = gs.combine_devices(parts)
    assert both.attrs["exec_device"].tolist() == [0] * 3 + [1] * 4
    assert both.attrs["kernel_records_dropped"] == 1 and both["kernel_records_dropped"].values.tolist() == [0, 1]
    table = gs.kernel_executions(both)
    assert table.columns[-1] == "device" and table.groupby("device").size().to_dict() == {0: 3, 1: 4}
    for d in (0, 1):
        mine = gs.select_device(both, d)
        assert "exec_device" not in mine.attrs
        assert gs.kernel_executions(mine).equals(gs.kernel_executions(parts[d]))
