"""Evaluating PM samples in worker processes, away from the user's GIL: the parent's side (what each worker runs is
:mod:`gpuscope._pm_sampling.worker_process`).

Evaluating a sample is one call of ``cuptiProfilerHostEvaluateToGpuValues``. Made from threads of the user's
process, each call gives the GIL up and takes it back; next to a Python loop that launches kernels, that made
evaluation three times slower on the H100 (27-32 µs a pm-default sample instead of 10.7) and it fell behind at
20 µs intervals. The host API needs no GPU, so :class:`ProcessEvaluation` runs it in spawned worker processes, each
with its own host object. Counter-data images live in shared memory mapped by both sides (:mod:`gpuscope._pm_sampling.shm`:
anonymous ``memfd`` files whose descriptors are passed to the workers over the socket, so no file outlives the
process, whatever kills it); the decode thread writes them, a worker evaluates them, the parent re-initialises them
and puts them back in the pool.

Faults (docs/reliability.md): workers ignore SIGINT and run in their own session, so Ctrl-C reaches only the user's
process; a worker whose parent is gone exits quietly. The socket's abstract name is visible to every user and has
no permissions: the parent reads the peer's credentials (``SO_PEERCRED``) of each connection before anything else
and refuses any process that is not one of its workers, of its own user; every read and write of the handshake, and
every send of a task, has a deadline (:attr:`ProcessEvaluation.IO_TIMEOUT_S`). A worker that dies or stops
answering is noticed during the run (end of file on its connection, or no answer for
:attr:`ProcessEvaluation.TASK_TIMEOUT_S` while it holds a task, after which it is killed); the images it held are
evaluated in this process instead and counted (``workers_lost``, ``images_recovered``). Every wait has a deadline;
an image that still could not be evaluated is counted in ``images_lost`` (its samples show as lost samples).

Between sessions: a session that ends cleanly (:meth:`ProcessEvaluation.finish` says the workers can serve another)
hands the workers, their connections and the shared images to the kept PM sampling object
(:class:`gpuscope._pm_sampling.sampler.SamplingObject`, kept by :mod:`gpuscope._gpu.keep`); the next session
configured the same way attaches its pipeline to them (:meth:`~ProcessEvaluation.attach`) instead of spawning new
ones. A worker that died meanwhile makes them unusable (:meth:`~ProcessEvaluation.reusable`), and that session starts
afresh. The images' memory is not this object's to free: :meth:`~ProcessEvaluation.close` lets go of its own
references, and the mapping goes only once the sampling object, which holds every image CUPTI was given, lets go of
it after ``cuptiPmSamplingDisable``.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Sequence

import numpy as np

from gpuscope._util.peers import peer

from gpuscope._pm_sampling.worker_process import (  # noqa: F401  (_child: BOOT runs it; PARENT_GONE: tests)
    DURATION, FDS_PER_MESSAGE, PARENT_GONE, Batch, _child, stamps_from_durations)

__all__ = ["DURATION", "Batch", "ProcessEvaluation", "stamps_from_durations"]

#: What a worker runs (``python -I -c``): the parent's ``sys.path`` without the current folder, passed as JSON, so
#: the worker imports the parent's gpuscope and never a ``gpuscope`` folder that happens to be in the cwd.
BOOT = "import sys, json; sys.path[:] = json.loads(sys.argv[2]); from gpuscope._pm_sampling.workers import _child; _child()"

class _Worker:
    """The parent's view of one worker: its process, connection (once connected) and the tasks it holds."""

    def __init__(self, proc):
        self.proc = proc
        self.conn = None
        self.alive = False  # connected and not lost: tasks may be sent
        self.killed = False  # killed by the parent (hung, or a send to it failed); its reader recovers its tasks
        self.pending: dict[int, tuple[tuple, float]] = {}  # seq -> (task, monotonic time sent), in the order sent
        self.answered = 0.0  # monotonic time of its last answer (or of its connection)
        self.lock = threading.Lock()  # guards alive, killed and pending against the reader's end-of-file handling
        self.reader: threading.Thread | None = None
        self.clean_exit = False


def _io_timeouts(fd: int, receive_s: float, send_s: float) -> None:
    """Bound each blocking read and write on a connected socket (0: no bound). The connections' own reads and
    writes (``os.read``/``os.write`` on the descriptor) then fail with ``BlockingIOError`` instead of waiting on."""
    sock = socket.socket(fileno=fd)
    try:
        for option, seconds in ((socket.SO_RCVTIMEO, receive_s), (socket.SO_SNDTIMEO, send_s)):
            whole = int(seconds)
            sock.setsockopt(socket.SOL_SOCKET, option, struct.pack("ll", whole, int((seconds - whole) * 1e6)))
    finally:
        sock.detach()


class ProcessEvaluation:
    """Worker processes that evaluate the pipeline's images; the parent side.

    Workers are plain ``python -I -c`` processes (not ``multiprocessing`` children, which would import the user's
    main script again), each in its own session, that connect back over an abstract Unix socket
    (:mod:`multiprocessing.connection`, with a random key). Abstract sockets have no permissions, so the parent
    checks who connects before anything else: a process of another user, or one that is not a worker it spawned, is
    refused at once, and every step of the handshake has a deadline. Starting them does not block: images are
    queued until a worker is connected, and if none starts (or all die) the images are evaluated in this process
    instead, with ``GetSampleInfo`` timestamps.

    Parameters
    ----------
    pipeline
        The ``_Pipeline``: its ``read_timestamps`` and ``recycle``, results and errors are used.
    image_bytes, pool_size
        The pool: up to *pool_size* images of *image_bytes* in reserved shared memory (``self.images``; fewer if
        the memory is not there, see :attr:`pool_note`). :meth:`close` lets go of them.
    workers
        Worker processes (each loads CUPTI's host API).

    Its life: ``start``, ``wait_ready``, ``submit`` while a session samples, then either :meth:`close`, or
    :meth:`finish` (the workers stay) and later :meth:`attach` for the next session's pipeline, as often as
    :meth:`reusable` says, and :meth:`close` at the end.
    """

    #: Seconds to wait for the workers to connect.
    CONNECT_TIMEOUT_S = 60.0
    #: Seconds one read or write may block: each step of a worker's handshake (it is then refused and killed), and
    #: each send of a task (a worker that reads nothing for that long is taken for hung and killed).
    IO_TIMEOUT_S = 5.0
    #: Seconds a worker may take for one image before it is taken for hung and killed (an image of 8,192 samples
    #: takes well under a second). Checked throughout the run, not only at :meth:`close`.
    TASK_TIMEOUT_S = 30.0
    #: Seconds :meth:`close` waits for the last images in all.
    CLOSE_TIMEOUT_S = 120.0
    #: Seconds a worker may take to exit once told to.
    EXIT_TIMEOUT_S = 5.0
    #: Seconds between two checks of the workers' liveness (and of the connect deadline while they connect).
    POLL_S = 0.5

    def __init__(self, pipeline, chip: str, metrics: Sequence[str], availability, *, image_bytes: int,
                 pool_size: int, workers: int):
        from gpuscope._pm_sampling import shm as _shm

        self._pipe = pipeline
        self._chip, self._metrics, self._availability = chip, list(metrics), availability
        self._shared, self.pool_note = _shm.reserve_images(pool_size, image_bytes)
        try:
            self.images: list[np.ndarray] = [s.array for s in self._shared]
            self._key = os.urandom(16)
            self._address = "gpuscope-pm-" + os.urandom(8).hex()  # abstract (leading NUL): no file to leave behind
            self._listener = self._listen(self._address)
        except BaseException:
            _shm.close_images(self._shared)
            raise
        self._uid = os.getuid()  # the only user whose processes may connect
        self._owner = os.getpid()  # a forked child never touches its parent's workers
        self._index = {id(image): i for i, image in enumerate(self.images)}
        self._workers_wanted = workers
        self._workers: list[_Worker] = []
        self._tasks: queue.Queue = queue.Queue()  # from the decode thread; None ends the dispatcher
        self._pending = 0  # tasks submitted and not yet returned
        self._done = threading.Condition()
        self._local = None  # an in-process evaluator, made if no worker is available
        self._local_lock = threading.Lock()
        self._dispatcher = threading.Thread(target=self._dispatch, name="gpuscope-pm-dispatch", daemon=True)
        self._closing = threading.Event()
        self._connected = threading.Event()
        self._closed = False
        self.ready_workers = 0
        self.workers_lost = 0  # workers that died or hung after connecting
        self.images_recovered = 0  # images a lost worker held, evaluated in this process instead
        self.images_lost = 0  # images never evaluated (their samples count as lost)

    def _listen(self, address: str) -> socket.socket:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind("\0" + address)
            listener.listen()
            listener.settimeout(self.POLL_S)  # accept() returns at times, to check the workers and the deadline
        except BaseException:
            listener.close()
            raise
        return listener

    def wait_ready(self, timeout: float | None = None) -> int:
        """Wait until every worker has connected (or failed to); returns how many are ready."""
        self._connected.wait(self.CONNECT_TIMEOUT_S if timeout is None else timeout)
        return self.ready_workers

    def start(self) -> None:
        """Spawn the workers and the dispatcher. A worker that cannot be spawned is reported in the pipeline's
        errors; with none, images are evaluated in this process."""
        env = dict(os.environ, GPUSCOPE_PM_WORKER_KEY=self._key.hex())
        from gpuscope.cupti import _python

        path = json.dumps(_python.sys_path())
        for _ in range(self._workers_wanted):
            try:  # never the frozen or embedding application itself: _python.interpreter refuses those
                proc = subprocess.Popen([_python.interpreter(), "-I", "-c", BOOT, self._address, path], env=env,
                                        stdin=subprocess.DEVNULL, start_new_session=True)
            except OSError as exc:
                self._error(f"an evaluation worker could not be spawned ({exc}); evaluating in-process")
                continue
            self._workers.append(_Worker(proc))
        self._dispatcher.start()

    def _error(self, text: str) -> None:
        """Say *text* in the errors of the session this serves; between sessions nobody is told (a worker lost then
        makes the workers unusable for the next session, :meth:`reusable`)."""
        pipe = self._pipe
        if pipe is not None:
            pipe.errors.append(text)

    def submit(self, seq: int, image: np.ndarray, n: int, batches: list) -> None:
        with self._done:
            self._pending += 1
        self._tasks.put((seq, self._index[id(image)], n, batches))

    # -- parent side ---------------------------------------------------------------------------------------
    def _connect(self) -> None:
        """Accept the workers (in this thread), hand them the set-up and start a reader per worker."""
        deadline = time.monotonic() + self.CONNECT_TIMEOUT_S
        waiting = {w.proc.pid: w for w in self._workers}
        refused: list[tuple[int, int]] = []  # (pid, uid) of each connection that was not a worker's
        while waiting and not self._closing.is_set() and time.monotonic() < deadline:
            for pid in [pid for pid, w in waiting.items() if w.proc.poll() is not None]:
                self._error(f"evaluation worker {pid} did not start: it exited (status "
                                         f"{waiting.pop(pid).proc.returncode}) before it connected")
            try:
                sock, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError as exc:  # out of descriptors, say: try again in a moment
                self._error(f"accepting an evaluation worker failed: {exc}")
                self._closing.wait(self.POLL_S)
                continue
            worker = self._admit(sock, waiting, refused)
            if worker is not None:
                self._hand_over(worker, deadline)
        if refused:
            first = ", ".join(f"pid {pid} of user {uid}" for pid, uid in refused[:3])
            self._error(f"refused {len(refused)} connection(s) to the evaluation workers' socket "
                                     f"({first}): only the workers this process spawned, as user {self._uid}, may "
                                     "connect")
        if waiting:
            self._error(f"{len(waiting)} evaluation worker(s) did not start in time; evaluating "
                                     "in-process")
            for worker in waiting.values():
                worker.proc.kill()
        self.ready_workers = sum(w.alive for w in self._workers)
        self._connected.set()
        self._listener.close()  # later connections are refused by the kernel
        for image in self._shared:  # mapped by every worker that will ever map them
            image.close_fd()

    def _admit(self, sock, waiting: dict, refused: list):
        """Check who connected, before reading anything from them: a process of this user that is one of the
        workers still waited for (taken out of *waiting*); any other is refused (added to *refused*). Then the
        handshake, each step within :attr:`IO_TIMEOUT_S`. Returns the worker with its connection, or None (the
        connection is closed; a worker that failed the handshake is killed, the reason is in the pipeline's
        errors)."""
        from multiprocessing.connection import Connection, answer_challenge, deliver_challenge

        with sock:
            try:
                pid, uid = peer(sock)
            except OSError:  # who it is cannot be known: not a worker
                pid, uid = -1, -1
            worker = waiting.pop(pid, None) if uid == self._uid else None
            if worker is None:
                refused.append((pid, uid))
                return None
            sock.setblocking(True)
            conn = Connection(sock.detach())
        try:
            _io_timeouts(conn.fileno(), self.IO_TIMEOUT_S, self.IO_TIMEOUT_S)
            deliver_challenge(conn, self._key)
            answer_challenge(conn, self._key)
        except Exception as exc:  # EOFError, OSError (BlockingIOError: the deadline), AuthenticationError
            conn.close()
            why = (f"sent nothing for {self.IO_TIMEOUT_S:g} s" if isinstance(exc, BlockingIOError)
                   else f"{type(exc).__name__}: {exc}")
            self._error(f"evaluation worker {pid} failed the handshake ({why}): killed")
            worker.proc.kill()
            return None
        worker.conn = conn
        return worker

    def _hand_over(self, worker: _Worker, deadline: float) -> None:
        """Send a connected worker its set-up and images; start its reader once it is ready. One that fails is
        killed, the reason is in the pipeline's errors."""
        from multiprocessing.reduction import sendfds

        conn = worker.conn
        try:
            conn.send((self._chip, self._metrics,
                       None if self._availability is None else bytes(np.asarray(self._availability, np.uint8)),
                       [s.size for s in self._shared]))
            fds = [s.fd for s in self._shared]
            with socket.socket(fileno=os.dup(conn.fileno())) as sock:
                for k in range(0, len(fds), FDS_PER_MESSAGE):
                    sendfds(sock, fds[k : k + FDS_PER_MESSAGE])
            reply = conn.recv() if conn.poll(max(0.0, deadline - time.monotonic())) else ("failed", "no answer")
            _io_timeouts(conn.fileno(), 0, self.IO_TIMEOUT_S)  # an idle worker may be silent for any time
        except Exception as exc:  # OSError, EOFError, a reply that cannot be unpickled
            reply = ("failed", f"{type(exc).__name__}: {exc}")
        if reply != ("ready", worker.proc.pid):
            self._error(f"evaluation worker {worker.proc.pid} failed to start: {reply[1]}")
            worker.conn = None
            conn.close()
            worker.proc.kill()
            return
        worker.alive, worker.answered = True, time.monotonic()
        worker.reader = threading.Thread(target=self._read, args=(worker,), name="gpuscope-pm-results", daemon=True)
        worker.reader.start()

    def _dispatch(self, connect: bool = True) -> None:
        if connect:
            self._connect()
        while True:
            self._kill_hung()
            try:
                task = self._tasks.get(timeout=min(self.POLL_S, self.TASK_TIMEOUT_S))
            except queue.Empty:
                continue
            if task is None:
                return
            if not self._send(task):
                self._evaluate_here(task)

    def _send(self, task) -> bool:
        """Send *task* to the live worker with the fewest tasks; False if no worker took it. A worker a task
        cannot be sent to (within :attr:`IO_TIMEOUT_S`) is killed: part of the task may have gone out."""
        for worker in sorted(self._workers, key=lambda w: len(w.pending)):
            with worker.lock:  # the reader marks a worker lost under this lock: no task is left behind
                if not worker.alive or worker.killed:
                    continue
                worker.pending[task[0]] = (task, time.monotonic())
                try:
                    worker.conn.send(task)
                    return True
                except (OSError, ValueError) as exc:
                    del worker.pending[task[0]]
                    why = (f"read no task for {self.IO_TIMEOUT_S:g} s" if isinstance(exc, BlockingIOError)
                           else f"could not be sent a task ({type(exc).__name__}: {exc})")
            self._kill(worker, why)
        return False

    def _read(self, worker: _Worker) -> None:
        while True:
            try:
                message = worker.conn.recv()
            except Exception:  # EOFError, OSError, or a message cut short: the worker is gone or of no more use
                break
            worker.answered = time.monotonic()
            if message[0] == "exit":
                worker.clean_exit = True
                break
            with worker.lock:
                worker.pending.pop(message[1], None)
            self._finish_task(message)
        with worker.lock:
            worker.alive = False
            orphans = [task for task, _ in worker.pending.values()]
            worker.pending.clear()
        if orphans or not worker.clean_exit:
            with self._done:
                self.workers_lost += 1
            worker.proc.kill()  # a worker that closed its end while alive is of no use either
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.proc.wait(self.EXIT_TIMEOUT_S)
            self._error(
                f"evaluation worker {worker.proc.pid} was lost (exit status {worker.proc.poll()}); "
                f"{len(orphans)} image(s) it held were evaluated in this process"
            )
        for task in orphans:
            with self._done:
                self.images_recovered += 1
            self._evaluate_here(task)

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
            with self._local_lock:
                if self._local is None:
                    from gpuscope.cupti import _images, host
                    from gpuscope.cupti._types import ProfilerType

                    for image in self.images:
                        _images.trust(image, _images.Kind.PM_SAMPLING)
                    h = host.ProfilerHost(self._chip, ProfilerType.PM_SAMPLING, self._availability)
                    self._local = (h, h.evaluator(self._metrics))
                values = np.empty((n, len(self._metrics)), dtype=np.float64)
                stamps = np.empty((n, 2), dtype=np.int64)
                self._local[1].evaluate_into(self.images[index], 0, n, values)
            self._finish_task(("done", seq, index, values, stamps, [(0, n - 1)] if n else []))
        except Exception as exc:
            self._finish_task(("error", seq, index, f"{type(exc).__name__}: {exc}"))

    def _kill(self, worker: _Worker, why: str) -> None:
        """Kill a live worker (once); its reader then sees the end of its connection and recovers its images."""
        with worker.lock:
            if not worker.alive or worker.killed:
                return
            worker.killed = True
        self._error(f"evaluation worker {worker.proc.pid} {why}: killed")
        worker.proc.kill()

    def _kill_hung(self) -> None:
        """Kill workers that hold tasks and have not answered for :attr:`TASK_TIMEOUT_S` (a worker evaluates its
        tasks in order: the first it holds started when it last answered, or when it was sent)."""
        now = time.monotonic()
        for worker in self._workers:
            with worker.lock:
                first = next(iter(worker.pending.values()), None)
                hung = first is not None and now - max(worker.answered, first[1]) > self.TASK_TIMEOUT_S
            if hung:
                self._kill(worker, f"did not answer for {self.TASK_TIMEOUT_S:g} s")

    def _drain(self) -> None:
        """Wait for every submitted image to come back (within :attr:`CLOSE_TIMEOUT_S`; images of hung workers are
        evaluated here) and end the dispatcher."""
        self._tasks.put(None)
        if self._dispatcher.is_alive():
            self._dispatcher.join(self.CONNECT_TIMEOUT_S + self.CLOSE_TIMEOUT_S)
        deadline = time.monotonic() + self.CLOSE_TIMEOUT_S
        with self._done:
            while self._pending and time.monotonic() < deadline:
                self._done.wait(self.POLL_S)
                self._kill_hung()
            if self._pending:
                self.images_lost += self._pending
                self._error(f"{self._pending} image(s) were not evaluated within {self.CLOSE_TIMEOUT_S:g} s: their "
                            "samples are lost")

    def finish(self) -> bool:
        """End of a session: wait for every submitted image to come back and end the dispatcher, leaving the workers
        connected and idle. Returns :meth:`reusable`; when True, the session's pipeline is let go of (it is told
        nothing more) and the workers wait for :meth:`attach` or :meth:`close`. When False, call :meth:`close`."""
        if self._closed or os.getpid() != self._owner:
            return False
        if not self._connected.is_set():  # still connecting at the end of the session: not worth keeping
            return False
        self._drain()
        if not self.reusable():
            return False
        self._pipe = None
        return True

    def reusable(self) -> bool:
        """Whether the workers can serve another session: not closed, in the process that spawned them, every
        worker asked for connected and alive (its connection not at its end, its process not exited), no task
        outstanding, no dispatcher running and no evaluation moved into this process."""
        if self._closed or os.getpid() != self._owner or not self._connected.is_set() or self._dispatcher.is_alive():
            return False
        if self._pending or self._local is not None or len(self._workers) != self._workers_wanted:
            return False
        for worker in self._workers:
            with worker.lock:
                fit = worker.alive and not worker.killed and not worker.pending
            if not fit or worker.proc.poll() is not None:
                return False
        return True

    def attach(self, pipeline) -> None:
        """Serve *pipeline*, the next session's, with these workers and images (after :meth:`finish` returned True;
        the pipeline's pool is :attr:`images`, initialised). Its counts start from 0; a worker that died since
        :meth:`reusable` was asked is counted lost in it, and its share is evaluated by the others or here."""
        if self._closed or self._dispatcher.is_alive() or not self._connected.is_set():
            raise RuntimeError("these evaluation workers are closed or serving a session")
        self._pipe = pipeline
        self.images_recovered = self.images_lost = 0
        lost = [w for w in self._workers if not w.alive]  # one dying now is counted by its reader
        self.workers_lost, self.ready_workers = len(lost), len(self._workers) - len(lost)
        for worker in lost:
            self._error(f"evaluation worker {worker.proc.pid} was lost between sessions (exit status "
                        f"{worker.proc.poll()})")
        self._tasks = queue.Queue()
        self._dispatcher = threading.Thread(target=self._dispatch, args=(False,), name="gpuscope-pm-dispatch",
                                            daemon=True)
        self._dispatcher.start()

    def close(self) -> None:
        """Wait for every submitted image to come back (within :attr:`CLOSE_TIMEOUT_S`; images of hung workers are
        evaluated here), stop the workers and let go of the images (safe to call twice). Their mapping goes once no
        array of them is left in this process: the PM sampling object holds them until it is disabled. In a forked
        child, whose parent owns the workers, only the child's copies of their connections are closed."""
        if self._closed:
            return
        if os.getpid() != self._owner:
            self._forget()
            return
        self._closed = True
        self._closing.set()
        self._drain()
        self._stop_workers()
        if self._local is not None:
            self._local[0].close()
            self._local = None
        self._listener.close()
        from gpuscope._pm_sampling import shm as _shm

        _shm.close_images(self._shared)
        self.images, self._index = [], {}  # unmapped once the pipeline and the sampling object let go of them too

    def _forget(self) -> None:
        """In a forked child: close the child's copies of the workers' connections (sending nothing), so that the
        workers still see the end of their connection when the parent ends, whatever the child does."""
        for worker in self._workers:
            if worker.conn is not None:
                with contextlib.suppress(OSError):
                    worker.conn.close()

    def _stop_workers(self) -> None:
        """Tell every worker to exit; kill those that do not within :attr:`EXIT_TIMEOUT_S`; reap them all."""
        for worker in self._workers:
            with worker.lock:
                conn = worker.conn if worker.alive else None
            if conn is not None:
                with contextlib.suppress(OSError, ValueError):
                    conn.send(None)
        for worker in self._workers:
            try:
                worker.proc.wait(timeout=self.EXIT_TIMEOUT_S)
            except Exception:
                worker.proc.kill()
                with contextlib.suppress(Exception):
                    worker.proc.wait(timeout=self.EXIT_TIMEOUT_S)
            if worker.reader is not None:
                worker.reader.join(self.EXIT_TIMEOUT_S)
            if worker.conn is not None:
                with contextlib.suppress(OSError):
                    worker.conn.close()
