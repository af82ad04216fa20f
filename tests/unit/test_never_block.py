"""Launch callbacks never wait indefinitely on another launching thread (launches.Baton): a launch that finds another
thread's profiled launch in flight waits a bounded time for it (its turn, where the holder ends), then runs
unprofiled and is counted, and once a wait ran out the session's launches no longer wait; one that comes while the
first Start is still under way runs unprofiled at once; the rows that CUPTI's order cannot tell apart are dropped,
never mislabelled (pure logic, no GPU)."""

import threading
import time
from collections import Counter
from dataclasses import replace
from types import SimpleNamespace

import pytest

import gpuscope as gs
from gpuscope._range_profiling import entry
from gpuscope._range_profiling.filters import KernelFilter
from gpuscope._range_profiling import launches
from gpuscope._range_profiling.launches import Baton, HostGates, IterationReplay, matched_prefix
from gpuscope._results.report_inputs import unprofiled_note

from tests.unit.test_launch_selection import CTX, FakeRangeProfiler, KernelRows, _launch


@pytest.fixture(autouse=True)
def _no_capture(monkeypatch):
    """No driver here: no stream is being captured; a short bounded wait for the baton."""
    monkeypatch.setattr(launches, "capturing", lambda stream: False)
    monkeypatch.setattr(launches, "BATON_WAIT_S", 0.2)


def _on_thread(fn):
    """Run *fn* on another thread; (its result, seconds it took)."""
    out = {}

    def run():
        t0 = time.perf_counter()
        out["result"] = fn()
        out["s"] = time.perf_counter() - t0

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(10)
    assert not thread.is_alive(), "a launch callback waited for another thread"
    return out["result"], out["s"]


def test_the_baton_is_never_waited_for():
    baton = Baton()
    assert baton.take()
    taken, seconds = _on_thread(baton.take)
    assert not taken and seconds < 1 and baton.refused == 1
    assert baton.take()  # its holder again (a graph's nodes launched from the graph launch's callback)
    baton.give()
    assert not _on_thread(baton.take)[0]  # still held: given back once of twice
    baton.give()
    assert _on_thread(baton.take)[0]  # free: another thread's turn (that thread ended holding it)
    baton.reset()
    assert baton.take()


def test_a_wait_for_the_baton_is_bounded_and_ends_at_the_holders_exit():
    baton = Baton()
    assert baton.take()
    taken, seconds = _on_thread(lambda: baton.take(0.3))  # the holder never gives it back meanwhile
    assert not taken and 0.25 < seconds < 2 and baton.timed_out == 1
    baton.give()
    held = threading.Event()

    def holder():  # another thread's launch, which ends while this one waits
        baton.take()
        held.set()
        time.sleep(0.1)
        baton.give()

    threading.Thread(target=holder).start()
    held.wait(5)
    taken, seconds = _on_thread(lambda: baton.take(5.0))
    assert taken and seconds < 4 and baton.timed_out == 1  # its turn: taken by the thread that waited


def test_a_launch_waiting_for_the_baton_when_the_session_closes_runs_unprofiled():
    baton = Baton()
    assert baton.take()
    timer = threading.Timer(0.1, baton.close)  # the session closes while another thread's launch waits
    timer.start()
    taken, seconds = _on_thread(lambda: baton.take(5.0))
    timer.join()
    assert not taken and seconds < 4 and baton.holder is None
    assert not _on_thread(lambda: baton.take(1.0))[0]  # and none takes it after the close


def test_launches_of_independent_threads_wait_their_turn_and_all_become_rows():
    """Eight threads each launch while another thread's profiled launch is in flight; each launch exits (its
    replay done) a little later: every launch waits its turn and is profiled, none runs unprofiled."""
    session = Session()
    done = []

    def launch(k):
        token = session._on_enter(_launch(f"k{k}"))
        time.sleep(0.01)  # CUPTI replaying it
        session._on_exit(token)
        done.append(token is not None)

    threads = [threading.Thread(target=launch, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert done == [True] * 8 and not session._unsafe and session._baton.timed_out == 0
    assert sorted(s.symbol for s in session._collector.selected) == [f"k{k}" for k in range(8)]
    assert not any(s.concurrent or s.overlapped for s in session._collector.selected)


class Session(KernelRows):
    """KernelRows with the session's launch entry and exit (``PerLaunchModes._on_enter``/``_on_exit``)."""

    def __init__(self, kfilter=None):
        super().__init__(kfilter or KernelFilter.build())
        self._context = SimpleNamespace(handle=CTX)
        self._baton, self._unsafe, self._gates, self._behind = Baton(), Counter(), HostGates(), Counter()
        self._first_thread = self._first_error = self._tracker = self._end_after = None
        self._thread = threading.get_ident()


def test_a_launch_during_another_threads_profiled_launch_runs_at_once_and_is_not_a_row(monkeypatch):
    from gpuscope.cupti import range_profiler

    session = Session()
    first = session._on_enter(_launch("a"))  # in flight, and it will not end while "b" waits (a deadlock)
    token, seconds = _on_thread(lambda: session._on_enter(_launch("b")))
    assert token is None and seconds < 1 and session._baton.timed_out == 1  # waited BATON_WAIT_S (0.2 s here)
    assert _on_thread(lambda: session._on_enter(_launch("b2")))[1] < 0.1  # once one wait ran out, none waits
    session._unsafe["concurrent"] -= 1
    session._collector.selected.pop()
    session._collector.concurrent -= 1
    session._on_exit(first)
    second = session._on_enter(_launch("c"))
    session._on_exit(second)
    assert [(s.symbol, s.concurrent, s.overlapped) for s in session._collector.selected] == [
        ("a", False, True), ("b", True, False), ("c", False, False)]
    # CUPTI made a range of the concurrent launch: its range and the one it overlapped are not rows
    monkeypatch.setattr(range_profiler, "num_ranges", lambda image: 3)
    session._collect_kernels()
    assert [r["kernel"] for r in session._rows] == ["c"]
    with pytest.warns(gs.GpuscopeWarning, match="1 launch from other threads ran unprofiled"):
        session._note_unsafe()
    assert session._notes["launches_concurrent"] == 1 and session._notes["launches_overlapped"] == 1


def test_where_cupti_made_no_range_of_the_concurrent_launch_the_rows_keep_their_names(monkeypatch):
    from gpuscope.cupti import range_profiler

    session = Session()
    first = session._on_enter(_launch("a"))
    _on_thread(lambda: session._on_enter(_launch("b")))
    session._on_exit(first)
    session._on_exit(session._on_enter(_launch("c")))
    monkeypatch.setattr(range_profiler, "num_ranges", lambda image: 2)
    session._collect_kernels()
    assert [r["kernel"] for r in session._rows] == ["c"]  # a: overlapped, CUPTI's order not known


def test_a_left_out_launch_holds_the_baton_to_its_exit():
    """The profiler stopped for a left-out launch must stay stopped until it has run: another thread's selected
    launch cannot start it meanwhile, so it runs unprofiled instead."""
    session = Session(KernelFilter.build(kernels="keep"))
    left_out = session._on_enter(_launch("other"))
    assert left_out is not None and left_out.token is None and session._collector.paused
    token, _ = _on_thread(lambda: session._on_enter(_launch("keep")))
    assert token is None and session._rp.calls == ["stop"]  # not started again under the left-out launch
    session._on_exit(left_out)
    session._on_exit(session._on_enter(_launch("keep")))
    assert session._rp.calls == ["stop", "start"] and session._unsafe["concurrent"] == 1


def test_other_threads_do_not_wait_for_the_first_start_and_the_session_thread_waits_a_bounded_time(monkeypatch):
    session = Session()
    release = threading.Event()
    session._first_thread = threading.Thread(target=release.wait, daemon=True)
    session._first_thread.start()
    token, seconds = _on_thread(lambda: session._on_enter(_launch("a")))
    assert token is None and seconds < 1 and session._unsafe["before_start"] == 1
    monkeypatch.setattr(entry, "FIRST_START_WAIT_S", 0.2)
    t0 = time.perf_counter()
    assert session._on_enter(_launch("a")) is None  # the session's thread: waited, then went on unprofiled
    assert 0.15 < time.perf_counter() - t0 < 5 and session._unsafe["before_start"] == 2
    release.set()
    session._first_thread.join(5)
    session._first_started = lambda: True
    held = session._on_enter(_launch("a"))
    assert held.token is not None
    session._on_exit(held)


def test_iteration_passes_end_their_common_part_at_a_concurrent_launch():
    it = IterationReplay(FakeRangeProfiler(), CTX, KernelFilter.build(), str, lambda: ("", None), lambda: 0)
    for concurrent_in_pass in (False, True):
        it.begin(0)
        for name in ("a", "b", "c"):
            token = it.on_enter(_launch(name))
            if name == "b" and concurrent_in_pass:
                it.on_concurrent(_launch("z"))
            it.on_exit(token)
        it.end()
    passes = it.take_group().passes
    assert [s.symbol for s in passes[1]] == ["a", "b", "z", "c"] and passes[1][1].overlapped
    assert matched_prefix(passes) == 1  # b overlapped z: CUPTI's order of the two is not known
    assert matched_prefix(passes[:1]) == 3


def test_the_note_names_each_reason():
    text = unprofiled_note({"launches_concurrent": 3, "launches_overlapped": 1, "launches_before_start": 2})
    assert "3 launches from other threads ran unprofiled" in text
    assert "1 profiled launch without a row" in text and "2 launches from other threads before" in text
    assert unprofiled_note({}) == ""


def test_a_kernel_waiting_for_the_host_and_what_follows_it_on_its_stream_run_unprofiled(monkeypatch):
    """XLA's autotuning timer: DelayKernel spins until its thread sets a flag after launching what it times. Kernel
    replay inside a launch call waits for the whole device, so every launch runs with the profiler stopped until
    the delay kernel's stream has drained."""
    busy = {7: True}
    monkeypatch.setattr(launches, "_busy", lambda stream: busy.get(stream, False))
    session = Session()
    delay = replace(_launch("_ZN15stream_executor3gpu11DelayKernelEv"), stream=7)
    timed = replace(_launch("gemm"), stream=7)
    other = replace(_launch("other"), stream=9)
    for launch in (delay, timed, other):
        session._on_exit(session._on_enter(launch))
    assert session._collector.selected == [] and session._unsafe["host_waiting"] == 3
    assert session._rp.calls == ["stop"]
    busy[7] = False  # the flag was set and the stream drained: profiled again
    session._on_exit(session._on_enter(timed))
    session._on_exit(session._on_enter(other))
    assert [s.symbol for s in session._collector.selected] == ["gemm", "other"]


def test_a_launch_recorded_by_stream_capture_runs_unprofiled(monkeypatch):
    """Inside a capture a launch records a graph node and runs nothing: CUPTI makes no range of it (a captured
    PyTorch graph had 8 launches heard, 5 ranges), so it is never selected; its node is profiled at the graph's
    launch."""
    monkeypatch.setattr(launches, "capturing", lambda stream: stream == 3)
    session = Session()
    session._on_exit(session._on_enter(replace(_launch("captured"), stream=3)))
    session._on_exit(session._on_enter(_launch("eager")))
    assert [s.symbol for s in session._collector.selected] == ["eager"] and session._unsafe["captured"] == 1


def test_a_launch_whose_exit_was_not_heard_frees_the_baton_and_is_counted():
    """The session paused its recorder (between iterations) while another thread's profiled launch ran: that
    launch's exit is never heard. Before, its thread kept the baton for the rest of the session and every other
    thread's launch, graph launches too, ran unprofiled as 'concurrent'."""
    session = Session()
    held, entered, done = {}, threading.Event(), threading.Event()

    def launch():  # its thread lives on (a new thread may get a dead one's ident, which the baton would take back)
        held["token"] = session._on_enter(_launch("theirs"))
        held["thread"] = threading.get_ident()
        entered.set()
        done.wait(10)

    holder = threading.Thread(target=launch)
    holder.start()
    entered.wait(10)
    assert session._baton.held and session._collector._in_flight is not None
    assert _on_thread(lambda: session._on_enter(_launch("b")))[0] is None  # refused while it is in flight
    session._on_lost(held["token"], held["thread"])  # the recorder gave it up at its resume
    done.set()
    holder.join()
    assert not session._baton.held and session._collector._in_flight is None
    mine = session._on_enter(_launch("c"))
    assert mine is not None and mine.token is not None
    session._on_exit(mine)
    assert session._unsafe["exit_unheard"] == 1 and session._unsafe["concurrent"] == 1
    assert "1 launch whose call's exit was not heard" in unprofiled_note({"launches_exit_unheard": 1})


def test_iterations_that_never_matched_warn_instead_of_raising():
    """Other threads' launches interleaved with every iteration of the loop auto mode found (H200: 8 threads of
    threads_stress.py): every pass group was collected and kept no launch. The session ends with no rows and says
    why, instead of raising MultiPassRangeError ("run the repeated work at least N times": it did)."""
    from gpuscope._range_profiling.modes import Mode, PerLaunchModes

    def session(mode, groups):
        return SimpleNamespace(
            _collector=SimpleNamespace(group=None), _iter_path="step", _steps=False, _tracker=None, _notes={},
            _size_from_first=False, passes=1, _rows=[], _group_index=groups, mode=mode,
            _complete_last_group=lambda: (0, 0), _take_found_group=lambda *a, **k: None)

    with pytest.warns(gs.GpuscopeWarning, match="Auto mode profiled 3 pass group.*kept no launch.*mode='kernel'"):
        assert PerLaunchModes._incomplete_iterations(session(Mode.AUTO, 3)) is None
    with pytest.warns(gs.GpuscopeWarning, match="Iteration mode profiled 2 pass group"):  # H200, 8 threads
        assert PerLaunchModes._incomplete_iterations(session(Mode.ITERATION, 2)) is None
    for mode in (Mode.AUTO, Mode.ITERATION):  # too few iterations for one group: the user's to fix
        assert isinstance(PerLaunchModes._incomplete_iterations(session(mode, 0)), gs.MultiPassRangeError)
