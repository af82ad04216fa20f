"""gpuscope.range: paths, nesting, decorator use, listeners, exception safety (no GPU)."""

import sys
import threading
import types

import pytest

from gpuscope._range_profiling import ranges as _ranges
from gpuscope.errors import GpuscopeWarning, UnbalancedRangeError


class Recorder:
    def __init__(self):
        self.events = []

    def range_push(self, path):
        self.events.append(("push", path, _ranges.current_path()))

    def range_pop(self, path):
        self.events.append(("pop", path, _ranges.current_path()))


@pytest.fixture
def recorder():
    rec = Recorder()
    _ranges.add_listener(rec)
    yield rec
    _ranges.remove_listener(rec)


def test_nested_paths_and_listener_order(recorder):
    with _ranges.range("step"):
        with _ranges.range("fwd"):
            assert _ranges.current_path() == "step/fwd"
        assert _ranges.current_path() == "step"
    assert _ranges.current_path() is None
    # push sees the path already on the stack, pop sees it still there
    assert recorder.events == [
        ("push", "step", "step"),
        ("push", "step/fwd", "step/fwd"),
        ("pop", "step/fwd", "step/fwd"),
        ("pop", "step", "step"),
    ]


def test_decorator_named_and_bare(recorder):
    @_ranges.range("outer")
    def f(x):
        return _ranges.current_path(), x * 2

    @_ranges.range
    def g():
        return _ranges.current_path()

    assert f(3) == ("outer", 6)
    assert g() == g.__qualname__
    assert f.__name__ == "f"
    assert [e[:2] for e in recorder.events][:2] == [("push", "outer"), ("pop", "outer")]


def test_exception_pops_and_propagates(recorder):
    with pytest.raises(KeyError):
        with _ranges.range("a"):
            with _ranges.range("b"):
                raise KeyError("boom")
    assert _ranges.current_path() is None
    assert [e[:2] for e in recorder.events] == [("push", "a"), ("push", "a/b"), ("pop", "a/b"), ("pop", "a")]


def test_listener_exception_becomes_warning_and_stack_stays_balanced(recorder):
    class Bad:
        def range_push(self, path):
            raise RuntimeError("push broke")

        def range_pop(self, path):
            raise RuntimeError("pop broke")

    bad = Bad()
    _ranges.add_listener(bad)
    try:
        with pytest.warns(GpuscopeWarning) as caught:
            with _ranges.range("x"):
                assert _ranges.current_path() == "x"
    finally:
        _ranges.remove_listener(bad)
    assert sorted(str(w.message).split(" raised ")[1] for w in caught) == [
        "RuntimeError: pop broke",
        "RuntimeError: push broke",
    ]
    assert _ranges.current_path() is None
    assert [e[:2] for e in recorder.events] == [("push", "x"), ("pop", "x")]


def test_out_of_order_exit_raises_and_closes_inner(recorder):
    outer, inner = _ranges.range("o"), _ranges.range("i")
    outer.__enter__()
    inner.__enter__()
    with pytest.raises(UnbalancedRangeError, match=r"\['o/i'\]"):
        outer.__exit__(None, None, None)
    assert _ranges.current_path() is None
    assert [e[:2] for e in recorder.events][-2:] == [("pop", "o/i"), ("pop", "o")]
    with pytest.raises(UnbalancedRangeError, match="not open"):
        inner.__exit__(None, None, None)


def test_thread_local_stacks():
    seen = {}
    with _ranges.range("main"):
        t = threading.Thread(target=lambda: seen.setdefault("other", _ranges.current_path()))
        t.start()
        t.join()
        assert _ranges.current_path() == "main"
    assert seen["other"] is None


def test_listener_added_inside_range_gets_no_unmatched_pop():
    rec = Recorder()
    with _ranges.range("a"):
        _ranges.add_listener(rec)
    _ranges.remove_listener(rec)
    assert rec.events == []


@pytest.mark.parametrize("bad, exc", [("", ValueError), ("a/b", ValueError), (3, TypeError)])
def test_bad_names(bad, exc):
    with pytest.raises(exc):
        _ranges.range(bad)


def test_add_listener_checks_methods():
    with pytest.raises(TypeError, match="range_pop"):
        _ranges.add_listener(type("L", (), {"range_push": lambda self, p: None})())


def test_public_name_is_lazy():
    import gpuscope

    assert gpuscope.range is _ranges.Range


#: What attaches a tool to the process (Nsight Systems and Nsight Compute set them for the programs they run).
TOOL_VARIABLES = ("NVTX_INJECTION64_PATH", "CUDA_INJECTION64_PATH")


class FakeNvtx:
    """The nvtx package's part that gpuscope.range uses, recording each call and whether it was marked as gpuscope's."""

    def __init__(self, monkeypatch):
        self.calls = []
        module = types.ModuleType("nvtx")
        module.get_domain = lambda name: self.calls.append(("domain", name, False)) or self
        monkeypatch.setitem(sys.modules, "nvtx", module)
        monkeypatch.setattr(_ranges, "_DOMAIN", _ranges._UNSET)  # as in a process that has made no range yet

    def get_event_attributes(self, message):
        return message

    def push_range(self, attributes):
        self.calls.append(("push", attributes, _ranges.emitting()))

    def pop_range(self):
        self.calls.append(("pop", None, _ranges.emitting()))


def test_ranges_make_no_nvtx_call_where_no_tool_is_attached(monkeypatch, recorder):
    """Without a tool, NVTX started inside a session could go to gpuscope's own CUPTI (issue 52, item 13)."""
    for name in TOOL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    nvtx = FakeNvtx(monkeypatch)
    with _ranges.range("step"):
        with _ranges.range("fwd"):
            pass
    assert nvtx.calls == []
    assert [e[:2] for e in recorder.events] == [("push", "step"), ("push", "step/fwd"), ("pop", "step/fwd"),
                                               ("pop", "step")]


@pytest.mark.parametrize("variable", TOOL_VARIABLES)
def test_ranges_emit_nvtx_where_a_tool_is_attached(monkeypatch, variable):
    for name in TOOL_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(variable, "/opt/tool/libinjection.so")
    nvtx = FakeNvtx(monkeypatch)
    with _ranges.range("step"):
        with _ranges.range("fwd"):
            pass
    assert nvtx.calls == [("domain", "gpuscope", False), ("push", "step", True), ("push", "step/fwd", True),
                          ("pop", None, True), ("pop", None, True)]
    assert not _ranges.emitting()
