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
