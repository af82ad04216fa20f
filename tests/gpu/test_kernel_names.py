"""One name per kernel in every Dataset of a process (issue 33 item 6): counter results, PC samples, fast Top-Down
and PM kernel executions name a kernel alike, with its qualified name beside, so that they join and compare. Two
modules' kernels of the same name (``benchmarks.workloads.stream`` and ``benchmarks.bench_pc_sampling.stream``) are
told apart the same way in all of them. In a fresh process, so that the names are the process's own."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json, warnings
import numpy as np
from numba import cuda
import gpuscope as gs
from benchmarks import bench_pc_sampling as B
from benchmarks import workloads as W

warnings.simplefilter("ignore", gs.GpuscopeWarning)
w = W.StreamFma(n=1 << 22)
b = B.Workload()  # its stream and fma have launched: compiled and loaded

def loop(steps):
    for _ in range(steps):
        w.stream()
        w.fma(400)
        b.run(2)  # bench_pc_sampling's stream, then its fma
    cuda.synchronize()

def column(ds, name):  # a coordinate, or a column of PM samples' execution table (a Dataset attr)
    return np.atleast_1d(ds.attrs[name] if name in ds.attrs else ds[name].values).tolist()

def names(ds, kernel, qualname):
    pairs = zip(column(ds, kernel), column(ds, qualname))
    return sorted({(str(k), str(q)) for k, q in pairs if str(k)})

with gs.Profiler("launch", mode="kernel") as counters:
    loop(2)
with gs.Profiler("topdown", mode="iteration") as topdown:
    for _ in range(topdown.passes + 1):
        topdown.step()
        loop(1)
with gs.pc_sample(period=2**12, kernels=[B.stream, B.fma]) as pc:
    loop(4)
fast = gs.profile_fast_topdown(loop, 2)
with gs.Profiler("launch", mode="kernel") as again:  # kernel replay before PM's kernel records, as test_pc_sampling
    loop(2)
with gs.sample("pm-default", "100us", kernels=True) as pm:
    loop(20)
compared = gs.compare(counters.dataset, again.dataset)
print(json.dumps({
    "counters": names(counters.dataset, "kernel", "kernel_qualname"),
    "topdown": names(topdown.dataset, "kernel", "kernel_qualname"),
    "again": names(again.dataset, "kernel", "kernel_qualname"),
    "pc": names(pc.dataset, "kernel", "kernel_qualname"),
    "fast": names(fast, "kernel", "kernel_qualname"),
    "pm": names(pm.dataset, "exec_kernel", "exec_kernel_qualname"),
    "compared": sorted({str(k) for k in compared.index.get_level_values("kernel")}),
    "only_in_one": [q for q in compared.index.get_level_values("quantity") if str(q).startswith("only in")],
}))
"""


def test_one_name_per_kernel_across_every_dataset_of_a_process():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    counters = dict(got["counters"])
    qualnames = sorted(counters.values())
    assert qualnames == ["benchmarks.bench_pc_sampling.fma", "benchmarks.bench_pc_sampling.stream",
                         "benchmarks.workloads.fma", "benchmarks.workloads.stream"], got
    # short where unambiguous: the first kernel named fma is "fma", the other module's keeps its module
    assert sorted(counters) == ["bench_pc_sampling.fma", "bench_pc_sampling.stream", "fma", "stream"], got
    for kind in ("topdown", "pc", "fast", "again", "pm"):
        assert dict(got[kind]) == counters, (kind, got)  # every kernel, by the same name, with the same qualname
    assert got["compared"] == sorted(counters) and not got["only_in_one"], got  # compare joins two sessions
