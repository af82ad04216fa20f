"""gpuscope holds CUPTI's one callback subscriber only while it listens, names who holds it when it cannot have
it, and counts CUDA graph launches (whose kernels reach no launch callback)."""

import ctypes
import threading

import pytest

from gpuscope.cupti import callbacks, subscriber
from gpuscope.errors import ProfilerBusyError, cupti_error


class FakeCupti:
    """CUPTI's callback API as gpuscope uses it, and the driver call it hears.

    One subscriber per process: a second ``cuptiSubscribe_v2`` is refused (39) and names the holder, "CUPTI for
    gpuscope" or *busy_with* (another client). Callbacks are enabled per subscriber. ``cuptiFinalize`` (gpuscope's,
    or another client's: :meth:`finalize_by_another_client`) forgets every subscriber; a call with a handle CUPTI
    does not know is recorded in :attr:`stale` and fails (INVALID_PARAMETER). :meth:`cuCtxGetCurrent` is the
    driver's: it calls the subscriber's C callback at its entry and exit, on the calling thread, where enabled.
    ``calls`` has "subscribe" for a subscription made and "subscribe refused" for one refused."""

    def __init__(self, busy_with=None):
        self.calls, self.busy_with = [], busy_with
        self.holder = None  # (handle, C callback) of gpuscope's subscriber while CUPTI knows it
        self.subscribed: list = []  # every (handle, C callback) CUPTI was given
        self.enabled: set = set()  # (domain, cbid) enabled on it
        self.stale: list = []
        self.next_handle = 0x5EB
        self.finalize_status = 0
        self.site = None  # the callback site CUPTI is calling back from on this thread, if any

    def has(self, name):
        return name == "cuptiSubscribe_v2"

    def cuptiSubscribe_v2(self, handle, callback, userdata, params):
        incumbent = self.busy_with or (b"CUPTI for gpuscope" if self.holder else None)
        if incumbent is not None:
            self.calls.append("subscribe refused")
            p = ctypes.cast(params, ctypes.POINTER(subscriber._SubscriberParams)).contents
            ctypes.memmove(p.oldSubscriberName, incumbent, len(incumbent) + 1)
            return 39
        self.calls.append("subscribe")
        handle._obj.value = self.next_handle
        self.holder = (self.next_handle, callback)
        self.subscribed.append(self.holder)
        self.next_handle += 1
        return 0

    def _known(self, name, handle):
        if self.holder is None or self.holder[0] != handle:
            self.stale.append((name, handle))
            raise cupti_error(1, name, "invalid parameter")

    def cuptiUnsubscribe(self, handle):
        self.calls.append(("unsubscribe", handle))
        self._known("cuptiUnsubscribe", handle)
        self.holder = None
        self.enabled.clear()
        return 0

    def cuptiEnableCallback(self, flag, handle, domain, cbid):
        self.calls.append(("enable", flag, cbid))
        self._known("cuptiEnableCallback", handle)
        (self.enabled.add if flag else self.enabled.discard)((domain, cbid))
        return 0

    def cuptiFinalize(self):
        self.calls.append("cuptiFinalize")
        if self.finalize_status == 0:
            self.holder = None
            self.enabled.clear()
        return self.finalize_status

    def finalize_by_another_client(self, then_subscribes=None):
        """Another CUPTI client of the process calls cuptiFinalize (Kineto's teardown): every subscriber is forgotten;
        *then_subscribes* (its name) subscribes after, as Kineto does unless it initialises lazily."""
        self.holder = None
        self.enabled.clear()
        self.busy_with = then_subscribes

    def cuCtxGetCurrent(self):
        self.calls.append("cuCtxGetCurrent")
        for site in (callbacks.CUPTI_API_ENTER, callbacks.CUPTI_API_EXIT):
            self.call_back(callbacks.CUPTI_CB_DOMAIN_DRIVER_API, callbacks.CBID_cuCtxGetCurrent, site)

    def call_back(self, domain, cbid, site):
        """CUPTI calling the subscriber back at *site* of a call on this thread, where the callback is enabled."""
        if self.holder is not None and (domain, cbid) in self.enabled:
            data = callbacks.CUpti_CallbackData(callbackSite=site)
            self.site = site
            try:
                self.holder[1](None, domain, cbid, ctypes.addressof(data))  # through the C callback, as CUPTI does
            finally:
                self.site = None


@pytest.fixture
def fake(monkeypatch):
    cupti = FakeCupti()
    monkeypatch.setattr(subscriber, "_f", cupti)
    monkeypatch.setattr(subscriber, "_subscription", [])
    monkeypatch.setattr(subscriber, "_listening", ())
    monkeypatch.setattr(subscriber, "_module_watchers", ())
    monkeypatch.setattr(subscriber, "_open", set())
    monkeypatch.setattr(subscriber, "_nvtx_watchers", ())
    monkeypatch.setattr(subscriber, "_holds", 0)
    return cupti


def test_the_subscriber_goes_back_when_the_last_listener_closes(fake):
    first = callbacks.LaunchRecorder(lambda launch: None)
    second = callbacks.LaunchRecorder(lambda launch: None)
    assert fake.calls.count("subscribe") == 1 and subscriber._subscription
    first.close()
    assert ("unsubscribe", 0x5EB) not in fake.calls  # the second still listens
    second.close()
    assert ("unsubscribe", 0x5EB) in fake.calls and subscriber._subscription == []
    callbacks.LaunchRecorder(lambda launch: None).close()  # the next session subscribes again
    assert fake.calls.count("subscribe") == 2


def test_a_module_watcher_keeps_the_subscriber_until_it_closes(fake):
    watcher = callbacks.ModuleWatcher(lambda module_id, cubin: None)
    callbacks.LaunchRecorder(lambda launch: None).close()
    assert subscriber._subscription
    watcher.close()
    assert subscriber._subscription == []


def test_another_client_is_named(fake):
    fake.busy_with = b"CUPTI for Kineto"
    with pytest.raises(ProfilerBusyError, match=r"torch.profiler.*\(CUPTI for Kineto\)|\(CUPTI for Kineto\).*torch"):
        callbacks.LaunchRecorder(lambda launch: None)
    assert subscriber._subscription == [] and subscriber._open == set()


def test_a_graph_launch_is_counted_and_is_no_kernel_launch(fake):
    heard, graphs = [], []
    recorder = callbacks.LaunchRecorder(heard.append, on_graph=lambda c, params: graphs.append(c))
    for cbid, correlation in ((callbacks.CBID_cuGraphLaunch, 41), (callbacks.CBID_cuGraphLaunch_ptsz, 57)):
        data = callbacks.CUpti_CallbackData(callbackSite=callbacks.CUPTI_API_ENTER, correlationId=correlation)
        recorder._on_callback(cbid, ctypes.addressof(data))
        data.callbackSite = callbacks.CUPTI_API_EXIT  # the exit of the same call: nothing more
        recorder._on_callback(cbid, ctypes.addressof(data))
    assert recorder.graph_launches == 2 and heard == []
    assert recorder.graph_correlations == {41, 57} and graphs == [41, 57]  # the IDs their kernels' records carry
    recorder.close()


def test_a_failing_graph_hook_is_a_warning_and_the_launch_is_still_counted(fake):
    def fail(correlation, params):
        raise RuntimeError("no records")

    recorder = callbacks.LaunchRecorder(lambda launch: None, on_graph=fail)
    data = callbacks.CUpti_CallbackData(callbackSite=callbacks.CUPTI_API_ENTER, correlationId=3)
    with pytest.warns(Warning, match="no records"):
        recorder._on_callback(callbacks.CBID_cuGraphLaunch, ctypes.addressof(data))
    assert recorder.graph_launches == 1 and recorder.graph_correlations == {3}
    recorder.close()


# -- what a launch callback reads from the driver call's parameters ------------------------------------------------
# The parameter structs as cuda.h and generated_cuda_meta.h lay them out, whole: gpuscope reads only their leading
# fields (callbacks._LaunchParams, _LaunchExParams), at the offsets these give.

class CuLaunchKernelParams(ctypes.Structure):  # cuLaunchKernel_params, cuLaunchCooperativeKernel_params
    _fields_ = ([("f", ctypes.c_void_p)]
                + [(n, ctypes.c_uint) for n in ("gridDimX", "gridDimY", "gridDimZ", "blockDimX", "blockDimY",
                                                 "blockDimZ", "sharedMemBytes")]
                + [("hStream", ctypes.c_void_p), ("kernelParams", ctypes.c_void_p), ("extra", ctypes.c_void_p)])


class CUlaunchConfig(ctypes.Structure):
    _fields_ = ([(n, ctypes.c_uint) for n in ("gridDimX", "gridDimY", "gridDimZ", "blockDimX", "blockDimY",
                                               "blockDimZ", "sharedMemBytes")]
                + [("hStream", ctypes.c_void_p), ("attrs", ctypes.c_void_p), ("numAttrs", ctypes.c_uint)])


class CuLaunchKernelExParams(ctypes.Structure):  # cuLaunchKernelEx_params
    _fields_ = [("config", ctypes.POINTER(CUlaunchConfig)), ("f", ctypes.c_void_p),
                ("kernelParams", ctypes.c_void_p), ("extra", ctypes.c_void_p)]


def _heard(cbid, params):
    """The Launch a recorder hears at the entry of a launch call with *params*."""
    heard = []
    recorder = callbacks.LaunchRecorder(heard.append)
    data = callbacks.CUpti_CallbackData(callbackSite=callbacks.CUPTI_API_ENTER, symbolName=b"_Z4tilePf",
                                        context=0xC7, functionParams=ctypes.addressof(params))
    recorder._on_callback(cbid, ctypes.addressof(data))
    recorder.close()
    (launch,) = heard
    return launch


@pytest.mark.parametrize("cbid", [callbacks.CBID_cuLaunchKernel, callbacks.CBID_cuLaunchKernel_ptsz,
                                  callbacks.CBID_cuLaunchCooperativeKernel])
def test_a_launch_carries_its_function_and_dynamic_shared_memory(fake, cbid):
    params = CuLaunchKernelParams(0x7F00DEAD0000, 64, 2, 1, 128, 2, 1, 6144, 0x5, 0x6, 0x7)
    launch = _heard(cbid, params)
    assert launch == callbacks.Launch("_Z4tilePf", (64, 2, 1), (128, 2, 1), 0xC7, 0x7F00DEAD0000, 6144, 0x5)


@pytest.mark.parametrize("cbid", [callbacks.CBID_cuLaunchKernelEx, callbacks.CBID_cuLaunchKernelEx_ptsz])
def test_a_launch_ex_carries_its_function_and_the_configs_dynamic_shared_memory(fake, cbid):
    config = CUlaunchConfig(132, 1, 1, 384, 1, 1, 213188, 0x5, 0x8, 1)
    params = CuLaunchKernelExParams(ctypes.pointer(config), 0x7F00BEEF0000, 0x6, 0x7)
    launch = _heard(cbid, params)
    assert (launch.grid, launch.block, launch.function, launch.shared_dynamic, launch.stream) == (
        (132, 1, 1), (384, 1, 1), 0x7F00BEEF0000, 213188, 0x5)


def test_a_launch_without_a_function_handle_says_0(fake):
    launch = _heard(callbacks.CBID_cuLaunchKernel, CuLaunchKernelParams(None, 1, 1, 1, 32, 1, 1, 0))
    assert (launch.function, launch.shared_dynamic) == (0, 0)
    made = callbacks.Launch("k", (1, 1, 1), (32, 1, 1), 1)  # as before: symbol, grid, block, context
    assert (made.function, made.shared_dynamic) == (0, 0)


# -- a call's exit matched to its entry by correlation ID -----------------------------------------------------------
def _call(recorder, site, correlation, params):
    data = callbacks.CUpti_CallbackData(callbackSite=site, correlationId=correlation, symbolName=b"_Z1kv",
                                        functionParams=ctypes.addressof(params))
    recorder._on_callback(callbacks.CBID_cuLaunchKernel, ctypes.addressof(data))


def test_an_exit_whose_entry_was_not_heard_leaves_the_pending_calls_alone(fake):
    """A call entered while the recorder was paused exits after its resume: the calls pending under it on the same
    thread keep their tokens (before, the exit popped the last pending token, someone else's)."""
    params = CuLaunchKernelParams(None, 1, 1, 1, 32, 1, 1, 0)
    exited, lost = [], []
    recorder = callbacks.LaunchRecorder(lambda launch: object(), exited.append, on_lost=lambda t, th: lost.append(t))
    _call(recorder, callbacks.CUPTI_API_ENTER, 7, params)
    (outer,) = recorder._pending.stack
    _call(recorder, callbacks.CUPTI_API_EXIT, 99, params)  # an exit never entered
    assert exited == [] and lost == [] and len(recorder._pending.stack) == 1
    _call(recorder, callbacks.CUPTI_API_EXIT, 7, params)
    assert exited == [outer[1]] and recorder._pending.stack == []
    recorder.close()


def test_a_nested_call_whose_exit_was_lost_is_given_up_at_the_outer_exit(fake):
    params = CuLaunchKernelParams(None, 1, 1, 1, 32, 1, 1, 0)
    tokens = iter(["outer", "inner"])
    exited, lost = [], []
    recorder = callbacks.LaunchRecorder(lambda launch: next(tokens), exited.append,
                                        on_lost=lambda t, th: lost.append((t, th)))
    _call(recorder, callbacks.CUPTI_API_ENTER, 1, params)
    _call(recorder, callbacks.CUPTI_API_ENTER, 2, params)
    _call(recorder, callbacks.CUPTI_API_EXIT, 1, params)  # the inner call's exit never came
    assert exited == ["outer"] and lost == [("inner", threading.get_ident())]
    recorder.close()


def test_calls_pending_across_a_pause_are_given_up_at_resume_on_every_thread(fake):
    """The recorder paused (between iterations, by the session's thread) while another thread's launch ran: that
    launch's exit is never heard, so its token is given up at resume, with its thread, and a late exit of it is
    ignored."""
    params = CuLaunchKernelParams(None, 1, 1, 1, 32, 1, 1, 0)
    exited, lost = [], []
    recorder = callbacks.LaunchRecorder(lambda launch: "theirs", exited.append,
                                        on_lost=lambda t, th: lost.append((t, th)))
    other = {}

    def launch_on_another_thread():
        _call(recorder, callbacks.CUPTI_API_ENTER, 5, params)
        other["ident"] = threading.get_ident()

    t = threading.Thread(target=launch_on_another_thread)
    t.start()
    t.join()
    recorder.pause()
    assert lost == []  # it may still be running: given up only once the recorder hears launches again
    recorder.resume()
    assert lost == [("theirs", other["ident"])] and exited == []
    recorder.resume()
    assert len(lost) == 1  # once
    recorder.close()


def test_a_graph_launch_pending_across_a_pause_is_kept_for_its_exit(fake):
    """A graph launch was handed an empty graph at its entry and its nodes run at its exit: giving it up at the
    resume would lose the graph's work where the call was still in flight. Its exit, heard after the resume, runs."""
    exited, lost = [], []
    recorder = callbacks.LaunchRecorder(lambda launch: None, lambda token: None, on_graph=lambda c, p: "nodes",
                                        on_graph_exit=exited.append, on_lost=lambda t, th: lost.append(t))
    data = callbacks.CUpti_CallbackData(callbackSite=callbacks.CUPTI_API_ENTER, correlationId=9)
    recorder._on_callback(callbacks.CBID_cuGraphLaunch, ctypes.addressof(data))
    recorder.pause()
    recorder.resume()
    assert lost == [] and exited == []
    data.callbackSite = callbacks.CUPTI_API_EXIT
    recorder._on_callback(callbacks.CBID_cuGraphLaunch, ctypes.addressof(data))
    assert exited == ["nodes"]
    recorder.close()
