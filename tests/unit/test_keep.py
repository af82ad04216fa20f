"""What sessions keep between them (gpuscope._gpu.keep) and small counter-data images emptied when full (no GPU)."""

import os
import subprocess
import sys
import threading
import time
import uuid
import warnings
from pathlib import Path

import pytest

from gpuscope._gpu import hosts as _hosts
from gpuscope._gpu import keep as _keep
from gpuscope._gpu import rendezvous as _rendezvous
from gpuscope._range_profiling import session as _session
from gpuscope._range_profiling.filters import KernelFilter
from gpuscope._range_profiling.launches import KernelReplay
from gpuscope._results.job import rank_info
from gpuscope._util.launchers import LAUNCHERS
from gpuscope.cupti.callbacks import Launch
from gpuscope.errors import GpuscopeWarning

CTX = 0x1234


class FakeFinalizer:
    def __init__(self):
        self.detached = False

    def detach(self):
        self.detached = True


class FakeProfiler:
    def __init__(self):
        self.closed = 0
        self._finalizer = FakeFinalizer()

    def close(self):
        self.closed += 1


class FakeContext:
    def __init__(self):
        self.closed = 0

    def make_current(self):
        pass

    def close(self):
        self.closed += 1


@pytest.fixture
def kept_state(monkeypatch):
    """A clean keeper whose releases count (cuptiProfilerDeInitialize is not called), listening on the rendezvous of
    a GPU of its own (tests/unit/test_rendezvous.py); what a test leaves kept is released after it."""
    deinit = []
    monkeypatch.setenv("GPUSCOPE_KEEP", "inf")  # no idle timers unless a test asks for them
    monkeypatch.setattr(_keep, "_kept", {})
    monkeypatch.setattr(_keep, "_sessions", {})
    monkeypatch.setattr(_keep, "_listeners", {})
    monkeypatch.setattr(_rendezvous, "gpu_id", lambda device, gpu=f"test-{uuid.uuid4().hex[:12]}": f"{gpu}-{device}")
    monkeypatch.setattr("gpuscope.cupti.profiler.deinitialize", lambda **k: deinit.append(1))
    yield deinit
    _keep.release()


def kept(key=("ctx", ("m",), 1, 2, 64, 1), context_id=7):
    return _keep.Kept(key, context_id, FakeContext(), FakeProfiler(), "config", "image")


def test_take_gives_back_only_the_same_configuration_on_the_same_context(kept_state):
    k = kept()
    _keep.keep(0, k)
    assert _keep.kept_devices() == [0]
    assert _keep.take(0, k.key, 7) is k
    assert _keep.kept_devices() == [] and k.profiler.closed == 0
    assert _keep.take(0, k.key, 7) is None  # taken once

    other = kept()
    _keep.keep(0, other)
    assert _keep.take(0, ("ctx", ("m",), 1, 2, 128, 1), 7) is None  # another size: released, not reused
    assert other.profiler.closed == 1 and other.context.closed == 1 and kept_state == [1]


def test_a_context_made_again_is_not_touched(kept_state):
    k = kept()
    _keep.keep(0, k)
    assert _keep.take(0, k.key, context_id=8) is None
    assert k.profiler.closed == 0 and k.profiler._finalizer.detached  # its context is gone: never disabled
    assert k.context.closed == 1


def test_release_one_device_or_all(kept_state):
    a, b, c = kept(), kept(), kept()
    _keep.keep(0, a)
    _keep.keep(1, b)
    _keep.keep(1, c)  # replaces b, which is released
    assert b.profiler.closed == 1
    assert _keep.release(0) == 1 and a.profiler.closed == 1
    assert _keep.release(0) == 0
    assert _keep.release() == 1 and c.profiler.closed == 1
    assert _keep.kept_devices() == []


def test_release_failure_is_a_warning_and_the_rest_is_released(kept_state):
    k = kept()

    def refuse():
        raise RuntimeError("CUPTI said no")

    k.profiler.close = refuse
    _keep.keep(0, k)
    with pytest.warns(Warning, match="releasing the kept range profiler failed: CUPTI said no"):
        assert _keep.release() == 1
    assert _keep.kept_devices() == []
    assert kept_state == [1] and k.context.closed == 1  # de-initialised and let go of all the same


def test_env_switches_keeping_off(monkeypatch):
    monkeypatch.setenv(_keep.ENV, "0")
    assert not _keep.enabled()
    monkeypatch.setenv(_keep.ENV, "1")
    assert _keep.enabled()
    monkeypatch.delenv(_keep.ENV)
    assert _keep.enabled()


def test_host_setup_is_made_once_per_device_chip_and_metrics(monkeypatch):
    monkeypatch.setattr(_hosts, "_hosts", {})
    made = []

    def make():
        made.append(1)
        return _keep.HostSetup("host", "config", 7, {})

    one = _keep.host_for(0, "GH100", ("a", "b"), make)
    assert _keep.host_for(0, "GH100", ("a", "b"), make) is one and len(made) == 1
    _keep.host_for(1, "GH100", ("a", "b"), make)
    _keep.host_for(0, "GH100", ("a",), make)
    assert len(made) == 3


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_forgets_the_parents_profiler(kept_state):
    k = kept()
    _keep.keep(0, k)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: nothing kept, nothing disabled
        os.write(w, f"{_keep.kept_devices()} {k.profiler.closed} {k.profiler._finalizer.detached}".encode())
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(r, 100).decode() == "[] 0 True"
    assert _keep.kept_devices() == [0] and not k.profiler._finalizer.detached


@pytest.mark.parametrize("launches, ranges", [(0, 16), (1, 16), (8, 16), (9, 32), (24, 32), (25, 64), (200, 256),
                                              (10**7, 1 << 20)])
def test_iteration_images_are_powers_of_two_with_room(launches, ranges):
    assert _session._capacity(launches) == ranges


class FakeRP:
    def __init__(self):
        self.calls = []

    def start(self):
        self.calls.append("start")

    def stop(self):
        self.calls.append("stop")


def test_kernel_mode_empties_a_full_image_at_the_launch_that_would_not_fit():
    rp = FakeRP()
    full = []
    replay = KernelReplay(rp, CTX, KernelFilter.build(), str, lambda: ("", None), lambda: 0, capacity=2,
                          on_full=lambda: (full.append(len(replay.selected)),
                                           setattr(replay, "image_first", len(replay.selected))))
    for i in range(5):
        token = replay.on_enter(Launch(f"k{i}", (1, 1, 1), (32, 1, 1), CTX))
        replay.on_exit(token)
    assert full == [2, 4]  # before the 3rd and the 5th launch
    assert [s.kernel for s in replay.selected] == ["k0", "k1", "k2", "k3", "k4"] and replay.image_first == 4


def test_kernel_mode_without_capacity_never_empties():
    replay = KernelReplay(FakeRP(), CTX, KernelFilter.build(), str, lambda: ("", None), lambda: 0,
                          on_full=lambda: pytest.fail("emptied"))
    for i in range(100):
        replay.on_exit(replay.on_enter(Launch("k", (1, 1, 1), (32, 1, 1), CTX)))


def test_user_mode_empties_a_full_image_into_the_next_pass_group(monkeypatch):
    from tests.unit.test_session_faults import FakeRangeProfiler, user_session

    monkeypatch.setattr("gpuscope.cupti.activity.timestamp", lambda: 1)
    rp = FakeRangeProfiler()
    p = user_session(rp, cycles=1)
    p.max_depth, p.max_ranges, p._running = 1, 2, True
    for name in ["a", "b", "a", "c", "d", "e"]:  # a repeated path stays one range of the image
        p.range_push(name)
        p.range_pop(name)
    assert [c for c in rp.calls if c in ("stop", "start") or c.startswith("collect")] == [
        "stop", "collect 0 bad=False", "start", "stop", "collect 1 bad=False", "start"]
    assert p._group_index == 2 and p._notes["image_flushes"] == 2
    assert list(p._group_rows) == ["e"]


def test_import_gpuscope_leaves_xarray_until_it_is_imported():
    code = ("import sys, gpuscope; assert 'xarray' not in sys.modules, 'imported'; import xarray; "
            "ds = xarray.Dataset(); print(type(ds.gpuscope).__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "GpuscopeAccessor"


def test_accessor_is_there_when_xarray_came_first():
    code = "import xarray, gpuscope; print(type(xarray.Dataset().gpuscope).__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "GpuscopeAccessor", out.stderr


class _SwitchingDict(dict):
    """The keeper's profilers by device, giving other threads the interpreter after every pop: a thread switch
    inside keep()'s and take()'s critical sections, which the GIL alone makes rare."""

    def pop(self, *args):
        out = super().pop(*args)
        time.sleep(0.0002)
        return out


@pytest.mark.parametrize("switching", [False, True], ids=["as-is", "switch-inside"])
def test_threads_share_the_keeper_safely(kept_state, monkeypatch, switching):
    """Every profiler handed to the keeper is taken back once or released once, never both, never neither. With
    a thread switch after every pop from the keeper's dict (``switch-inside``), an unlocked keeper loses profilers
    (neither taken nor released: measured by replacing its lock with a null context); the lock is what this checks."""
    if switching:
        monkeypatch.setattr(_keep, "_kept", _SwitchingDict())
    errors, made, taken = [], [], []
    start = threading.Barrier(4)

    def churn(device):
        start.wait()
        try:
            for _ in range(200):
                k = kept()
                made.append(k)
                _keep.keep(device, k)
                back = _keep.take(device, k.key, 7)
                if back is not None:
                    taken.append(back)
        except Exception as exc:  # pragma: no cover - the failure being tested for
            errors.append(exc)

    threads = [threading.Thread(target=churn, args=(d % 2,)) for d in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    _keep.release()
    assert not errors
    ids = [id(k) for k in taken]
    assert len(set(ids)) == len(ids)  # none taken twice
    back = set(ids)
    assert all((k.profiler.closed, id(k) in back) in ((1, False), (0, True)) for k in made)
    assert len(kept_state) == len(made) - len(taken)  # one cuptiProfilerDeInitialize per release


def test_a_late_timer_leaves_alone_what_is_kept_after_its_profiler(kept_state, monkeypatch):
    """A timer that fires after its profiler was taken back (and another kept) must not release the newer one."""
    first, second = kept(), kept()
    _keep.keep(0, first)
    assert _keep.take(0, first.key, 7) is first
    _keep.keep(0, second)
    _keep._expire(0, first)  # the first one's timer, firing late
    assert _keep.kept_devices() == [0] and second.profiler.closed == 0 and kept_state == []


class Watched(dict):
    """The keeper's table, noting whether the keeper's lock is held at each look-up and removal."""

    def __init__(self, *args):
        super().__init__(*args)
        self.locked = []

    def get(self, *args):
        self.locked.append(("get", _keep._lock.locked()))
        return super().get(*args)

    def __delitem__(self, key):
        self.locked.append(("del", _keep._lock.locked()))
        super().__delitem__(key)


def test_the_idle_timer_checks_and_takes_under_the_keepers_lock(kept_state, monkeypatch):
    """The timer's expiry looks the profiler up and takes it out in one step under the lock: between a look-up and a
    removal made apart, a session on another thread could take the same profiler, and both would use it (the timer
    disabling it under the session). Every other path to the table takes the lock, so a test of outcomes cannot see
    the gap; this one sees the lock."""
    k = kept()
    _keep.keep(0, k)
    watched = Watched(_keep._kept)
    monkeypatch.setattr(_keep, "_kept", watched)
    _keep._expire(0, k)  # the timer firing
    assert watched.locked == [("get", True), ("del", True)]
    assert k.profiler.closed == 1 and _keep.kept_devices() == [] and kept_state == [1]


class SlowProfiler(FakeProfiler):
    """A disable that takes a while (13 ms to 0.5 s on the H100), on the idle timer's thread."""

    def __init__(self):
        super().__init__()
        self.closing, self.finish = threading.Event(), threading.Event()

    def close(self):
        self.closing.set()
        self.finish.wait(10)
        self.closed += 1


@pytest.mark.parametrize("call", ["release", "release(0)", "take"])
def test_release_and_take_wait_for_the_idle_timers_release(kept_state, monkeypatch, call):
    """While the timer disabled the kept profiler, release() returned 0 at once and take() None: a new session
    could enable a profiler on the same context, and PC sampling could start, beside the one still enabled."""
    monkeypatch.setenv("GPUSCOPE_KEEP", "0.01")
    k = kept(context_id=7)
    k.profiler = SlowProfiler()
    _keep.keep(0, k)
    assert k.profiler.closing.wait(5) and _keep.kept_devices() == []
    threading.Timer(0.2, k.profiler.finish.set).start()
    if call == "take":
        assert _keep.take(0, k.key, 7) is None
    else:
        assert _keep.release(0 if call == "release(0)" else None) == 1
    assert k.profiler.closed == 1 and k.context.closed == 1 and kept_state == [1]  # returned once it ended


def without_launchers(monkeypatch):
    for names in LAUNCHERS.values():
        for name in names:
            for one in [name] if isinstance(name, str) else name or []:
                monkeypatch.delenv(one, raising=False)
    monkeypatch.delenv("GPUSCOPE_KEEP", raising=False)


@pytest.mark.parametrize("env, expected", [({}, 10.0), ({"GPUSCOPE_KEEP": "0"}, 0.0), ({"GPUSCOPE_KEEP": "2.5"}, 2.5),
                                           ({"GPUSCOPE_KEEP": "inf"}, float("inf")), ({"GPUSCOPE_KEEP": "off"}, 0.0),
                                           ({"OMPI_COMM_WORLD_SIZE": "4"}, 0.0), ({"SLURM_NTASKS": "1"}, 10.0),
                                           ({"SLURM_NTASKS": "8", "GPUSCOPE_KEEP": "30"}, 30.0)])
def test_how_long_a_profiler_is_kept(monkeypatch, env, expected):
    without_launchers(monkeypatch)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert _keep.seconds() == expected


@pytest.mark.parametrize("text", ["ten", "nan", "-1"])
def test_a_bad_keep_value_is_warned_about_once_and_the_default_used(monkeypatch, text):
    """``nan`` used to turn keeping off without a word, ``-1`` too, and text warned at every session, attributed to
    ``sys:1`` when a teardown thread asked."""
    monkeypatch.setattr(_keep, "_warned", set())
    monkeypatch.setenv("GPUSCOPE_KEEP", text)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert [_keep.seconds() for _ in range(3)] == [10.0] * 3 and _keep.enabled()
    assert [str(w.message) for w in caught] == [
        f"GPUSCOPE_KEEP={text!r} is not a number of seconds: use a number from 0, inf (keep until exit) or off "
        "(never keep). Keeping for 10 s."]
    assert caught[0].category is GpuscopeWarning and caught[0].filename == _keep.__file__


def test_a_keep_time_longer_than_a_timer_can_wait_keeps_until_exit(kept_state, monkeypatch):
    """``GPUSCOPE_KEEP=1e10`` killed the timer thread (OverflowError): its profiler was neither released when idle
    nor said to be kept for good."""
    monkeypatch.setenv("GPUSCOPE_KEEP", "1e10")
    died = []
    monkeypatch.setattr(threading, "excepthook", died.append)
    assert _keep.seconds() == float("inf")
    k = kept()
    _keep.keep(0, k)
    if k.timer is not None:
        k.timer.join(5)
    assert died == [] and _keep.kept_devices() == [0]
    assert _keep.release() == 1 and k.profiler.closed == 1


@pytest.mark.parametrize("launcher", list(LAUNCHERS))
def test_nothing_is_kept_where_a_launcher_says_processes_share_this_host(monkeypatch, launcher):
    """One rule for every launcher: its local world size where it gives one, else its world size. Under torchrun
    (``WORLD_SIZE=2 LOCAL_WORLD_SIZE=2``) the profiler used to be kept for 10 s, so the sibling rank on the GPU got
    HARDWARE_BUSY, while Open MPI's ``OMPI_COMM_WORLD_SIZE=2`` kept nothing."""
    rank, local, size, local_size = (name if name is None or isinstance(name, str) else name[0]
                                     for name in LAUNCHERS[launcher])
    without_launchers(monkeypatch)
    for name, value in ((rank, "1"), (local, "1"), (size, "2")):
        monkeypatch.setenv(name, value)
    if local_size is not None:
        monkeypatch.setenv(local_size, "2")
    info = rank_info()
    assert (info.launcher, info.world_size, info.local_world_size) == (launcher, 2, -1 if local_size is None else 2)
    assert _keep.seconds() == 0.0
    if local_size is not None:  # two hosts, one rank each: no sibling on this GPU
        monkeypatch.setenv(local_size, "1")
        monkeypatch.setenv(local, "0")
        assert rank_info().local_world_size == 1 and _keep.seconds() == 10.0
    monkeypatch.setenv("GPUSCOPE_KEEP", "30")
    assert _keep.seconds() == 30.0


def test_an_idle_profiler_is_released_by_its_timer(kept_state, monkeypatch):
    monkeypatch.setenv("GPUSCOPE_KEEP", "0.05")
    k = kept()
    _keep.keep(0, k)
    k.timer.join(5)
    assert _keep.kept_devices() == [] and k.profiler.closed == 1 and kept_state == [1]
    monkeypatch.setenv("GPUSCOPE_KEEP", "0.2")
    taken = kept()
    _keep.keep(0, taken)
    assert _keep.take(0, taken.key, 7) is taken  # taken in time: its timer is cancelled
    taken.timer.join(5)
    assert taken.profiler.closed == 0 and _keep.kept_devices() == []


def test_xarray_is_imported_in_the_background_and_the_thread_ends():
    code = ("import sys, threading; from gpuscope._gpu import keep as _keep; assert 'xarray' not in sys.modules; "
            "_keep.import_xarray_soon(); _keep.import_xarray_soon(); _keep.imports_done(); "
            "print('xarray' in sys.modules, [t.name for t in threading.enumerate() if t.name.startswith('gpuscope-')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "True []", out.stderr


FORK_DURING_IMPORT = """
import os, sys, time, warnings
warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: a fork while a thread runs
from gpuscope._gpu import imports as _imports, keep as _keep

def child():
    import xarray
    xarray.Dataset({"x": ("t", [1.0])})
    os._exit(0)

_keep.import_xarray_soon()  # what every session start calls
while "xarray" not in sys.modules:  # the import thread has begun xarray itself: its module lock is held
    time.sleep(0.0005)
during = _imports._importer.is_alive()
if sys.argv[1] == "os.fork":
    pid = os.fork()
    if pid == 0:
        child()
else:  # how a DataLoader worker starts
    import multiprocessing
    proc = multiprocessing.get_context("fork").Process(target=child)
    proc.start()
    pid = proc.pid
deadline = time.monotonic() + 30
while True:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        break
    if time.monotonic() > deadline:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        status = "hung"
        break
    time.sleep(0.02)
print(during, status)
"""


@pytest.mark.parametrize("how", ["os.fork", "multiprocessing"])
def test_a_child_forked_during_the_background_import_can_import_xarray(how):
    """The child of a fork 0-0.8 s after a session starts used to hang for ever at its first ``import xarray``: the
    import thread held xarray's module lock at the fork (Python 3.11-3.13)."""
    out = subprocess.run([sys.executable, "-c", FORK_DURING_IMPORT, how], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[2])
    assert out.stdout.split() == ["True", "0"], out.stdout + out.stderr  # forked mid-import; the child exited 0
    assert out.stderr == ""


class FakeGroupCollector:
    """An iteration collector holding an incomplete pass group (found iterations, filters that matched nothing)."""

    in_iteration = counting = False
    left_out, other_context, errors = 5, 0, []

    def __init__(self):
        self.group = object()

    def take_group(self):
        group, self.group = self.group, None
        return group


class FakeContextHandle:
    handle = 1

    def close(self):
        pass


def test_found_iterations_without_rows_close_without_an_error(monkeypatch):
    from gpuscope._range_profiling.repetition import Tracker

    monkeypatch.setattr("gpuscope.cupti.profiler.deinitialize", lambda **k: None)
    p = _session.Profiler.__new__(_session.Profiler)
    p.mode, p.mode_used = _session.Mode.AUTO, _session.Mode.ITERATION
    p._state, p._pid, p._stack, p._rows, p._notes = "open", os.getpid(), [], [], {}
    p._recorder = p._rp = None
    p._tracker, p._collector, p._context = Tracker(), FakeGroupCollector(), FakeContextHandle()
    p.device, p.print_report, p.filter = 0, False, KernelFilter.build(kernels=["nosuchkernel"])
    with pytest.warns(Warning, match="No launch matched the kernel filters"):
        p.close()  # no MultiPassRangeError: what gpuscope run reports as "nothing matched" (status 6)
    assert p._collector.group is None and p._notes["iterations_found_by"] == "none"


def test_reuse_hands_the_kept_profiler_to_a_session_with_its_own_context(kept_state, monkeypatch):
    k = kept()
    _keep.keep(0, k)
    assert _keep.reuse(0, k.key, 7) is k
    assert k.profiler.closed == 0 and k.context.closed == 1 and kept_state == [1]  # the session holds its own
    _keep.keep(0, k)
    monkeypatch.setenv("GPUSCOPE_KEEP", "0")
    assert _keep.reuse(0, k.key, 7) is None and _keep.kept_devices() == [0]  # keeping off: nothing taken
