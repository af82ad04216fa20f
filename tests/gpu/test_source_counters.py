"""Source counters on the GPU: exact instruction counts per source line of a divergent Numba kernel and a CuPy
RawKernel, what divergence does to the thread counts, and the join with PC sampling.

Counts do not depend on timing: every warp of these launches is full (N is a multiple of the block) and runs the
same path, so a line's warp-level executions are a whole multiple of warps x launches, a loop line's grow by
iterations x warps x launches per extra ``ITERS`` iterations (times the SASS instructions per iteration the
compiler put on the line, k >= 1, whatever it unrolled), and a line run by the even lanes only has exactly 16
threads per warp-level execution.

CUPTI configures SASS metrics once per process (gpuscope/_pc_sampling/counters.py), so each block runs in a process
of its own (:func:`_in_child`: this module's ``child`` with a spec), which returns the rows the tests look at.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from numba import cuda

import gpuscope as gs

THREADS, BLOCKS = 256, 64
N = THREADS * BLOCKS
WARPS = N // 32
ITERS = 48  # a multiple of 8: unrolled copies of the loop body divide it
LAUNCHES = 3
A, B = np.float32(0.999), np.float32(0.001)


def _line(marker: str, text: str | None = None) -> int:
    """The line tagged ``# marker`` (``// marker`` in CUDA code) in this file, or in *text*."""
    if text is None:
        with open(__file__) as fh:
            text = fh.read()
    lines = text.splitlines()
    hits = [n for n, t in enumerate(lines, 1) if t.rstrip().endswith(("# " + marker, "// " + marker))]
    assert len(hits) == 1, (marker, hits)
    return hits[0]


def divergent(out, a, b, iters):
    i = cuda.grid(1)
    if i < out.size:
        acc = out[i]
        if i % 2 == 0:  # BRANCH_LINE
            for _ in range(iters):
                acc = acc * a + b  # EVEN_LOOP_LINE
        out[i] = acc  # STORE_LINE


def _fresh_divergent():
    """A new dispatcher (a new module): CUPTI first sees it in the test that makes it."""
    return cuda.jit(lineinfo=True)(divergent)


def _row(table, marker, text=None):
    hit = np.flatnonzero(table.line.values == _line(marker, text))
    assert hit.size == 1, f"line {marker} is not in the table: {table.line.values.tolist()}"
    return table.isel(source_line=int(hit[0]))


def _counted(kernel, iters, warm=True, launches=LAUNCHES):
    out = cuda.to_device(np.ones(N, dtype=np.float32))
    if warm:  # compiled and run once before the block, as a user's code usually is
        kernel[BLOCKS, THREADS](out, A, B, iters)
        cuda.synchronize()
    with gs.source_counters(kernels=[kernel]) as sc:
        for _ in range(launches):
            kernel[BLOCKS, THREADS](out, A, B, iters)
    name = next(k for k in sc.dataset.kernel.values.tolist() if k.endswith("divergent"))
    return sc.dataset, gs.source(sc.dataset, kernel=name)


def _per_warp_launch(count: int, launches: int = LAUNCHES) -> int:
    assert count % (WARPS * launches) == 0, f"{count} is not a whole number of executions per warp and launch"
    return count // (WARPS * launches)



def _table_rows(table, markers, text=None) -> dict:
    out = {}
    for marker in markers:
        row = _row(table, marker, text)
        out[marker] = {v: float(row[v]) for v in table.data_vars if row[v].dims == ()}
        out[marker]["line_text"] = str(row.line_text.item())
        out[marker]["file"] = str(row.file.item())
    return out


def child(spec: dict) -> dict:
    """One source_counters block (or profile_source run, or error sequence) as *spec* says; JSON-able results."""
    kind = spec["kind"]
    if kind == "numba":
        ds, table = _counted(_fresh_divergent(), spec["iters"], warm=spec["warm"])
        return {"rows": _table_rows(table, ("EVEN_LOOP_LINE", "BRANCH_LINE", "STORE_LINE")),
                "launches": int(table.attrs["launches"]), "dropped": int(ds.attrs["dropped_records"]),
                "vars": sorted(ds.data_vars), "metrics": list(gs.source_counters().metric_names),
                "cupti_detach": ds.attrs["cupti_detach"],
                "totals": {v: float(table[v].sum()) for v in ("smsp__sass_thread_inst_executed",
                                                              "smsp__sass_inst_executed")},
                "pred_on_le_threads": bool((table.smsp__sass_thread_inst_executed_pred_on
                                            <= table.smsp__sass_thread_inst_executed).all()),
                "predicated_off_ge_0": bool((table.predicated_off >= 0).all())}
    if kind == "cupy":
        cp = pytest.importorskip("cupy")
        kernel = cp.RawKernel(CUPY_CODE, "scale_loop", options=("-lineinfo",))
        y = cp.ones(N, dtype=cp.float32)
        with gs.source_counters(kernels=[kernel]) as sc:
            for _ in range(LAUNCHES):
                kernel((BLOCKS,), (THREADS,), (y, A, B, np.int32(N), np.int32(spec["iters"])))
        table = gs.source(sc.dataset, kernel="scale_loop")
        got = {"launches": int(table.attrs["launches"]), "lines": table.line.values.tolist(),
               "inst": float(table.smsp__sass_inst_executed.sum()),
               "threads": float(table.smsp__sass_thread_inst_executed.sum())}
        if _line("CUPY_LOOP_LINE", CUPY_CODE) in got["lines"]:
            got["rows"] = _table_rows(table, ("CUPY_LOOP_LINE",), CUPY_CODE)
            # the line text of a kernel compiled from a string: pass the code under the file name the Dataset shows
            file = os.path.basename(got["rows"]["CUPY_LOOP_LINE"]["file"])
            again = gs.source(sc.build(sources={file: CUPY_CODE}), kernel="scale_loop")
            got["line_text"] = str(_row(again, "CUPY_LOOP_LINE", CUPY_CODE).line_text.item())
        return got
    if kind == "profile_source":
        kernel = _fresh_divergent()
        out = cuda.to_device(np.ones(N, dtype=np.float32))

        def work():
            for _ in range(20):
                kernel[BLOCKS, THREADS](out, A, B, 4 * ITERS)

        tables = gs.profile_source(work, period=2**10, kernels=[kernel])
        table = tables[next(k for k in tables if k.endswith("divergent"))]
        loop = _row(table, "EVEN_LOOP_LINE")
        return {"has_counters": int(table.attrs["has_counters"]), "has_pc_samples": int(table.attrs["has_pc_samples"]),
                "loop_inst": int(loop.smsp__sass_inst_executed), "loop_samples": int(loop.samples),
                "samples": int(table.samples.sum())}
    if kind == "errors":
        kernel = _fresh_divergent()
        out = cuda.to_device(np.ones(N, dtype=np.float32))
        said = {}
        try:
            gs.source_counters(metrics=["smsp__sass_no_such_metric"]).start()
        except gs.UnknownMetricError as exc:
            said["unknown"] = str(exc)
        with gs.pc_sample(period=2**14):
            try:
                gs.source_counters().start()
            except gs.SamplerBusyError as exc:
                said["inside_pc"] = str(exc)
            kernel[BLOCKS, THREADS](out, A, B, ITERS)
        try:
            with gs.source_counters(kernels=[kernel]):
                kernel[BLOCKS, THREADS](out, A, B, ITERS)
                raise KeyError("inside")
        except KeyError:
            said["raised"] = "KeyError"
        try:
            gs.source_counters().start()
        except gs.GpuscopeError as exc:
            said["second"] = str(exc)
        with gs.Profiler("launch", mode="kernel") as prof:  # range profiling after the block sees the launches
            kernel[BLOCKS, THREADS](out, A, B, ITERS)
        said["range_rows"] = int(prof.dataset.sizes["range"])
        with gs.pc_sample(period=2**10) as pc:
            for _ in range(5):
                kernel[BLOCKS, THREADS](out, A, B, 4 * ITERS)
        said["pc_samples"] = int(pc.dataset["samples"].sum())
        return said
    raise ValueError(kind)


def _in_child(**spec) -> dict:
    code = ("import json, sys; sys.path.insert(0, sys.argv[2]); import test_source_counters as t; "
            "print('RESULT' + json.dumps(t.child(json.loads(sys.argv[1]))))")
    done = subprocess.run([sys.executable, "-c", code, json.dumps(spec), os.path.dirname(__file__)],
                          capture_output=True, text=True, timeout=240)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT")]
    assert done.returncode == 0 and lines, (done.stdout[-2000:], done.stderr[-3000:])
    return json.loads(lines[-1][len("RESULT"):])


@pytest.mark.parametrize("warm", [True, False], ids=["run-before-the-block", "first-launch-in-the-block"])
def test_loop_line_counts_iterations_times_warps(warm):
    once = _in_child(kind="numba", iters=ITERS, warm=warm)
    twice = _in_child(kind="numba", iters=2 * ITERS, warm=True)
    assert once["launches"] == LAUNCHES and once["dropped"] == 0 and once["cupti_detach"] == "detached"
    assert set(once["metrics"]) <= set(once["vars"])
    c1 = _per_warp_launch(int(once["rows"]["EVEN_LOOP_LINE"]["smsp__sass_inst_executed"]))
    c2 = _per_warp_launch(int(twice["rows"]["EVEN_LOOP_LINE"]["smsp__sass_inst_executed"]))
    k, rest = divmod(c2 - c1, ITERS)  # SASS instructions per iteration on the line (1: the FFMA)
    assert rest == 0 and 1 <= k <= 4, (c1, c2)
    assert c1 >= k * ITERS
    for marker in ("BRANCH_LINE", "STORE_LINE"):  # outside the loop: the same count for any iteration count
        assert once["rows"][marker]["smsp__sass_inst_executed"] == twice["rows"][marker]["smsp__sass_inst_executed"]


def test_divergence_shows_in_thread_counts():
    got = _in_child(kind="numba", iters=ITERS, warm=True)
    loop, store = got["rows"]["EVEN_LOOP_LINE"], got["rows"]["STORE_LINE"]
    # only the even lanes run the loop: 16 threads per warp-level execution, exactly
    assert loop["smsp__sass_thread_inst_executed"] == 16 * loop["smsp__sass_inst_executed"] > 0
    assert loop["threads_per_instruction"] == 16.0
    # after the branch every lane is active again
    assert store["smsp__sass_thread_inst_executed"] == 32 * store["smsp__sass_inst_executed"] > 0
    assert got["pred_on_le_threads"] and got["predicated_off_ge_0"]
    assert got["totals"]["smsp__sass_thread_inst_executed"] < 32 * got["totals"]["smsp__sass_inst_executed"]
    assert loop["line_text"] == "acc = acc * a + b  # EVEN_LOOP_LINE"


CUPY_CODE = r'''extern "C" __global__ void scale_loop(float* y, float a, float b, int n, int iters) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        float acc = y[i];
        for (int k = 0; k < iters; ++k) {
            acc = acc * a + b;  // CUPY_LOOP_LINE
        }
        y[i] = acc;  // CUPY_STORE_LINE
    }
}
'''


def test_cupy_raw_kernel_counts():
    """Without divergence every instruction runs 32 threads, and the loop adds k SASS instructions per iteration,
    warp and launch."""
    pytest.importorskip("cupy")
    got = [_in_child(kind="cupy", iters=i) for i in (ITERS, 2 * ITERS)]
    assert got[0]["launches"] == LAUNCHES
    assert got[0]["threads"] == 32 * got[0]["inst"] > 0
    c1, c2 = (_per_warp_launch(int(g["inst"])) for g in got)
    # the whole kernel: the loop's FFMAs plus its unrolled control (92 and 149 per warp and launch on the H100)
    assert ITERS <= c2 - c1 <= 4 * ITERS, (c1, c2)


def test_cupy_raw_kernel_with_line_info():
    """The loop line of a CuPy RawKernel compiled with -lineinfo: found in CuPy's kernel cache (the cubin as loaded
    has one NUL more than as cached), its count grows with the iterations (NVRTC's unrolled loop puts a little of
    its control on the line: 53 and 104 per warp and launch on the H100), and its text given as sources."""
    pytest.importorskip("cupy")
    got = [_in_child(kind="cupy", iters=i) for i in (ITERS, 2 * ITERS)]
    assert all("rows" in g for g in got), got[0]["lines"]
    loop = [g["rows"]["CUPY_LOOP_LINE"] for g in got]
    c1, c2 = (_per_warp_launch(int(r["smsp__sass_inst_executed"])) for r in loop)
    assert ITERS <= c2 - c1 <= 4 * ITERS, (c1, c2)
    assert loop[0]["smsp__sass_thread_inst_executed"] == 32 * loop[0]["smsp__sass_inst_executed"]
    assert got[0]["line_text"] == "acc = acc * a + b;  // CUPY_LOOP_LINE"


def test_profile_source_joins_counts_and_stalls_on_the_loop_line():
    got = _in_child(kind="profile_source")
    assert got["has_counters"] == 1 and got["has_pc_samples"] == 1
    assert got["loop_inst"] > 0
    assert got["samples"] > 100
    assert got["loop_samples"] > 0  # 299 of 5,947 on the H100: the stalls gather on the loads and the store


def test_errors_leave_nothing_enabled_and_the_process_profiles_on():
    said = _in_child(kind="errors")
    assert "did you mean" in said["unknown"] or "smsp__sass" in said["unknown"]
    assert "pc_sample block is open" in said["inside_pc"]
    assert said["raised"] == "KeyError"
    assert "once per process" in said["second"]
    # the block's end made CUPTI forget the patched kernels: range profiling and PC sampling see them again
    assert said["range_rows"] == 1 and said["pc_samples"] > 0
