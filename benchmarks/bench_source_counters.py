"""What source counters cost, end to end, against ``ncu --section SourceCounters`` on the same kernels.

Run on a GPU from the repository root::

    python3 benchmarks/bench_source_counters.py --launches 20 200 --repeats 3

Workload: ``benchmarks/bench_pc_sampling.py``'s ``stream`` (3 x 64 MiB) and ``fma`` kernels, alternating. For each
launch count it times, median of ``--repeats``:

* ``plain``: the launches alone;
* ``source_counters``: from entering ``gs.source_counters()`` to holding its Dataset (SASS patching at each kernel's
  first launch in the block, the patched launches, flush, disable, the Dataset with source lines);
* ``profile_source``: ``gs.profile_source`` (the launches twice: under PC sampling at period 2^10, then counted,
  and the join);
* ``ncu``: the whole process of ``ncu --section SourceCounters --clock-control none --cache-control none`` on the
  same launches (this script's ``--child``), minus the same process run without ncu.

Two launch counts separate the fixed cost (patching, setup) from the cost per launch. Prints a Markdown table; with
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


def _median_time(fn, repeats: int) -> float:
    from numba import cuda

    times = []
    for _ in range(repeats):
        cuda.synchronize()
        began = time.perf_counter()
        fn()
        cuda.synchronize()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def _process_time(cmd: list[str]) -> float:
    began = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - began


def child(launches: int) -> None:
    """The workload alone, as ncu's target (and its no-ncu twin)."""
    from numba import cuda

    from benchmarks.bench_pc_sampling import Workload

    Workload().run(launches)
    cuda.synchronize()


def measure(launches: int, repeats: int, ncu: str | None) -> dict:
    import gpuscope as gs
    from benchmarks.bench_pc_sampling import Workload

    work = Workload(fresh=True)  # kernels not launched yet: the first block pays the patching as a user would
    row = {"launches": launches}
    row["plain_s"] = _median_time(lambda: work.run(launches), repeats)

    def counted():
        with gs.source_counters(kernels=list(work.kernels)) as sc:
            work.run(launches)
        row["instructions"] = int(sc.dataset["smsp__sass_inst_executed"].sum())

    row["source_counters_s"] = _median_time(counted, repeats)
    row["profile_source_s"] = _median_time(
        lambda: gs.profile_source(work.run, launches, kernels=list(work.kernels)), repeats)
    if ncu:
        gs.release()
        base = [sys.executable, os.path.abspath(__file__), "--child", str(launches)]
        profiled = [ncu, "--section", "SourceCounters", "--clock-control", "none", "--cache-control", "none",
                    "-k", "regex:stream|fma", "--target-processes", "all", *base]
        plain = statistics.median(_process_time(base) for _ in range(repeats))
        row["ncu_s"] = statistics.median(_process_time(profiled) for _ in range(repeats)) - plain
    return row


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, nargs="+", default=[20, 200])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--ncu", default=shutil.which("ncu") or "/usr/local/cuda/bin/ncu",
                        help="the ncu to compare with; 'none' to skip")
    parser.add_argument("--out", help="also write the rows as JSON here")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        child(args.child)
        return []
    ncu = None if args.ncu == "none" or not os.path.exists(args.ncu) else args.ncu
    rows = [measure(n, args.repeats, ncu) for n in args.launches]
    print(f"median of {args.repeats}; seconds end to end, and ms per launch beyond plain")
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
