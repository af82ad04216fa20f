"""gs.report on the H100 recordings: range results (launches and user ranges), PM sampling and PC sampling."""

import os
import warnings

import numpy as np
import pandas as pd
import pytest

import gpuscope as gs
from gpuscope._commands import demo as _demo
from gpuscope._results.report import Report, report
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
    assert r["share"].sum() == pytest.approx(100.0) and r.units["share"] == "%"
    assert r.index[0] in ("fma", "divergent") and r.index[-1] == "stream"  # sorted by share of GPU time


def test_verdicts_are_the_topdown_hierarchy(launches):
    r = report(launches)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        nodes = td.topdown(launches)
        # launches without a verdict (warp states off 100 +/- 5% and a verdict that leads by less) are left out
        per_kernel = td.aggregate(nodes.isel(range=nodes["decided"].values.astype(bool)), by="kernel")
    assert "left out of the Top-Down columns" in " ".join(r.notes) or nodes["decided"].values.all()
    kept = nodes["decided"].values & ~nodes["consistent"].values  # the recording's two: verdicts leading far
    assert kept.sum() == 2 and "2 launch(es) whose passes disagree keep their verdict" in " ".join(r.notes)
    for k in r.index:
        row = per_kernel.sel(kernel=k)
        level2 = {n: float(row[n]) for n in td.level_cut(2) if n != "retire"}
        assert r.loc[k, "bound_by"] == max(level2, key=level2.get)
        for n in td.level_cut(1):  # the same numbers as gs.aggregate(gs.topdown(ds)): percent of peak
            assert r.loc[k, n] == pytest.approx(float(row[n])) and r.units[n] == "%"
        assert sum(r.loc[k, n] for n in td.level_cut(1)) == pytest.approx(100.0, abs=2)
    assert dict(r["bound_by"]) == {"stream": "backend_memory", "fma": "backend_core", "divergent": "divergence_branch"}
    assert r.loc["stream", "culprit"] == "long_scoreboard" and r.loc["fma", "culprit"] == "math_pipe_throttle"
    assert r.loc["divergent", "culprit"] == ""  # divergence_branch has no stall reasons under it
    assert r.loc["stream", "advice"].startswith("Waiting on the memory system")


def test_printed_table_and_html(launches):
    r = report(launches)
    text = r.to_text(width=200)
    assert text.startswith("gpuscope report: 15 launches, 3 kernels")
    assert "backend_memory" in text and "long_scoreboard" in text
    assert f"{r.loc['stream', 'backend']:.1f}%" in text  # percentages print with their sign
    assert repr(r) == str(r) == r.to_text()
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
    assert r["share"].sum() == pytest.approx(100.0)
    assert r.units["share"] == r.units["DRAM read %"] == "%" and r.units["time_ms"] == "ms"
    assert str(r).startswith("gpuscope report: PM sampling, 18019 samples")


def test_pm_sampling_per_phase(series):
    short = series.isel(time=slice(0, 6000))  # the stream range and the start of the FMA range
    r = report(short, by="phase")
    assert r.index.name == "phase" and r["samples"].sum() == 6000 and len(r) >= 2


@pytest.fixture(scope="module")
def pc():
    from gpuscope._pc_sampling import records as P
    from gpuscope._pc_sampling import source as _source
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
    assert sorted(r.index) == ["fma", "stream"]
    assert r["samples"].sum() == 536398
    assert r.loc["stream", "stall_1"] == "long_scoreboard"
    assert r.loc["fma", "stall_1"] == "math_pipe_throttle"
    fma = pc["kernel_samples"].sel(kernel="fma")
    assert r.loc["fma", "stall_1_share"] == pytest.approx(
        100 * float(fma.sel(stall_reason="math_pipe_throttle") / fma.sum()))
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


# -- on a terminal: the report fits its width, the advice is whole, the rest is one option away ----------------


def _fits(text, width):
    too_long = [line for line in text.splitlines() if len(line) > width]
    assert not too_long, too_long


def _flat(text):
    return " ".join(text.split())


def _reports(launches, series):
    from gpuscope._results.compare import compare

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gs.GpuscopeWarning)
        per_phase = gs.dynamic(td.topdown(launches), phases=gs.phases(series))
        slowed = launches.copy(deep=True)
        slowed["gpu__time_duration.sum"].values[slowed["kernel"].values == "fma"] *= 1.1
        return {"launches": report(launches), "series": report(series), "phases": report(gs.phases(series)),
                "per_phase": report(per_phase), "compare": compare(launches, slowed)}


@pytest.mark.parametrize("width", [80, 200])
def test_every_report_fits_the_width_with_its_advice_whole(launches, series, width):
    for name, r in _reports(launches, series).items():
        text = r.to_text(width=width)
        _fits(text, width)
        for advice in set(r.get("advice", [])) - {""}:
            assert advice in _flat(text), (name, advice)  # in full, wrapped on lines of its own
        for note in r.notes:
            assert note in _flat(text)
    text = report(launches).to_text(width=80)
    assert "advice:" in text and "..." not in text
    # what did not fit is named, with where to see it
    assert "not shown at 80 characters: launches, mean_us" in _flat(text) and "--csv FILE" in text
    wide = report(launches).to_text(width=200)
    assert "not shown" not in wide and all(c in wide.splitlines()[2] for c in ["mean_us", "divergence", "culprit"])


def test_the_width_is_the_terminals(launches, monkeypatch):
    r = report(launches)
    monkeypatch.setenv("COLUMNS", "90")
    _fits(str(r), 90)
    assert str(r) == r.to_text(width=90)
    monkeypatch.setenv("COLUMNS", "250")
    assert str(r) == r.to_text(width=250) and "mean_us" in str(r)
    with pytest.raises(ValueError, match="at least 20"):
        r.to_text(width=10)


def test_long_row_labels_are_shortened_and_said(launches):
    # two template kernels that differ only at the end of their names
    name = "void cutlass::Kernel<cutlass::gemm::kernel::GemmUniversal<" + "float, " * 40 + "%s>>"
    kernels = {"fma": name % "Sm90", "divergent": name % "Sm80", "stream": "stream"}
    long = launches.assign_coords(kernel=("range", [kernels[k] for k in launches["kernel"].values.tolist()]))
    for width in (20, 40, 80, 133):
        text = report(long).to_text(width=width)
        _fits(text, width)
    text = report(long).to_text(width=80)
    assert "row labels shortened with '...' in the middle" in _flat(text)
    rows = [line.split("  ")[0] for line in text.splitlines() if line.startswith("void cutlass::")]
    assert len(rows) == 2 and rows[0] != rows[1] and all(r.endswith(">>") for r in rows)  # still told apart
    assert kernels["fma"] in report(long).index  # the DataFrame keeps it whole


def test_a_phases_result_is_reported_per_phase_never_averaging_labels(series):
    ph = gs.phases(series)
    r = report(ph)
    assert r.index.name == "phase" and "phase" not in r.columns
    labels = ph["phase"].values
    assert sorted(r.index) == sorted(set(labels.tolist()))
    for p in r.index:
        assert r.loc[p, "samples"] == int((labels == p).sum())
    assert r["segments"].sum() == ph.sizes["segment"]
    # per user range as well, without a column of averaged labels
    by_range = report(ph, by="range")
    assert by_range.index.name == "range" and "phase" not in by_range.columns


@pytest.fixture(scope="module")
def unattributed(launches, series):
    """A Top-Down per phase in which the fma range's samples lost their range: that phase has no Top-Down."""
    short = series.isel(time=slice(0, 9000))
    ranges = short["range"].values.astype(str)
    short = short.assign_coords(range=("time", np.where(ranges == "fma", "", ranges)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gs.GpuscopeWarning)
        return gs.dynamic(td.topdown(launches), phases=gs.phases(short))


def test_a_phase_without_attributed_work_says_so(unattributed):
    r = report(unattributed)
    none = unattributed["attributed_fraction"].values == 0
    assert none.any() and (~none).any()
    for p, empty in zip(unattributed["phase_id"].values, none):
        if empty:
            assert r.loc[p, "bound_by"] == "not attributed" and r.loc[p, "advice"] == ""
            assert r.loc[p, ["retire", "divergence", "frontend", "backend"]].isna().all()
        else:
            assert r.loc[p, "attributed"] > 0 and np.isfinite(r.loc[p, "retire"])
    text = r.to_text(width=120)
    assert "not attributed" in text and "nan" not in text.lower()
    row = next(line for line in text.splitlines() if "not attributed" in line and not line.startswith("note"))
    assert "%" not in row.split("not attributed")[0].split()[-1]  # no Top-Down number beside it


def test_a_sliver_of_attribution_is_not_printed_as_zero(unattributed):
    tiny = unattributed.copy(deep=True)
    tiny["attributed_fraction"].values[0] = 1e-5
    text = report(tiny).to_text(width=120)
    row = next(line for line in text.splitlines() if line.startswith(str(int(tiny["phase_id"].values[0])) + " "))
    assert "<0.1%" in row and " 0.0%" not in row


def _spoiled(ds, kernel, value):
    out = ds.copy(deep=True)
    for v in out.data_vars:
        out[v].values[out["kernel"].values == kernel] = value
    return out


def test_inf_launches_are_no_data_never_a_verdict(launches):
    r = report(_spoiled(launches, "divergent", np.inf))
    assert r.loc["divergent", "bound_by"] == "no data"
    assert r.loc["divergent", "culprit"] == r.loc["divergent", "advice"] == ""
    assert r.loc[["divergent"], ["retire", "divergence", "frontend", "backend", "gpu_time_ms"]].isna().all(axis=None)
    # the other kernels are untouched, and the share is of the time that is known
    clean = report(launches.isel(range=np.flatnonzero(launches["kernel"].values != "divergent")))
    for k in ("fma", "stream"):
        assert r.loc[k, "bound_by"] == clean.loc[k, "bound_by"]
        assert r.loc[k, "share"] == pytest.approx(clean.loc[k, "share"])
    text = r.to_text(width=200)
    line = next(x for x in text.splitlines() if x.startswith("divergent"))
    assert "no data" in line and "%" not in line and "inf" not in line
    assert "divergence_replay" not in text
    assert any("NaN or inf" in n and "5 of 15" in n for n in r.notes)


def test_nan_times_are_not_zero(launches):
    nan_time = launches.copy(deep=True)
    nan_time["gpu__time_duration.sum"].values[:] = np.nan
    r = report(nan_time)
    assert r["gpu_time_ms"].isna().all() and r["share"].isna().all()
    assert r.loc["stream", "bound_by"] == "backend_memory"  # the Top-Down is still known
    assert any("gpu__time_duration.sum in 15 of 15" in n for n in r.notes)


@pytest.mark.parametrize("value", [np.nan, np.inf])
def test_a_dataset_without_one_finite_value_is_refused(launches, series, value):
    spoiled = launches.copy(deep=True)
    for v in spoiled.data_vars:
        spoiled[v].values[:] = value
    with pytest.raises(ValueError, match="holds no measurement: every value of its 24 metrics in its 15 launches"):
        report(spoiled)
    samples = series.copy(deep=True)
    for v in samples.data_vars:
        samples[v].values[:] = value
    with pytest.raises(ValueError, match="18019 samples is NaN or inf"):
        report(samples)


def test_the_title_names_the_metric_set(launches):
    assert "metric set topdown + 1 metric, kernel mode" in report(launches).title  # topdown and the gmma stall
    named = launches.assign_attrs(metric_set="topdown")
    assert "metric set topdown, kernel mode" in report(named).title
    plain = launches[["gpu__time_duration.sum", "sm__cycles_elapsed.max"]].assign_attrs(metrics=[])
    assert "15 launches, 3 kernels, 2 metrics, kernel mode" in report(plain).title


# -- gpuscope show: --csv and --page ---------------------------------------------------------------------------


def _show(capsys, monkeypatch, *argv, width=80):
    from gpuscope import cli

    monkeypatch.setenv("COLUMNS", str(width))
    code = cli.main(["show", *map(str, argv)])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("width", [80, 200])
def test_show_fits_the_terminal(capsys, monkeypatch, width):
    code, out, _ = _show(capsys, monkeypatch, _demo.RECORDED_LAUNCHES, _demo.RECORDED_SERIES, width=width)
    assert code == 0
    _fits(out, width)
    assert "advice:" in out
    assert "Improve locality and coalescing, use shared memory, issue fewer and wider accesses." in _flat(out)


def test_show_csv_writes_the_whole_table(capsys, monkeypatch, tmp_path, launches):
    path = tmp_path / "report.csv"
    code, out, _ = _show(capsys, monkeypatch, _demo.RECORDED_LAUNCHES, "--csv", path)
    assert code == 0 and "gpuscope report" in out
    written = pd.read_csv(path, index_col="kernel", keep_default_na=False)  # no NaN in it; "" stays ""
    expected = report(launches).with_units()
    assert list(written.columns) == list(expected.columns)  # every column, the advice whole
    # every header says its unit: in the name it already had, or in brackets
    assert list(written.columns[:8]) == ["launches", "gpu_time_ms", "mean_us", "share [%]", "retire [%]",
                                         "divergence [%]", "frontend [%]", "backend [%]"]
    pd.testing.assert_frame_equal(written, expected, check_dtype=False, check_index_type=False,
                                  check_column_type=False)
    both = tmp_path / "both.csv"
    assert _show(capsys, monkeypatch, _demo.RECORDED_LAUNCHES, _demo.RECORDED_SERIES, "--csv", both)[0] == 0
    table = pd.read_csv(both)
    assert list(table.columns[:3]) == ["file", "device", "kernel"] and "range" in table.columns
    assert table["file"].tolist() == [str(_demo.RECORDED_LAUNCHES)] * 3 + [str(_demo.RECORDED_SERIES)] * 4


def test_show_raw_page_lists_every_value_with_its_unit(capsys, monkeypatch, tmp_path, launches):
    path = tmp_path / "raw.csv"
    code, out, _ = _show(capsys, monkeypatch, "--page", "raw", _demo.RECORDED_LAUNCHES, "--csv", path, width=120)
    assert code == 0
    _fits(out, 120)
    blocks = out.split("\n\n")[1:]
    assert len(blocks) == launches.sizes["range"]
    first = blocks[0].splitlines()
    assert first[0].startswith("range 0, name stream") and "launch 0" in first[0]
    t = int(launches["gpu__time_duration.sum"].values[0])
    assert any(line.split() == ["gpu__time_duration.sum", f"{t:,}", "nanosecond"] for line in first)
    assert sum(line.startswith("  smsp__") for line in blocks[0].splitlines()) == 22
    long = pd.read_csv(path)
    assert len(long) == 15 * 24 and set(long["unit"]) >= {"nanosecond", "percent"}
    code, out, _ = _show(capsys, monkeypatch, "--page", "raw", _demo.RECORDED_LAUNCHES, width=60)
    _fits(out, 60)  # names too long for one line: the value goes under the name
    assert "  gpu__time_duration.sum\n" in out and f"      {t:,} nanosecond" in out


def test_show_raw_page_refuses_by(capsys, monkeypatch):
    code, _, err = _show(capsys, monkeypatch, "--page", "raw", "--by", "phase", _demo.RECORDED_SERIES)
    assert code == 4 and "--by groups the rows of the summary and details pages" in err


def test_a_phase_whose_topdown_is_not_a_number_says_no_data(unattributed):
    broken = unattributed.copy(deep=True)
    p = int(np.flatnonzero(broken["attributed_fraction"].values > 0)[0])
    for node in ("retire", "divergence", "frontend", "backend"):
        broken[node].values[p] = np.inf
    r = report(broken)
    phase = broken["phase_id"].values[p]
    assert r.loc[phase, "bound_by"] == "no data" and r.loc[phase, "advice"] == ""
    assert "not attributed" in set(r["bound_by"])  # the phase with no profiled work is still that


def test_a_long_range_name_over_many_samples_is_never_widened(tmp_path):
    """A per-sample label array as wide as its longest name would take GBs (10,000 characters over 200,000 samples:
    7.6 GB); the report, the phase joins and the timeline read labels as one str per distinct name."""
    import tracemalloc

    import numpy as np

    from gpuscope._schema.labels import string_labels

    ts = gs.open_dataset(_demo.RECORDED_SERIES)
    long = "step/" + "x" * 10_000
    names = np.array([long, "other"], dtype=object)[np.arange(ts.sizes["time"]) % 2]
    ts = ts.assign_coords(range=("time", names))
    labels = string_labels(ts["range"].values)
    assert labels.dtype == object and labels[0] is labels[2] and labels[0] == long
    tracemalloc.start()
    try:
        text = gs.report(ts).to_text(width=100)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "other" in text
    # one <U10000 copy of the labels alone would be 40 kB x samples (720 MB here)
    assert peak < 40_000 * ts.sizes["time"] / 4, peak


def test_pm_samples_without_a_sample_are_refused_saying_so():
    ts = gs.open_dataset(_demo.RECORDED_SERIES).isel(time=slice(0, 0))
    ts.attrs["lost_samples"] = 1234
    with pytest.raises(ValueError, match=r"holds no sample \(1234 were lost"):
        gs.report(ts)


def test_labels_read_as_astype_str_would_and_missing_ones_as_asked():
    from gpuscope._schema.labels import string_labels

    values = np.array(["step", None, float("nan"), "step"], dtype=object)
    assert string_labels(values).tolist() == values.astype(str).tolist()
    assert string_labels(["step", None, "step"], missing="").tolist() == ["step", "", "step"]
    assert string_labels(np.array(["a", "b"])).dtype == object


def test_one_unit_for_topdown_in_the_api_the_report_and_the_csv(launches, tmp_path):
    """Issue 37: gs.aggregate gave IPC (2.99), the report % of peak (74.8%), its CSV fractions (0.4688), no unit."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        per_kernel = td.aggregate(td.topdown(launches), by="kernel")
    r = report(launches)
    r.to_csv(tmp_path / "report.csv")
    written = pd.read_csv(tmp_path / "report.csv", index_col="kernel")
    api = float(per_kernel["retire"].sel(kernel="fma"))
    assert api == pytest.approx(74.79, abs=0.01) and per_kernel["retire"].attrs["units"] == "percent"
    assert r.loc["fma", "retire"] == pytest.approx(api) and written.loc["fma", "retire [%]"] == pytest.approx(api)
    assert f"{api:.1f}%" in r.to_text(200)
    assert written.loc["fma", "share [%]"] == pytest.approx(r.loc["fma", "share"]) == pytest.approx(46.88, abs=0.01)


def test_the_first_lines_say_what_auto_mode_profiled_of_what_it_saw():
    """An auto-mode session that followed the launch stream: its coverage attrs (as on the H100 PyTorch run of
    docs/measurements.md) lead the report, beside the H100 recording's rows."""
    from gpuscope._commands import demo

    ds = gs.open_dataset(demo.RECORDED_LAUNCHES)
    ds.attrs.update(launches_seen=1624, launches_profiled=1172, loop_first_launch=37, launches_from_the_loop=1587,
                    launches_profiled_from_the_loop=1172, launches_searching_in_the_loop=207,
                    launches_unprofiled_by_reason={"searching": 226, "incomplete_group": 209})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        head = " ".join(str(gs.report(ds)).split("\nkernel ")[0].split())
    assert ("Auto mode profiled 1,172 of the 1,624 launches it saw (72%); from the loop's first iteration (launch 37) "
            "on, 1,172 of 1,587 (74%); not profiled: 226 while it searched for the loop, 209 in the last pass group, "
            "short of the set's passes.") in head
    ds.attrs.update(launches_profiled=1381, launches_profiled_from_the_loop=1381, launches_completed_from_earlier_group=
                    276, passes_from_earlier_group=4, launches_unprofiled_by_reason={"searching": 226})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        head = " ".join(str(gs.report(ds)).split("\nkernel ")[0].split())
    assert ("(launch 37) on, 1,381 of 1,587 (87%); 276 launches in the last pass group, with up to 4 of their passes "
            "from the group before (passes_from_earlier_group); not profiled: 226 while it searched for the loop.") in head
    plain = gs.open_dataset(demo.RECORDED_LAUNCHES)
    assert "Auto mode profiled" not in str(gs.report(plain))
    # iteration mode over ranges or prof.step(): no coverage of a launch stream, the completed launches all the same
    plain.attrs.update(launches_completed_from_earlier_group=3, passes_from_earlier_group=5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        head = " ".join(str(gs.report(plain)).split("\nkernel ")[0].split())
    assert ("). 3 launches in the last pass group, with up to 5 of their passes from the group before "
            "(passes_from_earlier_group).") in head and "Auto mode" not in head
