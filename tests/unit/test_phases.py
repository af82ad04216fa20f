"""Phase detection (gpuscope.metrics.phases) on synthetic piecewise-constant series."""

import warnings

import numpy as np
import pytest
import xarray as xr

from gpuscope.errors import GpuscopeWarning, MissingMetricsError
from gpuscope.metrics import changepoints
from gpuscope.metrics import phases as ph
from gpuscope.metrics import topdown as td

from .test_topdown import STALLS_0, STALLS_1, range_dataset

# Levels of three metrics (with very different units) in phases A, B, A, C.
LEVELS = {"A": (1.0, 50.0, 0.001), "B": (3.0, 50.0, 0.002), "C": (1.0, 80.0, 0.001)}
NOISE = (0.3, 4.0, 0.0002)
NAMES = ("sm__throughput.avg.pct_of_peak_sustained_elapsed", "dram__bytes_read.sum.per_second",
         "smsp__inst_executed.sum")


def time_series(pattern="ABAC", length=1000, seed=0, interval_ns=20_000):
    """PM samples as the sampler returns them: dim ``time`` (ns), start_ns/end_ns, the open user range."""
    rng = np.random.default_rng(seed)
    levels = np.repeat([LEVELS[p] for p in pattern], length, axis=0)
    x = levels + rng.normal(0.0, 1.0, levels.shape) * NOISE
    n = len(x)
    time = np.arange(n, dtype=np.int64) * interval_ns
    data = {name: ("time", x[:, i], {"units": "x", "description": name}) for i, name in enumerate(NAMES)}
    coords = {"time": time, "start_ns": ("time", time), "end_ns": ("time", time + interval_ns),
              "range": ("time", np.repeat([f"step{p}" for p in pattern], length))}
    return xr.Dataset(data, coords=coords)


def test_boundaries_and_recurring_labels():
    out = ph.phases(time_series())
    np.testing.assert_array_equal(out.segment_first, [0, 1000, 2000, 3000])
    np.testing.assert_array_equal(out.segment_stop, [1000, 2000, 3000, 4000])
    assert list(out.segment_phase.values) == [0, 1, 0, 2]  # the second A is phase 0 again
    assert list(out.phase.values[::1000]) == [0, 1, 0, 2]
    assert out.attrs["phases_change_points"] == 3 and out.attrs["phases_dim"] == "time"
    again = ph.phases(out)  # re-running on the result uses the same metrics, not the labels
    assert list(again.metric.values) == list(NAMES) and list(again.segment_phase.values) == [0, 1, 0, 2]


def test_summary_values():
    ds = time_series()
    out = ph.phases(ds)
    assert list(out.metric.values) == list(NAMES)
    np.testing.assert_allclose(out.segment_duration, [20e6] * 4)
    np.testing.assert_allclose(out.phase_duration, [40e6, 20e6, 20e6])
    np.testing.assert_allclose(out.phase_fraction, [0.5, 0.25, 0.25])
    assert list(out.phase_segments.values) == [2, 1, 1] and list(out.phase_samples.values) == [2000, 1000, 1000]
    first = ds[NAMES[0]].values
    assert float(out.phase_mean.sel(phase_id=0, metric=NAMES[0])) == pytest.approx(
        np.r_[first[:1000], first[2000:3000]].mean())
    assert float(out.segment_mean.sel(segment=3, metric=NAMES[1])) == pytest.approx(ds[NAMES[1]][3000:].mean())
    assert float(out.segment_start[1]) == 1000 * 20_000 and float(out.segment_end[1]) == 2000 * 20_000


def test_means_are_weighted_by_sample_duration():
    ds = time_series("AB", length=50)
    ds = ds.assign_coords(end_ns=ds.start_ns + np.where(np.arange(100) % 2, 30_000, 10_000))
    out = ph.phases(ds)
    x, w = ds[NAMES[0]].values[:50], (ds.end_ns - ds.start_ns).values[:50]
    assert float(out.phase_mean.sel(phase_id=0, metric=NAMES[0])) == pytest.approx((x * w).sum() / w.sum())


def test_pure_noise_has_no_change_point():
    rng = np.random.default_rng(3)
    assert len(ph.change_points(rng.normal(size=(20_000, 8)))) == 0


def test_change_points_on_arrays():
    rng = np.random.default_rng(1)
    x = np.repeat([[0.0, 0.0], [1.0, 0.0], [1.0, -2.0]], [4000, 3000, 3000], axis=0) + rng.normal(size=(10_000, 2))
    found = ph.change_points(x)
    assert len(found) == 2 and abs(found[0] - 4000) <= 100 and abs(found[1] - 7000) <= 100
    assert list(ph.change_points(x, max_change_points=1)) in ([found[0]], [found[1]])
    assert len(ph.change_points(x[:, 0])) == 1  # one metric, 1-D


def test_label_segments_merges_only_similar_means():
    means = np.array([[0.0, 0.0], [5.0, 0.0], [0.1, 0.0], [0.0, 5.0]])
    assert list(ph.label_segments(means, np.array([100, 100, 100, 100]), penalty=30.0)) == [0, 1, 0, 2]
    assert list(ph.label_segments(means, np.ones(4), penalty=0.0, label_tolerance=0.0)) == [0, 1, 2, 3]


def test_per_launch_series():
    values = time_series("AB", length=40)[NAMES[0]].values
    ds = xr.Dataset({NAMES[0]: ("range", values)}, coords={"launch": ("range", np.arange(80))})
    out = ph.phases(ds, metrics=[NAMES[0]])
    assert out.attrs["phases_dim"] == "range"
    np.testing.assert_array_equal(out.segment_first, [0, 40])
    np.testing.assert_allclose(out.segment_duration, [40, 40])  # no times: durations in samples


def test_constant_and_nan_samples():
    ds = time_series("AB", length=500)
    ds["flat"] = ("time", np.ones(1000))
    values = ds[NAMES[0]].values.copy()
    values[[10, 700]] = np.nan
    ds[NAMES[0]] = ("time", values)
    with pytest.warns(GpuscopeWarning, match="2 of 1000 samples"):
        out = ph.phases(ds)
    np.testing.assert_array_equal(out.segment_first, [0, 500])
    assert np.isfinite(out.phase_mean).all()


def test_phase_topdown_when_metrics_allow():
    ranges = range_dataset(stalls=(STALLS_0, STALLS_1) * 2, ipc=(0.5, 0.1) * 2, issued=(0.55, 0.1) * 2,
                           threads=(24.0, 32.0) * 2, kernels=("a", "b", "c", "d"), launches=(0, 1, 2, 3))
    # A time series that repeats range 0 for 300 samples, then range 1 for 300 samples.
    ts = ranges.isel(range=np.repeat([0, 1], 300)).rename({"range": "time"})
    ts = ts.drop_vars(["name", "kernel", "launch", "start_ns", "end_ns"]).assign_coords(time=np.arange(600) * 1000)
    out = ph.phases(ts, metrics=[td.IPC_EXECUTED])
    assert out.phase_topdown.dims == ("phase_id", "node")
    expected = td.topdown(ranges.isel(range=[0, 1]))
    for node in ("retire", "frontend", "backend_memory_long_scoreboard"):
        np.testing.assert_allclose(out.phase_topdown.sel(node=node), expected[node].values)
    assert "phase_topdown" not in ph.phases(time_series())
    with pytest.raises(MissingMetricsError):
        ph.phases(time_series().assign_attrs(compute_capability="9.0"), topdown=True)


def test_errors():
    with pytest.raises(MissingMetricsError, match="nope"):
        ph.phases(time_series(), metrics=["nope"])
    with pytest.raises(ValueError, match="dimension"):
        ph.phases(time_series(), dim="launch")
    with pytest.raises(ValueError, match="min_size"):
        ph.change_points(np.zeros((10, 1)), min_size=0)


def test_noise_scale_of_short_series_is_unbiased():
    """A short series must not lose its largest difference from the noise estimate (it then looks quieter than
    it is, and noise becomes phases): 2% of the differences are trimmed, none of fewer than 50."""
    rng = np.random.default_rng(5)
    for k in (19, 30, 50, 200):  # 19: the differences of the shortest series phases detects in
        scale = changepoints._trimmed_scale(rng.normal(size=(20_000, k)))
        assert np.mean(scale**2) == pytest.approx(1.0, abs=0.04), k


def test_short_white_noise_of_many_metrics_keeps_the_penalty_level():
    """The penalty is set for a false change in white noise with probability about 1/n: 20 samples of 27
    metrics (the Top-Down nodes of 20 launches) must not split more often than that."""
    rng = np.random.default_rng(0)
    split = sum(ph.phases(xr.Dataset({f"m{i}": ("range", x) for i, x in enumerate(rng.normal(size=(27, 20)))}),
                          topdown=False).sizes["phase_id"] > 1 for _ in range(300))
    assert split <= 300 / 20


def test_near_constant_top_down_nodes_make_no_phases():
    """Steps far above the noise but below 0.1% of IPC_MAX are no phases (retire 2.9915 -> 2.9916, a node at
    0.0001 IPC of 4); a metric without a full scale keeps the statistics' verdict (phases are offset-free)."""
    rng = np.random.default_rng(2)
    step = np.repeat([0.0, 1.0], 50)
    ipc = {"ipc_max": 4.0}
    ds = xr.Dataset({"retire": ("range", 2.9915 + 5e-5 * step + 1e-7 * rng.normal(size=100), ipc),
                     "frontend_decode_misc": ("range", 1e-4 + 2e-4 * step + 1e-7 * rng.normal(size=100), ipc)})
    with pytest.warns(GpuscopeWarning, match=r"0.1% of its full scale: one phase"):
        out = ph.phases(ds, topdown=False)
    assert out.sizes["phase_id"] == 1 and list(out.metric.values) == ["retire", "frontend_decode_misc"]
    assert ph.phases(ds.assign(retire=ds.retire + 0.1 * step), topdown=False).sizes["phase_id"] == 2
    assert ph.phases(ds.drop_attrs(), topdown=False).sizes["phase_id"] == 2


def test_too_short_a_series_is_one_phase_and_says_so():
    ds = time_series("AB", length=9)  # 18 samples: an obvious change, but too few to estimate the noise
    with pytest.warns(GpuscopeWarning, match=r"18 samples along 'time' are too few .* at least 20"):
        out = ph.phases(ds)
    assert out.sizes["phase_id"] == 1 and out.attrs["phases_change_points"] == 0
    assert ph.phases(time_series("AB", length=10)).sizes["phase_id"] == 2
    with pytest.warns(GpuscopeWarning, match=r"4 blocks of 250 samples"):
        ph.phases(time_series("AB", length=500), resolution=250)


def test_non_finite_samples_are_left_out_counted_and_said():
    ds = time_series("AB", length=500)
    values = ds[NAMES[1]].values.copy()
    bad = np.random.default_rng(4).choice(1000, 200, replace=False)  # 20% inf and NaN
    values[bad[:150]], values[bad[150:]] = np.inf, np.nan
    ds[NAMES[1]] = ("time", values)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no numpy warning on the way
        with pytest.warns(GpuscopeWarning, match=rf"200 of 1000 samples have NaN or inf .*'{NAMES[1]}': 200"):
            out = ph.phases(ds)
    assert out.attrs["phases_excluded_samples"] == 200 and out.attrs["phases_unusable_metrics"] == []
    assert abs(int(out.segment_first[1]) - 500) <= 2 and out.sizes["phase_id"] == 2
    assert np.isfinite(out.phase_mean).all() and np.isfinite(out.segment_mean).all()
    assert float(out.phase_mean.sel(phase_id=0, metric=NAMES[1])) == pytest.approx(50.0, abs=1.0)


def test_metrics_without_a_finite_value():
    ds = time_series("AB", length=500)
    ds["lost"] = ("time", np.full(1000, np.nan))
    with pytest.warns(GpuscopeWarning, match="metrics without a finite value, left out: lost"):
        out = ph.phases(ds)
    assert "lost" not in out.metric.values and out.attrs["phases_unusable_metrics"] == ["lost"]
    with pytest.raises(ValueError, match="NaN or inf at every sample along 'time' .*pass metrics="):
        ph.phases(ds, metrics=["lost"])
    half = ds.assign(a=("time", np.r_[np.full(500, np.nan), np.ones(500)]),
                     b=("time", np.r_[np.ones(500), np.full(500, np.inf)]))
    with pytest.raises(ValueError, match="no sample along 'time' has a finite value in every one of a, b"):
        ph.phases(half, metrics=["a", "b"])


def test_a_segment_within_reach_of_both_neighbours_is_absorbed_once():
    """A short segment between two phases, each near enough to absorb it, swung between them forever (a hang of
    gs.phases on H100 data in a shuffled GPU-suite run): it now joins the first and stays."""
    import threading

    from gpuscope.metrics.phase_labels import _absorb_excursions

    rng = np.random.default_rng(0)
    z = np.concatenate([rng.normal(0, 1, 400), np.full(10, 0.5), rng.normal(1, 1, 400)])[:, None]
    result = []
    worker = threading.Thread(target=lambda: result.append(
        _absorb_excursions(z, np.array([0, 400, 410, 810]), np.array([0, 2, 1]), 1.0)), daemon=True)
    worker.start()
    worker.join(30)
    assert result, "_absorb_excursions did not finish"
    assert list(result[0]) in ([0, 0, 1], [0, 1, 1])
