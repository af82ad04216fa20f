"""Source counters without a GPU: records -> Dataset on the recorded H100 cubins, the join with recorded PC samples,
and the session's order of CUPTI calls, errors and cleanup with the CUPTI and driver layers faked.

The SASS counts here are made up (CUPTI's SASS metrics need a GPU); the cubins, their CRCs, the PC offsets, the
SASS-to-source lookups (real libcupti) and the PC samples are the H100 recordings of ``tests/fixtures/pc/``.
"""

import os

import numpy as np
import pytest

import gpuscope as gs
from gpuscope._gpu import keep as _keep
from gpuscope._pc_sampling import counters as Cn
from gpuscope._pc_sampling import records as _pcrecords
from gpuscope._pc_sampling import sampler as _sampler
from gpuscope._pc_sampling import source as _source
from gpuscope._pc_sampling.sass_records import counters_dataset
from gpuscope.cupti import _api
from gpuscope.cupti import pc_sampling as C
from gpuscope.cupti import sass_metrics as S
from gpuscope.errors import CuptiError

HERE = os.path.join(os.path.dirname(__file__), "..", "fixtures", "pc")
STREAM_LINE = 30
IDS = {11: ("smsp__sass_inst_executed", "warp-level executions"),
       12: ("smsp__sass_thread_inst_executed", "thread-level executions"),
       13: ("smsp__sass_thread_inst_executed_pred_on", "predicated-on thread executions")}
PER_PC = {11: 100, 12: 3200, 13: 3000}  # made-up counts per instruction: 32 threads, 200 of them predicated off


def _fixture(name):
    return os.path.join(HERE, name)


@pytest.fixture(scope="module")
def recorded():
    data = np.load(_fixture("pc_records.npz"))
    pc_records = C.PCRecords.from_dict(data)
    registry = _source.CubinRegistry()
    for name in ("stream0.cubin", "fma0.cubin"):
        registry.add(_fixture(name))
    with open(_fixture("bench_pc_sampling.py.txt")) as fh:
        sources = {"bench_pc_sampling.py": fh.read()}
    pcs = sorted(set(zip(pc_records.cubin_crc.tolist(), pc_records.function.tolist(),
                         pc_records.pc_offset.tolist())))
    # one record per (PC, metric), as CUPTI's sample reads them; the stream PCs twice (two flushes)
    rows = [(crc, fn, off, mid, PER_PC[mid] // (2 if "stream" in fn else 1))
            for crc, fn, off in pcs for mid in IDS for _ in range(2 if "stream" in fn else 1)]
    crc, fn, off, mid, value = zip(*rows)
    sass = S.SassRecords(cubin_crc=np.asarray(crc, np.uint64), function_index=np.zeros(len(rows), np.uint32),
                         function=np.asarray(fn, dtype=str), pc_offset=np.asarray(off, np.uint64),
                         metric_id=np.asarray(mid, np.uint64), value=np.asarray(value, np.uint64))
    launches = {fn: 20 for fn in set(pc_records.function.tolist())}
    counters = counters_dataset(sass, IDS, _source.SourceMap(registry, sources=sources), launches=launches,
                                chip="GH100", attrs={"compute_capability": "9.0"})
    pc = _pcrecords.records_dataset(pc_records, data["reason_indices"], [str(n) for n in data["reason_names"]],
                                    _source.SourceMap(registry, sources=sources), chip="GH100")
    return pcs, counters, pc


def test_one_row_per_instruction_with_summed_counts(recorded):
    pcs, ds, _ = recorded
    assert ds.sizes["pc"] == len(pcs) == 228
    assert ds.attrs["metrics"] == [name for name, _ in IDS.values()]
    for mid, (name, description) in IDS.items():
        assert ds[name].dtype == np.int64 and (ds[name] == PER_PC[mid]).all(), name  # two halves of stream summed
        assert ds[name].attrs == {"units": "instruction", "description": description, "metric_type": "counter"}
    assert ds.attrs["kind"] == "source_counters" and ds.attrs["values_of_other_metrics"] == 0


def test_pcs_map_to_the_lines_pc_sampling_maps_them_to(recorded):
    _, ds, pc = recorded
    stream = ds.isel(pc=np.flatnonzero(ds.function.values == "stream"))
    at_160 = stream.isel(pc=int(np.flatnonzero(stream.pc_offset.values == 160)[0]))
    assert (int(at_160.line), os.path.basename(at_160.file.item())) == (STREAM_LINE, "bench_pc_sampling.py")
    assert at_160.line_text.item().startswith("z[i] = a * x[i] + y[i]")
    both = {(f, o): n for f, o, n in zip(pc.function.values, pc.pc_offset.values, pc.line.values)}
    assert all(both[(f, o)] == n for f, o, n in zip(ds.function.values, ds.pc_offset.values, ds.line.values))
    assert ds.kernel.values.tolist() == ["fma", "stream"] and ds.launches.values.tolist() == [20, 20]
    assert ds.attrs["functions_without_lineinfo"] == "" and ds.attrs["functions_without_cubin"] == ""


def test_source_table_joins_counts_and_stalls_per_line(recorded):
    _, counters, pc = recorded
    tables = gs.source(counters, pc)
    assert sorted(tables) == ["fma", "stream"]
    stream = tables["stream"]
    row = stream.sel(source_line=next(k for k in stream.source_line.values if k.endswith(f":{STREAM_LINE}")))
    n = int(((counters.function == "stream") & (counters.line == STREAM_LINE)).sum())
    assert int(row.instructions) == n > 0
    assert int(row.smsp__sass_inst_executed) == 100 * n
    assert float(row.threads_per_instruction) == 32.0
    assert int(row.predicated_off) == 200 * n
    assert int(row.stall_samples.sel(stall_reason="long_scoreboard")) == 336656  # the PC fixture's own number
    assert int(row.samples) == int(row.stall_samples.sum())
    assert row.line_text.item().startswith("z[i] = a * x[i] + y[i]")
    assert stream.attrs["launches"] == 20 and stream.attrs["has_pc_samples"] == 1
    assert list(stream.line.values) == sorted(stream.line.values)  # one file: ordered by line
    # every count and every sample of the kernel is on some line, once
    assert int(stream.smsp__sass_inst_executed.sum()) == int(counters.smsp__sass_inst_executed.where(
        counters.function == "stream", 0).sum())
    assert int(stream.samples.sum()) == int(pc.kernel_samples.sel(kernel="stream").sum())


def test_source_with_one_side_and_bad_arguments(recorded):
    _, counters, pc = recorded
    only = gs.source(counters, kernel="fma")
    assert "stall_samples" not in only and only.attrs["has_pc_samples"] == 0
    assert int(only.smsp__sass_thread_inst_executed.sum()) == 3200 * int((counters.function == "fma").sum())
    stalls = gs.source(pc=pc, kernel="fma")
    assert "smsp__sass_inst_executed" not in stalls and int(stalls.samples.sum()) > 0
    with pytest.raises(ValueError, match="or both"):
        gs.source()
    with pytest.raises(ValueError, match="no_such"):
        gs.source(counters, pc, kernel="no_such")


def test_a_line_only_pc_sampling_saw_is_zero_in_the_counts(recorded):
    _, counters, pc = recorded
    fewer = counters.isel(pc=np.flatnonzero(counters.line.values != STREAM_LINE))
    table = gs.source(fewer, pc, kernel="stream")
    row = table.isel(source_line=int(np.flatnonzero(table.line.values == STREAM_LINE)[0]))
    assert int(row.smsp__sass_inst_executed) == 0 and int(row.instructions) == 0 and int(row.samples) > 0


# ---------------------------------------------------------------------------------------------------------------
# The session, with the driver and CUPTI faked


class _Ctx:
    handle = 0xC0
    closed = False

    def __init__(self, index):
        self.index = index

    def close(self):
        type(self).closed = True


class _Recorder:
    last = None

    def __init__(self, on_enter, on_graph=None):
        self.on_enter, self.on_graph, self.closed = on_enter, on_graph, False
        type(self).last = self

    def close(self):
        self.closed = True


class _Launch:
    def __init__(self, symbol, context=0xC0):
        self.symbol, self.context = symbol, context


@pytest.fixture
def fake_gpu(monkeypatch):
    """Every driver and CUPTI call the session makes, recorded in ``calls``; ``fail`` names one to fail."""
    from gpuscope._gpu import device as _device
    from gpuscope.cupti import callbacks, profiler
    from gpuscope.cupti._types import ProfilerApi, SupportLevel

    calls, state = [], {"fail": None, "supported": SupportLevel.SUPPORTED, "flushed": None}

    def rec(name, result=None):
        def fn(*args, **kwargs):
            calls.append(name)
            if state["fail"] == name:
                raise CuptiError(7, name, "CUPTI_ERROR_INVALID_OPERATION")
            return result(*args, **kwargs) if callable(result) else result
        return fn

    info = type("Info", (), {"name": "NVIDIA H100 80GB HBM3", "compute_capability_str": "9.0", "index": 0,
                             "sm_count": 132, "sm_clock_khz": 1980000, "memory_clock_khz": 2619000,
                             "memory_bytes": 85 << 30})()
    monkeypatch.setattr(_device, "device_info", lambda i: info)
    monkeypatch.setattr(_device, "PrimaryContext", _Ctx)
    monkeypatch.setattr(_sampler, "_synchronize", rec("synchronize"))
    monkeypatch.setattr(_keep, "release", rec("release", 0))
    monkeypatch.setattr(_keep, "import_xarray_soon", lambda: None)
    monkeypatch.setattr(profiler, "initialize", rec("initialize"))
    monkeypatch.setattr(profiler, "deinitialize", rec("deinitialize"))
    monkeypatch.setattr(profiler, "chip_name", rec("chip_name", "GH100"))
    monkeypatch.setattr(profiler, "device_support", rec("device_support", lambda dev, api: profiler.DeviceSupport(
        ProfilerApi(api), state["supported"], {"architecture": state["supported"]})))
    monkeypatch.setattr(callbacks, "LaunchRecorder", _Recorder)
    by_name = {name: mid for mid, (name, _) in IDS.items()}

    def properties(chip, name):
        if name not in by_name:
            raise CuptiError(1, "cuptiSassMetricsGetProperties", "CUPTI_ERROR_INVALID_PARAMETER")
        return S.MetricDetails(by_name[name], name, IDS[by_name[name]][1])

    monkeypatch.setattr(S, "properties", rec("properties", properties))
    monkeypatch.setattr(S, "metrics", lambda chip: [S.MetricDetails(m, n, d) for m, (n, d) in IDS.items()])
    monkeypatch.setattr(S, "available", lambda: True)
    for name in ("set_config", "unset_config", "enable"):
        monkeypatch.setattr(S, name, rec(name))
    monkeypatch.setattr(S, "disable", rec("disable", 0))
    monkeypatch.setattr(S, "data_properties", rec("data_properties", (2, 1)))

    def flush(ctx, num, instances, slots_per_record=None):
        state["flushed"] = (ctx, num, instances, slots_per_record)
        return S.SassRecords(np.array([5, 5], np.uint64), np.zeros(2, np.uint32), np.array(["_Z1kPf", "_Z1kPf"]),
                             np.array([16, 16], np.uint64), np.array([11, 12], np.uint64),
                             np.array([8, 256], np.uint64))

    monkeypatch.setattr(S, "flush", rec("flush", flush))
    monkeypatch.setattr(_keep, "detach_cupti", rec("detach_cupti", "detached"))
    monkeypatch.setattr(_api, "reattach", rec("reattach"))
    monkeypatch.setattr(Cn, "_configured", False)  # each test its own process, as far as CUPTI's one config goes
    _Ctx.closed = False
    yield calls, state
    assert not Cn._active, "a source_counters block stayed registered"


def test_a_block_flushes_inside_the_enabled_range_then_disables_and_unconfigures(fake_gpu):
    calls, state = fake_gpu
    with gs.source_counters(metrics=["smsp__sass_inst_executed", "smsp__sass_thread_inst_executed"]) as sc:
        _Recorder.last.on_enter(_Launch("_Z1kPf"))
        _Recorder.last.on_enter(_Launch("_Z1kPf"))
        _Recorder.last.on_enter(_Launch("_Z5otherv", context=0xD0))  # another context: not this block's
    assert calls == ["release", "synchronize", "initialize", "chip_name", "device_support", "properties",
                     "properties", "set_config", "enable", "synchronize", "data_properties", "flush", "disable",
                     "unset_config", "deinitialize", "detach_cupti", "reattach"]
    assert sc.dataset.attrs["cupti_detach"] == "detached"
    assert state["flushed"] == (0xC0, 2, 1, 2)  # a value slot per metric and instance
    ds = sc.dataset
    assert ds.smsp__sass_inst_executed.values.tolist() == [8]
    assert ds.smsp__sass_thread_inst_executed.values.tolist() == [256]
    assert ds.launches.values.tolist() == [2] and ds.attrs["launches_counted"] == 2
    assert _Recorder.last.closed and _Ctx.closed


def test_an_exception_in_the_block_leaves_nothing_enabled(fake_gpu):
    calls, _ = fake_gpu
    with pytest.raises(KeyError), gs.source_counters() as sc:
        raise KeyError("inside")
    assert "flush" not in calls
    assert calls[-5:] == ["disable", "unset_config", "deinitialize", "detach_cupti", "reattach"]
    assert sc.dataset is None and _Ctx.closed


@pytest.mark.parametrize("step,undone", [("set_config", ["deinitialize"]),
                                         ("enable", ["unset_config", "deinitialize", "detach_cupti", "reattach"])])
def test_a_failed_start_undoes_what_it_did(fake_gpu, step, undone):
    calls, state = fake_gpu
    state["fail"] = step
    with pytest.raises(CuptiError, match=step), gs.source_counters():
        pytest.fail("the block must not run")
    assert calls[calls.index(step) + 1:] == undone and _Ctx.closed


def test_a_failed_flush_raises_and_still_tears_down(fake_gpu):
    calls, state = fake_gpu
    state["fail"] = "flush"
    with pytest.raises(CuptiError, match="flush"), gs.source_counters():
        pass
    assert calls[-5:] == ["disable", "unset_config", "deinitialize", "detach_cupti", "reattach"]


def test_unsupported_device_and_unknown_metric_say_why(fake_gpu):
    calls, state = fake_gpu
    with pytest.raises(gs.UnknownMetricError, match="did you mean smsp__sass_inst_executed"):
        gs.source_counters(metrics=["smsp__sass_inst_execute"]).start()
    assert "set_config" not in calls and calls[-1] == "deinitialize"
    from gpuscope.cupti._types import SupportLevel

    state["supported"] = SupportLevel.UNSUPPORTED
    with pytest.raises(gs.UnsupportedChipError, match=r"H100 80GB HBM3, GH100.*architecture: UNSUPPORTED"):
        gs.source_counters().start()


def test_one_block_per_device_and_never_beside_pc_sampling_or_a_range_session(fake_gpu, monkeypatch):
    with gs.source_counters(), pytest.raises(gs.SamplerBusyError, match="already open"), gs.source_counters():
        pass
    monkeypatch.setitem(_sampler._active, 0, object())
    with pytest.raises(gs.SamplerBusyError, match="pc_sample block is open"):
        gs.source_counters().start()
    monkeypatch.delitem(_sampler._active, 0)
    from gpuscope._range_profiling import session

    monkeypatch.setitem(session._active, 0, "Profiler(...)")
    with pytest.raises(gs.SessionConflictError, match="Profiler session is open"):
        gs.source_counters().start()


def test_arguments_are_checked_before_any_cuda():
    with pytest.raises(ValueError, match="at least one"):
        gs.source_counters(metrics=())
    with pytest.raises(TypeError, match="callable"):
        gs.profile_source("not callable")
    with pytest.raises(ValueError, match="power of two"):
        gs.profile_source(lambda: None, period=1000)


def test_without_a_gpu_the_block_says_so_and_registers_nothing():
    from gpuscope._gpu import device as _device

    try:
        _device.device_count()
    except gs.NoGpuError:
        pass
    else:
        pytest.skip("a GPU is present")
    with pytest.raises(gs.NoGpuError), gs.source_counters():
        pass
    assert not Cn._active


def test_a_second_block_in_the_process_is_refused_with_the_reason(fake_gpu):
    """CUPTI 13.0 configures SASS metrics once per process (a second SetConfig: CUPTI_ERROR_OUT_OF_MEMORY on the
    H100, whatever was released between): the second block says so before any CUPTI call."""
    calls, _ = fake_gpu
    with gs.source_counters():
        pass
    before = len(calls)
    with pytest.raises(gs.GpuscopeError, match="once per process"):
        gs.source_counters().start()
    assert len(calls) == before and not Cn._active


def test_a_refused_detach_is_said_in_the_notes(fake_gpu, monkeypatch):
    calls, _ = fake_gpu
    monkeypatch.setattr(_keep, "detach_cupti", lambda: "gpuscope is using CUPTI: 1 user(s) of the CUPTI profiler")
    with gs.source_counters() as sc:
        pass
    assert "reattach" not in calls
    assert "CUPTI was not detached after the block" in sc.dataset.attrs["notes"]
