"""The constructor's CUDA and CUPTI work on a thread (``Profiler(first_start_beside=True)`` with a named set, as
``gpuscope run`` makes it): the caller's code starts at once, and the session is the one made on the caller's
thread. The device, its context and CUPTI's profiler are stand-ins; the host API (GH100 config image, metric
properties) and the H100's recorded counter availability are real (no GPU; the H100 run is in
docs/measurements.md)."""

import os
import threading
import time
from types import SimpleNamespace

import pytest

from gpuscope._gpu import device as _device
from gpuscope._gpu import hosts, keep
from gpuscope._range_profiling.session import Profiler
from gpuscope.cupti import _lib, profiler
from gpuscope.errors import GpuscopeWarning, NoGpuError

from .test_found_loops import StandInProfiler
from .test_host import _fake_pm_availability


class Context:
    made = closed = 0

    def __init__(self, index):
        Context.made += 1
        self.handle, self.current_on = 0x1234, []

    def make_current(self):
        self.current_on.append(threading.current_thread().name)

    def unique_id(self):
        return 7

    def close(self):
        Context.closed += 1


@pytest.fixture
def device(monkeypatch):
    """The stand-in device: ``device.calls`` lists the CUDA and CUPTI calls in order, with their thread's name;
    ``device.slow`` is how long ``cuInit`` (device_info) takes; ``device.fail`` what it raises."""
    state = SimpleNamespace(calls=[], slow=0.0, fail=None)

    def call(name):
        state.calls.append((name, threading.current_thread().name))

    def info(index):
        time.sleep(state.slow)
        call("device_info")
        if state.fail is not None:
            raise state.fail
        return _device.DeviceInfo(index, "NVIDIA H100 80GB HBM3", (9, 0), 132, 80 << 30, 1980000, 2619000,
                                  "0000:00:00.0")

    Context.made = Context.closed = 0
    monkeypatch.setattr(_device, "device_info", info)
    monkeypatch.setattr(_device, "PrimaryContext", Context)
    monkeypatch.setattr(_lib, "load_soon", lambda: None)
    monkeypatch.setattr(profiler, "initialize", lambda handle=0: call("initialize"))
    monkeypatch.setattr(profiler, "deinitialize", lambda kept=False: call("deinitialize"))
    monkeypatch.setattr(profiler, "chip_name", lambda index: "GH100")
    monkeypatch.setattr(profiler, "_pm_availability", {})
    monkeypatch.setattr(hosts, "_hosts", {})
    _fake_pm_availability(monkeypatch)
    return state


def test_the_constructor_returns_before_cuda_initialises_and_makes_the_same_session(device):
    made = Profiler("topdown", mode="kernel")  # on the caller's thread
    made.close()
    device.calls.clear()
    hosts._hosts.clear()
    profiler._pm_availability.clear()
    device.slow = 0.3
    t = time.perf_counter()
    p = Profiler("topdown", mode="kernel", first_start_beside=True)
    assert time.perf_counter() - t < 0.25  # the caller's code goes on while CUDA initialises
    assert p._setup_thread.is_alive() and p.chip is None and p.passes is None and device.calls == []
    p._set_up()
    assert [c[1] for c in device.calls] == ["gpuscope-setup", "gpuscope-setup"]
    assert (p.chip, p.metrics, p.passes, p.cycles) == (made.chip, made.metrics, made.passes, made.cycles) == \
        (made.chip, made.metrics, 7, 7)
    assert bytes(p._config) == bytes(made._config) and p.properties == made.properties
    assert p.device_info == made.device_info and p._set_attrs == made._set_attrs
    assert not p._unchecked and p._availability is not None  # the thread asked CUPTI itself: nothing to check later
    p.close()
    assert [c[0] for c in device.calls] == ["device_info", "initialize", "deinitialize"]
    assert Context.made == Context.closed == 2


@pytest.mark.parametrize("kwargs", [
    {"metrics": ["sm__cycles_elapsed.max"], "mode": "kernel"},  # a list: its names are checked on the chip first
    {"metrics": "topdown", "mode": "kernel", "pass_groups": "ncu"},  # a layout measured on one chip only
    {"metrics": "topdown", "mode": "kernel", "pass_groups": "cupti"},
    {"metrics": "topdown", "mode": "iteration"},
    {"metrics": "topdown", "mode": "user"},
    {"metrics": "topdown", "mode": "kernel", "first_start_beside": False},
])
def test_what_can_be_wrong_on_another_chip_is_said_before_the_callers_code(device, kwargs):
    kwargs = {"first_start_beside": True, **kwargs}
    p = Profiler(kwargs.pop("metrics"), **kwargs)
    assert p._setup_thread is None and p.chip == "GH100" and p.passes >= 1
    p.close()


def test_an_unknown_metric_name_is_said_by_the_constructor(device):
    from gpuscope.errors import UnknownMetricError

    with pytest.raises(UnknownMetricError, match="topdwn"):  # not a set's name: checked on the chip, at once
        Profiler("topdwn", mode="kernel", first_start_beside=True)
    assert {c[1] for c in device.calls} == {"MainThread"} and Context.made == Context.closed == 1


def test_a_setup_that_fails_on_the_thread_profiles_nothing_says_so_at_the_first_launch_and_the_close_raises(device):
    from gpuscope.cupti._types import ProfilerRange, ReplayMode

    device.fail = NoGpuError("no NVIDIA GPU is visible to this process")
    p = Profiler("topdown", mode="auto", first_start_beside=True)
    p._state, p._pid, p._thread = "open", os.getpid(), threading.get_ident()  # as start() leaves it
    p._start_first_soon((ProfilerRange.AUTO, ReplayMode.KERNEL, 64))
    with pytest.warns(GpuscopeWarning, match="could not start .*no NVIDIA GPU.*nothing is profiled"):
        assert p._on_enter(SimpleNamespace(symbol="fill", context=0x1234)) is None
    assert p._rows == [] and p._collector is None
    with pytest.raises(NoGpuError, match="no NVIDIA GPU"):
        p.close()
    assert p._state == "closed" and [c[0] for c in device.calls] == ["device_info"]  # nothing to undo
    assert Context.made == 0
    from gpuscope.errors import SessionConflictError

    with pytest.raises(SessionConflictError, match="could not be set up .*no NVIDIA GPU.*nothing was profiled"):
        p.dataset


def test_a_session_closed_before_it_started_waits_for_its_setup_and_undoes_it(device):
    before = {t.name for t in threading.enumerate()}
    device.slow = 0.1
    p = Profiler("topdown", mode="kernel", first_start_beside=True)
    p.close()
    assert [c[0] for c in device.calls] == ["device_info", "initialize", "deinitialize"]
    assert Context.made == Context.closed == 1 and p._state == "closed"
    assert "gpuscope-setup" not in {t.name for t in threading.enumerate()} - before


def test_start_leaves_every_cuda_call_to_the_threads_and_the_first_launch_finds_the_session_made(device, monkeypatch):
    """``start()`` on the caller's thread makes no CUDA call (the rendezvous is named by the GPU's PCI id, so it is
    opened on the first Start's thread too): the launch callbacks are in place at once, and the first launch waits
    for the setup, the Enable and the first Start."""
    from gpuscope._gpu import modules as _modules
    from gpuscope.cupti import callbacks

    opened = []
    monkeypatch.setattr(keep, "session_open", lambda d, what: opened.append(threading.current_thread().name))
    monkeypatch.setattr(keep, "session_closed", lambda d, what: opened.append("closed"))
    monkeypatch.setattr(_modules, "watch", lambda: None)
    monkeypatch.setattr(_modules, "pause", lambda: None)
    monkeypatch.setattr(callbacks, "LaunchRecorder", lambda *a: SimpleNamespace(close=lambda: None, graph_launches=0))
    made = []

    def configure(self, range_mode, replay_mode, ranges, depth=1):
        made.append(threading.current_thread().name)
        self._rp, self._key, self._reused_now = StandInProfiler(self.passes, int(replay_mode)), ("stand-in",), False

    monkeypatch.setattr(Profiler, "_configure", configure)
    device.slow = 0.3
    t = time.perf_counter()
    p = Profiler("topdown", mode="kernel", first_start_beside=True).start()
    assert time.perf_counter() - t < 0.25 and p._state == "open" and p.mode_used.value == "kernel"
    assert device.calls == [] and opened == [] and p._collector is None  # all of it on the threads
    assert p._first_started()  # as the first launch does
    assert {c[1] for c in device.calls} == {"gpuscope-setup"} and opened == made == ["gpuscope-first-start"]
    assert p._context.current_on == ["gpuscope-first-start"] and p._context_id == 7
    assert p._collector.context == 0x1234 and p._collector.rp is p._rp and p._rp.started and p._first_taken
    assert "session_start_ns" in p._notes
    rp = p._rp
    p._teardown()
    assert rp.closed and opened[-1] == "closed" and Context.closed == 1


def test_without_a_driver_start_raises_the_setups_reason_not_what_cupti_said_after_it(device, monkeypatch):
    """Without a driver CUPTI refuses the launch callbacks with UNKNOWN: start() raises the setup's own error, as
    the constructor did when it made the setup itself (checked on a machine without a driver: the same message and
    exit status from ``gpuscope run`` as before)."""
    import warnings

    from gpuscope._gpu import modules as _modules
    from gpuscope.cupti import callbacks
    from gpuscope.errors import CuptiError

    def refused(*args):
        raise CuptiError("cuptiSubscribe_v2 failed: CUPTI_ERROR_UNKNOWN (CUptiResult 999)")

    monkeypatch.setattr(keep, "session_open", lambda d, what: pytest.fail("no session to tell others of"))
    monkeypatch.setattr(_modules, "watch", lambda: None)
    monkeypatch.setattr(_modules, "pause", lambda: None)
    monkeypatch.setattr(callbacks, "LaunchRecorder", refused)
    device.fail, device.slow = NoGpuError("The NVIDIA driver is not available on this machine"), 0.1
    p = Profiler("topdown", mode="kernel", first_start_beside=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # raised once, not also warned
        with pytest.raises(NoGpuError, match="driver is not available"):
            p.start()
    assert p._state == "failed" and p._first_thread is None and Context.made == 0
    assert "gpuscope-first-start" not in {t.name for t in threading.enumerate()}
