"""Probe: what CUPTI lets a process keep between profiling sessions, and what each set-up call costs.

Drives the ctypes shim by hand (no gpuscope session policy), each case in its own fresh process under a
watchdog, and prints one JSON object per case::

    python3 probes/probe_session_keep.py all --out keep.json
    python3 probes/probe_session_keep.py case keep          # one case, in this process

Cases:

``fresh``
    Every session pays everything: ``cuptiProfilerInitialize``, host object and config image, ``Enable``,
    counter-data image, ``SetConfig``, ``Start``, one range around one launch, ``Stop``, decode, evaluate,
    ``Disable``, ``DeInitialize``. Five one-pass user-range sessions, then three Top-Down kernel-replay ones.
    Shows which costs are paid once per process and which once per enable.
``keep``
    ``Initialize`` and ``Enable`` once; sessions of different kinds (one-pass user range, Top-Down kernel replay,
    Top-Down auto range + user replay over 7 iterations, one-pass again) only set a new config on the kept
    range profiler. Values are compared with the ``fresh`` kind of session.
``keep_pm``
    After a kept (enabled, stopped) range profiler: does PM sampling start (or get HARDWARE_BUSY)? And after
    ``Disable`` (profiler still initialised)?
``keep_pc``
    After a kept range profiler: PC sampling of a kernel that ran under range profiling and of a new kernel.
``disabled_pc``
    The same after ``Disable`` + ``DeInitialize``.
``pc_keep``
    PC sampling enabled once with start/stop control, five sessions of start/launch/stop/drain, against enable,
    configure and disable per session.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # benchmarks/: workloads, the benchmarks reused
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_session_cost import Calls  # noqa: E402  (CUPTI calls timed through the shim's observer)

ONE_PASS = ["smsp__inst_executed.sum", "sm__ctas_launched.sum"]
CASES = ["fresh", "keep", "keep_pm", "keep_pc", "disabled_pc", "pc_keep", "rp_same", "rp_size", "rp_switch",
         "pm_restart", "cubins"]


def kernels():
    import numpy as np
    from numba import cuda

    @cuda.jit(lineinfo=True)
    def fma_a(x, iters):
        i = cuda.grid(1)
        if i < x.size:
            v = x[i]
            for _ in range(iters):
                v = v * 1.000001 + 0.5
            x[i] = v

    @cuda.jit(lineinfo=True)
    def fma_b(x, iters):
        i = cuda.grid(1)
        if i < x.size:
            v = x[i]
            for _ in range(iters):
                v = v * 0.999999 + 0.25
            x[i] = v

    x = cuda.to_device(np.ones(1 << 20, np.float32))

    def a():
        fma_a[4096, 256](x, 2000)

    def b():
        fma_b[4096, 256](x, 2000)

    a(); cuda.synchronize()  # compiled; fma_b is compiled on first use inside a case
    return a, b, cuda.synchronize


def _host(metrics):
    from gpuscope._gpu import metric_lists as _lists
    from gpuscope.cupti import host, profiler
    from gpuscope.cupti._types import ProfilerType

    chip = profiler.chip_name(0)
    metrics = _lists.resolve(metrics, chip, "range")
    h = host.ProfilerHost(chip, ProfilerType.RANGE_PROFILER, profiler.pm_counter_availability(0))
    h.add_metrics(metrics)
    cfg = h.config_image()
    return h, cfg, metrics, host.num_passes(cfg)


def _session(rp, h, cfg, metrics, passes, kind, launch, sync):
    """One session's collection on an enabled range profiler; returns (values of range 0, ms per phase)."""
    from gpuscope.cupti import range_profiler
    from gpuscope.cupti._types import ProfilerRange, ReplayMode

    t = {}
    a = time.perf_counter()
    img = rp.counter_data_image(metrics, 16)
    if kind == "user":
        rp.set_config(cfg, img, ProfilerRange.USER, ReplayMode.USER, 16, 1, 1, 0, 1)
    elif kind == "kernel":
        rp.set_config(cfg, img, ProfilerRange.AUTO, ReplayMode.KERNEL, 16)
    else:
        rp.set_config(cfg, img, ProfilerRange.AUTO, ReplayMode.USER, 16, 1, 1, 0, 1)
    b = time.perf_counter()
    t["image_config_ms"] = (b - a) * 1e3
    if kind == "user":
        rp.start(); c = time.perf_counter(); rp.push_range("r"); launch(); rp.pop_range(); rp.stop()
    elif kind == "kernel":
        rp.start(); c = time.perf_counter(); launch(); rp.stop()
    else:
        c = time.perf_counter()
        for _ in range(passes):
            rp.start(); launch(); r = rp.stop()
        assert r.all_passes_submitted, r
    t["first_start_ms"] = (c - b) * 1e3
    d = time.perf_counter()
    t["body_stop_ms"] = (d - c) * 1e3
    rp.decode()
    values = h.evaluate(img, 0, metrics)
    t["decode_eval_ms"] = (time.perf_counter() - d) * 1e3
    assert range_profiler.num_ranges(img) == 1
    return [float(v) for v in values], {k: round(v, 2) for k, v in t.items()}


def case_fresh(a, b, sync):
    from gpuscope._gpu import device as _device
    from gpuscope.cupti import profiler, range_profiler

    calls = Calls()
    out = []
    for kind, metrics, n in (("user", ONE_PASS, 5), ("kernel", "topdown", 3)):
        for i in range(n):
            t0 = time.perf_counter()
            ctx = _device.PrimaryContext(0)
            profiler.initialize()
            h, cfg, names, passes = _host(metrics)
            ctx.make_current()
            t1 = time.perf_counter()
            rp = range_profiler.RangeProfiler(ctx.handle)
            t2 = time.perf_counter()
            values, t = _session(rp, h, cfg, names, passes, kind, a, sync)
            t3 = time.perf_counter()
            rp.close()
            h.close()
            profiler.deinitialize()
            ctx.close()
            t4 = time.perf_counter()
            out.append({"kind": kind, "session": i, "passes": passes, "init_host_ms": round((t1 - t0) * 1e3, 2),
                        "enable_ms": round((t2 - t1) * 1e3, 2), **t, "close_ms": round((t4 - t3) * 1e3, 2),
                        "total_ms": round((t4 - t0) * 1e3, 2), "values": values[:2], "calls": calls.take()})
    return out


def _kept(sync):
    from gpuscope._gpu import device as _device
    from gpuscope.cupti import profiler, range_profiler

    ctx = _device.PrimaryContext(0)
    profiler.initialize()
    ctx.make_current()
    return ctx, range_profiler.RangeProfiler(ctx.handle)


def case_keep(a, b, sync):
    calls = Calls()
    t0 = time.perf_counter()
    ctx, rp = _kept(sync)
    out = [{"kind": "init+enable", "ms": round((time.perf_counter() - t0) * 1e3, 2), "calls": calls.take()}]
    hosts = {}
    for kind, metrics in (("user", ONE_PASS), ("kernel", "topdown"), ("iteration", "topdown"), ("user", ONE_PASS),
                          ("kernel", "topdown"), ("iteration", "topdown"), ("user", ONE_PASS)):
        t0 = time.perf_counter()
        key = str(metrics)
        if key not in hosts:
            hosts[key] = _host(metrics)
        h, cfg, names, passes = hosts[key]
        t1 = time.perf_counter()
        try:
            values, t = _session(rp, h, cfg, names, passes, kind, a, sync)
        except Exception as exc:
            out.append({"kind": kind, "error": f"{type(exc).__name__}: {exc}", "calls": calls.take()})
            continue
        out.append({"kind": kind, "passes": passes, "host_ms": round((t1 - t0) * 1e3, 2), **t,
                    "total_ms": round((time.perf_counter() - t0) * 1e3, 2), "values": values[:2],
                    "calls": calls.take()})
    t0 = time.perf_counter()
    rp.close()
    out.append({"kind": "disable", "ms": round((time.perf_counter() - t0) * 1e3, 2), "calls": calls.take()})
    return out


def _one_user_session(rp, a, sync):
    h, cfg, names, passes = _host(ONE_PASS)
    values, _ = _session(rp, h, cfg, names, passes, "user", a, sync)
    h.close()
    return values


def case_keep_pm(a, b, sync):
    import gpuscope as gs

    ctx, rp = _kept(sync)
    _one_user_session(rp, a, sync)
    out = {}
    for label in ("kept_enabled", "after_disable"):
        if label == "after_disable":
            t0 = time.perf_counter(); rp.close(); out["disable_ms"] = round((time.perf_counter() - t0) * 1e3, 2)
        try:
            t0 = time.perf_counter()
            with gs.sample(ONE_PASS, interval="100us") as s:
                for _ in range(20):
                    a()
                sync()
            out[label] = {"samples": int(s.dataset.sizes["time"]), "s": round(time.perf_counter() - t0, 3)}
        except Exception as exc:
            out[label] = {"error": f"{type(exc).__name__}: {exc}"[:300]}
    return out


def _pc(a, b, sync):
    import warnings

    import gpuscope as gs

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with gs.pc_sample() as s:
            for _ in range(5):
                a(); b()
            sync()
    r = s.records
    per = {}
    for f, n in zip(r.function.tolist(), r.samples.tolist()):
        per[str(f)[-40:]] = per.get(str(f)[-40:], 0) + int(n)
    return {"records": int(s.records.function.size), "per_function": per,
            "unattributed": int(s.records.non_user_kernel_samples),
            "warnings": [str(w.message)[:160] for w in caught]}


def case_keep_pc(a, b, sync):
    ctx, rp = _kept(sync)
    _one_user_session(rp, a, sync)  # fma_a ran under range profiling; fma_b never ran
    return _pc(a, b, sync)


def case_disabled_pc(a, b, sync):
    from gpuscope.cupti import profiler

    ctx, rp = _kept(sync)
    _one_user_session(rp, a, sync)
    rp.close()
    profiler.deinitialize()
    return _pc(a, b, sync)


def case_pc_keep(a, b, sync):
    from gpuscope._gpu import device as _device
    from gpuscope._pc_sampling.sampler import PCSampler
    from gpuscope.cupti import pc_sampling as C

    calls = Calls()
    out = {"per_session": []}
    for i in range(3):  # gpuscope's sampler as it is: enable, configure, disable per session
        t0 = time.perf_counter()
        s = PCSampler(drain_interval=None)
        s.start(); t1 = time.perf_counter()
        a(); sync()
        s.close(); t2 = time.perf_counter()
        out["per_session"].append({"start_ms": round((t1 - t0) * 1e3, 1), "close_build_ms": round((t2 - t1) * 1e3, 1),
                                   "records": int(s.records.function.size), "calls": calls.take()})
    ctx = _device.PrimaryContext(0)
    ctx.make_current()
    t0 = time.perf_counter()
    C.enable(ctx.handle)
    idx, names = C.stall_reasons(ctx.handle)
    buf = C.SamplingBuffer(10000, len(names))
    sampler = PCSampler(drain_interval=None, start_stop=True)
    sampler.reason_indices, sampler._buffer = idx, buf
    C.set_attributes(ctx.handle, sampler._config())
    out["kept_enable_ms"] = round((time.perf_counter() - t0) * 1e3, 1)
    out["kept_enable_calls"] = calls.take()
    out["kept"] = []
    for i in range(4):
        t0 = time.perf_counter()
        C.start(ctx.handle)
        t1 = time.perf_counter()
        a(); sync()
        C.stop(ctx.handle)
        t2 = time.perf_counter()
        parts = []
        for _ in range(20):
            part = C.get_data(ctx.handle, buf)
            parts.append(part)
            if not part.function.size and not buf.remaining_pcs and len(parts) > 3:
                break
            time.sleep(0.01)
        recs = C.PCRecords.concat(parts)
        out["kept"].append({"start_ms": round((t1 - t0) * 1e3, 2), "stop_ms": round((t2 - t1) * 1e3, 2),
                            "drain_ms": round((time.perf_counter() - t2) * 1e3, 1),
                            "records": int(recs.function.size), "calls": calls.take()})
    t0 = time.perf_counter()
    C.disable(ctx.handle)
    out["kept_disable_ms"] = round((time.perf_counter() - t0) * 1e3, 1)
    out["final_records"] = int(buf.take().function.size)
    buf.release()
    return out


def _log(*what):
    print(*what, file=sys.stderr, flush=True)


def case_rp_same(a, b, sync):
    """One config kept: per session only re-initialise the image (after decode) and Start; also SetConfig again
    with the same image buffer each session."""
    calls = Calls()
    ctx, rp = _kept(sync)
    out = {}
    for metrics, label in ((ONE_PASS, "one_pass"), ("topdown", "topdown")):
        h, cfg, names, passes = _host(metrics)
        from gpuscope.cupti._types import ProfilerRange, ReplayMode

        for ranges in (16, 256):
            img = rp.counter_data_image(names, ranges)
            kind = "user" if metrics == ONE_PASS else "iteration"
            mode = ProfilerRange.USER if kind == "user" else ProfilerRange.AUTO

            def configure():
                rp.set_config(cfg, img, mode, ReplayMode.USER, ranges, 1, 1, 0, 1)

            def session(t0):
                """Every pass of one session, decode, evaluate, re-initialise the image: (stop result, row)."""
                for _ in range(1 if kind == "user" else passes):
                    rp.start()
                    if kind == "user":
                        rp.push_range("r"); a(); rp.pop_range()
                    else:
                        a()
                    r = rp.stop()
                rp.decode()
                v = h.evaluate(img, 0, names)
                rp.initialize_counter_data(img)
                return r, {"ms": round((time.perf_counter() - t0) * 1e3, 2), "v": float(v[0]), "calls": calls.take()}

            rows = []
            for i in range(4):
                t0 = time.perf_counter()
                if i == 0:
                    configure()
                r, row = session(t0)
                assert r.all_passes_submitted
                rows.append(row)
                _log(label, ranges, i, rows[-1]["ms"])
            out[f"{label}_{ranges}_kept"] = rows
            rows = []
            for i in range(3):  # SetConfig again, same image buffer, same config
                t0 = time.perf_counter()
                configure()
                rows.append(session(t0)[1])
                _log(label, ranges, "reconfig", i, rows[-1]["ms"])
            out[f"{label}_{ranges}_setconfig_again"] = rows
            # a new enable per session (Enable is cheap), same image
            rows = []
            for i in range(2):
                t0 = time.perf_counter()
                rp.close()
                from gpuscope.cupti import range_profiler

                rp = range_profiler.RangeProfiler(ctx.handle)
                rp.initialize_counter_data(img)
                configure()
                rows.append(session(t0)[1])
            out[f"{label}_{ranges}_reenable"] = rows
    rp.close()
    return out


def case_rp_size(a, b, sync):
    """First Start after SetConfig, by image size (fresh enable each, after a warm-up session)."""
    from gpuscope.cupti import range_profiler
    from gpuscope.cupti._types import ProfilerRange, ReplayMode

    calls = Calls()
    ctx, rp = _kept(sync)
    rp.close()
    h, cfg, names, passes = _host(ONE_PASS)
    out = []
    for ranges in (16, 16, 64, 256, 1024, 4096, 16):
        rp = range_profiler.RangeProfiler(ctx.handle)
        t0 = time.perf_counter()
        img = rp.counter_data_image(names, ranges)
        t1 = time.perf_counter()
        rp.set_config(cfg, img, ProfilerRange.USER, ReplayMode.USER, ranges, 1, 1, 0, 1)
        t2 = time.perf_counter()
        rp.start()
        t3 = time.perf_counter()
        rp.push_range("r"); a(); rp.pop_range(); rp.stop(); rp.decode()
        t4 = time.perf_counter()
        rp.initialize_counter_data(img)
        t5 = time.perf_counter()
        rp.close()
        out.append({"ranges": ranges, "image_mb": round(img.size / 2**20, 2), "image_ms": round((t1 - t0) * 1e3, 2),
                    "setconfig_ms": round((t2 - t1) * 1e3, 2), "start_ms": round((t3 - t2) * 1e3, 2),
                    "run_decode_ms": round((t4 - t3) * 1e3, 2), "reinit_ms": round((t5 - t4) * 1e3, 2),
                    "disable_ms": round((time.perf_counter() - t5) * 1e3, 2)})
        calls.take()
        _log(out[-1])
    return out


def case_rp_switch(a, b, sync):
    """Kinds of session one after another on one enabled profiler (SetConfig each), progress on stderr."""
    calls = Calls()
    ctx, rp = _kept(sync)
    out = []
    hosts = {}
    for kind, metrics in (("user", ONE_PASS), ("user", "topdown"), ("iteration", "topdown"), ("iteration", ONE_PASS),
                          ("kernel", ONE_PASS), ("user", ONE_PASS)):
        key = str(metrics)
        if key not in hosts:
            hosts[key] = _host(metrics)
        h, cfg, names, passes = hosts[key]
        if kind == "user" and passes > 1:
            continue
        _log("switch to", kind, key)
        try:
            values, t = _session(rp, h, cfg, names, passes, kind, a, sync)
            out.append({"kind": kind, "metrics": key[:20], **t, "v": values[:1], "calls": calls.take()})
        except Exception as exc:
            out.append({"kind": kind, "error": f"{type(exc).__name__}: {exc}"})
        _log(out[-1])
    rp.close()
    return out


def case_pm_restart(a, b, sync):
    """PM sampling: Enable and SetConfig once, then Start/Stop/decode twice; SetConfig cost by hardware buffer."""
    from gpuscope._gpu import metric_lists as _lists
    from gpuscope.cupti import host, pm_sampling as pm, profiler
    from gpuscope.cupti._types import PmTriggerMode, ProfilerType

    calls = Calls()
    profiler.initialize()
    chip = profiler.chip_name(0)
    avail = pm.counter_availability(0) if hasattr(pm, "counter_availability") else profiler.pm_counter_availability(0)
    names = _lists.resolve(ONE_PASS, chip, "sampling")
    cfg = host.config_image(chip, ProfilerType.PM_SAMPLING, names, avail)
    out = {"setconfig_by_buffer": []}
    for mb in (32, 128, 512):
        hnd = pm.enable(0)
        t0 = time.perf_counter()
        pm.set_config(hnd, cfg, mb << 20, 100_000, PmTriggerMode.GPU_TIME_INTERVAL)
        t1 = time.perf_counter()
        img = pm.new_counter_data(hnd, names, 2000)
        t2 = time.perf_counter()
        pm.disable(hnd)
        out["setconfig_by_buffer"].append({"mb": mb, "setconfig_ms": round((t1 - t0) * 1e3, 1),
                                           "image_2000_ms": round((t2 - t1) * 1e3, 1), "image_mb": img.size >> 20,
                                           "disable_ms": round((time.perf_counter() - t2) * 1e3, 1)})
        _log(out["setconfig_by_buffer"][-1])
    calls.take()
    hnd = pm.enable(0)
    pm.set_config(hnd, cfg, 128 << 20, 100_000, PmTriggerMode.GPU_TIME_INTERVAL)
    img = pm.new_counter_data(hnd, names, 4000)
    out["restarts"] = []
    for i in range(3):
        t0 = time.perf_counter()
        pm.start(hnd)
        t1 = time.perf_counter()
        for _ in range(40):
            a()
        sync()
        time.sleep(0.01)
        pm.stop(hnd)
        t2 = time.perf_counter()
        d = pm.decode(hnd, img)
        info = pm.counter_data_info(img)
        t3 = time.perf_counter()
        pm.initialize_counter_data(hnd, img)
        out["restarts"].append({"start_ms": round((t1 - t0) * 1e3, 2), "stop_ms": round((t2 - t1) * 1e3, 2),
                                "decode_ms": round((t3 - t2) * 1e3, 2), "decoded": str(d)[:120],
                                "info": str(info)[:160], "reinit_ms": round((time.perf_counter() - t3) * 1e3, 2),
                                "calls": calls.take()})
        _log(out["restarts"][-1])
    pm.disable(hnd)
    profiler.deinitialize()
    return out


CG_SRC = r"""
#include <cooperative_groups.h>
namespace cg = cooperative_groups;
extern "C" __global__ void cgk(float* x, int n) {
    cg::grid_group g = cg::this_grid();
    int i = g.thread_rank();
    if (i < n) x[i] += 1.0f;
    g.sync();
}
"""
PLAIN_SRC = r"""
extern "C" __global__ void plain(float* x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1.0f;
}
"""


def case_cubins(a, b, sync):
    """Cubins of modules with and without relocatable device code, as CUPTI's module callback sees them: written
    to $OUT/cubins (for the offline detector), with their ELF header facts."""
    import os

    import cupy as cp
    from numba import cuda

    from gpuscope._pc_sampling.source import numba_cubins

    out_dir = Path(os.environ.get("OUT", "/tmp")) / "cubins"
    out_dir.mkdir(parents=True, exist_ok=True)
    found = {}

    @cuda.jit
    def gsync(x):
        g = cuda.cg.this_grid()
        i = cuda.grid(1)
        if i < x.size:
            x[i] += 1.0
        g.sync()

    xs = cuda.to_device(__import__("numpy").zeros(4096, "f4"))
    gsync[16, 256](xs)
    sync()
    for name, disp in (("numba_plain", None), ("numba_gridsync", gsync)):
        if disp is None:
            continue
        for k, cub in enumerate(numba_cubins(disp)):
            (out_dir / f"{name}_{k}.cubin").write_bytes(cub)
            found[f"{name}_{k}"] = len(cub)
    x = cp.zeros(4096, cp.float32)
    mods = {"cupy_plain": cp.RawModule(code=PLAIN_SRC),
            "cupy_rdc": cp.RawModule(code=PLAIN_SRC, options=("-rdc=true",)),
            "cupy_cg": cp.RawModule(code=CG_SRC, enable_cooperative_groups=True)}
    for name, mod in mods.items():
        try:
            fn = mod.get_function("cgk" if name == "cupy_cg" else "plain")
            fn((16,), (256,), (x, cp.int32(4096)))
            cp.cuda.Device().synchronize()
            cub = getattr(mod, "cubin", None)
            if cub is None and hasattr(mod, "module"):
                cub = None
            found[name] = {"has_cubin_attr": cub is not None, "attrs": [n for n in dir(mod) if not n.startswith("__")][:40]}
        except Exception as exc:
            found[name] = f"{type(exc).__name__}: {exc}"[:300]
    from gpuscope._pc_sampling.source import cupy_cache_cubins

    for k, cub in enumerate(cupy_cache_cubins()):
        (out_dir / f"cupy_cache_{k}.cubin").write_bytes(cub)
        found[f"cupy_cache_{k}"] = len(cub)
    return found


def run_case(name: str) -> dict:
    t0 = time.perf_counter()
    import gpuscope  # noqa: F401

    t1 = time.perf_counter()
    import numba.cuda  # noqa: F401

    t2 = time.perf_counter()
    a, b, sync = kernels()
    result = {"case": name, "import_gpuscope_s": round(t1 - t0, 3), "import_numba_s": round(t2 - t1, 3)}
    try:
        result["result"] = globals()[f"case_{name}"](a, b, sync)
    except Exception as exc:
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()[-2000:]
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["all", "case"])
    parser.add_argument("name", nargs="?")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--out")
    parser.add_argument("--timeout", type=float, default=120)
    args = parser.parse_args()
    if args.what == "case":
        print(json.dumps(run_case(args.name)))
        return
    results = []
    for name in args.cases.split(","):
        try:
            p = subprocess.run([sys.executable, __file__, "case", name], capture_output=True, text=True,
                               timeout=args.timeout)
            lines = p.stdout.strip().splitlines()
            res = json.loads(lines[-1]) if p.returncode == 0 and lines else {
                "case": name, "rc": p.returncode, "stderr": p.stderr[-1500:]}
        except subprocess.TimeoutExpired:
            res = {"case": name, "error": f"timed out after {args.timeout} s"}
        results.append(res)
        print(json.dumps(res), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
