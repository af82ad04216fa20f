"""gs.sample(kernels=True): kernel executions from CUPTI's activity API on the samples' clock, and Top-Down per
phase joined through them."""

import numpy as np
import pytest
import xarray as xr

import gpuscope as gs
from gpuscope._commands import demo as _demo


@pytest.fixture(scope="session")
def run():
    from numba import cuda

    work = _demo.build_workload(n=1 << 22, fma_iters=500)
    for name in _demo.PHASES:
        work.launch(name)
    cuda.synchronize()
    with gs.Profiler("topdown", mode="kernel") as prof:
        for name in _demo.PHASES:
            work.launch(name)
        cuda.synchronize()
    launched = {}
    with gs.sample(metrics="pm-default", interval="100us", kernels=True) as sampler:
        for name in _demo.PHASES:
            with gs.range(name):
                for _ in range(200):
                    work.launch(name)
                launched[name] = 200
                cuda.synchronize()
    return prof.dataset, sampler.dataset, launched


def test_every_launch_is_one_execution_inside_the_session(run):
    _, ts, launched = run
    table = gs.kernel_executions(ts)
    short = table["kernel"].str.rsplit(".", n=1).str[-1]
    assert short.value_counts().to_dict() == launched
    assert ts.attrs["kernel_records_dropped"] == 0 and ts.attrs["kernel_records_incomplete"] == 0
    assert (table["duration_ns"] > 0).all()
    assert table["start_ns"].min() >= ts.attrs["session_start_ns"]
    assert table["end_ns"].max() <= ts.attrs["session_end_ns"]
    one_stream = table[table["stream"] == table["stream"].iloc[0]]
    assert (one_stream["start_ns"].values[1:] >= one_stream["end_ns"].values[:-1]).all()  # a stream runs in order
    # each kernel runs inside its range
    spans = gs.spans(ts)
    for name in launched:
        span = spans[spans["path"] == name].iloc[0]
        mine = table[short == name]
        assert mine["start_ns"].min() >= span["start_ns"] and mine["end_ns"].max() <= span["end_ns"] + 1_000_000


def test_execution_times_agree_with_the_range_profiler(run):
    launches, ts, _ = run
    table = gs.kernel_executions(ts)
    short = table["kernel"].str.rsplit(".", n=1).str[-1]
    profiled = launches["gpu__time_duration.sum"].groupby(launches["kernel"]).mean().to_pandas()
    for name, ns in profiled.items():
        traced = float(table["duration_ns"][short == name.rsplit(".", 1)[-1]].median())
        assert traced == pytest.approx(float(ns), rel=0.25), name


def test_topdown_per_phase_by_kernels(run):
    launches, ts, _ = run
    td = gs.topdown(launches, check="ignore")
    ph = gs.phases(ts)
    per = gs.dynamic(td, phases=ph)
    assert per.attrs["topdown_by"] == "kernels" and bool(per["has_topdown"].all())
    # a phase of the GPU's own activity: the detector also finds idle stretches (a shuffled run once gave a 5 ms
    # phase between two ranges with 0.2% kernel time), which have no kernels to attribute
    active = ph["phase_mean"].sel(metric="gr__cycles_active.avg.pct_of_peak_sustained_elapsed").values > 50
    busy = (per["phase_duration"] > 5e6) & xr.DataArray(active, dims="phase_id")
    assert bool(busy.any())
    # kernel time over phase time: 200 short launches leave launch gaps (0.42 for the stream phase on the H100)
    fraction = per["attributed_fraction"].where(busy, drop=True)
    assert float(fraction.min()) > 0.3, (fraction.values, ph["phase_mean"].values, ph["phase_duration"].values)
    total = sum(per[n] for n in ("retire", "divergence", "frontend", "backend"))
    np.testing.assert_allclose(total.where(busy, drop=True), 100.0, atol=5.0)  # percent of IPC_MAX


def test_kernel_replay_after_kernel_records(run):
    """Kernel replay after a kernels=True session in the same process (hung once on the H100 in a shuffled run;
    not reproduced since by probes/probe_kernel_records_twice.py): it completes and counts the same launches."""
    from numba import cuda

    work = _demo.build_workload(n=1 << 22, fma_iters=500)
    with gs.Profiler("topdown", mode="kernel") as prof:
        for name in _demo.PHASES:
            work.launch(name)
        cuda.synchronize()
    before, _, _ = run
    assert prof.dataset.sizes["range"] == before.sizes["range"] == len(_demo.PHASES)
    # the same kernels, though other dispatchers: one process names two kernels of one short name apart
    # (kernel_names: "fma" and "kernels.<locals>.fma", depending on which the process saw first)
    last = lambda names: sorted(str(n).rsplit(".", 1)[-1] for n in names)  # noqa: E731
    assert last(prof.dataset["kernel"].values) == last(before["kernel"].values)
