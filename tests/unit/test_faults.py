"""Fault injection without a GPU (docs/reliability.md): real worker processes evaluating the H100 recording are
killed, interrupted, slow to start or impossible to spawn; shared memory runs out; Ctrl-C arrives during teardown;
a malicious ``gpuscope`` package sits in the current folder. Waits below are liveness bounds, not timings."""

import errno
import os
import signal
import sys
import threading
import time

import numpy as np
import pytest

from gpuscope._pm_sampling import workers as _pm_workers
from gpuscope._pm_sampling import sampler as _sampling
from gpuscope._util import shield as _shield
from gpuscope._pm_sampling import shm as _shm

from .test_pm_workers import AVAILABILITY, FakePipeline, assert_no_images_left, batch


def backend_for(pm_recording, workers=2, pool=2):
    meta, image, stamps = pm_recording
    pipe = FakePipeline(stamps)
    backend = _pm_workers.ProcessEvaluation(pipe, meta["chip"], meta["metrics"], np.load(AVAILABILITY),
                                            image_bytes=image.size, pool_size=pool, workers=workers)
    for target in backend.images:
        target[:] = image
    return pipe, backend


def submit_all(backend, pm_recording, tasks=4):
    meta, _, stamps = pm_recording
    n = meta["completed"]
    for seq in range(tasks):
        backend.submit(seq, backend.images[seq % len(backend.images)], n, [batch(stamps, 0, n - 1)])


def assert_all_evaluated(pipe, pm_recording, tasks=4):
    meta, _, stamps = pm_recording
    assert sorted(pipe._results) == list(range(tasks))
    for seq in range(tasks):
        values, rebuilt = pipe._results[seq]
        np.testing.assert_allclose(values[:, 0], meta["values_device"][meta["metrics"][0]], rtol=1e-9, atol=1e-9)
        assert np.abs(rebuilt - stamps).max() <= 1_000


def assert_nothing_left(backend):
    assert all(w.proc.poll() is not None for w in backend._workers)  # every worker reaped
    assert not [t.name for t in threading.enumerate() if t.name.startswith("gpuscope-") and t.is_alive()]
    assert_no_images_left(backend)


def test_a_killed_worker_costs_no_image(pm_recording, monkeypatch):
    monkeypatch.setattr(_pm_workers.ProcessEvaluation, "CLOSE_TIMEOUT_S", 60.0)
    pipe, backend = backend_for(pm_recording)
    backend.start()
    assert backend.wait_ready() == 2
    victim = backend._workers[0].proc
    submit_all(backend, pm_recording)
    victim.send_signal(signal.SIGKILL)  # mid-run: some of its images may be pending, sent or in flight
    backend.close()
    assert backend.workers_lost == 1 and backend.images_lost == 0
    assert any("was lost" in e for e in pipe.errors)
    assert_all_evaluated(pipe, pm_recording)
    assert pipe._free.qsize() == 4  # every image came back to the pool
    assert_nothing_left(backend)


def test_workers_ignore_sigint(pm_recording):
    pipe, backend = backend_for(pm_recording)
    backend.start()
    assert backend.wait_ready() == 2
    for worker in backend._workers:
        os.kill(worker.proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C did to workers in its process group
    time.sleep(0.2)
    submit_all(backend, pm_recording)
    backend.close()
    assert backend.workers_lost == 0 and pipe.errors == []
    assert all(w.proc.returncode == 0 for w in backend._workers)
    assert all(os.getsid(0) != os.getsid(w.proc.pid) for w in backend._workers if w.proc.poll() is None)
    assert_all_evaluated(pipe, pm_recording)


def test_a_hung_worker_is_killed_and_its_images_recovered(pm_recording, monkeypatch):
    monkeypatch.setattr(_pm_workers.ProcessEvaluation, "TASK_TIMEOUT_S", 0.5)
    pipe, backend = backend_for(pm_recording, workers=1)
    backend.start()
    assert backend.wait_ready() == 1
    os.kill(backend._workers[0].proc.pid, signal.SIGSTOP)  # alive, never answers
    submit_all(backend, pm_recording)
    backend.close()
    assert backend.workers_lost == 1 and backend.images_recovered >= 1 and backend.images_lost == 0
    assert any("did not answer" in e for e in pipe.errors)
    assert_all_evaluated(pipe, pm_recording)
    assert_nothing_left(backend)


def test_a_slow_worker_start_falls_back_to_this_process(pm_recording, monkeypatch):
    monkeypatch.setattr(_pm_workers, "BOOT", "import time; time.sleep(60); " + _pm_workers.BOOT)
    monkeypatch.setattr(_pm_workers.ProcessEvaluation, "CONNECT_TIMEOUT_S", 1.0)
    pipe, backend = backend_for(pm_recording, workers=1)
    backend.start()
    assert backend.wait_ready() == 0
    submit_all(backend, pm_recording)
    backend.close()
    assert any("did not start in time" in e for e in pipe.errors)
    assert_all_evaluated(pipe, pm_recording)
    assert_nothing_left(backend)


def test_a_worker_that_cannot_be_spawned_falls_back_to_this_process(pm_recording, monkeypatch):
    pipe, backend = backend_for(pm_recording, workers=2)
    with monkeypatch.context() as patch:
        patch.setattr(sys, "executable", "/nonexistent/python")
        backend.start()  # documented: evaluation in this process, not an exception
    submit_all(backend, pm_recording)
    backend.close()
    assert backend.ready_workers == 0 and any("could not be spawned" in e for e in pipe.errors)
    assert_all_evaluated(pipe, pm_recording)


def test_failed_fallocate_shrinks_the_pool(monkeypatch):
    calls = []

    def fallocate(fd, offset, size):
        calls.append(size)
        if len(calls) > 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        os.ftruncate(fd, size)

    monkeypatch.setattr(os, "posix_fallocate", fallocate)
    images, note = _shm.reserve_images(8, 4096)
    assert len(images) == 3 and "failed" in note and "after 3 images" in note
    for image in images:
        image.array[:] = 7  # reserved pages: writing cannot raise SIGBUS
    _shm.close_images(images)


def test_a_small_shm_folder_sizes_the_pool(tmp_path, monkeypatch):
    monkeypatch.setenv(_shm.ENV_VAR, str(tmp_path))
    monkeypatch.setattr(_shm, "available_bytes", lambda folder: 64 << 20)  # Docker's default /dev/shm
    images, note = _shm.reserve_images(30, 10 << 20)
    assert len(images) == 3  # half of 64 MiB in 10 MiB images
    assert "64 MiB free" in note and "the pool has 3" in note
    assert list(tmp_path.iterdir()) == []  # unlinked at once: nothing to leave behind
    _shm.close_images(images)


class FakeBackend:
    """A ProcessEvaluation that made fewer shared images than the pipeline needs."""

    def __init__(self, pipeline, chip, metrics, availability, *, image_bytes, pool_size, workers):
        self.images, self.pool_note, self.closed = [], "anonymous shared memory has 1 MiB free", False

    def close(self):
        self.closed = True


def test_no_shared_memory_means_evaluation_in_threads(monkeypatch):
    from .test_sampling_pipeline import FakePm
    from gpuscope.cupti import host
    from gpuscope.cupti import pm_sampling as pm

    fake = FakePm(3)
    for name in ("new_counter_data", "initialize_counter_data", "decode", "counter_data_info", "sample_times_into",
                 "sample_info"):
        monkeypatch.setattr(pm, name, getattr(fake, name))
    monkeypatch.setattr(pm, "counter_data_size", lambda handle, metrics, n: 1 << 20)
    monkeypatch.setattr(host.ProfilerHost, "evaluator", lambda self, metrics: fake.evaluator(0.0))
    monkeypatch.setattr(_pm_workers, "ProcessEvaluation", FakeBackend)
    pipe = _sampling._Pipeline(1, "GH100", ["a", "b"], None, samples_per_image=40, pool_size=4, evaluators=1,
                               period_s=0.001, interval_ns=20, clock=fake.clock, evaluate_in="process")
    assert pipe.evaluate_in == "thread" and pipe._backend is None
    assert "1 MiB free" in pipe.pool_note and "in threads of this process" in pipe.pool_note
    assert pipe._free.qsize() == 3  # the pool in this process's memory (one image is current)
    pipe.close_workers()


def test_stop_waits_for_a_free_image_without_holding_the_lock(monkeypatch):
    from .test_sampling_pipeline import FakePm
    from gpuscope.cupti import host
    from gpuscope.cupti import pm_sampling as pm

    fake = FakePm(0)
    for name in ("new_counter_data", "initialize_counter_data", "decode", "counter_data_info", "sample_times_into",
                 "sample_info"):
        monkeypatch.setattr(pm, name, getattr(fake, name))
    monkeypatch.setattr(host.ProfilerHost, "evaluator", lambda self, metrics: fake.evaluator(0.0))
    pipe = _sampling._Pipeline(1, "GH100", ["a", "b"], None, samples_per_image=100, pool_size=2, evaluators=1,
                               period_s=0.001, interval_ns=20, clock=fake.clock, evaluate_in="thread")
    pipe.gil_wait_s = 0.0
    out = pipe._free.get_nowait()  # the other image is out with an evaluator, which recycles it in a moment
    fake.made = 90
    pipe.drain()  # 90 samples in the current image
    current = pipe._current
    pipe._last_end_ns, fake.per_tick = 0, 0  # a backlog estimate far beyond the 10 free slots
    fake.made = 150  # samples still in the hardware buffer after Stop
    threading.Timer(0.2, pipe.recycle, [out]).start()  # needs the lock
    pipe.drain(wait=True)
    assert pipe._current is out and pipe.discarded == 0 and fake.dropped == 0
    assert pipe._full.qsize() == 1 and pipe._full.get_nowait()[1] is current
    assert fake.content[out.ctypes.data][1] == list(range(90, 150))


def ctrl_c():
    """A real SIGINT to the main thread, as a terminal's Ctrl-C."""
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)


def test_run_shielded_finishes_the_teardown_despite_two_ctrl_c():
    done = threading.Event()

    def teardown():
        for _ in range(2):
            ctrl_c()  # twice, while tearing down
            time.sleep(0.1)
        done.set()
        return "torn down"

    with pytest.raises(KeyboardInterrupt):
        _shield.run_shielded(teardown)
    assert done.is_set()


def test_ctrl_c_during_stop_still_unregisters_and_disables(monkeypatch):
    from gpuscope.cupti import pm_sampling as pm
    from gpuscope.cupti import profiler

    disabled = []
    monkeypatch.setattr(pm, "stop", lambda handle: None)
    monkeypatch.setattr(pm, "disable", disabled.append)
    monkeypatch.setattr(profiler, "deinitialize", lambda **k: disabled.append("deinit"))

    class Decoder:
        errors, overflows, discarded, _backend = [], 0, 0, None

        def evaluation_counts(self):
            return {"ready": 0, "lost": 0, "recovered": 0, "images_lost": 0}

        def stop_sampling(self, call):
            ctrl_c()
            time.sleep(0.1)
            ctrl_c()  # the second one
            time.sleep(0.1)

        def finish(self):
            pass

        close_workers = finish

        def series(self):
            return np.empty((0, 1)), np.empty((0, 2), dtype=np.int64)

    s = _sampling.Sampler(device=5)
    s._state, s._decoder, s._handle, s._initialized, s._started = "running", Decoder(), 1234, True, True
    s._object = _sampling.SamplingObject(1234, None)
    s.start_ns, s.interval_ns, s.stop_ns = 0, 100_000, 0
    _sampling._active[5] = s
    monkeypatch.setattr("gpuscope.cupti.activity.timestamp", lambda: 0)
    with pytest.raises(KeyboardInterrupt):
        s.stop()
    assert disabled == [1234, "deinit"]
    assert 5 not in _sampling._active and s._state == "stopped"


def test_ctrl_c_before_the_shielded_teardown_does_not_skip_it(monkeypatch):
    """The second Ctrl-C can land in __exit__ before stop() has reached run_shielded: the teardown still runs."""
    from gpuscope.cupti import pm_sampling as pm
    from gpuscope.cupti import profiler

    disabled = []
    monkeypatch.setattr(pm, "stop", lambda handle: None)
    monkeypatch.setattr(pm, "disable", disabled.append)
    monkeypatch.setattr(profiler, "deinitialize", lambda **k: disabled.append("deinit"))

    class Decoder:
        errors, overflows, discarded, _backend = [], 0, 0, None

        def evaluation_counts(self):
            return {"ready": 0, "lost": 0, "recovered": 0, "images_lost": 0}

        def stop_sampling(self, call):
            call()

        def finish(self):
            pass

        close_workers = finish

        def series(self):
            return np.empty((0, 1)), np.empty((0, 2), dtype=np.int64)

    real = _shield.run_shielded
    calls = []

    def interrupted_first(fn, *args):  # Ctrl-C arrives just before the first teardown starts
        calls.append(fn)
        if len(calls) == 1:
            raise KeyboardInterrupt
        return real(fn, *args)

    monkeypatch.setattr(_sampling, "run_shielded", interrupted_first)
    s = _sampling.Sampler(device=6)
    s._state, s._decoder, s._handle, s._initialized, s._started = "running", Decoder(), 4321, True, True
    s._object = _sampling.SamplingObject(4321, None)
    s.start_ns, s.interval_ns, s.stop_ns = 0, 100_000, 0
    _sampling._active[6] = s
    monkeypatch.setattr("gpuscope.cupti.activity.timestamp", lambda: 0)
    with pytest.raises(KeyboardInterrupt):
        s.__exit__(None, None, None)  # the with block ended; Ctrl-C lands before the teardown
    assert len(calls) == 2 and disabled == [4321, "deinit"]
    assert 6 not in _sampling._active and s._state == "stopped"


MALICIOUS = "open({marker!r}, 'w').write('executed')\n"


def test_the_cupti_version_probe_never_imports_from_the_cwd(tmp_path, monkeypatch):
    from gpuscope.cupti import _lib

    marker = tmp_path / "marker"
    (tmp_path / "ctypes").mkdir()
    (tmp_path / "ctypes" / "__init__.py").write_text(MALICIOUS.format(marker=str(marker)))
    monkeypatch.chdir(tmp_path)
    api = _lib._probe_version_in_child(_lib.load().path)
    assert api == _lib.load().api_version and not marker.exists()


def test_ctrl_c_while_the_workers_start_leaves_no_worker_behind(monkeypatch):
    """Ctrl-C while the evaluation workers start (about 1 s), and again while they are being stopped: the pipeline
    still stops every worker it spawned before the interrupt propagates (seen on the H100: a dispatcher thread
    and two worker processes were left)."""
    from gpuscope._pm_sampling import pipeline as _pm_pipeline
    from gpuscope.cupti import pm_sampling as pm

    closed = threading.Event()

    class Starting:
        pool_note = ""

        def __init__(self, *args, **kwargs):
            self.images = [np.zeros(8, np.uint8), np.zeros(8, np.uint8)]

        def start(self):
            pass

        def wait_ready(self):
            ctrl_c()  # the first Ctrl-C lands while the workers connect
            time.sleep(1.0)

        def close(self):
            ctrl_c()  # the second one lands while they are stopped
            time.sleep(0.1)
            closed.set()

    monkeypatch.setattr(_pm_workers, "ProcessEvaluation", Starting)
    monkeypatch.setattr(pm, "counter_data_size", lambda *a: 8)
    monkeypatch.setattr(pm, "initialize_counter_data", lambda *a: None)
    with pytest.raises(KeyboardInterrupt):
        _pm_pipeline.Pipeline(1, "GH100", ["m"], None, samples_per_image=4, pool_size=2, evaluators=1,
                              period_s=0.01, clock=lambda: 0, evaluate_in="process")
    assert closed.is_set()
