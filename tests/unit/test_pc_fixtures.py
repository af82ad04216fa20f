"""PC samples recorded on the H100 (CUPTI 13.0), parsed and mapped to source with this machine's CUPTI.

``tests/fixtures/pc/``: ``pc_records.npz`` (raw records of ``benchmarks/bench_pc_sampling.py``'s ``stream`` and
``fma``, 20 launches each, period 1024 cycles, and CUPTI's stall-reason table), the two cubins Numba produced,
and the benchmark source as it was when recorded (line numbers refer to it).
"""

import os
from pathlib import Path

import numpy as np
import pytest

from gpuscope._pc_sampling import fast as _fast
from gpuscope.cupti import pc_sampling as C
from tests.fixtures.pc import recording

HERE = os.path.join(os.path.dirname(__file__), "..", "fixtures", "pc")
STREAM_LINE, FMA_LINE = 30, 42


def _fixture(name):
    return os.path.join(HERE, name)


@pytest.fixture(scope="module")
def recorded():
    return recording.records()[0], recording.dataset()


def test_cubin_crcs_match_the_records(recorded):
    records, _ = recorded
    crcs = {C.cubin_crc(Path(_fixture(n)).read_bytes()) for n in ("stream0.cubin", "fma0.cubin")}
    assert crcs == {2308074808, 3676127959}
    assert set(records.cubin_crc.tolist()) == crcs


def test_totals_and_reasons(recorded):
    records, ds = recorded
    assert (records.total_samples, records.dropped_samples) == (536398, 0)
    assert int(ds.samples.sum()) == 536398  # every sample is in exactly one warp state
    assert int(ds.samples_not_issued.sum()) == 282095
    assert ds.sizes["stall_reason"] == 19  # sample_count and samples_data_dropped are not warp states
    assert "warpgroup_arrive" in ds.stall_reason.values


def test_kernels_named_as_the_process_names_them_and_qualified_beside(recorded):
    _, ds = recorded
    assert ds.kernel.values.tolist() == ["fma", "stream"]
    assert ds.kernel_qualname.values.tolist() == ["benchmarks.bench_pc_sampling.fma",
                                                  "benchmarks.bench_pc_sampling.stream"]
    assert sorted(set(ds.function.values.tolist())) == ["fma", "stream"]  # each PC's kernel, as the kernel dim
    assert ds.attrs["functions_without_lineinfo"] == "" and ds.attrs["functions_without_cubin"] == ""


def _hot(ds, kernel):
    sub = ds.where(ds.function == kernel, drop=True)
    by_line = sub.samples.groupby("line").sum("pc")
    line = int(by_line.sum("stall_reason").idxmax())
    stalls = by_line.sel(line=line).drop_sel(stall_reason=["selected", "not_selected"])
    return line, str(stalls.idxmax().item()), by_line


def test_stream_hottest_stall_is_long_scoreboard_on_its_load_line(recorded):
    _, ds = recorded
    line, top, by_line = _hot(ds, "stream")
    assert (line, top) == (STREAM_LINE, "long_scoreboard")
    assert int(by_line.sel(line=line, stall_reason="long_scoreboard")) == 336656
    text = ds.line_text.where(ds.line == STREAM_LINE, drop=True).values[0]
    assert text.startswith("z[i] = a * x[i] + y[i]")


def test_fma_hottest_stall_is_the_math_pipe_in_its_loop(recorded):
    _, ds = recorded
    line, top, _ = _hot(ds, "fma")
    assert FMA_LINE - 1 <= line <= FMA_LINE + 3
    assert top == "math_pipe_throttle"
    fma = ds.kernel_samples.sel(kernel="fma")
    assert int(fma.sel(stall_reason="math_pipe_throttle")) == 39999


def test_sass_to_source_on_recorded_cubin():
    cubin = Path(_fixture("stream0.cubin")).read_bytes()
    records = C.PCRecords.from_dict(np.load(_fixture("pc_records.npz")))
    name = next(f for f in records.function if "stream" in f)
    loc = C.sass_to_source(cubin, name, 160)
    assert (loc.line, loc.file) == (30, "bench_pc_sampling.py")
    with pytest.raises(C.CuptiError):
        C.sass_to_source(cubin, "no_such_function", 0)


def _ncu_dataset():
    import collections
    import csv

    import xarray as xr

    from gpuscope.metrics import topdown as td

    values = collections.defaultdict(lambda: collections.defaultdict(list))
    with open(_fixture("ncu_topdown_gh100.csv")) as fh:
        for row in csv.DictReader(fh):
            kernel = "stream" if "stream" in row["Kernel Name"] else "fma"  # as gpuscope names it in the process
            values[kernel][row["Metric Name"]].append(float(row["Metric Value"]))
    kernels = sorted(values)
    metrics = td.required_metrics("9.0", optional=True)
    return xr.Dataset({m: ("kernel", [np.mean(values[k][m]) for k in kernels]) for m in metrics},
                      coords={"kernel": kernels}, attrs={"compute_capability": "9.0"})


def test_fast_topdown_within_5_points_of_the_counter_topdown(recorded):
    """Same kernels on the H100: ncu's 22 Top-Down counters (3 launches each) vs PC-sampled stall shares."""
    from gpuscope.metrics import topdown as td

    _, ds = recorded
    ncu = _ncu_dataset()
    full = td.topdown(ncu, check="ignore")
    fast = _fast.fast_topdown(ds, ncu[[td.IPC_EXECUTED, td.IPC_ISSUED, td.THREADS_PER_INST]])
    diff = {n: np.abs(fast[n] - full[n]).max().item() for n in fast.data_vars}  # points of peak
    assert max(diff.values()) < 5.0
    assert diff["backend_core_math_pipe_throttle"] == pytest.approx(3.05, abs=0.05)  # the largest
    assert float(fast["backend_memory"].sel(kernel="stream")) == pytest.approx(67.65, abs=0.025)
