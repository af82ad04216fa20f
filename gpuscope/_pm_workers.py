"""Evaluating PM samples in worker processes, away from the user's GIL.

Evaluating a sample is one call of ``cuptiProfilerHostEvaluateToGpuValues``. Made from threads of the user's
process, each call gives the GIL up and takes it back; next to a Python loop that launches kernels, that made
evaluation three times slower on the H100 (27-32 µs a pm-default sample instead of 10.7) and it fell behind at
20 µs intervals. The host API needs no GPU, so :class:`ProcessEvaluation` runs it in spawned worker processes, each
with its own host object. Counter-data images live in files in ``/dev/shm`` mapped by both sides (unlinked once
every worker has mapped them); the decode thread writes them, a worker evaluates them, the parent re-initialises
them and puts them back in the pool.

Timestamps: ``cuptiPmSamplingCounterDataGetSampleInfo`` needs the sampling object, which only the parent has. The
worker evaluates ``gpu__time_duration.sum`` with the metrics instead (each sample's end minus start, 1-2 ns
short on the H100) and rebuilds the timestamps of each decode's batch of samples from the batch's anchors, read
with ``GetSampleInfo`` by the decode thread: the first sample's start and end and the last sample's end.
:func:`stamps_from_durations` spreads the batch's residual (the 1-2 ns per sample) over it, so anchors are exact
and every other timestamp is within a few ns. A batch that does not add up (an overflow inside it, or a residual
beyond a few ns per sample) is marked, and the parent reads its timestamps with ``GetSampleInfo``.
"""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import tempfile
import threading
from collections.abc import Sequence

import numpy as np

__all__ = ["DURATION", "Batch", "ProcessEvaluation", "stamps_from_durations"]

#: The metric whose value per sample is the sample's duration (end - start, ns).
DURATION = "gpu__time_duration.sum"

#: One decode's samples in an image: (first, last, start of first, end of first, end of last, overflow).
Batch = tuple[int, int, int, int, int, bool]

#: Largest residual per sample (ns) accepted when rebuilding a batch's timestamps from durations.
RESIDUAL_PER_SAMPLE_NS = 8


def stamps_from_durations(durations: np.ndarray, batches: Sequence[Batch], n: int) -> tuple[np.ndarray, list]:
    """Rebuild (start, end) of samples ``0 .. n-1`` from their durations and each batch's anchors.

    Returns ``(stamps, inexact)``: an (n, 2) int64 array and the batches (as ``(first, last)``) whose timestamps
    could not be rebuilt (an overflow inside, a residual over :data:`RESIDUAL_PER_SAMPLE_NS` per sample, or
    samples no batch covers); their rows are left as they are and must be read with ``GetSampleInfo``.
    """
    stamps = np.zeros((n, 2), dtype=np.int64)
    d = np.rint(np.asarray(durations, dtype=np.float64)[:n]).astype(np.int64)
    inexact, covered = [], np.zeros(n, dtype=bool)
    for first, last, start_first, end_first, end_last, overflow in batches:
        last = min(last, n - 1)
        if last < first:
            continue
        covered[first : last + 1] = True
        count = last - first + 1
        ends = end_first + np.concatenate([[0], np.cumsum(d[first + 1 : last + 1])])
        residual = end_last - ends[-1]
        if overflow or abs(residual) > RESIDUAL_PER_SAMPLE_NS * count:
            inexact.append((first, last))
            continue
        if count > 1:  # spread the residual: exact at both anchors
            ends += np.rint(residual * np.arange(count) / (count - 1)).astype(np.int64)
        stamps[first : last + 1, 1] = ends
        stamps[first, 0] = start_first
        stamps[first + 1 : last + 1, 0] = ends[:-1]
    if not covered.all():
        missing = np.flatnonzero(~covered)
        inexact.append((int(missing[0]), int(missing[-1])))
    return stamps, inexact


def _worker_main(conn) -> None:
    """A worker process: receive the set-up, map the images, then evaluate tasks ``(seq, index, n, batches)``
    until ``None``."""
    try:
        from .cupti import host
        from .cupti._types import ProfilerType

        chip, metrics, availability, images = conn.recv()
        mapped = {i: np.memmap(path, dtype=np.uint8, mode="r", shape=(size,)) for i, path, size in images}
        avail = None if availability is None else np.frombuffer(availability, dtype=np.uint8).copy()
        h = host.ProfilerHost(chip, ProfilerType.PM_SAMPLING, avail)
        names = list(metrics) if DURATION in metrics else [*metrics, DURATION]
        column = names.index(DURATION)
        evaluator = h.evaluator(names)
    except BaseException as exc:  # reported to the parent, which evaluates in-process instead
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", os.getpid()))
    while (task := conn.recv()) is not None:
        seq, index, n, batches = task
        try:
            out = np.empty((n, len(names)), dtype=np.float64)
            evaluator.evaluate_into(mapped[index], 0, n, out)
            stamps, inexact = stamps_from_durations(out[:, column], batches, n)
            conn.send(("done", seq, index, np.ascontiguousarray(out[:, : len(metrics)]), stamps, inexact))
        except Exception as exc:
            conn.send(("error", seq, index, f"{type(exc).__name__}: {exc}"))
    h.close()
    conn.send(("exit", os.getpid()))


def _child() -> None:
    """Entry point of a worker process started by :class:`ProcessEvaluation`: argv holds the parent's address,
    the environment its authentication key."""
    import sys
    from multiprocessing.connection import Client

    conn = Client(sys.argv[1], family="AF_UNIX", authkey=bytes.fromhex(os.environ.pop("GPUSCOPE_PM_WORKER_KEY")))
    try:
        _worker_main(conn)
    finally:
        conn.close()


class ProcessEvaluation:
    """Worker processes that evaluate the pipeline's images; the parent side.

    Workers are plain ``python -c`` processes (not ``multiprocessing`` children, which would import the user's
    main script again) that connect back over a Unix socket (:mod:`multiprocessing.connection`, with a random
    key). Starting them does not block: images are queued until a worker is connected, and if none starts (or all
    die) the images are evaluated in this process instead, with ``GetSampleInfo`` timestamps.

    Parameters
    ----------
    pipeline
        The ``_Pipeline``: its ``read_timestamps`` and ``recycle``, results and errors are used.
    image_bytes, pool_size
        The pool: *pool_size* images of *image_bytes*, made here as shared files (``self.images``).
    workers
        Worker processes (each loads CUPTI's host API).
    """

    #: Seconds to wait for a worker to connect, and for the last images at the end.
    CONNECT_TIMEOUT_S = 60.0
    CLOSE_TIMEOUT_S = 120.0

    def __init__(self, pipeline, chip: str, metrics: Sequence[str], availability, *, image_bytes: int,
                 pool_size: int, workers: int):
        from multiprocessing.connection import Listener

        self._pipe = pipeline
        self._chip, self._metrics, self._availability = chip, list(metrics), availability
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        self._dir = tempfile.mkdtemp(prefix="gpuscope-pm-", dir=shm)
        self.images: list[np.ndarray] = []
        self._specs = []
        try:
            for i in range(pool_size):
                path = os.path.join(self._dir, f"image{i}")
                with open(path, "wb") as f:
                    f.truncate(image_bytes)
                self.images.append(np.memmap(path, dtype=np.uint8, mode="r+", shape=(image_bytes,)))
                self._specs.append((i, path, image_bytes))
            self._key = os.urandom(16)
            self._listener = Listener(os.path.join(self._dir, "socket"), family="AF_UNIX", authkey=self._key)
        except BaseException:
            shutil.rmtree(self._dir, ignore_errors=True)
            raise
        self._index = {id(image): i for i, image in enumerate(self.images)}
        self._workers = workers
        self._procs: list = []
        self._conns: list = []  # connected workers: [connection (None once lost), pending count, lock]
        self._tasks: queue.Queue = queue.Queue()  # from the decode thread; None ends the dispatcher
        self._pending = 0  # tasks submitted and not yet returned
        self._done = threading.Condition()
        self._local = None  # an in-process evaluator, made if no worker is available
        self._dispatcher = threading.Thread(target=self._dispatch, name="gpuscope-pm-dispatch", daemon=True)
        self.ready_workers = 0
        self._connected = threading.Event()

    def wait_ready(self, timeout: float | None = None) -> int:
        """Wait until every worker has connected (or failed to); returns how many are ready."""
        self._connected.wait(self.CONNECT_TIMEOUT_S if timeout is None else timeout)
        return self.ready_workers

    def start(self) -> None:
        import subprocess
        import sys

        package_parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env = dict(os.environ, GPUSCOPE_PM_WORKER_KEY=self._key.hex())
        if os.path.basename(package_parent) not in ("site-packages", "dist-packages"):
            # gpuscope run from a source tree: let the worker import the same copy (an installed one is found
            # anyway, and putting site-packages on PYTHONPATH would put it ahead of the standard library)
            env["PYTHONPATH"] = os.pathsep.join([package_parent, *filter(None, [env.get("PYTHONPATH")])])
        address = self._listener.address
        for _ in range(self._workers):
            self._procs.append(subprocess.Popen(
                [sys.executable, "-c", "from gpuscope._pm_workers import _child; _child()", address],
                env=env, stdin=subprocess.DEVNULL,
            ))
        self._dispatcher.start()

    def submit(self, seq: int, image: np.ndarray, n: int, batches: list) -> None:
        with self._done:
            self._pending += 1
        self._tasks.put((seq, self._index[id(image)], n, batches))

    # -- parent side ---------------------------------------------------------------------------------------
    def _connect(self) -> None:
        """Accept the workers (in this thread), hand them the set-up and start a reader per worker."""
        import socket
        import time

        self._listener._listener._socket.settimeout(0.5)
        deadline = time.monotonic() + self.CONNECT_TIMEOUT_S
        tried = 0
        while tried < len(self._procs):
            try:
                conn = self._listener.accept()
            except (socket.timeout, TimeoutError):
                dead = sum(proc.poll() is not None for proc in self._procs)
                if tried + dead >= len(self._procs) or time.monotonic() > deadline:
                    self._pipe.errors.append(
                        f"{len(self._procs) - tried} evaluation worker(s) did not start; evaluating in-process"
                    )
                    break
                continue
            except Exception as exc:  # OSError, EOFError, AuthenticationError: that worker is not used
                self._pipe.errors.append(f"an evaluation worker did not connect: {type(exc).__name__}: {exc}")
                tried += 1
                continue
            tried += 1
            try:
                conn.send((self._chip, self._metrics,
                           None if self._availability is None else bytes(np.asarray(self._availability, np.uint8)),
                           self._specs))
                reply = conn.recv()
            except (OSError, EOFError) as exc:
                self._pipe.errors.append(f"an evaluation worker failed to start: {exc}")
                continue
            if reply[0] != "ready":
                self._pipe.errors.append(f"an evaluation worker failed to start: {reply[1]}")
                continue
            slot = [conn, 0, threading.Lock()]
            self._conns.append(slot)
            threading.Thread(target=self._read, args=(slot,), name="gpuscope-pm-results", daemon=True).start()
        self.ready_workers = len(self._conns)
        self._connected.set()
        self._listener.close()
        shutil.rmtree(self._dir, ignore_errors=True)  # mapped everywhere: no file outlives the run

    def _dispatch(self) -> None:
        self._connect()
        while (task := self._tasks.get()) is not None:
            live = [slot for slot in self._conns if slot[0] is not None]
            if not live:
                self._evaluate_here(task)
                continue
            slot = min(live, key=lambda s: s[1])
            with slot[2]:
                slot[1] += 1
            try:
                slot[0].send(task)
            except (OSError, ValueError) as exc:
                self._pipe.errors.append(f"evaluation worker lost: {exc}")
                slot[0] = None
                self._evaluate_here(task)

    def _read(self, slot) -> None:
        conn = slot[0]
        while True:
            try:
                message = conn.recv()
            except (EOFError, OSError):
                break
            if message[0] == "exit":
                break
            with slot[2]:
                slot[1] -= 1
            self._finish_task(message)
        slot[0] = None

    def _finish_task(self, message) -> None:
        pipe = self._pipe
        image = self.images[message[2]]
        if message[0] == "error":
            pipe.errors.append(f"evaluate: {message[3]}")
        else:
            _, seq, _, values, stamps, inexact = message
            for first, last in inexact:  # read these with the sampling object
                pipe.read_timestamps(image, first, last - first + 1, stamps[first:])
            pipe.inexact_batches += len(inexact)
            pipe._results[seq] = (values, stamps)
        pipe.recycle(image)
        with self._done:
            self._pending -= 1
            self._done.notify_all()

    def _evaluate_here(self, task) -> None:
        """Evaluate a task in this process (no worker): timestamps with ``GetSampleInfo``."""
        seq, index, n, _ = task
        try:
            if self._local is None:
                from .cupti import host
                from .cupti._types import ProfilerType

                h = host.ProfilerHost(self._chip, ProfilerType.PM_SAMPLING, self._availability)
                self._local = (h, h.evaluator(self._metrics))
            values = np.empty((n, len(self._metrics)), dtype=np.float64)
            stamps = np.empty((n, 2), dtype=np.int64)
            self._local[1].evaluate_into(self.images[index], 0, n, values)
            self._finish_task(("done", seq, index, values, stamps, [(0, n - 1)] if n else []))
        except Exception as exc:
            self._finish_task(("error", seq, index, f"{type(exc).__name__}: {exc}"))

    def close(self) -> None:
        """Wait for every submitted image to come back, then stop the workers (safe to call twice)."""
        if self._tasks is None:
            return
        self._tasks.put(None)
        if self._dispatcher.is_alive():
            self._dispatcher.join()
        with self._done:
            self._done.wait_for(lambda: self._pending == 0, self.CLOSE_TIMEOUT_S)
        for slot in self._conns:
            conn = slot[0]
            if conn is not None:
                with contextlib.suppress(OSError, ValueError):
                    conn.send(None)
        for proc in self._procs:
            try:
                proc.wait(timeout=10.0)
            except Exception:
                proc.kill()
        if self._local is not None:
            self._local[0].close()
            self._local = None
        with contextlib.suppress(Exception):
            self._listener.close()
        shutil.rmtree(self._dir, ignore_errors=True)
        self._tasks = None
