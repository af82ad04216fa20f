"""Evaluation in worker processes (gpuscope._pm_sampling.workers) without a GPU: the H100 recording evaluated by real worker
processes with CUPTI's host API, timestamps rebuilt from durations and anchors, and the rebuilding rules."""

import gc
import os
import queue
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from gpuscope._pm_sampling import workers as _pm_workers
from gpuscope._pm_sampling import sampler as _sampling

AVAILABILITY = Path(__file__).resolve().parents[1] / "fixtures" / "gh100_counter_availability_pm.npy"


def batch(stamps, first, last, overflow=False):
    return (first, last, int(stamps[first, 0]), int(stamps[first, 1]), int(stamps[last, 1]), overflow)


def contiguous(n, period=20_000, jitter=0):
    rng = np.random.default_rng(1)
    ends = 10**18 + np.cumsum(period + rng.integers(-jitter, jitter + 1, n))
    starts = np.concatenate([[ends[0] - 510_000_000], ends[:-1]])  # the first sample reaches back
    return np.stack([starts, ends], axis=1)


def test_stamps_are_exact_when_durations_are():
    stamps = contiguous(1000, jitter=40)
    durations = (stamps[:, 1] - stamps[:, 0]).astype(np.float64)
    batches = [batch(stamps, 0, 399), batch(stamps, 400, 999)]
    rebuilt, inexact = _pm_workers.stamps_from_durations(durations, batches, 1000)
    assert inexact == []
    np.testing.assert_array_equal(rebuilt, stamps)


def test_a_short_duration_per_sample_is_spread_and_anchors_stay_exact():
    stamps = contiguous(2000, jitter=40)
    durations = (stamps[:, 1] - stamps[:, 0] - np.tile([1, 2], 1000)).astype(np.float64)  # as CUPTI 13 on the H100
    rebuilt, inexact = _pm_workers.stamps_from_durations(durations, [batch(stamps, 0, 1999)], 2000)
    assert inexact == []
    assert rebuilt[0, 0] == stamps[0, 0] and rebuilt[0, 1] == stamps[0, 1] and rebuilt[-1, 1] == stamps[-1, 1]
    assert np.abs(rebuilt - stamps).max() <= 2
    assert (rebuilt[1:, 0] == rebuilt[:-1, 1]).all()


def test_batches_that_do_not_add_up_are_left_for_get_sample_info():
    stamps = contiguous(600)
    stamps[300:] += 40_000  # two samples missing inside the second batch
    durations = (stamps[:, 1] - stamps[:, 0]).astype(np.float64)
    batches = [batch(stamps, 0, 199), batch(stamps, 200, 449), batch(stamps, 450, 549, overflow=True)]
    rebuilt, inexact = _pm_workers.stamps_from_durations(durations, batches, 600)
    assert inexact == [(200, 449), (450, 549), (550, 599)]  # a gap, an overflow, samples no batch covers
    np.testing.assert_array_equal(rebuilt[:200], stamps[:200])


def image_handles() -> list[str]:
    """This process's open descriptors and mappings of counter-data images (memfds named ``gpuscope-pm-image``, or
    files ``gpuscope-pm-*`` in ``GPUSCOPE_SHM_DIR``; both show with their name in /proc even once unlinked)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the descriptor listdir used, closed since
            continue
        if "gpuscope-pm-" in target:
            found.append(f"fd {fd} -> {target}")
    maps = Path("/proc/self/maps").read_text().splitlines()
    return found + [f"mapped: {line}" for line in maps if "gpuscope-pm-" in line]


def assert_no_images_left(backend):
    """After ``backend.close()``: no image descriptor is open, and once the pipeline's pool lets go of its images
    (as the real pipeline does when it finishes), no image is mapped in this process either."""
    free = backend._pipe._free
    while not free.empty():
        free.get_nowait()
    gc.collect()
    assert image_handles() == []


class FakePipeline:
    """What ProcessEvaluation uses of the pipeline (its own timestamp and recycling code, over a fake CUPTI):
    GetSampleInfo answers from the recorded timestamps."""

    TIMESTAMP_CHUNK = _sampling._Pipeline.TIMESTAMP_CHUNK
    read_timestamps = _sampling._Pipeline.read_timestamps
    recycle = _sampling._Pipeline.recycle

    def __init__(self, stamps):
        self.errors, self._results, self.inexact_batches = [], {}, 0
        self._lock, self.handle, self._free = threading.Lock(), None, queue.Queue()
        recorded = stamps

        class Pm:
            initialized = 0

            @staticmethod
            def initialize_counter_data(handle, image):
                Pm.initialized += 1

            @staticmethod
            def sample_times_into(handle, image, first, count, out):
                out[:count] = recorded[first : first + count]

        self._pm = Pm


@pytest.mark.parametrize("workers", [1, 2])
def test_workers_evaluate_the_h100_recording(pm_recording, workers):
    meta, image, stamps = pm_recording
    n = meta["completed"]
    pipe = FakePipeline(stamps)
    backend = _pm_workers.ProcessEvaluation(pipe, meta["chip"], meta["metrics"], np.load(AVAILABILITY),
                                            image_bytes=image.size, pool_size=2, workers=workers)
    for k in range(len(backend.images)):
        backend.images[k][:] = image
    backend.start()
    assert backend.wait_ready() == workers
    batches = [batch(stamps, 0, 99), batch(stamps, 100, n - 1)]
    backend.submit(0, backend.images[0], n, batches)
    backend.submit(1, backend.images[1], n, [batch(stamps, 0, n - 1, overflow=True)])
    backend.close()
    assert pipe.errors == []
    assert backend.ready_workers == workers
    assert pipe._pm.initialized == 2 and pipe._free.qsize() == 2  # both images came back, re-initialised
    for seq in (0, 1):
        values, rebuilt = pipe._results[seq]
        for i, name in enumerate(meta["metrics"]):
            np.testing.assert_allclose(values[:, i], meta["values_device"][name], rtol=1e-9, atol=1e-9)
        assert np.abs(rebuilt - stamps).max() <= 1_000  # rebuilt from durations: within a µs of GetSampleInfo
    assert pipe.inexact_batches == 1  # the overflowed batch was read with GetSampleInfo
    np.testing.assert_array_equal(pipe._results[1][1], stamps)
    rebuilt = pipe._results[0][1]
    for first, last in ((0, 99), (100, n - 1)):  # anchors are exact
        assert rebuilt[first, 0] == stamps[first, 0] and rebuilt[first, 1] == stamps[first, 1]
        assert rebuilt[last, 1] == stamps[last, 1]
    assert_no_images_left(backend)


def evaluated_without_workers(pm_recording, monkeypatch, workers: int, patches):
    """The recording evaluated by a backend whose workers are started with *patches* ``(object, name, value)`` in
    place, none of which comes up; returns the pipeline's errors once every sample matched the device's values."""
    meta, image, stamps = pm_recording
    n = meta["completed"]
    pipe = FakePipeline(stamps)
    backend = _pm_workers.ProcessEvaluation(pipe, meta["chip"], meta["metrics"], np.load(AVAILABILITY),
                                            image_bytes=image.size, pool_size=1, workers=workers)
    backend.images[0][:] = image
    with monkeypatch.context() as patch:
        for target, name, value in patches:
            patch.setattr(target, name, value, raising=False)
        backend.start()
    assert backend.wait_ready() == 0
    backend.submit(0, backend.images[0], n, [batch(stamps, 0, n - 1)])
    backend.close()
    assert backend.ready_workers == 0
    values, rebuilt = pipe._results[0]
    np.testing.assert_array_equal(rebuilt, stamps)
    np.testing.assert_allclose(values[:, 0], meta["values_device"][meta["metrics"][0]], rtol=1e-9, atol=1e-9)
    assert_no_images_left(backend)
    return pipe.errors


def test_no_worker_means_evaluation_in_this_process(pm_recording, monkeypatch):
    errors = evaluated_without_workers(pm_recording, monkeypatch, 1,
                                       [(_pm_workers, "BOOT", "raise SystemExit(3)")])  # each worker exits at once
    assert any("did not start" in e and "status 3" in e for e in errors), errors


def test_a_frozen_app_never_starts_copies_of_itself_as_workers(pm_recording, monkeypatch):
    started = []
    monkeypatch.delenv("GPUSCOPE_PYTHON", raising=False)
    errors = evaluated_without_workers(pm_recording, monkeypatch, 2, [
        (sys, "frozen", True), (subprocess, "Popen", lambda *args, **kw: started.append(args))])
    assert started == []
    assert len(errors) == 2 and all("could not be spawned (this is a frozen application: sys.executable" in e
                                    for e in errors), errors
