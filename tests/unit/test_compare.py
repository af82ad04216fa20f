"""gs.compare on the H100 recording: itself (nothing significant) and a deliberately slowed copy (flagged)."""

import warnings

import numpy as np
import pytest

import gpuscope as gs
from gpuscope._commands import demo as _demo
from gpuscope._results.compare import compare

warnings.filterwarnings("ignore", category=gs.GpuscopeWarning)


@pytest.fixture(scope="module")
def launches():
    return gs.open_dataset(_demo.RECORDED_LAUNCHES)


def slowed(ds, kernel, factor, metric="gpu__time_duration.sum"):
    out = ds.copy(deep=True)
    out[metric].values[out["kernel"].values == kernel] *= factor
    return out


def test_a_recording_against_itself_shows_nothing(launches):
    c = compare(launches, launches)
    assert not c["significant"].any()
    assert (c["change"] == 0).all()
    assert set(c.index.get_level_values("kernel")) == {"stream", "fma", "divergent"}
    quantities = set(c.index.get_level_values("quantity"))
    assert {"gpu_time_us", "retire", "backend", "backend_memory", "divergence_branch"} <= quantities
    assert str(c).startswith("gpuscope compare: 3 kernels")
    assert "0 of" in str(c)


def test_a_slowed_kernel_is_flagged_and_nothing_else(launches):
    c = compare(launches, slowed(launches, "fma", 1.10))
    flagged = c[c["significant"]]
    assert flagged.index.tolist() == [("fma", "gpu_time_us")]
    row = flagged.iloc[0]
    assert row["relative"] == pytest.approx(10.0) and row["unit"] == "us"  # relative: percent of the base
    assert row["ci_low"] > 0 and row["ci_low"] < row["change"] < row["ci_high"]
    assert row["n_base"] == row["n_new"] == 5
    assert "fma" in str(c) and "True" in str(c)


def test_a_change_within_the_noise_is_not_flagged(launches):
    # the stream kernel's launches vary by about 1%: a 0.3% shift is inside the noise
    c = compare(launches, slowed(launches, "stream", 1.003))
    assert not c["significant"].any()
    assert c.loc[("stream", "gpu_time_us"), "ci_low"] < 0 < c.loc[("stream", "gpu_time_us"), "ci_high"]


def test_a_topdown_shift_is_flagged(launches):
    # the FMA kernel retires 20% fewer instructions per cycle in the new run: retire drops, stalls rise
    new = slowed(launches, "fma", 0.8, "smsp__inst_executed.avg.per_cycle_active")
    new = slowed(new, "fma", 0.8, "smsp__inst_issued.avg.per_cycle_active")
    c = compare(launches, new)
    flagged = set(c[c["significant"]].index)
    assert ("fma", "retire") in flagged and ("fma", "backend") in flagged
    retire = c.loc[("fma", "retire")]
    # in percent of peak, as gs.topdown and gs.report give it: 20% fewer of the base's 74.8 points
    assert retire["unit"] == "%" and retire["base"] == pytest.approx(74.79, abs=0.01)
    assert retire["change"] == pytest.approx(-0.2 * retire["base"], rel=1e-6)
    assert retire["relative"] == pytest.approx(-20.0)
    assert not any(k != "fma" for k, _ in flagged)


def test_every_row_and_the_csv_say_their_unit(launches, tmp_path):
    c = compare(launches, launches)
    units = dict(zip(c.index.get_level_values("quantity"), c["unit"]))
    assert units["gpu_time_us"] == "us" and units["retire"] == "%" and units["backend_memory"] == "%"
    c.to_csv(tmp_path / "diff.csv")
    header = (tmp_path / "diff.csv").read_text().splitlines()[0].split(",")
    assert header[:5] == ["kernel", "quantity", "unit", "base", "new"] and "relative [%]" in header


def test_kernels_in_one_run_only(launches):
    c = compare(launches, launches.isel(range=np.flatnonzero(launches["kernel"].values != "divergent")))
    assert ("divergent", "only in base") in c.index
    assert not c["significant"].any()


def test_single_launch_cannot_be_judged(launches):
    one = launches.isel(range=[0, 1, 2])
    c = compare(one, slowed(one, "fma", 2.0))
    assert not c["significant"].any() and np.isnan(c.loc[("fma", "gpu_time_us"), "p_value"])
    assert any("single launch" in n for n in c.notes)


def test_only_range_results(launches):
    series = gs.open_dataset(_demo.RECORDED_SERIES)
    with pytest.raises(ValueError, match="range-profiling results"):
        compare(launches, series)
    with pytest.raises(ValueError, match="alpha"):
        compare(launches, launches, alpha=2)


def test_one_kernel_is_one_kernel(launches):
    one = launches.isel(range=np.flatnonzero(launches["kernel"].values == "fma"))
    assert compare(one, one).title.startswith("gpuscope compare: 1 kernel; base 5 ranges")


def test_nan_and_inf_are_no_data_not_values(launches):
    spoiled = launches.copy(deep=True)
    fma = spoiled["kernel"].values == "fma"
    spoiled["gpu__time_duration.sum"].values[np.flatnonzero(fma)[:2]] = [np.inf, np.nan]
    c = compare(launches, spoiled)
    row = c.loc[("fma", "gpu_time_us")]
    kept = launches["gpu__time_duration.sum"].values[np.flatnonzero(fma)[2:]] / 1e3
    assert row["n_new"] == 3 and row["new"] == pytest.approx(kept.mean())
    assert np.isfinite(row["change"]) and not c["significant"].any()
    assert any(n.startswith("new: no data (NaN or inf) for gpu__time_duration.sum in 2 of 15") for n in c.notes)
    for value in (np.nan, np.inf):
        empty = launches.copy(deep=True)
        for v in empty.data_vars:
            empty[v].values[:] = value
        with pytest.raises(ValueError, match="the new Dataset: This Dataset holds no measurement"):
            compare(launches, empty)


def test_a_halved_stall_shows_in_its_level3_node_and_its_raw_metric(launches):
    """Issue 37, item 12: halving long_scoreboard showed only in level 2; now its level-3 node and the metric
    itself (in its own unit) are rows too."""
    metric = "smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct"
    c = compare(launches, slowed(launches, "stream", 0.5, metric))
    stream = c.loc["stream"]
    assert stream.loc["backend_memory_long_scoreboard", "significant"]
    assert stream.loc[metric, "significant"] and stream.loc[metric, "unit"] == "percent"
    assert stream.loc[metric, "relative"] == pytest.approx(-50)
    assert stream.loc["sm__cycles_elapsed.max", "unit"] == "gpc_cycle"
    assert c.flagged("slower") == [] and ("stream", metric) in c.flagged("change")
    with pytest.raises(ValueError, match="'slower'"):
        c.flagged("worse")
