"""Every variable gs.phases adds says its units, and its times are whole nanoseconds (int64), as the samples'
(issue 53, item 4): float ns lost the last digits of a session's timestamps (1.8e18 ns) and said no unit."""

import warnings

import numpy as np
import pytest

import gpuscope as gs


@pytest.fixture(scope="module")
def series():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gs.GpuscopeWarning)
        return gs.example_dataset("demo_timeseries")


@pytest.fixture(scope="module")
def ph(series):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gs.GpuscopeWarning)
        return gs.phases(series)


def test_every_variable_phases_adds_says_its_units(series, ph):
    added = [n for n in [*ph.data_vars, *ph.coords] if n not in series.variables]
    assert {"phase", "segment_start", "phase_duration", "phase_mean", "metric_units"} <= set(added)
    missing = [n for n in added if n not in ("metric", "metric_units") and not ph[n].attrs.get("units")]
    assert missing == []
    units = dict(zip(ph["metric"].values.tolist(), ph["metric_units"].values.tolist(), strict=True))
    assert units == {m: series[m].attrs["units"] for m in units}


def test_times_are_whole_nanoseconds_as_the_samples(series, ph):
    for name in ("segment_start", "segment_end", "segment_duration", "phase_duration"):
        assert ph[name].dtype == np.int64 and ph[name].attrs["units"] == "ns", name
    start = np.asarray(series["start_ns"])
    first = ph["segment_first"].values
    assert (ph["segment_start"].values[1:] == start[first[1:]]).all()  # exact: no float rounding of 1.8e18 ns
    assert int(ph["phase_duration"].sum()) == int(ph["segment_duration"].sum())


def test_the_top_down_per_phase_keeps_whole_nanoseconds(ph):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gs.GpuscopeWarning)
        td = gs.topdown(gs.example_dataset("demo_launches"))
        per_phase = gs.dynamic(td, phases=ph)
    assert per_phase["phase_duration"].dtype == np.int64 and per_phase["phase_duration"].attrs["units"] == "ns"
    assert per_phase["time_in_phase"].dtype == np.int64 and per_phase["time_in_phase"].attrs["units"] == "ns"


def test_a_top_down_dataset_spells_percent_one_way():
    """Nodes said "percent" and warp_state_coverage "%" in the same Dataset (issue 53, item 4)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gs.GpuscopeWarning)
        td = gs.topdown(gs.example_dataset("demo_launches"))
    units = {n: td[n].attrs.get("units") for n in [*td.data_vars, *td.coords]}
    assert "%" not in units.values()
    assert units["warp_state_coverage"] == units["retire"] == "percent"
