"""Probe: CUPTI's own costs under gpuscope's modes, driven through the ctypes shim by hand.

Per range and per pass with auto ranges + user replay (``breakdown``: Start, Stop, decode, per launch),
unprofiled launches (``floor``, ``sfloor``), and kernel replay per process kind (the kinds and kernels of
``bench_replay_modes.py``). Each case runs in its own process (a CuPy module, once loaded, stays loaded)::

    python3 probes/probe_replay.py all --cases base:breakdown,base:floor,base:sfloor --out probe.json
    python3 probes/probe_replay.py case cupy_cg               # one case, in this process
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))  # benchmarks/: workloads, the benchmarks reused
from bench_replay_modes import setup, workload  # noqa: E402  (the same kernels and process states)


def kernel_mode(run, launches, mode="kernel"):
    import gpuscope as gs

    t0 = time.perf_counter()
    prof = gs.Profiler("topdown", mode=mode, max_ranges=launches + 8, progress=False)
    prof.start()
    t1 = time.perf_counter()
    run(launches)
    t2 = time.perf_counter()
    prof.close()
    t3 = time.perf_counter()
    ds = prof.dataset
    td = gs.topdown(ds)
    t4 = time.perf_counter()
    return {"start_s": t1 - t0, "loop_s": t2 - t1, "close_s": t3 - t2, "dataset_topdown_s": t4 - t3,
            "total_s": t4 - t0, "rows": int(ds.sizes["range"]), "td_vars": len(td.data_vars)}


def auto_user(run, iter_launches, iterations):
    """Auto ranges + user replay driven by hand: pass k on iteration k (the iteration-mode mechanism)."""
    from gpuscope.cupti import range_profiler
    from gpuscope.cupti._types import ProfilerRange, ReplayMode

    t0 = time.perf_counter()
    ctx, h, cfg, metrics, passes = _session("topdown")
    rp = range_profiler.RangeProfiler(ctx.handle)
    img = rp.counter_data_image(metrics, iter_launches + 8)
    rp.set_config(cfg, img, ProfilerRange.AUTO, ReplayMode.USER, iter_launches + 8, 1, 1, 0, 1)
    t1 = time.perf_counter()
    results, pass_s, decode_s, eval_s = 0, [], 0.0, 0.0
    for it in range(iterations):
        a = time.perf_counter()
        rp.start()
        run(iter_launches)
        r = rp.stop()
        pass_s.append(time.perf_counter() - a)
        if r.all_passes_submitted:
            a = time.perf_counter()
            rp.decode()
            b = time.perf_counter()
            for i in range(range_profiler.num_ranges(img)):
                h.evaluate(img, i, metrics)
                results += 1
            rp.initialize_counter_data(img)
            decode_s += b - a
            eval_s += time.perf_counter() - b
    t2 = time.perf_counter()
    _close(ctx, h, rp)
    t3 = time.perf_counter()
    return {"passes": passes, "start_s": t1 - t0, "loop_s": t2 - t1, "close_s": t3 - t2, "total_s": t3 - t0,
            "results": results, "pass_median_s": sorted(pass_s)[len(pass_s) // 2], "decode_s": decode_s,
            "eval_s": eval_s}


def unprofiled_floor(run_tiny, launches=2000):
    """Per-launch cost of unprofiled launches: nothing, Python launch callback, user-range profiler started."""
    from gpuscope.cupti import callbacks, range_profiler
    from gpuscope.cupti._types import ProfilerRange, ReplayMode

    def per(fn):
        best = []
        for _ in range(3):
            t = time.perf_counter(); fn(launches); best.append(time.perf_counter() - t)
        return min(best) / launches * 1e6

    out = {"plain_us": per(run_tiny)}
    rec = callbacks.LaunchRecorder(lambda launch: None)
    out["callback_us"] = per(run_tiny)
    rec.close()
    ctx, h, cfg, metrics, _ = _session(["smsp__inst_executed.sum", "sm__ctas_launched.sum"])
    rp = range_profiler.RangeProfiler(ctx.handle)
    img = rp.counter_data_image(metrics, 64)
    rp.set_config(cfg, img, ProfilerRange.USER, ReplayMode.USER, 64, 1, 1, 0, 1)
    out["enabled_not_started_us"] = per(run_tiny)
    rp.start()
    out["user_started_us"] = per(run_tiny)
    rp.stop()
    rp.decode()
    out["after_stop_us"] = per(run_tiny)
    # cost of one start/push/pop/stop/decode cycle on a 1-pass config, around one tiny launch
    cyc = []
    for _ in range(10):
        a = time.perf_counter()
        rp.start(); rp.push_range("r"); run_tiny(1); rp.pop_range(); rp.stop(); rp.decode()
        rp.initialize_counter_data(img)
        cyc.append(time.perf_counter() - a)
    out["user_cycle_ms"] = sorted(cyc)[5] * 1e3
    rp.close()
    # kernel replay, auto range, started
    rp = range_profiler.RangeProfiler(ctx.handle)
    img = rp.counter_data_image(metrics, 8192)
    rp.set_config(cfg, img, ProfilerRange.AUTO, ReplayMode.KERNEL, 8192)
    rp.start()
    out["kernel_started_us_per_profiled"] = per(run_tiny)
    rp.stop()
    ss = []
    for _ in range(10):
        a = time.perf_counter(); rp.start(); rp.stop(); ss.append(time.perf_counter() - a)
    out["kernel_startstop_ms"] = sorted(ss)[5] * 1e3
    _close(ctx, h, rp)
    return out


def _session(metrics):
    from gpuscope._gpu import metric_lists as _lists
    from gpuscope._gpu import device as _device
    from gpuscope.cupti import host, profiler
    from gpuscope.cupti._types import ProfilerType

    ctx = _device.PrimaryContext(0)
    profiler.initialize()
    chip = profiler.chip_name(0)
    metrics = _lists.resolve(metrics, chip, "range")
    h = host.ProfilerHost(chip, ProfilerType.RANGE_PROFILER, profiler.counter_availability(ctx.handle))
    h.add_metrics(metrics)
    cfg = h.config_image()
    ctx.make_current()
    return ctx, h, cfg, metrics, host.num_passes(cfg)


def _close(ctx, h, *rps):
    from gpuscope.cupti import profiler

    for rp in rps:
        rp.close()
    h.close(); profiler.deinitialize(); ctx.close()


def mem_used():
    from cuda.bindings import driver

    _, free, total = driver.cuMemGetInfo()
    return (total - free) / 2**30


def breakdown(run, run_tiny, run_stream):
    """Per-pass and per-range costs of auto range + user replay and user range + user replay."""
    from gpuscope.cupti import range_profiler
    from gpuscope.cupti._types import ProfilerRange, ReplayMode

    out = {}
    for label, metrics in (("topdown", "topdown"), ("onepass", ["smsp__inst_executed.sum", "sm__ctas_launched.sum"])):
        ctx, h, cfg, metrics, passes = _session(metrics)
        for per_pass, fn, kname in ((10, run, "sf"), (2, run, "sf"), (10, run_tiny, "tiny"), (10, run_stream, "stream")):
            rp = range_profiler.RangeProfiler(ctx.handle)
            img = rp.counter_data_image(metrics, 64)
            rp.set_config(cfg, img, ProfilerRange.AUTO, ReplayMode.USER, 64, 1, 1, 0, 1)
            times, starts, stops, decs = [], [], [], []
            for it in range(2 * passes):
                a = time.perf_counter(); rp.start(); b = time.perf_counter()
                fn(per_pass)
                c = time.perf_counter(); r = rp.stop(); d = time.perf_counter()
                times.append(c - b); starts.append(b - a); stops.append(d - c)
                if r.all_passes_submitted:
                    e = time.perf_counter(); rp.decode(); rp.initialize_counter_data(img); decs.append(time.perf_counter() - e)
            rp.close()
            plain_t = min(plain(fn, per_pass) for _ in range(3))
            out[f"{label}_auto_{kname}{per_pass}"] = {
                "passes": passes, "plain_ms": plain_t * 1e3,
                "pass_ms": [round(t * 1e3, 2) for t in times[:passes]],
                "start_ms": round(sorted(starts)[len(starts) // 2] * 1e3, 3),
                "stop_ms": round(sorted(stops)[len(stops) // 2] * 1e3, 3),
                "decode_ms": round(sorted(decs)[len(decs) // 2] * 1e3, 3) if decs else None,
                "per_launch_pass_ms": round((sorted(times)[len(times) // 2] - plain_t) / per_pass * 1e3, 3)}
        # user ranges around each launch, user replay
        rp = range_profiler.RangeProfiler(ctx.handle)
        img = rp.counter_data_image(metrics, 64)
        rp.set_config(cfg, img, ProfilerRange.USER, ReplayMode.USER, 64, 1, 1, 0, 1)
        times = []
        for it in range(2 * passes):
            rp.start()
            b = time.perf_counter()
            for k in range(10):
                rp.push_range(f"k{k}"); run_stream(1) if k % 2 == 0 else run_tiny(1); rp.pop_range()
            times.append(time.perf_counter() - b)
            if rp.stop().all_passes_submitted:
                rp.decode(); rp.initialize_counter_data(img)
        rp.close()
        out[f"{label}_user_pushpop10"] = {"pass_ms": [round(t * 1e3, 2) for t in times[:passes]]}
        _close(ctx, h)
    return out


def stream_floor(run_stream, launches=400):
    """Unprofiled 40-us kernels while a user-range profiler is started (the sample_every floor)."""
    from gpuscope.cupti import range_profiler
    from gpuscope.cupti._types import ProfilerRange, ReplayMode

    def per():
        best = []
        for _ in range(3):
            t = time.perf_counter(); run_stream(launches); best.append(time.perf_counter() - t)
        return min(best) / launches * 1e6

    out = {"plain_us": per()}
    ctx, h, cfg, metrics, passes = _session(["smsp__inst_executed.sum", "sm__ctas_launched.sum"])
    rp = range_profiler.RangeProfiler(ctx.handle)
    img = rp.counter_data_image(metrics, 64)
    rp.set_config(cfg, img, ProfilerRange.USER, ReplayMode.USER, 64, 1, 1, 0, 1)
    out["enabled_us"] = per()
    rp.start()
    out["started_us"] = per()
    rp.push_range("r"); run_stream(1); rp.pop_range()
    out["started_after_range_us"] = per()
    rp.stop(); rp.decode(); rp.initialize_counter_data(img)
    out["stopped_us"] = per()
    _close(ctx, h, rp)
    return out


def plain(run, launches):
    t = time.perf_counter(); run(launches); return time.perf_counter() - t


def case(name: str, launches: int) -> dict:
    kind, _, what = name.partition(":")
    run, run_tiny, run_stream = workload()
    before = mem_used()
    held = setup(kind)  # noqa: F841 - device arrays of the memN kinds, kept for the measurements
    out = {"case": name, "plain_s": plain(run, launches), "mem_before_gib": before, "mem_after_gib": mem_used()}
    if what in ("", "kernel"):
        out["kernel"] = kernel_mode(run, launches)
    if what in ("", "auto_user"):
        out["auto_user"] = auto_user(run, 10, 7 * 3)
        out["plain10_s"] = plain(run, 10)
    if what == "floor":
        out["floor"] = unprofiled_floor(run_tiny)
    if what == "breakdown":
        out["breakdown"] = breakdown(run, run_tiny, run_stream)
    if what == "sfloor":
        out["sfloor"] = stream_floor(run_stream)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=["all", "case"])
    ap.add_argument("name", nargs="?")
    ap.add_argument("--launches", type=int, default=40)
    ap.add_argument("--out", default="probe.json")
    ap.add_argument("--cases", default="base,cupy_import:kernel,cupy_elementwise:kernel,cupy_plain:kernel,"
                    "cupy_cg_noop:kernel,cupy_cg,numba_cg,cupy_gemm:kernel,mem4:kernel,mem16,base:floor")
    args = ap.parse_args()
    if args.what == "case":
        print("RESULT " + json.dumps(case(args.name, args.launches)), flush=True)
        return
    results = []
    for name in args.cases.split(","):
        t = time.perf_counter()
        p = subprocess.run([sys.executable, __file__, "case", name, "--launches", str(args.launches)],
                           capture_output=True, text=True, timeout=300)
        line = next((ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")), None)
        r = json.loads(line[7:]) if line else {"case": name, "rc": p.returncode, "stderr": p.stderr[-1500:]}
        r["wall_s"] = time.perf_counter() - t
        results.append(r)
        summary = {k: r.get(k) for k in ("case", "plain_s", "mem_before_gib", "mem_after_gib")}
        for k in ("kernel", "auto_user"):
            if k in r:
                summary[k] = {kk: (round(v, 3) if isinstance(v, float) else v) for kk, v in r[k].items()}
        for k in ("floor", "stderr", "breakdown", "sfloor"):
            if k in r:
                summary[k] = r[k]
        print(json.dumps(summary), flush=True)
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
