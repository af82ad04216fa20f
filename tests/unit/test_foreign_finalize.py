"""Another CUPTI client of the process calls cuptiFinalize (torch.profiler's Kineto does at the end of a profile in
some versions): CUPTI forgets gpuscope's subscriber, the kept range profiler and the CUPTI profiler's initialisation.
gpuscope must see it before it reuses any of them, drop them without a CUPTI call (they are gone), say so once, and
set up afresh (issue 36 item 5, B). No GPU: CUPTI's callback API is the model of tests/unit/test_subscriber.py."""

import warnings

import pytest

from gpuscope._gpu import keep as _keep
from gpuscope.cupti import _api, callbacks, profiler, subscriber
from gpuscope.errors import GpuscopeWarning, ProfilerBusyError, cupti_error

from .test_detach import cupti, keep_a_profiler  # noqa: F401 (fixture)

SAID = "Another CUPTI client of this process finalized CUPTI"
RESOURCE = (callbacks.CUPTI_CB_DOMAIN_RESOURCE, callbacks.CUPTI_CBID_RESOURCE_MODULE_LOADED)
LAUNCH = (callbacks.CUPTI_CB_DOMAIN_DRIVER_API, callbacks.CBID_cuLaunchKernel)


def said(record) -> int:
    return sum(SAID in str(w.message) for w in record if issubclass(w.category, GpuscopeWarning))


def test_a_subscriber_cupti_forgot_is_never_used_and_a_fresh_one_serves_what_is_open(cupti):  # noqa: F811
    """The module watcher holds gpuscope's subscriber for the rest of the process; after another client's
    cuptiFinalize a kernel-mode session enabled its launch callbacks on a handle CUPTI no longer knew."""
    watcher = callbacks.ModuleWatcher(lambda module_id, cubin: None)
    stale = subscriber._subscription[0]
    cupti.model.finalize_by_another_client()
    with pytest.warns(GpuscopeWarning, match=SAID) as record:
        recorder = callbacks.LaunchRecorder(lambda launch: None)
    assert said(record) == 1 and cupti.model.stale == []
    fresh = subscriber._subscription[0]
    assert fresh != stale and cupti.model.holder[0] == fresh
    assert {RESOURCE, LAUNCH} <= cupti.model.enabled  # the open watcher hears module loads again
    recorder.close()
    watcher.close()
    assert cupti.model.stale == [] and subscriber._subscription == [] and cupti.model.holder is None
    assert ("unsubscribe", stale) not in cupti.model.calls


@pytest.mark.parametrize("then", [b"CUPTI for <not provided>", b"CUPTI for nsys"])
def test_after_a_finalize_and_another_clients_subscribe_the_next_session_is_told_who_holds_it(cupti, then):  # noqa: F811
    """Kineto subscribes again right after its teardown (unless it initialises lazily): CUPTI's refusal then names
    Kineto, not gpuscope, so gpuscope's handle is gone too."""
    watcher = callbacks.ModuleWatcher(lambda module_id, cubin: None)
    cupti.model.finalize_by_another_client(then_subscribes=then)
    with pytest.warns(GpuscopeWarning, match=SAID), pytest.raises(ProfilerBusyError, match="torch.profiler"):
        callbacks.LaunchRecorder(lambda launch: None)
    assert subscriber._subscription == [] and cupti.model.stale == []
    cupti.model.busy_with = None  # that client goes: the next session subscribes, and the watcher hears again
    recorder = callbacks.LaunchRecorder(lambda launch: None)
    assert {RESOURCE, LAUNCH} <= cupti.model.enabled
    recorder.close()
    watcher.close()
    assert cupti.model.stale == [] and cupti.model.holder is None


def test_a_probe_answered_not_initialized_means_cupti_was_finalized(cupti, monkeypatch):  # noqa: F811
    watcher = callbacks.ModuleWatcher(lambda module_id, cubin: None)
    cupti.model.finalize_by_another_client()

    def not_initialized(*args):
        raise cupti_error(15, "cuptiSubscribe_v2", "not initialized")

    monkeypatch.setattr(cupti.model, "cuptiSubscribe_v2", not_initialized)
    with pytest.warns(GpuscopeWarning, match=SAID):
        assert not callbacks.known()
    assert subscriber._subscription == []
    watcher.close()
    assert cupti.model.stale == []


def test_cupti_refusing_the_profiler_right_after_the_finalize_is_attached_again_through_the_context(cupti,  # noqa: F811
                                                                                                  monkeypatch):
    """Right after a cuptiFinalize, CUPTI 13.0 answers cuptiProfilerInitialize NOT_INITIALIZED until a call names a
    context (measured on the H100): the session's own context, or the thread's current one, attaches it again."""
    keep_a_profiler()
    cupti.model.finalize_by_another_client()
    attached_through = []

    def initialize(p):
        if not attached_through:
            raise cupti_error(15, "cuptiProfilerInitialize", "not initialized")
        cupti.calls.append("cuptiProfilerInitialize")

    monkeypatch.setattr(profiler._f, "cuptiProfilerInitialize", initialize)
    monkeypatch.setattr(_api, "reattach", attached_through.append)
    profiler._after_detach()  # what a session does when CUPTI refuses the kept profiler (Profiler._start_first)
    profiler.initialize(0xC0)
    assert attached_through == [0xC0] and cupti.calls[-1] == "cuptiProfilerInitialize"
    assert profiler._init_count == 1


def test_without_a_foreign_finalize_the_kept_profiler_is_reused_and_nothing_is_said(cupti):  # noqa: F811
    kept = keep_a_profiler()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        profiler.initialize()
        assert _keep.take(0, kept.key, 7) is kept
    assert kept.profiler.closed == 0 and not kept.profiler._finalizer.detached
    assert cupti.calls == ["cuptiProfilerInitialize"] and profiler._init_count == 2


def test_nothing_is_kept_while_another_client_holds_the_subscriber(cupti):  # noqa: F811
    """That client could finalize CUPTI at any time without gpuscope seeing it (Kineto keeps the subscriber from
    its first profile on and finalizes at the end of each in some versions): the profiler is released at once."""
    cupti.model.busy_with = b"CUPTI for <not provided>"
    kept = keep_a_profiler()
    assert kept.witness is None
    assert kept.profiler.closed == 1 and _keep.kept_devices() == []
    assert cupti.calls == ["cuptiProfilerInitialize", "cuptiProfilerDeInitialize"]


def test_a_witness_that_cupti_cannot_give_keeps_as_before(cupti, monkeypatch):  # noqa: F811
    """Where CUPTI cannot answer the subscribe (no GPU, a broken install), keeping goes on unverified."""
    def unknown(*args):
        raise cupti_error(999, "cuptiSubscribe_v2", "unknown")

    monkeypatch.setattr(cupti.model, "cuptiSubscribe_v2", unknown)
    kept = keep_a_profiler()
    assert kept.witness == 0 and _keep.kept_devices() == [0]
    assert _keep.take(0, kept.key, 7) is kept


def test_while_only_a_profiler_is_kept_the_subscriber_is_free_for_another_client(cupti):  # noqa: F811
    """Held while gpuscope merely kept a profiler, the subscriber was taken from torch.profiler, whose Kineto then
    recorded no GPU event (H100, PyTorch 2.11: tests/gpu/test_pytorch.py). A session holds it while open."""
    kept = keep_a_profiler()
    assert cupti.model.holder is None and subscriber._subscription == [] and subscriber._holds == 0
    assert kept.witness == 0 and _keep.kept_devices() == [0]
    profiler.initialize()  # the next session: it holds the subscriber while it is open
    assert cupti.model.holder == tuple(subscriber._subscription) and subscriber._holds == 1
    profiler.deinitialize()
    assert cupti.model.holder is None and subscriber._holds == 0 and profiler._init_count == 1  # the kept one's
    assert _keep.release() == 1 and profiler._init_count == 0


def test_a_session_beside_the_one_that_keeps_keeps_the_subscriber(cupti):  # noqa: F811
    """A PM sampler open while a range session ends and keeps its profiler: the open one still holds it."""
    profiler.initialize()  # the PM sampler, open
    keep_a_profiler()  # the range session's, kept
    assert cupti.model.holder is not None and subscriber._holds == 1
    profiler.deinitialize()  # the PM sampler closes: only the kept one is left
    assert cupti.model.holder is None and subscriber._holds == 0 and profiler._init_count == 1


class _Refusing:
    def __init__(self):
        self.started, self.closed = 0, 0
        self._finalizer = type("F", (), {"detached": False, "detach": lambda f: setattr(f, "detached", True)})()

    def start(self):
        raise cupti_error(1, "cuptiRangeProfilerStart", "CUPTI_ERROR_INVALID_PARAMETER")


class _Fresh:
    started = 0

    def start(self):
        self.started += 1


class _Session:
    """The parts of a gpuscope.Profiler that its first Start touches."""
    from gpuscope._range_profiling.session import Profiler as _P
    _start_first = _P._start_first

    def __init__(self, reused):
        self._rp, self._key, self._reused_now = _Refusing(), ("key",), reused
        self._configured, self.configured = ("user", "user", 64, 1), []
        self._context = type("C", (), {"handle": 0xC0})()

    def _configure(self, *args):
        self.configured.append(args)
        self._rp = _Fresh()


def test_a_kept_profiler_cupti_refuses_is_dropped_untouched_and_the_session_sets_up_afresh(monkeypatch):
    """A finalize by another client while nothing of gpuscope's is open is not seen (the subscriber is free then):
    CUPTI then refuses the kept profiler at the session's first Start (INVALID_PARAMETER on the H100)."""
    calls = []
    monkeypatch.setattr(profiler, "_after_detach", lambda: calls.append("forgotten"))
    monkeypatch.setattr(profiler, "initialize", lambda context=0: calls.append(("initialize", context)))
    session = _Session(reused=True)
    stale = session._rp
    with pytest.warns(GpuscopeWarning, match="another CUPTI client of this process finalized CUPTI"):
        session._start_first()
    assert stale.closed == 0 and stale._finalizer.detached  # never disabled: CUPTI forgot it
    assert calls == ["forgotten", ("initialize", 0xC0)] and session.configured == [("user", "user", 64, 1)]
    assert session._rp.started == 1 and session._key is None


def test_a_new_profiler_cupti_refuses_is_an_error_as_before():
    session = _Session(reused=False)
    with pytest.raises(Exception, match="INVALID_PARAMETER"):
        session._start_first()
    assert session.configured == []
