"""Detaching CUPTI before PC sampling (gpuscope._gpu.keep.detach_cupti, gpuscope.cupti._api.detach), without a GPU:
CUPTI's cuptiFinalize is replaced by a recorder."""

import pytest

from gpuscope._gpu import keep as _keep
from gpuscope._gpu import modules as _modules
from gpuscope.cupti import _api, activity, callbacks, profiler


class FakeCupti:
    def __init__(self, status=0):
        self.calls = []
        self.status = status

        def finalize():
            self.calls.append("cuptiFinalize")
            return self.status

        self.cuptiFinalize = finalize


class FakeHost:
    def __init__(self):
        self.closed = 0

    def close(self):
        self.closed += 1


@pytest.fixture
def cupti(monkeypatch):
    fake = FakeCupti()
    monkeypatch.setattr(_api, "_cdll", lambda which: fake)
    monkeypatch.setattr(_api, "_attached", True)
    monkeypatch.delenv(_keep.DETACH_ENV, raising=False)  # on by default
    monkeypatch.delenv("CUDA_INJECTION64_PATH", raising=False)
    monkeypatch.setattr(callbacks, "_subscription", [])
    monkeypatch.setattr(activity, "_registered", [])
    monkeypatch.setattr(_keep, "_hosts", {})
    return fake


def _host():
    host = FakeHost()
    return host, _keep.HostSetup(host=host, config=None, passes=1, properties={})


def test_detach_finalizes_and_forgets_hosts_and_subscription(cupti, monkeypatch):
    unsubscribed = []
    monkeypatch.setattr(callbacks, "_subscription", [0xABC, object()])
    monkeypatch.setattr(callbacks._f, "cuptiUnsubscribe", lambda handle: unsubscribed.append(handle))
    monkeypatch.setattr(activity, "_registered", ["requested", "completed"])
    monkeypatch.setattr(activity._f, "cuptiActivityFlushAll", lambda flag: 0)
    host, setup = _host()
    _keep._hosts[(0, "GH100", ("m",))] = setup
    assert _keep.detach_cupti() == "detached"
    assert cupti.calls == ["cuptiFinalize"]
    assert unsubscribed == [0xABC] and callbacks._subscription == [] and activity._registered == []
    assert host.closed == 1 and _keep._hosts == {}
    assert not _api.attached()
    assert _keep.detach_cupti() == "not attached" and cupti.calls == ["cuptiFinalize"]


def test_an_open_session_refuses_and_nothing_is_dropped(cupti, monkeypatch):
    monkeypatch.setattr(profiler, "_init_count", 1)
    host, setup = _host()
    _keep._hosts[(0, "GH100", ("m",))] = setup
    why = _keep.detach_cupti()
    assert why.startswith("a gpuscope session is open") and "initialised" in why
    assert cupti.calls == [] and host.closed == 0 and len(_keep._hosts) == 1 and _api.attached()


def test_an_open_launch_listener_refuses(cupti, monkeypatch):
    monkeypatch.setattr(callbacks, "_listening", (object(),))
    assert "launch listener" in _keep.detach_cupti()
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
