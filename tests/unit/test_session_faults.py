"""Range-profiling sessions when CUPTI refuses a call: the range stacks stay whole (no GPU: a stand-in profiler)."""

import threading
import warnings

import pytest

from gpuscope._range_profiling import ranges as _ranges
from gpuscope._range_profiling import session as _session
from gpuscope._range_profiling.filters import checked_int
from gpuscope.cupti import callbacks


class StopResult:
    def __init__(self, done):
        self.all_passes_submitted = done


class FakeRangeProfiler:
    def __init__(self, refuse_push=()):
        self.calls = []
        self.refuse_push = set(refuse_push)

    def start(self):
        self.calls.append("start")

    def stop(self):
        self.calls.append("stop")
        return StopResult(True)

    def push_range(self, name):
        if name in self.refuse_push:
            self.refuse_push.discard(name)
            raise RuntimeError("CUPTI refused the push")
        self.calls.append(f"push {name}")

    def pop_range(self):
        self.calls.append("pop")

    def decode(self):
        self.calls.append("decode")
        return 0

    def initialize_counter_data(self, image):
        pass


def user_session(rp, cycles):
    """A user-mode Profiler wired to a stand-in range profiler (what start() sets up, without CUDA or CUPTI)."""
    p = _session.Profiler.__new__(_session.Profiler)
    p.mode = p.mode_used = _session.Mode.USER
    p.metric_set, p.metrics, p.device = "test", ["m"], 0
    p.max_depth, p.passes, p.cycles, p.sample_every = 2, cycles // 2 or 1, cycles, 1
    p._seen, p._notes, p._rows = {}, {}, []
    p._thread, p._pid = threading.get_ident(), __import__("os").getpid()
    p._stack, p._open_rows, p._launch, p._other_threads = [], [], 0, set()
    p._rp, p._image, p._state = rp, None, "open"
    p._new_group()
    p._group_index, p._iteration = 0, {}
    p._collect = lambda group: (rp.calls.append(f"collect {group} bad={p._bad_group}"), p._new_group())
    return p


def test_a_refused_push_keeps_the_stacks_whole(monkeypatch):
    monkeypatch.setattr("gpuscope.cupti.activity.timestamp", lambda: 1)
    rp = FakeRangeProfiler(refuse_push={"step"})
    p = user_session(rp, cycles=2)
    _ranges.add_listener(p)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with _ranges.range("step"):  # CUPTI refuses this push: the listener's error becomes a warning
                with _ranges.range("inner"):  # not pushed either: its parent is not a CUPTI range
                    pass
        assert any("CUPTI refused the push" in str(w.message) for w in caught)
        assert p._stack == [] and p._open_rows == []
        # the cycle begun for the refused range was ended, and its group is dropped, not mixed with later ones
        assert rp.calls == ["start", "stop", "collect 0 bad=True"]
        for _ in range(2):  # the next ranges are top-level CUPTI ranges again, with their nested ranges
            with _ranges.range("step"):
                with _ranges.range("inner"):
                    pass
        cycle = ["start", "push step", "push inner", "pop", "pop", "stop"]
        assert rp.calls[3:] == cycle + ["collect 1 bad=False"] + cycle + ["collect 2 bad=False"]
        assert p._stack == [] and p._open_rows == []
    finally:
        _ranges.remove_listener(p)


def test_launch_callbacks_cover_every_launch_entry_point():
    # cuLaunchCooperativeKernel_ptsz (478) was missing: its launches went unrecorded and shifted every later row
    assert set(callbacks.LAUNCH_CBIDS) == {307, 442, 477, 478, 652, 653, 514, 515}  # 514/515: cuGraphLaunch


def test_bad_session_options_say_what_to_pass():
    with pytest.raises(ValueError, match="max_ranges must be between 1 and"):
        checked_int(0, "max_ranges", maximum=1 << 20)
    with pytest.raises(TypeError, match="max_ranges must be an integer"):
        checked_int(2.5, "max_ranges")
    with pytest.raises(ValueError, match="NUL"):
        _ranges.range("a\0b")
