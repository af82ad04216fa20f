"""gs.to_perfetto: one Chrome/Perfetto trace of a run, from the H100 recordings (range, PM sampling, phases)."""

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

import gpuscope as gs
from gpuscope._results import build as _results

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "gpuscope" / "data"
RANGE = ROOT / "tests" / "fixtures" / "range"
PHASES = ROOT / "tests" / "fixtures" / "phases"
TOPDOWN_L1 = ["topdown.retire", "topdown.divergence", "topdown.frontend", "topdown.backend"]


@pytest.fixture(scope="module")
def launches():
    return gs.open_dataset(DATA / "demo_launches.nc")


@pytest.fixture(scope="module")
def series():
    return gs.open_dataset(DATA / "demo_timeseries.nc")


@pytest.fixture(scope="module")
def phased(series):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gs.GpuscopeWarning)
        return gs.phases(series)


def _kernel_mode_fixture():
    """The auto-range recording (three launches, 8 passes) as a range Dataset, evaluated by CUPTI's host API."""
    from gpuscope.cupti import host, range_profiler
    from gpuscope.cupti._types import ProfilerType

    d = np.load(RANGE / "auto_3kernels_gh100.npz")
    image, metrics, meta = d["counter_data"], [str(m) for m in d["metrics"]], json.loads(str(d["meta"]))
    with host.ProfilerHost(str(d["chip"]), ProfilerType.RANGE_PROFILER) as h:
        values = [h.evaluate(image, i, metrics) for i in range(range_profiler.num_ranges(image))]
    kernels = ["stream", "fma", "inc"]
    records = [{"name": k, "kernel": k, "launch": i, "grid": l["grid"], "block": l["block"], "start_ns": l["enter_ns"],
                "end_ns": l["exit_ns"], "values": list(v)}
               for i, (k, l, v) in enumerate(zip(kernels, meta["launches"], values))]
    props = {m: {"units": "", "description": m, "metric_type": "counter", "hw_unit": ""} for m in metrics}
    return _results.range_dataset(records, metrics, props, chip="GH100", attrs={"mode": "kernel", "passes": 8})


def _by(trace, ph, tid=None):
    return [e for e in trace["traceEvents"] if e["ph"] == ph and (tid is None or e["tid"] == tid)]


def _tid(trace, name):
    (tid,) = [e["tid"] for e in trace["traceEvents"] if e["name"] == "thread_name" and e["args"]["name"] == name]
    return tid


def _check_perfetto_fields(trace, counters=True):
    """What Perfetto's JSON importer needs of every event (of the counters too unless told), and that the trace
    is plain JSON (no NaN, no numpy types)."""
    events = [e for e in trace["traceEvents"] if counters or e["ph"] != "C"]
    for e in events:
        assert {"ph", "pid", "tid", "name"} <= set(e), e
        assert isinstance(e["name"], str) and type(e["pid"]) is int and type(e["tid"]) is int
        if e["ph"] != "M":
            assert isinstance(e["ts"], float) and e["ts"] >= 0, e
        if e["ph"] == "X":
            assert isinstance(e["dur"], float) and e["dur"] > 0, e
        if e["ph"] == "C":
            assert set(e["args"]) == {"value"}
    assert json.loads(json.dumps(events, allow_nan=False)) == events


def test_run_trace_from_demo_recordings(tmp_path, launches, series, phased):
    path = tmp_path / "run.json"
    trace = gs.to_perfetto(path, launches, series, phased)
    assert json.loads(path.read_text()) == trace
    _check_perfetto_fields(trace)
    names = {e["args"]["name"] for e in _by(trace, "M") if e["name"] == "thread_name"}
    assert names == {"kernels", "ranges (thread 139833069375808)", "phases"}

    kernels = _by(trace, "X", _tid(trace, "kernels"))
    assert [e["name"] for e in kernels] == ["stream", "fma", "divergent"] * 5
    assert [e["args"]["launch"] for e in kernels] == list(range(15))
    # the launches come first on the CUPTI clock (the demo profiles them before sampling): they start at 0
    assert kernels[0]["ts"] == 0.0 and trace["otherData"]["origin_ns"] == int(launches.start_ns.min())
    assert kernels[1]["ts"] == pytest.approx((launches.start_ns[1] - launches.start_ns[0]).item() / 1e3)
    assert all(a["ts"] + a["dur"] <= b["ts"] for a, b in zip(kernels, kernels[1:]))  # one after the other
    fma = kernels[1]["args"]
    assert fma["topdown.retire"] == pytest.approx(74.8, abs=0.05)  # as docs/topdown.md reports for fma
    assert sum(fma[k] for k in TOPDOWN_L1) == pytest.approx(100.0, abs=1.25)  # level 1 sums to 100% of IPC_MAX
    assert fma["gpu__time_duration.sum"] == launches["gpu__time_duration.sum"].values[1]
    # a launch slice lasts the kernel's GPU time, not the 37.6 ms of its kernel-replay passes
    stream = kernels[0]
    assert stream["dur"] == pytest.approx(79.68) and stream["args"]["duration_from"].startswith("gpu__time_duration")
    assert stream["args"]["profiled_span_us"] == pytest.approx(37632.967)
    assert (fma["grid_x"], fma["block_x"]) == (int(launches.grid_x[1]), int(launches.block_x[1]))

    counters = _by(trace, "C")
    assert len(counters) == 8 * series.sizes["time"]
    assert len({e["name"] for e in counters}) == 8
    dram = [e for e in counters if e["name"].startswith("dram__read_throughput")]
    assert [e["args"]["value"] for e in dram] == pytest.approx(
        series["dram__read_throughput.avg.pct_of_peak_sustained_elapsed"].values.tolist())
    assert [e["ts"] for e in dram] == sorted(e["ts"] for e in dram)

    user = _by(trace, "X", _tid(trace, "ranges (thread 139833069375808)"))
    assert [e["name"] for e in user] == ["stream", "fma", "divergent"]
    origin = trace["otherData"]["origin_ns"]
    assert user[0]["ts"] == pytest.approx((int(series.attrs["span_start_ns"][0]) - origin) / 1e3)
    assert user[0]["ts"] > kernels[-1]["ts"]  # sampling ran after range profiling

    segments = _by(trace, "X", _tid(trace, "phases"))
    assert len(segments) == phased.sizes["segment"]
    assert [e["name"] for e in segments] == [f"phase {p}" for p in phased.segment_phase.values]
    assert [e["args"]["phase"] for e in segments] == phased.segment_phase.values.tolist()
    # segments tile the series: each starts where the one before ended (µs, to rounding)
    assert all(b["ts"] == pytest.approx(a["ts"] + a["dur"], abs=0.2) for a, b in zip(segments, segments[1:]))
    stream = next(e for e in segments if e["ts"] <= user[0]["ts"] + 1e4 < e["ts"] + e["dur"])
    assert stream["args"]["dram__read_throughput.avg.pct_of_peak_sustained_elapsed"] > 30  # streaming reads DRAM


def test_phases_alone_bring_their_counters_and_no_duplicates(series, phased):
    alone = gs.to_perfetto(None, phased)
    assert len(_by(alone, "C")) == 8 * series.sizes["time"]
    assert len(_by(alone, "X")) == phased.sizes["segment"] + 3  # phases and the three user ranges
    both = gs.to_perfetto(None, series, phased)
    assert len(_by(both, "C")) == 8 * series.sizes["time"]
    assert len(_by(both, "X")) == phased.sizes["segment"] + 3
    assert alone["otherData"]["gpuscope"] == "phases" and both["otherData"]["gpuscope"] == ["pm_sampling", "phases"]


@pytest.mark.parametrize("name", ["idle_gaps", "cupy_gemm", "launch_bound", "periodic_sync", "slow_drift", "lengths"])
def test_phase_recordings(name):
    ts = gs.open_dataset(PHASES / f"{name}.nc")
    ph = gs.phases(ts, topdown=False)
    trace = gs.to_perfetto(None, ph)
    _check_perfetto_fields(trace, counters=False)
    assert len(_by(trace, "C")) == 8 * ts.sizes["time"]
    user = _by(trace, "X", 1)
    spans = gs.spans(ts)
    assert [e["name"] for e in user] == spans["path"].tolist()  # <index>_<kind>, in order
    segments = _by(trace, "X", _tid(trace, "phases"))
    assert [e["args"]["phase"] for e in segments] == ph.segment_phase.values.tolist()
    # ts 0 is the PM session's first (clipped) sample, and the last segment ends with the last sample
    last = segments[-1]
    assert last["ts"] + last["dur"] == pytest.approx((ts.end_ns.values[-1] - trace["otherData"]["origin_ns"]) / 1e3)


def test_kernel_mode_fixture_without_topdown():
    ds = _kernel_mode_fixture()
    trace = gs.to_perfetto(None, ds)
    _check_perfetto_fields(trace)
    kernels = _by(trace, "X")
    assert [e["name"] for e in kernels] == ["stream", "fma", "inc"]
    assert [e["args"]["sm__ctas_launched.sum"] for e in kernels] == [65536.0, 4096.0, 4096.0]
    assert not any(k.startswith("topdown.") for k in kernels[0]["args"])  # the set has no Top-Down metrics
    assert kernels[2]["ts"] == pytest.approx((ds.start_ns[2] - ds.start_ns[0]).item() / 1e3)
    span = (ds.end_ns[0] - ds.start_ns[0]).item() / 1e3  # 67 ms: the launch and its 8 replay passes
    assert kernels[0]["dur"] == pytest.approx(ds["gpu__time_duration.sum"].values[0] / 1e3)  # 80 us on the GPU
    assert kernels[0]["args"]["profiled_span_us"] == pytest.approx(span) and span > 500 * kernels[0]["dur"]
    # without the GPU time metric the slice is the span, and says that it holds the replay passes
    bare = gs.to_perfetto(None, ds.drop_vars("gpu__time_duration.sum").assign_attrs(
        metrics=[m for m in ds.attrs["metrics"] if m != "gpu__time_duration.sum"]))
    first = _by(bare, "X")[0]
    assert first["dur"] == pytest.approx(span) and "replay passes included" in first["args"]["duration_from"]


def test_user_ranges_nest_on_a_ranges_track():
    # the user-range recording has one "step" (= stream + fma); its children here are made up around it
    metrics = ["sm__ctas_launched.sum"]
    props = {m: {"units": "block", "description": m, "metric_type": "counter", "hw_unit": "sm"} for m in metrics}
    records = [{"name": "step", "start_ns": 1000, "end_ns": 9000, "values": [69632.0]},
               {"name": "step/fwd", "start_ns": 2000, "end_ns": 5000, "values": [65536.0]},
               {"name": "step/upd", "start_ns": 5000, "end_ns": 8000, "values": [4096.0]},
               {"name": "lost", "values": [1.0]}]  # no timestamps: left out
    ds = _results.range_dataset(records, metrics, props, chip="GH100", attrs={"mode": "user"})
    trace = gs.to_perfetto(None, ds)
    assert {e["args"]["name"] for e in _by(trace, "M") if e["name"] == "thread_name"} == {"ranges"}
    assert [(e["name"], e["ts"], e["dur"], e["args"]["path"]) for e in _by(trace, "X")] == [
        ("step", 0.0, 8.0, "step"), ("fwd", 1.0, 3.0, "step/fwd"), ("upd", 4.0, 3.0, "step/upd")]


def test_chrome_trace_is_the_pm_part(series):
    old = gs.to_chrome_trace(series)
    new = gs.to_perfetto(None, series)
    assert old["traceEvents"] == new["traceEvents"]  # the session start is the earliest event of a PM series


def test_two_range_sets_get_their_own_tracks(launches):
    trace = gs.to_perfetto(None, launches, launches.isel(range=slice(0, 3)))
    names = sorted(e["args"]["name"] for e in _by(trace, "M") if e["name"] == "thread_name")
    assert names == ["kernels", "kernels 2"]
    assert len(_by(trace, "X", _tid(trace, "kernels 2"))) == 3


def test_errors(tmp_path, series):
    with pytest.raises(ValueError, match="at least one Dataset"):
        gs.to_perfetto(tmp_path / "t.json")
    with pytest.raises(ValueError, match="open_dataset"):
        gs.to_perfetto(None, str(DATA / "demo_timeseries.nc"))
    with pytest.raises(TypeError, match="path"):
        gs.to_perfetto(7, series)
    with pytest.raises(gs.NotGpuscopeDataError, match=r"dataset 2 .*\(kind=None\)"):
        gs.to_perfetto(None, series, series.drop_attrs())
    import xarray as xr

    bare = xr.Dataset({"a": ("time", np.r_[np.zeros(50), np.ones(50)])}, coords={"time": np.arange(100)})
    with pytest.raises(ValueError, match="no CUPTI timestamps"):
        gs.to_perfetto(None, gs.phases(bare, topdown=False))
    assert not (tmp_path / "t.json").exists()


def _pc_recording():
    """The H100 PC-sampling recording (stream and fma of benchmarks/bench_pc_sampling.py) as a Dataset."""
    from gpuscope._pc_sampling import records as P
    from gpuscope._pc_sampling import source as _source
    from gpuscope.cupti import pc_sampling as C

    here = ROOT / "tests" / "fixtures" / "pc"
    data = np.load(here / "pc_records.npz")
    registry = _source.CubinRegistry()
    for name in ("stream0.cubin", "fma0.cubin"):
        registry.add(str(here / name))
    smap = _source.SourceMap(registry, sources={"bench_pc_sampling.py": (here / "bench_pc_sampling.py.txt").read_text()})
    return P.records_dataset(C.PCRecords.from_dict(data), data["reason_indices"],
                             [str(n) for n in data["reason_names"]], smap, chip="GH100",
                             attrs={"compute_capability": "9.0"})


def test_gpu_kernel_executions_get_a_track_per_stream_and_pc_hot_lines(series):
    t0 = int(series.attrs["session_start_ns"])
    records = [(name, t0 + 1000 * i, t0 + 1000 * i + 800, 0, 1, 7 + (i % 2), (1, 1, 1), (1, 1, 1), 16, i,
                *((5, 60 + i) if name == "other" else (0, 0)))  # "other": a CUDA graph's kernel nodes
               for i, name in enumerate(["_ZN10benchmarks17bench_pc_sampling6streamB2v1E", "other"] * 3)]
    ts = _results.with_executions(series, {"records": records, "dropped": 0, "errors": []})
    pc = _pc_recording()
    trace = gs.to_perfetto(None, ts, pc)
    events = trace["traceEvents"]
    tracks = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    gpu = [e for e in events if e["ph"] == "X" and tracks[e["tid"]].startswith("GPU kernels")]
    assert sorted({tracks[e["tid"]] for e in gpu}) == ["GPU kernels (stream 7)", "GPU kernels (stream 8)"]
    assert [e["name"] for e in gpu] == ["stream", "other"] * 3  # one name per kernel: the executions' and PC's
    assert [e["dur"] for e in gpu] == [0.8] * 6
    assert [(e["args"].get("graph_id"), e["args"].get("graph_node_id")) for e in gpu] == [
        (None, None), (5, 61), (None, None), (5, 63), (None, None), (5, 65)]  # graph ids on graph nodes only
    stream = [e for e in gpu if e["name"].endswith("stream")]
    hot = stream[0]["args"]["pc.hot_lines"]
    assert len(hot) == 3 and hot[0].startswith("bench_pc_sampling.py:30 ") and "long_scoreboard" in hot[0]
    assert "z[i] = a * x[i] + y[i]" in hot[0]
    assert all("pc.hot_lines" not in e["args"] for e in gpu if e["name"] == "other")
    assert set(trace["otherData"]["pc_hot_spots"]) == {"stream", "fma"}
    assert trace["otherData"]["pc_hot_spots_unmatched"] == ["fma"]
    share = float(hot[0].split()[1].rstrip("%"))
    assert 50 < share <= 100
    with pytest.raises(ValueError, match="no times of their own"):
        gs.to_perfetto(None, pc)
