"""A PM sampler kept between sessions with its evaluation workers and their shared image pool (issue 35, item 2),
without a GPU: ``gs.sample``'s own start and stop over a simulated CUPTI that delivers the H100 recording, evaluated
by real worker processes with CUPTI's host API.

The simulated CUPTI remembers every buffer it was given for each PM sampling object (the config of its SetConfig,
every image initialised or decoded into) and fails any later call on that object, and its disable, if one of them
has been freed: the real one keeps their addresses, and a kept sampler whose images had been freed crashed a later
session (SIGSEGV, docs/measurements.md). Waits below are liveness bounds, not timings."""

import gc
import os
import signal
import subprocess
import threading
import time
import uuid
import weakref
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from gpuscope._gpu import keep as _keep
from gpuscope._gpu import rendezvous as _rendezvous
from gpuscope._pm_sampling import sampler as _sampling
from gpuscope._pm_sampling import workers as _pm_workers
from gpuscope.cupti import _images, profiler
from gpuscope.cupti import pm_sampling as pm

from .test_faults import assert_all_evaluated, backend_for, submit_all
from .test_pm_workers import AVAILABILITY

BOUND = 60  # s: liveness bound
MAPPED = "gpuscope-pm-image"  # the memfds' name, shown in /proc/self/maps


def image_mappings() -> list[tuple[int, int]]:
    """The address ranges of this process's mappings of shared images."""
    ranges = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        if MAPPED in line:
            low, high = line.split()[0].split("-")
            ranges.append((int(low, 16), int(high, 16)))
    return ranges


def mapped_images(addresses) -> int:
    """How many of *addresses* lie in this process's mappings of shared images."""
    ranges = image_mappings()
    return sum(any(low <= a < high for low, high in ranges) for a in addresses)


def gpuscope_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("gpuscope-pm") and t.is_alive()]


class FakeCupti:
    """CUPTI's PM sampling calls over the H100 recording: each session's first decode after Start delivers its 261
    samples. ``events`` logs what happened in order; ``dead`` lists every call made on an object one of whose
    buffers had been freed (the crash of the real one), and such a call raises."""

    def __init__(self, recording):
        self.meta, self.image, self.stamps = recording
        self.events: list[str] = []
        self.dead: list[str] = []
        self.given: dict[int, list] = {}  # handle -> weakrefs of every buffer CUPTI was given for it
        self.content: dict[int, int] = {}  # image address -> completed samples
        self.handles = 100
        self.pending = False  # Start was called: the next decode delivers the recording
        self.running = False

    def _give(self, handle, array):
        self.given.setdefault(handle, []).append(weakref.ref(array))

    def _check(self, handle, call):
        freed = sum(ref() is None for ref in self.given.get(handle, []))
        if freed:
            self.dead.append(f"{call} on object {handle}: {freed} of its buffers were freed")
            raise RuntimeError(self.dead[-1])

    # -- the PM sampling object ---------------------------------------------------------------------------
    def enable(self, device):
        self.handles += 1
        self.events.append(f"enable {self.handles}")
        return self.handles

    def set_config(self, handle, config, *args):
        self._give(handle, config)

    def start(self, handle):
        self._check(handle, "Start")
        self.pending = self.running = True

    def stop(self, handle):
        self._check(handle, "Stop")
        self.running = False

    def disable(self, handle):
        # what the order promises: the workers are stopped, and every image of the object is still mapped
        addresses = {ref().ctypes.data for ref in self.given.get(handle, []) if ref() is not None}
        self.events.append(f"disable {handle} (workers alive: {len(live_workers())}, images mapped: "
                           f"{mapped_images(addresses)})")
        self._check(handle, "Disable")

    # -- images -------------------------------------------------------------------------------------------
    def counter_data_size(self, handle, metrics, n):
        return self.image.size

    def initialize_counter_data(self, handle, image):
        self._check(handle, "CounterDataImageInitialize")
        self._give(handle, image)
        # CUPTI writes its header here: an image handed over before any sample arrived evaluates as 0 samples.
        # The recording's bytes stand in for it (counter_data_info below says no sample is in the image yet).
        image[:] = self.image
        self.content[image.ctypes.data] = 0
        _images.trust(image, _images.Kind.PM_SAMPLING)

    def new_counter_data(self, handle, metrics, n):
        image = np.zeros(self.image.size, np.uint8)
        self.initialize_counter_data(handle, image)
        return image

    def decode(self, handle, image):
        self._check(handle, "DecodeData")
        self._give(handle, image)
        if self.pending and self.content[image.ctypes.data] == 0:
            image[:] = self.image  # the recording's bytes, which the workers evaluate
            self.content[image.ctypes.data] = self.meta["completed"]
            self.pending = False
        return pm.Decoded(stop_reason=pm.PmDecodeStopReason.END_OF_RECORDS, overflow=False)

    def counter_data_info(self, image):
        n = self.content[image.ctypes.data]
        return pm.CounterDataInfo(400, n, n)

    def sample_info(self, handle, image, index):
        return int(self.stamps[index, 0]), int(self.stamps[index, 1])

    def sample_times_into(self, handle, image, first, count, out):
        out[:count] = self.stamps[first : first + count]

    def clock(self):  # CUPTI's clock: the recording's start outside sampling, its last sample's end while it runs
        return int(self.stamps[-1, 1]) if self.running else self.meta["session_start_ns"]


_spawned: list = []  # every worker process spawned by the tests of this module


def live_workers() -> list[int]:
    return [p.pid for p in _spawned if p.poll() is None]


class FakeContext:
    def __init__(self, events, unique=7):
        self.handle, self.unique, self.events = 0xC0, unique, events

    def unique_id(self):
        return self.unique

    def make_current(self):
        pass

    def close(self):
        self.events.append("context released")


@pytest.fixture
def cupti(pm_recording, monkeypatch):
    """The simulated CUPTI in place of the real PM sampling calls, a keeper of its own (kept until released, its
    rendezvous on a GPU of its own) and every worker spawned counted; what a test leaves kept is released after."""
    fake = FakeCupti(pm_recording)
    for name in ("enable", "set_config", "start", "stop", "disable", "counter_data_size", "initialize_counter_data",
                 "new_counter_data", "decode", "counter_data_info", "sample_info", "sample_times_into"):
        monkeypatch.setattr(pm, name, getattr(fake, name))
    availability = np.load(AVAILABILITY)
    _images.trust(availability, _images.Kind.AVAILABILITY)  # CUPTI's own in a real session
    monkeypatch.setattr(pm, "counter_availability", lambda device: availability)
    monkeypatch.setattr("gpuscope.cupti.activity.timestamp", fake.clock)
    monkeypatch.setattr("gpuscope._gpu.device.PrimaryContext", lambda index: FakeContext(fake.events))
    monkeypatch.setattr("gpuscope._gpu.device.device_info", lambda index: SimpleNamespace(sm_clock_khz=1_755_000))
    monkeypatch.setattr(_sampling.Sampler, "_context_device", lambda self: 0)
    monkeypatch.setattr(profiler, "device_support", lambda device, api: SimpleNamespace(supported=True))
    monkeypatch.setattr(profiler, "initialize", lambda *a, **k: None)
    monkeypatch.setattr(profiler, "deinitialize", lambda **k: fake.events.append("deinitialize"))
    monkeypatch.setattr(profiler, "chip_name", lambda device: "GH100")
    real_popen = subprocess.Popen

    def popen(args, *rest, **kwargs):
        proc = real_popen(args, *rest, **kwargs)
        if _pm_workers.BOOT in args:  # an evaluation worker (not a CUPTI probe or image check)
            _spawned.append(proc)
            fake.events.append("spawn")
        return proc

    monkeypatch.setattr(subprocess, "Popen", popen)
    real_stop = _pm_workers.ProcessEvaluation._stop_workers

    def stop_workers(self):
        real_stop(self)
        fake.events.append(f"workers stopped (alive: {sum(w.proc.poll() is None for w in self._workers)})")

    monkeypatch.setattr(_pm_workers.ProcessEvaluation, "_stop_workers", stop_workers)
    monkeypatch.setenv("GPUSCOPE_KEEP", "inf")
    monkeypatch.setattr(_keep, "_kept", {})
    monkeypatch.setattr(_keep, "_sessions", {})
    monkeypatch.setattr(_keep, "_listeners", {})
    gpu = f"test-{uuid.uuid4().hex[:12]}"
    monkeypatch.setattr(_rendezvous, "gpu_id", lambda device: f"{gpu}-{device}")
    yield fake
    _keep.release()
    for proc in _spawned:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    _spawned.clear()


def session(fake, **options):
    """One ``gs.sample`` session with worker processes (the default) around nothing: the recording arrives."""
    options = {"interval": "100us", "samples_per_image": 400, "image_pool": 2, "evaluators": 2, **options}
    s = _sampling.Sampler(fake.meta["metrics"], **options)
    with s:
        pass
    return s


def assert_recording_evaluated(s, fake):
    assert s._decoder.errors == [] and s.evaluate_in == "process"
    values, stamps = s._values, s._stamps
    assert values.shape == (fake.meta["completed"], len(fake.meta["metrics"]))
    for i, name in enumerate(fake.meta["metrics"]):
        np.testing.assert_allclose(values[:, i], fake.meta["values_device"][name], rtol=1e-9, atol=1e-9)
    assert np.abs(stamps - fake.stamps).max() <= 1_000  # rebuilt by a worker from durations
    assert s._decoder.evaluation_counts() == {"ready": 2, "lost": 0, "recovered": 0, "images_lost": 0}


def pool_addresses(kept) -> list[int]:
    return sorted(image.ctypes.data for image in kept.image.images)


def test_sessions_in_a_row_never_leave_cupti_an_object_whose_buffers_were_freed(cupti):
    """The scenario that crashed on the H100 (several PM sessions with workers in a row), on the simulated CUPTI:
    with the sampler kept and its workers' images freed at each session's end, the second session's first call on
    the kept object is a call on freed memory."""
    for _ in range(3):
        s = session(cupti)
        assert cupti.dead == []
        assert_recording_evaluated(s, cupti)
    assert _keep.release() == 1
    assert cupti.dead == [] and cupti.events.count("spawn") == 2


def test_the_next_session_takes_the_workers_and_their_pool_back(cupti):
    first = session(cupti)
    assert_recording_evaluated(first, cupti)
    (kept,) = _keep._kept.values()
    owner = kept.profiler
    workers = live_workers()
    addresses = pool_addresses(kept)
    assert len(workers) == 2 and owner.evaluation.reusable()
    assert mapped_images(addresses) == 2  # the pool's shared memory stays mapped while kept
    assert gpuscope_threads() == ["gpuscope-pm-results"] * 2  # the workers' readers; no dispatcher between sessions
    assert cupti.events.count("spawn") == 2

    second = session(cupti)
    assert second.reused and _keep._kept[0].profiler is owner  # and kept again
    assert_recording_evaluated(second, cupti)
    assert cupti.events.count("spawn") == 2 and live_workers() == workers  # no worker spawned anew
    assert pool_addresses(_keep._kept[0]) == addresses and mapped_images(addresses) == 2
    assert [e for e in cupti.events if e.startswith(("enable", "disable"))] == ["enable 101"]
    assert first._decoder.evaluation_counts()["ready"] == 2  # the first session's counts are its own
    assert cupti.dead == []


def _give_back_on_the_listeners_thread():
    """What this process does when another gpuscope process asks for the counters (the rendezvous listener)."""
    answered = []
    t = threading.Thread(target=lambda: answered.append(_keep.answer(0)), name="gpuscope-rendezvous")
    t.start()
    t.join(BOUND)
    assert answered == [f"{_rendezvous.RELEASED} (the kept PM sampler)"]


def test_an_image_handed_over_empty_before_the_stop_leaves_the_sampler_kept(cupti, monkeypatch):
    """The race behind the flaky release tests (KeyError: 0 under load): when the decode thread expects a backlog
    larger than the room left (a slow decode, a long gap between drains), it hands the image holding the samples
    over and decodes into a fresh one, which the stop then hands over empty. CUPTI's initialised images carry its
    header and evaluate as 0 samples; the simulated CUPTI left them zero, their evaluation failed, and the session
    was not clean enough to keep. Forced here: the decode that delivers the samples says the image is full, and
    the decode thread goes on into a fresh image, which nothing more arrives in."""
    decode = cupti.decode

    def fills_the_image(handle, image):
        delivering = cupti.pending
        result = decode(handle, image)
        return pm.Decoded(stop_reason=pm.PmDecodeStopReason.COUNTER_DATA_FULL, overflow=False) if delivering else result

    monkeypatch.setattr(pm, "decode", fills_the_image)
    s = session(cupti)
    assert s._decoder.errors == [] and s._decoder.handed_off == 2  # the samples' image, then an empty one
    assert_recording_evaluated(s, cupti)
    assert _keep.kept_devices() == [0]


@pytest.mark.parametrize("how", ["gs.release", "another process asks", "exit"])
def test_release_stops_the_workers_then_disables_then_unmaps(cupti, how):
    import gpuscope as gs

    session(cupti)
    addresses = pool_addresses(_keep._kept[0])
    cupti.events.clear()
    {"gs.release": lambda: gs.release() == 1 or pytest.fail("not released"),
     "another process asks": _give_back_on_the_listeners_thread, "exit": _keep._at_exit}[how]()
    assert _keep.kept_devices() == []
    gc.collect()
    assert cupti.events == ["workers stopped (alive: 0)", "disable 101 (workers alive: 0, images mapped: 2)",
                            "deinitialize", "context released"]
    assert mapped_images(addresses) == 0 and live_workers() == [] and gpuscope_threads() == []
    assert cupti.dead == []


def test_the_idle_timer_releases_them_in_the_same_order_off_the_sessions_thread(cupti, monkeypatch):
    monkeypatch.setenv("GPUSCOPE_KEEP", "0.2")
    session(cupti)
    (kept,) = _keep._kept.values()
    addresses = pool_addresses(kept)
    cupti.events.clear()
    kept.timer.join(BOUND)
    assert not kept.timer.is_alive() and _keep.kept_devices() == []
    del kept
    gc.collect()
    assert cupti.events == ["workers stopped (alive: 0)", "disable 101 (workers alive: 0, images mapped: 2)",
                            "deinitialize", "context released"]
    assert mapped_images(addresses) == 0 and live_workers() == [] and gpuscope_threads() == []


def test_another_configuration_releases_them_before_its_own(cupti):
    session(cupti)
    first = live_workers()
    cupti.events.clear()
    other = session(cupti, evaluators=1)  # another number of workers: another configuration
    assert not other.reused
    assert cupti.events[:4] == ["workers stopped (alive: 0)", "disable 101 (workers alive: 0, images mapped: 2)",
                                "deinitialize", "context released"]
    assert cupti.events[4:6] == ["enable 102", "spawn"]
    assert not set(first) & set(live_workers()) and len(live_workers()) == 1
    assert_recording_evaluated_by(other, cupti, workers=1)
    assert cupti.dead == []


def assert_recording_evaluated_by(s, fake, workers):
    values = s._values
    assert s._decoder.errors == [] and values.shape[0] == fake.meta["completed"]
    np.testing.assert_allclose(values[:, 0], fake.meta["values_device"][fake.meta["metrics"][0]], rtol=1e-9, atol=1e-9)
    assert s._decoder.evaluation_counts()["ready"] == workers


def test_a_kept_worker_that_died_is_noticed_and_the_session_starts_afresh(cupti):
    session(cupti)
    (kept,) = _keep._kept.values()
    victim = kept.profiler.evaluation._workers[0].proc
    victim.kill()
    victim.wait()
    assert not kept.profiler.usable()
    cupti.events.clear()
    done = []
    t = threading.Thread(target=lambda: done.append(session(cupti)))
    t.start()
    t.join(BOUND)
    assert not t.is_alive(), "the session after a dead kept worker hung"
    (s,) = done
    assert not s.reused
    assert cupti.events[:4] == ["workers stopped (alive: 0)", "disable 101 (workers alive: 0, images mapped: 2)",
                                "deinitialize", "context released"]
    assert "enable 102" in cupti.events and cupti.events.count("spawn") == 2
    assert_recording_evaluated(s, cupti)
    assert cupti.dead == []


def test_a_worker_lost_after_the_check_is_counted_and_its_share_evaluated(pm_recording):
    """A worker that dies between the keeper's check and the next session's attach: the session goes on with the
    other worker (or in this process), and says that one was lost."""
    pipe, backend = backend_for(pm_recording, workers=2, pool=2)
    backend.start()
    assert backend.wait_ready() == 2
    submit_all(backend, pm_recording)
    assert backend.finish() and backend._pipe is None and backend.reusable()
    assert_all_evaluated(pipe, pm_recording)
    victim = backend._workers[0]
    victim.proc.kill()
    deadline = time.monotonic() + BOUND
    while victim.alive and time.monotonic() < deadline:  # its reader sees the end of the connection
        time.sleep(0.01)
    assert not backend.reusable() and pipe.errors == []  # the finished session is told nothing
    nxt, _ = backend_for(pm_recording, workers=0, pool=0)
    backend.attach(nxt)
    submit_all(backend, pm_recording)
    backend.close()
    assert backend.workers_lost == 1 and backend.ready_workers == 1
    assert [e for e in nxt.errors if "lost between sessions" in e]
    assert_all_evaluated(nxt, pm_recording)


def test_a_failed_start_on_kept_workers_leaves_nothing_behind(cupti, monkeypatch):
    session(cupti)
    addresses = pool_addresses(_keep._kept[0])
    cupti.events.clear()

    def refused(handle):
        raise KeyboardInterrupt  # Ctrl-C just as sampling starts

    monkeypatch.setattr(pm, "start", refused)
    with pytest.raises(KeyboardInterrupt):
        session(cupti)
    gc.collect()
    assert _keep.kept_devices() == [] and live_workers() == [] and gpuscope_threads() == []
    assert mapped_images(addresses) == 0
    # the kept context and initialisation were handed over at the take (the session holds its own); then its own
    assert cupti.events == ["context released", "deinitialize", "workers stopped (alive: 0)",
                            "disable 101 (workers alive: 0, images mapped: 2)", "deinitialize", "context released"]
    assert cupti.dead == []


def test_ctrl_c_while_kept_workers_are_released_leaves_nothing_behind(cupti, monkeypatch):
    """A session of another configuration releases the kept sampler on the user's thread (workers stopped,
    disable): a Ctrl-C there used to cut the release short, leaving the workers running and the counters held."""
    session(cupti)
    disable = cupti.disable

    def interrupted(handle):
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)  # a terminal's Ctrl-C
        time.sleep(0.1)
        disable(handle)

    monkeypatch.setattr(pm, "disable", interrupted)
    cupti.events.clear()
    with pytest.raises(KeyboardInterrupt):
        session(cupti, evaluators=1)
    assert cupti.events[:4] == ["workers stopped (alive: 0)", "disable 101 (workers alive: 0, images mapped: 2)",
                                "deinitialize", "context released"]
    assert _keep.kept_devices() == [] and live_workers() == [] and gpuscope_threads() == []


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_leaves_the_kept_workers_to_its_parent(cupti):
    session(cupti)
    (kept,) = _keep._kept.values()
    workers, addresses = live_workers(), pool_addresses(kept)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: nothing kept, nothing disabled or freed, only its copies of the connections closed
        code = 1
        try:
            conns = [w.conn for w in kept.image.evaluation._workers]
            said = (f"{_keep.kept_devices()} {sum(e.startswith('disable') for e in cupti.events)} "
                    f"{all(c.closed for c in conns) and len(conns) == 2} {mapped_images(addresses)} "
                    f"{len(_sampling._never_freed) >= 3}")
            os.write(write, said.encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert os.read(read, 1000).decode() == "[] 0 True 2 True"
    os.close(read)
    assert live_workers() == workers and kept.profiler.usable()
    again = session(cupti)  # the parent's workers serve on
    assert again.reused and live_workers() == workers
    assert_recording_evaluated(again, cupti)
    assert cupti.dead == []


def test_what_cupti_was_given_outlives_the_sampling_object_only_until_disable(cupti):
    """The config of SetConfig and every image are held by the sampling object: a warm session used to drop the
    config CUPTI was configured with (the kept one went with the keeper's entry) and keep a new one CUPTI never saw."""
    session(cupti)
    owner = _keep._kept[0].profiler
    config = weakref.ref(owner.config)
    session(cupti)
    assert _keep._kept[0].profiler.config is config()
    del owner
    _keep.release()
    gc.collect()
    assert config() is None and cupti.dead == []
