"""Sessions one after another in one process: the kept range profiler gives the same values, small images emptied
when full lose nothing, PM and PC sampling work after a kept profiler, and process exit leaves nothing behind."""

import json
import os
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import gpuscope as gs
from gpuscope._gpu import keep as _keep

cuda = pytest.importorskip("numba.cuda")
ONE_PASS = ["smsp__inst_executed.sum", "sm__ctas_launched.sum"]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@cuda.jit(lineinfo=True)
def fma_keep(x, iters):
    i = cuda.grid(1)
    if i < x.size:
        v = x[i]
        for _ in range(iters):
            v = v * 1.000001 + 0.5
        x[i] = v


@cuda.jit(lineinfo=True)
def fma_never_profiled(x, iters):  # first seen by CUPTI inside a pc_sample block
    i = cuda.grid(1)
    if i < x.size:
        v = x[i]
        for _ in range(iters):
            v = v * 0.999999 + 0.25
        x[i] = v


@pytest.fixture(scope="module")
def x():
    return cuda.to_device(np.ones(1 << 20, np.float32))


def launch(x):
    fma_keep[4096, 256](x, 300)


def one_range(x, metrics=ONE_PASS):
    with gs.Profiler(metrics) as prof:
        with gs.range("r"):
            launch(x)
    return prof.dataset


def test_sessions_of_every_mode_in_a_row_give_the_same_values(x):
    launch(x)
    cuda.synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gs.GpuscopeWarning)
        first = one_range(x)
        again = one_range(x)
        with gs.Profiler("topdown", mode="kernel") as k1:
            launch(x)
        with gs.Profiler("topdown", mode="iteration") as it:
            for _ in range(it.passes + 1):
                with gs.range("step"):
                    launch(x)
        with gs.Profiler("topdown", mode="kernel"):
            launch(x)
        k3 = gs.Profiler("topdown", mode="kernel")
        with k3:
            launch(x)
        last = one_range(x)
    for ds in (again, last):
        for m in ONE_PASS:  # instruction and CTA counts of the same launch are exact
            assert float(ds[m][0]) == float(first[m][0]) > 0
    assert "profiler_reused" not in first.attrs and again.attrs["profiler_reused"] == 1
    assert k3.dataset.attrs["profiler_reused"] == 1  # k2's configuration
    a, b = k1.dataset, k3.dataset
    ipc_a = float(a["smsp__inst_executed.avg.per_cycle_active"][0])
    ipc_b = float(b["smsp__inst_executed.avg.per_cycle_active"][0])
    assert abs(ipc_a - ipc_b) / ipc_a < 0.05
    ipc_i = float(it.dataset["smsp__inst_executed.avg.per_cycle_active"][0])
    assert abs(ipc_a - ipc_i) / ipc_a < 0.05
    td_a, td_b = gs.topdown(a), gs.topdown(b)  # the Top-Down of the same launch, fresh and kept profiler
    assert max(abs(float(td_a[v][0]) - float(td_b[v][0])) for v in td_a.data_vars) < 2.0  # points of IPC_MAX


def test_small_images_are_emptied_when_full_and_lose_nothing(x):
    launch(x)
    with gs.Profiler(ONE_PASS, mode="kernel") as prof:
        for _ in range(150):
            launch(x)
    ds = prof.dataset
    assert ds.sizes["range"] == 150 and ds.attrs["image_flushes"] == 2
    assert ds.launch.values.tolist() == list(range(150))
    assert np.unique(ds["smsp__inst_executed.sum"].values).size == 1
    with gs.Profiler(ONE_PASS) as user:
        for i in range(100):
            with gs.range(f"r{i}"):
                launch(x)
    u = user.dataset
    assert u.sizes["range"] == 100 and u.attrs["image_flushes"] == 1
    assert sorted(u.name.values.tolist()) == sorted(f"r{i}" for i in range(100))
    assert np.unique(u["smsp__inst_executed.sum"].values).size == 1


def test_pm_and_pc_sampling_after_a_kept_profiler(x):
    one_range(x)
    assert _keep.kept_devices() == [0]
    with gs.sample(ONE_PASS, interval="100us") as s:
        for _ in range(50):
            launch(x)
        cuda.synchronize()
    # the range profiler was released; the sampler is kept with its evaluation workers
    assert _keep.kept_devices() == [0] and _keep._kept[0].key[0] == "pm" and s.dataset.sizes["time"] > 5
    one_range(x)  # releases the kept sampler (its workers stopped) and keeps its own profiler
    assert _keep.kept_devices() == [0] and _keep._kept[0].key[0] != "pm"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gs.GpuscopeWarning)
        with gs.pc_sample() as pc:
            for _ in range(5):
                fma_never_profiled[4096, 256](x, 2000)
            cuda.synchronize()
    functions = set(map(str, pc.records.function))
    assert any("fma_never_profiled" in f for f in functions), functions
    assert one_range(x).attrs.get("profiler_reused", 0) == 0  # released by the PC sampler, made again


def test_process_exit_with_a_kept_profiler_leaves_the_counters_free(tmp_path):
    script = tmp_path / "keep_and_exit.py"
    script.write_text(textwrap.dedent("""
        import numpy as np
        from numba import cuda
        import gpuscope as gs
        from gpuscope._gpu import keep as _keep

        from benchmarks.workloads import tiny

        x = cuda.to_device(np.ones(1 << 16, np.float32))
        with gs.Profiler(["smsp__inst_executed.sum"]) as prof:
            with gs.range("r"):
                tiny[256, 256](x)
        print("kept", _keep.kept_devices(), int(prof.dataset["smsp__inst_executed.sum"][0]) > 0)
    """))
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().endswith("kept [0] True")
    # the counters are free for the next profiler: a PM sampler here starts
    with gs.sample(ONE_PASS, interval="100us") as s:
        x = cuda.to_device(np.ones(1 << 20, np.float32))
        for _ in range(20):
            launch(x)
        cuda.synchronize()
    assert s.dataset.sizes["time"] > 0


def test_release_gives_the_counters_back(x):
    one_range(x)
    assert gs.release() == 1 and _keep.kept_devices() == []
    assert gs.release() == 0
    assert one_range(x).attrs.get("profiler_reused", 0) == 0


def pm_session(x, launches=50, evaluate_in="thread"):
    with gs.sample(ONE_PASS, interval="100us", evaluate_in=evaluate_in) as s:
        for _ in range(launches):
            launch(x)
        cuda.synchronize()
    return s.dataset


def worker_pids() -> list[int]:
    """This process's PM evaluation workers alive now."""
    pids = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                boot = b"_pm_sampling.workers" in f.read()
        except (OSError, ValueError, IndexError):
            continue
        if ppid == os.getpid() and boot:
            pids.append(int(entry))
    return sorted(pids)


@pytest.mark.parametrize("evaluate_in", ["thread", "process"])
def test_pm_sampler_kept_between_sessions_then_released_for_range_profiling(x, evaluate_in):
    gs.release()
    first = pm_session(x, evaluate_in=evaluate_in)
    assert first.attrs["sampler_reused"] == 0 and _keep.kept_devices() == [0] and _keep._kept[0].key[0] == "pm"
    assert first.attrs["evaluate_in"] == evaluate_in
    workers = worker_pids()
    assert len(workers) == (2 if evaluate_in == "process" else 0)  # kept with the sampler
    second = pm_session(x, evaluate_in=evaluate_in)
    assert second.attrs["sampler_reused"] == 1 and worker_pids() == workers  # the same workers, none spawned
    assert second.attrs["evaluation_workers_ready"] == len(workers)
    for ds in (first, second):
        assert ds.sizes["time"] > 5 and ds.attrs["lost_samples"] == 0
    a = float(first["smsp__inst_executed.sum"].sum())
    b = float(second["smsp__inst_executed.sum"].sum())
    assert abs(a - b) / a < 0.1  # the same 50 launches, counted by samples of about the same span
    ds = one_range(x)  # the kept sampler holds the counters: the range profiler releases it first
    assert float(ds["smsp__inst_executed.sum"][0]) > 0 and worker_pids() == []  # its workers stopped
    assert pm_session(x, evaluate_in=evaluate_in).attrs["sampler_reused"] == 0


MIXED = """
import json, os, sys
import numpy as np
import cupy as cp
from numba import cuda
import gpuscope as gs
from benchmarks.workloads import fma

def workers():
    pids = []
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat, cmdline = open(f"/proc/{p}/stat").read(), open(f"/proc/{p}/cmdline", "rb").read()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid() and b"_pm_sampling.workers" in cmdline:
            pids.append(int(p))
    return sorted(pids)


hold = int(sys.argv[1])
a = cp.random.rand(2048, 2048, dtype=cp.float32)
(a @ a).sum().item()  # a CuPy GEMM, as the process that crashed ran
held = [cp.ones(1 << 30, dtype=cp.uint8) for _ in range(hold)]
x = cuda.to_device(np.ones(1 << 20, np.float32))
for i in range(int(sys.argv[2])):
    with gs.sample(["smsp__inst_executed.sum", "sm__ctas_launched.sum"], interval="100us") as s:
        for _ in range(20):
            fma[4096, 256](x, 300)
        cuda.synchronize()
        (a @ a).sum().item()
    ds = s.dataset
    print("SESSION", json.dumps({"reused": int(ds.attrs["sampler_reused"]), "evaluate_in": ds.attrs["evaluate_in"],
                                 "samples": int(ds.sizes["time"]), "lost": int(ds.attrs["lost_samples"]),
                                 "inst": float(ds["smsp__inst_executed.sum"].sum()), "workers": workers()}), flush=True)
"""


def test_pm_sessions_with_workers_in_a_row_in_a_process_holding_cupy_and_8_gb(tmp_path):
    """What crashed (SIGSEGV) when a PM sampler was kept without its workers' images: a process that imported CuPy,
    ran a GEMM and holds 8 GB of device arrays, running PM sessions with worker processes one after another. Each
    warm session takes the sampler, its image pool and the same workers back, and counts the same work."""
    cp = pytest.importorskip("cupy")
    free, _ = cp.cuda.runtime.memGetInfo()
    hold = 8 if free > 12 << 30 else max(1, int(free / 2**30) - 4)
    script = tmp_path / "pm_mixed.py"
    script.write_text(MIXED)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""), GPUSCOPE_KEEP="30")
    out = subprocess.run([sys.executable, str(script), str(hold), "6"], capture_output=True, text=True, timeout=600,
                         env=env, cwd=ROOT)
    assert out.returncode == 0, f"exit status {out.returncode} (-11: SIGSEGV)\n{out.stderr[-3000:]}"
    sessions = [json.loads(line[8:]) for line in out.stdout.splitlines() if line.startswith("SESSION ")]
    assert len(sessions) == 6
    assert [s["reused"] for s in sessions] == [0, 1, 1, 1, 1, 1]
    assert all(s["evaluate_in"] == "process" and s["samples"] > 5 for s in sessions)
    assert len(sessions[0]["workers"]) == 2 and all(s["workers"] == sessions[0]["workers"] for s in sessions)
    inst = [s["inst"] for s in sessions]
    assert max(inst) / min(inst) < 1.1, inst  # the same 20 launches each time
