"""Faults of the PM evaluation workers without a GPU (docs/reliability.md): a parent killed under its workers, code
in the current folder. Real worker processes evaluate the H100 recording. Waits below are liveness bounds, not
timings."""

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .test_faults import backend_for, submit_all
from .test_pm_workers import AVAILABILITY

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


#: A parent that starts two workers, says their pids, and waits to be killed.
PARENT = """
import json, sys, time
import numpy as np
from gpuscope import _pm_workers
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
