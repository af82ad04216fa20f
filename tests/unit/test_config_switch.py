"""A kept range profiler switched to another configuration, and the fallback when CUPTI refuses (no GPU: a stand-in
range profiler that lays images out as CUPTI does and refuses what a test tells it to)."""

from types import SimpleNamespace

import numpy as np
import pytest

from gpuscope._gpu import keep as _keep
from gpuscope._range_profiling import configure as _configure
from gpuscope._range_profiling import session as _session
from gpuscope.cupti._types import ProfilerRange, ReplayMode
from gpuscope.errors import CuptiError

from .test_keep import FakeContext, kept_state  # noqa: F401  (kept_state: the fixture)

CTX = 0x1234
USER = (ProfilerRange.USER, ReplayMode.USER, 64)
KERNEL = (ProfilerRange.AUTO, ReplayMode.KERNEL, 64)
ITERATION = (ProfilerRange.AUTO, ReplayMode.USER, 16)


class StopResult:
    all_passes_submitted = True


class FakeRangeProfiler:
    """As CUPTI's range profiler object: an image is laid out for the object's last GetCounterDataSize (one of
    another size is refused); with *refuse_start* set, the first Start after a SetConfig of another configuration
    fails as CUPTI did (CUPTI_ERROR_UNKNOWN)."""

    made: list = []
    refuse_start = False

    def __init__(self, ctx):
        self.ctx, self.calls, self.closed = ctx, [], 0
        self.sized = self.config = None
        self.changed = False
        FakeRangeProfiler.made.append(self)

    def counter_data_size(self, metrics, ranges, max_tree_nodes=None):
        self.sized = (tuple(metrics), ranges)
        self.calls.append(("size", tuple(metrics), ranges))
        return 100 * len(metrics) + ranges

    def counter_data_image(self, metrics, ranges):
        image = np.zeros(self.counter_data_size(metrics, ranges), np.uint8)
        self.initialize_counter_data(image)
        return image

    def initialize_counter_data(self, image):
        if image.size != 100 * len(self.sized[0]) + self.sized[1]:
            raise AssertionError("an image initialised for other metrics than the last GetCounterDataSize")
        self.calls.append(("init", id(image)))

    def set_config(self, config, image, range_mode, replay_mode, ranges, depth, *rest):
        config_id = (bytes(config), int(range_mode), int(replay_mode), ranges)
        self.changed = self.config is not None and config_id != self.config
        self.config = config_id
        self.calls.append(("set_config", int(range_mode), int(replay_mode), id(image)))

    def start(self):
        self.calls.append("start")
        if self.refuse_start and self.changed:
            raise CuptiError(999, "cuptiRangeProfilerStart", "CUPTI_ERROR_UNKNOWN")

    def stop(self):
        self.calls.append("stop")
        return StopResult()

    def decode(self):
        self.calls.append("decode")
        return 0

    def close(self):
        self.closed += 1


@pytest.fixture
def cupti(kept_state, monkeypatch):  # noqa: F811
    """The stand-in range profiler in place of CUPTI's, a fresh memory of refused switches, switching on."""
    monkeypatch.setattr("gpuscope.cupti.range_profiler.RangeProfiler", FakeRangeProfiler)
    monkeypatch.setattr(FakeRangeProfiler, "made", [])
    monkeypatch.setattr(FakeRangeProfiler, "refuse_start", False)
    monkeypatch.setattr(_configure, "_refused", set())
    monkeypatch.delenv(_configure.SWITCH_ENV, raising=False)
    return FakeRangeProfiler


def session(metrics=("a", "b")):
    """A Profiler as start() leaves it before configuring (no CUDA, no CUPTI)."""
    p = _session.Profiler.__new__(_session.Profiler)
    p.device, p._context_id, p._context = 0, 7, SimpleNamespace(handle=CTX)
    p.metrics, p._plan, p._groups = list(metrics), None, ()
    p._config = np.frombuffer(("config:" + ",".join(metrics)).encode(), np.uint8)
    p._notes, p._key, p._rp, p._images, p._collector = {}, None, None, {}, None
    return p


def run(metrics, how):
    """A session configured *how* (USER, KERNEL, ITERATION) that ends cleanly: its profiler kept."""
    p = session(metrics)
    p._configure(*how)
    _keep.keep(0, _keep.Kept(p._key, 7, FakeContext(), p._rp, p._config, p._image, images=p._images))
    return p


def test_alternating_configurations_keep_one_profiler_and_switch_back_to_its_images(cupti):
    td = ("t1", "t2", "t3")
    first = run(td, KERNEL)
    second = run(td, ITERATION)
    third = run(("a", "b"), USER)
    again = run(td, KERNEL)
    assert len(cupti.made) == 1 and cupti.made[0].closed == 0  # enabled once, never disabled
    assert "profiler_switched" not in first._notes
    assert [s._notes.get("profiler_switched") for s in (second, third, again)] == [1, 1, 1]
    assert again._image is first._image  # the switch back reuses its configuration's image
    assert len(again._images) == 3 and third._image is again._images[third._key]


def test_a_switch_sizes_then_initialises_then_configures_and_tries_an_empty_pass(cupti):
    run(("t1", "t2", "t3"), KERNEL)
    rp = cupti.made[0]
    rp.calls.clear()
    p = run(("a", "b"), USER)
    image, user = id(p._image), ("set_config", int(ProfilerRange.USER), int(ReplayMode.USER), id(p._image))
    assert rp.calls == [("size", ("a", "b"), 64), ("init", image), user,  # the new layout, then configured
                        "start", "stop", "decode", ("init", image), user]  # pass 0 again


def test_a_refused_switch_enables_a_new_profiler_and_is_not_tried_again(cupti):
    cupti.refuse_start = True
    run(("a", "b"), USER)
    p = run(("t1", "t2", "t3"), KERNEL)
    old, new = cupti.made
    assert old.closed == 1 and new.closed == 0 and p._rp is new
    assert "CUPTI_ERROR_UNKNOWN" in p._notes["profiler_switch_refused"] and "profiler_switched" not in p._notes
    assert p._images == {p._key: p._image}  # the refused profiler's images went with it

    run(("a", "b"), USER)  # another kind of change (kernel -> user): tried, refused
    assert len(cupti.made) == 3
    third = cupti.made[2]
    third.calls.clear()
    q = run(("t1", "t2", "t3"), KERNEL)  # the kind refused before (user -> kernel, new metrics): not tried
    assert third.closed == 1 and third.calls == [] and "profiler_switch_refused" not in q._notes


def test_a_refusal_at_set_config_falls_back_too(cupti, monkeypatch):
    run(("a", "b"), USER)

    def refuse(*args):
        raise CuptiError(1, "cuptiRangeProfilerSetConfig", "CUPTI_ERROR_INVALID_PARAMETER")

    monkeypatch.setattr(cupti.made[0], "set_config", refuse)
    p = run(("c", "d"), USER)
    assert cupti.made[0].closed == 1 and p._rp is cupti.made[1] and "INVALID_PARAMETER" in p._notes[
        "profiler_switch_refused"]


def test_nothing_stays_enabled_when_a_switch_is_interrupted(cupti, monkeypatch):
    run(("a", "b"), USER)
    rp = cupti.made[0]

    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(rp, "start", interrupted)
    p = session(("c", "d"))
    with pytest.raises(KeyboardInterrupt):
        p._configure(*USER)
    assert rp.closed == 1 and p._rp is None and p._key is None and p._images == {}
    assert len(cupti.made) == 1 and _keep.kept_devices() == []
    assert _configure._refused == set()  # not CUPTI's refusal: tried again next time


def test_a_failed_enable_after_a_refusal_leaves_nothing(cupti, monkeypatch):
    cupti.refuse_start = True
    run(("a", "b"), USER)

    def no_counters(ctx):
        raise CuptiError(26, "cuptiRangeProfilerEnable", "CUPTI_ERROR_HARDWARE_BUSY")

    monkeypatch.setattr("gpuscope.cupti.range_profiler.RangeProfiler", no_counters)
    monkeypatch.setattr(_keep, "retry_when_busy", lambda device, call, what="": call())
    p = session(("t1",))
    with pytest.raises(CuptiError, match="HARDWARE_BUSY"):
        p._configure(*KERNEL)
    assert cupti.made[0].closed == 1 and p._rp is None and p._key is None and _keep.kept_devices() == []


def test_switching_off_enables_a_new_profiler_per_configuration(cupti, monkeypatch):
    monkeypatch.setenv(_configure.SWITCH_ENV, "0")
    run(("a", "b"), USER)
    run(("a", "b"), KERNEL)
    assert [rp.closed for rp in cupti.made] == [1, 0]


def test_the_same_configuration_is_kept_as_it_is(cupti):
    first = run(("a", "b"), USER)
    rp = cupti.made[0]
    rp.calls.clear()
    again = run(("a", "b"), USER)
    assert again._rp is rp and again._image is first._image and rp.calls == []
    assert again._notes == {"profiler_reused": 1}


def test_past_max_images_a_change_enables_a_new_profiler(cupti):
    for i in range(_configure.MAX_IMAGES):
        run((f"m{i}",), USER)
    assert len(cupti.made) == 1
    run(("m0",), USER)  # a configuration it holds an image for: switched back
    assert len(cupti.made) == 1
    run(("new",), USER)
    assert len(cupti.made) == 2 and cupti.made[0].closed == 1


def test_within_a_session_the_own_profiler_is_switched_unless_its_state_is_unknown(cupti):
    p = session(("t1", "t2"))
    p._configure(*KERNEL)
    p._configure(*ITERATION)  # auto mode: kernel replay, then the loop found
    assert len(cupti.made) == 1 and p._notes["profiler_switched"] == 1
    p._key = None  # a dropped pass group's passes were submitted (modes.py): never switched
    p._configure(ProfilerRange.AUTO, ReplayMode.USER, 32)
    assert len(cupti.made) == 2 and cupti.made[0].closed == 1


@pytest.mark.parametrize(("old", "new", "ok"), [
    ((CTX, ("a",), (), 1, 1, 64, 1), (CTX, ("b",), (), 0, 2, 64, 1), True),
    ((CTX, ("a",), (), 1, 1, 64, 1), (CTX, ("a",), (), 1, 1, 64, 1), False),  # the same: kept, not switched
    (None, (CTX, ("b",), (), 0, 2, 64, 1), False),  # state unknown
    ((CTX + 1, ("a",), (), 1, 1, 64, 1), (CTX, ("b",), (), 1, 1, 64, 1), False),  # another context
    (("pm", CTX, ("a",), 1, 2, 3, 4, None, "thread", 2), (CTX, ("a",), (), 1, 1, 64, 1), False),  # a PM sampler
])
def test_switchable(cupti, old, new, ok):
    assert _configure.switchable(old, new) is ok


def test_take_hands_back_a_profiler_the_caller_can_switch(kept_state):  # noqa: F811
    k = _keep.Kept((CTX, ("a",), (), 1, 1, 64, 1), 7, FakeContext(), SimpleNamespace(closed=0), "c", "i")
    _keep.keep(0, k)
    other = (CTX, ("b",), (), 0, 2, 64, 1)
    assert _keep.take(0, other, 7, switch=lambda old, new: old[1] == ("a",)) is k  # not released: the caller's
    assert k.context.closed == 0
    _keep.keep(0, k)
    assert _keep.take(0, other, 8, switch=lambda old, new: True) is None  # another context: released
