"""PM sampling benchmark (run on the GPU): overhead against the plain workload, loss on a long run, and the
shortest interval that samples without loss.

    source tests/gpu/device_env.sh
    python3 benchmarks/bench_pm_sampling.py --out results.json

Workload: a Numba loop alternating a streaming kernel (3 x 64 MB) and an FMA-chain kernel, synchronising every
20 launches. Overhead: median time per launch over --reps interleaved repetitions of --launches launches, plain
and under gpuscope.sample("pm-default") at each interval. Long run: --long-seconds at 20 us, plain and sampled
(the overhead of a long run). Sweep: each of --sweep intervals for --sweep-seconds, counting lost and discarded
samples and hardware-buffer overflows. Evaluation cost per sample on this CPU (the recorded fixture), and DRAM
metrics of both families (dramc__, dram__) over a streaming kernel whose bandwidth is timed.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time

import numpy as np


def make_workload():
    from numba import cuda

    @cuda.jit
    def stream(a, b, c):
        i = cuda.grid(1)
        if i < c.size:
            c[i] = a[i] + 2.0 * b[i]

    @cuda.jit
    def fma(x, n):
        i = cuda.grid(1)
        if i < x.size:
            v = x[i]
            for _ in range(n):
                v = v * 1.000001 + 0.5
            x[i] = v

    n = 16 << 20
    a = cuda.to_device(np.ones(n, np.float32))
    b = cuda.to_device(np.ones(n, np.float32))
    c = cuda.device_array(n, np.float32)
    x = cuda.to_device(np.ones(1 << 20, np.float32))

    def launches(count):
        for k in range(count):
            if k % 2 == 0:
                stream[(n + 255) // 256, 256](a, b, c)
            else:
                fma[((1 << 20) + 255) // 256, 256](x, 2000)
            if k % 20 == 19:
                cuda.synchronize()
        cuda.synchronize()

    def stream_only(count):
        for k in range(count):
            stream[(n + 255) // 256, 256](a, b, c)
        cuda.synchronize()

    def for_seconds(seconds):
        t0 = time.perf_counter()
        k = 0
        while time.perf_counter() - t0 < seconds:
            launches(20)
            k += 20
        return k, time.perf_counter() - t0

    launches(40)  # compile and warm up
    stream_only(2)
    return launches, for_seconds, stream_only, 3 * n * 4  # bytes moved per streaming launch (2 read, 1 written)


def overhead(launches, intervals, count, reps):
    import gpuscope

    times = {"plain": [], **{iv: [] for iv in intervals}}
    lost = {iv: 0 for iv in intervals}
    for _ in range(reps):
        t0 = time.perf_counter()
        launches(count)
        times["plain"].append((time.perf_counter() - t0) / count)
        for iv in intervals:
            with gpuscope.sample("pm-default", iv) as s:
                t0 = time.perf_counter()
                launches(count)
                times[iv].append((time.perf_counter() - t0) / count)
            lost[iv] += s.dataset.attrs["lost_samples"]
    plain = statistics.median(times["plain"])
    rows = {"plain": {"ms_per_launch": plain * 1e3, "overhead_pct": 0.0, "all_ms": [t * 1e3 for t in times["plain"]]}}
    for iv in intervals:
        med = statistics.median(times[iv])
        rows[iv] = {
            "ms_per_launch": med * 1e3,
            "overhead_pct": 100 * (med / plain - 1),
            "all_ms": [t * 1e3 for t in times[iv]],
            "lost_samples": lost[iv],
        }
    return rows


def one_run(for_seconds, interval, seconds, plain=False):
    import gpuscope

    plain_launches = None
    if plain:
        k, work = for_seconds(seconds)
        plain_launches = {"launches": k, "seconds": round(work, 3), "ms_per_launch": 1e3 * work / k}
    with gpuscope.sample("pm-default", interval) as s:
        t_run = time.perf_counter()
        k, work = for_seconds(seconds)
        t_stop = time.perf_counter()
    stop_s = time.perf_counter() - t_stop
    t0 = time.perf_counter()
    ds = s.dataset
    evaluate_s = time.perf_counter() - t0
    n = ds.sizes["time"]
    span_ns = int(ds["end_ns"][-1] - ds["start_ns"][1]) if n > 1 else 0  # the first sample reaches back
    return {
        "interval": interval,
        "seconds": round(work, 3),
        "launches": k,
        "samples": n,
        "expected_samples": round((s.stop_ns - s.start_ns) / s.interval_ns),
        "sampled_span_s": span_ns / 1e9,
        "lost_samples": ds.attrs["lost_samples"],
        "overflows": ds.attrs["overflows"],
        "discarded_samples": ds.attrs["discarded_samples"],
        "decode_errors": ds.attrs["decode_errors"][:300],
        "counter_data_images": ds.attrs["counter_data_images"],
        "samples_per_image": ds.attrs["samples_per_image"],
        "counter_data_pool": ds.attrs["counter_data_pool"],
        "ms_per_launch": 1e3 * work / k,
        "plain": plain_launches,
        "overhead_pct": 100 * ((work / k) / (plain_launches["seconds"] / plain_launches["launches"]) - 1) if plain else None,
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "stop_s": round(stop_s, 3),
        "evaluate_s": round(evaluate_s, 2),
        "median_period_ns": float(np.median(np.diff(ds["start_ns"].values[1:]))) if n > 2 else None,
        "wall_s": round(time.perf_counter() - t_run, 2),
    }


def evaluation_cost(reps=20):
    """µs per sample to evaluate the recorded pm-default fixture: ProfilerHost.evaluate and the Evaluator."""
    from pathlib import Path

    from gpuscope.cupti import host
    from gpuscope.cupti._types import ProfilerType

    pm = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "pm"
    meta = json.loads((pm / "gh100_pm_default.json").read_text())
    image = np.load(pm / "gh100_pm_default_counter_data.npz")["image"]
    n, metrics = meta["completed"], meta["metrics"]
    with host.ProfilerHost("GH100", ProfilerType.PM_SAMPLING) as h:
        t0 = time.perf_counter()
        for i in range(n):
            h.evaluate(image, i, metrics)
        slow = (time.perf_counter() - t0) / n
        ev, out = h.evaluator(metrics), np.empty((n, len(metrics)))
        t0 = time.perf_counter()
        for _ in range(reps):
            ev.evaluate_into(image, 0, n, out)
        fast = (time.perf_counter() - t0) / (n * reps)
    return {"evaluate_us": slow * 1e6, "evaluator_us": fast * 1e6}


DRAM_METRICS = [
    "dramc__read_throughput.avg.pct_of_peak_sustained_elapsed",
    "dramc__write_throughput.avg.pct_of_peak_sustained_elapsed",
    "dram__read_throughput.avg.pct_of_peak_sustained_elapsed",
    "dram__write_throughput.avg.pct_of_peak_sustained_elapsed",
    "dram__bytes_read.sum.per_second",
    "dram__bytes_write.sum.per_second",
    "sm__cycles_active.avg.pct_of_peak_sustained_elapsed",
]


def dram_check(stream_only, bytes_per_launch, launches=4000):
    """Median of each DRAM metric over samples inside a run of streaming kernels, and the bandwidth timed."""
    import gpuscope

    t0 = time.perf_counter()
    stream_only(launches)
    elapsed = time.perf_counter() - t0
    with gpuscope.sample(DRAM_METRICS, "100us") as s:
        with gpuscope.range("stream"):
            stream_only(launches)
    ds = s.dataset
    inside = ds.isel(time=slice(1, None)).where(ds["range"][1:] == "stream", drop=True)
    inside = inside.isel(time=slice(2, -2))  # leave out the samples at the edges of the range
    return {
        "timed_read_bytes_per_s": launches * bytes_per_launch * 2 / 3 / elapsed,
        "timed_write_bytes_per_s": launches * bytes_per_launch / 3 / elapsed,
        "samples": int(inside.sizes["time"]),
        "median": {m: float(inside[m].median()) for m in DRAM_METRICS},
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench_pm_sampling.json")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--launches", type=int, default=2000)
    ap.add_argument("--intervals", nargs="*", default=["100us", "20us"])
    ap.add_argument("--long-seconds", type=float, default=60.0)
    ap.add_argument("--sweep", nargs="*", default=["10us", "5us", "2us", "1us"])
    ap.add_argument("--sweep-seconds", type=float, default=5.0)
    ap.add_argument("--no-dram", action="store_true", help="skip the DRAM metric comparison")
    args = ap.parse_args()

    import gpuscope
    from gpuscope import _device, _sampling

    info = _device.device_info(0)
    launches, for_seconds, stream_only, bytes_per_launch = make_workload()
    results = {"device": info.name, "driver_cuda": "%d.%d" % _device.driver_version(), "args": vars(args)}
    results["evaluation_cost"] = evaluation_cost()
    print(json.dumps(results["evaluation_cost"]), flush=True)
    if not args.no_dram:
        results["dram"] = dram_check(stream_only, bytes_per_launch)
        print(json.dumps(results["dram"], indent=1), flush=True)
    results["overhead"] = overhead(launches, args.intervals, args.launches, args.reps)
    print(json.dumps(results["overhead"], indent=1), flush=True)
    save(args.out, results)
    if args.long_seconds > 0:
        results["long"] = one_run(for_seconds, "20us", args.long_seconds, plain=True)
        print(json.dumps(results["long"], indent=1), flush=True)
        save(args.out, results)
    _sampling.MIN_INTERVAL_NS = 1  # the sweep probes below gpuscope's floor on purpose
    results["sweep"] = []
    for iv in args.sweep:
        try:
            row = one_run(for_seconds, iv, args.sweep_seconds)
        except gpuscope.GpuscopeError as exc:
            row = {"interval": iv, "error": str(exc)[:300]}
        results["sweep"].append(row)
        print(json.dumps(row), flush=True)
        save(args.out, results)
    save(args.out, results)


def save(path, results):
    """Write the results so far (what is done survives a later step being cut off)."""
    with open(path, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
