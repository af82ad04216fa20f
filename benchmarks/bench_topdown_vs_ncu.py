"""Top-Down from gpuscope against the same formulas applied to Nsight Compute's numbers, on the demo kernels.

Run on the GPU machine from the repository root:

    source tests/gpu/device_env.sh; python3 benchmarks/bench_topdown_vs_ncu.py --launches 5 --out topdown_vs_ncu.json

* gpuscope: the three kernels of ``gpuscope demo`` (streaming, FMA chain, one-lane FMA chain), each launched
  ``--launches`` times inside ``gpuscope.Profiler(metrics=<topdown set>, mode="kernel")`` (CUPTI kernel replay).
* ncu: the same launches in a child process under ``ncu --metrics <same list> --csv --page raw``, once with
  ncu's defaults (clocks locked to base, caches flushed before each pass) and once with
  ``--clock-control none --cache-control none``.
* Both go through ``gpuscope.topdown`` (the same formulas); per kernel the median over launches is compared node
  by node, as the difference in percent of IPC_MAX (percentage points).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

KERNELS = ("stream", "fma", "divergent")
EXPECTED = {"stream": "backend_memory", "fma": "backend_core", "divergent": "divergence"}


def launch_all(work, launches):
    from numba import cuda

    for _ in range(launches):
        for name in KERNELS:
            work.launch(name)
    cuda.synchronize()


def workload(launches):
    from gpuscope._commands import demo as _demo

    work = _demo.build_workload()
    launch_all(work, launches)


def node_table(ds, kernel_of):
    """Median Top-Down node values per kernel, from a Dataset with dim range."""
    import gpuscope as gs

    td = gs.topdown(ds)
    out = {}
    for k in KERNELS:
        sel = [i for i, name in enumerate(kernel_of) if k in name and not (k == "fma" and "divergent" in name)]
        out[k] = {n: float(np.median(td[n].values[sel])) for n in td.data_vars}
    return out


def ncu_dataset(rows, metrics, cc):
    import xarray as xr

    data = {m: ("range", [float(r[m].replace(",", "")) for r in rows]) for m in metrics}
    return xr.Dataset(data, attrs={"compute_capability": cc})


def run_ncu(ncu, metrics, extra, launches):
    cmd = [ncu, "--metrics", ",".join(metrics), "--csv", "--page", "raw", *extra, sys.executable, __file__,
           "workload", "--launches", str(launches)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith('"')]
    rows = list(csv.DictReader(io.StringIO("\n".join(lines))))[1:]  # the second row holds units
    if not rows:
        raise RuntimeError(f"ncu gave no rows (rc {proc.returncode}): {proc.stderr[-800:]}")
    return rows, " ".join(cmd)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", nargs="?", default="bench")
    ap.add_argument("--launches", type=int, default=5)
    ap.add_argument("--ncu", default=shutil.which("ncu") or "/usr/local/cuda/bin/ncu")
    ap.add_argument("--out", default="topdown_vs_ncu.json")
    args = ap.parse_args()
    if args.mode == "workload":
        workload(args.launches)
        return

    import gpuscope as gs
    from gpuscope._commands import demo as _demo
    from numba import cuda

    cc = "%d.%d" % cuda.get_current_device().compute_capability
    metrics = list(gs.metric_set("topdown").metrics)
    work = _demo.build_workload(decorate=gs.profile)
    launch_all(work, 1)
    with gs.Profiler(metrics=metrics, mode="kernel") as prof:
        launch_all(work, args.launches)
    ds = prof.dataset
    results = {"gpuscope": node_table(ds, [str(k) for k in ds["kernel"].values]), "compute_capability": cc,
               "metrics": metrics, "launches": args.launches}
    for label, extra in (("ncu_default", []), ("ncu_no_control", ["--clock-control", "none", "--cache-control", "none"])):
        rows, cmd = run_ncu(args.ncu, metrics, extra, args.launches)
        results[label] = node_table(ncu_dataset(rows, metrics, cc), [r["Kernel Name"] for r in rows])
        results[label + "_cmd"] = cmd

    # gs.topdown gives percent of IPC_MAX for both: a difference is in percentage points
    print("| kernel | node | gpuscope (%) | ncu (no clock/cache control) | diff (pp of IPC_MAX) | ncu default | "
          "diff (pp) |")
    print("|---|---|---|---|---|---|---|")
    worst = {}
    for k in KERNELS:
        g, a, b = results["gpuscope"][k], results["ncu_no_control"][k], results["ncu_default"][k]
        for node in g:
            da, db = abs(g[node] - a[node]), abs(g[node] - b[node])
            worst[k] = max(worst.get(k, 0.0), da)
            print(f"| {k} | {node} | {g[node]:.2f} | {a[node]:.2f} | {da:.2f} | {b[node]:.2f} | {db:.2f} |")
    for k in KERNELS:
        level = {n: v for n, v in results["gpuscope"][k].items() if n in ("divergence", "frontend", "backend_core",
                                                                            "backend_memory")}
        verdict = max(level, key=level.get)
        print(f"{k}: largest lost-IPC node {verdict} (expected {EXPECTED[k]}), "
              f"max difference to ncu (no control) {worst[k]:.2f} pp")
        results.setdefault("verdicts", {})[k] = verdict
    Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
