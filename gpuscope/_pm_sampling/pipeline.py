"""The decode thread and the in-process evaluator threads of PM sampling, over a fixed pool of counter-data
images (the worker-process evaluation backend is :mod:`gpuscope._pm_sampling.workers`)."""

from __future__ import annotations

import dataclasses
import math
import os
import queue
import sys
import threading
import time
from collections.abc import Sequence

import numpy as np

from gpuscope._util.shield import run_shielded
from gpuscope.errors import CuptiMemoryError

__all__ = ["ImagePool", "Pipeline"]


@dataclasses.dataclass
class ImagePool:
    """Counter-data images initialised for one PM sampling object, for its next session (:mod:`gpuscope._gpu.keep`):
    the pool and the discard image and, evaluating in worker processes, the :class:`~.workers.ProcessEvaluation`
    whose shared memory holds the pool and whose workers map it (None: evaluated in threads)."""

    images: list
    discard: np.ndarray
    evaluation: object = None
    note: str = ""  # the pool_note of the session that made it


class Pipeline:
    """Decodes samples into a fixed pool of counter-data images and evaluates them while sampling runs.

    A raw image costs about 21.7 KB per sample (pm-default, GH100), so images are small, made up front, and
    recycled: the decode thread only decodes into the current image and queues it for evaluation before a decode
    could fill it, then takes a free one. **A decode must never fill its image**: when ``cuptiPmSamplingDecodeData``
    stops with ``COUNTER_DATA_FULL``, the samples it had read beyond the image's capacity are gone (measured on the
    H100: every gap in the samples sat at such an image boundary). Each decode reads the samples waiting in the
    hardware buffer when it starts, so before each decode the thread estimates that backlog from the time since the
    last decoded sample ended, and hands the image over first if the backlog might not fit.

    Evaluator threads (each with its own host object) read the samples' timestamps, evaluate them into numpy
    arrays, re-initialise the image and put it back in the pool. The decode thread never waits for an image or
    allocates one: if the pool is empty it decodes into a discard image, whose samples are counted in
    :attr:`discarded` (and show as lost). Calls that take the PM sampling object (decode, sample info, image
    initialisation) are serialised by one lock, as CUPTI does not say they are thread-safe.

    The time spent inside ``DecodeData`` and the samples it produced are recorded (:attr:`decode_seconds`,
    :attr:`decoded_samples`): decoding costs tens of µs per pm-default sample on the H100's host, which is what
    limits the shortest interval that runs without loss.
    """

    #: Margin on the estimated backlog before a decode (samples), on top of 25%.
    BACKLOG_MARGIN = 32
    #: Fewest shared images worth worker processes; with fewer, images are evaluated in threads of this process.
    MIN_SHARED_POOL = 2
    #: Seconds :meth:`finish` waits in all for free images after Stop (images come back as the evaluators finish
    #: them); past it, what is left in the hardware buffer is decoded into the discard image and counted.
    FREE_WAIT_S = 30.0
    #: Seconds :meth:`finish` waits for the decode thread to end its last drain.
    JOIN_TIMEOUT_S = 30.0
    #: Seconds :meth:`finish` waits for the evaluator threads while none of them finishes an image; past it, the
    #: images they hold or have not taken are counted as lost and the threads are left to themselves.
    EVALUATE_TIMEOUT_S = 30.0

    def __init__(self, handle: int, chip: str, metrics: Sequence[str], availability, *, samples_per_image: int,
                 pool_size: int, evaluators: int, period_s: float, interval_ns: int = 0, clock=None,
                 evaluate_in: str = "thread", images: ImagePool | None = None, hold=None, on_drain=None):
        from gpuscope.cupti import host
        from gpuscope.cupti import pm_sampling as pm
        from gpuscope.cupti._types import ProfilerType

        self._pm = pm
        self._on_drain = on_drain  # called by the decode thread after each periodic drain (the range stamps' anchors)
        self._pid = os.getpid()  # a forked child must not touch this pipeline: its threads and workers are not its own
        self.handle = handle
        self.metrics = list(metrics)
        self.samples_per_image = samples_per_image
        self.pool_size = pool_size
        self.period_s = period_s
        self.interval_ns = int(interval_ns)
        if clock is None:
            from gpuscope.cupti import activity

            clock = activity.timestamp
        self._clock = clock  # CUPTI's clock (ns), the clock of the sample timestamps
        # how long this thread may wait for the GIL between reading the clock and starting the decode: a forced
        # switch comes after one switch interval
        self.gil_wait_s = sys.getswitchinterval()
        self.overflows = 0  # decodes that reported a hardware-buffer overflow
        self.errors: list[str] = []
        self.decodes = 0
        self.full_stops = 0  # decodes that stopped because the image was full (samples beyond it were lost)
        self.handed_off = 0  # images queued for evaluation
        self.discarded = 0  # samples decoded into the discard image because no image was free
        self.decode_seconds = 0.0  # time spent inside cuptiPmSamplingDecodeData
        self.decoded_samples = 0
        self.longest_drain_gap_s = 0.0  # the longest time between two drains: how late the decode thread got
        self._last_drain: float | None = None
        self._last_end_ns: int | None = None  # end of the last decoded sample
        self._lock = threading.Lock()  # serialises calls that take the PM sampling object
        self._free: queue.Queue = queue.Queue()
        self._full: queue.Queue = queue.Queue()  # (sequence number, image); None stops an evaluator
        self._results: dict[int, tuple[np.ndarray, np.ndarray]] = {}  # sequence number -> (values, stamps)
        self._batches: dict[int, list] = {}  # id(image) -> the decodes' batches in it (first, last, anchors)
        self.inexact_batches = 0  # batches whose timestamps workers could not rebuild (read with GetSampleInfo)
        self.images_unevaluated = 0  # images finish() gave up on: an evaluator thread did not finish them in time
        self.samples_unevaluated = 0  # the samples in them
        self._busy: dict[str, int] = {}  # evaluator thread name -> samples in the image it is evaluating
        self._progress = time.monotonic()  # when an evaluator thread last finished an image
        self._free_deadline = math.inf  # set by finish(): until when the last drain may wait for free images
        self.evaluate_in = evaluate_in
        self._hosts, evaluator_objects, self._backend = [], [], None
        self.pool_note = ""  # why the pool is smaller than asked, or why evaluation moved into this process
        self._counts = None  # the workers' counts of this session, taken at finish(): the workers may serve another
        # hold(image): the owner of the sampling object keeps every image CUPTI is given until it is disabled
        hold = hold or (lambda image: None)
        try:
            if images is not None:  # an earlier session's pool, initialised, with its workers if it had any
                self.pool_note, self._discard = images.note, images.discard
                self.pool_size = len(images.images)
                self.evaluate_in = "thread" if images.evaluation is None else "process"
                for image in images.images:
                    self._free.put(image)
                if images.evaluation is not None:
                    self._backend = images.evaluation
                    self._backend.attach(self)
            elif evaluate_in == "process":
                from gpuscope._pm_sampling.workers import ProcessEvaluation

                image_bytes = pm.counter_data_size(handle, self.metrics, samples_per_image)
                backend = ProcessEvaluation(self, chip, self.metrics, availability, image_bytes=image_bytes,
                                            pool_size=pool_size, workers=evaluators)
                self._backend, self.pool_note = backend, backend.pool_note
                if len(backend.images) < self.MIN_SHARED_POOL:
                    backend.close()
                    self._backend, self.evaluate_in = None, "thread"
                    self.pool_note += ("; " if self.pool_note else "") + "evaluating in threads of this process instead"
                else:
                    self.pool_size = len(backend.images)
                    for image in backend.images:
                        hold(image)
                        pm.initialize_counter_data(handle, image)
                        self._free.put(image)
                    # workers take ~1 s to start (Python, NumPy, CUPTI): before sampling, so that no sample waits
                    backend.start()
                    backend.wait_ready()
            elif evaluate_in != "thread":
                raise ValueError(f"evaluate_in is 'process' or 'thread'; got {evaluate_in!r}.")
            if self.evaluate_in == "thread":
                self._hosts = [host.ProfilerHost(chip, ProfilerType.PM_SAMPLING, availability) for _ in range(evaluators)]
                evaluator_objects = [h.evaluator(self.metrics) for h in self._hosts]
                for _ in range(pool_size if images is None else 0):
                    self._free.put(self._new_image(samples_per_image, hold))
            if images is None:
                self._discard = self._new_image(samples_per_image, hold)
        except BaseException:
            # A Ctrl-C while the workers start (about 1 s), or a MemoryError for the last image, must not leave them,
            # their dispatcher or their shared images behind; a second Ctrl-C cannot cut this short.
            run_shielded(self.close_workers)
            raise
        self._current = self._free.get_nowait()
        self.spare = None  # after finish(): the ImagePool, all initialised, when every image came back
        self.clean = False  # after finish(): no decode or evaluation error
        self._stop = threading.Event()
        self._stopping = threading.Event()  # Stop is waiting for the lock: no more decodes until finish()
        self._threads = [threading.Thread(target=self._decode_loop, name="gpuscope-pm-decode", daemon=True)] + [
            threading.Thread(target=self._evaluate_loop, args=(ev,), name=f"gpuscope-pm-evaluate-{i}", daemon=True)
            for i, ev in enumerate(evaluator_objects)
        ]
        self._finished = False

    def _new_image(self, samples: int, hold):
        """A new image, initialised for the sampling object, held by the object's owner (CUPTI has its address)."""
        image = self._pm.new_counter_data(self.handle, self.metrics, samples)
        hold(image)
        return image

    def start(self, start_ns: int | None = None) -> None:
        """Start the threads; *start_ns* (CUPTI clock) is when sampling started, the origin of the first backlog."""
        self._last_end_ns = start_ns
        for thread in self._threads:
            thread.start()

    # -- decode thread ------------------------------------------------------------------------------------
    def _decode_loop(self) -> None:
        # one drain every period_s, counted from the start of the previous one: a drain that took longer than
        # the period is followed at once by the next, which keeps the backlog of each decode near one period
        started = time.perf_counter()
        while not self._stop.wait(max(0.0, self.period_s - (time.perf_counter() - started))):
            started = time.perf_counter()
            self.drain()
            if self._on_drain is not None:
                try:
                    self._on_drain()
                except Exception as exc:  # keep the thread alive; reported in the result
                    self.errors.append(f"after a drain: {type(exc).__name__}: {exc}")

    def _hand_off(self, wait: bool = False) -> None:
        """Queue the current image for evaluation (the discard image: count and empty it) and take a free one,
        or the discard image if none is free (*wait*: wait for one, after Stop only)."""
        pm = self._pm
        if self._current is self._discard:
            self.discarded += pm.counter_data_info(self._discard).completed
            self._batches.pop(id(self._discard), None)
            with self._lock:
                pm.initialize_counter_data(self.handle, self._discard)
        else:
            self._queue(self._current)
        self._current = self._take_free(wait)

    def _take_free(self, wait: bool = False):
        """A free image, or the discard image if none is free (*wait*: wait for one until :meth:`finish`'s
        deadline, after Stop only)."""
        try:
            if wait:
                return self._free.get(timeout=max(0.0, min(self._free_deadline - time.monotonic(), self.FREE_WAIT_S)))
            return self._free.get_nowait()
        except queue.Empty:
            return self._discard

    def _queue(self, image) -> None:
        """Hand *image* to the evaluators, with its sequence number, its samples and its decodes' batches."""
        batches = self._batches.pop(id(image), [])
        n = self._pm.counter_data_info(image).completed
        if self._backend is not None:
            self._backend.submit(self.handed_off, image, n, batches)
        else:
            self._full.put((self.handed_off, image, n))
        self.handed_off += 1

    @property
    def forked(self) -> bool:
        """True in a child forked from the process that made this pipeline: the threads, the evaluation workers
        and the sampling object are the parent's, and nothing here may touch them (the lock may have been held
        by the parent's decode thread at the fork, and stay held for ever)."""
        return os.getpid() != self._pid

    def stop_sampling(self, call):
        """Run *call* (``cuptiPmSamplingStop``) holding the lock of the PM sampling object, after the decode
        thread's current decode: the thread stops decoding until :meth:`finish` (a decode thread that cannot keep
        up would otherwise take the lock again and again, and Stop would wait for seconds). Does nothing in a
        forked child."""
        if self.forked:
            return None
        self._stopping.set()
        with self._lock:
            return call()

    def expected_backlog(self) -> int:
        """Samples that may be waiting in the hardware buffer when the next decode starts: the time since the last
        decoded sample ended, plus :attr:`gil_wait_s` (one Python thread switch interval: how long this thread may
        wait for the GIL between reading the clock and starting the decode), in intervals, times ``1 / (1 - load)``
        (at least 1.25) where ``load`` is the share of an interval that decoding a sample has taken so far, plus
        :attr:`BACKLOG_MARGIN` (0 when the interval is unknown)."""
        if not self.interval_ns or self._last_end_ns is None:
            return 0
        waiting = max(0, self._clock() - self._last_end_ns) + self.gil_wait_s * 1e9
        # samples that arrive while the decode runs may be decoded too: with decoding taking a fraction `load` of
        # each interval, a backlog B grows to B / (1 - load) by the time the decode is done
        load = min(0.8, self.decode_seconds * 1e9 / self.decoded_samples / self.interval_ns) if self.decoded_samples else 0
        return math.ceil(max(1.25, 1 / (1 - load)) * waiting / self.interval_ns) + self.BACKLOG_MARGIN

    def drain(self, wait: bool = False) -> None:
        """Decode until the hardware buffer is empty, handing images over before a decode could fill them."""
        pm = self._pm
        now = time.perf_counter()
        if self._last_drain is not None:
            self.longest_drain_gap_s = max(self.longest_drain_gap_s, now - self._last_drain)
        self._last_drain = now
        retried = False
        while not (self._stopping.is_set() and not wait):
            if self._current is self._discard and not self._free.empty():
                self._hand_off(wait)
            hand_over_first = False
            try:
                with self._lock:
                    # the backlog is estimated here, under the lock, just before the decode: an evaluator holding
                    # the lock would otherwise let the backlog outgrow the estimate
                    before = pm.counter_data_info(self._current).populated
                    backlog = self.expected_backlog()
                    if before and self._current is not self._discard and self.samples_per_image - before < backlog:
                        if wait:  # after Stop: wait for a free image outside the lock, which evaluators need
                            hand_over_first = True
                        else:
                            self._queue(self._current)
                            self._current = self._take_free()
                            before = pm.counter_data_info(self._current).populated
                    if not hand_over_first:
                        result = self._decode(before)
            except CuptiMemoryError as exc:
                # CUPTI says OUT_OF_MEMORY both for a full counter-data image and for a hardware buffer that
                # filled: retry once on another image; failing again, it was the hardware buffer.
                if not retried and pm.counter_data_info(self._current).populated:
                    retried = True
                    self._hand_off(wait)
                    continue
                self.overflows += 1
                self.errors.append(str(exc))
                return
            except Exception as exc:  # keep the thread alive; reported in the result
                self.errors.append(f"{type(exc).__name__}: {exc}")
                return
            if hand_over_first:
                self._queue(self._current)
                self._current = self._take_free(wait=True)
                continue
            self.decodes += 1
            self.overflows += result.overflow
            if result.stop_reason != pm.PmDecodeStopReason.COUNTER_DATA_FULL:
                break
            self.full_stops += 1
            self._hand_off(wait)

    def _decode(self, before: int):
        """One ``DecodeData`` into the current image (hold the lock), recording its cost and its batch."""
        pm = self._pm
        t0 = time.perf_counter()
        result = pm.decode(self.handle, self._current)
        self.decode_seconds += time.perf_counter() - t0
        after = pm.counter_data_info(self._current).populated
        if after > before:
            self.decoded_samples += after - before
            self._last_end_ns = pm.sample_info(self.handle, self._current, after - 1)[1]
            if self._backend is not None:  # anchors for rebuilding the timestamps
                first = pm.sample_info(self.handle, self._current, before)
                self._batches.setdefault(id(self._current), []).append(
                    (before, after - 1, first[0], first[1], self._last_end_ns, bool(result.overflow))
                )
        return result

    #: Samples whose timestamps an evaluator reads per hold of the object lock (keeps the decode thread's waits
    #: short: reading a timestamp took 2-9 µs on the H100's host).
    TIMESTAMP_CHUNK = 64

    def read_timestamps(self, image, first: int, count: int, out: np.ndarray) -> None:
        """``GetSampleInfo`` of samples ``first .. first+count-1`` into rows ``0 .. count-1`` of *out*, holding the
        object lock for :attr:`TIMESTAMP_CHUNK` samples at a time."""
        for k in range(0, count, self.TIMESTAMP_CHUNK):
            with self._lock:
                self._pm.sample_times_into(self.handle, image, first + k, min(self.TIMESTAMP_CHUNK, count - k), out[k:])

    def recycle(self, image) -> None:
        """Re-initialise an evaluated image and put it back in the pool (if that fails, the pool shrinks by one)."""
        try:
            with self._lock:
                self._pm.initialize_counter_data(self.handle, image)
            self._free.put(image)
        except Exception as exc:
            self.errors.append(f"re-initialise: {type(exc).__name__}: {exc}")

    @property
    def images_lost(self) -> int:
        """Images whose samples were never evaluated: given up on by :meth:`finish` (an evaluator thread did not
        finish within :attr:`EVALUATE_TIMEOUT_S`), or by the worker processes' own deadlines."""
        return self.images_unevaluated + self.evaluation_counts()["images_lost"]

    def evaluation_counts(self) -> dict:
        """This session's worker counts: ``ready``, ``lost``, ``recovered`` and ``images_lost`` (all 0 without
        workers). Taken at :meth:`finish`, after which the workers may serve another session and count anew."""
        if self._counts is not None:
            return self._counts
        b = self._backend
        if b is None:
            return {"ready": 0, "lost": 0, "recovered": 0, "images_lost": 0}
        return {"ready": b.ready_workers, "lost": b.workers_lost, "recovered": b.images_recovered,
                "images_lost": b.images_lost}

    # -- evaluator threads --------------------------------------------------------------------------------
    def _evaluate_loop(self, evaluator) -> None:
        me = threading.current_thread().name
        while (item := self._full.get()) is not None:
            seq, image, n = item
            self._busy[me] = n
            result = None
            try:
                stamps = np.empty((n, 2), dtype=np.int64)
                values = np.empty((n, len(self.metrics)), dtype=np.float64)
                self.read_timestamps(image, 0, n, stamps)
                evaluator.evaluate_into(image, 0, n, values)
                result = (values, stamps)
            except Exception as exc:  # the samples are lost (and counted as such); the thread goes on
                error = f"evaluate: {type(exc).__name__}: {exc}"
            with self._lock:  # finish() gives up holding it for good: either this image counts, or it is lost
                if result is None:
                    self.errors.append(error)
                else:
                    self._results[seq] = result
                del self._busy[me]
                self._progress = time.monotonic()
            self.recycle(image)

    # -- end ----------------------------------------------------------------------------------------------
    def finish(self) -> None:
        """Stop the decode thread, decode what is left (call after ``cuptiPmSamplingStop``) and wait for the
        evaluators, which need the sampling object for the timestamps (safe to call twice; does nothing in a forked
        child).

        Every wait has a deadline: the decode thread's last drain (:attr:`JOIN_TIMEOUT_S`), free images for what is
        left in the hardware buffer (:attr:`FREE_WAIT_S` in all; then the discard image), the evaluator threads
        (:attr:`EVALUATE_TIMEOUT_S` without an image finished). What a missed deadline costs is in :attr:`errors`,
        :attr:`discarded` and :attr:`images_lost`.
        """
        if self._finished:
            return
        self._finished = True
        if self.forked:
            return
        self._stop.set()
        decode, *evaluate = self._threads
        if decode.is_alive():
            decode.join(self.JOIN_TIMEOUT_S)
        if decode.is_alive():  # it holds the current image: leave it, and what is still in the hardware buffer
            self.errors.append(f"the decode thread did not stop within {self.JOIN_TIMEOUT_S:g} s: the samples left "
                               "in the hardware buffer were not decoded (counted as lost samples)")
        else:
            self._free_deadline = time.monotonic() + self.FREE_WAIT_S
            self.drain(wait=True)
            self._hand_off(wait=False)  # the last, partly filled image
        reusable = False
        if self._backend is not None:  # every image back; the workers stay while they can serve another session
            reusable = self._backend.finish()
            self._counts = self.evaluation_counts()
        for _ in evaluate:
            self._full.put(None)
        stuck = self._wait_for_evaluators(evaluate)
        while not self._full.empty():  # evaluators never started (start failed) or gave up on: not evaluated
            item = self._full.get_nowait()
            if item is not None and stuck:
                self.images_unevaluated += 1
                self.samples_unevaluated += item[2]
        if stuck:
            self.errors.append(
                f"{len(stuck)} evaluator thread(s) did not finish an image within {self.EVALUATE_TIMEOUT_S:g} s: "
                f"{self.images_unevaluated} image(s) ({self.samples_unevaluated} samples) were not evaluated "
                "(counted as lost samples); the thread(s) were left running")
        self.clean = not self.errors  # the sampling object may serve the next session (gpuscope._gpu.keep)
        pool = [] if self._current is None or self._current is self._discard else [self._current]  # taken, unused
        while not self._free.empty():
            pool.append(self._free.get_nowait())
        if len(pool) == self.pool_size and not self.errors and (self._backend is None or reusable):
            try:  # the pool, with its workers if any, can serve the next session (gpuscope._gpu.keep)
                with self._lock:
                    self._pm.initialize_counter_data(self.handle, self._discard)
                self.spare = ImagePool(pool, self._discard, self._backend, self.pool_note)
            except Exception as exc:
                self.errors.append(f"re-initialise: {type(exc).__name__}: {exc}")
        if self._backend is not None and self.spare is None:
            self._backend.close()
        if not decode.is_alive():
            self._current = self._discard = None
        self._free = queue.Queue()
        busy = {t.name for t in stuck}
        for h, thread in zip(self._hosts, evaluate):
            if thread.name not in busy:  # a host object still evaluating is left open: closing it would crash
                h.close()

    def _wait_for_evaluators(self, evaluate: list) -> list:
        """Wait for the evaluator threads to end (each has its ``None``); give up when none of them has finished an
        image for :attr:`EVALUATE_TIMEOUT_S`. Returns the threads given up on.

        Giving up takes the lock of the sampling object for good: a thread that comes back from its evaluation
        then waits on it for ever, instead of calling into a sampling object that is disabled by then or storing
        results already counted as lost."""
        self._progress = time.monotonic()
        while alive := [t for t in evaluate if t.is_alive()]:
            if time.monotonic() - self._progress > self.EVALUATE_TIMEOUT_S:
                if not self._lock.acquire(timeout=self.JOIN_TIMEOUT_S):
                    self.errors.append("an evaluator thread holds the PM sampling object and does not return")
                self.images_unevaluated += len(self._busy)
                self.samples_unevaluated += sum(self._busy.values())
                return alive
            alive[0].join(0.25)
        return []

    def close_workers(self) -> None:
        """Stop the evaluation workers, if any, and release the evaluator threads' host objects (safe to call twice;
        :meth:`finish` does it too; does nothing in a forked child, whose workers are the parent's)."""
        if self.forked:
            return
        if self._backend is not None:
            self._backend.close()
        for h in self._hosts:
            h.close()

    def series(self) -> tuple[np.ndarray, np.ndarray]:
        """``(values, stamps)``: (n, metrics) float64 and (n, 2) int64, in sample order."""
        parts = [self._results[k] for k in sorted(self._results)]
        values = np.concatenate([v for v, _ in parts]) if parts else np.empty((0, len(self.metrics)))
        stamps = np.concatenate([t for _, t in parts]) if parts else np.empty((0, 2), dtype=np.int64)
        return values, stamps
