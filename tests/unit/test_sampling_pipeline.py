"""The decode/evaluate pipeline of gpuscope.sample without a GPU: CUPTI's PM sampling calls are replaced by a
simulated hardware buffer that numbers its samples, so hand-off, recycling, order and loss counting can be checked
exactly (the host API evaluation itself is checked against the H100 fixture in test_sampling_fixture.py)."""

import threading
import time

import numpy as np
import pytest

from gpuscope._pm_sampling import sampler as _sampling


from gpuscope._pm_sampling import timeline as _timeline
from gpuscope._pm_sampling import plan as _plan
from gpuscope.cupti import host
from gpuscope.cupti import pm_sampling as pm


class FakePm:
    """A hardware buffer as CUPTI's behaves on the H100: sample ``i`` spans ``[20 i, 20 i + 20)`` ns, and
    *per_tick* samples are made each time the pipeline reads the clock. A decode takes the samples waiting when it
    starts; if they do not fit in the image it stops with ``COUNTER_DATA_FULL`` and the rest are gone."""

    def __init__(self, per_tick, tick_on_decode=False):
        self.per_tick = per_tick
        self.tick_on_decode = tick_on_decode  # also make samples at each decode (when the clock is not read)
        self.made = 0  # samples made so far
        self.next_id = 0  # first sample not yet decoded (or dropped)
        self.dropped = 0  # samples lost at a full image
        self.producing = True  # False after cuptiPmSamplingStop
        self.decode_s = 0.0  # how long a decode takes (the GIL is released meanwhile, as in ctypes)
        self.content = {}  # image address -> (capacity, list of sample ids)
        self.in_object = 0  # calls inside the sampling object at once (must stay <= 1)
        self.lock = threading.Lock()

    def clock(self):
        with self.lock:
            self.made += self.per_tick * self.producing
            return 20 * self.made

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
        time.sleep(self.decode_s)
        if self.tick_on_decode:
            self.made += self.per_tick * self.producing
        capacity, ids = self.content[image.ctypes.data]
        waiting = self.made - self.next_id
        take = min(waiting, capacity - len(ids))
        ids.extend(range(self.next_id, self.next_id + take))
        self.next_id += take
        full = take < waiting or (len(ids) == capacity and waiting)
        if take < waiting:  # what did not fit is gone
            self.dropped += waiting - take
            self.next_id = self.made
        self._leave()
        reason = pm.PmDecodeStopReason.COUNTER_DATA_FULL if full else pm.PmDecodeStopReason.END_OF_RECORDS
        return pm.Decoded(stop_reason=reason, overflow=False)

    def sample_info(self, handle, image, index):
        self._enter()
        i = self.content[image.ctypes.data][1][index]
        self._leave()
        return 20 * i, 20 * i + 20

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


def run_pipeline(monkeypatch, *, per_tick, delay, seconds=0.3, pool=3, threads=2, samples_per_image=40,
                 interval_ns=20):
    fake = FakePm(per_tick, tick_on_decode=not interval_ns)
    for name in ("new_counter_data", "initialize_counter_data", "decode", "counter_data_info", "sample_times_into",
                 "sample_info"):
        monkeypatch.setattr(pm, name, getattr(fake, name))
    monkeypatch.setattr(host.ProfilerHost, "evaluator", lambda self, metrics: fake.evaluator(delay))
    pipe = _sampling._Pipeline(
        1, "GH100", ["a", "b"], None, samples_per_image=samples_per_image, pool_size=pool, evaluators=threads,
        period_s=0.001, interval_ns=interval_ns, clock=fake.clock,
    )
    pipe.gil_wait_s = 0.0  # the simulated clock does not run while a thread waits
    pipe.start(0)
    time.sleep(seconds)
    fake.producing = False  # cuptiPmSamplingStop
    pipe.finish()
    values, stamps = pipe.series()
    return fake, pipe, values, stamps


def test_every_sample_is_evaluated_once_in_order(monkeypatch):
    fake, pipe, values, stamps = run_pipeline(monkeypatch, per_tick=7, delay=0.0, samples_per_image=100, pool=8)
    assert pipe.errors == []
    assert pipe.full_stops == 0 and fake.dropped == 0  # images were handed over before a decode could fill one
    assert fake.made > 500
    kept = values[:, 0].astype(np.int64)
    if pipe.discarded:  # a loaded machine starved the evaluators of CPU until the pool ran dry: counted, in order
        assert kept.size + pipe.discarded == fake.made and (np.diff(kept) > 0).all()
        return
    np.testing.assert_array_equal(kept, np.arange(fake.made))  # nothing lost, nothing twice
    assert (values[:, 1] == -1).all()
    np.testing.assert_array_equal(stamps[:, 0], 20 * np.arange(fake.made))
    assert pipe.handed_off > pipe.pool_size  # images were recycled
    assert _timeline.count_lost(stamps[:, 0], stamps[:, 1], 20) == 0
    assert pipe.decoded_samples == fake.made and pipe.decode_seconds > 0


def test_without_the_backlog_estimate_full_images_lose_samples_and_the_loss_is_counted(monkeypatch):
    # interval unknown: no estimate, so images are handed over only when a decode filled them, losing the rest
    fake, pipe, values, stamps = run_pipeline(monkeypatch, per_tick=7, delay=0.0, samples_per_image=100, interval_ns=0)
    assert pipe.full_stops > 0 and fake.dropped > 0
    kept = values[:, 0].astype(np.int64)
    assert (np.diff(kept) > 0).all()
    assert kept.size + fake.dropped == fake.made
    # the gaps between kept samples are what count_lost sees: all drops but those before the first kept sample and
    # those after the last one (a decode that filled its image just before Stop loses the tail)
    lost_before, lost_after = kept[0], fake.made - 1 - kept[-1]
    assert _timeline.count_lost(stamps[:, 0], stamps[:, 1], 20) == fake.dropped - lost_before - lost_after


def test_backlog_larger_than_an_image_is_lost_and_counted(monkeypatch):
    # decoding cannot keep up: more samples wait than an image holds; each decode fills a fresh image, loses the rest
    fake, pipe, values, stamps = run_pipeline(monkeypatch, per_tick=150, delay=0.0, samples_per_image=100, pool=4)
    assert pipe.full_stops > 0 and fake.dropped > 0 and pipe.errors == []
    kept = values[:, 0].astype(np.int64)
    assert kept.size + fake.dropped + pipe.discarded == fake.made
    assert _timeline.count_lost(stamps[:, 0], stamps[:, 1], 20) == kept[-1] + 1 - kept[0] - kept.size  # gaps between kept


def test_stop_gets_the_lock_from_a_decode_thread_that_cannot_keep_up(monkeypatch):
    fake = FakePm(150)
    fake.decode_s = 0.002
    for name in ("new_counter_data", "initialize_counter_data", "decode", "counter_data_info", "sample_times_into",
                 "sample_info"):
        monkeypatch.setattr(pm, name, getattr(fake, name))
    monkeypatch.setattr(host.ProfilerHost, "evaluator", lambda self, metrics: fake.evaluator(0.0))
    pipe = _sampling._Pipeline(1, "GH100", ["a", "b"], None, samples_per_image=100, pool_size=4, evaluators=1,
                               period_s=0.001, interval_ns=20, clock=fake.clock)
    pipe.gil_wait_s = 0.0
    pipe.start(0)
    time.sleep(0.1)
    stopped = threading.Event()

    def stop():
        fake.producing = False
        stopped.set()

    caller = threading.Thread(target=pipe.stop_sampling, args=(stop,))
    caller.start()
    caller.join(timeout=20)  # a liveness check, not a timing: without the stop flag this waits for ever
    assert stopped.is_set()
    pipe.finish()
    kept = pipe.series()[0][:, 0].astype(np.int64)
    assert kept.size + fake.dropped + pipe.discarded == fake.made


def test_slow_evaluation_discards_and_counts(monkeypatch):
    # evaluation far slower than sampling: the pool runs dry, the decode thread discards instead of waiting
    fake, pipe, values, stamps = run_pipeline(monkeypatch, per_tick=30, delay=2e-4, pool=2, threads=1,
                                              samples_per_image=100)
    assert pipe.discarded > 0 and pipe.errors == []
    kept = values[:, 0].astype(np.int64)
    assert (np.diff(kept) > 0).all()  # in order, no duplicates
    assert kept.size + pipe.discarded + fake.dropped == fake.made
    assert _timeline.count_lost(stamps[:, 0], stamps[:, 1], 20) == kept[-1] + 1 - kept[0] - kept.size  # gaps between kept


def test_finish_twice_and_series_before_any_sample(monkeypatch):
    fake, pipe, values, stamps = run_pipeline(monkeypatch, per_tick=0, delay=0.0, seconds=0.02)
    pipe.finish()
    assert values.shape == (0, 2) and stamps.shape == (0, 2)


@pytest.mark.parametrize("decode_us, expected", [(0.3, 1), (8.0, 20), (12.6, 20), (16.9, 50), (45.0, 100), (140.0, 500)])
def test_suggested_interval_leaves_decoding_a_third_of_the_time_free(decode_us, expected):
    assert _plan.suggest_interval_us(decode_us) == expected


@pytest.mark.parametrize("interval_ns, expected", [(20_000, 5_000), (100_000, 1_000), (1_000, 8_192), (1_000_000, 256)])
def test_default_samples_per_image(interval_ns, expected):
    assert _plan.default_samples_per_image(interval_ns) == expected


@pytest.mark.parametrize(
    "samples_per_image, interval_ns, image_bytes, expected",
    [
        (5_000, 20_000, 32_000_000, 33),  # pm-fast at 20 us: two seconds would be 34 images; 1 GiB allows 33
        (1_000, 100_000, 21_700_000, 34),  # pm-default at 100 us
        (5_000, 20_000, 110_000_000, 9),  # pm-default at 20 us: 1 GiB allows 9
        (256, 1_000_000, 5_500_000, 14),  # 1 ms: two seconds of samples in 14 images
        (256, 10_000_000, 5_500_000, 8),  # long intervals: at least 8
        (4_096, 1_000, 88_700_000, 12),  # 1 us: two seconds would be 489 images; 1 GiB allows 12
    ],
)
def test_default_image_pool(samples_per_image, interval_ns, image_bytes, expected):
    assert _plan.default_image_pool(samples_per_image, interval_ns, image_bytes) == expected
