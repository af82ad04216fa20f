"""The kernels of CUDA graph launches in kernel and auto modes (no GPU: CUPTI's callback and activity calls faked).

CUPTI's kernel replay does not see a graph's kernel nodes; the session counts graph launches, keeps their correlation
IDs, opens kernel activity records at the first one and keeps only the records of graph launches, then names the
kernels in its attrs, its warning and its report. Where the records cannot be read, the count stands and the
warning says why."""

import ctypes
import warnings

import pytest

import gpuscope as gs
from gpuscope._range_profiling import session as _session
from gpuscope._range_profiling.graphs import GraphKernels
from gpuscope._results import build as _results
from gpuscope._schema import names as _names
from gpuscope.cupti import activity, callbacks

from .test_activity_records import FakeActivity, _record
from .test_subscriber import fake  # noqa: F401 (the fixture: CUPTI's callback calls faked)

GEMM, RELU, STREAM = "_Z4gemmPfS_S_", "_Z4reluPf", "_Z6streamPf"


@pytest.fixture(autouse=True)
def fresh_names(monkeypatch):
    monkeypatch.setattr(_names, "_process_names", _names.KernelNames())


@pytest.fixture
def cupti_activity(monkeypatch):
    """CUPTI's activity calls: what a flush hands back is set by the test (``cupti_activity.records``)."""
    fake_activity = FakeActivity([])
    monkeypatch.setattr(activity, "_f", fake_activity)
    monkeypatch.setattr(activity, "_registered", [])
    monkeypatch.setattr(activity, "_sinks", ())
    monkeypatch.delenv("CUDA_INJECTION64_PATH", raising=False)
    return fake_activity


class Names:
    """Kernel names at stable addresses, as CUPTI's records point to them."""

    def __init__(self):
        self._buffers = {}

    def __call__(self, symbol):
        buf = self._buffers.setdefault(symbol, ctypes.create_string_buffer(symbol.encode()))
        return ctypes.addressof(buf)


def _graph_launch(recorder, correlation):
    data = callbacks.CUpti_CallbackData(callbackSite=callbacks.CUPTI_API_ENTER, correlationId=correlation)
    recorder._on_callback(callbacks.CBID_cuGraphLaunch, ctypes.addressof(data))


class Context:
    def __init__(self):
        self.synchronized = 0

    def synchronize(self):
        self.synchronized += 1


def _session_hearing_graphs(mode=_session.Mode.KERNEL, records=True):
    """A kernel- or auto-mode Profiler with what start() sets up for graph launches: the recorder and GraphKernels."""
    p = _session.Profiler.__new__(_session.Profiler)
    p.mode = p.mode_used = mode
    p._notes, p._context = {}, Context()
    p._graphs = GraphKernels(records=records)
    p._recorder = callbacks.LaunchRecorder(lambda launch: None, None, p._on_graph)
    return p


def _close(p):
    p._recorder.close()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        p._note_graph_launches(p._recorder.graph_launches)
    return [str(w.message) for w in caught]


def test_graph_kernels_are_named_and_counted_and_replayed_kernels_left_out(fake, cupti_activity):  # noqa: F811
    p = _session_hearing_graphs()
    assert cupti_activity.enabled == []  # nothing opened before a graph launch
    names, records, t = Names(), [], 1000
    for correlation in (11, 12, 13):
        _graph_launch(p._recorder, correlation)
        for symbol, ns in ((GEMM, 300), (RELU, 50)):
            records.append(_record(kind=10, start=t, end=t + ns, correlationId=correlation, name=names(symbol)))
            t += 1000
        # a launch that kernel replay profiled (its own correlation ID), replayed once per pass: not the graph's
        records += [_record(kind=10, start=t + k, end=t + k + 5, correlationId=100 + correlation,
                            name=names(STREAM)) for k in range(3)]
    assert cupti_activity.enabled == [activity.CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL]  # opened at the first
    cupti_activity.records = records
    said = _close(p)
    assert cupti_activity.enabled == [] and p._context.synchronized == 1  # synchronised, then flushed
    assert p._notes["graph_launches"] == 3
    assert p._notes["graph_kernels"] == {"gemm": 3, "relu": 3}  # in the order they ran; stream is not there
    assert p._notes["graph_kernels_gpu_ns"] == {"gemm": 900, "relu": 150}
    assert "graph_kernels_unavailable" not in p._notes and "graph_launches_unrecorded" not in p._notes
    assert len(said) == 1
    assert said[0].startswith("3 CUDA graph launches ran 6 kernels that this kernel-mode session could not profile")
    assert "gemm x3, relu x3" in said[0] and "gpuscope.range" in said[0] and "gpuscope.pc_sample" in said[0]


def test_the_names_are_those_of_every_dataset_of_the_process(fake, cupti_activity):  # noqa: F811
    """A kernel already named elsewhere in the process (range rows, PC samples) keeps its name here."""
    _names.kernel_names().name("other.gemm")  # another kernel took the short name first
    p = _session_hearing_graphs()
    _graph_launch(p._recorder, 5)
    names = Names()  # the name must outlive the flush, as CUPTI's does
    cupti_activity.records = [_record(kind=10, start=1, end=2, correlationId=5, name=names(GEMM))]
    _close(p)
    assert p._notes["graph_kernels"] == {_names.kernel_name(GEMM): 1} and _names.kernel_name(GEMM) != "gemm"


def test_launches_without_records_are_counted_and_said(fake, cupti_activity):  # noqa: F811
    p = _session_hearing_graphs(_session.Mode.AUTO)
    names = Names()
    for correlation in (1, 2):
        _graph_launch(p._recorder, correlation)
    cupti_activity.records = [_record(kind=10, start=5, end=9, correlationId=2, name=names(RELU))]
    cupti_activity.dropped = 4
    said = _close(p)
    assert p._notes["graph_kernels"] == {"relu": 1} and p._notes["graph_launches_unrecorded"] == 1
    assert "this auto-mode session" in said[0]
    assert "The kernels of 1 of them are not counted: CUPTI dropped 4 kernel activity record(s)" in said[0]


def test_a_session_without_graph_launches_opens_no_records(fake, cupti_activity):  # noqa: F811
    p = _session_hearing_graphs()
    assert _close(p) == [] and cupti_activity.enabled == [] and cupti_activity.registered == 0
    assert "graph_launches" not in p._notes and "graph_kernels" not in p._notes


@pytest.mark.parametrize("how, why", [
    ("refused", "CUPTI's kernel activity records could not be opened (RuntimeError: CUPTI_ERROR_NOT_COMPATIBLE)"),
    ("injected", "another CUPTI tool is injected (CUDA_INJECTION64_PATH)"),
    ("iteration", "iteration mode does not read them"),
])
def test_without_records_the_count_stands_and_the_warning_says_why(fake, cupti_activity, monkeypatch, how,  # noqa: F811
                                                                   why):
    if how == "refused":
        def refuse(kind):
            raise RuntimeError("CUPTI_ERROR_NOT_COMPATIBLE")

        cupti_activity.cuptiActivityEnable = refuse
    elif how == "injected":
        monkeypatch.setenv("CUDA_INJECTION64_PATH", "/opt/nsys/libToolsInjection64.so")
    p = _session_hearing_graphs(records=how != "iteration")
    for correlation in range(10):
        _graph_launch(p._recorder, correlation)  # tried once: later launches do not ask CUPTI again
    said = _close(p)
    assert p._notes["graph_launches"] == 10 and p._notes["graph_kernels"] == {}
    assert p._notes["graph_kernels_unavailable"].startswith(why)
    assert activity._sinks == () and cupti_activity.enabled == []
    assert len(said) == 1 and said[0].startswith("10 CUDA graph launches (cuGraphLaunch")
    assert f"Their kernels could not be named: {why}" in said[0] and "gpuscope.range" in said[0]


def test_teardown_after_a_failure_closes_the_records_quietly(fake, cupti_activity):  # noqa: F811
    graphs = GraphKernels()
    graphs.open(lambda c: True)
    assert activity._sinks != ()

    class Broken:
        def synchronize(self):
            raise RuntimeError("context gone")

    graphs.close(Broken())  # the flush still happens
    graphs.close()  # twice is nothing
    assert activity._sinks == () and cupti_activity.enabled == [] and graphs.unavailable == ""
    graphs.open(lambda c: True)  # a late graph launch (another thread) opens nothing after the close
    assert activity._sinks == ()


def _graph_dataset(notes, rows=()):
    attrs = {"metric_set": "launch", "mode": "kernel", **notes}
    return _results.range_dataset(list(rows), ["gpu__time_duration.sum"],
                                  {"gpu__time_duration.sum": {"units": "nanosecond"}}, None, "GH100", attrs)


def test_the_attrs_survive_save_and_open(tmp_path):
    ds = _graph_dataset({"graph_launches": 10, "graph_kernels": {"gemm": 10, "relu": 10},
                         "graph_kernels_gpu_ns": {"gemm": 3000, "relu": 500}, "graph_launches_unrecorded": 1})
    gs.save_dataset(ds, tmp_path / "graphs.nc")
    back = gs.open_dataset(tmp_path / "graphs.nc")
    assert back.attrs["graph_kernels"] == {"gemm": 10, "relu": 10}
    assert list(back.attrs["graph_kernels"]) == ["gemm", "relu"]  # the order they ran in
    assert back.attrs["graph_kernels_gpu_ns"] == {"gemm": 3000, "relu": 500}
    assert back.attrs["graph_launches"] == 10 and back.attrs["graph_launches_unrecorded"] == 1
    empty = _graph_dataset({"graph_launches": 2, "graph_kernels": {}, "graph_kernels_gpu_ns": {},
                            "graph_kernels_unavailable": "another CUPTI tool is injected"})
    gs.save_dataset(empty, tmp_path / "unnamed.nc")
    back = gs.open_dataset(tmp_path / "unnamed.nc")
    assert back.attrs["graph_kernels"] == {} and back.attrs["graph_kernels_unavailable"].startswith("another")


def test_the_report_says_first_which_graph_launches_were_not_profiled():
    notes = {"graph_launches": 10, "graph_kernels": {"gemm": 10, "relu": 10}, "graph_kernels_gpu_ns": {}}
    nothing = gs.report(_graph_dataset(notes))
    assert nothing.title.endswith(". 10 CUDA graph launches not profiled (kernels: gemm x10, relu x10).")
    assert "a gpuscope.range around each graph launch" in nothing.notes[0]
    row = {"name": "stream", "kernel": "stream", "launch": 0, "values": [1000.0]}
    some = gs.report(_graph_dataset(notes, [row]))
    text = " ".join(some.to_text(100).split())
    assert text.index("10 CUDA graph launches not profiled (kernels: gemm x10, relu x10)") < text.index("share")
    unnamed = gs.report(_graph_dataset({"graph_launches": 1, "graph_kernels": {},
                                        "graph_kernels_unavailable": "CUPTI refused"}, [row]))
    assert unnamed.title.endswith(". 1 CUDA graph launch not profiled (their kernels not named: CUPTI refused).")
    assert "CUDA graph" not in gs.report(_graph_dataset({}, [row])).title


def test_kernel_replay_stops_before_every_graph_launch_and_the_records_open_at_the_first():
    """A graph launched while kernel replay ran left it no range for the launches around it (H100: 0 rows for 3),
    and CUPTI refuses kernel activity while it runs (CUPTI_ERROR_NOT_COMPATIBLE): it is stopped before every graph
    launch, as before a left-out launch, and started again at the next launch it profiles."""
    from gpuscope._range_profiling.launches import Baton
    from gpuscope._range_profiling.modes import PerLaunchModes

    events = []

    class Rp:
        def stop(self):
            events.append("stop")

    class Collector:
        running, paused, errors, rp = True, False, [], Rp()

    class Graphs:
        def may_open(self):
            return "open" not in events

        def open(self, keep):
            events.append("open")

    class Session:
        _on_graph = PerLaunchModes._on_graph
        _recorder = type("R", (), {"graph_correlations": {5}})()
        _graphs, _collector = Graphs(), Collector()
        _graph_replay, _baton = None, Baton()

    session = Session()
    session._on_graph(5)
    assert events == ["stop", "open"] and session._collector.paused
    session._collector.paused = False  # a profiled launch started it again
    session._on_graph(6)
    assert events == ["stop", "open", "stop"] and session._collector.paused
