"""Two processes on one GPU: what one keeps never blocks the other (gpuscope._gpu.rendezvous).

Range then PM, PM then range, each with a fresh asker (``HARDWARE_BUSY`` from the counter-availability query) and a
warm one (availability cached: ``HARDWARE_BUSY`` from the range profiler's or PM sampler's enable): the second
process's retry succeeds and the first has given back what it kept, with nothing of the rendezvous left. A process
with a session open is named in the other's error; a Dask-CUDA worker profiles after a session in this process.

    python3 -m pytest -m gpu tests/gpu/test_rendezvous.py
"""

import json
import os
import select
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest

import gpuscope as gs
from gpuscope._gpu import keep as _keep

cuda = pytest.importorskip("numba.cuda")
ROOT = Path(__file__).resolve().parents[2]
ONE_PASS = ["smsp__inst_executed.sum", "sm__ctas_launched.sum"]
#: Seconds a test waits for a child's next line (CUDA, Numba and CUPTI start in it).
WAIT_S = 300

CHILD = textwrap.dedent("""
    import json, os, sys, threading
    import numpy as np
    from numba import cuda
    import gpuscope as gs
    from gpuscope._gpu import keep as _keep
    from benchmarks.workloads import tiny

    role, session = sys.argv[1], sys.argv[2]
    ONE_PASS = json.loads(sys.argv[3])
    x = cuda.to_device(np.ones(1 << 16, np.float32))

    def say(event, **fields):
        print(json.dumps(dict(fields, event=event, pid=os.getpid())), flush=True)

    def rendezvous_threads():
        return [t.name for t in threading.enumerate() if t.name == "gpuscope-rendezvous"]

    def range_session():
        with gs.Profiler(ONE_PASS) as prof:
            with gs.range("r"):
                tiny[256, 256](x)
        return int(prof.dataset["smsp__inst_executed.sum"][0])

    def pm_threads():  # the kept evaluation workers' reader threads while kept
        return [t.name for t in threading.enumerate() if t.name.startswith("gpuscope-pm")]

    def pm_session(evaluate_in="thread"):  # the sampler is kept after it (with its workers: "pm-workers")
        with gs.sample(ONE_PASS, interval="100us", evaluate_in=evaluate_in) as s:
            for _ in range(20):
                tiny[256, 256](x)
            cuda.synchronize()
        return int(s.dataset.sizes["time"])

    run = {"range": range_session, "pm": pm_session, "pm-workers": lambda: pm_session("process")}[session]
    if role == "keep":  # a session that keeps what it enabled, until another process asks for it
        say("kept", value=run(), kept=_keep.kept_devices(), threads=rendezvous_threads())
        sys.stdin.readline()
        say("after", kept=_keep.kept_devices(), listeners=len(_keep._listeners), threads=rendezvous_threads(),
            pm_threads=pm_threads())
    elif role in ("run", "warm-run"):
        if role == "warm-run":  # a session first, kept by nobody: availability is cached, the next enable is busy
            os.environ["GPUSCOPE_KEEP"] = "0"
            run()
            os.environ["GPUSCOPE_KEEP"] = "inf"
            say("warm", kept=_keep.kept_devices())
            sys.stdin.readline()
        try:
            say("ok", value=run())
        except gs.ProfilerBusyError as exc:
            say("busy", message=str(exc), holders=exc.holders)
    elif role == "open":  # a session held open until told
        with gs.Profiler(ONE_PASS):
            with gs.range("r"):
                tiny[256, 256](x)
            say("open", threads=rendezvous_threads())
            sys.stdin.readline()
        say("closed", kept=_keep.kept_devices())
    sys.stdin.readline()
""")


class Child:
    """A process of this test on GPU 0; its lines are JSON."""

    def __init__(self, role, session):
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
                   GPUSCOPE_KEEP="inf")  # kept until the rendezvous gives it back
        self.proc = subprocess.Popen([sys.executable, "-c", CHILD, role, session, json.dumps(ONE_PASS)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=env, cwd=ROOT)

    def line(self) -> dict:
        if not select.select([self.proc.stdout], [], [], WAIT_S)[0]:
            raise AssertionError(f"child {self.proc.pid} said nothing for {WAIT_S} s")
        text = self.proc.stdout.readline()
        if not text:
            self.proc.wait(30)
            raise AssertionError(f"child {self.proc.pid} ended ({self.proc.returncode}): "
                                 f"{self.proc.stderr.read()[-4000:]}")
        return json.loads(text)

    def tell(self) -> None:
        self.proc.stdin.write("go on\n")
        self.proc.stdin.flush()

    def end(self) -> None:
        if self.proc.poll() is None:
            try:
                self.tell()
                self.proc.wait(60)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            stream.close()


@pytest.fixture
def children():
    made = []

    def make(role, session):
        made.append(Child(role, session))
        return made[-1]

    yield make
    for child in made:
        child.end()


@pytest.mark.parametrize("warm", [False, True], ids=["fresh", "warm"])
@pytest.mark.parametrize("held, asking", [("range", "pm"), ("pm", "range"), ("pm-workers", "range")],
                         ids=["range-then-pm", "pm-then-range", "pm-workers-then-range"])
def test_what_one_process_keeps_is_given_back_to_the_other(children, held, asking, warm):
    asker = None
    if warm:
        asker = children("warm-run", asking)
        assert asker.line() == dict(event="warm", pid=asker.proc.pid, kept=[])
    holder = children("keep", held)
    kept = holder.line()
    assert kept["event"] == "kept" and kept["value"] > 0 and kept["kept"] == [0]
    assert kept["threads"] == ["gpuscope-rendezvous"]
    if asker is None:
        asker = children("run", asking)
    else:
        asker.tell()
    done = asker.line()
    assert done["event"] == "ok" and done["value"] > 0, done
    holder.tell()
    after = holder.line()
    assert after == dict(event="after", pid=holder.proc.pid, kept=[], listeners=0, threads=[], pm_threads=[])


def test_a_process_with_an_open_session_is_named(children):
    holder = children("open", "range")
    assert holder.line()["event"] == "open"
    asker = children("run", "pm")
    busy = asker.line()
    pid = holder.proc.pid
    assert busy["event"] == "busy" and busy["holders"] == [[pid, "busy"]], busy
    assert f"gpuscope process {pid} of this user holds them: a session is open (range profiling)" in busy["message"]
    holder.tell()
    assert holder.line() == dict(event="closed", pid=pid, kept=[0])
    again = children("run", "pm").line()  # the closed session's profiler is kept: given back when asked
    assert again["event"] == "ok" and again["value"] > 0, again


DASK = textwrap.dedent("""
    import json, sys
    import gpuscope as gs
    import gpuscope.dask

    def work():
        import numpy as np
        from numba import cuda

        @cuda.jit
        def add(x):
            i = cuda.grid(1)
            if i < x.size:
                x[i] += 1

        x = cuda.to_device(np.ones(1 << 16, np.float32))
        for _ in range(4):
            add[256, 256](x)
        cuda.synchronize()

    if __name__ == "__main__":  # the workers start their own interpreters
        from dask_cuda import LocalCUDACluster
        from distributed import Client

        with LocalCUDACluster(CUDA_VISIBLE_DEVICES="0", dashboard_address=None) as cluster, Client(cluster) as client:
            client.wait_for_workers(1)
            merged = gpuscope.dask.profile(client, work, options={"metrics": json.loads(sys.argv[2])})
        gs.save_dataset(merged, sys.argv[1])
""")


def test_a_dask_worker_profiles_after_a_session_here(tmp_path, monkeypatch):
    """The GPU suite's order that failed: this process sampled and kept its sampler, then a Dask-CUDA worker on the
    same GPU profiled (it got HARDWARE_BUSY)."""
    pytest.importorskip("dask_cuda")
    from benchmarks.workloads import tiny

    monkeypatch.setenv("GPUSCOPE_KEEP", "inf")
    x = cuda.to_device(np.ones(1 << 16, np.float32))
    with gs.sample(ONE_PASS, interval="100us", evaluate_in="thread"):
        for _ in range(20):
            tiny[256, 256](x)
        cuda.synchronize()
    assert _keep.kept_devices() == [0]
    script, out = tmp_path / "dask_after_a_session.py", tmp_path / "dask.nc"
    script.write_text(DASK)
    env = {k: v for k, v in os.environ.items() if k != "GPUSCOPE_KEEP"}  # the worker keeps as it would
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    run = subprocess.run([sys.executable, str(script), str(out), json.dumps(ONE_PASS)], capture_output=True,
                         text=True, timeout=600, cwd=tmp_path, env=env)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    merged = gs.open_dataset(out)
    assert merged.attrs["launcher"] == "dask" and float(merged["smsp__inst_executed.sum"].sum()) > 0
    assert _keep.kept_devices() == []  # given back to the worker, from the rendezvous listener's thread
    assert not [t for t in threading.enumerate() if t.name == "gpuscope-rendezvous"]
