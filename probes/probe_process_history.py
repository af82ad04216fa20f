"""Probe: what a process's history does to the stall shares of short kernels, for gpuscope and for ncu alike.

Run on the GPU machine from the repository root (PyTorch and CuPy installed there; neither is a gpuscope
dependency):

    source tests/gpu/device_env.sh; python3 probes/probe_process_history.py --out $OUT/history

The measured launches are one step of :class:`probe_pass_consistency.Work` (a PyTorch training step, CuPy 1 M-element
kernels, two long Numba kernels: 41 launches, 33 of them under 10 us), after two warm-up steps, in four fresh
processes:

* ``gpuscope`` and ``ncu``: nothing ran before the work;
* ``gpuscope_history`` and ``ncu_history``: first the history that moved the GPU suite's comparison with ncu, the
  module ``tests/gpu/test_range_profiling.py`` imported (it compiles its Numba kernels) and its ``test_cupy_kernels``
  run (a CuPy ``RawKernel``, ``ElementwiseKernel`` and ``ReductionKernel`` launched in a kernel-replay session;
  under ncu, inside ``cudaProfilerStart``/``Stop``, so that ncu replays them as gpuscope did).

gpuscope collects the ``topdown`` set in kernel mode; ncu the same metrics (``--clock-control none --cache-control
none``, ``--profile-from-start off``). Writes ``history.json`` (the 18 stall shares per launch of each process, ncu's
durations and kernel names) and prints, per pair, the median of the largest share difference by length and the
mean shift of ``imc_miss`` and ``long_scoreboard`` on the launches under 10 us.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from probe_pass_consistency import PCT, REASONS, Work, run_ncu  # noqa: E402


class _NcuRange:
    """Stands in for ``gs.Profiler`` under ncu: the block is what ncu profiles."""

    def __init__(self, *args, **kwargs):
        pass

    def __enter__(self):
        import cupy as cp

        cp.cuda.runtime.profilerStart()
        return self

    def __exit__(self, *exc):
        import cupy as cp

        cp.cuda.runtime.deviceSynchronize()
        cp.cuda.runtime.profilerStop()


def history(tool: str) -> None:
    """The GPU suite's history: test_range_profiling.py imported and its test_cupy_kernels run (profiled)."""
    sys.path.insert(0, str(ROOT / "tests" / "gpu"))
    import test_range_profiling as t

    if tool == "ncu":
        t.test_cupy_kernels.__globals__["gs"] = type("NcuGs", (), {"profile": staticmethod(lambda k: k),
                                                                  "Profiler": _NcuRange})
    try:
        t.test_cupy_kernels()
    except Exception:  # noqa: BLE001 (under ncu, the stand-in has no dataset to check: the launches ran)
        if tool != "ncu":
            raise
    if tool == "gpuscope":
        import gpuscope as gs

        gs.release()


def child(case: str, out: str | None) -> None:
    tool = case.split("_")[0]
    if case.endswith("_history"):
        history(tool)
    work = Work()
    work.step()
    work.step()
    if tool == "ncu":
        with _NcuRange():
            work.step()
        return
    import gpuscope as gs

    with gs.Profiler(metrics="topdown", mode="kernel") as prof:
        work.step()
    ds = prof.dataset
    Path(out).write_text(json.dumps(np.stack([ds[PCT.format(r)].values for r in REASONS], axis=1).tolist()))


def run_ncu_case(case: str, metrics: list[str]) -> dict:
    """ncu on the work of *case* in a child process (:func:`probe_pass_consistency.run_ncu`)."""
    ncu = shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
    rows = run_ncu(ncu, metrics, 1, child=[__file__, "child", case])["rows"]
    return {"shares": [[r[PCT.format(x)] for x in REASONS] for r in rows],
            "duration_ns": [r["gpu__time_duration.sum"] for r in rows], "kernels": [r["kernel"] for r in rows]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", nargs="?", default="probe")
    ap.add_argument("case", nargs="?")
    ap.add_argument("path", nargs="?")
    ap.add_argument("--out", default="history_out")
    args = ap.parse_args()
    if args.mode == "child":
        child(args.case, args.path)
        return
    import gpuscope as gs

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    metrics = list(gs.metric_set("topdown").metrics) + ["gpu__time_duration.sum"]
    res = {}
    for case in ("ncu", "ncu_history"):
        res[case] = run_ncu_case(case, metrics)
    n = len(res["ncu"]["shares"])
    for key in ("shares", "duration_ns", "kernels"):  # under ncu the history's own launches come first
        res["ncu_history"][key] = res["ncu_history"][key][-n:]
    for case in ("gpuscope", "gpuscope_history"):
        path = out / f"{case}.json"
        subprocess.run([sys.executable, __file__, "child", case, str(path)], check=True, cwd=ROOT)
        res[case] = {"shares": json.loads(path.read_text())}
    (out / "history.json").write_text(json.dumps(res))
    short = np.array(res["ncu"]["duration_ns"]) < 10e3
    imc, lsb = REASONS.index("imc_miss"), REASONS.index("long_scoreboard")
    for a, b in [("gpuscope", "ncu"), ("gpuscope_history", "ncu_history"), ("gpuscope_history", "ncu"),
                 ("ncu_history", "ncu"), ("gpuscope_history", "gpuscope")]:
        d = np.array(res[a]["shares"]) - np.array(res[b]["shares"])
        worst = np.abs(d).max(axis=1)
        print(f"{a:17s} vs {b:12s}: < 10 us {np.median(worst[short]):4.1f}  >= 10 us {np.median(worst[~short]):4.1f}"
              f"  imc_miss {d[short, imc].mean():+5.1f}  long_scoreboard {d[short, lsb].mean():+5.1f}")


if __name__ == "__main__":
    main()
