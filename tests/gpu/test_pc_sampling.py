"""PC sampling on the GPU: the hottest stall of a memory-bound and a compute-bound Numba kernel lands on the
source line that does the work, with the stall reason the kernel's bound predicts."""

import pytest

import gpuscope
from benchmarks import bench_pc_sampling as B


@pytest.fixture(scope="module")
def sampled():
    # kernels CUPTI first sees inside the block: these tests do not depend on what ran before them
    work = B.Workload(fresh=True)
    with gpuscope.pc_sample(period=2**10, kernels=list(work.kernels)) as pcs:
        work.run(20)
    return work, pcs.dataset


def _hot(ds, function):
    kernel = next(k for k in ds.kernel.values.tolist() if k.rsplit(".", 1)[-1] == function)
    sub = ds.where(ds.function == kernel, drop=True)
    by_line = sub.samples.groupby("line").sum("pc")
    line = int(by_line.sum("stall_reason").idxmax())
    reasons = by_line.sel(line=line)
    stalls = reasons.drop_sel(stall_reason=["selected", "not_selected"])
    return line, str(stalls.idxmax().item()), reasons


def test_samples_were_collected(sampled):
    _, ds = sampled
    assert ds.attrs["total_samples"] > 1000
    assert ds.attrs["dropped_samples"] == 0 and ds.attrs["non_user_kernel_samples"] == 0
    assert int(ds.samples.sum()) == ds.attrs["total_samples"]  # every sample counted is in the records


def test_sample_counts_scale_with_the_period(sampled):
    """The records hold 1/8 of the samples at 8x the period (CUPTI's own totalSamples does not: at 2^15 it said
    a few hundred where the records held ~2e5); every sample is accounted for."""
    work, _ = sampled
    totals = {}
    for log2 in (10, 13):
        with gpuscope.pc_sample(period=2**log2) as pcs:
            work.run(40)
        ds = pcs.dataset
        assert "cupti_total_samples" in ds.attrs
        assert int(ds.samples.sum()) + ds.attrs["dropped_samples"] + ds.attrs["non_user_kernel_samples"] == \
            ds.attrs["total_samples"]
        totals[log2] = ds.attrs["total_samples"]
    assert totals[10] / totals[13] == pytest.approx(8, rel=0.15), totals


def test_stream_waits_on_memory_at_its_load_line(sampled):
    _, ds = sampled
    line, top, _ = _hot(ds, "stream")
    assert line == B.source_line("STREAM_LINE")
    assert top == "long_scoreboard"


def test_fma_waits_on_the_math_pipe_at_its_fma_lines(sampled):
    _, ds = sampled
    line, top, _ = _hot(ds, "fma")
    first = B.source_line("FMA_LINE")
    assert first - 1 <= line <= first + 3
    assert top in ("math_pipe_throttle", "wait")


def test_second_sampler_and_exceptions_leave_cupti_usable(sampled):
    work, _ = sampled
    with gpuscope.pc_sample(period=2**14):
        with pytest.raises(gpuscope.SamplerBusyError, match="already open"):
            with gpuscope.pc_sample():
                pass
        work.run(2)
    with pytest.raises(KeyError):
        with gpuscope.pc_sample(period=2**14):
            work.run(2)
            raise KeyError("inside")
    with gpuscope.pc_sample(period=2**12) as again:
        work.run(4)
    assert again.records.total_samples > 0


_BOTH_ORDERS = r"""
import sys, warnings
import gpuscope
from benchmarks import bench_pc_sampling as B
work = B.Workload()
def pcs():
    fresh = B.Workload(fresh=True)  # kernels CUPTI first sees inside the block
    with gpuscope.pc_sample(period=2**10, kernels=list(fresh.kernels)) as s:
        fresh.run(20)
    return s.records
def ranges():
    with gpuscope.Profiler("topdown", mode="kernel") as prof:
        work.run(2)
    return prof.dataset.sizes["range"]
warnings.simplefilter("error", gpuscope.GpuscopeWarning)
order = {"pc-first": [pcs, ranges], "ranges-first": [ranges, pcs], "between": [ranges, pcs, ranges, pcs]}
for step in order[sys.argv[1]]:
    got = step()
    if step is pcs:
        kernels = sorted({f.rsplit("6cudapy", 1)[-1][:40] for f in got.function})
        print(got.non_user_kernel_samples, int(got.samples.sum()), len(kernels))
"""


@pytest.mark.parametrize("order", ["pc-first", "ranges-first", "between"])
def test_pc_sampling_before_after_and_between_range_profiling(order):
    """In one process, PC sampling delivers every sample of the kernels it samples, before, after and between
    range-profiling sessions (warnings are errors: no sample goes unattributed)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", _BOTH_ORDERS, order], capture_output=True, text=True, timeout=300,
                         cwd=root)
    assert out.returncode == 0, out.stderr[-3000:]
    for line in out.stdout.strip().splitlines():
        unattributed, delivered, kernels = map(int, line.split())
        assert unattributed == 0 and delivered > 10000 and kernels == 2, line


_FIRST_SEEN = r"""
import json, sys, warnings
import numpy as np
import gpuscope
from benchmarks import bench_pc_sampling as B
work = B.Workload()  # both kernels load and run before any CUPTI call
with gpuscope.Profiler("topdown", mode="kernel") as counters:
    work.stream()  # stream runs under range profiling
    work.fma()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    with gpuscope.pc_sample(period=2**10, kernels=[B.stream, B.fma]) as s:
        work.run(20)
    try:  # after the counter Top-Down of the same kernels
        fast = gpuscope.profile_fast_topdown(lambda: work.run(4))
        without = fast.attrs.get("kernels_without_pc_samples")
        fast_kernels, fast_error = [str(k) for k in fast.kernel.values], ""
        fast_without = [str(k) for k in np.atleast_1d(without) if str(k)] if without is not None else []
    except gpuscope.FastTopDownError as exc:
        fast_kernels, fast_without, fast_error = [], [], str(exc)
ds = s.dataset
print(json.dumps({"kernels": [str(k) for k in ds.kernel.values], "unattributed": ds.attrs["non_user_kernel_samples"],
                  "total": ds.attrs["total_samples"], "in_records": int(ds.samples.sum()),
                  "without_samples": ds.attrs["kernels_without_samples"], "detach": ds.attrs["cupti_detach"],
                  "fast_kernels": fast_kernels, "fast_without": fast_without, "fast_error": fast_error,
                  "warned": [str(w.message) for w in caught if "PC samples" in str(w.message)]}))
"""


def _first_seen(env=None):
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", _FIRST_SEEN], capture_output=True, text=True, timeout=300, cwd=root,
                         env={**os.environ, **(env or {})})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_kernel_range_profiled_first_is_pc_sampled():
    """CUPTI maps a kernel for PC sampling only if it did not run while CUPTI was attached outside a PC block;
    pc_sample detaches CUPTI when it starts (the default), so a kernel profiled by a counter Top-Down first gets all
    its samples, and so does the fast Top-Down after it (``probes/probe_pc_after_ranges.py``)."""
    got = _first_seen({"GPUSCOPE_PC_DETACH": ""})
    assert got["detach"] == "detached", got
    assert sorted(k.rsplit(".", 1)[-1] for k in got["kernels"]) == ["fma", "stream"], got
    assert got["unattributed"] == 0 and got["in_records"] == got["total"] and not got["without_samples"], got
    assert not got["warned"], got
    assert sorted(k.rsplit(".", 1)[-1] for k in got["fast_kernels"]) == ["fma", "stream"], got
    assert not got["fast_without"], got


def test_without_the_detach_the_lost_kernel_is_counted_and_explained():
    """With ``GPUSCOPE_PC_DETACH=0`` (CUPTI not detached), CUPTI 13.0 does not map the kernel that ran under range profiling: its samples are counted as unattributed, or not at all; gpuscope names the kernel,
    from the block's launch count, and says why."""
    got = _first_seen({"GPUSCOPE_PC_DETACH": "0"})
    assert got["detach"].startswith("off"), got
    assert got["in_records"] + got["unattributed"] == got["total"]
    lost = [k for k in ("stream", "fma") if not any(n.endswith(k) for n in got["kernels"])]
    for kernel in lost:  # CUPTI 13.0 on the H100: both ran under range profiling
        assert f"{kernel} (" in got["without_samples"], got
        assert any("No PC samples for" in w and "GPUSCOPE_PC_DETACH" in w for w in got["warned"]), got
    if len(lost) == 2:
        assert "GPUSCOPE_PC_DETACH" in got["fast_error"], got


def test_fast_topdown_in_one_call_agrees_with_the_counter_topdown(sampled):
    """gs.profile_fast_topdown (PC samples + one range pass) against the 7-pass counter Top-Down, same kernels."""
    import numpy as np

    from gpuscope._schema.names import match_kernel

    work, _ = sampled
    fast = gpuscope.profile_fast_topdown(work.run, 20, period=2**10)
    assert sorted(k.rsplit(".", 1)[-1] for k in fast["kernel"].values) == ["fma", "stream"]
    assert (fast["launches"] == 10).all()  # run(20) alternates stream and fma
    assert (fast["samples_per_launch"] > 0).all()
    # iteration mode, not kernel replay: kernel replay is refused after a kernels=True session in the process
    # (tests/gpu/test_kernel_times.py may run first), iteration mode is not (measured in a shuffled run)
    with gpuscope.Profiler("topdown", mode="iteration") as prof:
        for _ in range(prof.passes + 1):
            with gpuscope.range("step"):
                work.run(4)
    full = gpuscope.aggregate(gpuscope.topdown(prof.dataset, check="ignore"), by="kernel")
    for kernel in fast["kernel"].values:
        counter = full.sel(kernel=match_kernel(str(kernel), full["kernel"].values.tolist()))
        for node in ("retire", "frontend", "backend", "backend_memory", "backend_core"):
            pp = abs(float(fast[node].sel(kernel=kernel)) - float(counter[node]))  # points of IPC_MAX
            assert pp < 5, (kernel, node, pp)
    assert np.isfinite(fast["retire"]).all()


_CUPY_FAST = r"""
import json
import cupy as cp
import gpuscope
from gpuscope._schema.names import match_kernel
a = cp.asarray(cp.random.random((4096, 4096)), dtype=cp.float16)
b = cp.asarray(cp.random.random((4096, 4096)), dtype=cp.float16)
scale = cp.ElementwiseKernel("float32 x", "float32 y", "y = x * 2.0f + 1.0f", "gpuscope_scale")
x = cp.ones(1 << 24, dtype=cp.float32)

def step(n):
    for _ in range(n):
        cp.matmul(a, b)
        scale(x)

fast = gpuscope.profile_fast_topdown(step, 10, period=2**10)
with gpuscope.Profiler("topdown", mode="kernel") as prof:
    step(2)
full = gpuscope.aggregate(gpuscope.topdown(prof.dataset, check="ignore"), by="kernel")
rows = {}
for k in fast.kernel.values:
    ref = full.sel(kernel=match_kernel(str(k), [str(n) for n in full.kernel.values]))
    rows[str(k)] = {n: [float(fast[n].sel(kernel=k)), float(ref[n])] for n in ("retire", "frontend", "backend")}
    rows[str(k)]["launches"] = int(fast["launches"].sel(kernel=k))
    rows[str(k)]["samples"] = int(fast["pc_samples"].sel(kernel=k))
print(json.dumps({"rows": rows, "without_pc": fast.attrs["kernels_without_pc_samples"]}))
"""


def test_fast_topdown_on_cupy_gemm_and_elementwise_kernels():
    """One call on CuPy's kernels (a cuBLAS tensor-core GEMM and an ElementwiseKernel), in a fresh process: both
    get a fast Top-Down whose level 1 is within 5 points of IPC_MAX of the 7-pass counter Top-Down."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("cupy")
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", _CUPY_FAST], capture_output=True, text=True, timeout=300, cwd=root)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    rows = got["rows"]
    assert any("gpuscope_scale" in k for k in rows) and len(rows) >= 2, rows
    for kernel, row in rows.items():
        assert row["launches"] == 10 and row["samples"] > 0, (kernel, row)
        for node in ("retire", "frontend", "backend"):
            fast, counter = row[node]
            assert abs(fast - counter) < 5, (kernel, node, fast, counter)  # points of IPC_MAX
