"""PM sampling benchmark (run on the GPU): overhead against the plain workload, loss on long runs, the shortest
interval that samples without loss, and what decoding costs per metric.

    source tests/gpu/device_env.sh
    python3 benchmarks/bench_pm_sampling.py --out results.json

A configuration is ``SET@INTERVAL`` (``pm-default@100us``, ``pm-fast@20us``). Workload: a Numba loop alternating a
streaming kernel (3 x 64 MB) and an FMA-chain kernel, synchronising every 20 launches. Overhead: median time per
launch over --reps interleaved repetitions of --launches launches, plain and under each of --configs. Long runs:
each of --long for --long-seconds, with a plain run of the same length first. Sweep: each of --sweep for
--sweep-seconds, counting lost and discarded samples and hardware-buffer overflows. Decode cost: each metric of
pm-default and pm-fast alone (idle GPU, 50 us): counter-data bytes per sample and the time CUPTI's DecodeData
took per sample. Evaluation cost per sample on this CPU (the recorded fixture), and DRAM metrics of both families
(dramc__, dram__) over a streaming kernel whose bandwidth is timed.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time

import numpy as np

if __package__:  # imported as benchmarks.bench_pm_sampling
    from benchmarks import workloads
else:  # python3 benchmarks/bench_pm_sampling.py: benchmarks/ is sys.path[0]
    import workloads


def make_workload():
    from numba import cuda

    work = workloads.StreamFma(16 << 20)

    def launches(count):
        work.alternate(count, 2000, sync_every=20)

    def stream_only(count):
        for k in range(count):
            work.stream()
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
    return launches, for_seconds, stream_only, 3 * work.n * 4  # bytes moved per streaming launch (2 read, 1 written)


def parse_config(config):
    """``"pm-fast@20us"`` -> ``("pm-fast", "20us")``."""
    metrics, _, interval = config.partition("@")
    if not interval:
        raise SystemExit(f"A configuration is SET@INTERVAL, e.g. pm-fast@20us; got {config!r}.")
    return metrics, interval


def overhead(launches, configs, count, reps):
    import gpuscope

    intervals = configs
    times = {"plain": [], **{iv: [] for iv in intervals}}
    lost = {iv: 0 for iv in intervals}
    for _ in range(reps):
        t0 = time.perf_counter()
        launches(count)
        times["plain"].append((time.perf_counter() - t0) / count)
        for iv in intervals:
            with gpuscope.sample(*parse_config(iv)) as s:
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


def one_run(for_seconds, config, seconds, plain=False):
    import gpuscope

    metrics, interval = parse_config(config)
    plain_launches = None
    if plain:
        k, work = for_seconds(seconds)
        plain_launches = {"launches": k, "seconds": round(work, 3), "ms_per_launch": 1e3 * work / k}
    with gpuscope.sample(metrics, interval) as s:
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
        "config": config,
        "interval": interval,
        "metrics": len(s.metrics),
        "seconds": round(work, 3),
        "launches": k,
        "samples": n,
        "expected_samples": round((s.stop_ns - s.start_ns) / s.interval_ns),
        "sampled_span_s": span_ns / 1e9,
        "lost_samples": ds.attrs["lost_samples"],
        "overflows": ds.attrs["overflows"],
        "discarded_samples": ds.attrs["discarded_samples"],
        "full_decodes": ds.attrs["full_decodes"],
        "decode_us_per_sample": ds.attrs["decode_us_per_sample"],
        "decode_load_pct": 100 * ds.attrs["decode_us_per_sample"] * 1e3 / s.interval_ns,
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


def decode_cost(seconds=0.5, interval="50us"):
    """Per metric of pm-default and pm-fast, alone on an idle GPU: counter-data bytes per sample and µs that
    cuptiPmSamplingDecodeData took per sample."""
    import warnings

    import gpuscope
    from gpuscope._gpu import metric_lists as _lists
    from gpuscope.cupti import pm_sampling as pm
    from gpuscope.cupti import profiler

    sets = {name: _lists.resolve(name, "GH100", "sampling") for name in ("pm-default", "pm-fast")}
    metrics = list(dict.fromkeys(sets["pm-default"] + sets["pm-fast"]))
    profiler.initialize()
    handle = pm.enable(0)
    try:
        size = {m: (pm.counter_data_size(handle, [m], 1001) - pm.counter_data_size(handle, [m], 1)) / 1000
                for m in metrics}
        size.update({name: (pm.counter_data_size(handle, ms, 1001) - pm.counter_data_size(handle, ms, 1)) / 1000
                     for name, ms in sets.items()})
    finally:
        pm.disable(handle)
        profiler.deinitialize()
    rows = []
    for name in [*metrics, *sets]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with gpuscope.sample(sets.get(name, [name]), interval) as s:
                time.sleep(seconds)
        a = s.dataset.attrs
        rows.append({"metrics": name, "bytes_per_sample": size[name], "decode_us_per_sample": a["decode_us_per_sample"],
                     "lost_samples": a["lost_samples"]})
        print(json.dumps(rows[-1]), flush=True)
    return rows


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
    ap.add_argument("--configs", nargs="*", default=["pm-default@100us", "pm-fast@20us", "pm-default@20us"])
    ap.add_argument("--long", nargs="*", default=["pm-fast@20us", "pm-default@100us"])
    ap.add_argument("--long-seconds", type=float, default=60.0)
    ap.add_argument("--sweep", nargs="*",
                    default=["pm-default@50us", "pm-default@20us", "pm-fast@10us", "pm-fast@5us"])
    ap.add_argument("--sweep-seconds", type=float, default=3.0)
    ap.add_argument("--no-dram", action="store_true", help="skip the DRAM metric comparison")
    ap.add_argument("--no-decode-cost", action="store_true", help="skip the per-metric decode cost")
    args = ap.parse_args()

    import gpuscope
    from gpuscope._gpu import device as _device
    from gpuscope._pm_sampling import plan as _plan
    info = _device.device_info(0)
    launches, for_seconds, stream_only, bytes_per_launch = make_workload()
    results = {"device": info.name, "driver_cuda": "%d.%d" % _device.driver_version(), "args": vars(args)}
    results["evaluation_cost"] = evaluation_cost()
    print(json.dumps(results["evaluation_cost"]), flush=True)
    if not args.no_decode_cost:
        results["decode_cost"] = decode_cost()
        save(args.out, results)
    if not args.no_dram:
        results["dram"] = dram_check(stream_only, bytes_per_launch)
        print(json.dumps(results["dram"], indent=1), flush=True)
    results["overhead"] = overhead(launches, args.configs, args.launches, args.reps)
    print(json.dumps(results["overhead"], indent=1), flush=True)
    save(args.out, results)
    results["long"] = []
    for i, config in enumerate(args.long if args.long_seconds > 0 else []):
        results["long"].append(one_run(for_seconds, config, args.long_seconds, plain=i == 0))
        print(json.dumps(results["long"][-1], indent=1), flush=True)
        save(args.out, results)
    _plan.MIN_INTERVAL_NS = 1  # the sweep may probe below gpuscope's floor on purpose
    results["sweep"] = []
    for config in args.sweep:
        try:
            row = one_run(for_seconds, config, args.sweep_seconds)
        except gpuscope.GpuscopeError as exc:
            row = {"config": config, "error": str(exc)[:300]}
        results["sweep"].append(row)
        print(json.dumps(row), flush=True)
        save(args.out, results)
    save(args.out, results)
    summary(results)


def summary(results):
    """One line per run: what was kept and lost, and the decode load."""
    print("\nSUMMARY")
    for name, row in results.get("overhead", {}).items():
        print(f"overhead {name:18s} {row['ms_per_launch']:.4f} ms/launch {row['overhead_pct']:+.2f}% "
              f"lost {row.get('lost_samples', 0)}")
    for row in [*results.get("long", []), *results.get("sweep", [])]:
        if "error" in row:
            print(f"{row['config']:18s} error {row['error'][:120]}")
            continue
        print(f"{row['config']:18s} {row['seconds']:6.1f} s kept {row['samples']:8d} of {row['expected_samples']:8d} "
              f"lost {row['lost_samples']:7d} overflows {row['overflows']} discarded {row['discarded_samples']} "
              f"full {row['full_decodes']} decode {row['decode_us_per_sample']:.1f} us/sample "
              f"({row['decode_load_pct']:.0f}% of the interval)"
              + (f" overhead {row['overhead_pct']:+.2f}%" if row.get("overhead_pct") is not None else ""))


def save(path, results):
    """Write the results so far (what is done survives a later step being cut off)."""
    with open(path, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
