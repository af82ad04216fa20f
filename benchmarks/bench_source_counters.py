"""What source counters cost, end to end, against ``ncu --section SourceCounters`` on the same kernels.

Run on a GPU from the repository root::

    python3 benchmarks/bench_source_counters.py --launches 20 200 --repeats 3

Workload: ``benchmarks/bench_pc_sampling.py``'s ``stream`` (3 x 64 MiB) and ``fma`` kernels, alternating. For each
launch count it times, median of ``--repeats``:

* ``plain``: the launches alone;
* ``source_counters``: from entering ``gs.source_counters()`` to holding its Dataset (SASS patching at each kernel's
  first launch in the block, the patched launches, flush, disable, the detach, the Dataset with source lines);
* ``profile_source``: ``gs.profile_source`` (the launches twice: under PC sampling at period 2^10, then counted,
  and the join);
* ``ncu``: the whole process of ``ncu --section SourceCounters --clock-control none --cache-control none`` on the
  same launches (this script's ``--child``), minus the same process run without ncu.

Each case runs in processes of its own (CUPTI configures SASS metrics once per process), the kernels compiled at
their first launch inside the timed part in every case alike. Two launch counts separate the fixed cost (patching, setup) from the cost per launch. Prints a Markdown table; with
``--out FILE`` also writes the numbers as JSON.
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

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _process(cmd: list[str]) -> tuple[float, dict]:
    """Wall time of a whole process, and what it printed last as JSON (a gpuscope child's block time)."""
    began = time.perf_counter()
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    wall = time.perf_counter() - began
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    return wall, (json.loads(lines[-1]) if lines else {})


def child(mode: str, launches: int) -> None:
    """One process: the workload (``plain``), or the workload in a ``source_counters`` block or under
    ``profile_source`` (CUPTI configures SASS metrics once per process); prints the block's time as JSON."""
    from numba import cuda

    import gpuscope as gs
    from benchmarks.bench_pc_sampling import Workload

    work = Workload(fresh=True)  # kernels not launched yet: the block pays the patching as a user's would
    cuda.synchronize()
    began = time.perf_counter()
    out = {}
    if mode == "source_counters":
        with gs.source_counters(kernels=list(work.kernels)) as sc:
            work.run(launches)
        out["instructions"] = int(sc.dataset["smsp__sass_inst_executed"].sum())
    elif mode == "profile_source":
        gs.profile_source(work.run, launches, kernels=list(work.kernels))
    else:
        work.run(launches)
    cuda.synchronize()
    out["block_s"] = time.perf_counter() - began
    print(json.dumps(out))


def measure(launches: int, repeats: int, ncu: str | None) -> dict:
    row = {"launches": launches}
    me = [sys.executable, os.path.abspath(__file__), "--child"]
    for mode in ("plain", "source_counters", "profile_source"):
        runs = [_process([*me, mode, str(launches)]) for _ in range(repeats)]
        row[f"{mode}_process_s"] = statistics.median(w for w, _ in runs)
        row[f"{mode}_s"] = statistics.median(r["block_s"] for _, r in runs)
        if mode == "source_counters":
            row["instructions"] = runs[-1][1].get("instructions")
    if ncu:
        profiled = [ncu, "--section", "SourceCounters", "--clock-control", "none", "--cache-control", "none",
                    "-k", "regex:stream|fma", "--target-processes", "all", *me, "plain", str(launches)]
        row["ncu_process_s"] = statistics.median(_process(profiled)[0] for _ in range(repeats))
        row["ncu_s"] = row["ncu_process_s"] - row["plain_process_s"] + row["plain_s"]  # as a block: beyond plain
    return row


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, nargs="+", default=[20, 200])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ncu", default=shutil.which("ncu") or "/usr/local/cuda/bin/ncu",
                        help="the ncu to compare with; 'none' to skip")
    parser.add_argument("--out", help="also write the rows as JSON here")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        child(args.child[0], int(args.child[1]))
        return []
    ncu = None if args.ncu == "none" or not os.path.exists(args.ncu) else args.ncu
    rows = [measure(n, args.repeats, ncu) for n in args.launches]
    print(f"median of {args.repeats}, each a process of its own; seconds from entering the API to holding the "
          "result (ncu: its whole process minus the plain one, plus the plain launches), and ms per launch beyond "
          "plain")
    print("| launches | plain | source_counters | per launch | profile_source | per launch | ncu SourceCounters | "
          "per launch |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        cells = [f"{r['plain_s']:.3f}"]
        for key in ("source_counters_s", "profile_source_s", "ncu_s"):
            if key in r:
                cells += [f"{r[key]:.3f}", f"{1e3 * (r[key] - r['plain_s']) / r['launches']:.2f}"]
            else:
                cells += ["-", "-"]
        print(f"| {r['launches']} | " + " | ".join(cells) + " |")
    for r in rows:
        print(f"whole processes, {r['launches']} launches: plain {r['plain_process_s']:.2f} s, source_counters "
              f"{r['source_counters_process_s']:.2f} s, profile_source {r['profile_source_process_s']:.2f} s"
              + (f", ncu {r['ncu_process_s']:.2f} s" if "ncu_process_s" in r else ""))
    if len(rows) >= 2:
        a, b = rows[0], rows[-1]
        for key in ("source_counters_s", "ncu_s"):
            if key in a and key in b:
                per = (b[key] - a[key]) / (b["launches"] - a["launches"])
                print(f"{key[:-2]}: {1e3 * per:.2f} ms per launch, fixed {a[key] - per * a['launches']:.3f} s "
                      f"(from {a['launches']} and {b['launches']} launches)")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(rows, fh, indent=1)
    return rows


if __name__ == "__main__":
    main()
