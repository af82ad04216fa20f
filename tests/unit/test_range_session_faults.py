"""User-mode range sessions when CUPTI refuses a pop, and ranges on other threads (no GPU: the stand-in range
profiler of test_session_faults)."""

import threading
import warnings

from gpuscope._range_profiling import ranges as _ranges

from .test_session_faults import FakeRangeProfiler, StopResult, user_session


class StrictRangeProfiler(FakeRangeProfiler):
    """As CUPTI: refuses ``start`` while started, and has all passes of a group submitted every *cycles* stops;
    refuses the first *refuse_pops* pops."""

    def __init__(self, cycles, refuse_pops=0):
        super().__init__()
        self.cycles, self.stops, self.started, self.refuse_pops = cycles, 0, False, refuse_pops

    def start(self):
        if self.started:
            raise RuntimeError("CUPTI: the profiler is already started")
        self.started = True
        super().start()

    def stop(self):
        self.started = False
        self.stops += 1
        self.calls.append("stop")
        return StopResult(self.stops % self.cycles == 0)

    def pop_range(self):
        if self.refuse_pops:
            self.refuse_pops -= 1
            raise RuntimeError("CUPTI refused the pop")
        super().pop_range()


def ranges(p, *paths):
    """Open and close top-level ranges (each with an inner one) with *p* listening; the warnings they gave."""
    _ranges.add_listener(p)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for name in paths:
                with _ranges.range(name):
                    with _ranges.range("inner"):
                        pass
        return [str(w.message) for w in caught]
    finally:
        _ranges.remove_listener(p)


def test_a_refused_pop_ends_the_cycle_and_later_ranges_are_profiled(monkeypatch):
    monkeypatch.setattr("gpuscope.cupti.activity.timestamp", lambda: 1)
    rp = StrictRangeProfiler(cycles=2, refuse_pops=1)  # the inner range's pop of the first "step"
    p = user_session(rp, cycles=2)
    said = ranges(p, "step", "step", "step", "step")
    assert len(said) == 1 and "CUPTI refused the pop" in said[0]  # the listener's error, as a warning
    cycle = ["start", "push step", "push inner", "pop", "pop", "stop"]
    # the refused pop's group is dropped (collect warns of it); the next group is whole
    assert rp.calls == (["start", "push step", "push inner", "pop", "stop"] + cycle + ["collect 0 bad=True"]
                        + cycle + cycle + ["collect 1 bad=False"])
    assert not p._running and not rp.started and p._stack == [] and p._open_rows == []


def test_a_refused_top_level_pop_ends_the_cycle(monkeypatch):
    monkeypatch.setattr("gpuscope.cupti.activity.timestamp", lambda: 1)
    rp = StrictRangeProfiler(cycles=2)
    p = user_session(rp, cycles=2)
    _ranges.add_listener(p)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with _ranges.range("step"):
                rp.refuse_pops = 1
    finally:
        _ranges.remove_listener(p)
    assert ["CUPTI refused the pop" in str(w.message) for w in caught] == [True]
    assert rp.calls == ["start", "push step", "stop"] and not p._running and not rp.started  # was left started
    assert ranges(p, "step", "step", "step") == []  # each starts a cycle: no "already started"
    cycle = ["start", "push step", "push inner", "pop", "pop", "stop"]
    assert rp.calls[3:] == cycle + ["collect 0 bad=True"] + cycle + cycle + ["collect 1 bad=False"]


def test_each_new_thread_is_warned_about_once_though_idents_are_reused():
    p = user_session(FakeRangeProfiler(), cycles=1)
    _ranges.add_listener(p)
    said = []

    def work():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(2):  # twice on one thread: one warning
                with _ranges.range("step"):
                    pass
        said.extend(str(w.message) for w in caught)

    try:
        idents = []
        for _ in range(8):  # one after the other: the OS hands the same ident out again
            t = threading.Thread(target=work)
            t.start()
            t.join()
            idents.append(t.ident)
    finally:
        _ranges.remove_listener(p)
    assert len(set(idents)) < 8  # the reuse the old ident-keyed record missed
    assert len(said) == 8 and all("are not profiled: a user-mode session profiles the thread" in s for s in said)
    assert p._rp.calls == []  # nothing from the other threads reached CUPTI
