"""Source counters on the GPU: exact instruction counts per source line of a divergent Numba kernel and a CuPy
RawKernel, what divergence does to the thread counts, and the join with PC sampling.

Counts do not depend on timing: every warp of these launches is full (N is a multiple of the block) and runs the
same path, so a line's warp-level executions are a whole multiple of warps x launches, a loop line's grow by
iterations x warps x launches per extra ``ITERS`` iterations (times the SASS instructions per iteration the
compiler put on the line, k >= 1, whatever it unrolled), and a line run by the even lanes only has exactly 16
threads per warp-level execution.
"""

import os

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


@pytest.mark.parametrize("warm", [True, False], ids=["run-before-the-block", "first-launch-in-the-block"])
def test_loop_line_counts_iterations_times_warps(warm):
    kernel = _fresh_divergent()
    ds, once = _counted(kernel, ITERS, warm=warm)
    _, twice = _counted(kernel, 2 * ITERS)
    assert once.attrs["launches"] == LAUNCHES and ds.attrs["dropped_records"] == 0
    assert set(gs.source_counters().metric_names) <= set(ds.data_vars)
    c1 = _per_warp_launch(int(_row(once, "EVEN_LOOP_LINE").smsp__sass_inst_executed))
    c2 = _per_warp_launch(int(_row(twice, "EVEN_LOOP_LINE").smsp__sass_inst_executed))
    k, rest = divmod(c2 - c1, ITERS)  # SASS instructions per iteration on the line (1: the FFMA)
    assert rest == 0 and 1 <= k <= 4, (c1, c2)
    assert c1 >= k * ITERS
    for marker in ("BRANCH_LINE", "STORE_LINE"):  # outside the loop: the same count for any iteration count
        assert int(_row(once, marker).smsp__sass_inst_executed) == int(_row(twice, marker).smsp__sass_inst_executed)


def test_divergence_shows_in_thread_counts():
    _, table = _counted(_fresh_divergent(), ITERS)
    loop, store = _row(table, "EVEN_LOOP_LINE"), _row(table, "STORE_LINE")
    # only the even lanes run the loop: 16 threads per warp-level execution, exactly
    assert int(loop.smsp__sass_thread_inst_executed) == 16 * int(loop.smsp__sass_inst_executed) > 0
    assert float(loop.threads_per_instruction) == 16.0
    # after the branch every lane is active again
    assert int(store.smsp__sass_thread_inst_executed) == 32 * int(store.smsp__sass_inst_executed) > 0
    pred_on, threads = table.smsp__sass_thread_inst_executed_pred_on, table.smsp__sass_thread_inst_executed
    assert bool((pred_on <= threads).all()) and bool((table.predicated_off >= 0).all())
    assert float(threads.sum()) < 32 * float(table.smsp__sass_inst_executed.sum())
    assert loop.line_text.item() == "acc = acc * a + b  # EVEN_LOOP_LINE"


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


def test_cupy_raw_kernel_with_line_info():
    cp = pytest.importorskip("cupy")
    kernel = cp.RawKernel(CUPY_CODE, "scale_loop", options=("-lineinfo",))
    y = cp.ones(N, dtype=cp.float32)
    tables = {}
    for iters in (ITERS, 2 * ITERS):
        with gs.source_counters(kernels=[kernel]) as sc:
            for _ in range(LAUNCHES):
                kernel((BLOCKS,), (THREADS,), (y, A, B, np.int32(N), np.int32(iters)))
        tables[iters] = gs.source(sc.dataset, kernel="scale_loop")
    assert tables[ITERS].attrs["launches"] == LAUNCHES
    loop = [_row(tables[i], "CUPY_LOOP_LINE", CUPY_CODE) for i in (ITERS, 2 * ITERS)]
    c1, c2 = (_per_warp_launch(int(r.smsp__sass_inst_executed)) for r in loop)
    k, rest = divmod(c2 - c1, ITERS)
    assert rest == 0 and 1 <= k <= 4, (c1, c2)
    assert int(loop[0].smsp__sass_thread_inst_executed) == 32 * int(loop[0].smsp__sass_inst_executed)
    # the line text of a kernel compiled from a string: pass the code under the file name the Dataset shows
    file = os.path.basename(str(loop[0].file.item()))
    again = gs.source(sc.build(sources={file: CUPY_CODE}), kernel="scale_loop")
    assert _row(again, "CUPY_LOOP_LINE", CUPY_CODE).line_text.item() == "acc = acc * a + b;  // CUPY_LOOP_LINE"


def test_profile_source_joins_counts_and_stalls_on_the_loop_line():
    kernel = _fresh_divergent()
    out = cuda.to_device(np.ones(N, dtype=np.float32))

    def work():
        for _ in range(20):
            kernel[BLOCKS, THREADS](out, A, B, 4 * ITERS)

    tables = gs.profile_source(work, period=2**10, kernels=[kernel])
    table = tables[next(k for k in tables if k.endswith("divergent"))]
    assert table.attrs["has_counters"] == 1 and table.attrs["has_pc_samples"] == 1
    loop = _row(table, "EVEN_LOOP_LINE")
    assert int(loop.smsp__sass_inst_executed) > 0
    assert int(table.samples.sum()) > 100
    assert int(loop.samples) >= 0.2 * int(table.samples.sum())  # the loop is where the warps spend their time


def test_errors_leave_nothing_enabled_and_the_next_block_works():
    kernel = _fresh_divergent()
    out = cuda.to_device(np.ones(N, dtype=np.float32))
    with pytest.raises(KeyError), gs.source_counters(kernels=[kernel]):
        kernel[BLOCKS, THREADS](out, A, B, ITERS)
        raise KeyError("inside")
    with gs.pc_sample(period=2**14):
        with pytest.raises(gs.SamplerBusyError, match="pc_sample block is open"):
            gs.source_counters().start()
        kernel[BLOCKS, THREADS](out, A, B, ITERS)
    with gs.source_counters(kernels=[kernel]) as sc:
        with pytest.raises(gs.SamplerBusyError, match="already open"):
            gs.source_counters().start()
        kernel[BLOCKS, THREADS](out, A, B, ITERS)
    assert int(sc.dataset.smsp__sass_inst_executed.sum()) > 0
    with pytest.raises(gs.UnknownMetricError):
        gs.source_counters(metrics=["smsp__sass_no_such_metric"]).start()
