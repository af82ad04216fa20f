"""What a PM evaluation worker process runs: the set-up and images it receives, each task's image evaluated, and
the task's timestamps rebuilt from the samples' durations (the parent side is :mod:`gpuscope._pm_sampling.workers`).

Timestamps: ``cuptiPmSamplingCounterDataGetSampleInfo`` needs the sampling object, which only the parent has. The
worker evaluates ``gpu__time_duration.sum`` with the metrics instead (each sample's end minus start, 1-2 ns
short on the H100) and rebuilds the timestamps of each decode's batch of samples from the batch's anchors, read
with ``GetSampleInfo`` by the decode thread: the first sample's start and end and the last sample's end.
:func:`stamps_from_durations` spreads the batch's residual (the 1-2 ns per sample) over it, so anchors are exact
and every other timestamp is within a few ns. A batch that does not add up (an overflow inside it, or a residual
beyond a few ns per sample) is marked, and the parent reads its timestamps with ``GetSampleInfo``.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence

import numpy as np

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
    """A worker process: receive the set-up and the images' descriptors, map them, then evaluate tasks
    ``(seq, index, n, batches)`` until ``None``."""
    import mmap
    import socket
    from multiprocessing.reduction import recvfds

    chip, metrics, availability, sizes = conn.recv()
    fds = []
    with socket.socket(fileno=os.dup(conn.fileno())) as sock:
        while len(fds) < len(sizes):
            fds.extend(recvfds(sock, min(FDS_PER_MESSAGE, len(sizes) - len(fds))))
    try:
        from gpuscope.cupti import _images, host
        from gpuscope.cupti._types import ProfilerType

        mapped = [np.frombuffer(mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ), dtype=np.uint8)
                  for fd, size in zip(fds, sizes)]
        for fd in fds:
            os.close(fd)
        avail = None if availability is None else np.frombuffer(availability, dtype=np.uint8).copy()
        if avail is not None:  # the parent's, which CUPTI gave it or it checked
            _images.trust(avail, _images.Kind.AVAILABILITY)
        h = host.ProfilerHost(chip, ProfilerType.PM_SAMPLING, avail)
        names = list(metrics) if DURATION in metrics else [*metrics, DURATION]
        column = names.index(DURATION)
        evaluator = h.evaluator(names)
        for image in mapped:  # made by the parent through CUPTI: their size is CUPTI's own
            _images.trust(image, _images.Kind.PM_SAMPLING)
    except Exception as exc:  # reported to the parent, which evaluates in-process instead
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", os.getpid()))
    while (task := conn.recv()) is not None:
        seq, index, n, batches = task
        try:
            out = np.empty((n, len(names)), dtype=np.float64)
            evaluator.evaluate_into(mapped[index], 0, n, out)
            stamps, inexact = stamps_from_durations(out[:, column], batches, n)
            answer = ("done", seq, index, np.ascontiguousarray(out[:, : len(metrics)]), stamps, inexact)
        except Exception as exc:
            answer = ("error", seq, index, f"{type(exc).__name__}: {exc}")
        conn.send(answer)
    h.close()
    conn.send(("exit", os.getpid()))


def _child() -> None:
    """Entry point of a worker process started by :class:`ProcessEvaluation`: argv[1] holds the parent's abstract
    socket name (without its leading NUL), the environment its authentication key. Ctrl-C is the parent's business:
    the worker ignores SIGINT (it runs in its own session as well, so a terminal's Ctrl-C does not reach it). A
    worker whose parent is gone, or refused it, exits quietly: nobody is left to tell, and the user's terminal is no
    place for its traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from multiprocessing.connection import Client

    key = bytes.fromhex(os.environ.pop("GPUSCOPE_PM_WORKER_KEY"))
    try:
        with Client("\0" + sys.argv[1], family="AF_UNIX", authkey=key) as conn:
            _worker_main(conn)
    except (EOFError, OSError):  # the connection ended: the parent exited, was killed or closed it
        sys.exit(PARENT_GONE)


#: A worker's exit status when its connection to the parent ended before it was told to exit.
PARENT_GONE = 3


#: Descriptors sent per SCM_RIGHTS message (Linux allows 253).
FDS_PER_MESSAGE = 200
