"""The fast Top-Down (PC samples + one range pass) on the H100: accuracy, cost, sample counts, session order.

Run on the GPU machine from the repository root (``source tests/gpu/device_env.sh`` first)::

    python3 benchmarks/bench_fast_topdown.py validate --out fast_validate.json
    python3 benchmarks/bench_fast_topdown.py cost --launches 200 --periods 1024 32768 --out fast_cost.json
    python3 benchmarks/bench_fast_topdown.py periods --out fast_periods.json
    python3 benchmarks/bench_fast_topdown.py together --out fast_together.json
    python3 benchmarks/bench_fast_topdown.py sessions --rounds 30 --out fast_sessions.json
    python3 benchmarks/bench_fast_topdown.py breakdown --launches 200 --out fast_breakdown.json
    python3 benchmarks/bench_fast_topdown.py pcstart --period 8192 --out fast_pcstart.json

``validate``
    Eight kernels with different bottlenecks (memory streaming, an FMA chain, divergent branches, shared-memory
    bank conflicts, a barrier, contended atomics, a tensor-core GEMM through CuPy, a kernel of less than one
    wave): the 7-pass counter Top-Down (``Profiler("topdown", mode="kernel")``, median per kernel) against
    ``gs.profile_fast_topdown`` on the same kernels, node by node in percentage points of IPC_MAX.
``cost``
    End to end (entering the API to holding the Top-Down Dataset) on 200 launches alternating a streaming and
    an FMA kernel: plain, the fast Top-Down at each period, the counter Top-Down (iteration and kernel mode),
    and ncu's whole process on the same launches and metrics (minus the same process run plainly).
``periods``
    PC samples counted, delivered and dropped per sampling period, against the number expected from the
    kernels' GPU time (``cycles x SMs / period``), for short and long kernels.
``together``
    PC sampling inside an open one-pass range session and the other way round, each in a fresh process.
``sessions``
    One process alternating range-profiling and PC-sampling sessions: records delivered per round.
``pcstart``
    A PC sampling block's start, first launch and close against the device buffer's size.
``breakdown``
    Where the fast Top-Down's time goes: three calls in one process (the first pays the process's one-time
    costs), each CUPTI call's time and count, gpuscope's stages, and cProfile's top entries.
    ``--hold-gb G`` holds G GiB of device memory through CuPy first; ``--mixed`` adds a CuPy GEMM and a
    reduction every tenth launch (``cost`` takes both too).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from numba import cuda, float32  # noqa: E402

if __package__:  # imported as benchmarks.bench_fast_topdown
    from benchmarks import workloads  # noqa: E402
else:  # python3 benchmarks/bench_fast_topdown.py, or beside it (sys.path.insert(0, "benchmarks"))
    import workloads  # noqa: E402

THREADS = 256
N_STREAM = 1 << 24
N = 1 << 21


@cuda.jit(lineinfo=True)
def stream(x, y, z, a):
    i = cuda.grid(1)
    if i < x.size:
        z[i] = a * x[i] + y[i]


@cuda.jit(lineinfo=True)
def fma(out, a, b, iters):
    i = cuda.grid(1)
    if i < out.size:
        v0 = out[i]
        v1 = v0 + 1.0
        v2 = v0 + 2.0
        v3 = v0 + 3.0
        for _ in range(iters):
            v0 = v0 * a + b
            v1 = v1 * a + b
            v2 = v2 * a + b
            v3 = v3 * a + b
        out[i] = v0 + v1 + v2 + v3


# the FMA kernel's body under its own name (the Top-Down is per name): launched with fewer blocks than one wave; a
# module attribute of its name here, where PC sampling looks for its cubin
sub_wave = cuda.jit(lineinfo=True)(workloads.renamed(fma.py_func, "sub_wave"))


@cuda.jit(lineinfo=True)
def divergent(out, iters):
    i = cuda.grid(1)
    if i < out.size:
        v = out[i]
        if i % 32 == 0:  # one lane of each warp does the work
            for _ in range(iters):
                v = v * 0.999 + 0.001
        out[i] = v


@cuda.jit(lineinfo=True)
def bank_conflicts(out, iters):
    sh = cuda.shared.array(8192, float32)
    t = cuda.threadIdx.x
    for k in range(32):
        sh[(t * 32 + k) % 8192] = t + k
    cuda.syncthreads()
    acc = float32(0.0)
    for j in range(iters):
        acc += sh[(t * 32 + j) % 8192]  # every lane of a warp in the same bank: 32-way conflict
    i = cuda.grid(1)
    if i < out.size:
        out[i] = acc


@cuda.jit(lineinfo=True)
def barrier(out, iters):
    i = cuda.grid(1)
    t = cuda.threadIdx.x
    v = out[i % out.size]
    for _ in range(iters):
        if t < 32:  # one warp works, the other 31 of the block wait at the barrier
            for _ in range(16):
                v = v * 0.999 + 0.001
        cuda.syncthreads()
    if i < out.size:
        out[i] = v


@cuda.jit(lineinfo=True)
def atomics(counters, iters):
    i = cuda.grid(1)
    for j in range(iters):
        cuda.atomic.add(counters, (i + j) % 16, float32(1.0))  # 16 addresses for the whole grid


class Kernels:
    """Arrays and one launcher per validation kernel (each launch about 0.05-1 ms on an H100)."""

    def __init__(self, with_cupy: bool = True):
        rng = np.random.default_rng(0)
        self.x = cuda.to_device(rng.random(N_STREAM, dtype=np.float32))
        self.y = cuda.to_device(rng.random(N_STREAM, dtype=np.float32))
        self.z = cuda.device_array(N_STREAM, dtype=np.float32)
        self.out = cuda.to_device(np.ones(N, dtype=np.float32))
        self.counters = cuda.to_device(np.zeros(16, dtype=np.float32))
        self.sms = cuda.get_current_device().MULTIPROCESSOR_COUNT
        self.launch = {
            "stream": lambda: stream[(N_STREAM + THREADS - 1) // THREADS, THREADS](self.x, self.y, self.z,
                                                                                  np.float32(2.0)),
            "fma": lambda: fma[N // THREADS, THREADS](self.out, np.float32(0.999), np.float32(0.001), 256),
            "divergent": lambda: divergent[N // THREADS, THREADS](self.out, 512),
            "bank_conflicts": lambda: bank_conflicts[N // 8 // THREADS, THREADS](self.out, 256),
            "barrier": lambda: barrier[2 * self.sms, 1024](self.out, 256),
            "atomics": lambda: atomics[(1 << 18) // THREADS, THREADS](self.counters, 4),
            # less than one wave: half the SMs get one block of 128 threads
            "sub_wave": lambda: sub_wave[self.sms // 2, 128](self.out, np.float32(0.999), np.float32(0.001), 20000),
        }
        if with_cupy:
            import cupy as cp

            a = cp.asarray(rng.random((4096, 4096)), dtype=cp.float16)
            b = cp.asarray(rng.random((4096, 4096)), dtype=cp.float16)
            self.launch["cupy_gemm"] = lambda: cp.matmul(a, b)
        for fn in self.launch.values():
            fn()
        cuda.synchronize()

    def run(self, n: int, names=None):
        for _ in range(n):
            for name in names or self.launch:
                self.launch[name]()
        cuda.synchronize()


def _median_node_table(ds, nodes):
    """Median over launches, per kernel, of each Top-Down node of a per-launch Top-Down Dataset."""
    out = {}
    kernels = [str(k) for k in ds["kernel"].values]
    for k in sorted(set(kernels)):
        sel = [i for i, n in enumerate(kernels) if n == k]
        out[k] = {n: float(np.median(ds[n].values[sel])) for n in nodes if n in ds}
    return out


def cmd_validate(args):
    import gpuscope as gs
    from gpuscope._schema.names import match_kernel

    k = Kernels()
    timings = {}
    periods = args.validate_periods or [args.period]
    fasts = {}
    for period in periods:  # all before the counter run: CUPTI maps kernels for PC sampling at their first launch
        t0 = time.perf_counter()
        fasts[period] = gs.profile_fast_topdown(k.run, args.fast_launches, period=period, check="ignore")
        timings[f"fast_s period={period}"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    with gs.Profiler("topdown", mode="kernel") as prof:
        k.run(args.counter_launches)
    full = gs.topdown(prof.dataset, check="ignore")
    timings["counter_s"] = time.perf_counter() - t0
    counter = None
    by_period = {}
    for period, fast in fasts.items():
        nodes = [n for n in fast.data_vars if n in full.data_vars]
        counter = _median_node_table(full.isel(range=[i for i, n in enumerate(full["kernel"].values) if str(n)]),
                                     nodes)
        ipc_max = float(full.attrs.get("topdown_ipc_max", 4.0))
        rows, worst = [], {}
        for kernel in fast["kernel"].values:
            ref_name = match_kernel(str(kernel), list(counter))
            if ref_name is None:
                worst[str(kernel)] = {"error": f"not in the counter run: {list(counter)}"}
                continue
            ref = counter[ref_name]
            diffs = {}
            for node in nodes:
                f, c = float(fast[node].sel(kernel=kernel)), ref[node]
                diffs[node] = f - c  # both in percent of IPC_MAX: points
                rows.append((str(kernel), node, c, f, diffs[node]))
            node_max = max(diffs, key=lambda n: abs(diffs[n]))
            worst[str(kernel)] = {"node": node_max, "pp": diffs[node_max],
                                  "samples": int(fast["pc_samples"].sel(kernel=kernel)),
                                  "launches": int(fast["launches"].sel(kernel=kernel))}
        by_period[period] = {"worst": worst, "rows": rows, "fast_attrs": {a: str(fast.attrs.get(a)) for a in (
            "kernels_without_pc_samples", "kernels_without_ipc", "pc_total_samples", "pc_dropped_samples")}}
        print(f"## period {period}")
        print("| kernel | node | counter (7 passes, %) | fast (%) | diff (pp of IPC_MAX) |")
        print("|---|---|---|---|---|")
        for kernel, node, c, f, d in rows:
            if abs(c) > 0.025 or abs(f) > 0.025:
                print(f"| {kernel} | {node} | {c:.2f} | {f:.2f} | {d:+.1f} |")
        for kernel, w in worst.items():
            print("WORST", period, kernel, w)
        print("ATTRS", period, by_period[period]["fast_attrs"])
    result = {"ipc_max": ipc_max, "periods": periods, "fast_launches": args.fast_launches,
              "counter_launches": args.counter_launches, "timings": timings, "by_period": by_period,
              "counter_kernels": list(counter)}
    print("COUNTER KERNELS", list(counter), "TIMINGS", timings)
    return result


class Pair:
    """The cost workload: alternating a streaming kernel (3 x 64 MiB) and an FMA kernel; with *mixed*, every
    tenth launch is instead a CuPy GEMM (cuBLAS, 2048^2 fp32) then a CuPy sum (a CUB reduction)."""

    def __init__(self, mixed: bool = False):
        self.k = Kernels(with_cupy=False)
        self.mixed = mixed
        if mixed:
            import cupy as cp

            a = cp.random.default_rng(0).random((2048, 2048), dtype=cp.float32)
            self._library = lambda: (cp.matmul(a, a), a.sum())
            self._library()

    def run(self, n):
        for i in range(n):
            if self.mixed and i % 10 == 9:
                self._library()
            else:
                self.k.launch["stream" if i % 2 == 0 else "fma"]()
        cuda.synchronize()


def _hold(gib: float):
    """Hold *gib* GiB of device memory through CuPy (as a process with a model or a dataset resident does)."""
    if not gib:
        return None
    import cupy as cp

    block = cp.ones(int(gib * (1 << 30)) // 4, dtype=cp.float32)
    cp.cuda.runtime.deviceSynchronize()
    return block


def _timed(fn, repeats):
    times = []
    for _ in range(repeats):
        cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), times


def cmd_cost(args):
    import gpuscope as gs

    held = _hold(args.hold_gb)  # noqa: F841  (kept alive for the whole run)
    w = Pair(mixed=args.mixed)
    n = args.launches
    plain, _ = _timed(lambda: w.run(n), 5)
    out = {"launches": n, "plain_s": plain, "hold_gib": args.hold_gb, "mixed": args.mixed, "cases": {}}

    def fast(period):
        return gs.profile_fast_topdown(w.run, n, period=period, check="ignore")

    def counter(mode):
        def go():
            if mode == "iteration":
                with gs.Profiler("topdown", mode="iteration") as prof:
                    for _ in range(prof.passes + 1):
                        with gs.range("step"):
                            w.run(n)
                executions = prof.passes + 1
            else:
                with gs.Profiler("topdown", mode="kernel") as prof:
                    w.run(n)
                executions = 1
            gs.aggregate(gs.topdown(prof.dataset, check="ignore"), by="kernel")
            return executions
        return go

    cases = {f"fast period={p}": (lambda p=p: fast(p), 2) for p in args.periods}
    cases["counter topdown, iteration mode"] = (counter("iteration"), None)
    if not args.skip_kernel_mode:
        cases["counter topdown, kernel mode"] = (counter("kernel"), 1)
    for name, (fn, executions) in cases.items():
        times = []
        for _ in range(args.repeats):
            cuda.synchronize()
            t0 = time.perf_counter()
            r = fn()
            times.append(time.perf_counter() - t0)
        execs = executions if executions is not None else r
        t = statistics.median(times)
        out["cases"][name] = {"end_to_end_s": t, "times": times, "executions_of_work": execs,
                              "ms_per_launch": 1e3 * (t - plain * execs) / n}
        if "pc_total_samples" in getattr(r, "attrs", {}):
            out["cases"][name]["samples"] = int(r.attrs["pc_total_samples"])
            out["cases"][name]["dropped"] = int(r.attrs["pc_dropped_samples"])
            out["cases"][name]["samples_per_launch"] = [float(v) for v in r["samples_per_launch"].values]
        print(name, out["cases"][name]["ms_per_launch"], "ms/launch", [round(x, 3) for x in times], flush=True)

    ncu = args.ncu
    if ncu and Path(ncu).exists():
        metrics = list(gs.metric_set("topdown").metrics)
        base_cmd = [sys.executable, __file__, "workload", "--launches", str(n)]
        t0 = time.perf_counter()
        subprocess.run(base_cmd, capture_output=True, timeout=300)
        plain_proc = time.perf_counter() - t0
        cmd = [ncu, "--metrics", ",".join(metrics), "--clock-control", "none", "--cache-control", "none", *base_cmd]
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.ncu_timeout)
            ncu_s = time.perf_counter() - t0
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            ncu_s, rc = float("nan"), "timeout"
        out["ncu"] = {"cmd": " ".join(cmd), "process_s": ncu_s, "plain_process_s": plain_proc, "rc": rc,
                      "ms_per_launch": 1e3 * (ncu_s - plain_proc) / n}
        print("NCU", out["ncu"]["ms_per_launch"], "ms/launch; process", ncu_s, "plain", plain_proc, flush=True)
    return out


WATCHED = ("cuptiRangeProfilerStart", "cuptiRangeProfilerStop", "cuptiRangeProfilerSetConfig",
           "cuptiPCSamplingDisable", "cuptiPCSamplingEnable", "cuptiPCSamplingGetData")


def _cupti_call_timer(each: dict | None = None):
    """Time every CUPTI call (by wrapping the one place gpuscope calls them): name -> [seconds, calls]; with
    *each*, also every call's time of the functions in WATCHED (name -> list of seconds)."""
    from gpuscope.cupti import _api

    spent: dict[str, list] = {}
    call = _api._Bound.__call__

    def timed(self, *args):
        t0 = time.perf_counter()
        try:
            return call(self, *args)
        finally:
            dt = time.perf_counter() - t0
            row = spent.setdefault(self.name, [0.0, 0])
            row[0] += dt
            row[1] += 1
            if each is not None and self.name in WATCHED:
                each.setdefault(self.name, []).append(round(dt, 5))

    _api._Bound.__call__ = timed
    return spent


def _stage_timer(spent: dict, targets):
    """Wrap ``(owner, attribute, label)`` callables so each call adds its time to ``spent[label]``."""
    for owner, attr, label in targets:
        fn = getattr(owner, attr)

        def wrapper(*a, _fn=fn, _label=label, **k):
            t0 = time.perf_counter()
            try:
                return _fn(*a, **k)
            finally:
                spent[_label] = spent.get(_label, 0.0) + time.perf_counter() - t0

        setattr(owner, attr, wrapper)


def cmd_breakdown(args):
    import cProfile
    import io
    import pstats

    import gpuscope as gs
    from gpuscope._pc_sampling import fast as _fast
    from gpuscope._pc_sampling import sampler as _pcsampling
    from gpuscope._range_profiling import session as _session
    from gpuscope.cupti import host, profiler, range_profiler
    from gpuscope.metrics import topdown as td

    held = _hold(args.hold_gb)  # noqa: F841
    w = Pair(mixed=args.mixed)
    n = args.launches
    plain, _ = _timed(lambda: w.run(n), 3)
    each: dict[str, list] = {}
    cupti = _cupti_call_timer(each)
    stages: dict[str, float] = {}
    executions: list[float] = []
    run = w.run

    def timed_run(k):
        t0 = time.perf_counter()
        run(k)
        executions.append(round(time.perf_counter() - t0, 4))

    w.run = timed_run
    _stage_timer(stages, [
        (_session.Profiler, "__init__", "Profiler.__init__"),
        (profiler, "pm_counter_availability", "  counter availability"),
        (host.ProfilerHost, "__init__", "  ProfilerHost.__init__"),
        (host.ProfilerHost, "add_metrics", "  ProfilerHost.add_metrics"),
        (host.ProfilerHost, "config_image", "  ProfilerHost.config_image"),
        (_session, "_properties", "  metric properties"),
        (_session.Profiler, "start", "Profiler.start"),
        (range_profiler.RangeProfiler, "__init__", "  RangeProfiler enable"),
        (range_profiler.RangeProfiler, "counter_data_image", "  counter_data_image"),
        (_session.Profiler, "step", "Profiler.step"),
        (_session.Profiler, "_size_image", "  size image"),
        (_session.Profiler, "close", "Profiler.close"),
        (_session.Profiler, "_collect_iterations", "  collect iterations"),
        (_session.Profiler, "_teardown", "  teardown"),
        (_pcsampling.PCSampler, "start", "pc start"),
        (_pcsampling.PCSampler, "close", "pc close"),
        (_fast, "stall_percentages", "stall_percentages"),
        (td, "aggregate", "aggregate"),
        (_fast, "fast_topdown", "fast_topdown (combine)"),
    ])
    calls = []
    for i in range(args.repeats):
        cupti.clear()
        stages.clear()
        each.clear()
        executions.clear()
        prof = cProfile.Profile()
        cuda.synchronize()
        t0 = time.perf_counter()
        prof.enable()
        ds = _fast.profile_fast_topdown(w.run, n, period=args.period, check="ignore")
        prof.disable()
        total = time.perf_counter() - t0
        text = io.StringIO()
        pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(35)
        top = sorted(cupti.items(), key=lambda kv: -kv[1][0])
        row = {"call": i, "end_to_end_s": total, "work_twice_plain_s": 2 * plain,
               "ms_per_launch": 1e3 * (total - 2 * plain) / n,
               "launches_seen": int(ds["launches"].sum()), "kernels": [str(k) for k in ds["kernel"].values],
               "stages_s": {k: round(v, 4) for k, v in stages.items()},
               "cupti_s": {k: [round(v[0], 4), v[1]] for k, v in top[:25]},
               "cupti_total_s": sum(v[0] for v in cupti.values()),
               "executions_s": list(executions), "watched_calls_s": {k: list(v) for k, v in each.items()}}
        calls.append(row)
        print(f"CALL {i}: {total:.3f} s end to end, {row['ms_per_launch']:.2f} ms/launch, "
              f"CUPTI {row['cupti_total_s']:.3f} s", flush=True)
        print("  STAGES", row["stages_s"], flush=True)
        print("  EXECUTIONS", row["executions_s"], "plain", round(plain, 4), "WATCHED",
              {k: v[:8] for k, v in each.items()}, flush=True)
        print("  CUPTI", {k: v for k, v in list(row["cupti_s"].items())[:12]}, flush=True)
        if i == args.repeats - 1:
            print(text.getvalue()[:6000], flush=True)
    # the range profiler's Start in other sessions: the 7-pass set in iteration mode, one-pass user ranges,
    # kernel mode with a filter (Stop/Start around each left-out launch)
    others = {}
    w.run = run
    for label, go in (
        ("topdown iteration (8 executions)", lambda: _iterate(gs, "topdown", w, n)),
        ("launch set, user ranges x3", lambda: _user_ranges(gs, w, n)),
        ("launch set, kernel mode, launch_skip=100", lambda: _kernel_skip(gs, w, n)),
    ):
        each.clear()
        cupti.clear()
        t0 = time.perf_counter()
        go()
        others[label] = {"s": round(time.perf_counter() - t0, 4),
                         "watched_calls_s": {k: (v[:10], round(sum(v), 4), len(v)) for k, v in each.items()}}
        print("OTHER", label, others[label], flush=True)
    launch_times = _launch_times(gs, w, n, args.period)
    return {"launches": n, "plain_s": plain, "hold_gib": args.hold_gb, "mixed": args.mixed, "calls": calls,
            "other_sessions": others, "launch_times": launch_times, "gpuscope": gs.__version__}


def cmd_pcstart(args):
    """The first launch in a pc_sample block waits about 0.3 s (H100): does it depend on the hardware buffer CUPTI
    allocates (default 512 MiB), or on a launch of gpuscope's own before the user's?"""
    import gpuscope as gs

    w = Pair()
    n = args.launches
    rows = []
    for hw in (None, 1 << 29, 1 << 27, 1 << 26, 1 << 24, None):
        names = ["stream" if i % 2 == 0 else "fma" for i in range(n)]
        t0 = time.perf_counter()
        with gs.pc_sample(period=args.period, hardware_buffer_size=hw) as s:
            t1 = time.perf_counter()
            first = None
            for name in names:
                t2 = time.perf_counter()
                w.k.launch[name]()
                first = first if first is not None else time.perf_counter() - t2
            cuda.synchronize()
            t3 = time.perf_counter()
        t4 = time.perf_counter()
        a = s.dataset.attrs
        rows.append({"hardware_buffer_size": hw, "start_s": round(t1 - t0, 4), "first_launch_s": round(first, 4),
                     "launches_s": round(t3 - t1, 4), "close_s": round(t4 - t3, 4), "block_s": round(t4 - t0, 4),
                     "samples": int(a["total_samples"]), "dropped": int(a["dropped_samples"]),
                     "hardware_buffer_full": int(a["hardware_buffer_full"])})
        print("PCSTART", rows[-1], flush=True)
    return rows


def _launch_times(gs, w, n, period):
    """Host time of each launch, and of the synchronisation after them: plain, under PC sampling, and in the
    range pass of an iteration-mode session."""
    names = ["stream" if i % 2 == 0 else "fma" for i in range(n)]

    def loop():
        each = []
        for name in names:
            t0 = time.perf_counter()
            w.k.launch[name]()
            each.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        cuda.synchronize()
        return each, time.perf_counter() - t0

    def summary(each, sync):
        return {"first5_ms": [round(1e3 * t, 3) for t in each[:5]], "median_ms": round(1e3 * statistics.median(each), 3),
                "sum_s": round(sum(each), 4), "sync_s": round(sync, 4)}

    out = {"plain": summary(*loop())}
    with gs.pc_sample(period=period):
        got = loop()
    out["pc_sample"] = summary(*got)
    with gs.Profiler("fast-topdown", mode="iteration") as prof:
        prof.step()
        loop()
        prof.step()
        got = loop()
    out["range pass"] = summary(*got)
    for k, v in out.items():
        print("LAUNCHES", k, v, flush=True)
    return out


def _iterate(gs, metrics, w, n):
    with gs.Profiler(metrics, mode="iteration") as prof:
        for _ in range(prof.passes + 1):
            with gs.range("step"):
                w.run(n)


def _user_ranges(gs, w, n):
    with gs.Profiler("launch", mode="user"):
        for i in range(3):
            with gs.range(f"r{i}"):
                w.run(n // 10)


def _kernel_skip(gs, w, n):
    with gs.Profiler("launch", mode="kernel", launch_skip=100):
        w.run(110)


def _close_timers():
    """Time the parts of PCSampler.close (synchronise, settle, disable, build) by wrapping them."""
    from gpuscope._pc_sampling import sampler as _pcsampling
    from gpuscope.cupti import pc_sampling as C

    spent = {"sync": 0.0, "settle": 0.0, "disable": 0.0, "build": 0.0, "get_data_calls": 0}
    _stage_timer(spent, [(_pcsampling, "_synchronize", "sync"), (_pcsampling.PCSampler, "_settle", "settle"),
                         (_pcsampling.PCSampler, "build", "build"), (C, "disable", "disable")])
    get = _pcsampling._get_data

    def counted(*a):
        spent["get_data_calls"] += 1
        return get(*a)

    _pcsampling._get_data = counted
    return spent


def cmd_periods(args):
    import gpuscope as gs

    spent = _close_timers()

    k = Kernels(with_cupy=False)
    out = []
    clock_khz = cuda.get_current_device().CLOCK_RATE
    for names, launches in ((("stream",), 200), (("fma",), 200), (("sub_wave",), 20), (("stream", "fma"), 100)):
        start, end = cuda.event(), cuda.event()
        start.record()
        k.run(launches, names)
        end.record()
        end.synchronize()
        gpu_ms = cuda.event_elapsed_time(start, end)
        for log2 in args.log2:
            before = dict(spent)
            t0 = time.perf_counter()
            with gs.pc_sample(period=2**log2) as pcs:
                k.run(launches, names)
                t1 = time.perf_counter()
            t2 = time.perf_counter()
            rec = pcs.records
            delivered = int(np.sum(rec.samples))
            expected = gpu_ms * 1e-3 * clock_khz * 1e3 * k.sms / 2**log2
            row = {"kernels": names, "launches": launches, "gpu_ms": gpu_ms, "period_log2": log2,
                   "total": int(rec.total_samples), "delivered": delivered, "dropped": int(rec.dropped_samples),
                   "non_user": int(rec.non_user_kernel_samples), "hw_full": bool(rec.hardware_buffer_full),
                   "expected_at_boost_clock": expected, "block_s": t2 - t0, "close_s": t2 - t1,
                   "close_parts_s": {key: spent[key] - before[key] for key in spent}}
            out.append(row)
            print(row, flush=True)
    return out


_TOGETHER = r"""
import json, sys
sys.path.insert(0, "benchmarks")
import gpuscope as gs
from gpuscope._pc_sampling.fast import FAST_SET
from bench_fast_topdown import Pair
w = Pair()
out = {"order": sys.argv[1]}
try:
    if sys.argv[1] == "pc-inside-sizing-iteration":
        with gs.Profiler(FAST_SET, mode="iteration") as prof:
            prof.step()
            with gs.pc_sample(period=1024) as pcs:
                w.run(20)
            prof.step()
            w.run(20)
    elif sys.argv[1] == "pc-inside-range":
        with gs.Profiler(FAST_SET, mode=sys.argv[2]) as prof:
            with gs.pc_sample(period=1024) as pcs:
                w.run(20)
    else:
        with gs.pc_sample(period=1024) as pcs:
            with gs.Profiler(FAST_SET, mode=sys.argv[2]) as prof:
                w.run(20)
    out["pc_total"] = int(pcs.records.total_samples)
    out["pc_delivered"] = int(pcs.records.samples.sum())
    ds = prof.dataset
    out["ranges"] = int(ds.sizes.get("range", 0))
    out["ipc"] = [float(v) for v in ds["smsp__inst_executed.avg.per_cycle_active"].values[:4]]
except Exception as exc:
    out["error"] = f"{type(exc).__name__}: {exc}"
print("RESULT " + json.dumps(out))
"""


def _in_fresh_process(script: str, *argv: str) -> dict:
    """Run *script* in a new Python process from the repository root; its last ``RESULT <json>`` line, or the exit
    status and the end of its stderr. The warnings it printed are kept."""
    proc = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[1])
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    row = json.loads(line[-1][7:]) if line else {"argv": list(argv), "rc": proc.returncode,
                                                  "stderr": proc.stderr[-1500:]}
    row["warnings"] = [ln for ln in proc.stderr.splitlines() if "Warning" in ln][-5:]
    return row


def cmd_together(args):
    out = []
    for order, mode in (("pc-inside-sizing-iteration", "iteration"), ("pc-inside-range", "kernel"),
                        ("pc-inside-range", "user"), ("range-inside-pc", "kernel"), ("range-inside-pc", "user")):
        row = _in_fresh_process(_TOGETHER, order, mode)
        row["mode"] = mode
        out.append(row)
        print(row, flush=True)
    return out


def cmd_sessions(args):
    import gpuscope as gs

    w = Pair()
    out = []
    kinds = ["kernel", "iteration", "pm", "user"]
    for r in range(args.rounds):
        kind = kinds[r % len(kinds)]
        t0 = time.perf_counter()
        if kind == "pm":
            with gs.sample("pm-default", interval="100us"):
                w.run(20)
        elif kind == "iteration":
            with gs.Profiler("fast-topdown", mode="iteration"):
                for _ in range(2):
                    with gs.range("step"):
                        w.run(20)
        else:
            with gs.Profiler("fast-topdown", mode=kind):
                w.run(20)
        with gs.pc_sample(period=1024) as pcs:
            w.run(20)
        row = {"round": r, "after": kind, "total": int(pcs.records.total_samples),
               "delivered": int(pcs.records.samples.sum()), "records": int(pcs.records.samples.size),
               "s": time.perf_counter() - t0}
        out.append(row)
        print(row, flush=True)
    return out


_FIRST_LAUNCH = r"""
import json, sys
sys.path.insert(0, "benchmarks")
import numpy as np
import gpuscope as gs
from gpuscope._pc_sampling import sampler as _pcsampling
from gpuscope.cupti import pc_sampling as C
from bench_fast_topdown import Pair
parts = []
take = C.SamplingBuffer.take
def logged(self):
    rec = take(self)
    parts.append((int(rec.samples.sum()), rec.total_samples, rec.non_user_kernel_samples))
    return rec
C.SamplingBuffer.take = logged
w = Pair()  # loads and runs both kernels before any CUPTI call
launch = w.k.launch
def pc(names):
    parts.clear()
    with gs.pc_sample(period=1024) as s:
        for _ in range(10):
            for n in names:
                launch[n]()
    per = {}
    for f, n in zip(s.records.function, s.records.samples):
        key = "stream" if "stream" in f else "fma" if "fma" in f else f
        per[key] = per.get(key, 0) + int(n)
    return {"per_kernel": per, "non_user": int(s.records.non_user_kernel_samples),
            "total": int(s.records.total_samples), "parts": list(parts)}
out = {"case": sys.argv[1]}
if sys.argv[1] == "A-then-AB":
    out["first"] = pc(["stream"]); out["second"] = pc(["stream", "fma"])
elif sys.argv[1] == "A-outside-B-then-AB":
    out["first"] = pc(["stream"]); launch["fma"](); out["second"] = pc(["stream", "fma"])
elif sys.argv[1] == "range-A-then-AB":
    with gs.Profiler("fast-topdown", mode="kernel"):
        launch["stream"]()
    out["second"] = pc(["stream", "fma"])
elif sys.argv[1] == "pm-AB-then-AB":
    with gs.sample("pm-default", interval="100us"):
        launch["stream"](); launch["fma"]()
    out["second"] = pc(["stream", "fma"])
print("RESULT " + json.dumps(out))
"""


def cmd_firstlaunch(args):
    out = []
    for case in ("A-then-AB", "A-outside-B-then-AB", "range-A-then-AB", "pm-AB-then-AB"):
        row = _in_fresh_process(_FIRST_LAUNCH, case)
        out.append(row)
        print(row, flush=True)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=["validate", "cost", "periods", "together", "sessions", "firstlaunch", "workload",
                                        "breakdown", "pcstart"])
    ap.add_argument("--hold-gb", type=float, default=0.0)
    ap.add_argument("--mixed", action="store_true")
    ap.add_argument("--skip-kernel-mode", action="store_true",
                    help="cost: leave out kernel replay (it saves and restores every allocation: with --hold-gb 60 "
                         "it did not finish two repeats in 200 s)")
    ap.add_argument("--out")
    ap.add_argument("--launches", type=int, default=200)
    ap.add_argument("--periods", type=int, nargs="+", default=[1024, 32768])
    ap.add_argument("--log2", type=int, nargs="+", default=[10, 12, 13, 14, 15, 17])
    ap.add_argument("--period", type=int, default=1024)
    ap.add_argument("--validate-periods", type=int, nargs="+")
    ap.add_argument("--fast-launches", type=int, default=10)
    ap.add_argument("--counter-launches", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=24)
    ap.add_argument("--ncu", default=shutil.which("ncu") or "/usr/local/cuda/bin/ncu")
    ap.add_argument("--ncu-timeout", type=int, default=240)
    args = ap.parse_args(argv)
    if args.command == "workload":
        Pair().run(args.launches)
        return None
    result = globals()[f"cmd_{args.command}"](args)
    if args.out:
        Path(args.out).write_text(json.dumps({"command": " ".join(sys.argv), "result": result}, indent=1,
                                             default=str))
    return result


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()

