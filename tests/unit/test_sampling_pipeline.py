"""The decode/evaluate pipeline of gpuscope.sample without a GPU: CUPTI's PM sampling calls are replaced by a
simulated hardware buffer that numbers its samples, so hand-off, recycling, order and loss counting can be checked
exactly (the host API evaluation itself is checked against the H100 fixture in test_sampling_fixture.py)."""

import threading
import time

import numpy as np
import pytest

from gpuscope import _sampling
from gpuscope.cupti import host
from gpuscope.cupti import pm_sampling as pm


class FakePm:
    """A hardware buffer that gains *per_decode* samples per decode; sample ``i`` spans ``[20 i, 20 i + 20)``."""

    def __init__(self, per_decode):
        self.per_decode = per_decode
        self.produced = 0
        self.pending = 0
        self.content = {}  # image address -> (capacity, list of sample ids)
        self.in_object = 0  # calls inside the sampling object at once (must stay <= 1)
        self.lock = threading.Lock()

    def _enter(self):
        with self.lock:
            self.in_object += 1
            assert self.in_object == 1, "two calls inside the PM sampling object at once"

    def _leave(self):
        with self.lock:
            self.in_object -= 1

    def new_counter_data(self, handle, metrics, max_samples):
        image = np.zeros(16, dtype=np.uint8)
        self.content[image.ctypes.data] = (max_samples, [])
        return image

    def initialize_counter_data(self, handle, image):
        self._enter()
        self.content[image.ctypes.data][1].clear()
        self._leave()

    def decode(self, handle, image):
        self._enter()
        self.pending += self.per_decode
        capacity, ids = self.content[image.ctypes.data]
        take = min(self.pending, capacity - len(ids))
        ids.extend(range(self.produced, self.produced + take))
        self.produced += take
        self.pending -= take
        self._leave()
        full = len(ids) == capacity and self.pending
        reason = pm.PmDecodeStopReason.COUNTER_DATA_FULL if full else pm.PmDecodeStopReason.END_OF_RECORDS
        return pm.Decoded(stop_reason=reason, overflow=False)

    def counter_data_info(self, image):
        capacity, ids = self.content[image.ctypes.data]
        return pm.CounterDataInfo(capacity, len(ids), len(ids))

    def sample_times_into(self, handle, image, first, count, out):
        self._enter()
        ids = np.asarray(self.content[image.ctypes.data][1][first : first + count], dtype=np.int64)
        out[:count, 0], out[:count, 1] = 20 * ids, 20 * ids + 20
        self._leave()

    def evaluator(self, delay):
        fake = self

        class Evaluator:
            def evaluate_into(self, image, first, count, out):
                time.sleep(delay * count)
                out[:count, 0] = fake.content[image.ctypes.data][1][first : first + count]
                out[:count, 1] = -1.0

        return Evaluator()


def run_pipeline(monkeypatch, *, per_decode, delay, seconds=0.3, pool=3, threads=2):
    fake = FakePm(per_decode)
    for name in ("new_counter_data", "initialize_counter_data", "decode", "counter_data_info", "sample_times_into"):
        monkeypatch.setattr(pm, name, getattr(fake, name))
    monkeypatch.setattr(host.ProfilerHost, "evaluator", lambda self, metrics: fake.evaluator(delay))
    pipe = _sampling._Pipeline(
        1, "GH100", ["a", "b"], None, samples_per_image=40, pool_size=pool, evaluate_threads=threads, period_s=0.001
    )
    pipe.start()
    time.sleep(seconds)
    pipe.finish()
    values, stamps = pipe.series()
    return fake, pipe, values, stamps


def test_every_sample_is_evaluated_once_in_order(monkeypatch):
    fake, pipe, values, stamps = run_pipeline(monkeypatch, per_decode=7, delay=0.0)
    assert pipe.errors == [] and pipe.discarded == 0
    assert fake.produced > 500
    np.testing.assert_array_equal(values[:, 0], np.arange(fake.produced))  # nothing lost, nothing twice
    assert (values[:, 1] == -1).all()
    np.testing.assert_array_equal(stamps[:, 0], 20 * np.arange(fake.produced))
    assert pipe.handed_off > 3 * pipe.pool_size  # images were recycled
    assert _sampling.count_lost(stamps[:, 0], stamps[:, 1], 20) == 0


def test_slow_evaluation_discards_and_counts(monkeypatch):
    # evaluation far slower than sampling: the pool runs dry, the decode thread discards instead of waiting
    fake, pipe, values, stamps = run_pipeline(monkeypatch, per_decode=30, delay=2e-4, pool=2, threads=1)
    assert pipe.discarded > 0 and pipe.errors == []
    kept = values[:, 0].astype(np.int64)
    assert (np.diff(kept) > 0).all()  # in order, no duplicates
    assert kept.size + pipe.discarded == fake.produced
    assert _sampling.count_lost(stamps[:, 0], stamps[:, 1], 20) == fake.produced - kept.size - kept[0]


def test_finish_twice_and_series_before_any_sample(monkeypatch):
    fake, pipe, values, stamps = run_pipeline(monkeypatch, per_decode=0, delay=0.0, seconds=0.02)
    pipe.finish()
    assert values.shape == (0, 2) and stamps.shape == (0, 2)


@pytest.mark.parametrize("interval_ns, expected", [(20_000, 2_500), (1_000, 4_096), (1_000_000, 256)])
def test_default_samples_per_image(interval_ns, expected):
    assert _sampling.default_samples_per_image(interval_ns) == expected
