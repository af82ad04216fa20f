"""NVTX ranges as gpuscope ranges, without a GPU: CUPTI's NVTX callback data parsed from structs laid out as the
headers declare them, the filters, NVTX push/pop driving gpuscope's range stacks, the injection checks and probe,
and CUPTI's subscriber (faked at the ctypes layer)."""

import ctypes
import sys
import threading
import types
import warnings
from ctypes import POINTER, Structure, c_char_p, c_int32, c_uint16, c_uint32, c_uint64, c_void_p, c_wchar_p

import pytest

from gpuscope._range_profiling import nvtx as _nvtx
from gpuscope._range_profiling import ranges as _ranges
from gpuscope.cupti import callbacks, subscriber
from gpuscope.cupti import nvtx as shim
from gpuscope.errors import GpuscopeWarning, NvtxUnavailableError, SessionConflictError

from .test_subscriber import FakeCupti


# -- the layouts, written as the headers declare them (types included), independently of the shim ------------
class EventAttributes(Structure):  # nvtxEventAttributes_v2 (nvtx3/nvToolsExt.h)
    _fields_ = [("version", c_uint16), ("size", c_uint16), ("category", c_uint32), ("colorType", c_int32),
                ("color", c_uint32), ("payloadType", c_int32), ("reserved0", c_int32), ("payload", c_uint64),
                ("messageType", c_int32), ("message", c_void_p)]


class PushA(Structure):  # nvtxRangePushA_params (generated_nvtx_meta.h)
    _fields_ = [("message", c_char_p)]


class PushW(Structure):  # nvtxRangePushW_params
    _fields_ = [("message", c_wchar_p)]


class PushEx(Structure):  # nvtxRangePushEx_params
    _fields_ = [("eventAttrib", POINTER(EventAttributes))]


class DomainPushEx(Structure):  # nvtxDomainRangePushEx_params {domain, core}
    _fields_ = [("domain", c_void_p), ("core", PushEx)]


class DomainOnly(Structure):  # nvtxDomainRangePop_params, nvtxDomainDestroy_params
    _fields_ = [("domain", c_void_p)]


class CreateA(Structure):  # nvtxDomainCreateA_params
    _fields_ = [("name", c_char_p)]


class RegisterA(Structure):  # nvtxDomainRegisterStringA_params
    _fields_ = [("domain", c_void_p), ("string", c_char_p)]


class RegisterW(Structure):  # nvtxDomainRegisterStringW_params (the string is a wchar_t* at run time)
    _fields_ = [("domain", c_void_p), ("string", c_wchar_p)]


class NvtxData(Structure):  # CUpti_NvtxData (cupti_callbacks.h)
    _fields_ = [("functionName", c_char_p), ("functionParams", c_void_p), ("functionReturnValue", c_void_p)]


def parsed(cbid, params, returned=None):
    keep = [params]
    ret = None
    if returned is not None:
        ret = c_void_p(returned)
        keep.append(ret)
    data = NvtxData(b"nvtx", ctypes.addressof(params), ctypes.addressof(ret) if ret is not None else None)
    return shim.parse(cbid, ctypes.addressof(data))


def attributes(kind, message):
    a = EventAttributes(version=3, size=ctypes.sizeof(EventAttributes), messageType=kind)
    a.message = message
    return a


def test_the_event_attributes_layout_is_the_headers():
    for name, *_ in EventAttributes._fields_:
        assert getattr(shim.nvtxEventAttributes_v2, name).offset == getattr(EventAttributes, name).offset, name
    assert ctypes.sizeof(shim.nvtxEventAttributes_v2) == ctypes.sizeof(EventAttributes) == 48


def test_pushes_of_every_kind_are_parsed():
    assert parsed(shim.CBID_nvtxRangePushA, PushA(b"step")) == shim.NvtxCall("push", 0, "step")
    assert parsed(shim.CBID_nvtxRangePushW, PushW("f\u00fcr")) == shim.NvtxCall("push", 0, "f\u00fcr")
    text = ctypes.create_string_buffer(b"forward")
    a = attributes(shim.NVTX_MESSAGE_TYPE_ASCII, ctypes.addressof(text))
    assert parsed(shim.CBID_nvtxRangePushEx, PushEx(ctypes.pointer(a))) == shim.NvtxCall("push", 0, "forward")
    wide = ctypes.create_unicode_buffer("backward")
    a = attributes(shim.NVTX_MESSAGE_TYPE_UNICODE, ctypes.addressof(wide))
    assert parsed(shim.CBID_nvtxRangePushEx, PushEx(ctypes.pointer(a))) == shim.NvtxCall("push", 0, "backward")
    a = attributes(shim.NVTX_MESSAGE_TYPE_REGISTERED, 0xABC0)
    call = parsed(shim.CBID_nvtxDomainRangePushEx, DomainPushEx(0xD0, PushEx(ctypes.pointer(a))))
    assert call == shim.NvtxCall("push", 0xD0, None, 0xABC0)
    a = attributes(shim.NVTX_MESSAGE_UNKNOWN, 0)
    assert parsed(shim.CBID_nvtxDomainRangePushEx, DomainPushEx(None, PushEx(ctypes.pointer(a)))) == \
        shim.NvtxCall("push", 0, "")


def test_pops_domains_and_strings_are_parsed():
    assert parsed(shim.CBID_nvtxRangePop, DomainOnly(None)) == shim.NvtxCall("pop")
    assert parsed(shim.CBID_nvtxDomainRangePop, DomainOnly(0xD0)) == shim.NvtxCall("pop", 0xD0)
    assert parsed(shim.CBID_nvtxDomainDestroy, DomainOnly(0xD0)) == shim.NvtxCall("destroy", 0xD0)
    assert parsed(shim.CBID_nvtxDomainCreateA, CreateA(b"app"), returned=0xD0) == shim.NvtxCall("domain", 0xD0, "app",
                                                                                               0xD0)
    assert parsed(shim.CBID_nvtxDomainRegisterStringA, RegisterA(0xD0, b"step"), returned=0x51) == \
        shim.NvtxCall("string", 0xD0, "step", 0x51)
    assert parsed(shim.CBID_nvtxDomainRegisterStringW, RegisterW(None, "step"), returned=0x52) == \
        shim.NvtxCall("string", 0, "step", 0x52)
    assert parsed(1, PushA(b"a mark")) is None  # nvtxMarkA: not heard


def test_the_cbids_are_cuptis():  # cupti_nvtx_cbid.h
    assert (shim.CBID_nvtxRangePushA, shim.CBID_nvtxRangePop, shim.CBID_nvtxDomainRangePushEx,
            shim.CBID_nvtxDomainRangePop, shim.CBID_nvtxDomainRegisterStringA, shim.CBID_nvtxDomainCreateA,
            shim.CBID_nvtxDomainDestroy) == (8, 11, 33, 34, 39, 41, 43)
    assert callbacks.CUPTI_CB_DOMAIN_NVTX == 5


# -- CUPTI's subscriber ----------------------------------------------------------------------------------------
@pytest.fixture
def cupti(monkeypatch):
    fake = FakeCupti()
    monkeypatch.setattr(subscriber, "_f", fake)
    for name, value in (("_subscription", []), ("_listening", ()), ("_module_watchers", ()), ("_open", set()),
                        ("_nvtx_watchers", ()), ("_holds", 0)):
        monkeypatch.setattr(subscriber, name, value)
    return fake


def test_an_nvtx_watcher_holds_the_subscriber_and_its_callbacks_while_open(cupti):
    heard = []
    watcher = shim.NvtxWatcher(heard.append)
    assert cupti.calls[0] == "subscribe" and [c[2] for c in cupti.calls[1:]] == list(shim.CBIDS)
    assert all(c[1] == 1 for c in cupti.calls[1:])
    message = PushA(b"step")
    data = NvtxData(b"nvtxRangePushA", ctypes.addressof(message), None)
    subscriber._dispatch(None, callbacks.CUPTI_CB_DOMAIN_NVTX, shim.CBID_nvtxRangePushA, ctypes.addressof(data))
    assert heard == [shim.NvtxCall("push", 0, "step")]
    with pytest.raises(RuntimeError, match="1 NVTX watcher"):
        subscriber._before_detach()
    watcher.close()
    watcher.close()
    assert [c[1] for c in cupti.calls if c[0] == "enable"].count(0) == len(shim.CBIDS)
    assert cupti.calls[-1] == ("unsubscribe", 0x5EB) and subscriber._subscription == []


def test_a_failing_nvtx_callback_is_a_warning(cupti):
    def broken(call):
        raise RuntimeError("oops")

    watcher = shim.NvtxWatcher(broken)
    message = PushA(b"step")
    data = NvtxData(b"nvtxRangePushA", ctypes.addressof(message), None)
    with pytest.warns(GpuscopeWarning, match="NVTX callback failed"):
        watcher._on_callback(shim.CBID_nvtxRangePushA, ctypes.addressof(data))
    watcher.close()


# -- filters ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("nvtx, exclude, text", [
    (True, None, "all"), ("step", None, "include step"),
    (["NVTX@step/", "*/fwd"], "x", "include NVTX@step/, */fwd; exclude x"),
    (None, ["a", "app@"], "all; exclude a, app@")])
def test_filters_are_built_and_described(nvtx, exclude, text):
    assert _nvtx.NvtxFilter.build(nvtx, exclude).describe() == text


@pytest.mark.parametrize("nvtx, exclude, error, needle", [
    ([""], None, ValueError, "empty pattern"), ("@step", None, ValueError, "no domain before"),
    ("a//b", None, ValueError, "empty level"), ([], None, ValueError, r"nvtx=\[\]"),
    (False, "x", ValueError, "nvtx=False"), ([3], None, TypeError, "strings"), (True, 3, TypeError, "pattern"),
    (True, [], ValueError, "nvtx_exclude=")])
def test_bad_filters_are_refused(nvtx, exclude, error, needle):
    with pytest.raises(error, match=needle):
        _nvtx.NvtxFilter.build(nvtx, exclude)


def test_no_filter_without_nvtx():
    assert _nvtx.NvtxFilter.build() is None and _nvtx.NvtxFilter.build(False) is None


def test_patterns_match_the_path_and_the_domain():
    p = _nvtx.NvtxPattern.parse("app@step/*", "nvtx")
    assert p.matches("app", "step/forward") and not p.matches("NVTX", "step/forward") and not p.matches(None, "step/x")
    assert _nvtx.NvtxPattern.parse("*/forward", "nvtx").matches(None, "a/b/forward")
    assert not _nvtx.NvtxPattern.parse("forward", "nvtx").matches("NVTX", "step/forward")
    assert _nvtx.NvtxPattern.parse("ap?@", "nvtx").matches("app", "anything/at/all")


# -- NVTX push/pop -> gpuscope ranges --------------------------------------------------------------------------
class Listener:
    def __init__(self):
        self.heard = []

    def range_push(self, path):
        self.heard.append(("push", path))

    def range_pop(self, path):
        self.heard.append(("pop", path))


class FakeWatcher:
    """Stands in for CUPTI's NVTX callbacks: a test feeds the calls."""

    made: list = []

    def __init__(self, on_call):
        self.on_call, self.closed = on_call, False
        FakeWatcher.made.append(self)

    def close(self):
        self.closed = True


@pytest.fixture
def taking(monkeypatch):
    """``make(filter)``: NvtxRanges over a fake watcher with a listening session; ``feed(kind, ...)`` plays calls."""
    FakeWatcher.made = []
    monkeypatch.setattr(shim, "NvtxWatcher", FakeWatcher)
    monkeypatch.setattr(_nvtx.NvtxRanges, "_probe", lambda self: None)
    monkeypatch.setattr(_nvtx, "_domains", {0: _nvtx.DEFAULT_DOMAIN})
    monkeypatch.setattr(_nvtx, "_strings", {})
    made = []

    def make(nvtx=True, exclude=None):
        session = Listener()
        _ranges.add_listener(session)
        taken = _nvtx.NvtxRanges(session, _nvtx.NvtxFilter.build(nvtx, exclude))
        made.append((session, taken))
        return session, taken

    yield make
    for session, taken in made:
        taken.close(report=False)
        _ranges.remove_listener(session)


def play(taken, *calls):
    for call in calls:
        if isinstance(call, str):
            call = shim.NvtxCall("push", 0, call) if call != "pop" else shim.NvtxCall("pop")
        taken._watcher.on_call(call)


def test_nested_nvtx_ranges_are_ranges_named_by_path_told_to_the_session_only(taking):
    session, taken = taking()
    bystander = Listener()
    _ranges.add_listener(bystander)
    try:
        play(taken, "step", "forward")
        assert _ranges.current_path() == "step/forward"
        with _ranges.range("inner"):  # a gpuscope.range inside NVTX ranges nests under them
            pass
        play(taken, "pop", "pop")
    finally:
        _ranges.remove_listener(bystander)
    assert session.heard == [("push", "step"), ("push", "step/forward"), ("push", "step/forward/inner"),
                             ("pop", "step/forward/inner"), ("pop", "step/forward"), ("pop", "step")]
    assert bystander.heard == [("push", "step/forward/inner"), ("pop", "step/forward/inner")]
    assert _ranges.current_path() is None and (taken.heard, taken.taken) == (2, 2)


def test_domains_and_registered_strings_name_ranges(taking):
    session, taken = taking(["app@step"])
    play(taken, shim.NvtxCall("domain", 0xD0, "app", 0xD0), shim.NvtxCall("string", 0xD0, "step", 0x51),
         shim.NvtxCall("push", 0, "step"), shim.NvtxCall("pop"),  # the default domain's "step": not included
         shim.NvtxCall("push", 0xD0, None, 0x51), shim.NvtxCall("push", 0, "mm"),  # nested in app's: included
         shim.NvtxCall("pop"), shim.NvtxCall("pop", 0xD0))
    assert session.heard == [("push", "step"), ("push", "step/mm"), ("pop", "step/mm"), ("pop", "step")]
    assert taken.heard == 3


def test_gpuscopes_own_nvtx_is_not_taken_twice(taking):
    session, taken = taking()
    _ranges._local.emitting = True
    try:
        play(taken, "a gpuscope.range's NVTX push")
    finally:
        _ranges._local.emitting = False
    play(taken, shim.NvtxCall("domain", 0xD1, "gpuscope", 0xD1), shim.NvtxCall("push", 0xD1, "step"),
         shim.NvtxCall("pop", 0xD1))
    assert session.heard == [] and taken.heard == 0


def test_include_takes_what_is_nested_and_a_glob_can_start_the_path_lower(taking):
    session, taken = taking(["step"])
    play(taken, "step", "fwd", "pop", "pop", "other", "pop")
    assert [p for k, p in session.heard if k == "push"] == ["step", "step/fwd"]
    taken.close(report=False)
    session, taken = taking(["*/forward"])
    play(taken, "step", "forward", "mm", "pop", "pop", "pop")
    assert [p for k, p in session.heard if k == "push"] == ["forward", "forward/mm"]


def test_exclude_drops_the_range_and_what_is_nested(taking):
    session, taken = taking(None, ["step/backward"])
    play(taken, "step", "backward", "mm", "pop", "pop", "forward", "pop", "pop")
    assert [p for k, p in session.heard if k == "push"] == ["step", "step/forward"]


def test_slashes_in_messages_do_not_make_levels(taking):
    session, taken = taking()
    play(taken, "data/load", "pop", "   ", "pop")
    assert [p for k, p in session.heard if k == "push"] == ["data|load", "(no message)"]


def test_a_pop_of_a_range_pushed_before_the_session_is_ignored(taking):
    session, taken = taking()
    play(taken, "pop", shim.NvtxCall("pop", 0xD0))
    assert session.heard == [] and _ranges.current_path() is None


def test_an_unregistered_string_is_named_and_said(taking):
    session, taken = taking()
    play(taken, shim.NvtxCall("push", 0, None, 0x99), "pop")
    assert session.heard == [("push", "?"), ("pop", "?")]
    with pytest.warns(GpuscopeWarning, match="registered before"):
        taken.close()


def test_domains_that_do_not_nest_are_said_and_leave_the_stacks_whole(taking):
    session, taken = taking()
    play(taken, shim.NvtxCall("push", 0xA, "a"), shim.NvtxCall("push", 0xB, "b"))
    with pytest.warns(GpuscopeWarning, match="do not nest"):
        play(taken, shim.NvtxCall("pop", 0xA))  # NVTX pops domain A's range while B's is open inside it
    assert _ranges.current_path() is None
    play(taken, shim.NvtxCall("pop", 0xB))
    assert session.heard == [("push", "a"), ("push", "a/b"), ("pop", "a/b"), ("pop", "a")]


def test_closing_leaves_no_nvtx_range_on_any_thread(taking):
    _, taken = taking()
    ready, done = threading.Event(), threading.Event()
    seen = {}

    def other():
        play(taken, "worker")
        ready.set()
        done.wait(5)
        with _ranges.range("later"):
            seen["path"] = _ranges.current_path()

    thread = threading.Thread(target=other)
    thread.start()
    ready.wait(5)
    play(taken, "main")
    taken.close(report=False)
    assert _ranges.current_path() is None and FakeWatcher.made[-1].closed
    done.set()
    thread.join(5)
    assert seen["path"] == "later"  # the worker's NVTX range was dropped at its next range
    play(taken, "pop")  # nothing hears after close (the watcher is closed); a late call changes nothing
    assert _ranges.current_path() is None


def test_one_session_at_a_time_takes_nvtx(taking):
    taking()
    with pytest.raises(SessionConflictError, match="one session at a time"):
        taking()
    assert len(_nvtx._taking) == 1


def test_the_end_says_when_nothing_was_heard_or_matched(taking):
    _, taken = taking()
    with pytest.warns(GpuscopeWarning, match="No NVTX range was heard"):
        taken.close()
    _, taken = taking(["nomatch"])  # the first closed: another may take NVTX ranges
    play(taken, "step", "pop")
    with pytest.warns(GpuscopeWarning, match="none matched the NVTX filters"):
        taken.close()
    assert taken.notes() == {"nvtx": "include nomatch", "nvtx_ranges_heard": 1, "nvtx_ranges_taken": 0}


# -- the probe and the injection --------------------------------------------------------------------------------
def fake_nvtx_package(monkeypatch, arrives: bool):
    heard = []

    def push_range(message):
        heard.append(message)
        if arrives:  # as CUPTI would: the callback runs inside the call, on this thread
            _nvtx._taking[0]._on_call(shim.NvtxCall("push", 0, message))

    package = types.SimpleNamespace(enabled=lambda: True, push_range=push_range,
                                    pop_range=lambda: _nvtx._taking[0]._on_call(shim.NvtxCall("pop")) if arrives
                                    else None)
    monkeypatch.setitem(sys.modules, "nvtx", package)
    return heard


@pytest.mark.parametrize("arrives", [True, False])
def test_the_probe_sees_whether_nvtx_arrives_and_is_no_range(monkeypatch, arrives):
    monkeypatch.setattr(shim, "NvtxWatcher", FakeWatcher)
    pushed = fake_nvtx_package(monkeypatch, arrives)
    session = Listener()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        taken = _nvtx.NvtxRanges(session, _nvtx.NvtxFilter.build(True))
    taken.close(report=False)
    assert pushed == [_nvtx.PROBE] and taken.probe is arrives and session.heard == [] and taken.heard == 0
    assert any("do not reach gpuscope" in str(w.message) for w in caught) is (not arrives)


def test_without_the_nvtx_package_there_is_no_probe(monkeypatch):
    monkeypatch.setattr(shim, "NvtxWatcher", FakeWatcher)
    monkeypatch.setitem(sys.modules, "nvtx", None)  # import nvtx raises ImportError
    taken = _nvtx.NvtxRanges(Listener(), _nvtx.NvtxFilter.build(True))
    taken.close(report=False)
    assert taken.probe is None


@pytest.fixture
def lib(monkeypatch, tmp_path):
    path = tmp_path / "libcupti.so.13"
    path.write_bytes(b"")
    monkeypatch.setattr(_nvtx, "_cupti_path", lambda: str(path))
    monkeypatch.delenv(_nvtx.INJECTION_VAR, raising=False)
    return path


def test_a_session_without_injection_is_refused_with_what_to_do(lib, monkeypatch, tmp_path):
    with pytest.raises(NvtxUnavailableError, match="is not set.*enable_nvtx.*--nvtx"):
        _nvtx.check_injection()
    other = tmp_path / "libToolsInjection64.so"
    other.write_bytes(b"")
    monkeypatch.setenv(_nvtx.INJECTION_VAR, str(other))
    with pytest.raises(NvtxUnavailableError, match="not the CUPTI gpuscope uses"):
        _nvtx.check_injection()
    monkeypatch.setenv(_nvtx.INJECTION_VAR, str(lib))
    _nvtx.check_injection()


def test_enable_nvtx_routes_nvtx_to_gpuscopes_cupti(lib, monkeypatch, tmp_path):
    monkeypatch.delitem(sys.modules, "nvtx.nvtx", raising=False)
    import os

    assert _nvtx.enable_nvtx() == str(lib) == os.environ[_nvtx.INJECTION_VAR]
    assert _nvtx.enable_nvtx() == str(lib)  # again: nothing changes
    other = tmp_path / "libToolsInjection64.so"
    other.write_bytes(b"")
    monkeypatch.setenv(_nvtx.INJECTION_VAR, str(other))
    with pytest.raises(NvtxUnavailableError, match="another NVTX tool"):
        _nvtx.enable_nvtx()
    assert os.environ[_nvtx.INJECTION_VAR] == str(other)


def test_enable_nvtx_says_when_the_nvtx_package_started_too_early(lib, monkeypatch):
    class Cached:
        @staticmethod
        def cache_info():
            return types.SimpleNamespace(currsize=1)

    monkeypatch.setitem(sys.modules, "nvtx.nvtx", types.SimpleNamespace(_get_domain_cached=Cached))
    with pytest.warns(GpuscopeWarning, match="made NVTX calls before"):
        _nvtx.enable_nvtx()


# -- a user-mode session driven by NVTX ------------------------------------------------------------------------
def test_nvtx_ranges_are_cupti_ranges_of_a_user_mode_session(monkeypatch):
    from .test_range_session_faults import StrictRangeProfiler
    from .test_session_faults import user_session

    monkeypatch.setattr("gpuscope.cupti.activity.timestamp", lambda: 1)
    monkeypatch.setattr(shim, "NvtxWatcher", FakeWatcher)
    monkeypatch.setattr(_nvtx.NvtxRanges, "_probe", lambda self: None)
    rp = StrictRangeProfiler(cycles=2)
    p = user_session(rp, cycles=2)  # max_depth 2: two cycles per pass group
    _ranges.add_listener(p)
    taken = _nvtx.NvtxRanges(p, _nvtx.NvtxFilter.build(True, "*/skip"))
    try:
        for _ in range(2):
            play(taken, "step", "forward", "pop", "skip", "pop")
            with _ranges.range("update"):
                pass
            play(taken, "pop")
    finally:
        taken.close(report=False)
        _ranges.remove_listener(p)
    cycle = ["start", "push step", "push forward", "pop", "push update", "pop", "pop", "stop"]
    assert rp.calls == cycle + cycle + ["collect 0 bad=False"]
    assert p._stack == [] and _ranges.current_path() is None


def test_a_profiler_refuses_bad_nvtx_patterns_before_touching_the_gpu():
    import gpuscope as gs

    with pytest.raises(ValueError, match="empty level"):
        gs.Profiler("launch", nvtx="step//forward")
    with pytest.raises(TypeError, match="strings"):
        gs.Profiler("launch", nvtx=[1])


def test_an_nvtx_package_that_fails_the_probe_is_no_probe(monkeypatch):
    monkeypatch.setattr(shim, "NvtxWatcher", FakeWatcher)

    def push_range(message):
        raise AttributeError("an nvtx package of another shape")

    monkeypatch.setitem(sys.modules, "nvtx", types.SimpleNamespace(enabled=lambda: True, push_range=push_range))
    taken = _nvtx.NvtxRanges(Listener(), _nvtx.NvtxFilter.build(True))
    taken.close(report=False)
    assert taken.probe is None and not getattr(taken._local, "probing", False)
