"""The fixed cost of a gpuscope session, per mode, cold (first in the process) and warm, and `gpuscope run` vs ncu.

Run on the GPU machine from the repository root::

    source tests/gpu/device_env.sh; python3 benchmarks/bench_session_cost.py --out session_cost.json

Each mode runs in a fresh child process: ``--sessions`` sessions one after another (the first is *cold*, the
others *warm*), each around the smallest work the mode can profile: one launch of a 0.5 ms FMA kernel, or one
range around it. For each session it records what the user waits for, from entering the API to holding the
Dataset (and the Top-Down, where the mode gives one), broken into stages (enter, body, exit, Dataset, analysis)
and into CUPTI calls (every call through the shim is timed: ``gpuscope.cupti._api.observe``). Import times of
gpuscope and Numba are taken at the start of each child.

Modes: ``user`` (2 counters, one range), ``kernel1`` / ``kernel`` (one-pass set / Top-Down, kernel replay of one
launch), ``iteration1`` (one-pass set, one one-launch iteration) / ``iteration`` (Top-Down, one one-launch
iteration per pass and one more: the first sizes the image), ``pm`` (PM sampling, 2 counters at 100 us, evaluated in
worker processes, the default: warm sessions take the kept sampler, its image pool and its workers back; each session
records ``sampler_reused``, the workers ready and their PIDs, the same PIDs when kept), ``pc`` (PC sampling),
``pm_thread`` (the same, evaluated in threads, not worker processes), ``fast`` (``profile_fast_topdown`` of one
launch), and ``alternate`` (``kernel``, ``iteration``, ``user``, ``kernel``, ... one after another in one process: each
session changes the configuration, so the range profiler kept from the one before is disabled and a new one
enabled; CUPTI does not let an enabled profiler change configuration, ``probes/probe_config_switch.py``).
The first three sessions are cold (the first of each configuration) and the rest warm; each row says how its
profiler was had (``setup``: kept or enabled). ``--run-breakdown`` times the stages of ``gpuscope run --set topdown
--launch-count 3`` inside its process (the Profiler made, started, its setup thread done, the script, the session's
close, after it, CUPTI calls), and the exit against the plain script's own (timed the same way in its process).
``--process mixed`` runs them in a process that also imported CuPy, ran a CuPy GEMM and holds ``--hold`` GB of device
arrays.

``--run`` adds whole processes: a script run plainly, under ``gpuscope run --set topdown`` (``--launch-count 3``
and every launch), and under ``ncu`` with the same metrics (``-c 3`` and every launch), all in this run, the cases
interleaved ``--repeat`` times; costs are each process's median minus the plain one's, and the median of the
repeats' ratios to ncu's. ``--script`` picks the scripts: ``numba`` (30 steps x 3 Numba kernels), ``held`` (the same
after a CuPy GEMM, holding 16 GB of device arrays) and ``pytorch`` (``bench_auto_pytorch``'s training step, 3 warm-up
steps and ``--steps``). The runs compared with ncu's (``count3``, ``full3``) save nothing, as ncu prints its page;
the others save with ``-o`` (their rows are counted from the file), and ``count3o`` is ``count3`` saving. ``count3``
prints its report, as a user's run does, ``count3n`` is ``count3`` without it, and ``count3b`` is ``count3`` with the
range profiler's first Start made before the script (``GPUSCOPE_FIRST_START_BESIDE=0``), ``count3m`` ``count3`` with
the set's metrics given as a list, whose session is made before the script (CUDA's initialisation, the primary context,
CUPTI's profiler and the config image) while its first Start stays beside it; the other gpuscope cases run with
``--no-report``.
``gpuscope run -c 3`` against ``ncu -c 3`` on all three::

    python3 benchmarks/bench_session_cost.py --modes "" --run --cases plain,count3,count3o,ncu3 --repeat 8 \
        --steps 30 --script numba,held --out run3.json
    python3 benchmarks/bench_session_cost.py --modes "" --run --cases plain,count3,ncu3 --repeat 6 --steps 5 \
        --script pytorch --out run3_torch.json

Warm PM sessions with worker processes, in a plain process and in one that imported CuPy and holds 8 GB of device
arrays (where keeping the sampler without its workers' images crashed, docs/measurements.md)::

    python3 benchmarks/bench_session_cost.py --sessions 9 --modes pm,pm_thread --processes base,mixed --hold 8 \
        --out pm_keep.json

The cold/warm table of docs/measurements.md, with the alternating and PM rows and ncu in the same run::

    python3 benchmarks/bench_session_cost.py --sessions 9 --modes user,kernel,iteration,alternate,pm,pm_thread,fast \
        --run --steps 30 --repeat 2 --cases plain,count3,ncu3 --out session_cost.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ONE_PASS = ["smsp__inst_executed.sum", "sm__ctas_launched.sum"]
MODES = ["user", "kernel1", "kernel", "iteration1", "iteration", "pm", "pm_thread", "pc", "fast", "alternate"]
#: The configurations the alternating modes go through, one per session: Top-Down by kernel replay, Top-Down over 8
#: iterations, a 2-counter user range.
ALTERNATE = ("kernel", "iteration", "user")

SCRIPT = '''
import numpy as np
from numba import cuda

@cuda.jit
def scale(x, a):
    i = cuda.grid(1)
    if i < x.size:
        x[i] = a * x[i]

@cuda.jit
def add(x, y):
    i = cuda.grid(1)
    if i < x.size:
        x[i] += y[i]

@cuda.jit
def fma(x, iters):
    i = cuda.grid(1)
    if i < x.size:
        v = x[i]
        for _ in range(iters):
            v = v * 1.000001 + 0.5
        x[i] = v

import contextlib, sys
if "annotate" in sys.argv[1:]:
    import gpuscope as gs
    body = lambda: gs.range("step")
else:
    body = contextlib.nullcontext
x = cuda.to_device(np.ones(1 << 22, np.float32))
y = cuda.to_device(np.ones(1 << 22, np.float32))
x[:] = 1.0  # a setup kernel before the loop
for step in range(STEPS):
    with body():
        scale[4096, 1024](x, 0.5)
        add[4096, 1024](x, y)
        fma[4096, 1024](x, 200)
cuda.synchronize()
'''


#: What the ``held`` script does before :data:`SCRIPT`'s Numba kernels: a CuPy GEMM, and 16 GB of device arrays held.
HELD = '''
import cupy as cp
_a = cp.random.rand(2048, 2048, dtype=cp.float32)
(_a @ _a).sum().item()
_held = [cp.empty(1 << 30, cp.uint8) for _ in range(16)]
for _h in _held:
    _h[:1] = 1
cp.cuda.Device().synchronize()
'''


class Calls:
    """Seconds per CUPTI call since the last :meth:`take` (through the shim's observer)."""

    def __init__(self):
        from gpuscope.cupti import _api

        self.times = defaultdict(float)
        _api.observe(self._add)

    def _add(self, name, seconds):
        self.times[name.replace("cupti", "")] += seconds

    def take(self) -> dict:
        out = {k: round(v * 1e3, 2) for k, v in sorted(self.times.items(), key=lambda kv: -kv[1]) if v >= 5e-4}
        self.times.clear()
        return out


def _kernel():
    import numpy as np
    from numba import cuda

    @cuda.jit(lineinfo=True)
    def fma(x, iters):
        i = cuda.grid(1)
        if i < x.size:
            v = x[i]
            for _ in range(iters):
                v = v * 1.000001 + 0.5
            x[i] = v

    x = cuda.to_device(np.ones(1 << 20, np.float32))

    def launch():
        fma[4096, 256](x, 2000)

    launch()
    cuda.synchronize()
    return launch, cuda.synchronize


def _mixed(hold_gb: int):
    import cupy as cp
    from numba import cuda

    a = cp.random.rand(2048, 2048, dtype=cp.float32)
    (a @ a).sum().item()
    held = [cuda.device_array(1 << 30, "u1") for _ in range(hold_gb)]
    for h in held:
        h[:1] = 1
    cuda.synchronize()
    return held, a


def session(mode: str, launch, sync) -> dict:
    """One session of *mode* around one launch: seconds per stage."""
    import gpuscope as gs

    t = {}
    t0 = time.perf_counter()
    analysis = None
    if mode in ("user", "kernel1", "kernel", "iteration1", "iteration"):
        metrics = ONE_PASS if mode in ("user", "kernel1", "iteration1") else "topdown"
        kind = {"user": "user", "kernel1": "kernel", "kernel": "kernel"}.get(mode, "iteration")
        extra = {"max_ranges": 16} if mode == "iteration1" else {}
        prof = gs.Profiler(metrics, mode=kind, progress=False, **extra)
        prof.start()
        t1 = time.perf_counter()
        if mode == "user":
            with gs.range("r"):
                launch()
        elif kind == "kernel":
            launch()
        else:
            for _ in range(1 if mode == "iteration1" else prof.passes + 1):  # the first sizes the image
                with gs.range("step"):
                    launch()
        sync()
        t2 = time.perf_counter()
        prof.close()
        t3 = time.perf_counter()
        ds = prof.dataset
        t4 = time.perf_counter()
        if metrics == "topdown":
            analysis = gs.topdown(ds)
    elif mode in ("pm", "pm_thread", "pc"):
        s = (gs.pc_sample() if mode == "pc" else
             gs.sample(ONE_PASS, interval="100us", evaluate_in="thread" if mode == "pm_thread" else "process"))
        s.__enter__()
        t1 = time.perf_counter()
        launch()
        sync()
        t2 = time.perf_counter()
        s.__exit__(None, None, None)
        t3 = time.perf_counter()
        ds = s.dataset
        t4 = time.perf_counter()
    elif mode == "fast":
        t1 = t2 = t3 = t0
        ds = gs.profile_fast_topdown(launch)
        t4 = time.perf_counter()
    else:
        raise ValueError(mode)
    t5 = time.perf_counter()
    t.update(enter_s=t1 - t0, body_s=t2 - t1, exit_s=t3 - t2, dataset_s=t4 - t3, analysis_s=t5 - t4, total_s=t5 - t0)
    rows = ds.sizes.get("range", ds.sizes.get("time", ds.sizes.get("kernel", ds.sizes.get("pc", 0))))
    t = {k: round(v, 4) for k, v in t.items()}
    t["rows"] = int(rows)
    setup = [f"{k}={ds.attrs[k]}" for k in ("profiler_reused",) if k in ds.attrs]
    if mode in ALTERNATE:
        t["config"], t["setup"] = mode, ", ".join(setup) or "enabled"
    if mode in ("pm", "pm_thread"):  # kept or made anew, and which worker processes evaluated (the same when kept)
        t["setup"] = (f"sampler_reused={ds.attrs['sampler_reused']}, {ds.attrs['evaluate_in']}, "
                      f"{ds.attrs['evaluation_workers_ready']} workers, lost {ds.attrs['lost_samples']} samples")
        t["worker_pids"] = _worker_pids()
    if analysis is not None:
        t["topdown_vars"] = len(analysis.data_vars)
    return t


def _worker_pids() -> list[int]:
    """This process's PM evaluation workers alive now (children running gpuscope's worker boot line)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == os.getpid() and b"_pm_sampling.workers" in cmdline:
            pids.append(int(entry))
    return sorted(pids)


def child(mode: str, sessions: int, process: str, hold: int) -> dict:
    t0 = time.perf_counter()
    import gpuscope  # noqa: F401

    t1 = time.perf_counter()
    import numba.cuda  # noqa: F401

    t2 = time.perf_counter()
    launch, sync = _kernel()
    keep = _mixed(hold) if process == "mixed" else None  # noqa: F841  (held while the sessions run)
    out = {"mode": mode, "process": process, "import_gpuscope_s": round(t1 - t0, 3),
           "import_numba_s": round(t2 - t1, 3), "sessions": []}
    calls = Calls()
    for i in range(sessions):
        try:
            r = session(ALTERNATE[i % len(ALTERNATE)] if mode.startswith("alternate") else mode, launch, sync)
        except Exception as exc:
            r = {"error": f"{type(exc).__name__}: {exc}"[:400]}
        r["calls"] = calls.take()
        out["sessions"].append(r)
    t = time.perf_counter()
    import gpuscope.cupti._api as api

    api.observe(None)
    out["atexit_from_s"] = round(t - t0, 3)
    return out


def run_child(mode, sessions, process, hold, timeout=300) -> dict:
    cmd = [sys.executable, __file__, "--child", mode, "--sessions", str(sessions), "--process", process,
           "--hold", str(hold)]
    t = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"mode": mode, "process": process, "error": f"timed out after {timeout} s"}
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
    res = json.loads(line[7:]) if line else {"mode": mode, "process": process, "rc": p.returncode,
                                              "stderr": p.stderr[-1500:]}
    res["process_s"] = round(time.perf_counter() - t, 3)
    return res


RUN_CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
from gpuscope import cli
from gpuscope._commands import run as _run
from gpuscope.cupti import _api
calls = {}
_api.observe(lambda name, s: calls.__setitem__(name, calls.get(name, 0.0) + s))
marks = {"imported": time.perf_counter() - t0}
execute = _run.execute
def timed(*args, **kwargs):
    marks["script_start"] = time.perf_counter() - t0
    try:
        return execute(*args, **kwargs)
    finally:
        marks["script_end"] = time.perf_counter() - t0
_run.execute = timed
import functools
from gpuscope._range_profiling import session as _session
def marked(name, label):  # the end of a Profiler method, wherever it runs (the setup thread's too)
    method = getattr(_session.Profiler, name)
    @functools.wraps(method)  # gpuscope run reads the Profiler's signature
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        finally:
            marks.setdefault(label, time.perf_counter() - t0)
    setattr(_session.Profiler, name, wrapper)
marked("close", "session_closed")
marked("__init__", "session_made")
marked("start", "session_started")
marked("_setup", "setup_done")
code = cli.main(["run", "--set", "topdown", "--launch-count", "3", "--no-report", sys.argv[1]])
marks["done"] = time.perf_counter() - t0
top = dict(sorted(((k, round(v * 1e3, 1)) for k, v in calls.items() if v > 0.005), key=lambda kv: -kv[1]))
print("RUNBREAKDOWN " + json.dumps({"rc": code, "marks": marks, "cupti_ms": top}))
"""

#: The plain script, timed in its process as RUN_CHILD times the profiled one: its end, then the process's exit.
PLAIN_CHILD = r"""
import runpy, sys, time
t0 = time.perf_counter()
sys.argv = sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    print(f"PLAINEND {time.perf_counter() - t0:.4f}", flush=True)
"""


def run_breakdown(steps: int, script: str = "numba") -> dict:
    """Stages of ``gpuscope run --set topdown --launch-count 3`` on *script* (:func:`script_text`), inside its
    process, and the wall time of the plain script's process beside it."""
    tmp = Path(tempfile.mkdtemp(prefix="gpuscope-bench-"))
    path = tmp / f"{script}_script.py"
    path.write_text(script_text(script, steps))
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t = time.perf_counter()
    q = subprocess.run([sys.executable, "-c", PLAIN_CHILD, str(path)], capture_output=True, text=True, env=env,
                       timeout=300)
    plain = time.perf_counter() - t
    plain_end = next((float(ln.split()[1]) for ln in q.stdout.splitlines() if ln.startswith("PLAINEND ")), None)
    t = time.perf_counter()
    p = subprocess.run([sys.executable, "-c", RUN_CHILD, str(path)], capture_output=True, text=True, env=env,
                       timeout=300)
    wall = time.perf_counter() - t
    line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RUNBREAKDOWN ")), None)
    shutil.rmtree(tmp, ignore_errors=True)
    out = json.loads(line[13:]) if line else {"rc": p.returncode, "stderr": p.stderr[-1500:]}
    out.update(script=script, process_wall_s=round(wall, 3), plain_process_wall_s=round(plain, 3),
               plain_script_end_s=plain_end)
    marks = out.get("marks", {})
    if "done" in marks and plain_end is not None:  # the exit after all of gpuscope's work, against the plain one's
        out["exit_s"] = round(wall - marks["done"], 3)
        out["plain_exit_s"] = round(plain - plain_end, 3)
    return out


CASES = ("plain", "count3", "count3o", "count3n", "count3b", "count3m", "auto", "annotated", "kernel", "ncu3", "ncuall",
         "full3", "ncufull3")


def script_text(script: str, steps: int) -> str:
    """The source of a whole-process case's script: ``numba`` (:data:`SCRIPT`), ``held`` (the same in a process that
    first ran a CuPy GEMM and holds 16 GB of device arrays) or ``pytorch`` (3 warm-up steps, then *steps* training
    steps of ``bench_auto_pytorch``'s transformer encoder layer)."""
    if script == "numba":
        return SCRIPT.replace("STEPS", str(steps))
    if script == "held":
        return HELD + SCRIPT.replace("STEPS", str(steps))
    if script == "pytorch":
        from bench_auto_pytorch import SCRIPT as TORCH

        line = "warmup, steps = int(sys.argv[1]), int(sys.argv[2])"
        assert line in TORCH
        return TORCH.replace(line, f"warmup, steps = 3, {steps}")
    raise ValueError(f"unknown script {script!r}: numba, held or pytorch")


def whole_processes(ncu: str | None, steps: int, repeat: int, only: tuple[str, ...] = (),
                    timeout: float = 580, script: str = "numba") -> list[dict]:
    """Plain script, gpuscope run and ncu on the same script, in this run: wall seconds of each process. *only*
    (keys of :data:`CASES`) picks cases; by default kernel mode and ncu are left out above 100 steps. The cases run
    interleaved (each repeat runs every case once, in turn), so that a slow minute of the machine falls on all of
    them; each case's ``over_plain_s`` is its median minus the plain script's, and ``paired_ratio`` (where ncu's
    matching case ran) the median over the repeats of (case - plain) / (ncu - plain) of the same repeat."""
    import gpuscope as gs

    tmp = Path(tempfile.mkdtemp(prefix="gpuscope-bench-"))
    path = tmp / f"{script}_script.py"
    path.write_text(script_text(script, steps))
    metrics = ",".join(gs.metric_set("topdown").metrics)
    py = sys.executable
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "benchmarks"),
                                                      os.environ.get("PYTHONPATH", "")]))
    run = [py, "-m", "gpuscope", "run", "--set", "topdown", "--no-report"]
    cases = [("plain", "plain", [py, str(path)]),
             # as a user runs it: the report printed (ncu prints its page)
             ("count3", "gpuscope run --launch-count 3", [*run[:-1], "--launch-count", "3", str(path)]),
             ("count3o", "gpuscope run --launch-count 3 -o run.nc", [*run[:-1], "--launch-count", "3", str(path)]),
             ("count3n", "gpuscope run --launch-count 3 --no-report", [*run, "--launch-count", "3", str(path)]),
             ("count3b", "gpuscope run --launch-count 3, the first Start before the script",
              ["env", "GPUSCOPE_FIRST_START_BESIDE=0", *run[:-1], "--launch-count", "3", str(path)]),
             # the same metrics as a list: the constructor's CUDA and CUPTI work on the caller's thread, before the
             # script (a set's name lets it run beside the script), the first Start still beside it
             ("count3m", "gpuscope run --launch-count 3, the session made before the script",
              [py, "-m", "gpuscope", "run", "--metrics", metrics, "--launch-count", "3", str(path)]),
             ("auto", "gpuscope run (every launch; auto: the loop found)", [*run, str(path)]),
             ("annotated", "gpuscope run, script with gs.range('step')", [*run, str(path), "annotate"]),
             ("kernel", "gpuscope run --mode kernel (every launch)", [*run, "--mode", "kernel", str(path)]),
             ("full3", "gpuscope run --set full --mode kernel --launch-count 3",
              [py, "-m", "gpuscope", "run", "--set", "full", "--mode", "kernel", "--no-report", "--launch-count", "3",
               str(path)])]
    if ncu:
        cases += [("ncu3", "ncu -c 3", [ncu, "--metrics", metrics, "-c", "3", "--csv", "--page", "raw", py,
                                        str(path)]),
                  ("ncuall", "ncu (every launch)", [ncu, "--metrics", metrics, "--csv", "--page", "raw", py,
                                                    str(path)]),
                  ("ncufull3", "ncu --set full -c 3", [ncu, "--set", "full", "-c", "3", "--csv", "--page", "raw", py,
                                                       str(path)])]
    if script != "numba":  # the annotated variant is the Numba script's
        cases = [c for c in cases if c[0] != "annotated"]
    if only:
        cases = [c for c in cases if c[0] in only or c[0] == "plain"]
    elif steps > 100:  # kernel mode and ncu on every launch take minutes there
        cases = [c for c in cases if c[0] in ("plain", "auto", "annotated")]
    out = [{"case": label, "key": key, "script": script, "steps": steps, "wall_s": [], "rc": 0}
           for key, label, _ in cases]
    for _ in range(repeat):
        for row, (_, _, cmd) in zip(out, cases):
            saved = tmp / "run.nc"
            saved.unlink(missing_ok=True)
            # the cases measured against ncu's do not save (ncu prints its page), the others save to count rows
            saves = cmd[1:3] == ["-m", "gpuscope"] and row["key"] not in ("count3", "count3n", "count3b", "count3m",
                                                                          "full3")
            full = cmd[:-1] + ["-o", str(saved), cmd[-1]] if saves else list(cmd)
            if full[-1] == "annotate":  # the option goes before the script, "annotate" after it
                full = cmd[:-2] + ["-o", str(saved), cmd[-2], "annotate"]
            t = time.perf_counter()
            try:
                p = subprocess.run(full, capture_output=True, text=True, env=env, timeout=timeout)
                if p.returncode:
                    row["rc"], row["stderr"] = p.returncode, p.stderr[-400:]
            except subprocess.TimeoutExpired:
                row["rc"], row["stderr"] = "timeout", f"stopped after {timeout} s"
            row["wall_s"].append(round(time.perf_counter() - t, 3))
            if saved.exists():
                row.update(_rows_of(saved))
            print(json.dumps({k: row[k] for k in ("case", "script", "wall_s", "rc")}), flush=True)
    plain = out[0]["wall_s"]
    ncu_of = {"count3": "ncu3", "count3o": "ncu3", "count3n": "ncu3", "count3b": "ncu3", "count3m": "ncu3",
              "auto": "ncuall", "kernel": "ncuall", "full3": "ncufull3"}
    by_key = {o["key"]: o for o in out}
    for o in out:
        o["over_plain_s"] = round(statistics.median(o["wall_s"]) - statistics.median(plain), 3)
        o["over_plain_best_s"] = round(min(o["wall_s"]) - min(plain), 3)
        other = by_key.get(ncu_of.get(o["key"], ""))
        if other is not None:
            ratios = [(w - p) / (n - p) for w, n, p in zip(o["wall_s"], other["wall_s"], plain) if n > p]
            if ratios:
                o["paired_ratio"] = round(statistics.median(ratios), 3)
                o["paired_ratios"] = [round(r, 3) for r in ratios]
                o["ratio_of_medians"] = round(o["over_plain_s"] / (statistics.median(other["wall_s"]) -
                                                                   statistics.median(plain)), 3)
        if o.get("rows"):
            o["ms_per_row"] = round(o["over_plain_s"] / o["rows"] * 1e3, 1)
    shutil.rmtree(tmp, ignore_errors=True)
    return out


def _rows_of(path: Path) -> dict:
    """Rows of a saved range Dataset, its mode and how its iterations were found (gpuscope run -o)."""
    import gpuscope as gs

    ds = gs.open_dataset(str(path))
    return {"rows": int(ds.sizes.get("range", 0)), "mode": ds.attrs.get("mode", ""),
            "iterations_found_by": ds.attrs.get("iterations_found_by", ""),
            "kernel_rows": int((ds["replay"].values == "kernel").sum()) if "replay" in ds.coords else -1}


def summary(results: dict) -> str:
    lines = ["| process | mode | import gpuscope s | cold: total s (enter/exit/dataset+analysis) | warm: total s "
             "(median) | warm CUPTI calls over 20 ms |", "|---|---|---|---|---|---|"]
    for r in results["modes"]:
        ss = [s for s in r.get("sessions", []) if "total_s" in s]
        if not ss:
            crash = f"exit status {r['rc']}: " if r.get("rc") else ""  # -11: SIGSEGV
            lines.append(f"| {r.get('process')} | {r['mode']} | | error: {crash}"
                         f"{r.get('error') or r.get('sessions') or r.get('stderr', '')[-200:]} | | |")
            continue
        if r["mode"].startswith("alternate"):  # a row per configuration: its first session, and the later ones
            for config in ALTERNATE:
                mine = [s for s in ss if s.get("config") == config]
                if mine:
                    lines.append(_summary_row(r, f"{r['mode']}: {config}", mine[0], mine[1:]))
            continue
        lines.append(_summary_row(r, r["mode"], ss[0], ss[1:]))
    for w in results.get("processes", []):
        ratio = (f", {w['ratio_of_medians']} of ncu's on the medians, paired median {w['paired_ratio']}"
                 if "paired_ratio" in w else "")
        lines.append(f"whole process, {w.get('script', 'numba')} script, {w['steps']} steps: {w['case']}: "
                     f"{w['wall_s']} s, over plain {w['over_plain_s']} s (median){ratio} "
                     f"(rc {w['rc']}; rows {w.get('rows', '-')}, {w.get('ms_per_row', '-')} ms/row, mode "
                     f"{w.get('mode', '-')}, found by {w.get('iterations_found_by', '-')})")
    return "\n".join(lines)


def _summary_row(r: dict, label: str, cold: dict, warm: list) -> str:
    wt = statistics.median(s["total_s"] for s in warm) if warm else float("nan")
    big = {k: v for k, v in (warm[-1]["calls"] if warm else {}).items() if v >= 20}
    how = f" [{warm[-1]['setup']}]" if warm and "setup" in warm[-1] else ""
    return (f"| {r['process']} | {label} | {r['import_gpuscope_s']:.2f} | {cold['total_s']:.3f} "
            f"({cold['enter_s']:.2f}/{cold['exit_s']:.2f}/{cold['dataset_s'] + cold['analysis_s']:.2f}) | "
            f"{wt:.3f}{how} | {big} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--sessions", type=int, default=4)
    ap.add_argument("--process", default="base", choices=["base", "mixed"])
    ap.add_argument("--processes", default="base", help="comma list of process kinds to run the modes in")
    ap.add_argument("--hold", type=int, default=8, help="GB of device arrays a 'mixed' process holds")
    ap.add_argument("--run", action="store_true", help="also time gpuscope run and ncu on a 3-kernel script")
    ap.add_argument("--steps", default="30", help="steps of the 3-kernel script, comma list (e.g. 30,1000)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=580, help="seconds before a process is stopped")
    ap.add_argument("--cases", default="", help=f"comma list of {','.join(CASES)} (default: all; above 100 steps "
                                                "plain, auto and annotated)")
    ap.add_argument("--ncu", default=shutil.which("ncu") or "/usr/local/cuda/bin/ncu")
    ap.add_argument("--script", default="numba", help="comma list of the whole-process scripts: numba (30 steps x 3 "
                    "Numba kernels), held (the same after a CuPy GEMM, 16 GB held) and pytorch (a training step)")
    ap.add_argument("--run-breakdown", action="store_true")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.child, args.sessions, args.process, args.hold)))
        return
    results = {"modes": [], "processes": []}
    for process in args.processes.split(",") if args.modes else []:
        for mode in args.modes.split(","):
            r = run_child(mode, args.sessions, process, args.hold)
            results["modes"].append(r)
            print(json.dumps(r), flush=True)
    if args.run:
        ncu = args.ncu if Path(args.ncu).exists() else None
        for script in args.script.split(","):
            for steps in map(int, str(args.steps).split(",")):
                results["processes"] += whole_processes(ncu, steps, args.repeat,
                                                        tuple(c for c in args.cases.split(",") if c), args.timeout,
                                                        script)
    if args.run_breakdown:
        results["run_breakdown"] = [run_breakdown(int(str(args.steps).split(",")[0]), script)
                                    for script in args.script.split(",")]
        print(json.dumps(results["run_breakdown"]))
    text = summary(results)
    results["summary"] = text
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    print(text)


if __name__ == "__main__":
    main()
