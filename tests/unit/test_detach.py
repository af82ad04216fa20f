"""Detaching CUPTI before PC sampling (gpuscope._gpu.keep.detach_cupti, gpuscope.cupti._api.detach), and another
CUPTI client's cuptiFinalize seen before gpuscope reuses what CUPTI forgot, without a GPU: CUPTI's callback API, its
cuptiFinalize and the driver call at whose exit gpuscope finalizes are a model of them (tests/unit/test_subscriber.py
FakeCupti); cuptiProfilerInitialize and cuptiProfilerDeInitialize are replaced by a recorder; the CUPTI profiler's
reference count, the keeper and the callback bookkeeping are gpuscope's own."""

import ctypes
import threading

import pytest

from gpuscope._gpu import hosts as _hosts
from gpuscope._gpu import keep as _keep
from gpuscope._gpu import modules as _modules
from gpuscope.cupti import _api, activity, callbacks, profiler, subscriber
from gpuscope.cupti import finalize as _finalize

from .test_keep import FakeContext, FakeProfiler
from .test_subscriber import FakeCupti


class Finalize:
    """What CUPTI was asked to do that the tests follow: cuptiFinalize (through the callback model, which forgets its
    subscribers), cuptiProfilerInitialize and cuptiProfilerDeInitialize, in order."""

    def __init__(self, model):
        self.calls = []
        self.status = 0
        self.model = model
        self.threads = []  # the thread each cuptiFinalize ran on
        self.sites = []  # and the callback site it was called from (None: outside any callback)

        def finalize():  # a function, as ctypes gives: gpuscope sets its restype
            self.calls.append("cuptiFinalize")
            self.threads.append(threading.get_ident())
            self.sites.append(model.site)
            model.finalize_status = self.status
            return model.cuptiFinalize()

        self.cuptiFinalize = finalize


class FakeHost:
    def __init__(self):
        self.closed = 0

    def close(self):
        self.closed += 1


@pytest.fixture
def cupti(monkeypatch):
    model = FakeCupti()  # no other CUPTI client holds the subscriber (tests below change that)
    fake = Finalize(model)
    monkeypatch.setattr(_api, "_cdll", lambda which: fake)
    monkeypatch.setattr(_api, "_attached", True)
    monkeypatch.delenv(_keep.DETACH_ENV, raising=False)  # on by default
    monkeypatch.delenv("CUDA_INJECTION64_PATH", raising=False)
    monkeypatch.setattr(subscriber, "_f", model)
    monkeypatch.setattr(_finalize, "_call_the_driver", model.cuCtxGetCurrent)
    monkeypatch.setattr(subscriber, "_subscription", [])
    monkeypatch.setattr(subscriber, "_open", set())
    monkeypatch.setattr(subscriber, "_listening", ())
    monkeypatch.setattr(subscriber, "_module_watchers", ())
    monkeypatch.setattr(subscriber, "_nvtx_watchers", ())
    monkeypatch.setattr(subscriber, "_holds", 0)
    monkeypatch.setattr(activity, "_registered", [])
    monkeypatch.setattr(activity, "_sinks", ())
    monkeypatch.setattr(_modules, "_watcher", None)
    monkeypatch.setattr(_hosts, "_hosts", {})
    monkeypatch.setattr(_keep, "_kept", {})
    monkeypatch.setattr(_keep, "_listeners", {})
    monkeypatch.setattr(_keep, "_start_listener", lambda device: None)  # no rendezvous (tests/unit/test_keep.py)
    monkeypatch.setenv("GPUSCOPE_KEEP", "inf")  # no idle timer unless a test asks for one
    monkeypatch.setattr(profiler, "_init_count", 0)
    monkeypatch.setattr(profiler, "_witness", None)
    monkeypatch.setattr(profiler, "_sessions", 0)
    monkeypatch.setattr(profiler, "params", lambda cls, **fields: None)
    for name in ("cuptiProfilerInitialize", "cuptiProfilerDeInitialize"):
        monkeypatch.setattr(profiler._f, name, lambda p, name=name: fake.calls.append(name))
    return fake


def keep_a_profiler(prof=None, device=0) -> _keep.Kept:
    """What a range session that closed cleanly leaves behind: the CUPTI profiler initialised for it (the session's
    cuptiProfilerInitialize, handed over with the profiler), its range profiler kept."""
    profiler.initialize()
    kept = _keep.Kept(("ctx", ("m",)), 7, FakeContext(), prof or FakeProfiler(), "config", "image")
    _keep.keep(device, kept)
    return kept


class SlowProfiler(FakeProfiler):
    """A kept range profiler whose disable takes a while (cuptiRangeProfilerDisable: 13 ms to 0.5 s on the H100)."""

    def __init__(self):
        super().__init__()
        self.closing, self.finish = threading.Event(), threading.Event()

    def close(self):
        self.closing.set()
        self.finish.wait(10)
        self.closed += 1


def _host():
    host = FakeHost()
    return host, _keep.HostSetup(host=host, config=None, passes=1, properties={})


def subscribed(cupti, monkeypatch, handle=0xABC) -> object:
    """gpuscope holding CUPTI's subscriber *handle*, which CUPTI knows; its C callback."""
    callback = object()
    cupti.model.holder = (handle, callback)
    monkeypatch.setattr(subscriber, "_subscription", [handle, callback])
    return callback


def test_detach_finalizes_and_forgets_hosts_and_subscription(cupti, monkeypatch):
    callback = subscribed(cupti, monkeypatch)
    monkeypatch.setattr(activity, "_registered", ["requested", "completed"])
    monkeypatch.setattr(activity._f, "cuptiActivityFlushAll", lambda flag: 0)
    host, setup = _host()
    _hosts._hosts[(0, "GH100", ("m",))] = setup
    assert _keep.detach_cupti() == "detached"
    assert cupti.calls == ["cuptiFinalize"]
    unsubscribed = [c[1] for c in cupti.model.calls if c[0] == "unsubscribe"]
    assert unsubscribed == [0xABC, 0x5EB]  # gpuscope's, then the one the finalize's own call was heard on
    assert subscriber._subscription == [] and callback in subscriber._retired and activity._registered == []
    assert host.closed == 1 and _hosts._hosts == {}
    assert not _api.attached() and cupti.model.stale == []
    assert _keep.detach_cupti() == "not attached" and cupti.calls == ["cuptiFinalize"]


def test_an_open_session_refuses_and_nothing_is_dropped(cupti, monkeypatch):
    profiler.initialize()  # a gpuscope.Profiler made, not yet closed
    keep_a_profiler(device=1)  # given back, though the detach is then refused
    host, setup = _host()
    _hosts._hosts[(0, "GH100", ("m",))] = setup
    assert _keep.detach_cupti() == (
        "gpuscope is using CUPTI: 1 user(s) of the CUPTI profiler are open (cuptiProfilerInitialize): a "
        "gpuscope.Profiler or gpuscope.sample session not yet closed")
    assert "cuptiFinalize" not in cupti.calls and host.closed == 0 and len(_hosts._hosts) == 1 and _api.attached()
    assert _keep.kept_devices() == [] and profiler._init_count == 1
    assert subscriber._subscription and cupti.model.holder is not None  # the open session's witness stays held


def test_a_kept_profiler_is_released_and_never_counted_as_an_open_session(cupti):
    """What an iteration-mode session, then a kernel-mode one, leave (issue 33 item 5): the later session's kept
    profiler, holding the CUPTI profiler initialised. The detach gives it back, then detaches; it used to say "a
    gpuscope session is open (the CUPTI profiler is initialised for 1 session(s))"."""
    first = keep_a_profiler()
    second = keep_a_profiler()  # the kernel-mode session's replaces the iteration-mode one's
    assert first.profiler.closed == 1 and profiler._init_count == 1
    assert _keep.detach_cupti() == "detached"
    assert second.profiler.closed == 1 and second.context.closed == 1 and _keep.kept_devices() == []
    assert profiler._init_count == 0
    assert cupti.calls == ["cuptiProfilerInitialize", "cuptiProfilerDeInitialize", "cuptiFinalize"]


def test_a_release_under_way_on_the_idle_timer_is_waited_for(cupti, monkeypatch):
    """The idle timer takes the kept profiler out and disables it on its own thread (up to 0.5 s). A detach meanwhile
    found nothing kept, the CUPTI profiler still initialised, and refused with the false reason "a gpuscope session
    is open" (issue 36 item 4)."""
    monkeypatch.setenv("GPUSCOPE_KEEP", "0.01")
    kept = keep_a_profiler(SlowProfiler())
    assert kept.profiler.closing.wait(5)  # the timer's release has begun: nothing kept, the disable under way
    assert _keep.kept_devices() == [] and profiler._init_count == 1
    threading.Timer(0.2, kept.profiler.finish.set).start()
    assert _keep.detach_cupti() == "detached"
    assert kept.profiler.closed == 1 and kept.context.closed == 1 and profiler._init_count == 0
    assert cupti.calls[-1] == "cuptiFinalize"


def test_a_release_that_never_ends_is_the_reason_given(cupti, monkeypatch):
    monkeypatch.setenv("GPUSCOPE_KEEP", "0.01")
    monkeypatch.setattr(_keep, "RELEASE_WAIT_S", 0.2)
    kept = keep_a_profiler(SlowProfiler())
    assert kept.profiler.closing.wait(5)
    try:
        assert _keep.detach_cupti() == ("the kept profiler of device(s) [0] was still being released after 0.2 s "
                                        "(cuptiRangeProfilerDisable did not return)")
        assert "cuptiFinalize" not in cupti.calls
    finally:
        kept.profiler.finish.set()
    kept.timer.join(5)
    assert _keep.detach_cupti() == "detached"


@pytest.mark.parametrize("failing", ["close", "make_current"])
def test_a_release_that_fails_half_way_gives_back_the_rest_and_the_detach_goes_on(cupti, failing):
    """A failed disable (or a context that cannot be made current) used to skip cuptiProfilerDeInitialize and the
    context's release: every later detach was refused, and later PC blocks got no samples for kernels that ran under
    range profiling (issue 36 item 4)."""
    kept = keep_a_profiler()

    def refuse():
        raise RuntimeError("CUPTI said no")

    setattr(kept.profiler if failing == "close" else kept.context, failing, refuse)
    with pytest.warns(Warning, match="releasing the kept range profiler failed: CUPTI said no"):
        assert _keep.detach_cupti() == "detached"
    assert profiler._init_count == 0 and kept.context.closed == 1
    assert kept.profiler._finalizer.detached  # a profiler that could not be disabled is never touched again
    assert cupti.calls == ["cuptiProfilerInitialize", "cuptiProfilerDeInitialize", "cuptiFinalize"]


def test_an_open_launch_listener_refuses(cupti, monkeypatch):
    monkeypatch.setattr(subscriber, "_open", {object()})
    monkeypatch.setattr(subscriber, "_listening", tuple(subscriber._open))
    assert "launch recorder" in _keep.detach_cupti()
    assert cupti.calls == []


def test_a_paused_launch_recorder_refuses(cupti, monkeypatch):
    """An iteration-mode session between iterations has paused its recorder: it resumes on the subscription a
    detach would have dropped. It used to pass the check (only listening recorders counted)."""
    monkeypatch.setattr(subscriber, "_open", {object()})
    subscribed(cupti, monkeypatch)
    assert _keep.detach_cupti() == (
        "gpuscope is using CUPTI: 1 launch recorder(s) (a gpuscope.Profiler session in kernel, iteration or auto "
        "mode, or a pc_sample block) and 0 module watcher(s) are open")
    assert cupti.calls == [] and subscriber._subscription[0] == 0xABC


def test_a_module_watcher_other_than_gpuscopes_refuses(cupti, monkeypatch):
    monkeypatch.setattr(subscriber, "_module_watchers", (object(),))
    assert "1 module watcher(s) are open" in _keep.detach_cupti()
    assert cupti.calls == []


def test_kernel_activity_records_being_collected_refuse(cupti, monkeypatch):
    monkeypatch.setattr(activity, "_sinks", (object(),))
    assert _keep.detach_cupti() == ("gpuscope is using CUPTI: kernel activity records are being collected "
                                    "(gpuscope.sample(kernels=True), or the kernels of CUDA graph launches in a "
                                    "gpuscope.Profiler session)")
    assert cupti.calls == []


@pytest.mark.parametrize("value", ["0", "off", "false"])
def test_off_when_asked(cupti, monkeypatch, value):
    monkeypatch.setenv(_keep.DETACH_ENV, value)
    assert _keep.detach_cupti() == "off (GPUSCOPE_PC_DETACH=0)"
    assert cupti.calls == []


def test_another_injected_tool_keeps_cupti_attached(cupti, monkeypatch):
    monkeypatch.setenv("CUDA_INJECTION64_PATH", "/opt/nsys/libToolsInjection64.so")
    assert "injected" in _keep.detach_cupti()
    assert cupti.calls == []


def test_the_catalogs_host_objects_are_dropped(cupti, monkeypatch):
    from gpuscope._gpu import metric_lists as _lists

    dropped = []
    monkeypatch.setattr(_lists, "forget_hosts", lambda: dropped.append(True))
    assert _keep.detach_cupti() == "detached" and dropped == [True]


def test_a_module_watcher_is_paused_and_resumed(cupti, monkeypatch):
    events = []

    class Watcher:
        def close(self):
            events.append("close")

    monkeypatch.setattr(_modules, "_watcher", Watcher())
    monkeypatch.setattr(_modules, "watch", lambda: events.append("watch"))
    assert _keep.detach_cupti() == "detached"
    assert events == ["close", "watch"] and cupti.calls == ["cuptiFinalize"]


def test_a_failed_finalize_raises_a_cupti_error_and_leaves_cupti_attached(cupti, monkeypatch):
    cupti.status = 1  # CUPTI_ERROR_INVALID_PARAMETER
    monkeypatch.setattr(_api, "error_message", lambda status: "invalid parameter")
    with pytest.raises(Exception, match="cuptiFinalize"):
        _api.detach()
    assert _api.attached()


def test_every_cupti_call_marks_cupti_attached(monkeypatch):
    monkeypatch.setattr(_api, "_attached", False)
    bound = _api._Bound("cuptiGetVersion", [], None, "cupti", frozenset())
    bound._fn = lambda *args: 0
    bound()
    assert _api.attached()


@pytest.mark.parametrize("holder, said", [(b"kineto", "(kineto)"), (b"not provided", "subscriber, ")])
def test_another_cupti_client_of_the_process_stops_the_detach_before_anything_is_given_back(cupti, holder, said):
    """torch.profiler's Kineto keeps CUPTI's subscriber: cuptiFinalize would wipe its subscriber and activity buffers
    (issue 36 item 5). The refusal comes before gpuscope gives anything back (host objects, the module watcher)."""
    cupti.model.busy_with = holder
    host, setup = _host()
    _hosts._hosts[(0, "GH100", ("m",))] = setup
    text = _keep.detach_cupti()
    assert text.startswith("another CUPTI client of this process holds CUPTI's subscriber") and said in text
    assert "cuptiFinalize" not in cupti.calls and _api.attached()
    assert cupti.model.calls == ["subscribe refused"] and host.closed == 0 and len(_hosts._hosts) == 1


def test_a_free_subscriber_is_asked_for_and_given_back_at_once(cupti):
    assert _keep.detach_cupti() == "detached"
    assert cupti.model.calls[:2] == ["subscribe", ("unsubscribe", 0x5EB)] and subscriber._subscription == []
    assert cupti.calls == ["cuptiFinalize"]


# -- cuptiFinalize at the exit of the detaching thread's own driver call (issue 36 item 5, A) ---------------------
DRIVER, CTX_GET_CURRENT = callbacks.CUPTI_CB_DOMAIN_DRIVER_API, callbacks.CBID_cuCtxGetCurrent


def test_cupti_is_finalized_in_the_exit_callback_of_the_detaching_threads_driver_call(cupti):
    """CUPTI's guide: call cuptiFinalize from the exit call site of a CUDA API call, or other threads may call into
    CUPTI in the middle of it and crash (torch's Kineto did, pytorch/kineto#686). gpuscope called it directly."""
    assert _keep.detach_cupti() == "detached"
    assert cupti.calls == ["cuptiFinalize"] and cupti.sites == [callbacks.CUPTI_API_EXIT]
    assert cupti.threads == [threading.get_ident()]
    # its own subscriber, that one callback enabled, the call; unsubscribed in the callback, then finalized
    assert cupti.model.calls[2:] == ["subscribe", ("enable", 1, CTX_GET_CURRENT), "cuCtxGetCurrent",
                                     ("unsubscribe", 0x5EC), "cuptiFinalize"]


def test_only_the_detaching_threads_own_call_finalizes(cupti, monkeypatch):
    """Another thread's cuCtxGetCurrent at the same moment, the own call's entry, and another driver callback at an
    exit on the detaching thread finalize nothing; the own call's exit does."""
    model = cupti.model
    exit_data = callbacks.CUpti_CallbackData(callbackSite=callbacks.CUPTI_API_EXIT)
    seen = []

    def driver():
        other = threading.Thread(target=model.cuCtxGetCurrent)
        other.start()
        other.join()
        seen.append(list(cupti.calls))  # after another thread's call, entry and exit
        model.call_back(DRIVER, CTX_GET_CURRENT, callbacks.CUPTI_API_ENTER)
        subscriber._dispatch(None, DRIVER, callbacks.CBID_cuLaunchKernel, ctypes.addressof(exit_data))
        seen.append(list(cupti.calls))  # after the own call's entry and another function's exit
        model.call_back(DRIVER, CTX_GET_CURRENT, callbacks.CUPTI_API_EXIT)

    monkeypatch.setattr(_finalize, "_call_the_driver", driver)
    assert _keep.detach_cupti() == "detached"
    assert seen == [[], []] and cupti.calls == ["cuptiFinalize"] and cupti.threads == [threading.get_ident()]


def test_a_failed_finalize_in_the_callback_is_raised_by_the_detach(cupti):
    cupti.status = 1  # CUPTI_ERROR_INVALID_PARAMETER
    with pytest.raises(Exception, match="cuptiFinalize failed"):
        _keep.detach_cupti()
    assert cupti.sites == [callbacks.CUPTI_API_EXIT] and _api.attached()
    assert cupti.model.holder is None and cupti.model.stale == [] and subscriber._exit_call is None


def test_what_the_finalize_raises_in_the_callback_is_raised_on_the_calling_thread(cupti):
    class Boom(Exception):
        pass

    def finalize():
        raise Boom("in the callback")

    with pytest.raises(Boom, match="in the callback"):
        callbacks.finalize_at_api_exit(finalize)
    assert cupti.model.holder is None and subscriber._exit_call is None  # unsubscribed before it


def test_no_callback_at_the_calls_exit_means_no_finalize(cupti, monkeypatch):
    """Where CUPTI does not call back, nothing is finalized (never outside a callback) and the subscriber goes
    back."""
    monkeypatch.setattr(_finalize, "_call_the_driver", lambda: None)
    assert _keep.detach_cupti() == ("CUPTI did not call back at the exit of cuCtxGetCurrent, so cuptiFinalize was "
                                    "not called")
    assert cupti.calls == [] and _api.attached()
    assert cupti.model.holder is None and cupti.model.enabled == set() and subscriber._subscription == []


def test_a_client_that_subscribes_after_the_check_stops_the_finalize(cupti, monkeypatch):
    monkeypatch.setattr(callbacks, "other_client", lambda: None)  # free when asked; Kineto subscribed since
    cupti.model.busy_with = b"kineto"
    assert _keep.detach_cupti() == ("another CUPTI client of this process holds CUPTI's subscriber (kineto), "
                                    "torch.profiler's Kineto for one: cuptiFinalize would wipe its state")
    assert cupti.calls == [] and _api.attached()


def test_after_the_finalize_the_subscriber_state_is_reset_and_set_up_afresh(cupti):
    profiler.initialize()  # a session's, kept with its profiler, then given back by the detach
    keep_a_profiler()
    profiler.deinitialize()
    before = subscriber._generation
    assert _keep.detach_cupti() == "detached"
    assert subscriber._subscription == [] and subscriber._holds == 0 and subscriber._exit_call is None
    finalizing_handle, finalizing_callback = cupti.model.subscribed[-1]
    assert finalizing_callback in subscriber._retired  # CUPTI's C callback: never freed
    assert subscriber._generation > before
    recorder = callbacks.LaunchRecorder(lambda launch: None)  # the next session subscribes afresh
    assert subscriber._subscription[0] == cupti.model.holder[0] == finalizing_handle + 1
    recorder.close()
    assert cupti.model.stale == [] and subscriber._subscription == []


def test_a_cupti_call_that_fails_in_the_detach_is_said_not_raised(cupti, monkeypatch):
    """Without a driver, cuptiSubscribe_v2 answers CUPTI_ERROR_UNKNOWN: PC sampling hears why CUPTI stays attached
    instead of getting a CuptiError from a detach it did not ask for."""
    from gpuscope.errors import cupti_error

    def refuse(*args):
        raise cupti_error(999, "cuptiSubscribe_v2", "CUPTI_ERROR_UNKNOWN")

    monkeypatch.setattr(cupti.model, "cuptiSubscribe_v2", refuse)
    assert _keep.detach_cupti() == ("CUPTI refused gpuscope the subscriber that the detach needs (cuptiSubscribe_v2 "
                                    "failed: CUPTI_ERROR_UNKNOWN (CUptiResult 999)), so cuptiFinalize was not called")
    assert "cuptiFinalize" not in cupti.calls and _api.attached()
