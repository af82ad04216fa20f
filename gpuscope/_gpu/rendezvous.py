"""The rendezvous of processes that need one GPU's counters: holders listen, a process that finds them busy asks.

The counters are the GPU's, not the process's: a range profiler or PM sampler that one process keeps enabled between
its sessions (:mod:`gpuscope._gpu.keep`) makes every other process's profiling of that GPU fail with
``CUPTI_ERROR_HARDWARE_BUSY``. So while a gpuscope process holds a GPU's counters (a session open, or something
kept) it listens, on a thread of its own (:class:`Listener`), on an abstract Unix socket whose name holds its user,
the GPU and itself: ``gpuscope-keep-<uid>-<PCI bus id>-<pid>-<random>``. A gpuscope process of the same user that
gets ``HARDWARE_BUSY`` finds those names in ``/proc/net/unix`` and asks each holder of that GPU to give the counters
back (:func:`ask`), waiting at most :data:`ASK_TIMEOUT_S` for all the answers:

``released (...)``
    it gave back what it kept (from its listener's thread, never in the middle of a session);
``busy: a session is open (...)``
    a session holds them; it gives them back when the session closes and nothing is kept;
``nothing kept``
    it holds nothing of this GPU's (it is about to stop listening).

Abstract sockets have no permissions and no file: the kernel drops the name with its last descriptor, however the
process ends, so nothing is left behind and nothing stale is found. Anyone may connect to such a socket, or bind a
name that looks like a holder's, so both ends read the other's credentials (``SO_PEERCRED``) before anything else:
a holder answers only processes of its own user, and a process never asks a socket of another user. Processes of
other users are never asked and never answer; neither are processes in another network namespace (a container with
a network of its own), whose abstract sockets this process cannot see.
"""

from __future__ import annotations

import dataclasses
import os
import select
import socket
import threading
import time
from collections.abc import Callable

from gpuscope._util.peers import peer

__all__ = ["Answer", "Listener", "ask", "holders", "gpu_id", "describe", "RELEASED", "BUSY", "NOTHING_KEPT",
           "NO_ANSWER", "ANOTHER_USER"]

#: The start of every holder's socket name (after the leading NUL of an abstract name).
PREFIX = "gpuscope-keep"
#: Seconds an asker waits for all the holders' answers together (a holder answers once its release is done: disabling
#: a range profiler with a 4,096-range image took 0.5 s on the H100).
ASK_TIMEOUT_S = 5.0
#: Seconds a holder waits for the request of a process that connected (a silent one is dropped).
REQUEST_TIMEOUT_S = 1.0
#: Seconds :meth:`Listener.close` waits for its thread (which may be giving back what the process kept).
JOIN_TIMEOUT_S = 10.0
#: Longest request or answer line, in bytes.
MAX_LINE = 256
#: ``__SO_ACCEPTCON`` in the Flags column of ``/proc/net/unix``: a listening socket.
_LISTENING = 0x10000

# What a holder said, as :attr:`Answer.state`.
RELEASED = "released"
BUSY = "busy"
NOTHING_KEPT = "nothing kept"
NO_ANSWER = "no answer"
ANOTHER_USER = "another user"  # a socket named like a holder's but bound by another user: not asked
FAILED = "failed"  # the holder tried to give them back and could not
_CLOSED = "closed the connection without an answer"


@dataclasses.dataclass(frozen=True)
class Answer:
    """One holder's answer: its process id (as the kernel gives it), :attr:`state` and the line it sent (or what
    happened instead)."""

    pid: int
    state: str
    text: str


def gpu_id(device: int) -> str:
    """The GPU's name in the rendezvous: its PCI bus id, the same in every process of the machine."""
    from gpuscope._gpu import device as _device

    return _device.bus_id(device).lower()


def _prefix(gpu: str) -> str:
    return f"{PREFIX}-{os.getuid()}-{gpu}-"


def _request(gpu: str) -> bytes:
    return f"release {gpu}\n".encode()


class Listener:
    """Answers the processes of this user that ask for *gpu*'s counters, on a thread of its own, until
    :meth:`close`.

    ``answer()`` runs on the listener's thread for each request and returns the line to send (it gives back what
    the process keeps, or says why not; see :func:`gpuscope._gpu.keep.answer`). Requests are served one at a time;
    a connection of another user is closed unanswered, one that sends no request within :data:`REQUEST_TIMEOUT_S`
    is dropped. The socket is closed by the thread when it ends.

    Raises
    ------
    OSError
        The socket could not be made (nothing is left open).
    """

    def __init__(self, gpu: str, answer: Callable[[], str]):
        self.gpu = gpu
        self.name = f"{_prefix(gpu)}{os.getpid()}-{os.urandom(4).hex()}"
        self._answer = answer
        self._uid = os.getuid()
        self._stop = threading.Event()
        self._close_lock = threading.Lock()
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._wake_read, self._wake = socket.socketpair()  # close() wakes the thread through it
        self._thread = threading.Thread(target=self._serve, name="gpuscope-rendezvous", daemon=True)
        try:
            self._sock.bind("\0" + self.name)
            self._sock.listen(8)
            self._sock.setblocking(False)
            self._thread.start()
        except BaseException:
            self.forget()
            raise

    def close(self) -> None:
        """Stop listening (safe twice; from the listener's own thread too, in its ``answer``): the thread ends once
        it has answered, and takes the socket with it. Waits for it at most :data:`JOIN_TIMEOUT_S`."""
        with self._close_lock:
            if not self._stop.is_set():
                self._stop.set()
                try:
                    self._wake.send(b"x")
                except OSError:
                    pass
                self._wake.close()
        if threading.current_thread() is not self._thread:
            self._thread.join(JOIN_TIMEOUT_S)

    def forget(self) -> None:
        """Close the descriptors without the thread: in a forked child, those inherited from the parent (whose
        thread is not the child's), so that the parent's socket ends with the parent."""
        for sock in (self._sock, self._wake_read, self._wake):
            sock.close()

    def _serve(self) -> None:
        try:
            while not self._stop.is_set():
                if not _readable(self._sock, None, self._wake_read):
                    continue  # woken: the loop's condition says whether to stop
                try:
                    conn, _ = self._sock.accept()
                except OSError:  # gone before it was accepted, or out of descriptors: a moment, then go on
                    self._stop.wait(0.05)
                    continue
                with conn:
                    self._serve_one(conn)
        finally:
            self._sock.close()
            self._wake_read.close()

    def _serve_one(self, conn: socket.socket) -> None:
        try:
            pid, uid = peer(conn)
        except OSError:
            return
        if uid != self._uid:  # another user's process: never answered, never released for
            return
        conn.setblocking(False)
        if _read_line(conn, time.monotonic() + REQUEST_TIMEOUT_S, self._wake_read) != _request(self.gpu).strip():
            return
        try:
            line = self._answer()
        except Exception as exc:  # answered, never raised on the listener's thread
            line = f"{FAILED}: {type(exc).__name__}: {exc}"
        try:
            conn.setblocking(True)
            conn.settimeout(REQUEST_TIMEOUT_S)
            conn.sendall(line.encode()[: MAX_LINE - 1] + b"\n")
        except OSError:  # the asker gave up waiting
            pass


def _readable(sock: socket.socket, timeout: float | None, wake: socket.socket | None = None) -> bool:
    """Whether *sock* has something to read within *timeout* seconds (None: wait) before *wake* does."""
    poller = select.poll()  # poll, not select: descriptors above 1,024 are common in big processes
    poller.register(sock, select.POLLIN)
    if wake is not None:
        poller.register(wake, select.POLLIN)
    events = dict(poller.poll(None if timeout is None else max(0, int(timeout * 1000))))
    return sock.fileno() in events and (wake is None or wake.fileno() not in events)


def _read_line(sock: socket.socket, deadline: float, wake: socket.socket | None = None) -> bytes | None:
    """One line from a non-blocking socket before *deadline* (without its newline), or None."""
    data = b""
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0 or len(data) >= MAX_LINE or not _readable(sock, left, wake):
            return None
        try:
            chunk = sock.recv(MAX_LINE)
        except BlockingIOError:
            continue
        except OSError:
            return None
        if not chunk:
            return None
        data += chunk
    return data.split(b"\n", 1)[0]


def holders(gpu: str) -> list[tuple[str, int]]:
    """``(name, pid)`` of every listening holder socket of this user for *gpu*, this process's left out (from
    ``/proc/net/unix``; the pid is the one in the name, which only the peer check confirms). Empty where the table
    cannot be read."""
    prefix = "@" + _prefix(gpu)
    try:
        with open("/proc/net/unix") as table:
            lines = table.read().splitlines()[1:]
    except OSError:
        return []
    found = {}
    for line in lines:
        fields = line.split()
        if len(fields) < 8 or not fields[7].startswith(prefix):
            continue
        try:
            listening = int(fields[3], 16) & _LISTENING
            pid = int(fields[7][len(prefix):].split("-", 1)[0])
        except ValueError:
            continue
        if listening and pid != os.getpid():
            found[fields[7][1:]] = pid
    return list(found.items())


def ask(gpu: str, timeout: float | None = None) -> list[Answer]:
    """Ask every holder of *gpu*'s counters among this user's processes to give them back, and wait at most
    *timeout* seconds (:data:`ASK_TIMEOUT_S`) for all the answers. A socket bound by another user is not asked
    (its :class:`Answer` says so); a holder gone since it was listed is left out."""
    deadline = time.monotonic() + (ASK_TIMEOUT_S if timeout is None else timeout)
    answers: list[Answer] = []
    waiting: dict[int, tuple[socket.socket, int, list]] = {}  # fd -> (socket, pid, bytes read)
    try:
        for name, listed_pid in holders(gpu):
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.setblocking(False)
            try:
                sock.connect("\0" + name)
                pid, uid = peer(sock)
            except BlockingIOError:  # its backlog is full: it is alive but not answering
                answers.append(Answer(listed_pid, NO_ANSWER, "took no connection"))
                sock.close()
                continue
            except OSError:  # gone since it was listed
                sock.close()
                continue
            if uid != os.getuid():
                answers.append(Answer(pid, ANOTHER_USER, f"a socket of user {uid} named like a holder's: not asked"))
                sock.close()
                continue
            try:
                sock.send(_request(gpu))
            except OSError:  # it closed the connection at once (it refused this process)
                answers.append(Answer(pid, NO_ANSWER, _CLOSED))
                sock.close()
                continue
            waiting[sock.fileno()] = (sock, pid, [])
        answers += _collect(waiting, deadline)
    finally:
        for sock, _, _ in waiting.values():
            sock.close()
    return answers


def _collect(waiting: dict, deadline: float) -> list[Answer]:
    """Read each waiting holder's answer line until *deadline*; those that sent none are :data:`NO_ANSWER`."""
    answers = []
    poller = select.poll()
    for fd in waiting:
        poller.register(fd, select.POLLIN)
    pending = set(waiting)
    while pending and (left := deadline - time.monotonic()) > 0:
        for fd, _ in poller.poll(max(1, int(left * 1000))):
            sock, pid, chunks = waiting[fd]
            try:
                chunk = sock.recv(MAX_LINE)
            except BlockingIOError:
                continue
            except OSError:
                chunk = b""
            chunks.append(chunk)
            data = b"".join(chunks)
            if chunk and b"\n" not in data and len(data) < MAX_LINE:
                continue
            poller.unregister(fd)
            pending.discard(fd)
            line = data.split(b"\n", 1)[0].decode(errors="replace") if b"\n" in data else ""
            answers.append(Answer(pid, _state(line), line or _CLOSED))
    for fd in pending:
        answers.append(Answer(waiting[fd][1], NO_ANSWER, "no answer"))
    return answers


def _state(line: str) -> str:
    for state in (RELEASED, BUSY, NOTHING_KEPT, FAILED):
        if line.startswith(state):
            return state
    return NO_ANSWER


def describe(answers: list[Answer], timeout: float | None = None, here: str = "") -> str:
    """Who holds the counters, for the error of a process that found them busy: *answers* from :func:`ask` (the
    retry after a release failed too, where there was one), *here* this process's own open session on the GPU."""
    timeout = ASK_TIMEOUT_S if timeout is None else timeout
    said = [f"this process has a gpuscope session open on this GPU ({here}): close it first"] if here else []
    for a in answers:
        if a.state == BUSY:
            said.append(f"gpuscope process {a.pid} of this user holds them: {a.text.removeprefix('busy: ')}; it "
                        "gives them back when that session closes")
        elif a.state == NO_ANSWER:
            said.append(f"gpuscope process {a.pid} of this user was asked to give them back and did not answer "
                        f"within {timeout:g} s ({a.text})")
        elif a.state == FAILED:
            said.append(f"gpuscope process {a.pid} of this user could not give them back ({a.text})")
    if not said:
        released = ", ".join(str(a.pid) for a in answers if a.state == RELEASED)
        said.append((f"gpuscope process {released} of this user gave back what it kept, and they were still busy "
                     "when tried again: " if released else "no gpuscope process of this user holds them: ")
                    + "not gpuscope: Nsight Compute, DCGM, another tool, or a process of another user")
    said += [f"process {a.pid}: {a.text}" for a in answers if a.state == ANOTHER_USER]
    return "; ".join(said) + "."
