"""gs.report on the H100 recordings: range results (launches and user ranges), PM sampling and PC sampling."""

import os
import warnings

import numpy as np
import pandas as pd
import pytest

import gpuscope as gs
from gpuscope import _demo
from gpuscope._report import Report, report
from gpuscope.errors import NotGpuscopeDataError
from gpuscope.metrics import topdown as td


@pytest.fixture(scope="module")
def launches():
    return gs.open_dataset(_demo.RECORDED_LAUNCHES)


@pytest.fixture(scope="module")
def series():
    return gs.open_dataset(_demo.RECORDED_SERIES)


def test_one_row_per_kernel_with_gpu_time(launches):
    r = report(launches)
    assert isinstance(r, Report) and isinstance(r, pd.DataFrame)
    assert sorted(r.index) == ["divergent", "fma", "stream"] and r.index.name == "kernel"
    assert r["launches"].tolist() == [5, 5, 5]
    t = launches["gpu__time_duration.sum"].values
    kernels = launches["kernel"].values
    for k in r.index:
        assert r.loc[k, "gpu_time_ms"] == pytest.approx(t[kernels == k].sum() / 1e6)
        assert r.loc[k, "mean_us"] == pytest.approx(t[kernels == k].mean() / 1e3)
    assert r["share"].sum() == pytest.approx(1.0)
    assert r.index[0] in ("fma", "divergent") and r.index[-1] == "stream"  # sorted by share of GPU time


def test_verdicts_are_the_topdown_hierarchy(launches):
    r = report(launches)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        per_kernel = td.aggregate(td.topdown(launches), by="kernel")
    for k in r.index:
        row = per_kernel.sel(kernel=k)
        level2 = {n: float(row[n]) for n in td.level_cut(2) if n != "retire"}
        assert r.loc[k, "bound_by"] == max(level2, key=level2.get)
        for n in td.level_cut(1):
            assert r.loc[k, n] == pytest.approx(float(row[n]) / 4.0)
        assert sum(r.loc[k, n] for n in td.level_cut(1)) == pytest.approx(1.0, abs=0.02)
    assert dict(r["bound_by"]) == {"stream": "backend_memory", "fma": "backend_core", "divergent": "divergence_branch"}
    assert r.loc["stream", "culprit"] == "long_scoreboard" and r.loc["fma", "culprit"] == "math_pipe_throttle"
    assert r.loc["divergent", "culprit"] == ""  # divergence_branch has no stall reasons under it
    assert r.loc["stream", "advice"].startswith("Waiting on the memory system")


def test_printed_table_and_html(launches):
    r = report(launches)
    text = str(r)
    assert text.startswith("gpuscope report: 15 launches, 3 kernels")
    assert "backend_memory" in text and "long_scoreboard" in text
    assert f"{100 * r.loc['stream', 'backend']:.1f}%" in text  # fractions print as percentages
    assert repr(r) == text
    page = r._repr_html_()
    assert "<table" in page and "gpuscope report" in page and "backend_core" in page


def test_without_gpu_time_the_proxy_is_named_for_what_it_is(launches):
    r = report(launches.drop_vars("gpu__time_duration.sum"))
    assert "gpu_time_ms" not in r and "launch_call_ms" in r
    wall = (launches["end_ns"] - launches["start_ns"]).values
    kernels = launches["kernel"].values
    assert r.loc["fma", "launch_call_ms"] == pytest.approx(wall[kernels == "fma"].sum() / 1e6)
    assert any("not GPU time" in n for n in r.notes)


def test_user_ranges_are_rows_by_name(launches):
    user = launches.assign_coords(kernel=("range", np.full(launches.sizes["range"], "")),
                                  name=("range", np.array(["step/a", "step/b", "step/b"] * 5)))
    user.attrs["mode"] = "user"
    r = report(user)
    assert r.index.name == "range" and sorted(r.index) == ["step/a", "step/b"]
    assert r["count"].to_dict() == {"step/a": 5, "step/b": 10}


def test_a_set_without_topdown_has_no_verdict(launches):
    plain = launches[["gpu__time_duration.sum", "sm__cycles_elapsed.max"]]
    r = report(plain)
    assert "bound_by" not in r and list(r.columns) == ["launches", "gpu_time_ms", "mean_us", "share"]


def test_pm_sampling_per_user_range(series):
    r = report(series)
    assert r.index.name == "range"
    assert {"stream", "fma", "divergent"} <= set(r.index)
    ranges = series["range"].values
    for name in ("stream", "fma"):
        assert r.loc[name, "samples"] == int((ranges == name).sum())
        m = "dram__read_throughput.avg.pct_of_peak_sustained_elapsed"
        assert r.loc[name, "DRAM read %"] == pytest.approx(float(series[m].values[ranges == name].mean()))
    # the streaming range reads DRAM, the FMA range does not
    assert r.loc["stream", "DRAM read %"] > 20 > r.loc["fma", "DRAM read %"]
    assert r["share"].sum() == pytest.approx(1.0)
    assert str(r).startswith("gpuscope report: PM sampling, 18019 samples")


def test_pm_sampling_per_phase(series):
    short = series.isel(time=slice(0, 6000))  # the stream range and the start of the FMA range
    r = report(short, by="phase")
    assert r.index.name == "phase" and r["samples"].sum() == 6000 and len(r) >= 2


@pytest.fixture(scope="module")
def pc():
    from gpuscope import _pcsampling as P
    from gpuscope import _source
    from gpuscope.cupti import pc_sampling as C

    here = os.path.join(os.path.dirname(__file__), "..", "fixtures", "pc")
    data = np.load(os.path.join(here, "pc_records.npz"))
    registry = _source.CubinRegistry()
    for name in ("stream0.cubin", "fma0.cubin"):
        registry.add(os.path.join(here, name))
    smap = _source.SourceMap(registry)
    return P.records_dataset(C.PCRecords.from_dict(data), data["reason_indices"],
                             [str(n) for n in data["reason_names"]], smap, chip="GH100",
                             attrs={"compute_capability": "9.0"})


def test_pc_sampling_top_stalls_per_kernel(pc):
    r = report(pc)
    assert sorted(r.index) == ["benchmarks.bench_pc_sampling.fma", "benchmarks.bench_pc_sampling.stream"]
    assert r["samples"].sum() == 536398
    assert r.loc["benchmarks.bench_pc_sampling.stream", "stall_1"] == "long_scoreboard"
    assert r.loc["benchmarks.bench_pc_sampling.fma", "stall_1"] == "math_pipe_throttle"
    fma = pc["kernel_samples"].sel(kernel="benchmarks.bench_pc_sampling.fma")
    assert r.loc["benchmarks.bench_pc_sampling.fma", "stall_1_share"] == pytest.approx(
        float(fma.sel(stall_reason="math_pipe_throttle") / fma.sum()))
    assert len(report(pc, top=1).filter(like="stall_").columns) == 2


def test_saved_and_loaded_reports_agree(launches, tmp_path):
    path = tmp_path / "out.nc"
    gs.save_dataset(launches, path)
    pd.testing.assert_frame_equal(report(gs.open_dataset(path)), report(launches))


def test_bad_input(launches):
    import xarray as xr

    with pytest.raises(NotGpuscopeDataError, match="not a gpuscope Dataset"):
        report(xr.Dataset({"x": ("foo", [1.0])}))
    with pytest.raises(ValueError, match="takes"):
        report(launches, top=2)
    with pytest.raises(ValueError, match="not a coordinate"):
        report(launches, by="nope")


def test_nothing_profiled_says_so(launches):
    r = report(launches.isel(range=slice(0, 0)))
    assert len(r) == 0 and "nothing was profiled" in str(r)


def test_mangled_kernel_symbols_become_readable_rows(launches):
    from tests.unit.test_names import recorded_symbols

    symbols, _ = recorded_symbols()  # __main__.stream, __main__.fma, __main__.inc as the driver names them
    raw = launches.assign_coords(kernel=("range", np.array([symbols[i % 3] for i in range(launches.sizes["range"])])))
    r = report(raw)
    assert sorted(r.index) == ["__main__.fma", "__main__.inc", "__main__.stream"]
    assert r["launches"].tolist() == [5, 5, 5]


def test_grouping_by_launch_titles_the_rows_by_launch(launches):
    r = report(launches, by="launch")
    assert r.index.name == "launch"
    assert f"{launches.sizes['range']} launches, {len(r)} launches" in r.title
    one = report(launches.isel(range=[0]))
    assert "report: 1 launch, 1 kernel," in one.title
