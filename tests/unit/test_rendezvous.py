"""What one process keeps never blocks another (gpuscope._gpu.rendezvous, keep): real processes, no GPU.

The GPU's counters are played by a lock on a file that every process opens (``flock``): the fake CUPTI call that
starts a session takes it, or fails with ``HARDWARE_BUSY`` while another process holds it; the fake profiler that a
process keeps holds it until it is released. Everything else is gpuscope's own code: the keeper, the listener on
its thread, the abstract socket, the peer checks and the asker's retry.
"""

from __future__ import annotations

import json
import os
import pickle
import pwd
import select
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import pytest

from gpuscope._gpu import keep as _keep
from gpuscope._gpu import rendezvous
from gpuscope.errors import ProfilerBusyError, cupti_error

ROOT = Path(__file__).resolve().parents[2]
#: Seconds a test waits for a child's next line: far beyond any bound the rendezvous has.
WAIT_S = 60.0

CHILD = textwrap.dedent("""
    import fcntl, json, os, select, sys, threading, time
    from gpuscope._gpu import keep, rendezvous
    from gpuscope.errors import ProfilerBusyError, cupti_error

    role, what, GPU, COUNTERS, ask_timeout, patch = sys.argv[1:7]
    os.environ["GPUSCOPE_KEEP"] = "inf"  # only the rendezvous releases what is kept
    rendezvous.gpu_id = lambda device: GPU
    rendezvous.ASK_TIMEOUT_S = float(ask_timeout)
    if patch == "peer-is-another-user":  # as if every peer ran as another user
        real = rendezvous.peer
        rendezvous.peer = lambda sock: (real(sock)[0], os.getuid() + 1)

    def say(event, **fields):
        print(json.dumps(dict(fields, event=event, pid=os.getpid())), flush=True)

    class Counters:
        '''The GPU's counters: a lock on a file. take() is the CUPTI call that enables; close() gives them back.'''
        def take(self):
            fd = os.open(COUNTERS, os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise cupti_error(26, "cuptiRangeProfilerEnable", "CUPTI_ERROR_HARDWARE_BUSY") from None
            self.fd = fd
            return self
        def close(self):
            os.close(self.fd)

    class Context:
        def make_current(self): pass
        def close(self): pass

    def listening(name):  # this process's socket in the kernel's table, in any state
        with open("/proc/net/unix") as table:
            return sum(name in line for line in table)

    def threads():
        return [t.name for t in threading.enumerate() if t.name.startswith("gpuscope-rendezvous")]

    def wait_for(condition):  # or until the test says to go on (it ends this process)
        deadline = time.monotonic() + 30
        while not condition() and time.monotonic() < deadline:
            if select.select([sys.stdin], [], [], 0.01)[0]:
                sys.exit(0)

    if role == "ask-first":  # a session whose availability came from the cache: it asks first, retries nothing
        keep.ask_holders(0)
        try:
            Counters().take().close()
        except ProfilerBusyError as exc:
            say("busy", message=str(exc))
        else:
            say("ok")
        sys.exit(0)
    keep.session_open(0, what)
    try:
        t0 = time.monotonic()
        counters = keep.retry_when_busy(0, Counters().take, what)
    except ProfilerBusyError as exc:
        keep.session_closed(0, what)
        say("busy", message=str(exc), holders=exc.holders, seconds=time.monotonic() - t0)
        sys.exit(0)
    if role == "ask":
        counters.close()
        keep.session_closed(0, what)
        say("ok", seconds=time.monotonic() - t0)
    elif role == "keep":  # a session that ends cleanly and keeps its profiler
        key = ("pm",) if what == keep.PM_SESSION else ("range",)
        keep.keep(0, keep.Kept(key, 1, Context(), counters, None, None))
        keep.session_closed(0, what)
        name = keep._listeners[0].name
        say("kept", name=name, threads=threads())
        wait_for(lambda: not keep.kept_devices())
        wait_for(lambda: not threads())
        say("released", kept=keep.kept_devices(), threads=threads(), listening=listening(name))
    elif role == "session":  # a session that stays open until told
        name = keep._listeners[0].name
        say("open", name=name)
        sys.stdin.readline()
        counters.close()
        keep.session_closed(0, what)
        say("closed", kept=keep.kept_devices(), threads=threads(), listening=listening(name))
    sys.stdin.readline()  # stay alive until the test has looked
""")


class Child:
    """A gpuscope process of this test playing *role* for *what* on the fake GPU; its lines are JSON."""

    def __init__(self, role, what, gpu, counters, ask_timeout=rendezvous.ASK_TIMEOUT_S, patch="", user=None):
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, role, what, gpu, str(counters), str(ask_timeout), patch],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, user=user)

    def line(self, timeout=WAIT_S) -> dict:
        if not select.select([self.proc.stdout], [], [], timeout)[0]:
            raise AssertionError(f"child {self.proc.pid} said nothing for {timeout:g} s")
        text = self.proc.stdout.readline()
        if not text:
            self.proc.wait(10)
            raise AssertionError(f"child {self.proc.pid} ended: {self.proc.stderr.read()[-3000:]}")
        return json.loads(text)

    def tell(self) -> None:
        self.proc.stdin.write("go on\n")
        self.proc.stdin.flush()

    def end(self) -> None:
        if self.proc.poll() is None:
            try:
                self.tell()
                self.proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            stream.close()


@pytest.fixture
def gpu(tmp_path):
    """A fake GPU of this test only: its rendezvous name and its counters (a file to lock)."""
    counters = tmp_path / "counters"
    counters.write_bytes(b"")
    children: list[Child] = []

    class Gpu:
        id = f"test-{uuid.uuid4().hex[:12]}"
        path = counters

        def child(self, role, what, **kw):
            children.append(Child(role, what, self.id, counters, **kw))
            return children[-1]

        def listening(self) -> int:
            """Sockets of this GPU's rendezvous in the kernel's table (every state)."""
            return sum(self.id in line for line in Path("/proc/net/unix").read_text().splitlines())

    yield Gpu()
    for child in children:
        child.end()


@pytest.mark.parametrize("held, asking", [(_keep.RANGE_SESSION, _keep.PM_SESSION),
                                          (_keep.PM_SESSION, _keep.RANGE_SESSION)])
def test_what_one_process_keeps_is_given_back_to_the_next(gpu, held, asking):
    """Range then PM, PM then range: the second process finds the counters busy, asks, and its retry succeeds; the
    first gives them back from its listener and then nothing of the rendezvous is left in it."""
    holder = gpu.child("keep", held)
    kept = holder.line()
    assert kept["event"] == "kept" and kept["threads"] == ["gpuscope-rendezvous"] and gpu.listening() == 1
    asker = gpu.child("ask", asking)
    done = asker.line()
    assert done["event"] == "ok", done
    assert done["seconds"] < rendezvous.ASK_TIMEOUT_S
    released = holder.line()
    assert released == dict(event="released", pid=holder.proc.pid, kept=[], threads=[], listening=0)
    assert gpu.listening() == 0  # while the holder still runs: its socket is gone


def test_a_session_whose_availability_is_cached_asks_the_holders_before_it_enables(gpu):
    """The availability query answered from the cache asks CUPTI nothing, so nothing fails busy where a retry can
    wait: the session asks the holders first (keep.ask_holders), and its first Start finds the counters free."""
    holder = gpu.child("keep", _keep.PM_SESSION)
    assert holder.line()["event"] == "kept"
    asker = gpu.child("ask-first", _keep.RANGE_SESSION)
    assert asker.line()["event"] == "ok"
    assert holder.line()["event"] == "released"


def test_asking_first_costs_nothing_where_no_process_holds_the_counters(gpu, monkeypatch):
    monkeypatch.setattr(rendezvous, "gpu_id", lambda device: gpu.id)
    monkeypatch.setattr(rendezvous, "ask", lambda *a, **k: pytest.fail("asked with no holder listening"))
    assert _keep.ask_holders(0) == []


def test_the_counters_go_back_and_forth_between_two_processes(gpu):
    """Each process in turn keeps, then asks for what the other keeps."""
    first = gpu.child("keep", _keep.RANGE_SESSION)
    assert first.line()["event"] == "kept"
    second = gpu.child("keep", _keep.PM_SESSION)
    assert second.line()["event"] == "kept"  # it asked the first, which released
    assert first.line()["event"] == "released"
    third = gpu.child("keep", _keep.RANGE_SESSION)
    assert third.line()["event"] == "kept"
    assert second.line()["event"] == "released"
    third.end()


def test_a_holder_with_an_open_session_answers_busy_and_keeps_it(gpu):
    session = gpu.child("session", _keep.RANGE_SESSION)
    assert session.line()["event"] == "open"
    asker = gpu.child("ask", _keep.PM_SESSION)
    busy = asker.line()
    pid = session.proc.pid
    assert busy["event"] == "busy" and busy["holders"] == [[pid, rendezvous.BUSY]]
    assert (f"gpuscope process {pid} of this user holds them: a session is open (range profiling); it gives them "
            "back when that session closes") in busy["message"]
    assert "HARDWARE_BUSY" in busy["message"] and "not gpuscope" not in busy["message"]
    session.tell()
    closed = session.line()
    assert closed["event"] == "closed" and closed["threads"] == [] and closed["listening"] == 0
    assert gpu.child("ask", _keep.PM_SESSION).line()["event"] == "ok"  # free once the session closed


def test_counters_held_by_no_gpuscope_process_are_said_to_be_another_tools(gpu):
    import fcntl

    with open(gpu.path) as held:  # this test holds them, and listens for nobody: as ncu or DCGM would
        fcntl.flock(held, fcntl.LOCK_EX)
        busy = gpu.child("ask", _keep.RANGE_SESSION).line()
    assert busy["event"] == "busy" and busy["holders"] == []
    assert ("no gpuscope process of this user holds them: not gpuscope: Nsight Compute, DCGM, another tool, or a "
            "process of another user") in busy["message"]
    assert busy["seconds"] < 2  # nobody to wait for


def test_a_holder_that_does_not_answer_is_waited_for_a_bounded_time(gpu):
    import fcntl

    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)  # a holder that never accepts nor answers
    silent.bind(f"\0{rendezvous.PREFIX}-{os.getuid()}-{gpu.id}-{os.getpid()}-silent")
    silent.listen(1)
    with silent, open(gpu.path) as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        busy = gpu.child("ask", _keep.PM_SESSION, ask_timeout=0.5).line()
    assert busy["event"] == "busy" and busy["holders"] == [[os.getpid(), rendezvous.NO_ANSWER]]
    assert 0.5 <= busy["seconds"] < 2.5
    assert f"gpuscope process {os.getpid()} of this user was asked to give them back and did not answer within " \
           "0.5 s" in busy["message"]


def test_a_silent_connection_does_not_stop_the_holder_answering(gpu):
    holder = gpu.child("keep", _keep.RANGE_SESSION)
    name = holder.line()["name"]
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as silent:
        silent.connect("\0" + name)  # connects first and says nothing
        done = gpu.child("ask", _keep.PM_SESSION).line()
        assert done["event"] == "ok" and done["seconds"] < rendezvous.REQUEST_TIMEOUT_S + 2
        assert silent.recv(10) == b""  # dropped unanswered
    assert holder.line()["event"] == "released"


def test_a_holder_never_answers_nor_releases_for_another_user(gpu):
    """The holder's peer check: as if the asker ran as another user, the holder closes unanswered and keeps."""
    holder = gpu.child("keep", _keep.RANGE_SESSION, patch="peer-is-another-user")
    assert holder.line()["event"] == "kept"
    busy = gpu.child("ask", _keep.PM_SESSION).line()
    assert busy["event"] == "busy" and busy["holders"] == [[holder.proc.pid, rendezvous.NO_ANSWER]]
    assert "closed the connection without an answer" in busy["message"]
    assert not select.select([holder.proc.stdout], [], [], 0.5)[0]  # it did not release
    assert gpu.listening() == 1


def test_an_asker_never_asks_a_socket_of_another_user(gpu):
    """The asker's peer check: as if the holder's socket were another user's, it is not sent the request."""
    holder = gpu.child("keep", _keep.RANGE_SESSION)
    assert holder.line()["event"] == "kept"
    busy = gpu.child("ask", _keep.PM_SESSION, patch="peer-is-another-user").line()
    assert busy["event"] == "busy" and busy["holders"] == [[holder.proc.pid, rendezvous.ANOTHER_USER]]
    assert f"a socket of user {os.getuid() + 1} named like a holder's: not asked" in busy["message"]
    assert "not gpuscope: Nsight Compute" in busy["message"]
    assert not select.select([holder.proc.stdout], [], [], 0.5)[0]  # never asked: still keeps


def test_a_process_of_another_user_gets_no_answer(gpu):
    """For real: a process running as another user connects to a holder and asks; it is closed unanswered."""
    if os.getuid() != 0:
        pytest.skip("needs root, to run the asking process as another user (nobody)")
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("this machine has no user 'nobody'")
    holder = gpu.child("keep", _keep.RANGE_SESSION)
    name = holder.line()["name"]
    readable, writable = os.pipe()
    pid = os.fork()
    if pid == 0:  # the other user's process: no Python beyond this block, whatever happens
        try:
            os.close(readable)
            os.setgroups([])
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(10)
                sock.connect("\0" + name)
                try:
                    sock.sendall(f"release {gpu.id}\n".encode())
                    got = sock.recv(100)
                except (BrokenPipeError, ConnectionResetError):  # closed before it was read from
                    got = b""
                os.write(writable, b"answered " + got)
        finally:
            os._exit(0)
    os.close(writable)
    with os.fdopen(readable, "rb") as out:
        assert select.select([out], [], [], WAIT_S)[0] and out.read() == b"answered "  # closed, unanswered
    os.waitpid(pid, 0)
    assert not select.select([holder.proc.stdout], [], [], 0.5)[0]  # it did not release
    assert gpu.child("ask", _keep.PM_SESSION).line()["event"] == "ok"  # while this user's process is answered


# -- in this process -------------------------------------------------------------------------------------------


class FakeProfiler:
    def __init__(self):
        self.closed = 0

    def close(self):
        self.closed += 1


class FakeContext:
    def make_current(self):
        pass

    def close(self):
        pass


@pytest.fixture
def keeper(monkeypatch):
    """A clean keeper on a fake GPU of this test (cuptiProfilerDeInitialize is not called)."""
    gpu = f"test-{uuid.uuid4().hex[:12]}"
    monkeypatch.setenv("GPUSCOPE_KEEP", "inf")
    for name, value in (("_kept", {}), ("_sessions", {}), ("_listeners", {})):
        monkeypatch.setattr(_keep, name, value)
    monkeypatch.setattr(rendezvous, "gpu_id", lambda device: f"{gpu}-{device}")
    monkeypatch.setattr("gpuscope.cupti.profiler.deinitialize", lambda **k: None)
    yield gpu
    _keep.release()
    for device in list(_keep._sessions):
        _keep._sessions.pop(device)
        _keep._listen(device)


def kept(key=("range",)):
    return _keep.Kept(key, 7, FakeContext(), FakeProfiler(), None, None)


def listening(gpu: str) -> int:
    return sum(gpu in line for line in Path("/proc/net/unix").read_text().splitlines())


def rendezvous_threads() -> list:
    return [t for t in threading.enumerate() if t.name == "gpuscope-rendezvous"]


def test_release_ends_the_listener_and_its_socket(keeper):
    _keep.keep(0, kept())
    _keep.keep(1, kept())
    assert len(rendezvous_threads()) == 2 and listening(keeper) == 2
    _keep.release(0)
    assert len(rendezvous_threads()) == 1 and listening(f"{keeper}-0") == 0 and listening(f"{keeper}-1") == 1
    _keep.release()
    assert rendezvous_threads() == [] and listening(keeper) == 0


def test_the_idle_timer_ends_the_listener(keeper, monkeypatch):
    monkeypatch.setenv("GPUSCOPE_KEEP", "0.05")
    k = kept()
    _keep.keep(0, k)
    k.timer.join(5)
    deadline = time.monotonic() + 5
    while rendezvous_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert k.profiler.closed == 1 and rendezvous_threads() == [] and listening(keeper) == 0


def test_a_session_listens_while_open_and_what_it_keeps_after(keeper):
    _keep.session_open(0, _keep.RANGE_SESSION)
    assert len(rendezvous_threads()) == 1
    k = kept()
    _keep.keep(0, k)
    _keep.session_closed(0, _keep.RANGE_SESSION)
    assert len(rendezvous_threads()) == 1  # the same listener goes on while it keeps
    _keep.session_open(0, _keep.RANGE_SESSION)
    assert _keep.take(0, k.key, 7) is k and len(rendezvous_threads()) == 1
    _keep.session_closed(0, _keep.RANGE_SESSION)
    assert rendezvous_threads() == [] and listening(keeper) == 0  # closed, nothing kept


def test_an_open_session_is_never_released_under_it(keeper):
    k = kept()
    _keep.keep(0, k)
    _keep.session_open(0, _keep.PM_SESSION)
    assert _keep.answer(0) == "busy: a session is open (PM sampling)"
    assert _keep.kept_devices() == [0] and k.profiler.closed == 0
    _keep.session_closed(0, _keep.PM_SESSION)
    assert _keep.answer(0) == "released (the kept range profiler)" and k.profiler.closed == 1
    assert _keep.answer(0) == "nothing kept"
    assert rendezvous_threads() == [] and listening(keeper) == 0


def test_a_forked_child_closes_its_copy_of_the_socket(keeper):
    _keep.keep(0, kept())
    readable, writable = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child keeps running, holding whatever it did not close
        try:
            os.write(writable, f"{_keep.kept_devices()} {len(_keep._listeners)}".encode())
            time.sleep(30)
        finally:
            os._exit(0)
    try:
        assert os.read(readable, 100) == b"[] 0"
        _keep.release()
        assert listening(keeper) == 0  # had the child kept its copy, the listening socket would still be there
    finally:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        os.close(readable)
        os.close(writable)


def test_busy_is_retried_only_for_hardware_busy(keeper, monkeypatch):
    asked = []
    monkeypatch.setattr(rendezvous, "ask", lambda gpu, timeout=None: asked.append(gpu) or [])

    def subscriber_taken():
        raise cupti_error(39, "cuptiSubscribe", "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED")

    with pytest.raises(ProfilerBusyError) as info:
        _keep.retry_when_busy(0, subscriber_taken)
    assert info.value.status == 39 and asked == []
    calls = []

    def busy_then_free():
        calls.append(1)
        if len(calls) == 1:
            raise cupti_error(26, "cuptiPmSamplingEnable", "CUPTI_ERROR_HARDWARE_BUSY")
        return "enabled"

    monkeypatch.setattr(rendezvous, "ask", lambda gpu, timeout=None: [rendezvous.Answer(42, "released", "released")])
    assert _keep.retry_when_busy(0, busy_then_free) == "enabled" and len(calls) == 2


def test_this_process_s_own_open_session_is_named(keeper, monkeypatch):
    monkeypatch.setattr(rendezvous, "ask", lambda gpu, timeout=None: [])
    _keep.session_open(0, _keep.RANGE_SESSION)
    _keep.session_open(0, _keep.PM_SESSION)

    def busy():
        raise cupti_error(26, "cuptiPmSamplingSetConfig", "CUPTI_ERROR_HARDWARE_BUSY")

    with pytest.raises(ProfilerBusyError) as info:
        _keep.retry_when_busy(0, busy, _keep.PM_SESSION)
    assert "this process has a gpuscope session open on this GPU (range profiling): close it first" in str(info.value)
    assert "not gpuscope" not in str(info.value)


@pytest.mark.parametrize("answers, said", [
    ([], "no gpuscope process of this user holds them: not gpuscope: Nsight Compute, DCGM, another tool"),
    ([(7, "busy", "busy: a session is open (PM sampling)")],
     "gpuscope process 7 of this user holds them: a session is open (PM sampling); it gives them back when"),
    ([(7, "released", "released (the kept range profiler)")],
     "gpuscope process 7 of this user gave back what it kept, and they were still busy when tried again: not "
     "gpuscope: Nsight Compute"),
    ([(7, "no answer", "no answer")], "gpuscope process 7 of this user was asked to give them back and did not "
                                      "answer within 5 s"),
])
def test_the_error_says_what_holds_the_counters(answers, said):
    text = rendezvous.describe([rendezvous.Answer(*a) for a in answers])
    assert said in text


def test_the_busy_error_keeps_its_holders_through_pickle():
    error = ProfilerBusyError(26, "cuptiRangeProfilerEnable", "CUPTI_ERROR_HARDWARE_BUSY", "held", [(7, "busy")])
    again = pickle.loads(pickle.dumps(error))
    assert again.holders == ((7, "busy"),) and str(again) == str(error) and isinstance(again, RuntimeError)
