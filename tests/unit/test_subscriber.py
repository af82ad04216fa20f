"""gpuscope holds CUPTI's one callback subscriber only while it listens, names who holds it when it cannot have
it, and counts CUDA graph launches (whose kernels reach no launch callback)."""

import ctypes

import pytest

from gpuscope.cupti import callbacks
from gpuscope.errors import ProfilerBusyError


class FakeCupti:
    def __init__(self, busy_with=None):
        self.calls, self.busy_with = [], busy_with

    def has(self, name):
        return name == "cuptiSubscribe_v2"

    def cuptiSubscribe_v2(self, handle, callback, userdata, params):
        self.calls.append("subscribe")
        if self.busy_with is not None:
            p = ctypes.cast(params, ctypes.POINTER(callbacks._SubscriberParams)).contents
            ctypes.memmove(p.oldSubscriberName, self.busy_with, len(self.busy_with) + 1)
            return 39
        handle._obj.value = 0x5EB
        return 0

    def cuptiUnsubscribe(self, handle):
        self.calls.append(("unsubscribe", handle))

    def cuptiEnableCallback(self, flag, handle, domain, cbid):
        self.calls.append(("enable", flag, cbid))


@pytest.fixture
def fake(monkeypatch):
    cupti = FakeCupti()
    monkeypatch.setattr(callbacks, "_f", cupti)
    monkeypatch.setattr(callbacks, "_subscription", [])
    monkeypatch.setattr(callbacks, "_listening", ())
    monkeypatch.setattr(callbacks, "_module_watchers", ())
    monkeypatch.setattr(callbacks, "_open", set())
    return cupti


def test_the_subscriber_goes_back_when_the_last_listener_closes(fake):
    first = callbacks.LaunchRecorder(lambda launch: None)
    second = callbacks.LaunchRecorder(lambda launch: None)
    assert fake.calls.count("subscribe") == 1 and callbacks._subscription
    first.close()
    assert ("unsubscribe", 0x5EB) not in fake.calls  # the second still listens
    second.close()
    assert ("unsubscribe", 0x5EB) in fake.calls and callbacks._subscription == []
    callbacks.LaunchRecorder(lambda launch: None).close()  # the next session subscribes again
    assert fake.calls.count("subscribe") == 2


def test_a_module_watcher_keeps_the_subscriber_until_it_closes(fake):
    watcher = callbacks.ModuleWatcher(lambda module_id, cubin: None)
    callbacks.LaunchRecorder(lambda launch: None).close()
    assert callbacks._subscription
    watcher.close()
    assert callbacks._subscription == []


def test_another_client_is_named(fake):
    fake.busy_with = b"CUPTI for Kineto"
    with pytest.raises(ProfilerBusyError, match=r"torch.profiler.*\(CUPTI for Kineto\)|\(CUPTI for Kineto\).*torch"):
        callbacks.LaunchRecorder(lambda launch: None)
    assert callbacks._subscription == [] and callbacks._open == set()


def test_a_graph_launch_is_counted_and_is_no_kernel_launch(fake):
    heard, graphs = [], []
    recorder = callbacks.LaunchRecorder(heard.append, on_graph=graphs.append)
    for cbid, correlation in ((callbacks.CBID_cuGraphLaunch, 41), (callbacks.CBID_cuGraphLaunch_ptsz, 57)):
        data = callbacks.CUpti_CallbackData(callbackSite=callbacks.CUPTI_API_ENTER, correlationId=correlation)
        recorder._on_callback(cbid, ctypes.addressof(data))
        data.callbackSite = callbacks.CUPTI_API_EXIT  # the exit of the same call: nothing more
        recorder._on_callback(cbid, ctypes.addressof(data))
    assert recorder.graph_launches == 2 and heard == []
    assert recorder.graph_correlations == {41, 57} and graphs == [41, 57]  # the IDs their kernels' records carry
    recorder.close()


def test_a_failing_graph_hook_is_a_warning_and_the_launch_is_still_counted(fake):
    def fail(correlation):
        raise RuntimeError("no records")

    recorder = callbacks.LaunchRecorder(lambda launch: None, on_graph=fail)
    data = callbacks.CUpti_CallbackData(callbackSite=callbacks.CUPTI_API_ENTER, correlationId=3)
    with pytest.warns(Warning, match="no records"):
        recorder._on_callback(callbacks.CBID_cuGraphLaunch, ctypes.addressof(data))
    assert recorder.graph_launches == 1 and recorder.graph_correlations == {3}
    recorder.close()
