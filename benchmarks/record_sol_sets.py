"""Record the roofline, memory, occupancy and instructions sets on real kernels, with Nsight Compute beside them.

Run on the GPU machine from the repository root (CuPy is installed there; a test workload, not a gpuscope
dependency):

    source tests/gpu/device_env.sh; python3 benchmarks/record_sol_sets.py --out $OUT/sol

The workload (:class:`Work`, one ``step()``): the Numba ``stream`` and ``fma`` kernels of ``workloads.py``
(``StreamFma``: 16 Mi-element streaming, 2000 multiply-adds per element), a CuPy fp16 GEMM (4096 x 4096 x 4096,
cuBLAS on the tensor cores) and a CuPy reduction (``cp.sum`` over 64 Mi float32).

* gpuscope: one step inside ``gpuscope.Profiler(metrics=<set>, mode="kernel")`` per set; each Dataset is saved as
  ``sol_<set>_gh100.nc`` (``gs.save_dataset``) with the attrs ``launch_registers`` and
  ``launch_shared_memory_bytes`` (one value per range, from ncu's ``launch__registers_per_thread`` and static plus
  dynamic shared memory of the same launches; Numba's own register counts are checked against them).
* ncu: the same step in a child process between ``cudaProfilerStart`` and ``Stop``, under ``ncu --metrics <the same
  list> --section <ncu's sections for that analysis> --csv --page raw --print-units base --clock-control none
  --cache-control none``; the rows are saved as ``ncu_<set>.json`` (metric -> value per launch, and the command).
* Compared, launch by launch (matched by position; grid and block sizes must agree): every collected metric
  (median relative difference per kernel), and what the analyses compute (``gs.roofline``,
  ``gs.memory_workload``, ``gs.occupancy``, ``gs.instruction_mix``) against the numbers ncu's sections show
  (``derived__*`` roofline traffic and peaks, hit rates, ``launch__occupancy_limit_*``, theoretical occupancy,
  waves, pipe utilisation). ``comparison.json`` holds every number; a short table is printed.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

SETS = ("roofline", "memory", "occupancy", "instructions")
#: ncu's sections for each analysis; those the installed ncu lacks are left out (ncu --list-sections).
SECTIONS = {
    "roofline": ("SpeedOfLight_RooflineChart", "SpeedOfLight_HierarchicalSingleRooflineChart",
                 "SpeedOfLight_HierarchicalDoubleRooflineChart", "SpeedOfLight_HierarchicalHalfRooflineChart",
                 "SpeedOfLight_HierarchicalTensorRooflineChart"),
    "memory": ("MemoryWorkloadAnalysis", "MemoryWorkloadAnalysis_Chart", "MemoryWorkloadAnalysis_Tables"),
    "occupancy": ("Occupancy", "LaunchStats"),
    "instructions": ("InstructionStats", "ComputeWorkloadAnalysis"),
}
#: The launches of one :class:`Work` step, in order (the sum is two cub kernels).
STREAM, FMA, GEMM, REDUCE, SINGLE = range(5)
#: Counters of executed work: the same program, the same counts in gpuscope's and ncu's runs (measured on the H200
#: recording of tests/fixtures/sol). (The L1 tag stage's totals, l1tex__t_sectors and
#: l1tex__t_bytes, are not among them: 19 of DeviceReduceKernel's 8.4 M sectors more in ncu's run, while its global
#: loads and stores counted per space are equal.)
COUNTS = ("smsp__sass_thread_inst_executed_op_", "sm__ops_path_tensor_src_", "smsp__inst_executed",
          "smsp__thread_inst_executed", "sm__pipe_tensor_cycles_active.sum", "smsp__sass_inst_executed_op_",
          "smsp__sass_data_bytes_mem_shared", "l1tex__t_bytes_pipe_lsu_", "l1tex__t_requests_pipe_lsu_",
          "sm__ctas_launched.sum", "sm__warps_launched.sum")
#: Which FMA-pipe instructions go to the heavy half is decided at dispatch (single tile: 88 in gpuscope's
#: run, 86 under ncu).
DISPATCHED = ("smsp__inst_executed_pipe_fmaheavy.sum",)
#: The GEMM's warps wait for each other in loops (Hopper's warp-specialised kernels poll their barriers): how often
#: they go round depends on timing, so its instruction totals, pipes and its control and misc classes differ, by
#: 0.5 % at most in that recording, and its integer class too (512 of 34.2 M instructions in a later GPU-suite run,
#: 2026-11-26). Its FLOPs, tensor work and memory instructions are compared.
GEMM_POLLING = ("smsp__inst_executed", "smsp__thread_inst_executed",
                "smsp__sass_thread_inst_executed_op_control_pred_on.sum",
                "smsp__sass_thread_inst_executed_op_misc_pred_on.sum",
                "smsp__sass_thread_inst_executed_op_integer_pred_on.sum")
#: Columns of ncu's raw page that are not metrics.
IDENTITY = ("ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
            "Grid Size", "Device", "CC")
_PREFIX = {"": 1.0, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}
_TIME = {"nsecond": 1.0, "usecond": 1e3, "msecond": 1e6, "second": 1e9}


class Work:
    """The launches of one step, built once (compilation, allocation and cuBLAS handles outside the sessions)."""

    def __init__(self):
        import cupy as cp
        from numba import cuda

        import workloads

        self.cp, self.cuda, self.workloads = cp, cuda, workloads
        self.sf = workloads.StreamFma()
        rng = cp.random.default_rng(0)
        n = 4096
        self.a = rng.standard_normal((n, n), dtype=cp.float32).astype(cp.float16)
        self.b = rng.standard_normal((n, n), dtype=cp.float32).astype(cp.float16)
        self.x = rng.standard_normal(64 << 20, dtype=cp.float32)

    def step(self):
        self.sf.stream()
        self.sf.fma(2000)
        self.cp.matmul(self.a, self.b)
        self.cp.sum(self.x)
        self.cp.cuda.Device().synchronize()
        self.cuda.synchronize()

    def numba_registers(self) -> dict:
        """Registers per thread of the Numba kernels, by kernel name (numba-cuda's own count)."""
        out = {}
        for name in ("stream", "fma"):
            regs = getattr(self.workloads, name).get_regs_per_thread()
            out[name] = int(next(iter(regs.values())) if isinstance(regs, dict) else regs)
        return out


def workload():
    work = Work()
    work.step()  # compile and warm up outside the profiled step
    work.cp.cuda.runtime.profilerStart()
    work.step()
    work.cp.cuda.runtime.profilerStop()


def to_base(text: str, unit: str) -> float:
    """A value of ncu's raw page in base units: bytes, instructions, nanoseconds for durations, per second for
    rates (``--print-units base`` should make this the identity; older ncu versions scale some units anyway)."""
    try:
        value = float(text.replace(",", ""))
    except ValueError:
        return float("nan")
    numerator, _, denominator = unit.partition("/")
    scale = 1.0
    for word, factor in _TIME.items():
        if numerator == word:
            return value * factor  # a duration, in ns as gpuscope stores gpu__time_duration.sum
        if numerator.endswith(word) and numerator[:-len(word)] in _PREFIX:
            return value * _PREFIX[numerator[:-len(word)]] * factor
    match = re.match(r"^([KMGTP]?)(byte|inst|cycle|warp|thread|sector|request|FLOP|flop|op|hz|Hz)", numerator)
    if match:
        scale = _PREFIX[match.group(1)]
    elif numerator.lower() in ("khz", "mhz", "ghz"):
        scale = _PREFIX[numerator[0].upper()]
    if denominator in _TIME:
        scale *= 1e9 / _TIME[denominator]  # per ns, us, ms -> per second
    return value * scale


def sections_available(ncu: str) -> set[str]:
    proc = subprocess.run([ncu, "--list-sections"], capture_output=True, text=True)
    return set(re.findall(r"^\s*([A-Za-z0-9_]+)\s", proc.stdout, re.M))


def run_ncu(ncu: str, metrics: list[str], sections: list[str]) -> dict:
    cmd = [ncu, "--metrics", ",".join(metrics), *[a for s in sections for a in ("--section", s)], "--csv", "--page",
           "raw", "--print-units", "base", "--clock-control", "none", "--cache-control", "none",
           "--profile-from-start", "off", sys.executable, __file__, "workload"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith('"')]
    table = list(csv.DictReader(io.StringIO("\n".join(lines))))
    if len(table) < 2:
        raise RuntimeError(f"ncu gave no rows (rc {proc.returncode}): {proc.stderr[-800:]}")
    units, rows = table[0], table[1:]  # the first row holds the units
    out = []
    for r in rows:
        row = {k: r.get(k, "") for k in IDENTITY}
        row.update({k: to_base(v, units.get(k, "")) for k, v in r.items() if k not in IDENTITY})
        out.append(row)
    return {"rows": out, "wall_s": wall, "cmd": " ".join(cmd)}


def shape(text: str) -> int:
    """Blocks or threads of ncu's "(x, y, z)" Grid Size / Block Size."""
    return int(np.prod([int(v) for v in re.findall(r"\d+", text)] or [0]))


def collect(work, name: str):
    import gpuscope as gs

    with gs.Profiler(metrics=name, mode="kernel") as prof:
        work.step()
    return prof.dataset


def matched(ds, rows) -> list[str]:
    """Problems matching the Dataset's launches with ncu's rows by position (none when they match)."""
    n = ds.sizes["range"]
    if n != len(rows):
        return [f"gpuscope has {n} launches, ncu {len(rows)}"]
    problems = []
    for i, r in enumerate(rows):
        grid = int(np.prod([int(ds[f"grid_{a}"].values[i]) for a in "xyz"]))
        block = int(np.prod([int(ds[f"block_{a}"].values[i]) for a in "xyz"]))
        if (grid, block) != (shape(r["Grid Size"]), shape(r["Block Size"])):
            problems.append(f"launch {i}: grid/block {grid}/{block} here, {r['Grid Size']}/{r['Block Size']} in ncu")
    return problems


def ncu_dataset(ds, rows):
    """ncu's values of the Dataset's metrics, in the Dataset's layout (its coords and attrs)."""
    out = ds.copy(deep=True)
    for m in ds.data_vars:
        out[m].values[:] = [r.get(m, np.nan) for r in rows]
    return out


def metric_differences(ds, rows) -> dict:
    """Per metric: the median over launches of |gpuscope - ncu| / |ncu|, and the worst launch's."""
    out = {}
    for m in ds.data_vars:
        g = np.asarray(ds[m].values, dtype=float)
        n = np.array([r.get(m, np.nan) for r in rows], dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            rel = np.abs(g - n) / np.maximum(np.abs(n), 1e-12)
        rel = np.where((g == 0) & (n == 0), 0.0, rel)
        out[m] = {"median": float(np.nanmedian(rel)), "max": float(np.nanmax(rel)), "gpuscope": g.tolist(),
                  "ncu": n.tolist()}
    return out


def _get(row, *names):
    """The first of *names* in an ncu row, or NaN."""
    return next((row[n] for n in names if n in row and np.isfinite(row[n])), np.nan)


def section_values(name: str, row: dict) -> dict:
    """What ncu's sections show for one launch, for the quantities gpuscope's analyses compute."""
    if name == "roofline":
        sm_hz = _get(row, "smsp__cycles_elapsed.avg.per_second")
        fp32 = (_get(row, "smsp__sass_thread_inst_executed_op_fadd_pred_on.sum.per_cycle_elapsed")
                + _get(row, "smsp__sass_thread_inst_executed_op_fmul_pred_on.sum.per_cycle_elapsed")
                + _get(row, "derived__smsp__sass_thread_inst_executed_op_ffma_pred_on_x2")) * sm_hz
        paths = [v for k, v in row.items() if k.startswith("sm__ops_path_tensor_src_") and k.endswith(".sum.per_second")
                 and isinstance(v, float) and np.isfinite(v)]
        tensor = sum(paths) if paths else np.nan
        return {
            "flop_rate fp32": fp32,
            "peak_flop_rate fp32": _get(row, "derived__sm__sass_thread_inst_executed_op_ffma_pred_on_x2")
            * _get(row, "sm__cycles_elapsed.avg.per_second"),
            "flop_rate tensor": tensor,
            "bandwidth DRAM": _get(row, "dram__bytes.sum.per_second"),
            "bandwidth L2": _get(row, "derived__lts__lts2xbar_bytes.sum.per_second"),
            "bandwidth L1": _get(row, "derived__l1tex__lsu_writeback_bytes_mem_lgds.sum.per_second",
                                 "derived__l1tex__lsu_writeback_bytes_mem_lg.sum.per_second"),
            "peak_bandwidth DRAM": _get(row, "dram__bytes.sum.peak_sustained")
            * _get(row, "dram__cycles_elapsed.avg.per_second"),
            "peak_bandwidth L2": _get(row, "derived__lts__lts2xbar_bytes.sum.peak_sustained")
            * _get(row, "lts__cycles_elapsed.avg.per_second"),
            "peak_bandwidth L1": _get(row, "derived__l1tex__lsu_writeback_bytes_mem_lgds.sum.peak_sustained",
                                      "derived__l1tex__lsu_writeback_bytes_mem_lg.sum.peak_sustained")
            * _get(row, "l1tex__cycles_elapsed.avg.per_second"),
        }
    if name == "memory":
        return {"hit_rate L1/TEX": _get(row, "l1tex__t_sector_hit_rate.pct"),
                "hit_rate L2": _get(row, "lts__t_sector_hit_rate.pct"),
                "bytes DRAM": _get(row, "dram__bytes.sum"),
                "ncu Mem Busy": _get(row, "gpu__compute_memory_access_throughput.avg.pct_of_peak_sustained_elapsed"),
                "ncu Max Bandwidth": _get(row, "gpu__compute_memory_request_throughput.avg.pct_of_peak_sustained_elapsed"),
                "ncu DRAM throughput": _get(row, "dram__throughput.avg.pct_of_peak_sustained_elapsed")}
    if name == "occupancy":
        return {"theoretical_occupancy": _get(row, "sm__maximum_warps_per_active_cycle_pct"),
                "achieved_occupancy": _get(row, "sm__warps_active.avg.pct_of_peak_sustained_active"),
                "block_limit registers": _get(row, "launch__occupancy_limit_registers"),
                "block_limit shared_memory": _get(row, "launch__occupancy_limit_shared_mem"),
                "block_limit warps": _get(row, "launch__occupancy_limit_warps"),
                "block_limit blocks": _get(row, "launch__occupancy_limit_blocks"),
                "shared_memory_config": _get(row, "launch__shared_mem_config_size"),
                "waves_per_sm": _get(row, "launch__waves_per_multiprocessor")}
    return {f"pipe_utilization {p}": _get(row, f"sm__inst_executed_pipe_{p}.avg.pct_of_peak_sustained_active")
            for p in ("alu", "fma", "fmaheavy", "fp64", "lsu", "xu", "adu", "cbu", "uniform")} | {
        "pipe_utilization tensor": _get(row, "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active")}


def analysed(name: str, ds, registers, shared) -> list[dict]:
    """gpuscope's analysis of *ds*, one dict per launch, keyed as :func:`section_values`."""
    import xarray as xr

    import gpuscope as gs

    n = ds.sizes["range"]
    if name == "roofline":
        rl = gs.roofline(ds)
        return [{"flop_rate fp32": float(rl.flop_rate.sel(precision="fp32")[i]),
                 "peak_flop_rate fp32": float(rl.peak_flop_rate.sel(precision="fp32")[i]),
                 "flop_rate tensor": float(rl.flop_rate.sel(precision="tensor")[i])
                 if "tensor" in rl["precision"] else np.nan,
                 **{f"{q} {lv}": float(rl[q].sel(level=lv)[i]) for q in ("bandwidth", "peak_bandwidth")
                    for lv in rl["level"].values},
                 "bound": str(rl.bound.sel(precision=str(rl.dominant_precision[i].values))[i].values)
                 if str(rl.dominant_precision[i].values) else ""} for i in range(n)]
    if name == "memory":
        mw = gs.memory_workload(ds)
        return [{"hit_rate L1/TEX": float(mw.hit_rate.sel(level="L1/TEX")[i]),
                 "hit_rate L2": float(mw.hit_rate.sel(level="L2")[i]),
                 "bytes DRAM": float(mw.bytes.sel(level="DRAM")[i]),
                 "busiest": f"{mw.busiest_level.values[i]} {float(mw.busiest_share[i]):.1f}%"} for i in range(n)]
    if name == "occupancy":
        oc = gs.occupancy(ds, registers=xr.DataArray(registers, dims="range"),
                          shared_memory=xr.DataArray(shared, dims="range"))
        return [{"theoretical_occupancy": float(oc.theoretical_occupancy[i]),
                 "achieved_occupancy": float(oc.achieved_occupancy[i]),
                 **{f"block_limit {k}": float(oc.block_limit.sel(limit=k)[i]) for k in oc["limit"].values},
                 "shared_memory_config": float(oc.shared_memory_config[i]),
                 "waves_per_sm": float(oc.waves_per_sm[i]), "limited_by": str(oc.limited_by.values[i])}
                for i in range(n)]
    im = gs.instruction_mix(ds)
    return [{f"pipe_utilization {p}": float(im.pipe_utilization.sel(pipe=p)[i]) for p in im["pipe"].values}
            | {"busiest_pipe": str(im.busiest_pipe.values[i])} for i in range(n)]


def compare(name, ds, ncu, registers, shared) -> dict:
    rows = ncu["rows"]
    problems = matched(ds, rows)
    entry = {"problems": problems, "ncu_cmd": ncu["cmd"], "ncu_wall_s": ncu["wall_s"]}
    if problems:
        return entry
    entry["metrics"] = metric_differences(ds, rows)
    ours = analysed(name, ds, registers, shared)
    same_formulas = analysed(name, ncu_dataset(ds, rows), registers, shared)
    theirs = [section_values(name, r) for r in rows]
    entry["launches"] = [{"kernel": str(ds["kernel"].values[i]), "gpuscope": ours[i],
                          "gpuscope_formulas_on_ncu_values": same_formulas[i], "ncu_sections": theirs[i]}
                         for i in range(len(rows))]
    return entry


def print_summary(results: dict):
    for name, entry in results.items():
        print(f"\n== {name} ==")
        if entry.get("error") or entry.get("problems"):
            print(f"  not compared: {entry.get('error') or '; '.join(entry['problems'])}")
            continue
        diffs = entry["metrics"]
        close = sum(d["median"] <= 0.02 for d in diffs.values())
        print(f"  {close} of {len(diffs)} metrics within 2 % of ncu (median over launches)")
        for m, d in sorted(diffs.items(), key=lambda kv: -kv[1]["median"]):
            if not d["median"] <= 0.02:
                print(f"    {m}: median {100 * d['median']:.1f} %, worst {100 * d['max']:.1f} %")
        print("  | kernel | quantity | gpuscope | same formulas on ncu's values | ncu's section |")
        print("  |---|---|---|---|---|")
        for launch in entry["launches"]:
            for q, v in launch["gpuscope"].items():
                same = launch["gpuscope_formulas_on_ncu_values"].get(q)
                sec = launch["ncu_sections"].get(q)
                print(f"  | {launch['kernel']} | {q} | {_fmt(v)} | {_fmt(same)} | {_fmt(sec)} |")


def _fmt(value) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", nargs="?", default="record")
    ap.add_argument("--out", default="sol_out")
    ap.add_argument("--sets", nargs="+", default=list(SETS), choices=SETS)
    ap.add_argument("--ncu", default=shutil.which("ncu") or "/usr/local/cuda/bin/ncu")
    ap.add_argument("--skip-ncu", action="store_true")
    args = ap.parse_args()
    if args.mode == "workload":
        workload()
        return

    import gpuscope as gs

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Work()
    work.step()
    datasets = {}
    for name in args.sets:
        t0 = time.perf_counter()
        datasets[name] = collect(work, name)
        print(f"{name}: {datasets[name].sizes['range']} launches, {datasets[name].attrs.get('passes')} passes, "
              f"{time.perf_counter() - t0:.1f} s", flush=True)
    numba_regs = work.numba_registers()
    gs.release()  # the kept profiler would make ncu's child wait for the counters
    available = set() if args.skip_ncu else sections_available(args.ncu)
    results = {}
    for name, ds in datasets.items():
        registers = shared = [float("nan")] * ds.sizes["range"]
        try:
            if args.skip_ncu:
                raise RuntimeError("--skip-ncu")
            sections = [s for s in SECTIONS[name] if s in available]
            ncu = run_ncu(args.ncu, list(ds.data_vars), sections)
            (out / f"ncu_{name}.json").write_text(json.dumps(ncu))
            rows = ncu["rows"]
            if len(rows) == ds.sizes["range"]:
                registers = [r.get("launch__registers_per_thread", np.nan) for r in rows]
                shared = [r.get("launch__shared_mem_per_block_static", np.nan)
                          + r.get("launch__shared_mem_per_block_dynamic", np.nan) for r in rows]
            results[name] = compare(name, ds, ncu, registers, shared)
            results[name]["sections"] = sections
        except Exception as exc:  # record what gpuscope collected even when ncu fails
            results[name] = {"error": repr(exc)}
        kernels = [str(k) for k in ds["kernel"].values]
        results[name]["numba_registers"] = numba_regs
        results[name]["numba_registers_agree"] = all(
            not np.isfinite(r) or numba_regs.get(k, r) == r for k, r in zip(kernels, registers, strict=True))
        ds = ds.assign_attrs(launch_registers=[float(r) for r in registers],
                             launch_shared_memory_bytes=[float(s) for s in shared])
        gs.save_dataset(ds, out / f"sol_{name}_gh100.nc")
    (out / "comparison.json").write_text(json.dumps(results, indent=1, default=str))
    print_summary(results)


if __name__ == "__main__":
    main()
