"""Probe: how long each tool says a short kernel ran, against how long the program's own launch ran.

Run on the GPU machine from the repository root:

    source tests/gpu/device_env.sh; python3 probes/probe_replay_durations.py --out $OUT/durations

Under kernel replay, ``gpu__time_duration.sum`` is collected in one pass of the replay, and the passes of a short
kernel do not run alike. The same launches (``Work``: a PyTorch training step, small CuPy kernels, Numba kernels),
in one process, their durations from:

* ``kernel_pass1``: gpuscope's kernel mode, its pass plan with the durations in the first pass (the program's
  launch; the plan before it moved them);
* ``kernel_pass3``: the same with the durations in the first stall pass (the third), as the plan has them;
* ``kernel_single``: gpuscope's kernel mode with the duration alone (one pass: nothing replayed);
* ``iteration``: gpuscope's iteration mode (the program's own launches, counters on, nothing replayed);
* ``unprofiled``: CUPTI's kernel activity records (``gs.sample(kernels=True)``, PM sampling every 1 ms beside
  them): no range profiling, nothing replayed or serialized;
* ``ncu_none_1``, ``ncu_none_2``: ncu's kernel replay with ``--cache-control none`` (as the benchmarks run it);
* ``ncu_all``: ncu's kernel replay with its default ``--cache-control all`` (caches flushed before each pass);
* ``ncu_single``: ncu with the duration alone (one pass: ncu then saves and restores nothing).

The ncu runs but ``ncu_single`` ask for the ``topdown`` set, as the benchmarks do.

Prints, by kernel length, the median ratio of each to ``ncu_none_1`` and to ``unprofiled``, and writes
``durations.json`` (every launch's duration, ns, by source).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_stalls_vs_ncu import BUCKETS  # noqa: E402
from probe_pass_consistency import Work, run_ncu, session  # noqa: E402

DURATION = "gpu__time_duration.sum"


def kernel_groups(position: int):
    """The ``topdown`` set's pass groups as the plan makes them, with the durations in pass *position* (1: the
    first, the program's launch; 3: the first stall pass, where the plan has them on GH100)."""
    import gpuscope as gs
    from gpuscope._gpu import metric_lists

    metrics = tuple(metric_lists.resolve(list(gs.metric_set("topdown").metrics), "GH100"))
    moved = ["sm__cycles_elapsed.max", DURATION]
    groups = [[m for m in g if m not in moved] for g in metric_lists.consistent_plan(metrics, "GH100").groups]
    groups[position - 1] += moved
    return groups


def durations_kernel(work, groups):
    rows = session(work, 1, list(dict.fromkeys(m for g in groups for m in g)), groups)["rows"]
    return [r["kernel"] for r in rows], [r[DURATION] for r in rows]


def durations_iteration(work):
    import gpuscope as gs

    with gs.Profiler("topdown", mode="iteration") as prof:
        for _ in range(prof.passes + 1):  # one iteration sizes the image, then one per pass
            prof.step()
            work.step()
    ds = prof.dataset
    first = ds["passes_from_earlier_group"].values == 0 if "passes_from_earlier_group" in ds.coords else slice(None)
    return [str(k) for k in ds["kernel"].values[first]], [float(v) for v in ds[DURATION].values[first]]


def durations_unprofiled(work):
    import gpuscope as gs

    work.cuda.synchronize()
    with gs.sample("pm-fast", interval="1ms", kernels=True) as s:
        work.step()
        work.cuda.synchronize()
    ex = gs.kernel_executions(s.dataset)
    return [str(k) for k in ex["kernel"]], [float(v) for v in ex["duration_ns"]]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="durations_out")
    ap.add_argument("--ncu", default=shutil.which("ncu") or "/usr/local/cuda/bin/ncu")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    import gpuscope as gs

    work = Work()
    work.step()
    work.step()
    durations_kernel(work, kernel_groups(3))  # a first session costs more: thrown away
    res = {}
    for name, make in (("kernel_pass1", lambda: durations_kernel(work, kernel_groups(1))),
                       ("kernel_pass3", lambda: durations_kernel(work, kernel_groups(3))),
                       ("kernel_single", lambda: durations_kernel(work, [[DURATION]])),
                       ("iteration", lambda: durations_iteration(work)),
                       ("unprofiled", lambda: durations_unprofiled(work))):
        t0 = time.perf_counter()
        try:
            kernels, values = make()
            res[name] = {"kernels": kernels, "ns": values}
            print(f"{name}: {len(values)} launches, {time.perf_counter() - t0:.1f} s", flush=True)
        except Exception as exc:
            res[name] = {"error": repr(exc)}
            print(f"{name}: {exc!r}", flush=True)
    gs.release()
    topdown = list(dict.fromkeys([DURATION, *gs.metric_set("topdown").metrics]))
    for name, metrics, extra in (("ncu_none_1", topdown, ()), ("ncu_none_2", topdown, ()),
                                 ("ncu_all", topdown, ("--cache-control", "all")), ("ncu_single", [DURATION], ())):
        try:
            got = run_ncu(args.ncu, metrics, 1, extra=extra)
            res[name] = {"kernels": [r["kernel"] for r in got["rows"]], "ns": [r[DURATION] for r in got["rows"]]}
            print(f"{name}: {len(got['rows'])} launches, {got['wall_s']:.1f} s", flush=True)
        except Exception as exc:
            res[name] = {"error": repr(exc)}
            print(f"{name}: {exc!r}", flush=True)
    (out / "durations.json").write_text(json.dumps(res))
    for ref in ("ncu_none_1", "unprofiled"):
        if "ns" not in res.get(ref, {}):
            continue
        base = np.asarray(res[ref]["ns"])
        length = np.asarray(res["ncu_none_1"]["ns"] if "ns" in res.get("ncu_none_1", {}) else base) / 1e3
        print(f"median duration / {ref}'s, by kernel length (ncu_none_1's):")
        for name, r in res.items():
            if name == ref or "ns" not in r:
                continue
            if len(r["ns"]) != len(base):
                print(f"  {name}: {len(r['ns'])} launches against {len(base)}")
                continue
            q = np.asarray(r["ns"]) / base
            cells = []
            for label, lo, hi in BUCKETS:
                sel = (length[:len(q)] >= lo) & (length[:len(q)] < hi)
                if sel.any():
                    cells.append(f"{label} ({sel.sum()}): {np.median(q[sel]):.3f}")
            print(f"  {name}: " + "; ".join(cells))


if __name__ == "__main__":
    main()
