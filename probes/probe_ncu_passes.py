"""Probe: which pass of a kernel replay each of the ``topdown`` set's values comes from, in ncu and in gpuscope.

Run on the GPU machine from the repository root:

    source tests/gpu/device_env.sh; python3 probes/probe_ncu_passes.py --out $OUT/passes

Neither tool says which pass collected which counter, so the kernel tells: ``timed_work`` reads the GPU's
``%globaltimer`` when it starts and runs ``base * (1 + (us since t0) / scale_us)`` iterations of the same loop,
``t0`` being the timer just before the launch. Each replay pass runs later than the one before, so it does more of the
same work; the stall mix per iteration stays the same. Run once so (``scaled``) and once with ``base`` iterations in
every pass (``flat``), each ``*_per_warp_active.pct`` share's ratio scaled / flat is the work of the pass of its
stall counter over the work of the pass of its denominator (``smsp__warps_active``): 1 where both are one pass,
more where the stall counter came later. ``gpu__time_duration.sum`` and ``sm__cycles_elapsed.max`` give their
pass's work itself; ``smsp__inst_executed.avg.per_cycle_active`` the ratio of two passes' work again.

ncu runs twice more with the raw counters behind the ratios asked as well (``ncu_raw``; they are the counters its
ratios are made of, so its schedule should not change, which the ratios of both runs check): each raw counter's
scaled / flat ratio is the work of its own pass. The default kernel, ``mixed_work``, stalls for most reasons, so
that every reason's counter is large enough to be placed; ``timed_work`` is global loads and FMAs only. The same is
done for gpuscope in kernel mode with its pass plan, whose layout is known: the check that the method reads passes
right. Writes ``passes.json`` (every value of every launch) and prints, per metric, the median ratio for each tool.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from probe_pass_consistency import run_ncu  # noqa: E402

SOURCE = r"""
extern "C" __global__ void now(long long* out) {
    long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    out[0] = t;
}

extern "C" __global__ void timed_work(const float* __restrict__ src, float* dst, long long t0, int scaled,
                                      int base, unsigned n, double scale_us) {
    __shared__ int loops;
    if (threadIdx.x == 0) {
        long long t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        double us = (t - t0) * 1e-3;
        loops = scaled ? (int)(base * fmin(1.0 + (us > 0.0 ? us : 0.0) / scale_us, 1000.0)) : base;
    }
    __syncthreads();
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned idx = i;
    float acc = 0.f;
    for (int k = 0; k < loops; ++k) {
        idx = (idx * 1664525u + 1013904223u) % n;
        acc = fmaf(acc, 0.999f, src[idx]);
        acc = fmaf(acc, 1.0001f, 0.5f);
    }
    dst[i] = acc;
}

__constant__ float ctab[4096];

// The same scaling over a loop that stalls for most reasons: global loads (long_scoreboard, lg_throttle), a
// divergent constant-memory index (imc_miss), divergent MUFU work (branch_resolving, short_scoreboard,
// math_pipe_throttle), shared-memory atomics (mio_throttle), __syncthreads (barrier), __threadfence (membar),
// __nanosleep (sleeping) and dependent FMAs (wait).
extern "C" __global__ void mixed_work(const float* __restrict__ src, float* dst, long long t0, int scaled,
                                      int base, unsigned n, double scale_us) {
    __shared__ int loops;
    __shared__ float sh[256];
    sh[threadIdx.x & 255] = 0.f;
    if (threadIdx.x == 0) {
        long long t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        double us = (t - t0) * 1e-3;
        loops = scaled ? (int)(base * fmin(1.0 + (us > 0.0 ? us : 0.0) / scale_us, 1000.0)) : base;
    }
    __syncthreads();
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned idx = i, lane = threadIdx.x & 31;
    float acc = 0.f;
    for (int k = 0; k < loops; ++k) {
        idx = (idx * 1664525u + 1013904223u) % n;
        acc = fmaf(acc, 0.999f, src[idx]);
        acc += ctab[(idx >> 5) & 4095];
        if (lane & 1) acc = __sinf(acc) * 1.0001f;
        else acc = __expf(-fabsf(acc)) + __fsqrt_rn(fabsf(acc));
        atomicAdd(&sh[idx & 255], 1.0f);
        if ((k & 7) == 0) __syncthreads();
        if ((k & 15) == 0) __threadfence();
        if ((k & 31) == 0) __nanosleep(200);
        for (int j = 0; j < 4; ++j) acc = fmaf(acc, 1.0001f, 0.5f);
    }
    __syncthreads();
    dst[i] = acc + sh[threadIdx.x & 255];
}
"""

#: The raw counters behind the set's ratios, asked of ncu beside the ratios (``--raw``): their own scaled / flat
#: ratio is the work of the pass that collected each, with no denominator in between.
RAW = ["smsp__warps_active.sum", "smsp__cycles_active.sum", "smsp__inst_executed.sum", "smsp__inst_issued.sum",
       "smsp__thread_inst_executed.sum"] + [f"smsp__warps_issue_stalled_{r}.sum" for r in (
           "no_instruction", "barrier", "membar", "branch_resolving", "sleeping", "misc", "dispatch_stall",
           "math_pipe_throttle", "long_scoreboard", "imc_miss", "mio_throttle", "drain", "lg_throttle",
           "short_scoreboard", "wait", "tex_throttle", "selected", "not_selected")]


class TimedWork:
    def __init__(self, base: int, scale_us: float, kernel: str = "mixed_work"):
        import cupy as cp

        self.cp, self.base, self.scale_us, self.kernel = cp, base, scale_us, kernel
        module = cp.RawModule(code=SOURCE)
        self.now, self.work = module.get_function("now"), module.get_function(kernel)
        table = module.get_global("ctab")
        cp.ndarray((4096,), cp.float32, table).set(np.linspace(0.0, 1.0, 4096, dtype=np.float32))
        self.n = 1 << 24
        self.src = cp.random.random(self.n, dtype=cp.float32)
        sms = cp.cuda.Device().attributes["MultiProcessorCount"]
        self.grid, self.block = (sms * 4,), (256,)  # one wave: every block starts with the pass
        self.dst = cp.zeros(self.grid[0] * self.block[0], dtype=cp.float32)
        self.stamp = cp.zeros(1, dtype=cp.int64)

    def launch(self, scaled: bool) -> None:
        cp = self.cp
        self.now((1,), (1,), (self.stamp,))
        t0 = int(self.stamp.get()[0])  # synchronises: the launch below starts a few tens of us after t0
        self.work(self.grid, self.block, (self.src, self.dst, cp.int64(t0), cp.int32(int(scaled)),
                                          cp.int32(self.base), cp.uint32(self.n), cp.float64(self.scale_us)))
        cp.cuda.Device().synchronize()


def child(scaled: bool, launches: int, base: int, scale_us: float, kernel: str) -> None:
    work = TimedWork(base, scale_us, kernel)
    work.launch(False)  # compiled and warm before the profiled launches
    work.cp.cuda.runtime.profilerStart()
    for _ in range(launches):
        work.launch(scaled)
    work.cp.cuda.runtime.profilerStop()


def gpuscope_rows(work, metrics, scaled: bool, launches: int, groups) -> list[dict]:
    import gpuscope as gs

    with gs.Profiler(metrics=metrics, mode="kernel", kernels=[work.kernel], pass_groups=groups) as prof:
        for _ in range(launches):
            work.launch(scaled)
    ds = prof.dataset
    names = [m for m in ds.data_vars if ds[m].dims == ("range",) and ds[m].dtype.kind == "f"]  # raw counters too
    return [{m: float(ds[m].values[i]) for m in names} for i in range(ds.sizes["range"])]


def ratios(scaled: list[dict], flat: list[dict], metrics) -> dict:
    out = {}
    for m in metrics:
        a = np.array([r.get(m, np.nan) for r in scaled], dtype=float)
        b = np.array([r.get(m, np.nan) for r in flat], dtype=float)
        if a.size and b.size and np.nanmedian(b) != 0:
            r = a / np.nanmedian(b)
            out[m] = {"median": float(np.nanmedian(r)), "min": float(np.nanmin(r)), "max": float(np.nanmax(r))}
    return out


def work_chip() -> str:
    from gpuscope.cupti import profiler

    return profiler.chip_name(0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", nargs="?", default="probe", choices=("probe", "scaled", "flat"))
    ap.add_argument("--launches", type=int, default=6)
    ap.add_argument("--kernel", default="mixed_work", choices=("mixed_work", "timed_work"))
    ap.add_argument("--base", type=int, default=512, help="loop iterations of an unscaled pass (about 1.4 ms)")
    ap.add_argument("--scale-us", type=float, default=2000.0, help="one more base of iterations every this many us "
                    "(the probe sets it to two flat passes, and base to make a flat pass 1.5 ms)")
    ap.add_argument("--ncu", default=shutil.which("ncu") or "/usr/local/cuda/bin/ncu")
    ap.add_argument("--out", default="passes_out")
    args = ap.parse_args()
    if args.mode != "probe":
        child(args.mode == "scaled", args.launches, args.base, args.scale_us, args.kernel)
        return
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import gpuscope as gs

    metrics = list(gs.metric_set("topdown").metrics)
    work = TimedWork(args.base, args.scale_us, args.kernel)
    work.launch(False)

    def flat_ms() -> float:
        start = work.cp.cuda.Event(), work.cp.cuda.Event()
        start[0].record()
        work.launch(False)
        start[1].record()
        start[1].synchronize()
        return work.cp.cuda.get_elapsed_time(*start)

    # about 1.5 ms a flat pass, and one more base every two of them: each pass then does about 1.75 times the
    # work of the pass before (a later pass starts after the passes before it ran, so the growth compounds)
    first = flat_ms()
    work.base = args.base = max(4, int(args.base * 1.5 / first))
    results = {"flat_launch_ms": flat_ms(), "base": args.base}
    work.scale_us = args.scale_us = 2000.0 * results["flat_launch_ms"]
    results["scale_us"] = args.scale_us
    print(f"base {args.base}: flat {results['flat_launch_ms']:.3f} ms (first {first:.3f} ms), scale {args.scale_us:.0f} us",
          flush=True)
    for label, groups in (("gpuscope_plan", None),):
        for scaled in (True, False):
            key = f"{label}_{'scaled' if scaled else 'flat'}"
            try:
                results[key] = {"rows": gpuscope_rows(work, metrics, scaled, args.launches, groups)}
            except Exception as exc:
                results[key] = {"error": repr(exc)}
            print(key, len(results[key].get("rows", ())), results[key].get("error", ""), flush=True)
    gs.release()
    for tool, asked in (("ncu", metrics), ("ncu_raw", metrics + RAW)):
        for scaled in ("scaled", "flat"):
            key = f"{tool}_{scaled}"
            child_args = [__file__, scaled, "--launches", str(args.launches), "--base", str(args.base),
                          "--scale-us", str(args.scale_us), "--kernel", args.kernel]
            try:
                results[key] = run_ncu(args.ncu, asked, 0, child=child_args,
                                       extra=("-k", f"regex:{args.kernel}", "--print-units", "base"))
            except Exception as exc:
                results[key] = {"error": repr(exc)}
            print(key, len(results[key].get("rows", ())), results[key].get("error", "")[:300], flush=True)
    (out / "passes.json").write_text(json.dumps(results))
    table = {}
    for tool in ("ncu", "ncu_raw", "gpuscope_plan"):
        a, b = results.get(f"{tool}_scaled", {}), results.get(f"{tool}_flat", {})
        if "rows" in a and "rows" in b:
            names = [m for m in a["rows"][0] if m in b["rows"][0] and isinstance(a["rows"][0][m], float)]
            table[tool] = ratios(a["rows"], b["rows"], sorted(names))
    from gpuscope._gpu import metric_lists as lists

    try:
        results["plan_groups"] = [list(g) for g in lists.consistent_plan(tuple(metrics), work_chip()).groups]
    except Exception as exc:  # the table does not need it
        results["plan_groups"] = repr(exc)
    results["ratios"] = table
    (out / "passes.json").write_text(json.dumps(results))
    print(f"flat launch {results['flat_launch_ms']:.3f} ms; scaled/flat, median over {args.launches} launches:")
    tools = list(table)
    print("| metric | " + " | ".join(tools) + " |")
    print("|---|" + "---|" * len(tools))
    for m in list(metrics) + RAW + ["sm__warps_active.sum"]:
        short = m.replace("smsp__warp_issue_stalled_", "").replace("_per_warp_active.pct", "")
        cells = [f"{table[t][m]['median']:.2f}" if m in table[t] else "" for t in tools]
        print(f"| {short} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
