"""Top-Down per phase (gs.dynamic(td, phases=...)) on the H100 demo recordings: range profiling of the demo's
three kernels joined with the phases of a PM-sampled run of the same kernels."""

import warnings
from pathlib import Path

import numpy as np
import pytest

import gpuscope as gs
from gpuscope._results import build as _results
from gpuscope.metrics import plot
from gpuscope.metrics.topdown import level_cut

DATA = Path(gs.__file__).parent / "data"
LEVEL1 = ["retire", "divergence", "frontend", "backend"]


@pytest.fixture(scope="module")
def recorded():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gs.GpuscopeWarning)  # the recording's stall-coverage warning
        td = gs.topdown(gs.open_dataset(DATA / "demo_launches.nc"))
    ts = gs.open_dataset(DATA / "demo_timeseries.nc")
    return td, ts, gs.phases(ts)


def _per_kernel(td):
    return gs.aggregate(td, by="kernel")


def test_by_ranges_gives_each_phase_the_topdown_of_the_kernels_in_its_ranges(recorded):
    td, ts, ph = recorded
    per = gs.dynamic(td, phases=ph)
    assert per.attrs["topdown_by"] == "ranges" and per.sizes["phase_id"] == ph.sizes["phase_id"]
    kernels = _per_kernel(td)
    time = per["time_in_phase"].to_pandas()
    assert sorted(time.columns) == ["divergent", "fma", "stream"]
    for p in per["phase_id"].values:
        row = time.loc[p]
        expected = sum(row[k] * kernels[n].sel(kernel=k) for k in row.index for n in [LEVEL1[0]]) / row.sum()
        assert float(per["retire"].sel(phase_id=p)) == pytest.approx(float(expected), rel=1e-12)
        if (row > 0).sum() == 1:  # a phase inside one range has exactly that kernel's Top-Down
            only = row.idxmax()
            for n in LEVEL1:
                assert float(per[n].sel(phase_id=p)) == pytest.approx(float(kernels[n].sel(kernel=only)), rel=1e-12)
    # the level-1 cut still sums to 100% in every phase
    total = sum(per[n] for n in level_cut(1, per.data_vars))
    np.testing.assert_allclose(total, 100.0, atol=1.25)
    # the time of each phase's samples inside ranges is the phase's duration: all is attributed, but for the
    # first 1.5 ms, before the first range began (part of the short first phase)
    long = per["phase_duration"] > 5e6
    np.testing.assert_allclose(per["attributed_fraction"].where(long, drop=True), 1.0, atol=0.01)
    assert 0 < float(per["attributed_fraction"][0]) < 1
    for name in LEVEL1:
        assert per[name].attrs["units"] == td[name].attrs["units"]


def _with_executions(ts, names=None):
    """The demo's PM recording with an execution table made from its ranges: each range execution is one run of
    the kernel of that name (the demo launches one kernel per range, back to back)."""
    table = gs.spans(ts)
    names = names or {}
    records = [(names.get(p, p), int(s), int(e), 0, 1, 7, (1, 1, 1), (1, 1, 1), 16, i)
               for i, (p, s, e) in enumerate(zip(table["path"], table["start_ns"], table["end_ns"], strict=True))]
    return _results.with_executions(ts, {"records": records, "dropped": 0, "errors": []})


def test_by_kernels_agrees_with_by_ranges_when_kernels_fill_their_ranges(recorded):
    td, ts, _ = recorded
    ph = gs.phases(_with_executions(ts, {"stream": "__main__.stream"}))  # a Numba-style name, matched by suffix
    by_kernels = gs.dynamic(td, phases=ph)
    by_ranges = gs.dynamic(td, phases=ph, by="ranges")
    assert by_kernels.attrs["topdown_by"] == "kernels"
    assert by_kernels["has_topdown"].all()
    long = ph["phase_duration"] > 5e6
    for n in LEVEL1:
        np.testing.assert_allclose(by_kernels[n].where(long, drop=True), by_ranges[n].where(long, drop=True),
                                   atol=0.02)
    # kernel time inside phases adds up to the executions' time inside the sampled window
    table = gs.kernel_executions(ph)
    window = np.clip(table["end_ns"], None, int(ph["end_ns"][-1])) - table["start_ns"]
    assert float(by_kernels["time_in_phase"].sum()) == pytest.approx(float(window.sum()), rel=1e-6)


def test_work_without_a_topdown_is_counted_not_spread(recorded):
    td, ts, ph = recorded
    only = td.isel(range=np.flatnonzero(td["kernel"].values == "divergent"))  # stream and fma not profiled
    per = gs.dynamic(only, phases=ph)
    assert per["has_topdown"].to_pandas().to_dict() == {"divergent": True, "fma": False, "stream": False}
    time = per["time_in_phase"].to_pandas()
    duration = per["phase_duration"].to_pandas()
    np.testing.assert_allclose(per["unattributed_fraction"], (time["fma"] + time["stream"]) / duration, rtol=1e-12)
    np.testing.assert_allclose(per["attributed_fraction"], time["divergent"] / duration, rtol=1e-12)
    without = [p for p in time.index if time.loc[p, "divergent"] == 0]
    assert without  # the stream phase: nothing profiled ran in it, no Top-Down, nothing spread over the nodes
    for p in without:
        assert np.isnan(float(per["retire"].sel(phase_id=p)))
    divergent = gs.aggregate(only, by="kernel").sel(kernel="divergent")
    for p in time.index.difference(without):  # the profiled part keeps its own Top-Down, unmixed
        assert float(per["retire"].sel(phase_id=p)) == pytest.approx(float(divergent["retire"]), rel=1e-12)


def test_bad_inputs_say_what_to_pass(recorded):
    td, ts, ph = recorded
    with pytest.raises(ValueError, match="kernels=True"):
        gs.dynamic(td, phases=ph, by="kernels")
    with pytest.raises(ValueError, match="gpuscope.phases"):
        gs.dynamic(td, phases=ts)
    with pytest.raises(ValueError, match="Top-Down nodes"):
        gs.dynamic(gs.open_dataset(DATA / "demo_launches.nc"), phases=ph)
    with pytest.raises(ValueError, match="by must be one of|by"):
        gs.dynamic(td, phases=ph, by="phase")
    with pytest.raises(ValueError, match="do not go together"):
        gs.dynamic(td, "fma", phases=ph)
    range_phases = gs.phases(gs.dynamic(td, "fma"), metrics=["retire"])
    with pytest.raises(ValueError, match="PM samples"):
        gs.dynamic(td, phases=range_phases)


def test_the_plot_draws_bands_and_one_bar_stack_per_phase(recorded):
    td, ts, ph = recorded
    per = gs.dynamic(td, phases=ph)
    fig = plot.phase_topdown(ph, per, level=2)
    timeline, bars = fig.axes[:2]
    assert len(timeline.patches) >= ph.sizes["segment"]  # one band per segment
    labels = [t.get_text() for t in bars.get_xticklabels()]
    assert labels == [f"phase {p}" for p in ph["phase_id"].values]
    heights = {}
    for patch in bars.patches:
        x = round(patch.get_x() + patch.get_width() / 2)
        heights[x] = heights.get(x, 0) + patch.get_height()
    np.testing.assert_allclose(list(heights.values()), 100.0, atol=1.25)
    with pytest.raises(ValueError, match="other phases"):
        plot.phase_topdown(gs.phases(ts, penalty=1e9), per)
    import matplotlib.pyplot as plt

    plt.close("all")
