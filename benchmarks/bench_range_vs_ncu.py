"""gpuscope range profiling against Nsight Compute on the same Numba workload: values and cost per launch.

Run on a GPU machine from the repository root (writes a JSON report and a Markdown table)::

    python3 benchmarks/bench_range_vs_ncu.py --launches 100 --out bench_range.json

The workload alternates a streaming kernel (3 x 64 MB) and an FMA-chain kernel. Measured:

* ncu ``--metrics <list>`` on ``workload`` (a subprocess), default settings (clocks locked to base, caches
  flushed) and ``--clock-control none --cache-control none``: values per launch and wall time per launch
  beyond the plain run;
* gpuscope in-process, decorated kernels (``@gpuscope.profile``) in ``mode="user"`` and ``mode="kernel"``:
  values and time per launch of the profiled loop;
* user-range overhead: ranges of >= 1 ms around the workload with a 1-pass set, against the bare loop.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

if __package__:  # imported as benchmarks.bench_range_vs_ncu
    from benchmarks import workloads
else:  # python3 benchmarks/bench_range_vs_ncu.py: benchmarks/ is sys.path[0]
    import workloads

ONE_PASS = ["smsp__inst_executed.sum", "sm__ctas_launched.sum", "dram__bytes_read.sum"]
_ST = ("no_instruction barrier membar branch_resolving sleeping misc dispatch_stall math_pipe_throttle "
       "long_scoreboard imc_miss mio_throttle drain lg_throttle short_scoreboard wait tex_throttle selected "
       "not_selected").split()
TOPDOWN = ["smsp__inst_executed.avg.per_cycle_active", "smsp__thread_inst_executed_per_inst_executed.ratio",
           "smsp__inst_issued.avg.per_cycle_active"] + [f"smsp__warp_issue_stalled_{s}_per_warp_active.pct" for s in _ST]


def make_workload():
    work = workloads.StreamFma(1 << 24, random=True)  # stream over 3 x 64 MB, fma over 1 Mi elements

    def run(launches, s=workloads.stream, f=workloads.fma):
        work.alternate(launches, 2000, stream_kernel=s, fma_kernel=f)

    run(2)
    return run, workloads.stream, workloads.fma


def plain_ms(run, launches):
    t = time.perf_counter()
    run(launches)
    return (time.perf_counter() - t) / launches * 1e3


def gpuscope_case(run, stream, fma, launches, metrics, mode):
    import gpuscope as gs

    ps, pf = gs.profile(stream), gs.profile(fma)
    t0 = time.perf_counter()
    with gs.Profiler(metrics, mode=mode, max_ranges=max(launches + 8, 64), progress=False) as prof:
        run(1, ps, pf)  # first pass pays CUPTI's start-up; not part of the per-launch cost
        t1 = time.perf_counter()
        run(launches, ps, pf)
        t2 = time.perf_counter()
    total = time.perf_counter() - t0
    ds = prof.dataset
    per_kernel = {}
    for kernel in ("stream", "fma"):
        sel = ds.where(ds.kernel == kernel, drop=True)
        per_kernel[kernel] = {m: float(sel[m].median()) for m in metrics}
    return {"ms_per_launch": (t2 - t1) / launches * 1e3, "session_s": total, "ranges": int(ds.sizes["range"]),
            "passes": prof.passes, "values": per_kernel}


def range_overhead(run, launches, metrics, repeats=5):
    import gpuscope as gs

    bare = []
    for _ in range(repeats):
        t = time.perf_counter(); run(launches); bare.append(time.perf_counter() - t)
    prof_t = []
    with gs.Profiler(metrics) as prof:
        with gs.range("warmup"):
            run(2)
        for _ in range(repeats):
            t = time.perf_counter()
            with gs.range("region"):
                run(launches)
            prof_t.append(time.perf_counter() - t)
    region_ms = statistics.median(bare) * 1e3
    return {"region_ms": region_ms, "bare_ms": region_ms, "ranged_ms": statistics.median(prof_t) * 1e3,
            "overhead_pct": (statistics.median(prof_t) / statistics.median(bare) - 1) * 100,
            "inst_executed": float(prof.dataset.where(prof.dataset.name == "region", drop=True)[metrics[0]][0])}


def ncu_case(launches, metrics, extra, ncu):
    cmd = [ncu, "--metrics", ",".join(metrics), "--csv", "--page", "raw", *extra, sys.executable, __file__,
           "workload", "--launches", str(launches)]
    t = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith('"')]
    rows = list(csv.DictReader(io.StringIO("\n".join(lines))))[1:]  # second row holds units
    values = {}
    for kernel in ("stream", "fma"):
        sel = [r for r in rows if kernel in r.get("Kernel Name", "")]
        values[kernel] = {m: statistics.median(float(r[m].replace(",", "")) for r in sel) for m in metrics if sel}
    return {"cmd": " ".join(cmd), "wall_s": wall, "launches_seen": len(rows), "values": values,
            "rc": proc.returncode, "stderr_tail": proc.stderr[-500:]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("what", nargs="?", default="all", choices=["all", "workload"])
    ap.add_argument("--launches", type=int, default=100)
    ap.add_argument("--out", default="bench_range.json")
    ap.add_argument("--ncu", default=shutil.which("ncu") or "/usr/local/cuda/bin/ncu")
    args = ap.parse_args()
    run, stream, fma = make_workload()
    if args.what == "workload":
        t = time.perf_counter(); run(args.launches)
        print(json.dumps({"workload_s": time.perf_counter() - t}))
        return
    report = {"launches": args.launches, "plain_ms_per_launch": plain_ms(run, args.launches)}
    t = time.perf_counter()
    subprocess.run([sys.executable, __file__, "workload", "--launches", str(args.launches)], check=True,
                   capture_output=True)
    report["plain_process_s"] = time.perf_counter() - t
    for label, metrics in (("one_pass", ONE_PASS), ("topdown", TOPDOWN)):
        for mode in ("user", "kernel"):
            report[f"gpuscope_{label}_{mode}"] = gpuscope_case(run, stream, fma, args.launches, metrics, mode)
            print(label, mode, report[f"gpuscope_{label}_{mode}"]["ms_per_launch"], flush=True)
        if os.path.exists(args.ncu):
            for setting, extra in (("default", []), ("noclock_nocache", ["--clock-control", "none", "--cache-control", "none"])):
                r = ncu_case(args.launches, metrics, extra, args.ncu)
                r["ms_per_launch"] = (r["wall_s"] - report["plain_process_s"]) / args.launches * 1e3
                report[f"ncu_{label}_{setting}"] = r
                print(label, setting, r["ms_per_launch"], r["launches_seen"], flush=True)
    report["user_range_overhead"] = [range_overhead(run, n, ONE_PASS) for n in (4, 40)]
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(json.dumps(report)[:4000])


if __name__ == "__main__":
    main()
