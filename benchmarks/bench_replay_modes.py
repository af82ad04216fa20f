"""What a per-kernel Top-Down costs end to end, per mode and per kind of process, against ncu in the same run.

Run on the GPU machine from the repository root::

    source tests/gpu/device_env.sh; python3 benchmarks/bench_replay_modes.py --launches 200 --out replay.json

Workload: ``--launches`` launches alternating a streaming kernel (3 x 64 MB) and an FMA-chain kernel (Numba).
Each process kind runs in its own child process (a loaded module stays loaded):

* ``base``: only Numba kernels, ~0.7 GB on the device;
* ``cupy_cg``: after one CuPy ``RawModule(enable_cooperative_groups=True)`` kernel (with atomics) has run once;
* ``mem16``: with 16 GB of idle device arrays held.

Per process and mode, the cost per launch is everything the user waits for, from entering ``gs.Profiler`` to
holding ``gs.topdown(prof.dataset)``, minus the same launches run plainly, divided by the launches that got a
Top-Down. Kernel mode profiles the ``--launches`` launches once each. Iteration mode runs them as the body of a
top-level ``gs.range("step")`` once per pass (7 for the Top-Down set): the user's loop repeats that work anyway,
so the plain time of the same 7 executions is subtracted. Where the time goes (start, loop, close, dataset,
topdown) is kept too. ``ncu`` runs the base workload with the same metric list, whole process minus the plain
process. ``--bisect`` adds the cases that find what about a CuPy module makes kernel replay dearer, and the cost
of launches a session does not profile.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

if __package__:  # imported as benchmarks.bench_replay_modes
    from benchmarks import workloads  # noqa: E402
else:  # python3 benchmarks/bench_replay_modes.py, or from probes/probe_replay.py: benchmarks/ is on sys.path
    import workloads  # noqa: E402

ONE_PASS = ["smsp__inst_executed.sum", "sm__ctas_launched.sum", "dram__bytes_read.sum"]
CG_SRC = r"""
#include <cooperative_groups.h>
namespace cg = cooperative_groups;
extern "C" __global__ void cgk(float* x, int* counter, int n) {
    cg::grid_group g = cg::this_grid();
    int i = g.thread_rank();
    if (i < n) { x[i] += 1.0f; atomicAdd(counter, 1); }
    g.sync();
}
"""
PLAIN_SRC = r"""
extern "C" __global__ void plain(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1.0f;
}
"""


def workload():
    """(run, run_tiny, run_stream), each taking a launch count: the stream/FMA loop, tiny launches, short streaming
    launches; compiled and warm."""
    import numpy as np
    from numba import cuda

    work = workloads.StreamFma(1 << 24, random=True)  # stream over 3 x 64 MB, fma over 1 Mi elements
    tiny, t = workloads.tiny, cuda.to_device(np.zeros(1024, np.float32))

    def run(launches):
        work.alternate(launches, 2000)

    def run_tiny(launches):
        for _ in range(launches):
            tiny[4, 256](t)
        cuda.synchronize()

    def run_stream(launches):  # a 4 MB streaming kernel only (about 40 us)
        for _ in range(launches):
            work.stream(work.stream_blocks // 16)
        cuda.synchronize()

    run(2)
    run_tiny(2)
    run_stream(2)
    return run, run_tiny, run_stream


def setup(kind: str):
    """Put this process into the state *kind* names (see the module docstring and ``--bisect``)."""
    if kind == "base":
        return None
    if kind.startswith("mem"):
        import numpy as np
        from numba import cuda

        held = [cuda.device_array(1 << 30, np.uint8) for _ in range(int(kind[3:]))]
        for h in held:
            h[:1] = 1
        return held
    if kind == "numba_cg":
        import numpy as np
        from numba import cuda

        @cuda.jit
        def gsync(x):
            g = cuda.cg.this_grid()
            i = cuda.grid(1)
            if i < x.size:
                x[i] += 1.0
            g.sync()

        gsync[16, 256](cuda.to_device(np.zeros(4096, np.float32)))
        cuda.synchronize()
        return None
    import cupy as cp

    x = cp.zeros(4096, cp.float32)
    if kind == "cupy_import":
        pass
    elif kind == "cupy_elementwise":
        cp.ElementwiseKernel("float32 x", "float32 y", "y = x * 2", "dbl")(x)
    elif kind == "cupy_plain":
        cp.RawModule(code=PLAIN_SRC).get_function("plain")((16,), (256,), (x, cp.int32(4096)))
    elif kind == "cupy_rdc":  # relocatable device code, no cooperative groups
        cp.RawModule(code=PLAIN_SRC, options=("-rdc=true",)).get_function("plain")((16,), (256,), (x, cp.int32(4096)))
    elif kind in ("cupy_cg", "cupy_cg_noop"):
        m = cp.RawModule(code=CG_SRC, options=("-std=c++17",), enable_cooperative_groups=True)
        f = m.get_function("cgk")
        if kind == "cupy_cg":
            f((16,), (256,), (x, cp.zeros(1, cp.int32), cp.int32(4096)))
    elif kind == "cupy_gemm":
        a = cp.random.rand(1024, 1024, dtype=cp.float32)
        (a @ a).sum()
    else:
        raise SystemExit(f"unknown process kind {kind!r}")
    cp.cuda.Device().synchronize()
    return None


def plain_s(run, launches, repeats=3):
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        run(launches)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def timed_session(metrics, mode, body, **options):
    """Run *body(prof)* in a session; the phases of what the user waits for, in seconds."""
    import gpuscope as gs

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t0 = time.perf_counter()
        prof = gs.Profiler(metrics, mode=mode, progress=False, **options)
        t1 = time.perf_counter()
        prof.start()
        t2 = time.perf_counter()
        body(prof)
        t3 = time.perf_counter()
        prof.close()
        t4 = time.perf_counter()
        ds = prof.dataset
        t5 = time.perf_counter()
        if metrics == "topdown":
            gs.topdown(ds)
        t6 = time.perf_counter()
    return {"create_s": t1 - t0, "start_s": t2 - t1, "loop_s": t3 - t2, "close_s": t4 - t3, "dataset_s": t5 - t4,
            "topdown_s": t6 - t5, "total_s": t6 - t0, "rows": int(ds.sizes["range"]), "passes": prof.passes,
            "mode_used": ds.attrs["mode"], "replay_ms_per_launch": ds.attrs.get("replay_ms_per_launch"),
            "warnings": sorted({str(w.message)[:160] for w in caught})}


def modes(kind: str, launches: int) -> dict:
    run, run_tiny, _ = workload()
    held = setup(kind)  # noqa: F841 - kept alive for the measurements
    plain = plain_s(run, launches)
    out = {"kind": kind, "launches": launches, "plain_ms_per_launch": plain / launches * 1e3}

    def kernel_body(prof):
        run(launches)

    r = timed_session("topdown", "kernel", kernel_body, max_ranges=launches + 8)
    r["ms_per_launch"] = (r["total_s"] - plain) / r["rows"] * 1e3
    r["loop_ms_per_launch"] = (r["loop_s"] - plain) / r["rows"] * 1e3
    out["kernel"] = r

    def iteration_body(prof):
        for _ in range(prof.passes):
            with __import__("gpuscope").range("step"):
                run(launches)

    r = timed_session("topdown", "iteration", iteration_body, max_ranges=launches + 8)
    plain_all = plain * r["passes"]
    r["ms_per_launch"] = (r["total_s"] - plain_all) / r["rows"] * 1e3
    r["loop_ms_per_launch"] = (r["loop_s"] - plain_all) / r["rows"] * 1e3
    out["iteration"] = r

    def iteration_default_body(prof):  # max_ranges left to gpuscope: one more, unprofiled, iteration sizes it
        for _ in range(prof.passes + 1):
            with __import__("gpuscope").range("step"):
                run(launches)

    r = timed_session("topdown", "iteration", iteration_default_body)
    plain_all = plain * (r["passes"] + 1)
    r["ms_per_launch"] = (r["total_s"] - plain_all) / r["rows"] * 1e3
    r["loop_ms_per_launch"] = (r["loop_s"] - plain_all) / r["rows"] * 1e3
    out["iteration_sized"] = r

    one = 2 * launches
    plain_one = plain_s(run, one)
    for mode in ("kernel", "iteration"):
        def one_body(prof, mode=mode):
            if mode == "kernel":
                run(one)
            else:
                with __import__("gpuscope").range("step"):
                    run(one)

        r = timed_session(ONE_PASS, mode, one_body, max_ranges=one + 8)
        r["ms_per_launch"] = (r["total_s"] - plain_one) / max(r["rows"], 1) * 1e3
        r["loop_ms_per_launch"] = (r["loop_s"] - plain_one) / max(r["rows"], 1) * 1e3
        out[f"one_pass_{mode}"] = r
    if kind == "base":
        out["filters"] = filtered(run, launches, plain)
        out["unprofiled"] = unprofiled(run_tiny)
    return out


def filtered(run, launches, plain):
    """Kernel mode with kernels='regex:stream': the FMA half runs unprofiled."""
    def body(prof):
        run(launches)

    r = timed_session("topdown", "kernel", body, kernels="regex:stream", max_ranges=launches + 8)
    r["ms_per_profiled_launch"] = (r["total_s"] - plain) / max(r["rows"], 1) * 1e3
    return r


def unprofiled(run_tiny, launches=4000):
    """Cost of launches a session does not profile (tiny kernels, launch-bound), per launch, in microseconds."""
    import gpuscope as gs

    out = {"plain_us": plain_s(run_tiny, launches) / launches * 1e6}
    metrics = ["sm__ctas_launched.sum"]
    for label, mode, opts in (("kernel_excluded", "kernel", {"exclude": "regex:tiny"}),
                              ("iteration_outside", "iteration", {}),
                              ("user_started", "user", {})):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            prof = gs.Profiler(metrics, mode=mode, **opts).start()
            try:
                out[f"{label}_us"] = plain_s(run_tiny, launches) / launches * 1e6
            finally:
                try:
                    prof.close()
                except Exception:
                    pass
    # user mode, sample_every: regions of 20 launches + synchronize, 1 in 100 profiled
    def region():
        run_tiny(20)

    base = plain_s(lambda n: [region() for _ in range(n)], 200) / 200
    prof = gs.Profiler(metrics, sample_every=100).start()
    t = time.perf_counter()
    for _ in range(200):
        with gs.range("step"):
            region()
    sampled = (time.perf_counter() - t) / 200
    prof.close()
    out["sample_every_100_region_overhead_us_per_launch"] = (sampled - base) / 20 * 1e6
    return out


def bisect(kind: str, launches: int) -> dict:
    run, _, _ = workload()
    setup(kind)
    plain = plain_s(run, launches)

    def body(prof):
        run(launches)

    r = timed_session("topdown", "kernel", body, max_ranges=launches + 8)
    return {"kind": kind, "launches": launches, "loop_ms_per_launch": (r["loop_s"] - plain) / launches * 1e3,
            "replay_ms_per_launch": r["replay_ms_per_launch"]}


def run_ncu(ncu, launches, extra=()):
    import gpuscope as gs

    metrics = gs.metric_set("topdown").metrics
    cmd = [ncu, "--metrics", ",".join(metrics), "--csv", "--page", "raw", *extra, sys.executable, __file__,
           "workload", "--launches", str(launches)]
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t
    rows = sum(1 for ln in proc.stdout.splitlines() if ln.startswith('"')) - 2
    return {"cmd": " ".join(cmd[:3]) + " ... " + " ".join(cmd[-4:]), "wall_s": wall, "rows": rows, "rc": proc.returncode}


def child(what: str, kind: str, launches: int) -> dict:
    cmd = [sys.executable, __file__, what, "--kind", kind, "--launches", str(launches)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=580)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    return json.loads(line[7:]) if line else {"kind": kind, "rc": proc.returncode, "stderr": proc.stderr[-2000:]}


def table(results) -> str:
    lines = ["| process | mode | end-to-end ms/launch | loop-only ms/launch | start s | close+dataset+topdown s | rows |",
             "|---|---|---|---|---|---|---|"]
    for r in results.get("processes", []):
        for mode in ("kernel", "iteration", "iteration_sized", "one_pass_kernel", "one_pass_iteration"):
            m = r.get(mode)
            if not m:
                continue
            lines.append(f"| {r['kind']} | {mode} | {m['ms_per_launch']:.2f} | {m['loop_ms_per_launch']:.2f} | "
                         f"{m['create_s'] + m['start_s']:.2f} | {m['close_s'] + m['dataset_s'] + m['topdown_s']:.2f} "
                         f"| {m['rows']} |")
    for n in results.get("ncu", []):
        lines.append(f"| base | ncu {n['setting']} | {n['ms_per_launch']:.2f} | | | | {n['rows']} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", nargs="?", default="all", choices=["all", "modes", "bisect", "workload"])
    ap.add_argument("--kind", default="base")
    ap.add_argument("--kinds", default="base,cupy_cg,mem16")
    ap.add_argument("--launches", type=int, default=200)
    ap.add_argument("--bisect", action="store_true")
    ap.add_argument("--no-ncu", action="store_true")
    ap.add_argument("--ncu", default=shutil.which("ncu") or "/usr/local/cuda/bin/ncu")
    ap.add_argument("--out", default="replay.json")
    args = ap.parse_args()
    if args.what == "workload":
        run, _, _ = workload()
        run(args.launches)
        return
    if args.what in ("modes", "bisect"):
        result = (modes if args.what == "modes" else bisect)(args.kind, args.launches)
        print("RESULT " + json.dumps(result), flush=True)
        return
    results = {"processes": [], "bisect": [], "ncu": []}
    for kind in args.kinds.split(","):
        results["processes"].append(child("modes", kind, args.launches))
        print(json.dumps(results["processes"][-1])[:1500], flush=True)
    if args.bisect:
        for kind in ("base", "cupy_import", "cupy_elementwise", "cupy_plain", "cupy_rdc", "cupy_cg_noop", "cupy_cg",
                     "numba_cg", "cupy_gemm", "mem1", "mem4", "mem16"):
            results["bisect"].append(child("bisect", kind, 40))
            print(json.dumps(results["bisect"][-1]), flush=True)
    if not args.no_ncu and Path(args.ncu).exists():
        t = time.perf_counter()
        subprocess.run([sys.executable, __file__, "workload", "--launches", str(args.launches)], check=True)
        plain_process = time.perf_counter() - t
        for setting, extra in (("default", ()), ("no clock/cache control", ("--clock-control", "none",
                                                                            "--cache-control", "none"))):
            n = run_ncu(args.ncu, args.launches, extra)
            n.update(setting=setting, plain_process_s=plain_process,
                     ms_per_launch=(n["wall_s"] - plain_process) / args.launches * 1e3)
            results["ncu"].append(n)
            print(json.dumps(n), flush=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    print(table(results))


if __name__ == "__main__":
    main()
