"""Top-Down (gpuscope.metrics.topdown) on small synthetic Datasets shaped like the profiler's output."""

import warnings

import numpy as np
import pytest
import xarray as xr

from gpuscope.errors import GpuscopeWarning, MissingMetricsError
from gpuscope.metrics import catalog
from gpuscope.metrics import phase_topdown
from gpuscope.metrics import topdown as td
from gpuscope.metrics.topdown import stall_metric

# Range 0 is the hand-computed case below; range 1 is a memory-bound kernel with everything in long_scoreboard.
STALLS_0 = {
    "no_instruction": 10, "barrier": 5, "membar": 0, "branch_resolving": 5, "sleeping": 0,  # fetch 20
    "misc": 5, "dispatch_stall": 5,  # decode 10
    "math_pipe_throttle": 10, "wait": 10,  # core 20
    "long_scoreboard": 20, "imc_miss": 0, "mio_throttle": 5, "drain": 0, "lg_throttle": 5,  # memory 40
    "short_scoreboard": 10, "tex_throttle": 0,
    "selected": 8, "not_selected": 2,  # not stalls; all 18 add up to 100
}
STALLS_1 = {r: 0.0 for r in STALLS_0} | {"long_scoreboard": 85.0, "selected": 15.0}
# Nodes are percentages of IPC_MAX (4 on every architecture): an IPC of 1 is 25%.
PERCENT = 100 / 4


def range_dataset(cc="9.0", stalls=(STALLS_0, STALLS_1), ipc=(0.5, 0.1), issued=(0.55, 0.1), threads=(24.0, 32.0),
                  kernels=("fma", "stream"), launches=(0, 0), cycles=None):
    """A range Dataset as the profiler returns it: dim ``range``, one variable per exact CUPTI name."""
    n = len(ipc)

    def var(values, units, description):
        return ("range", np.asarray(values, dtype=float), {"units": units, "description": description})

    data = {
        td.IPC_EXECUTED: var(ipc, "inst/cycle", "warp instructions executed per active cycle, per SMSP"),
        td.IPC_ISSUED: var(issued, "inst/cycle", "warp instructions issued per active cycle, per SMSP"),
        td.THREADS_PER_INST: var(threads, "threads/inst", "active threads per executed warp instruction"),
    }
    for reason in stalls[0]:
        data[stall_metric(reason)] = var([s[reason] for s in stalls], "%", f"warps stalled on {reason}")
    if cycles is not None:
        data["sm__cycles_elapsed.max"] = var(cycles, "cycle", "elapsed cycles of the longest SM")
    coords = {
        "name": ("range", list(kernels)),
        "kernel": ("range", list(kernels)),
        "launch": ("range", list(launches)),
        "start_ns": ("range", np.arange(n, dtype=np.int64) * 1000),
        "end_ns": ("range", np.arange(n, dtype=np.int64) * 1000 + 500),
    }
    return xr.Dataset(data, coords=coords, attrs={"compute_capability": cc, "device": "synthetic"})


def test_hand_computed_case():
    out = td.topdown(range_dataset(), check="raise").isel(range=0)
    # Per-SM units: R = 4 * 0.5, I = 4 * 0.55, W = 24 / 32 (equations 2-5, 7).
    r, i, w = 2.0, 2.2, 0.75
    stall = 4.0 - (r * (1 - w) + (i - r)) - r * w  # 1.8
    expected = {
        "retire": r * w,  # 1.5
        "divergence_branch": r * (1 - w),  # 0.5
        "divergence_replay": i - r,  # 0.2
        "divergence": 0.7,
        # Shares of the 90% of warp-active cycles that are stalls (selected/not_selected excluded): the paper's
        # equations 8-14 with STALL_X as a percentage of stalls, as the paper describes its inputs.
        "frontend": stall * 30 / 90,  # 0.6
        "frontend_fetch": stall * 20 / 90,
        "frontend_decode": stall * 10 / 90,
        "backend": stall * 60 / 90,  # 1.2
        "backend_core": stall * 20 / 90,
        "backend_memory": stall * 40 / 90,
        "backend_memory_long_scoreboard": stall * 20 / 90,  # 0.4
        "backend_core_wait": stall * 10 / 90,  # wait is core, not memory as Table VIII prints it
        "frontend_fetch_membar": 0.0,
    }
    for name, value in expected.items():  # every node in percent of IPC_MAX
        assert float(out[name]) == pytest.approx(value * PERCENT, abs=1e-12), name
    assert float(out.retire + out.divergence + out.frontend + out.backend) == pytest.approx(100.0)


def test_level_checks_add_nodes_of_other_dim_orders_by_name_not_position():
    out = td.topdown(range_dataset()).expand_dims(device=[0, 1])  # nodes (device, range)
    assert max(td.check_levels(out).values()) < 1e-12
    # one node transposed to (range, device), another with a wrong value in one cell: still found where it is
    out["retire"] = out["retire"].transpose("range", "device")
    assert max(td.check_levels(out).values()) < 1e-12
    out["frontend"] = out["frontend"].copy(data=out["frontend"].values + np.array([[0.0, 0.0], [0.0, 7.0]]))
    with pytest.raises(ValueError, match="misses 100% by up to 7 points"):
        td.check_levels(out)


def test_memory_bound_range_is_all_long_scoreboard():
    out = td.topdown(range_dataset()).isel(range=1)
    assert float(out.retire) == pytest.approx(10.0)  # IPC 0.4 of 4
    assert float(out.divergence) == pytest.approx(0.0)
    assert float(out.backend_memory_long_scoreboard) == pytest.approx(90.0)
    assert float(out.frontend) == pytest.approx(0.0)


def test_every_level_sums_to_100_percent_and_attrs():
    out = td.topdown(range_dataset())
    deviations = td.check_levels(out)
    assert set(deviations) == {1, 2, 3} and max(deviations.values()) < 1e-12
    for level in (1, 2, 3):
        total = sum(out[n] for n in td.level_cut(level, out.data_vars))
        np.testing.assert_allclose(total, 100.0)
    attrs = out.backend_memory_long_scoreboard.attrs
    assert (attrs["level"], attrs["parent"], attrs["units"], attrs["ipc_max"]) == (
        3, "backend_memory", "percent", 4.0)
    assert out.attrs["topdown_units"] == "percent"
    assert "long_scoreboard" in attrs["formula"]
    assert out.retire.attrs["parent"] == "" and out.frontend_fetch.attrs["parent"] == "frontend"
    assert out.attrs["topdown_ipc_max"] == 4.0 and out.attrs["device"] == "synthetic"
    assert list(out.kernel.values) == ["fma", "stream"] and out.retire.dims == ("range",)


def test_level_cuts():
    assert td.level_cut(1) == ["retire", "divergence", "frontend", "backend"]
    assert td.level_cut(2) == ["retire", "divergence_branch", "divergence_replay", "frontend_fetch",
                               "frontend_decode", "backend_core", "backend_memory"]
    assert len(td.level_cut(3)) == 3 + len(td.STALL_PARENT)


def test_levels_selects_nodes():
    out = td.topdown(range_dataset(), levels=1)
    assert set(out.data_vars) == {"retire", "divergence", "frontend", "backend"}
    level2 = td.topdown(range_dataset(), levels=[2])
    assert {level2[n].attrs["level"] for n in level2.data_vars} == {2}
    with pytest.raises(ValueError, match="levels"):
        td.topdown(range_dataset(), levels=4)


def test_required_metrics_cc90_is_the_papers_set():
    names = td.required_metrics("9.0")
    assert names[:3] == [td.IPC_EXECUTED, td.THREADS_PER_INST, td.IPC_ISSUED]
    stalls = names[3:]
    assert len(stalls) == 18 and all(
        n.startswith("smsp__warp_issue_stalled_") and n.endswith("_per_warp_active.pct") for n in stalls)
    assert set(names) == set(catalog.get_set("topdown").metrics) - {"sm__cycles_elapsed.max", "gpu__time_duration.sum"}
    assert stall_metric("gmma") not in names
    assert td.required_metrics("9.0", optional=True) == names + [stall_metric("gmma")]
    assert len(td.required_metrics("9.0", coverage=False)) == 19


@pytest.mark.parametrize("cc", ["7.0", "7.5", "8.0", "8.6", "8.9", (9, 0), "10.0", "12.0"])
def test_every_architecture_has_a_table(cc):
    expected = set(td.required_metrics("9.0"))
    if str(cc).startswith(("10.", "12.")):  # Blackwell has no imc_miss stall reason
        expected.discard(td.stall_metric("imc_miss"))
    assert set(td.required_metrics(cc)) == expected
    assert td.architecture(cc).ipc_max == 4.0


@pytest.mark.parametrize("cc", ["6.1", "13.0", "nine"])
def test_unknown_compute_capability(cc):
    with pytest.raises(ValueError):
        td.architecture(cc)


def test_architecture_from_attrs_or_argument():
    ds = range_dataset()
    del ds.attrs["compute_capability"]
    with pytest.raises(ValueError, match="arch="):
        td.topdown(ds)
    xr.testing.assert_allclose(td.topdown(ds, arch="9.0").retire, td.topdown(range_dataset()).retire)


def test_missing_metrics_are_named():
    ds = range_dataset().drop_vars([td.IPC_ISSUED, stall_metric("wait")])
    with pytest.raises(MissingMetricsError) as info:
        td.topdown(ds)
    assert isinstance(info.value, ValueError)
    assert set(info.value.missing) == {td.IPC_ISSUED, stall_metric("wait")}
    assert td.IPC_ISSUED in str(info.value) and "'topdown' metric set" in str(info.value)


def test_selected_and_not_selected_are_optional_inputs():
    ds = range_dataset().drop_vars([stall_metric("selected"), stall_metric("not_selected")])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = td.topdown(ds)
    assert float(out.frontend[0]) == pytest.approx(0.6 * PERCENT)


def test_gmma_is_core_when_collected_and_flagged_when_not():
    gmma = [dict(STALLS_0, long_scoreboard=0.0, gmma=20.0), dict(STALLS_1, long_scoreboard=65.0, gmma=20.0)]
    full = range_dataset(stalls=gmma)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = td.topdown(full)
    assert float(out.backend_core_gmma[0]) == pytest.approx(1.8 * 20 / 90 * PERCENT)
    assert float(out.backend_core[0]) == pytest.approx(1.8 * 40 / 90 * PERCENT)
    with pytest.warns(GpuscopeWarning, match="gmma"):
        out = td.topdown(full.drop_vars(stall_metric("gmma")))
    assert "backend_core_gmma" not in out


def test_coverage_scattered_both_ways_is_no_missing_reason():
    """Passes that disagree put some ranges above 100% and some below; a reason not collected only lowers it: no
    call to collect gmma (the rows' consistent coordinate says which disagree)."""
    rows = [STALLS_0, dict(STALLS_1, long_scoreboard=70.0), dict(STALLS_0, long_scoreboard=35.0), STALLS_1]
    ds = range_dataset(stalls=rows, ipc=(0.5, 0.1) * 2, issued=(0.55, 0.1) * 2, threads=(24.0, 32.0) * 2,
                       kernels=("fma", "stream") * 2, launches=(0, 0, 1, 1))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = td.topdown(ds, check="ignore")
        covered = out["warp_state_coverage"].values
        assert covered.min() < 95 and covered.max() > 105 and abs(np.median(covered) - 100) <= 5, covered
        td.topdown(ds)  # the default check: no coverage warning either


def test_inconsistent_input_is_reported():
    ds = range_dataset(issued=(1.2, 0.1))  # more than one issue per SMSP cycle: stalls come out negative
    with pytest.warns(GpuscopeWarning, match="consistency"):
        td.topdown(ds)
    with pytest.raises(ValueError, match="frontend"):
        td.topdown(ds, check="raise")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        td.topdown(ds, check="ignore")


def test_no_stall_at_all_leaves_the_split_undefined():
    quiet = {r: 0.0 for r in STALLS_0} | {"selected": 100.0}
    out = td.topdown(range_dataset(stalls=(quiet, STALLS_1)))
    assert np.isnan(float(out.frontend[0])) and float(out.retire[0]) == pytest.approx(1.5 * PERCENT)


def test_time_series_keep_their_coordinates():
    ds = range_dataset().rename({"range": "time"}).assign_coords(time=("time", np.array([0, 20_000])))
    out = td.topdown(ds)
    assert out.retire.dims == ("time",) and list(out.time.values) == [0, 20_000]


def test_aggregate_weights_by_cycles():
    ds = range_dataset(stalls=(STALLS_0, STALLS_1, STALLS_1), ipc=(0.5, 0.1, 0.3), issued=(0.55, 0.1, 0.3),
                       threads=(24.0, 32.0, 32.0), kernels=("fma", "stream", "fma"), launches=(0, 0, 1),
                       cycles=(1000.0, 5000.0, 3000.0))
    out = td.topdown(ds)
    assert out["weight"].values.tolist() == [1000.0, 5000.0, 3000.0] and "sm__cycles_elapsed.max" not in out
    assert out["weight"].attrs["metric"] == "sm__cycles_elapsed.max"
    agg = td.aggregate(out, by="kernel")
    assert list(agg.kernel.values) == ["fma", "stream"]
    assert float(agg.retire.sel(kernel="fma")) == pytest.approx((1.5 * 1000 + 1.2 * 3000) / 4000 * PERCENT)
    assert list(agg["count"].values) == [2, 1] and list(agg["weight"].values) == [4000.0, 5000.0]
    assert agg.retire.attrs["level"] == 1
    td.check_levels(agg)
    whole = td.aggregate(out, by=None)
    assert float(whole.retire) == pytest.approx((1.5 * 1000 + 0.4 * 5000 + 1.2 * 3000) / 9000 * PERCENT)


def test_aggregate_falls_back_on_duration_and_complains_without_weight():
    out = td.topdown(range_dataset())
    assert float(td.aggregate(out, by=None).retire) == pytest.approx((1.5 + 0.4) / 2 * PERCENT)  # equal durations
    with pytest.raises(MissingMetricsError, match="sm__cycles_elapsed.max"):
        td.aggregate(out.drop_vars(["start_ns", "end_ns"]), by=None)
    with pytest.raises(ValueError, match="group by"):
        td.aggregate(out, by="nope")


def test_dynamic_gives_one_kernel_in_launch_order():
    ds = range_dataset(stalls=(STALLS_0, STALLS_1, STALLS_1), ipc=(0.5, 0.1, 0.3), issued=(0.55, 0.1, 0.3),
                       threads=(24.0, 32.0, 32.0), kernels=("fma", "stream", "fma"), launches=(1, 0, 0))
    dyn = phase_topdown.dynamic(td.topdown(ds), "fma")
    assert list(dyn.launch.values) == [0, 1]
    np.testing.assert_allclose(dyn.retire, [1.2 * PERCENT, 1.5 * PERCENT])
    with pytest.raises(ValueError, match="several kernels"):
        phase_topdown.dynamic(td.topdown(ds))
    with pytest.raises(ValueError, match="no kernel"):
        phase_topdown.dynamic(td.topdown(ds), "gemm")


def test_netcdf_round_trip(tmp_path):
    out = td.topdown(range_dataset())
    path = tmp_path / "topdown.nc"
    out.to_netcdf(path, engine="h5netcdf")
    with xr.open_dataset(path, engine="h5netcdf") as back:
        xr.testing.assert_allclose(back.load(), out)
        assert back.backend.attrs["formula"] == out.backend.attrs["formula"]
