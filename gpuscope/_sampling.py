"""``gpuscope.sample``: hardware metrics over time (CUPTI PM sampling), aligned with ``gpuscope.range``.

How it works: the config image is checked to fit in one pass before anything starts; then a PM sampling object
is enabled on the device and started. A background thread that does nothing but ``DecodeData`` moves samples out
of the hardware buffer into a small, fixed pool of counter-data images; evaluator threads evaluate each image
while sampling runs (raw images cost ~21.7 KB per sample, far too much to keep) and return it to the pool. User
ranges are stamped with ``cuptiGetTimestamp``, the clock of the sample timestamps.

Lost samples are never dropped silently: the decode thread counts hardware-buffer overflows, and gaps in the
sample timestamps are counted as lost samples; both go into the Dataset's attrs (and a warning).
"""

from __future__ import annotations

import dataclasses
import enum
import math
import queue
import re
import sys
import threading
import time
import warnings
from collections.abc import Iterable, Sequence

import numpy as np

from .errors import CuptiMemoryError, GpuscopeWarning, NotSinglePassError, SamplerBusyError

__all__ = [
    "sample",
    "Sampler",
    "Trigger",
    "parse_interval",
    "choose_trigger",
    "single_pass_groups",
    "innermost_ranges",
    "count_lost",
    "MIN_INTERVAL_NS",
]

def suggest_interval_us(decode_us_per_sample: float) -> int:
    """The interval (µs, rounded up to a 1-2-5 step) of which decoding would take at most two thirds.

    On the H100, runs whose decoding took up to ~65% of the interval lost nothing; at ~75% a stall of the decode
    thread (a long drain) was enough to lose samples."""
    need = 1.5 * decode_us_per_sample
    for step in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000):
        if step >= need:
            return step
    return int(math.ceil(need))


#: Memory the default pool of counter-data images may take (bytes).
POOL_MEMORY = 1 << 30


def default_image_pool(samples_per_image: int, interval_ns: int, image_bytes: int) -> int:
    """Images in the default pool: two seconds of samples in images filled to 60% (so evaluation may fall behind
    for two seconds without losing any), at least 8, and no more than :data:`POOL_MEMORY` allows beyond those 8."""
    second = math.ceil(2e9 / (max(interval_ns, 1) * 0.6 * samples_per_image))
    return max(8, min(second, POOL_MEMORY // max(image_bytes, 1)))


def default_samples_per_image(interval_ns: int) -> int:
    """Capacity of each counter-data image: about 100 ms of samples, 256 to 8,192 (pm-default: ~21.7 KB a sample
    on GH100, pm-fast ~6.4 KB). A decode must fit in one image, and a decode under load reads up to a few tens of
    ms of samples."""
    return int(min(max(100e6 / max(interval_ns, 1), 256), 8_192))


#: Shortest interval gpuscope accepts for the time trigger (ns). Shorter intervals are rejected up front:
#: the hardware buffer fills faster than samples can be decoded (see docs/pm-sampling.md for the measurements).
MIN_INTERVAL_NS = 1_000

_UNITS_NS = {"ns": 1, "us": 1_000, "µs": 1_000, "ms": 1_000_000, "s": 1_000_000_000}
_INTERVAL_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(ns|us|µs|ms|s|cycles)\s*$")


class Trigger(str, enum.Enum):
    """What starts a sample: a fixed time interval, or a number of sys-clock cycles (Turing and GA100)."""

    TIME = "time"
    SYSCLK = "sysclk"


def parse_interval(interval) -> tuple[int, str]:
    """Parse a sampling interval into ``(value, unit)`` with unit ``"ns"`` or ``"cycles"``.

    Accepts ``"20us"``, ``"0.5 ms"``, ``"100000ns"``, ``"1e-4s"``, ``"20000cycles"``, a
    :class:`datetime.timedelta`, or a number of nanoseconds.

    Raises
    ------
    ValueError
        The interval is not a positive time (or cycle count) or its unit is unknown.
    TypeError
        The interval is neither a string, a number nor a timedelta.
    """
    import datetime

    if isinstance(interval, datetime.timedelta):
        value, unit = interval.total_seconds() * 1e9, "ns"
    elif isinstance(interval, (int, float, np.integer, np.floating)) and not isinstance(interval, bool):
        value, unit = float(interval), "ns"
    elif isinstance(interval, str):
        match = _INTERVAL_RE.match(interval)
        if not match:
            raise ValueError(
                f"Cannot read the sampling interval {interval!r}: write a number and a unit, e.g. '20us', "
                "'100 us', '1ms' (units: ns, us, ms, s, or cycles for the sys-clock trigger)."
            )
        number, unit = float(match.group(1)), match.group(2)
        value, unit = (number, "cycles") if unit == "cycles" else (number * _UNITS_NS[unit], "ns")
    else:
        raise TypeError(f"A sampling interval is a string like '20us', a timedelta or ns; got {interval!r}.")
    if not math.isfinite(value) or round(value) <= 0:
        raise ValueError(f"The sampling interval must be positive; got {interval!r}.")
    return int(round(value)), unit


def choose_trigger(chip: str) -> Trigger:
    """The trigger a chip supports: sys-clock cycles on Turing (TU*) and GA100, time everywhere else."""
    return Trigger.SYSCLK if chip.startswith("TU") or chip == "GA100" else Trigger.TIME


# ---------------------------------------------------------------------------------------------------------
# Single-pass check (host API only: works offline)
# ---------------------------------------------------------------------------------------------------------


def _passes(metrics: Sequence[str], chip: str, availability) -> int:
    from .cupti import host
    from .cupti._types import ProfilerType

    return host.num_passes(host.config_image(chip, ProfilerType.PM_SAMPLING, metrics, availability))


def single_pass_groups(metrics: Sequence[str], chip: str, counter_availability=None):
    """Split *metrics* for PM sampling: ``(drop, groups)``.

    *drop* are metrics that need more than one pass even alone (they cannot be PM-sampled); *groups* are
    lists, in the given order, that each fit in one pass (greedy first fit).
    """
    drop, groups = [], []
    for name in metrics:
        if _passes([name], chip, counter_availability) > 1:
            drop.append(name)
            continue
        for group in groups:
            if _passes([*group, name], chip, counter_availability) == 1:
                group.append(name)
                break
        else:
            groups.append([name])
    return drop, groups


def check_single_pass(metrics: Sequence[str], chip: str, counter_availability=None) -> None:
    """Raise :class:`NotSinglePassError` unless *metrics* fit in one PM sampling pass on *chip*.

    Raises
    ------
    NotSinglePassError
        The message says which metrics to drop, and how to split the rest into one-pass lists.
    """
    passes = _passes(metrics, chip, counter_availability)
    if passes == 1:
        return
    drop, groups = single_pass_groups(metrics, chip, counter_availability)
    lines = [f"PM sampling collects one pass, but these {len(metrics)} metrics need {passes} passes on {chip}."]
    if drop:
        lines.append(
            "Drop these, which need more than one pass on their own (profile them per range with "
            f"gpuscope.Profiler instead): {drop}."
        )
    if len(groups) > 1:
        lines.append("Or split the rest into separate sampling runs, one per list:")
        lines.extend(f"  {g}" for g in groups)
    elif groups:
        lines.append(f"The rest fit in one pass: {groups[0]}.")
    raise NotSinglePassError("\n".join(lines), passes=passes, drop=drop, groups=groups)


# ---------------------------------------------------------------------------------------------------------
# Pure helpers over timestamps (tested without a GPU)
# ---------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Span:
    """One user range as the sampler saw it: path, thread and CUPTI timestamps (ns)."""

    path: str
    thread: int
    start_ns: int
    end_ns: int


def innermost_ranges(times_ns: np.ndarray, spans: Sequence[Span]) -> np.ndarray:
    """For each time, the path of the innermost user range open then ("" where none).

    "Innermost" is the most recently entered range still open; with ranges on several threads that is the
    latest ``range_push`` of any thread.
    """
    times_ns = np.asarray(times_ns, dtype=np.int64)
    out = np.full(times_ns.shape, "", dtype=object)
    if not spans or times_ns.size == 0:
        return out.astype(str)
    events = sorted(
        [(s.start_ns, 1, i) for i, s in enumerate(spans)] + [(s.end_ns, 0, i) for i, s in enumerate(spans)]
    )  # at equal times, pops (0) before pushes (1)
    order = np.argsort(times_ns, kind="stable")
    open_spans: dict[int, None] = {}  # insertion-ordered: the last key is the innermost
    k = 0
    for idx in order:
        t = times_ns[idx]
        while k < len(events) and events[k][0] <= t:
            _, is_push, i = events[k]
            if is_push:
                open_spans[i] = None
            else:
                open_spans.pop(i, None)
            k += 1
        if open_spans:
            out[idx] = spans[next(reversed(open_spans))].path
    return out.astype(str)


def count_lost(start_ns, end_ns, interval_ns: float, session_end_ns: int | None = None) -> int:
    """Samples that never arrived: a gap of ``g`` ns between one sample's end and the next one's start stands
    for ``round(g / interval)`` samples, and so does the time from the last sample to *session_end_ns*
    (less one interval, the sample in flight at Stop)."""
    if interval_ns <= 0:
        return 0
    start_ns = np.asarray(start_ns, dtype=np.int64)
    end_ns = np.asarray(end_ns, dtype=np.int64)
    lost = int(np.rint(np.clip(start_ns[1:] - end_ns[:-1], 0, None) / interval_ns).sum())
    if session_end_ns is not None and end_ns.size:
        lost += max(0, int(round((session_end_ns - end_ns[-1]) / interval_ns)) - 1)
    return lost


# ---------------------------------------------------------------------------------------------------------
# The decode and evaluate threads
# ---------------------------------------------------------------------------------------------------------


class _Pipeline:
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
    #: Seconds to wait for a free image after Stop (images come back as the evaluators finish them).
    FREE_WAIT_S = 30.0

    def __init__(self, handle: int, chip: str, metrics: Sequence[str], availability, *, samples_per_image: int,
                 pool_size: int, evaluators: int, period_s: float, interval_ns: int = 0, clock=None,
                 evaluate_in: str = "thread"):
        from .cupti import host
        from .cupti import pm_sampling as pm
        from .cupti._types import ProfilerType

        self._pm = pm
        self.handle = handle
        self.metrics = list(metrics)
        self.samples_per_image = samples_per_image
        self.pool_size = pool_size
        self.period_s = period_s
        self.interval_ns = int(interval_ns)
        if clock is None:
            from .cupti import activity

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
        self.evaluate_in = evaluate_in
        self._hosts, evaluator_objects, self._backend = [], [], None
        self.pool_note = ""  # why the pool is smaller than asked, or why evaluation moved into this process
        try:
            if evaluate_in == "process":
                from ._pm_workers import ProcessEvaluation

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
                for _ in range(pool_size):
                    self._free.put(pm.new_counter_data(handle, self.metrics, samples_per_image))
        except BaseException:
            self.close_workers()
            for h in self._hosts:
                h.close()
            raise
        self._discard = pm.new_counter_data(handle, self.metrics, samples_per_image)
        self._current = self._free.get_nowait()
        self._stop = threading.Event()
        self._stopping = threading.Event()  # Stop is waiting for the lock: no more decodes until finish()
        self._threads = [threading.Thread(target=self._decode_loop, name="gpuscope-pm-decode", daemon=True)] + [
            threading.Thread(target=self._evaluate_loop, args=(ev,), name=f"gpuscope-pm-evaluate-{i}", daemon=True)
            for i, ev in enumerate(evaluator_objects)
        ]
        self._finished = False

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
        """A free image, or the discard image if none is free (*wait*: wait for one, after Stop only)."""
        try:
            return self._free.get(timeout=self.FREE_WAIT_S) if wait else self._free.get_nowait()
        except queue.Empty:
            return self._discard

    def _queue(self, image) -> None:
        """Hand *image* to the evaluators, with its sequence number and its decodes' batches."""
        batches = self._batches.pop(id(image), [])
        if self._backend is not None:
            self._backend.submit(self.handed_off, image, self._pm.counter_data_info(image).completed, batches)
        else:
            self._full.put((self.handed_off, image))
        self.handed_off += 1

    def stop_sampling(self, call):
        """Run *call* (``cuptiPmSamplingStop``) holding the lock of the PM sampling object, after the decode
        thread's current decode: the thread stops decoding until :meth:`finish` (a decode thread that cannot keep
        up would otherwise take the lock again and again, and Stop would wait for seconds)."""
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

    # -- evaluator threads --------------------------------------------------------------------------------
    def _evaluate_loop(self, evaluator) -> None:
        while (item := self._full.get()) is not None:
            seq, image = item
            try:
                n = self._pm.counter_data_info(image).completed
                stamps = np.empty((n, 2), dtype=np.int64)
                values = np.empty((n, len(self.metrics)), dtype=np.float64)
                self.read_timestamps(image, 0, n, stamps)
                evaluator.evaluate_into(image, 0, n, values)
                self._results[seq] = (values, stamps)
            except Exception as exc:  # the samples are lost (and counted as such); the thread goes on
                self.errors.append(f"evaluate: {type(exc).__name__}: {exc}")
            self.recycle(image)

    # -- end ----------------------------------------------------------------------------------------------
    def finish(self) -> None:
        """Stop the decode thread, decode what is left (call after ``cuptiPmSamplingStop``) and wait for the
        evaluators, which need the sampling object for the timestamps (safe to call twice)."""
        if self._finished:
            return
        self._finished = True
        self._stop.set()
        decode, *evaluate = self._threads
        if decode.is_alive():
            decode.join()
        self.drain(wait=True)
        self._hand_off(wait=False)  # the last, partly filled image
        if self._backend is not None:
            self._backend.close()
        for _ in evaluate:
            self._full.put(None)
        for thread in evaluate:
            if thread.is_alive():
                thread.join()
        while not self._full.empty():  # evaluators never started (start failed): nothing to evaluate
            self._full.get_nowait()
        self._current = self._discard = None
        self._free = queue.Queue()
        for h in self._hosts:
            h.close()

    def close_workers(self) -> None:
        """Stop the evaluation workers, if any, and release the evaluator threads' host objects (safe to call twice;
        :meth:`finish` does it too)."""
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


# ---------------------------------------------------------------------------------------------------------
# The sampler
# ---------------------------------------------------------------------------------------------------------

_active: dict[int, "Sampler"] = {}
_active_lock = threading.Lock()


def run_shielded(fn, *args):
    """Run *fn* to its end even if Ctrl-C (or another signal handler's exception) arrives meanwhile.

    *fn* runs in a helper thread, which Python never interrupts with signals; this thread waits for it, catching
    ``KeyboardInterrupt``, and re-raises the first one once *fn* is done (an exception from *fn* wins). Teardown
    made this way cannot be cut short: the sampler is always unregistered and PM sampling always disabled.
    """
    outcome: list = [None, None]
    finished = threading.Event()

    def body():
        try:
            outcome[0] = fn(*args)
        except BaseException as exc:  # handed to the caller
            outcome[1] = exc
        finally:
            finished.set()

    helper = threading.Thread(target=body, name="gpuscope-teardown")
    interrupted = None
    try:
        helper.start()  # a signal may arrive while start() waits for the thread to run
    except BaseException as exc:
        interrupted = exc
    while not finished.is_set():
        try:  # not Thread.join: on Python 3.11 an interrupted join marks a running thread as stopped
            finished.wait()
        except BaseException as exc:  # KeyboardInterrupt, or an exception from a signal handler
            interrupted = interrupted or exc
    helper.join()
    if outcome[1] is not None:
        raise outcome[1]
    if interrupted is not None:
        raise interrupted
    return outcome[0]


class _RangeRecorder:
    """A ``gpuscope.range`` listener that stamps pushes and pops with the CUPTI clock."""

    def __init__(self, timestamp):
        self._timestamp = timestamp
        self.events: list[tuple[int, bool, str, int]] = []  # (ns, is_push, path, thread id)

    def range_push(self, path: str) -> None:
        self.events.append((self._timestamp(), True, path, threading.get_ident()))

    def range_pop(self, path: str) -> None:
        self.events.append((self._timestamp(), False, path, threading.get_ident()))

    def spans(self, open_until_ns: int, already_open: Iterable[str] = ()) -> list[Span]:
        """Pair pushes with pops per thread; ranges still open end at *open_until_ns*."""
        stacks: dict[int, list[tuple[str, int]]] = {}
        spans = []
        for t, is_push, path, thread in self.events:
            stack = stacks.setdefault(thread, [])
            if is_push:
                stack.append((path, t))
            elif stack:
                p, t0 = stack.pop()
                spans.append(Span(p, thread, t0, t))
        for thread, stack in stacks.items():
            spans.extend(Span(p, thread, t0, open_until_ns) for p, t0 in stack)
        return sorted(spans, key=lambda s: (s.start_ns, -s.end_ns))


class Sampler:
    """PM sampling on one device; make it with :func:`sample`.

    Use it as a context manager, or call :meth:`start` and :meth:`stop`. Read :attr:`dataset` afterwards.

    Attributes
    ----------
    metrics : list of str
        The sampled metrics (full CUPTI names).
    interval_ns : int
        The requested interval in ns (for the sys-clock trigger: the converted estimate).
    trigger : Trigger
        The trigger used.
    device : int
        CUDA device index.
    """

    def __init__(
        self,
        metrics="pm-default",
        interval="100us",
        device: int = 0,
        *,
        hardware_buffer_size: int = 512 << 20,
        decode_period: float = 0.01,
        samples_per_image: int | None = None,
        image_pool: int | None = None,
        evaluators: int = 2,
        evaluate_in: str = "process",
    ):
        value, unit = parse_interval(interval)
        if not isinstance(device, (int, np.integer)) or isinstance(device, bool) or device < 0:
            raise ValueError(f"device must be a CUDA device index (0, 1, ...); got {device!r}.")
        if hardware_buffer_size < (1 << 20):
            raise ValueError(f"hardware_buffer_size must be at least 1 MiB; got {hardware_buffer_size} bytes.")
        if decode_period <= 0:
            raise ValueError(f"decode_period must be positive seconds; got {decode_period!r}.")
        if samples_per_image is not None and samples_per_image < 2:
            raise ValueError(f"samples_per_image must be at least 2; got {samples_per_image!r}.")
        if evaluate_in not in ("process", "thread"):
            raise ValueError(f"evaluate_in is 'process' or 'thread'; got {evaluate_in!r}.")
        if (image_pool is not None and image_pool < 1) or evaluators < 1:
            raise ValueError(
                f"image_pool and evaluators must be at least 1; got {image_pool!r} and {evaluators!r}."
            )
        self.image_pool = None if image_pool is None else int(image_pool)
        self.evaluators = int(evaluators)
        self.evaluate_in = evaluate_in
        self._interval_value, self._interval_unit = value, unit
        self._requested_metrics = metrics
        self.device = int(device)
        self.hardware_buffer_size = int(hardware_buffer_size)
        self.decode_period = float(decode_period)
        self._samples_per_image = samples_per_image
        self.metrics: list[str] = []
        self.trigger: Trigger | None = None
        self.interval_ns: int = value if unit == "ns" else 0
        self._state = "new"
        self._dataset = None
        self._handle = None
        self._context = None
        self._initialized = False
        self._decoder: _Pipeline | None = None
        self.lost_samples = 0
        self.stop_call_ns = 0
        self._recorder: _RangeRecorder | None = None

    # -- lifetime -----------------------------------------------------------------------------------------
    def __enter__(self):
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb):
        self.stop()
        return False

    def start(self) -> "Sampler":
        """Check the metrics, enable PM sampling on the device and start sampling.

        Raises
        ------
        SamplerBusyError
            Another sampler runs on this device.
        NotSinglePassError
            The metrics need more than one pass; the message says which to drop or how to split them.
        UnknownMetricError
            A metric name that the chip cannot PM-sample (the message names close matches).
        ValueError
            The interval is shorter than the chip can sample.
        CuptiPermissionError
            This user may not read GPU performance counters.
        CuptiNotSupportedError
            The device does not support PM sampling (MIG, vGPU, ...).
        ProfilerBusyError
            Another profiler (Nsight, another CUPTI client) holds the counters.
        """
        if self._state != "new":
            raise RuntimeError(f"This sampler was already started (state: {self._state}); make a new one.")
        with _active_lock:
            other = _active.get(self.device)
            if other is not None:
                raise SamplerBusyError(
                    f"A PM sampler is already running on device {self.device} (metrics {other.metrics[:3]}...). "
                    "One sampler per device: stop it first, or sample all the metrics in one sampler."
                )
            _active[self.device] = self
        try:
            self._setup()
        except BaseException:
            try:
                run_shielded(self._teardown)
            finally:
                with _active_lock:
                    _active.pop(self.device, None)
                self._state = "failed"
            raise
        self._state = "running"
        return self

    def _setup(self) -> None:
        from . import _catalog, _device, _ranges
        from .cupti import activity, host, profiler
        from .cupti import pm_sampling as pm
        from .cupti._types import PmTriggerMode, ProfilerApi, ProfilerType

        self._context = _device.PrimaryContext(self.device)  # initialises the driver, keeps the device alive
        info = _device.device_info(self.device)
        support = profiler.device_support(self._context_device(), ProfilerApi.PM_SAMPLING)
        if not support.supported:
            from .errors import CuptiNotSupportedError

            reasons = ", ".join(support.reasons()) or support.overall.name
            raise CuptiNotSupportedError(27, "cuptiProfilerDeviceSupported", "PM sampling is not supported", reasons)
        profiler.initialize()
        self._initialized = True
        self.chip = profiler.chip_name(self.device)
        self.availability = pm.counter_availability(self.device)
        self.metrics = _catalog.resolve(self._requested_metrics, self.chip, "sampling")
        check_single_pass(self.metrics, self.chip, self.availability)
        self.trigger = choose_trigger(self.chip)
        self._check_interval(info)
        self.device_info = info
        self.config = host.config_image(self.chip, ProfilerType.PM_SAMPLING, self.metrics, self.availability)
        self._handle = pm.enable(self.device)
        trigger = PmTriggerMode.GPU_TIME_INTERVAL if self.trigger is Trigger.TIME else PmTriggerMode.GPU_SYSCLK_INTERVAL
        pm.set_config(self._handle, self.config, self.hardware_buffer_size, self._hw_interval, trigger)
        samples_per_image = self._samples_per_image or default_samples_per_image(self.interval_ns)
        if self.image_pool is None:
            image_bytes = pm.counter_data_size(self._handle, self.metrics, samples_per_image)
            self.image_pool = default_image_pool(samples_per_image, self.interval_ns, image_bytes)
        self._decoder = _Pipeline(
            self._handle,
            self.chip,
            self.metrics,
            self.availability,
            samples_per_image=samples_per_image,
            pool_size=self.image_pool,
            evaluators=self.evaluators,
            evaluate_in=self.evaluate_in,
            period_s=self.decode_period,
            interval_ns=self.interval_ns,
        )
        self.evaluate_in, self.image_pool = self._decoder.evaluate_in, self._decoder.pool_size
        if self._decoder.pool_note:
            warnings.warn(f"gpuscope PM sampling: {self._decoder.pool_note}.", GpuscopeWarning, stacklevel=4)
        self._recorder = _RangeRecorder(activity.timestamp)
        self._open_at_start = [p for p in [_ranges.current_path()] if p]
        _ranges.add_listener(self._recorder)
        self.start_ns = activity.timestamp()
        self._wall_start = time.time()
        pm.start(self._handle)
        self._started = True
        self._decoder.start(self.start_ns)

    def _context_device(self) -> int:
        from cuda.bindings import driver

        err, dev = driver.cuDeviceGet(self.device)
        return int(dev)

    def _check_interval(self, info) -> None:
        if self._interval_unit == "cycles":
            self._hw_interval = self._interval_value
            # sys-clock rate is not exposed; the SM clock is the estimate, the measured interval is in attrs
            self.interval_ns = max(1, round(self._interval_value * 1e6 / info.sm_clock_khz))
            if self.trigger is Trigger.TIME:
                raise ValueError(
                    f"{self.chip} samples on a time interval; give the interval in time units (e.g. '20us'), "
                    "not cycles."
                )
            return
        if self.interval_ns < MIN_INTERVAL_NS:
            raise ValueError(
                f"Sampling interval {self.interval_ns} ns is shorter than gpuscope allows ({MIN_INTERVAL_NS} ns): "
                f"{self.chip} cannot deliver samples that fast without losing them. Use interval='"
                f"{MIN_INTERVAL_NS // 1000}us' or longer (docs/pm-sampling.md lists the shortest loss-free interval)."
            )
        if self.trigger is Trigger.SYSCLK:
            self._hw_interval = max(1, round(self.interval_ns * info.sm_clock_khz / 1e6))
        else:
            self._hw_interval = self.interval_ns

    def stop(self) -> None:
        """Stop sampling, decode what is left and release the device (safe to call twice).

        Waits for the evaluator threads to finish the last images. Warns (:class:`GpuscopeWarning`) if samples
        were lost, saying why and what to change.
        """
        if self._state != "running":
            return
        self._state = "stopping"
        run_shielded(self._stop)
        message = self._loss_message()
        if message:
            warnings.warn(message, GpuscopeWarning, stacklevel=2)

    def _stop(self) -> None:
        from .cupti import activity
        from .cupti import pm_sampling as pm

        def stop_sampling():
            self.stop_ns = activity.timestamp()  # no sample can be expected after this
            pm.stop(self._handle)
            self.stop_call_ns = activity.timestamp() - self.stop_ns

        try:
            # not while a decode runs: a Stop during DecodeData lost the samples still in the hardware buffer
            self._decoder.stop_sampling(stop_sampling)
            self._started = False
            self._decoder.finish()
        finally:
            try:
                self._teardown()
            finally:
                with _active_lock:
                    _active.pop(self.device, None)
                self._state = "stopped"
                if not hasattr(self, "stop_ns"):
                    self.stop_ns = activity.timestamp()
                self._values, self._stamps = self._decoder.series()
                self.lost_samples = self._count_lost()

    def _count_lost(self) -> int:
        starts, ends = self._stamps[:, 0], self._stamps[:, 1]
        if not ends.size:  # nothing arrived: every sample of the session was lost
            return max(0, round((self.stop_ns - self.start_ns) / self.interval_ns))
        return count_lost(starts, ends, self.interval_ns, self.stop_ns)

    @property
    def decode_us_per_sample(self) -> float:
        """Time spent inside ``cuptiPmSamplingDecodeData`` per decoded sample (µs; NaN before any sample)."""
        d = self._decoder
        return d.decode_seconds / d.decoded_samples * 1e6 if d and d.decoded_samples else float("nan")

    def _loss_message(self) -> str:
        """Why samples were lost and what to do, or "" if none were."""
        d = self._decoder
        if not (self.lost_samples or d.overflows or d.errors or d.discarded):
            return ""
        backend = d._backend
        kept = len(self._stamps)
        lines = [
            f"PM sampling on device {self.device} lost {self.lost_samples} of {kept + self.lost_samples} samples "
            f"(interval {self.interval_ns / 1000:g} us, {len(self.metrics)} metrics; "
            "dataset.attrs['lost_samples'])."
        ]
        cost = self.decode_us_per_sample
        if math.isfinite(cost) and cost > 0.7 * self.interval_ns / 1000:
            lines.append(
                f"Decoding is the limit: cuptiPmSamplingDecodeData took {cost:.1f} us per sample of these metrics on "
                f"this machine, {100 * cost * 1000 / self.interval_ns:.0f}% of the interval, and it cannot run in "
                f"parallel. Use interval='{suggest_interval_us(cost)}us' or longer, or fewer metrics "
                "(the 'pm-fast' set decodes several times faster)."
            )
        if d.overflows:
            lines.append(
                f"The hardware buffer overflowed {d.overflows} time(s): use a longer interval or a larger "
                "hardware_buffer_size."
            )
        if d.discarded:
            lines.append(
                f"{d.discarded} samples were discarded because evaluation fell behind and no counter-data image was "
                "free: use a longer interval, or more image_pool or evaluators."
            )
        if backend is not None and (backend.workers_lost or backend.images_lost):
            lines.append(
                f"{backend.workers_lost} evaluation worker(s) were lost; {backend.images_recovered} image(s) they held "
                f"were evaluated in this process and {backend.images_lost} could not be (attrs "
                "'evaluation_workers_lost', 'images_recovered', 'images_lost')."
            )
        if d.errors:
            lines.append(f"Errors: {'; '.join(d.errors[:3])}.")
        return " ".join(lines)

    def _teardown(self) -> None:
        """Undo whatever :meth:`_setup` did, in reverse; trouble becomes warnings."""
        from . import _ranges
        from .cupti import pm_sampling as pm
        from .cupti import profiler

        steps = []
        if self._recorder is not None:
            steps.append(("remove range listener", lambda: _ranges.remove_listener(self._recorder)))
        if self._decoder is not None and getattr(self, "_started", False):
            steps.append(("stop", lambda: (pm.stop(self._handle), self._decoder.finish())))
        elif self._decoder is not None:
            steps.append(("evaluation workers", self._decoder.close_workers))
        if self._handle is not None:
            handle, self._handle = self._handle, None
            steps.append(("cuptiPmSamplingDisable", lambda: pm.disable(handle)))
        if self._initialized:
            self._initialized = False
            steps.append(("cuptiProfilerDeInitialize", profiler.deinitialize))
        if self._context is not None:
            context, self._context = self._context, None
            steps.append(("release context", context.close))
        for what, step in steps:
            try:
                step()
            except Exception as exc:
                warnings.warn(f"gpuscope PM sampling cleanup ({what}) failed: {exc}", GpuscopeWarning, stacklevel=3)
        self._started = False

    def close(self) -> None:
        """Same as :meth:`stop` (safe to call twice)."""
        self.stop()

    # -- results ------------------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._state == "running"

    @property
    def overflows(self) -> int:
        """Hardware-buffer overflows the decode thread saw."""
        return self._decoder.overflows if self._decoder else 0

    @property
    def discarded_samples(self) -> int:
        """Samples decoded while no counter-data image was free (the evaluators fell behind): thrown away."""
        return self._decoder.discarded if self._decoder else 0

    @property
    def dataset(self):
        """The samples as an :class:`xarray.Dataset` (dim ``time``); built on first read.

        Raises
        ------
        RuntimeError
            Sampling has not been stopped yet.
        """
        if self._state != "stopped":
            raise RuntimeError(
                "No samples yet: read .dataset after the `with gpuscope.sample(...)` block (or after .stop())."
            )
        if self._dataset is None:
            self._dataset = self._build()
        return self._dataset

    def report(self, **options):
        """The readable summary of :attr:`dataset`: per user range (``by="phase"``: per phase); see
        :func:`gpuscope.report`."""
        from ._report import report

        return report(self.dataset, **options)

    def _build(self):
        from . import _results

        values, stamps = self._values, self._stamps
        backend = self._decoder._backend
        series = Series(
            values=values.T,
            start_ns=stamps[:, 0].copy(),
            end_ns=stamps[:, 1].copy(),
            properties=metric_properties(self.chip, self.metrics, self.availability),
        )
        spans = self._recorder.spans(self.stop_ns)
        mid = (series.start_ns + series.end_ns) // 2
        return _results.sampling_dataset(
            values=series.values,
            metrics=self.metrics,
            properties=series.properties,
            start_ns=series.start_ns,
            end_ns=series.end_ns,
            ranges=innermost_ranges(mid, spans),
            spans=spans,
            session_start_ns=self.start_ns,
            device_info=self.device_info,
            chip=self.chip,
            attrs={
                "interval_ns": int(self.interval_ns),
                "trigger": self.trigger.value,
                "hardware_interval": int(self._hw_interval),
                "hardware_buffer_size": self.hardware_buffer_size,
                "session_end_ns": int(self.stop_ns),
                "lost_samples": int(self.lost_samples),
                "overflows": int(self.overflows),
                "decode_errors": "; ".join(self._decoder.errors[:10]),
                "counter_data_images": int(self._decoder.handed_off),
                "counter_data_pool": int(self.image_pool),
                "samples_per_image": int(self._decoder.samples_per_image),
                "discarded_samples": int(self.discarded_samples),
                "full_decodes": int(self._decoder.full_stops),
                "evaluate_in": self.evaluate_in,
                "evaluators": int(self.evaluators),
                "evaluation_workers_ready": int(backend.ready_workers) if backend else 0,
                "evaluation_workers_lost": int(backend.workers_lost) if backend else 0,
                "images_recovered": int(backend.images_recovered) if backend else 0,
                "images_lost": int(backend.images_lost) if backend else 0,
                "pool_note": self._decoder.pool_note,
                "inexact_batches": int(self._decoder.inexact_batches),
                "decode_us_per_sample": float(round(self.decode_us_per_sample, 3)),
                "decode_seconds": float(round(self._decoder.decode_seconds, 6)),
                "stop_call_ns": int(self.stop_call_ns),
            },
        )


@dataclasses.dataclass
class Series:
    """Evaluated samples: values (n_metrics x n_samples), timestamps and metric properties."""

    values: np.ndarray
    start_ns: np.ndarray
    end_ns: np.ndarray
    properties: dict


def metric_properties(chip: str, metrics: Sequence[str], counter_availability=None) -> dict:
    """Per metric: the Dataset attrs ``units``, ``description``, ``metric_type``, ``hw_unit`` (host API, offline)."""
    from . import _catalog
    from .cupti import host
    from .cupti._types import ProfilerType

    properties = {}
    with host.ProfilerHost(chip, ProfilerType.PM_SAMPLING, counter_availability) as h:
        for name in metrics:
            p = h.metric_properties(name)
            _, suffix = _catalog.split_name(name)
            properties[name] = {
                "units": _catalog.units_of(suffix, p.units),
                "description": p.description,
                "metric_type": p.metric_type.name,
                "hw_unit": p.hw_unit,
            }
    return properties


def evaluate_images(
    chip: str, metrics: Sequence[str], images: Sequence[np.ndarray], timestamps: Sequence[np.ndarray], counter_availability=None
) -> Series:
    """Evaluate decoded PM sampling counter-data images with the host API (works offline).

    *timestamps* holds, per image, an (n, 2) array of each completed sample's start and end (CUPTI ns), as read
    with ``cuptiPmSamplingCounterDataGetSampleInfo`` before the sampling object was disabled.
    """
    from .cupti import host
    from .cupti._types import ProfilerType

    metrics = list(metrics)
    counts = [len(ts) for ts in timestamps]
    values = np.empty((sum(counts), len(metrics)), dtype=np.float64)
    stamps = np.concatenate([np.asarray(ts, dtype=np.int64).reshape(-1, 2) for ts in timestamps] or [np.empty((0, 2), np.int64)])
    with host.ProfilerHost(chip, ProfilerType.PM_SAMPLING, counter_availability) as h:
        evaluator = h.evaluator(metrics)
        k = 0
        for image, n in zip(images, counts):
            evaluator.evaluate_into(image, 0, n, values[k : k + n])
            k += n
    return Series(
        values=values.T,
        start_ns=stamps[:, 0].copy(),
        end_ns=stamps[:, 1].copy(),
        properties=metric_properties(chip, metrics, counter_availability),
    )


def sample(metrics="pm-default", interval="100us", device: int = 0, **options) -> Sampler:
    """Sample hardware metrics over time on a GPU (CUPTI PM sampling): no replay, low overhead.

    Parameters
    ----------
    metrics : str or list of str
        A sampling metric-set name (``"pm-default"``, ``"pm-fast"``) or full metric names. They must fit in one
        pass.
    interval : str, timedelta or int
        Time between samples: ``"20us"``, ``"100 us"``, ``"1ms"`` or ns. On Turing and GA100, which sample
        on sys-clock cycles, a time is converted (estimate) and ``"<n>cycles"`` is taken as is.

        Decoding each sample costs CPU time that grows with the metrics' counter instances (per-SM counters
        are the dearest), and CUPTI decodes on one thread: on the H100, ``pm-default`` costs about 40 µs per
        sample and samples every 100 µs without loss; ``pm-fast`` costs about 7-13 µs and samples every 20 µs
        without loss. A shorter interval loses samples, counted in ``attrs["lost_samples"]`` with a warning
        that gives the decode cost measured in the run and the interval to use.
    device : int
        CUDA device index.
    hardware_buffer_size : int, optional
        Bytes of device memory CUPTI uses as the hardware sample buffer (default 512 MiB).
    decode_period : float, optional
        Seconds between decodes by the background thread (default 0.01).
    samples_per_image : int, optional
        Capacity of each counter-data image (default: 100 ms of samples, 256 to 8,192). An image is handed to the
        evaluators before a decode could fill it: a decode that fills its image loses the samples beyond it.
    image_pool : int, optional
        Counter-data images made up front and recycled (default: two seconds of samples, at least 8, within
        1 GiB). If evaluation falls behind and none is free,
        samples are discarded and counted (``attrs["discarded_samples"]``, part of ``lost_samples``).
    evaluators : int, optional
        Worker processes (or threads, with ``evaluate_in="thread"``) that evaluate samples while sampling runs
        (default 2).
    evaluate_in : {"process", "thread"}, optional
        Where samples are evaluated (default ``"process"``): worker processes with their own host object, which
        never compete with your Python threads for the GIL (timestamps rebuilt from each sample's duration and
        anchors read on the device; ``attrs["inexact_batches"]`` counts batches read exactly instead), or threads
        of this process (timestamps from ``GetSampleInfo``), which fall behind a Python loop that launches kernels
        at 20 µs intervals. Images then live in files in ``/dev/shm``, unlinked once the workers have mapped them.

    Returns
    -------
    Sampler
        A context manager; ``.dataset`` after the block holds the samples (dim ``time``).

    Raises
    ------
    ValueError
        Bad interval or device (raised here); interval below what the chip can do (raised on start).
    SamplerBusyError, NotSinglePassError, UnknownMetricError, CuptiPermissionError, ProfilerBusyError
        On start: see :meth:`Sampler.start`.

    Examples
    --------
    >>> with gpuscope.sample(metrics="pm-default", interval="100us") as s:
    ...     with gpuscope.range("solve"):
    ...         run_simulation()
    >>> ts = s.dataset             # dims: time; coords start_ns, end_ns, range
    """
    return Sampler(metrics, interval, device, **options)
