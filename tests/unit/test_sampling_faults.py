"""Faults of a PM sampler and its pipeline without a GPU (docs/reliability.md, "PM sampling"): range names thousands
of characters long; a start that fails at its last step; a fork while it runs; evaluations and decodes that never
return. CUPTI's PM sampling calls are simulated (test_sampling_pipeline.FakePm); evaluation workers are real
processes. Waits below are liveness bounds, not timings."""

import gc
import os
import signal
import threading
import time

import numpy as np
import pytest
import xarray as xr

from gpuscope._results import io as _io
from gpuscope._pm_sampling import multi as _multi_sampling
from gpuscope._pm_sampling import pipeline as _pm_pipeline
from gpuscope._pm_sampling import workers as _pm_workers
from gpuscope._results import build as _results
from gpuscope._pm_sampling import sampler as _sampling
from gpuscope._pm_sampling import timeline as _timeline
from gpuscope._pm_sampling.timeline import Span
from gpuscope.cupti import host
from gpuscope.cupti import pm_sampling as pm

from .test_pm_workers import AVAILABILITY, FakePipeline, batch
from .test_sampling_pipeline import FakePm


# -- long range names ----------------------------------------------------------------------------------------
def long_named_samples(n=20_000, name_length=1_000, device=None):
    """A PM Dataset as Sampler._build makes it: *n* samples, the first 15,000 inside a range with a very long
    name (the same spans for any *n*, as for the devices of one process)."""
    name = "r" * name_length
    start = np.arange(n, dtype=np.int64) * 1000 + 10_000
    spans = [Span(name, 1, 10_600, 10_000 + 1000 * 14_999), Span(f"{name}/inner", 1, 20_000, 30_000)]
    ranges = _timeline.innermost_ranges(start + 500, spans)
    device_attrs = {} if device is None else {"device_index": device}
    ds = _results.sampling_dataset(
        values=np.ones((1, n)), metrics=["m"], properties={"m": {"units": "percent"}}, start_ns=start,
        end_ns=start + 1000, ranges=ranges, spans=spans, session_start_ns=10_000, chip="GH100",
        attrs={"interval_ns": 1000, "lost_samples": 0, **device_attrs},
    )
    return ds, name


def assert_names_shared(values, distinct):
    """Each distinct name is one str object: the coordinate costs a pointer per sample, not a name."""
    assert values.dtype == object
    assert len({id(v) for v in values.ravel()}) == distinct


def test_a_long_range_name_costs_its_length_once(tmp_path):
    """A 1,000-character name over 20,000 samples made an 80 MB <U1000 coordinate (10,000 characters over
    200,000 samples: 7.6 GB); now it is 8 bytes a sample, in memory and after a netCDF round trip."""
    ds, name = long_named_samples()
    values = ds["range"].values
    assert values.nbytes == 8 * values.size
    assert_names_shared(values, 3)  # "", the name, the inner range
    assert values[0] == "" and values[1] == name and values[12] == f"{name}/inner" and values[-1] == ""
    path = tmp_path / "long.nc"
    _io.save_dataset(ds, path)
    assert path.stat().st_size < 2_000_000  # each name stored once (as sample strings it was 20 MB)
    back = _io.open_dataset(path)
    xr.testing.assert_identical(back, ds)
    assert_names_shared(back["range"].values, 3)
    assert "gpuscope_strings" not in back["range"].attrs


def test_long_range_names_stay_shared_across_devices(tmp_path):
    one, name = long_named_samples(device=0)
    two, _ = long_named_samples(n=15_000, device=1)
    both = _multi_sampling.combine_devices([one, two])
    assert both["range"].shape == (2, 20_000)
    assert_names_shared(both["range"].values, 3)
    assert both["range"].values[1, -1] == ""  # padding past device 1's last sample
    path = tmp_path / "both.nc"
    _io.save_dataset(both, path)
    back = _io.open_dataset(path)
    xr.testing.assert_identical(back, both)
    again = _multi_sampling.select_device(back, 1)
    assert again.sizes["time"] == 15_000 and again["range"].values[1] == name
    assert_names_shared(again["range"].values, 3)


# -- a start that fails at its last step ---------------------------------------------------------------------
def gpuscope_threads():
    return [t.name for t in threading.enumerate() if t.name.startswith("gpuscope-") and t.is_alive()]


def memfd_images() -> list[str]:
    """This process's mappings and descriptors of shared images."""
    with open("/proc/self/maps") as maps:
        mapped = [line for line in maps if "gpuscope-pm-image" in line]
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if "gpuscope-pm-image" in target:
            fds.append(target)
    return mapped + fds


@pytest.mark.parametrize("error", [MemoryError, KeyboardInterrupt])
def test_a_failed_last_step_of_the_start_leaves_nothing_behind(pm_recording, monkeypatch, error):
    """The discard image was made after the rollback's `try`: a MemoryError or Ctrl-C there left 2 worker
    processes, the dispatcher and reader threads and 4 memfd mappings until exit."""
    meta, image, _ = pm_recording
    made = []

    class Recorded(_pm_workers.ProcessEvaluation):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    def no_memory(*args):
        raise error()

    monkeypatch.setattr(_pm_workers, "ProcessEvaluation", Recorded)
    monkeypatch.setattr(pm, "counter_data_size", lambda handle, metrics, n: image.size)
    monkeypatch.setattr(pm, "initialize_counter_data", lambda handle, target: None)
    monkeypatch.setattr(pm, "new_counter_data", no_memory)  # the discard image: the last step of the set-up
    gc.collect()
    before = memfd_images()  # an earlier test's images that are still referenced
    with pytest.raises(error):
        _pm_pipeline.Pipeline(1, meta["chip"], meta["metrics"], np.load(AVAILABILITY), samples_per_image=64,
                              pool_size=4, evaluators=2, period_s=0.01, clock=lambda: 0, evaluate_in="process")
    (backend,) = made
    assert backend.ready_workers == 2  # the workers had started
    assert all(w.proc.poll() is not None for w in backend._workers)  # and were stopped and reaped
    assert not gpuscope_threads()
    del backend, made[:]
    gc.collect()
    assert set(memfd_images()) <= set(before)


# -- fork ------------------------------------------------------------------------------------------------------
#: Liveness bound (s): how long a test waits for something that must happen, before it calls it a hang.
BOUND = 30


def use_fake(monkeypatch, fake, evaluator=None):
    for name in ("new_counter_data", "initialize_counter_data", "decode", "counter_data_info", "sample_times_into",
                 "sample_info"):
        monkeypatch.setattr(pm, name, getattr(fake, name))
    monkeypatch.setattr(host.ProfilerHost, "evaluator", lambda self, metrics: evaluator or fake.evaluator(0.0))


def thread_pipeline(fake, pool=4, evaluators=1):
    pipe = _sampling._Pipeline(1, "GH100", ["a", "b"], None, samples_per_image=100, pool_size=pool,
                               evaluators=evaluators, period_s=0.001, interval_ns=20, clock=fake.clock)
    pipe.gil_wait_s = 0.0
    return pipe


def running_sampler(monkeypatch, pipe, fake, device):
    """A Sampler as start() leaves it, over *pipe*; stopping it stops the fake hardware buffer."""
    from gpuscope.cupti import profiler

    monkeypatch.setattr(pm, "stop", lambda handle: setattr(fake, "producing", False))
    monkeypatch.setattr(pm, "disable", lambda handle: None)
    monkeypatch.setattr(profiler, "deinitialize", lambda **k: None)
    monkeypatch.setattr("gpuscope.cupti.activity.timestamp", lambda: 20 * fake.made)
    s = _sampling.Sampler(device=device)
    s._state, s._decoder, s._handle, s._initialized, s._started = "running", pipe, 1234, True, True
    s._object = _sampling.SamplingObject(1234, None)
    s._pid, s.start_ns, s.interval_ns = os.getpid(), 0, 20
    _sampling._active[device] = s
    return s


def wait_for_child(pid) -> int:
    """The child's exit code; a child still running after :data:`BOUND` s is killed and the test fails."""
    deadline = time.monotonic() + BOUND
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    pytest.fail(f"the forked child did not exit within {BOUND} s: it hung")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_leaves_the_running_sampler_to_its_parent(monkeypatch):
    """The child forks while the parent's decode thread holds the object lock (3 of 3 runs hung in
    stop_sampling): its `with` exit returns at once and touches nothing, it can start a sampler of its own on the
    same device, and the parent samples on and stops with every sample."""
    fake = FakePm(3)
    use_fake(monkeypatch, fake)
    in_decode, go_on = threading.Event(), threading.Event()
    decode = fake.decode

    def held_decode(handle, image):  # the first decode holds the lock until the fork is done
        in_decode.set()
        go_on.wait()
        return decode(handle, image)

    monkeypatch.setattr(pm, "decode", held_decode)
    pipe = thread_pipeline(fake)
    s = running_sampler(monkeypatch, pipe, fake, device=7)
    pipe.start(0)
    try:
        assert in_decode.wait(BOUND)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report, then leave without running anything of pytest's
            code = 1
            try:
                s.__exit__(SystemExit, SystemExit(0), None)  # sys.exit() inside the `with` block
                try:
                    s.dataset
                    said = "no error"
                except RuntimeError as exc:
                    said = "parent's" if f"process {os.getppid()}" in str(exc) else str(exc)
                own = _sampling.Sampler(device=7)
                own._setup = lambda: None  # the bookkeeping of gs.sample(device=7) only: no GPU here
                own.start()
                os.write(write, f"{s._state}|{s.running}|{said}|{_sampling._active.get(7) is own}".encode())
                code = 0
            finally:
                os._exit(code)
        os.close(write)
        assert wait_for_child(pid) == 0
        assert os.read(read, 1000).decode() == "forked|False|parent's|True"
        os.close(read)
    finally:
        go_on.set()
    assert s.running and _sampling._active[7] is s  # the parent's sampler is untouched
    time.sleep(0.05)  # let it sample on after the fork
    s.stop()
    assert s._state == "stopped" and 7 not in _sampling._active and pipe.errors == []
    kept = s._values[:, 0].astype(np.int64)
    assert kept.size + pipe.discarded + fake.dropped == fake.made and (np.diff(kept) > 0).all()
    assert fake.made > 0 and kept.size > 0
    assert not gpuscope_threads()


class CountingBackend:
    """A ProcessEvaluation that writes every call of close() into a pipe, from whichever process makes it."""

    def __init__(self, write_fd, fake):
        self.write_fd, self.fake = write_fd, fake

    def __call__(self, pipeline, chip, metrics, availability, *, image_bytes, pool_size, workers):
        self.images = [self.fake.new_counter_data(None, None, 100) for _ in range(pool_size)]
        self.pool_note, self.images_lost = "", 0
        self.ready_workers, self.workers_lost, self.images_recovered = 1, 0, 0
        return self

    def start(self):
        pass

    def wait_ready(self):
        return 1

    def submit(self, seq, image, n, batches):
        pass

    def finish(self):  # not worth keeping: the pipeline closes it
        return False

    def close(self):
        os.write(self.write_fd, f"close in {os.getpid()};".encode())


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_never_closes_the_parents_evaluation_workers(monkeypatch):
    """Before: the child's close sent None to the parent's workers, and the parent evaluated in-process unsaid."""
    fake = FakePm(0)
    use_fake(monkeypatch, fake)
    monkeypatch.setattr(pm, "counter_data_size", lambda handle, metrics, n: 1 << 10)
    read, write = os.pipe()
    backend = CountingBackend(write, fake)
    monkeypatch.setattr(_pm_workers, "ProcessEvaluation", backend)
    pipe = _sampling._Pipeline(1, "GH100", ["a", "b"], None, samples_per_image=100, pool_size=4, evaluators=1,
                               period_s=0.001, interval_ns=20, clock=fake.clock, evaluate_in="process")
    assert pipe._backend is backend
    pipe.start(0)
    stopped = []
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            pipe.stop_sampling(lambda: stopped.append(1))
            pipe.finish()
            pipe.close_workers()
            code = 0 if not stopped and pipe.forked else 2
        finally:
            os._exit(code)
    assert wait_for_child(pid) == 0
    assert not pipe.forked
    pipe.stop_sampling(lambda: stopped.append(1))
    pipe.finish()
    os.close(write)
    assert os.read(read, 1000).decode() == f"close in {os.getpid()};"  # the parent's close only
    os.close(read)
    assert stopped == [1] and pipe.errors == []


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_the_parents_workers_evaluate_on_after_a_child_leaves(pm_recording, monkeypatch):
    """Real workers: after a forked child ran its pipeline's finish and close, the parent's workers still
    evaluate (not this process: the timestamps are rebuilt by a worker, nothing is recovered or lost)."""
    meta, image, stamps = pm_recording
    n = meta["completed"]
    monkeypatch.setattr(pm, "counter_data_size", lambda handle, metrics, count: image.size)
    monkeypatch.setattr(pm, "initialize_counter_data", lambda handle, target: None)
    monkeypatch.setattr(pm, "new_counter_data", lambda handle, metrics, count: np.zeros(16, np.uint8))
    pipe = _sampling._Pipeline(1, meta["chip"], meta["metrics"], np.load(AVAILABILITY), samples_per_image=n,
                               pool_size=2, evaluators=1, period_s=0.01, interval_ns=100_000, clock=lambda: 0,
                               evaluate_in="process")
    backend = pipe._backend
    assert backend is not None and backend.ready_workers == 1
    for target in backend.images:
        target[:] = image
    pid = os.fork()
    if pid == 0:
        try:
            pipe.finish()
            pipe.close_workers()
        finally:
            os._exit(0)
    assert wait_for_child(pid) == 0
    fake = FakePipeline(stamps)  # answers GetSampleInfo from the recording, should a batch need it
    pipe._pm, pipe.handle = fake._pm, None
    backend.submit(0, backend.images[0], n, [batch(stamps, 0, n - 1)])
    backend.close()
    assert pipe.errors == [] and backend.workers_lost == 0 and backend.images_recovered == 0
    assert pipe.inexact_batches == 0  # rebuilt by the worker: an image evaluated here would be read exactly
    values, rebuilt = pipe._results[0]
    np.testing.assert_allclose(values[:, 0], meta["values_device"][meta["metrics"][0]], rtol=1e-9, atol=1e-9)
    assert all(w.proc.returncode == 0 for w in backend._workers)  # told to exit by the parent, once
    pipe.close_workers()


# -- waits without deadlines ---------------------------------------------------------------------------------
def test_an_evaluation_that_never_returns_is_given_up_counted_and_said(monkeypatch):
    """Thread mode (the fallback when fewer than 2 shared images fit): an evaluation that never returns held
    finish() for good. Now finish() gives up after EVALUATE_TIMEOUT_S without progress, counts every image not
    evaluated and says so; the stuck thread never touches the sampling object again."""
    monkeypatch.setattr(_pm_pipeline.Pipeline, "EVALUATE_TIMEOUT_S", 0.3)
    monkeypatch.setattr(_pm_pipeline.Pipeline, "FREE_WAIT_S", 0.3)  # no image comes back for the last drain
    release = threading.Event()

    class Stuck:
        def evaluate_into(self, image, first, count, out):
            release.wait()

    fake = FakePm(7)
    use_fake(monkeypatch, fake, evaluator=Stuck())
    pipe = thread_pipeline(fake, pool=3)
    pipe.start(0)
    deadline = time.monotonic() + BOUND
    while pipe.handed_off < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    pipe.stop_sampling(lambda: setattr(fake, "producing", False))
    finisher = threading.Thread(target=pipe.finish)
    finisher.start()
    finisher.join(BOUND)
    try:
        assert not finisher.is_alive(), "finish() waited for an evaluation that never returns"
        assert pipe.handed_off >= 2 and pipe._results == {}
        assert pipe.images_lost == pipe.images_unevaluated == pipe.handed_off  # the one held and those queued
        assert pipe.samples_unevaluated == fake.made - pipe.discarded - fake.dropped
        assert any("did not finish an image within 0.3 s" in e for e in pipe.errors)
        assert not pipe.clean and pipe.spare is None
        assert pipe.series()[0].shape == (0, 2)
        s = _sampling.Sampler(device=3)
        s._decoder, s._stamps, s.lost_samples, s.interval_ns, s.metrics = pipe, np.empty((0, 2)), fake.made, 20, ["a"]
        message = s._loss_message()
        assert f"{pipe.samples_unevaluated} samples in images that no evaluator thread finished" in message
        assert "'images_lost'" in message
        release.set()  # the evaluation returns at last: the thread waits on the object lock, which finish() kept
        time.sleep(0.05)
        assert pipe._results == {} and fake.in_object == 0
    finally:  # let the stuck thread end
        release.set()
        pipe._lock.release()
        pipe._full.put(None)
        for thread in pipe._threads:
            thread.join(BOUND)
        for h in pipe._hosts:
            h.close()


def test_finish_never_waits_for_ever_on_a_decode_that_does_not_return(monkeypatch):
    monkeypatch.setattr(_pm_pipeline.Pipeline, "JOIN_TIMEOUT_S", 0.3)
    monkeypatch.setattr(_pm_pipeline.Pipeline, "EVALUATE_TIMEOUT_S", 0.3)
    fake = FakePm(3)
    use_fake(monkeypatch, fake)
    in_decode, release = threading.Event(), threading.Event()
    decode = fake.decode

    def hung(handle, image):
        if fake.made > 50:
            in_decode.set()
            release.wait()
        return decode(handle, image)

    monkeypatch.setattr(pm, "decode", hung)
    pipe = thread_pipeline(fake)
    pipe.start(0)
    finisher = threading.Thread(target=pipe.finish)
    try:
        assert in_decode.wait(BOUND)
        finisher.start()
        finisher.join(BOUND)
        assert not finisher.is_alive(), "finish() waited for a decode that never returns"
        assert any("decode thread did not stop within 0.3 s" in e for e in pipe.errors)
        assert not pipe.clean and pipe.spare is None
    finally:
        fake.producing = False
        release.set()
        pipe._full.put(None)  # an evaluator given up on comes back to an empty queue
        for thread in pipe._threads:
            thread.join(BOUND)
    assert not gpuscope_threads()


def _loss_text(metrics, evaluate_in):
    from types import SimpleNamespace

    from gpuscope._pm_sampling import sampler as _sampling

    decoder = SimpleNamespace(overflows=0, errors=[], discarded=0, images_unevaluated=0, _backend=None,
                              evaluation_counts=lambda: {"ready": 0, "lost": 0, "recovered": 0, "images_lost": 0})
    sampler = SimpleNamespace(_decoder=decoder, lost_samples=16422, _stamps=range(61245), device=0,
                              interval_ns=20_000, metrics=metrics, decode_us_per_sample=15.9,
                              evaluate_in=evaluate_in)
    return _sampling.Sampler._loss_message(sampler)


def test_the_decode_advice_never_suggests_the_set_in_use_and_names_thread_evaluation():
    """On the H100, pm-fast at 20 us lost 16,422 of 77,667 samples with evaluate_in='thread' and none in worker
    processes; the advice used to suggest the pm-fast set it was already using."""
    import gpuscope as gs

    fast = gs.metric_set("pm-fast").metrics
    text = _loss_text(list(fast), "thread")
    assert "lost 16422 of 77667" in text and "'pm-fast' set" not in text and "evaluate_in='process'" in text
    text = _loss_text(list(gs.metric_set("pm-default").metrics), "process")
    assert "'pm-fast' set decodes several times faster" in text and "evaluate_in='process'" not in text
