"""Faults of the PM evaluation workers without a GPU (docs/reliability.md): strangers on the workers' socket, a
worker that hangs mid-run, a parent killed under its workers, code in the current folder. Real worker processes
evaluate the H100 recording. Waits below are liveness bounds, not timings."""

import json
import os
import pwd
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from gpuscope._pm_sampling import workers as _pm_workers

from .test_faults import assert_all_evaluated, assert_nothing_left, backend_for, submit_all
from .test_pm_workers import AVAILABILITY, batch

#: Liveness bound (s) for things that happen in well under a second.
BOUND = 60


def wait_until(condition, what):
    end = time.monotonic() + BOUND
    while not condition():
        assert time.monotonic() < end, f"{what}: not within {BOUND} s"
        time.sleep(0.02)


def state(pid):
    """The process's state letter from /proc (R, S, T: stopped, Z: zombie), or None if it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


@pytest.fixture
def make_backend(pm_recording):
    """``backend_for`` whose workers, stopped ones included, are killed and reaped even if the test fails."""
    made = []

    def make(**kwargs):
        pipe, backend = backend_for(pm_recording, **kwargs)
        made.append(backend)
        return pipe, backend

    yield make
    for backend in made:
        for worker in backend._workers:
            worker.proc.kill()
        backend.close()


class SilentPeer:
    """A process (forked from this one, as *user* if given) that connects to the workers' socket and sends nothing;
    it only reads until the other end closes. Made once it is connected."""

    def __init__(self, address, user=None):
        readable, writable = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # the peer: no Python beyond this block, whatever happens
            try:
                os.close(readable)
                if user is not None:
                    os.setgroups([])
                    os.setgid(user.pw_gid)
                    os.setuid(user.pw_uid)
                sock = socket.socket(socket.AF_UNIX)
                sock.connect("\0" + address)
                os.write(writable, b"connected ")
                got = b""
                while chunk := sock.recv(4096):
                    got += chunk
                os.write(writable, b"refused" if got == b"" else b"answered")
            finally:
                os._exit(0)
        os.close(writable)
        self._out = os.fdopen(readable, "rb")
        assert select.select([self._out], [], [], BOUND)[0] and self._out.read(10) == b"connected "

    def was_refused(self) -> bool:
        """Whether it was disconnected before anything was sent to it."""
        if not select.select([self._out], [], [], BOUND)[0]:
            return False
        return self._out.read() == b"refused"

    def end(self) -> None:
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        self._out.close()


def workers_come_up_despite(peer, backend, pipe, pm_recording):
    """The workers connect although *peer* connected first and sends nothing; the peer is refused at once."""
    try:
        backend.start()
        assert backend.wait_ready() == 2
        assert peer.was_refused()
        submit_all(backend, pm_recording)
        backend.close()
    finally:
        peer.end()
    assert backend.workers_lost == 0 and backend.images_lost == 0
    assert_all_evaluated(pipe, pm_recording)
    assert_nothing_left(backend)


def test_a_silent_connection_of_this_user_does_not_block_the_workers(make_backend, pm_recording):
    pipe, backend = make_backend(workers=2)
    peer = SilentPeer(backend._address)  # connected before any worker, as a stranger on the machine could
    workers_come_up_despite(peer, backend, pipe, pm_recording)
    assert [e for e in pipe.errors if "refused 1 connection(s)" in e and f"pid {peer.pid} of user" in e]


def test_a_silent_connection_of_another_user_is_refused(make_backend, pm_recording):
    if os.getuid() != 0:
        pytest.skip("needs root, to run the intruding process as another user (nobody)")
    try:
        nobody = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("this machine has no user 'nobody' to run the intruding process as")
    pipe, backend = make_backend(workers=2)
    peer = SilentPeer(backend._address, user=nobody)
    workers_come_up_despite(peer, backend, pipe, pm_recording)
    assert [e for e in pipe.errors if f"pid {peer.pid} of user {nobody.pw_uid}" in e]


def test_the_peer_check_refuses_a_process_of_another_user(make_backend, pm_recording):
    """As if the workers ran as another user: the peer check refuses them, before they are read from."""
    pipe, backend = make_backend(workers=2)
    backend._uid = os.getuid() + 1
    backend.start()
    assert backend.wait_ready() == 0
    submit_all(backend, pm_recording)
    backend.close()
    message = next(e for e in pipe.errors if e.startswith("refused 2 connection(s)"))
    assert all(f"pid {w.proc.pid} of user {os.getuid()}" in message for w in backend._workers)
    assert f"as user {os.getuid() + 1}, may connect" in message
    assert all(w.proc.returncode == _pm_workers.PARENT_GONE for w in backend._workers)  # refused: they exit
    assert_all_evaluated(pipe, pm_recording)  # in this process
    assert_nothing_left(backend)


def test_a_worker_silent_in_the_handshake_is_dropped_at_the_deadline(make_backend, pm_recording, monkeypatch):
    monkeypatch.setattr(_pm_workers, "BOOT", "import socket, sys, time; s = socket.socket(socket.AF_UNIX); "
                                             "s.connect('\\0' + sys.argv[1]); time.sleep(600)")
    monkeypatch.setattr(_pm_workers.ProcessEvaluation, "IO_TIMEOUT_S", 0.2)
    pipe, backend = make_backend(workers=1)
    backend.start()
    assert backend.wait_ready() == 0
    assert any("failed the handshake (sent nothing for 0.2 s): killed" in e for e in pipe.errors)
    assert backend._workers[0].proc.wait(BOUND) == -signal.SIGKILL
    submit_all(backend, pm_recording)
    backend.close()
    assert_all_evaluated(pipe, pm_recording)
    assert_nothing_left(backend)


def test_a_hung_worker_is_killed_during_the_run_and_its_images_come_back(make_backend, pm_recording, monkeypatch):
    monkeypatch.setattr(_pm_workers.ProcessEvaluation, "TASK_TIMEOUT_S", 0.5)
    meta, _, stamps = pm_recording
    n = meta["completed"]
    pipe, backend = make_backend(workers=1, pool=2)
    backend.start()
    assert backend.wait_ready() == 1

    def evaluate(seqs):  # as the decode thread: take free images, hand them off
        for seq in seqs:
            backend.submit(seq, pipe._free.get_nowait() if seq >= 2 else backend.images[seq], n,
                           [batch(stamps, 0, n - 1)])
        wait_until(lambda: all(s in pipe._results for s in seqs) and pipe._free.qsize() == 2,
                   f"images {seqs} back in the pool during the run")

    evaluate([0, 1])  # by the worker
    assert backend.workers_lost == 0
    worker = backend._workers[0].proc
    os.kill(worker.pid, signal.SIGSTOP)
    wait_until(lambda: state(worker.pid) == "T", "the worker stopped")
    evaluate([2, 3])  # sent to the stopped worker: it is killed and they are evaluated here, before close()
    assert worker.wait(BOUND) == -signal.SIGKILL
    assert backend.workers_lost == 1 and backend.images_recovered == 2
    assert any(f"evaluation worker {worker.pid} did not answer for 0.5 s: killed" in e for e in pipe.errors)
    evaluate([4])  # and sampling goes on: later images are evaluated in this process
    backend.close()
    assert backend.images_lost == 0 and backend.images_recovered == 2
    assert_all_evaluated(pipe, pm_recording, tasks=5)
    assert_nothing_left(backend)


def test_a_worker_that_reads_nothing_does_not_block_the_dispatcher(make_backend, pm_recording, monkeypatch):
    """A task larger than the socket's buffer, for a stopped worker: the send gives up after IO_TIMEOUT_S, that
    worker is killed (part of the task went out) and the other worker evaluates it."""
    monkeypatch.setattr(_pm_workers.ProcessEvaluation, "IO_TIMEOUT_S", 0.2)
    monkeypatch.setattr(_pm_workers.ProcessEvaluation, "TASK_TIMEOUT_S", 600.0)  # not the hung-task check
    meta, _, stamps = pm_recording
    pipe, backend = make_backend(workers=2, pool=1)
    backend.start()
    assert backend.wait_ready() == 2
    stopped = backend._workers[0].proc  # first of the two with no task: the dispatcher's first choice
    os.kill(stopped.pid, signal.SIGSTOP)
    wait_until(lambda: state(stopped.pid) == "T", "the worker stopped")
    empty = [(5, 4, i, i, i, False) for i in range(300_000)]  # megabytes of batches that cover no sample
    backend.submit(0, backend.images[0], meta["completed"], empty)
    wait_until(lambda: 0 in pipe._results, "the image evaluated by the other worker")
    assert stopped.wait(BOUND) == -signal.SIGKILL
    assert any(f"evaluation worker {stopped.pid} read no task for 0.2 s: killed" in e for e in pipe.errors)
    backend.close()
    assert backend.images_lost == 0 and backend._workers[1].clean_exit
    np.testing.assert_array_equal(pipe._results[0][1], stamps)  # no batch: read with GetSampleInfo
    assert_nothing_left(backend)


#: A parent that starts two workers, says their pids, and waits to be killed.
PARENT = """
import json, sys, time
import numpy as np
from gpuscope._pm_sampling import workers as _pm_workers
args = json.loads(sys.argv[1])

class Pipeline:
    errors = []

backend = _pm_workers.ProcessEvaluation(Pipeline(), args["chip"], args["metrics"], np.load(args["availability"]),
                                        image_bytes=args["image_bytes"], pool_size=2, workers=2)
backend.start()
ready = backend.wait_ready()
print(json.dumps({"ready": ready, "pids": [w.proc.pid for w in backend._workers]}), flush=True)
time.sleep(600)
"""


def test_workers_of_a_killed_parent_exit_quietly(pm_recording, tmp_path):
    meta, image, _ = pm_recording
    args = {"chip": meta["chip"], "metrics": meta["metrics"], "availability": str(AVAILABILITY),
            "image_bytes": int(image.size)}
    stderr = tmp_path / "stderr"  # the parent's, which the workers inherit: the user's terminal
    with open(stderr, "w") as err:
        parent = subprocess.Popen([sys.executable, "-c", PARENT, json.dumps(args)], stdout=subprocess.PIPE,
                                  stderr=err, text=True, cwd=tmp_path)
    try:
        ready, _, _ = select.select([parent.stdout], [], [], BOUND)
        assert ready, "the parent did not start its workers"
        started = json.loads(parent.stdout.readline())
        assert started["ready"] == 2
    finally:
        parent.kill()
        parent.wait()
        parent.stdout.close()
    try:
        for pid in started["pids"]:
            wait_until(lambda: state(pid) in (None, "Z"), f"worker {pid} exited after its parent was killed")
    finally:
        for pid in started["pids"]:
            if state(pid) not in (None, "Z"):
                os.kill(pid, signal.SIGKILL)
    assert stderr.read_text() == ""


MALICIOUS = "open({marker!r}, 'a').write('executed {name}\\n')\n"


def test_workers_never_run_code_from_the_cwd(make_backend, pm_recording, tmp_path, monkeypatch):
    """``json`` is imported by the worker's first line, before its ``sys.path`` is set: only ``python -I`` keeps
    a ``json.py`` in the current folder from running."""
    marker = tmp_path / "marker"
    for name in ("json.py", "numpy.py", "socket.py", "gpuscope/__init__.py"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(MALICIOUS.format(marker=str(marker), name=name))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", ["", *sys.path])  # as under `python -c`
    pipe, backend = make_backend(workers=1)
    backend.start()
    assert backend.wait_ready() == 1
    submit_all(backend, pm_recording, tasks=1)
    backend.close()
    assert not marker.exists(), marker.read_text()
    assert backend.workers_lost == 0 and pipe.errors == []


def test_a_forked_child_never_closes_its_parents_workers(monkeypatch):
    """close() in a forked child tells the parent's workers nothing and touches neither their socket nor the images:
    it only closes the child's own copies of the workers' connections (so that the workers still see the parent
    end, whatever the child does: a kept sampler's workers outlive sessions)."""
    from gpuscope._pm_sampling import workers as _pm_workers

    class Conn:
        def __init__(self):
            self.calls = []

        def send(self, obj):
            self.calls.append("send")

        def close(self):
            self.calls.append("close")

    evaluation = _pm_workers.ProcessEvaluation.__new__(_pm_workers.ProcessEvaluation)
    evaluation._closed, evaluation._owner = False, os.getpid() + 1  # as seen from a child
    conn = Conn()
    evaluation._workers = [_pm_workers._Worker(proc=None)]
    evaluation._workers[0].conn = conn
    evaluation.close()  # would touch the dispatcher, the task queue and the workers in the parent
    assert evaluation._closed is False and conn.calls == ["close"]
