"""Why kernel replay hangs after ``gs.sample(kernels=True)`` (H100, CUPTI 13.0): each variant in a fresh process,
killed after ``--timeout`` seconds; for a hung one, the Python stacks (faulthandler) and, where gdb is installed,
every thread's native stack.

On 2026-11-23 no variant hung (each passed in a fresh process, ``demo_rounds`` in three rounds), and gpuscope's
refusal of kernel replay after ``kernels=True`` was lifted; the probe stays to check other drivers.

    python3 -X faulthandler probes/probe_kernel_records_twice.py [--timeout 40] [--variant NAME]

Variants (each then runs a kernel-mode ``gs.Profiler("launch")`` over two launches):

``none``            nothing before (the control)
``register``        only ``cuptiActivityRegisterCallbacks`` (no activity enabled)
``records``         concurrent-kernel activity enabled around two launches, then disabled and flushed
``sample``          ``gs.sample("pm-default", kernels=True)`` around two launches (what users do)
``sample_nokernels`` ``gs.sample("pm-default")`` without kernel records
``records_thread``  as ``records``, the kernel-mode session's launches from a second Python thread
``sample_topdown``  as ``sample``, then the 7-pass ``topdown`` set (kernel replay saves and restores memory)
``demo_rounds``     the demo's three kernels, three rounds of ``gs.sample(kernels=True)`` with ranges then a
                    kernel-mode ``topdown`` session (what the GPU test process did when it hung)
``demo_rounds_nokernels`` the same without kernel records
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # benchmarks/: workloads, the benchmarks reused

if __package__:  # imported as a module of a package (probes.probe_kernel_records_twice)
    from benchmarks import workloads  # noqa: E402
else:  # python3 probes/probe_kernel_records_twice.py: benchmarks/ is on sys.path
    import workloads  # noqa: E402

VARIANTS = ("none", "register", "records", "sample", "sample_nokernels", "records_thread", "sample_topdown",
            "demo_rounds", "demo_rounds_nokernels")


def run_variant(name: str) -> dict:
    import faulthandler

    import numpy as np
    from numba import cuda

    import gpuscope as gs
    from gpuscope.cupti import activity

    faulthandler.dump_traceback_later(30, exit=False)

    scale = workloads.jit_as("scale", workloads.twice)  # x *= 2, a kernel of its own named scale

    x = cuda.to_device(np.ones(1 << 20, dtype=np.float32))

    def launch(n=2):
        for _ in range(n):
            scale[(x.size + 255) // 256, 256](x)
        cuda.synchronize()

    launch()
    if name.startswith("demo_rounds"):
        return _demo_rounds(gs, kernels=name == "demo_rounds")
    t0 = time.perf_counter()
    if name == "register":
        activity._f.cuptiActivityRegisterCallbacks(activity._on_requested, activity._on_completed)
        activity._registered.extend([activity._on_requested, activity._on_completed])
    elif name in ("records", "records_thread"):
        rec = activity.KernelRecords()
        rec.open()
        launch()
        rec.close()
    elif name in ("sample", "sample_topdown"):
        with gs.sample("pm-default", interval="100us", kernels=True):
            launch()
    elif name == "sample_nokernels":
        with gs.sample("pm-default", interval="100us"):
            launch()
    before = time.perf_counter() - t0
    print("before done", round(before, 3), flush=True)
    t0 = time.perf_counter()
    with gs.Profiler("topdown" if name == "sample_topdown" else "launch", mode="kernel") as prof:
        if name == "records_thread":
            t = threading.Thread(target=launch)
            t.start()
            t.join()
        else:
            launch()
    faulthandler.cancel_dump_traceback_later()
    return {"variant": name, "before_s": before, "kernel_mode_s": time.perf_counter() - t0,
            "ranges": int(prof.dataset.sizes.get("range", 0))}


def _demo_rounds(gs, kernels: bool) -> dict:
    import faulthandler

    from numba import cuda

    from gpuscope._commands import demo as _demo

    work = _demo.build_workload(n=1 << 22, fma_iters=500)
    for name in _demo.PHASES:
        work.launch(name)
    cuda.synchronize()
    times = []
    for r in range(3):
        faulthandler.dump_traceback_later(25, exit=False)
        t0 = time.perf_counter()
        with gs.sample("pm-default", interval="100us", kernels=kernels):
            for name in _demo.PHASES:
                with gs.range(name):
                    for _ in range(200):
                        work.launch(name)
                    cuda.synchronize()
        t1 = time.perf_counter()
        print(r, "sampled", round(t1 - t0, 3), flush=True)
        with gs.Profiler("topdown", mode="kernel"):
            for name in _demo.PHASES:
                work.launch(name)
            cuda.synchronize()
        print(r, "kernel mode", round(time.perf_counter() - t1, 3), flush=True)
        times.append((t1 - t0, time.perf_counter() - t1))
        faulthandler.cancel_dump_traceback_later()
    return {"variant": "demo_rounds" if kernels else "demo_rounds_nokernels", "rounds_s": times}


def _native_stacks(pid: int) -> str:
    gdb = shutil.which("gdb")
    if not gdb:
        return "(no gdb)"
    proc = subprocess.run([gdb, "-p", str(pid), "-batch", "-ex", "thread apply all bt 14"], capture_output=True,
                          text=True, timeout=60)
    return proc.stdout[-12000:]


def drive(timeout: float, variants) -> list[dict]:
    rows = []
    for name in variants:
        child = subprocess.Popen([sys.executable, "-X", "faulthandler", __file__, "--variant", name],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 cwd=Path(__file__).resolve().parents[1])
        try:
            out, err = child.communicate(timeout=timeout)
            row = {"variant": name, "rc": child.returncode, "hung": False}
        except subprocess.TimeoutExpired:
            stacks = _native_stacks(child.pid)
            child.kill()
            out, err = child.communicate()
            row = {"variant": name, "rc": None, "hung": True, "native": stacks}
        lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
        if lines:
            row.update(json.loads(lines[-1][7:]))
        row["stdout"] = out[-600:]
        row["stderr"] = err[-5000:]
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k not in ("native", "stderr", "stdout")}), flush=True)
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variant", choices=VARIANTS)
    ap.add_argument("--only", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    ap.add_argument("--timeout", type=float, default=40)
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.variant:
        print("RESULT " + json.dumps(run_variant(args.variant)), flush=True)
        os._exit(0)
    rows = drive(args.timeout, args.only)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
