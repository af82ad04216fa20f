"""The range profiler's first Start made on a thread while the caller's code goes on (``Profiler.first_start_beside``,
set by ``gpuscope run``): the first launch, range or close waits for it, and the rows are those of a Start made
first (a Profiler over a stand-in range profiler: no GPU; the H100 run is in docs/measurements.md)."""

import threading
import time
from types import SimpleNamespace

import pytest

from .test_found_loops import auto, feed, rows  # noqa: F401  (auto: the stand-in session's fixture)


@pytest.fixture
def session(request):
    """make(passes) -> an open auto-mode Profiler over stand-in profilers (test_found_loops's ``auto``)."""
    return request.getfixturevalue("auto")


def beside(p, start_takes: float = 0.0, refuse: Exception | None = None):
    """Start *p*'s stand-in profiler on the thread, the Start taking *start_takes* seconds or raising *refuse*;
    returns the list of events in order ("start done", "launch <symbol>")."""
    events = []
    rp = p._rp
    start = rp.start

    def slow_start():
        time.sleep(start_takes)
        if refuse is not None:
            raise refuse
        start()
        events.append("start done")

    rp.start = slow_start
    p._context.make_current = lambda: None
    on_enter = p._on_enter

    def heard(launch):
        events.append(f"launch {launch.symbol}")
        return on_enter(launch)

    p._on_enter = heard
    p._start_first_soon()
    return events


STREAM = ["fill_a", "fill_b"] + ["gemm", "relu"] * 13


def test_the_first_launch_waits_for_the_start_and_the_rows_are_those_of_a_start_made_first(session):
    first = session(passes=2)
    feed(first, STREAM)
    first.close()
    p = session(passes=2)
    events = beside(p, start_takes=0.2)
    assert p._first_thread.is_alive()  # the caller goes on meanwhile
    feed(p, STREAM)
    p.close()
    assert events[:2] == ["launch fill_a", "start done"]  # heard first, profiled only once started
    assert p._first_thread is None and p._first_taken and p.profilers[0].replayed == first.profilers[0].replayed == 4
    assert rows(p, "kernel") == rows(first, "kernel") and rows(p, "iteration") == rows(first, "iteration")
    assert p._notes["launches_profiled"] == first._notes["launches_profiled"]
    assert all(r.closed and not r.started for r in p.profilers)


def test_a_refused_first_start_profiles_nothing_and_the_close_says_why(session):
    p = session(passes=2)
    beside(p, refuse=RuntimeError("CUPTI_ERROR_INSUFFICIENT_PRIVILEGES"))
    feed(p, STREAM)
    assert p._rows == [] and p.profilers[0].replayed == 0 and p._collector is None
    p.range_push("step")  # nor is a range after it: auto mode does not go to iteration replay
    p.range_pop("step")
    assert p.mode_used.value == "auto" and len(p.profilers) == 1
    with pytest.raises(RuntimeError, match="INSUFFICIENT_PRIVILEGES"):
        p.close()
    assert p._state == "closed" and all(r.closed for r in p.profilers)
    p.close()  # once is enough


def test_a_refused_first_start_in_kernel_mode_is_not_stopped_at_the_close(session):
    p = session(passes=2)
    beside(p, refuse=RuntimeError("CUPTI_ERROR_UNKNOWN"))
    p.mode = p.mode_used = type(p.mode_used).KERNEL
    p._warn_replay_cost = lambda *a, **k: None
    p._use_kernel()  # as start() does in kernel mode: the pass is taken before the Start has come back
    rp = p._rp
    stopped = []
    rp.stop = lambda: stopped.append("stop")  # CUPTI would refuse it, a warning at the close
    with pytest.raises(RuntimeError, match="CUPTI_ERROR_UNKNOWN"):
        p.close()
    assert rp.closed and stopped == []


def test_auto_mode_going_to_iteration_replay_before_a_launch_stops_the_pass_started_beside(session):
    p = session(passes=2)
    p._recorder = SimpleNamespace(resume=lambda: None, pause=lambda: None, close=lambda: None)
    beside(p, start_takes=0.1)
    kernel_rp = p._rp
    p.range_push("step")  # the script's first gs.range: auto mode takes iteration replay
    assert kernel_rp.started is False and not p._first_began  # stopped before the new configuration
    assert p.mode_used.value == "iteration"


def test_a_session_with_no_launch_stops_the_pass_started_beside(session):
    p = session(passes=2)
    beside(p, start_takes=0.05)
    rp = p._rp
    p.close()
    assert rp.started is False and rp.closed and p._first_thread is None


def test_the_start_thread_is_not_left_behind(session):
    before = {t.name for t in threading.enumerate()}
    p = session(passes=2)
    beside(p, start_takes=0.05)
    feed(p, STREAM[:4])
    p.close()
    assert "gpuscope-first-start" not in {t.name for t in threading.enumerate()} - before


def test_the_thread_also_queries_the_counters_and_enables_the_profiler_while_the_code_goes_on(session):
    """With ``configure`` (as ``start()`` gives it when the constructor left the availability query to the thread),
    the thread checks the counters, enables and configures the profiler, then starts it; kernel mode's collector
    is made meanwhile without a profiler, and gets the thread's once the first launch has waited for it."""
    from gpuscope.cupti._types import ProfilerRange, ReplayMode

    kernel = type(session(passes=1).mode).KERNEL
    first = session(passes=2)
    first.mode = first.mode_used = kernel
    first._use_kernel()
    feed(first, STREAM)
    first.close()

    p = session(passes=2)
    p._rp.close()
    p._rp = p._key = None  # as start() leaves it: nothing enabled before the thread
    p.profilers.clear()
    p.mode = p.mode_used = kernel
    p._context.make_current = lambda: None
    order = []

    def check():  # the availability query and the config check (0.1-0.2 s of CUPTI on the H100)
        time.sleep(0.2)
        order.append(("checked", p._rp))

    p._check_availability = check
    p._start_first_soon((ProfilerRange.AUTO, ReplayMode.KERNEL, 64))
    p._use_kernel()  # as start() does in kernel mode
    assert p._first_thread.is_alive() and p.profilers == [] and p._collector.rp is None and p._first_taken
    feed(p, STREAM)
    collector = p._collector
    p.close()
    assert order == [("checked", None)]  # before the Enable
    assert len(p.profilers) == 1 and collector.rp is p.profilers[0]
    assert p.profilers[0].replayed == first.profilers[0].replayed == len(STREAM)
    made = [(r["kernel"], r["launch"], r["values"]) for r in p._rows]
    assert made == [(r["kernel"], r["launch"], r["values"]) for r in first._rows] and len(made) == len(STREAM)


def test_a_refused_availability_query_on_the_thread_profiles_nothing_and_says_so_at_once(session):
    from gpuscope.cupti._types import ProfilerRange, ReplayMode
    from gpuscope.errors import GpuscopeWarning

    p = session(passes=2)
    p._rp.close()
    p._rp = p._key = None
    p.profilers.clear()
    p._context.make_current = lambda: None

    def busy():
        raise RuntimeError("CUPTI_ERROR_HARDWARE_BUSY")

    p._check_availability = busy
    p._start_first_soon((ProfilerRange.AUTO, ReplayMode.KERNEL, 64))
    with pytest.warns(GpuscopeWarning, match="could not start .*HARDWARE_BUSY.*nothing is profiled"):
        assert p._on_enter(SimpleNamespace(symbol="fill_a", context=0)) is None  # the script's first launch
    assert p._on_enter(SimpleNamespace(symbol="fill_b", context=0)) is None  # said once
    assert p.profilers == [] and p._rows == []
    with pytest.raises(RuntimeError, match="HARDWARE_BUSY"):
        p.close()
    assert p._state == "closed"


def _unchecked_topdown(monkeypatch):
    """A Profiler as the constructor leaves it with the first Start beside the code: the ``topdown`` plan's host
    and config made offline (GH100) without the availability image; CUPTI's query answered with the H100's."""
    from gpuscope._gpu import hosts, metric_lists
    from gpuscope._range_profiling.session import Profiler

    from .test_host import _fake_pm_availability

    calls = []
    _fake_pm_availability(monkeypatch, calls)
    monkeypatch.setattr(hosts, "_hosts", {})
    p = Profiler.__new__(Profiler)
    p.device, p.chip, p.max_depth, p._notes = 0, "GH100", 1, {}
    plan = metric_lists.consistent_plan(tuple(metric_lists.resolution("topdown", "GH100", "range").metrics), "GH100")
    p._plan, p._groups, p.metrics = plan, plan.groups, list(plan.requested)
    setup = p._host_setup(None)
    p._host, p._config, p.passes, p._unchecked = setup.host, setup.config, setup.passes, True
    p.properties = {m: dict(x) for m, x in setup.properties.items()}
    p.cycles = p.passes
    return p, setup, calls


def test_the_config_made_without_the_availability_query_is_checked_against_the_devices_answer(monkeypatch):
    from gpuscope._gpu import hosts, keep

    p, unchecked, calls = _unchecked_topdown(monkeypatch)
    assert hosts._hosts == {}  # an unchecked config is not kept for other sessions
    monkeypatch.setattr("gpuscope._range_profiling.setup._properties",
                        lambda host, m: pytest.fail("metric properties asked of CUPTI again"))
    p._check_availability()
    assert calls == [0, 0] and not p._unchecked and p._availability is not None
    assert bytes(p._config) == bytes(unchecked.config) and p.passes == 7  # GH100: the same image
    assert "config_changed_by_availability" not in p._notes
    kept = keep.host_for(0, "GH100", (tuple(p.metrics), p._groups), lambda: pytest.fail("not kept"))
    assert kept.host is not unchecked.host and bytes(kept.config) == bytes(p._config)
    assert kept.properties == unchecked.properties  # the session's
    p._check_availability()  # once is enough
    assert calls == [0, 0]


def test_a_config_the_devices_counters_change_is_taken_with_its_passes(monkeypatch):
    from gpuscope._gpu import keep
    from gpuscope.cupti import host

    p, unchecked, _ = _unchecked_topdown(monkeypatch)
    made = p._host_setup
    fewer = host.config_image("GH100", host.ProfilerType.RANGE_PROFILER, ["sm__cycles_elapsed.max"])

    def setup(availability, properties=None):  # a device whose answer leaves fewer counters: another config image
        real = made(availability, properties)
        return keep.HostSetup(real.host, fewer, host.num_passes(fewer), real.properties)

    p._host_setup = setup
    p._check_availability()
    assert bytes(p._config) == bytes(fewer) and p.passes == p.cycles == 1 != unchecked.passes
    assert p._notes["config_changed_by_availability"] == 1
