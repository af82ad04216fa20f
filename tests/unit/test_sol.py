"""Roofline, memory workload, occupancy and instruction mix: every formula on range Datasets shaped as an H100
session records them (tests/unit/sol_data.py), with answers worked out by hand."""

import dataclasses

import numpy as np
import pytest
import xarray as xr

import gpuscope as gs
from gpuscope._gpu import device as _device
from gpuscope._schema.dataset import SM_LIMIT_ATTRS
from gpuscope.errors import MissingMetricsError
from gpuscope.metrics import combine as cb
from gpuscope.metrics import occupancy as oc

from .sol_data import GEMM, H100, INSTRUCTIONS, OCCUPANCY, STREAM, STREAM_MEMORY, T, recorded

HOPPER_SMEM_KIB = (0, 8, 16, 32, 64, 100, 132, 164, 196, 228)
H100_LIMITS = oc.SMLimits(max_warps=64, max_blocks=32, registers=65536, block_registers=65536, shared_memory=233472,
                          reserved_shared_memory=1024, shared_memory_unit=128, sub_partitions=4, sm_count=132,
                          shared_memory_sizes=tuple(k << 10 for k in HOPPER_SMEM_KIB))


@pytest.fixture(scope="module")
def two():
    """A streaming launch and a tensor-core GEMM launch."""
    return recorded([STREAM, GEMM], ["stream", "gemm"])


def test_roofline_work_traffic_and_peaks(two):
    rl = gs.roofline(two)
    assert list(rl["precision"].values) == ["fp64", "fp32", "fp16", "tensor"]
    assert list(rl["level"].values) == ["L1", "L2", "DRAM"]
    s, g = rl.isel(range=0), rl.isel(range=1)
    # fp32 = fadd + fmul + 2 ffma = 3 GFLOP in 1 ms; peak = 2 x 16896 FFMA per cycle x 2 GHz
    assert float(s.flop.sel(precision="fp32")) == 3e9
    assert float(s.flop_rate.sel(precision="fp32")) == pytest.approx(3e12)
    assert float(s.peak_flop_rate.sel(precision="fp32")) == pytest.approx(2 * 16896 * 2e9)
    assert float(s.peak_flop_rate.sel(precision="fp64")) == pytest.approx(2 * 8448 * 2e9)
    assert float(s.peak_flop_rate.sel(precision="fp16")) == pytest.approx(4 * 16896 * 2e9)
    # bytes: L1 writeback cycles x 128, L2 lts2xbar cycles x 32, DRAM bytes; peaks at each level's clock
    np.testing.assert_allclose(s.bytes.values, [6.4e9, 3.2e9, 1.5e9])
    np.testing.assert_allclose(s.bandwidth.values, [6.4e12, 3.2e12, 1.5e12])
    np.testing.assert_allclose(s.peak_bandwidth.values, [132 * 128 * 2e9, 160 * 32 * 1.8e9, 1280 * 2.5e9])
    np.testing.assert_allclose(s.intensity.sel(precision="fp32").values, [3 / 6.4, 3 / 3.2, 2.0])
    np.testing.assert_allclose(s.ridge.sel(precision="fp32", level="DRAM"), 2 * 16896 * 2e9 / 3.2e12)
    # the tensor work is the fp16 path's; its peak that path's .peak_sustained; where none ran, the largest path's
    assert float(g.flop.sel(precision="tensor")) == 4e11
    assert float(g.peak_flop_rate.sel(precision="tensor")) == pytest.approx(1081344 * 2e9)
    assert float(s.peak_flop_rate.sel(precision="tensor")) == pytest.approx(2162688 * 2e9)
    assert list(rl.dominant_precision.values) == ["fp32", "tensor"]
    assert rl.flop_rate.attrs["units"] == "FLOP/second" and rl.attrs["chip"] == "GH100"
    assert list(rl["kernel"].values) == ["stream", "gemm"]


def test_roofline_bound_is_the_lowest_ceiling(two):
    rl = gs.roofline(two)
    s, g = rl.isel(range=0), rl.isel(range=1)
    # stream fp32: DRAM 2 FLOP/B x 3.2 TB/s = 6.4 TFLOP/s is below L2 (8.64), L1 (15.84) and the peak (67.6)
    assert str(s.bound.sel(precision="fp32").values) == "DRAM"
    assert float(s.attainable.sel(precision="fp32")) == pytest.approx(6.4e12)
    assert float(s.achieved_fraction.sel(precision="fp32")) == pytest.approx(3e12 / 6.4e12)
    # GEMM tensor: 4000, 1250 and 312.5 FLOP/B put every bandwidth ceiling above the 2.16 PFLOP/s peak
    assert str(g.bound.sel(precision="tensor").values) == "compute"
    assert float(g.achieved_fraction.sel(precision="tensor")) == pytest.approx(4e14 / (1081344 * 2e9))
    # its fp32 work (2 GFLOP) meets the L1 ceiling (1.5625 FLOP/B x 33.8 TB/s = 52.8 TFLOP/s) first: below DRAM's
    # 64 and the 67.6 TFLOP/s peak
    assert str(g.bound.sel(precision="fp32").values) == "L1"
    assert float(g.attainable.sel(precision="fp32")) == pytest.approx(2e9 / 1.28e9 * 132 * 128 * 2e9)
    # no work, no bound
    assert str(s.bound.sel(precision="fp64").values) == "" and np.isnan(float(s.achieved_fraction.sel(precision="fp64")))


def test_roofline_per_kernel_adds_the_launches(two):
    ds = xr.concat([two, two.isel(range=[0])], "range")
    ds["gpu__time_duration.sum"][2] = 3e6  # a third launch, three times as long, at the same clocks
    ds["dram__cycles_elapsed.avg.per_second"][2] = 3.5e9
    per = gs.roofline(ds, by="kernel")
    stream = per.sel(kernel="stream")
    assert int(stream["count"]) == 2
    assert float(stream.flop.sel(precision="fp32")) == 6e9
    assert float(stream.flop_rate.sel(precision="fp32")) == pytest.approx(6e9 / 4e-3)
    # the DRAM clock is weighted by duration: (1 x 2.5 + 3 x 3.5) / 4 GHz
    assert float(stream.peak_bandwidth.sel(level="DRAM")) == pytest.approx(1280 * 3.25e9)
    assert float(stream.peak_flop_rate.sel(precision="fp32")) == pytest.approx(2 * 16896 * 2e9)


def test_combine_adds_counts_weights_rates_keeps_peaks():
    ds = xr.Dataset({"gpu__time_duration.sum": ("range", [1.0, 3.0, 5.0]),
                     "dram__bytes.sum": ("range", [10.0, 20.0, 7.0]),
                     "sm__cycles_elapsed.avg.per_second": ("range", [1.0, 2.0, 9.0]),
                     "dram__bytes.sum.peak_sustained": ("range", [1280.0, 1280.0, 1280.0])},
                    coords={"kernel": ("range", ["a", "a", "b"])}, attrs={"chip": "GH100"})
    out = cb.combine(ds, "kernel")
    assert list(out["kernel"].values) == ["a", "b"] and list(out["count"].values) == [2, 1]
    np.testing.assert_allclose(out["dram__bytes.sum"], [30.0, 7.0])
    np.testing.assert_allclose(out["sm__cycles_elapsed.avg.per_second"], [(1 + 6) / 4, 9.0])
    np.testing.assert_allclose(out["dram__bytes.sum.peak_sustained"], [1280.0, 1280.0])
    assert out.attrs == {"chip": "GH100"}
    assert [cb.kind_of(n) for n in ("a__b.sum", "a__b.sum.peak_sustained", "a__b.avg.per_second", "a__b.pct")] == [
        "count", "peak", "rate", "rate"]
    with pytest.raises(MissingMetricsError, match="gpu__time_duration.sum"):
        cb.combine(ds.drop_vars("gpu__time_duration.sum"), "kernel")
    with pytest.raises(ValueError, match="no coordinate 'name'"):
        cb.combine(ds, "name")


def test_metric_takes_the_sets_alternatives():
    ds = xr.Dataset({"sm__ops_path_tensor_src_fp16_dst_fp16.sum": ("range", [1.0]),
                     "sm__ops_path_tensor_src_fp16_dst_fp32.sum": ("range", [2.0])})
    # Ampere, Ada and Blackwell split the fp16 tensor path by destination: the two stand in for GH100's one
    assert cb.metric(ds, "sm__ops_path_tensor_src_fp16.sum", "roofline").values.tolist() == [3.0]
    assert cb.metric(ds, "sm__ops_path_tensor_src_fp16.sum") is None
    assert cb.metric(ds, "dram__bytes.sum", "roofline") is None


def test_roofline_of_other_chips_names(two):
    # Ada's L1 counter (mem_lg, no distributed shared memory) and split fp16 tensor paths
    ds = two.rename({"l1tex__lsu_writeback_active_mem_lgds.sum": "l1tex__lsu_writeback_active_mem_lg.sum",
                     "l1tex__lsu_writeback_active_mem_lgds.sum.peak_sustained":
                         "l1tex__lsu_writeback_active_mem_lg.sum.peak_sustained",
                     "sm__ops_path_tensor_src_fp16.sum": "sm__ops_path_tensor_src_fp16_dst_fp32.sum",
                     "sm__ops_path_tensor_src_fp16.sum.peak_sustained":
                         "sm__ops_path_tensor_src_fp16_dst_fp32.sum.peak_sustained"})
    ds = ds.drop_vars([n for n in ds.data_vars if n.startswith("dram__")])  # a Tegra part has no DRAM counters
    rl = gs.roofline(ds)
    assert list(rl["level"].values) == ["L1", "L2"]
    assert float(rl.bytes.sel(level="L1").isel(range=0)) == 6.4e9
    assert float(rl.flop.sel(precision="tensor").isel(range=1)) == 4e11


def test_roofline_says_what_is_missing(two):
    with pytest.raises(MissingMetricsError, match="roofline") as info:
        gs.roofline(two.drop_vars([n for n in two.data_vars if n.startswith(("smsp__sass", "sm__ops_path"))]))
    assert f"{T}fadd_pred_on.sum" in info.value.missing
    with pytest.raises(MissingMetricsError, match="sm__cycles_elapsed.avg.per_second"):
        gs.roofline(two.drop_vars("sm__cycles_elapsed.avg.per_second"))


def test_memory_workload_per_level():
    ds = recorded([STREAM_MEMORY], ["stream"])
    mw = gs.memory_workload(ds).isel(range=0)
    assert list(mw["level"].values) == ["L1/TEX", "shared", "L2", "DRAM", "system"]
    # the sector is lts__t_bytes' peak over lts__t_sectors': 7680 / 240 bytes
    assert float(mw.sector_bytes) == 32.0
    np.testing.assert_allclose(mw.read_bytes.values, [2e9, np.nan, 1.5e9, 1.5e9, 32e3])
    np.testing.assert_allclose(mw.write_bytes.values, [1e9, np.nan, 1e9, 1e9, 0.0])
    np.testing.assert_allclose(mw.bytes.values, [3e9, 6.4e8, 2.5e9, 2.5e9, 32e3])
    np.testing.assert_allclose(mw.bandwidth.values, [3e12, 6.4e11, 2.5e12, 2.5e12, 32e6])
    np.testing.assert_allclose(mw.requests.values, [2e7, 5e6, 1.5e7, np.nan, np.nan])
    np.testing.assert_allclose(mw.hit_rate.values, [25.0, np.nan, 50.0, np.nan, np.nan])
    # busy: L1/TEX data stage 1e8 / (132 x 2 M cycles) beats its tag stage (2.2 %); shared its own wavefronts;
    # L2 3.2 GB / (7680 B x 1.8 M cycles); DRAM 2.5 GB / (1280 B x 2.5 M cycles)
    np.testing.assert_allclose(mw.busy.values, [100 / 2.64, 100 * 2.6e7 / 2.64e8, 100 * 3.2e9 / (7680 * 1.8e6),
                                                78.125, np.nan])
    assert str(mw.busiest_level.values) == "DRAM" and float(mw.busiest_share) == pytest.approx(78.125)
    np.testing.assert_allclose(mw.load_instructions.values, [1.5e7, 0.0, 4e6])
    np.testing.assert_allclose(mw.store_instructions.values, [5e6, 0.0, 1e6])
    np.testing.assert_allclose(mw.l1_requests.values, [2e7, 0.0, np.nan])
    np.testing.assert_allclose(mw.l1_bytes.values, [3e9, 0.0, np.nan])
    assert float(mw.shared_bank_conflicts) == 1.25e6 and float(mw.shared_wavefronts) == 2.6e7
    assert mw.hit_rate.attrs["units"] == "percent"


def test_memory_workload_on_chips_without_dram_counters_or_with_other_names():
    ds = recorded([STREAM_MEMORY], ["stream"])
    rtx50 = ds.rename({"dram__bytes_read.sum": "dram__bytes_op_read.sum", "dram__bytes_write.sum": "dram__bytes_op_write.sum",
                       "dram__bytes_read.sum.peak_sustained": "dram__bytes_op_read.sum.peak_sustained"})
    xr.testing.assert_allclose(gs.memory_workload(rtx50).busy, gs.memory_workload(ds).busy)
    tegra = gs.memory_workload(ds.drop_vars([n for n in ds.data_vars if n.startswith("dram__")])).isel(range=0)
    assert np.isnan(float(tegra.bytes.sel(level="DRAM"))) and np.isnan(float(tegra.busy.sel(level="DRAM")))
    assert str(tegra.busiest_level.values) == "L1/TEX"
    with pytest.raises(MissingMetricsError, match="'memory' set"):
        gs.memory_workload(recorded([STREAM], ["stream"], sets=("roofline",)))


@pytest.mark.parametrize("threads, registers, shared, blocks, limited_by, occupancy", [
    (256, 32, 0, 8, "registers+warps", 100.0),  # 8 warps x 1024 registers: a sub-partition holds 16 of them
    (256, 16, 0, 8, "warps", 100.0),
    (256, 40, 0, 6, "registers", 75.0),  # 1280 registers a warp: 12 per sub-partition, 48 per SM
    (256, 33, 0, 6, "registers", 75.0),  # 33 x 32 = 1056 registers, given as 1280
    (256, 64, 0, 4, "registers", 50.0),
    (128, 40, 48 << 10, 4, "shared_memory", 25.0),  # (48 KiB + 1 KiB reserved) x 4 fits in 228 KiB, x 5 not
    (32, 16, 0, 32, "blocks", 50.0),  # one-warp blocks: 32 blocks an SM at most
    (1024, 72, 0, 0, "registers", 0.0),  # 2304 x 32 warps exceeds a block's 65536 registers: cannot launch
    (1000, 0, 0, 2, "warps", 100.0),  # 1000 threads are 32 warps (the last one partial)
])
def test_theoretical_occupancy_as_cuda_calculates_it(threads, registers, shared, blocks, limited_by, occupancy):
    out = oc.theoretical_occupancy(threads, registers, shared, H100_LIMITS)
    assert (out["blocks"], out["limiter"], out["occupancy"]) == (blocks, limited_by, occupancy)
    assert out["warps"] == blocks * -(-threads // 32)


@pytest.mark.parametrize("threads, registers, shared, config, limit", [
    (256, 16, 0, 32, 32),  # 8 blocks of 1 KiB need 8 KiB: the driver configures no less than 32 KiB
    (256, 32, 44, 32, 28),  # 8 blocks of 1152 bytes: 32 KiB holds 28
    (256, 16, 6 << 10, 64, 9),  # 8 x 7 KiB = 56 KiB: 64 KiB holds 9
    (384, 168, 213188, 228, 1),  # 209 KiB (+1 KiB) for one block: only the largest size holds it
    (128, 40, 48 << 10, 228, 4),  # 12 blocks of 49 KiB fit in no size: the largest holds 4
])
def test_shared_memory_limit_counts_what_the_driver_configures(threads, registers, shared, config, limit):
    out = oc.theoretical_occupancy(threads, registers, shared, H100_LIMITS)
    assert (out["shared_memory_config"], out["limits"]["shared_memory"]) == (config << 10, limit)
    # CUDA's calculator counts the largest size: never fewer blocks, so the same occupancy
    largest = dataclasses.replace(H100_LIMITS, shared_memory_sizes=())
    assert out["blocks"] == oc.theoretical_occupancy(threads, registers, shared, largest)["blocks"]


def test_shared_memory_limit_of_a_given_configuration():
    # the size a launch got (ncu's launch__shared_mem_config_size) is used as is, and limits where it holds fewer
    given = oc.theoretical_occupancy(256, 16, 6 << 10, H100_LIMITS, shared_memory_config=32 << 10)
    assert (given["limits"]["shared_memory"], given["blocks"], given["limiter"]) == (4, 4, "shared_memory")
    # a tie the driver made by sizing shared memory to the other limits is not shared memory's doing
    tie = oc.theoretical_occupancy(32, 16, 0, H100_LIMITS)
    assert (tie["limits"]["shared_memory"], tie["limits"]["blocks"], tie["limiter"]) == (32, 32, "blocks")
    with pytest.raises(ValueError, match="shared_memory_config=-1"):
        oc.theoretical_occupancy(256, 16, 0, H100_LIMITS, shared_memory_config=-1)


def test_theoretical_occupancy_turing_allocates_shared_memory_by_256_bytes():
    turing = oc.SMLimits(max_warps=32, max_blocks=16, registers=65536, block_registers=65536, shared_memory=65536,
                         reserved_shared_memory=0, shared_memory_unit=256, sub_partitions=4)
    # 4100 bytes are given as 4352 (17 x 256): 15 blocks of them fit in 64 KiB, not 16
    assert oc.theoretical_occupancy(64, 32, 4100, turing)["limits"]["shared_memory"] == 15
    with pytest.raises(ValueError, match="threads must be positive"):
        oc.theoretical_occupancy(0, 32, 0, turing)


def test_occupancy_of_launches_waves_and_tail():
    ds = recorded(list(OCCUPANCY), ["stream", "fma"], sets=("occupancy",))
    out = gs.occupancy(ds, registers={"stream": 16, "fma": 40})
    assert list(out.limited_by.values) == ["warps", "registers"]
    np.testing.assert_allclose(out.theoretical_occupancy, [100.0, 75.0])
    np.testing.assert_allclose(out.block_limit.sel(limit="registers"), [16, 6])
    np.testing.assert_allclose(out.achieved_occupancy, [90.0, 60.0])
    np.testing.assert_allclose(out.achieved_warps, [57.6, 38.4])
    np.testing.assert_allclose(out.sm_active, [99.0, 80.0])
    # a wave is 8 x 132 = 1056 blocks: 65536 are 62 waves and 64 blocks; 4096 / (6 x 132) = 5 waves and 136 blocks
    np.testing.assert_allclose(out.waves_per_sm, [65536 / 1056, 4096 / 792])
    np.testing.assert_allclose(out.tail_blocks, [64, 136])
    np.testing.assert_allclose(out.tail_share, [1 / 63, 1 / 6])
    np.testing.assert_allclose(out.tail_utilization, [100 * 64 / 1056, 100 * 136 / 792])
    np.testing.assert_allclose(out.threads_per_block, [256, 256])
    np.testing.assert_allclose(out.shared_memory_config, [32 << 10, 32 << 10])  # 8 and 6 KiB needed
    # the registers the SM allocates, as ncu reports them (launch__registers_per_thread): 256 a warp, 8 a thread
    out30 = gs.occupancy(ds, registers={"stream": 30, "fma": 40})
    np.testing.assert_allclose(out30.registers, [30, 40])
    np.testing.assert_allclose(out30.registers_allocated, [32, 40])
    # the same from a DataArray per launch, and shared memory that limits the second launch
    regs = xr.DataArray([16, 40], dims="range")
    smem = xr.DataArray([0, 100_000], dims="range")
    out = gs.occupancy(ds, registers=regs, shared_memory=smem)
    assert list(out.limited_by.values) == ["warps", "shared_memory"]
    np.testing.assert_allclose(out.blocks_per_sm, [8, 2])


def test_occupancy_limits_from_the_dataset_or_given():
    ds = recorded(list(OCCUPANCY), ["stream", "fma"], sets=("occupancy",))
    assert oc.sm_limits(ds) == H100_LIMITS  # counters' peaks, device attrs, Hopper's table
    bare = ds.drop_vars(["sm__warps_active.avg.peak_sustained", "sm__ctas_active.avg.peak_sustained"])
    assert oc.sm_limits(bare) == H100_LIMITS  # from the device attrs alone (2048 threads = 64 warps)
    older = bare.assign_attrs({k: None for k in SM_LIMIT_ATTRS})
    older.attrs = {k: v for k, v in older.attrs.items() if v is not None}
    with pytest.raises(MissingMetricsError, match="limits="):
        gs.occupancy(older, registers=32)
    given = {"max_warps": 64, "max_blocks": 32, "registers": 65536, "block_registers": 65536, "shared_memory": 233472}
    assert oc.sm_limits(older, given).reserved_shared_memory == 0
    with pytest.raises(ValueError, match="no fields"):
        oc.sm_limits(ds, {"warps": 64})
    with pytest.raises(MissingMetricsError, match="registers="):
        gs.occupancy(ds)
    with pytest.raises(TypeError, match="mapping kernel"):
        gs.occupancy(ds, registers="32")
    # a kernel the mapping does not name: NaN for it, not a guess
    out = gs.occupancy(ds, registers={"stream": 16})
    assert np.isnan(float(out.theoretical_occupancy[1])) and str(out.limited_by.values[1]) == ""


def test_instruction_mix_pipes_and_classes():
    ds = recorded([INSTRUCTIONS], ["fma"], sets=("instructions",))
    out = gs.instruction_mix(ds).isel(range=0)
    share = out.pipe_share.to_series()
    assert (share["fma"], share["fmaheavy"], share["alu"], share["lsu"], share["tensor"]) == (50.0, 25.0, 25.0, 25.0, 0)
    util = out.pipe_utilization.to_series()
    # count / (peak per cycle x 1 M active cycles); the tensor pipe from its active cycles
    assert util["fma"] == pytest.approx(100 * 2e8 / 528e6) and util["lsu"] == pytest.approx(100 * 1e8 / 132e6)
    assert util["tensor"] == pytest.approx(10.0) and util["xu"] == 0
    assert str(out.busiest_pipe.values) == "lsu"
    classes = out.class_share.to_series()
    assert (classes["fp32"], classes["integer"], classes["memory"]) == (75.0, 18.75, 6.25)
    assert float(out.threads_per_inst) == 24.0 and float(out.pred_on_threads_per_inst) == 20.0
    assert float(out.inst_issued) == 4.1e8
    # GA100 has no fmaheavy pipe counter: left out of the set, NaN here
    ga100 = gs.instruction_mix(ds.drop_vars(["smsp__inst_executed_pipe_fmaheavy.sum",
                                             "sm__inst_executed_pipe_fmaheavy.sum.peak_sustained"])).isel(range=0)
    assert np.isnan(float(ga100.pipe_utilization.sel(pipe="fmaheavy")))
    assert float(ga100.pipe_utilization.sel(pipe="fma")) == pytest.approx(util["fma"])


def test_accessor_delegates(two):
    xr.testing.assert_identical(two.gpuscope.roofline(), gs.roofline(two))
    xr.testing.assert_identical(two.gpuscope.roofline(by="kernel"), gs.roofline(two, by="kernel"))


def test_device_info_records_the_sm_limits(monkeypatch):
    from cuda.bindings import driver as real

    values = {getattr(real.CUdevice_attribute, enum): i + 1 for i, enum in enumerate(_device._SM_LIMIT_ENUMS.values())}

    class Fake:
        CUdevice_attribute = real.CUdevice_attribute

        def cuDeviceGetAttribute(self, attr, dev):
            return (0, values.get(attr, 7))

        def cuDeviceGetName(self, n, dev):
            return (0, b"GPU\0")

        def cuDeviceGetPCIBusId(self, n, dev):
            return (0, b"0000:01:00.0\0")

        def cuDeviceTotalMem(self, dev):
            return (0, 1 << 30)

    monkeypatch.setattr(_device, "bindings", lambda: Fake())
    monkeypatch.setattr(_device, "_device", lambda index: 0)
    info = _device.device_info(0)
    assert set(info.sm_limits) == set(SM_LIMIT_ATTRS)
    assert [info.sm_limits[k] for k in _device._SM_LIMIT_ENUMS] == list(range(1, len(SM_LIMIT_ATTRS) + 1))
    ds = recorded([STREAM], ["stream"], sets=("roofline",))
    assert {k: ds.attrs[k] for k in SM_LIMIT_ATTRS} == H100.sm_limits


def test_the_peaks_are_the_chips_own_and_cost_no_pass():
    """Every .peak_sustained the analyses read evaluates from an H100 counter-data image that was configured for
    other metrics (a peak is a constant of the chip's configuration, not a counter), to the values the synthetic
    Datasets here use; and leaving the peaks out of a set saves no pass."""
    from pathlib import Path

    from gpuscope.cupti import host
    from gpuscope.cupti._types import ProfilerType

    from .sol_data import GH100_PEAKS

    image = np.load(Path(__file__).parents[1] / "fixtures" / "range" / "auto_3kernels_gh100.npz")["counter_data"]
    evaluated = {}
    for name in GH100_PEAKS:
        with host.ProfilerHost("GH100", ProfilerType.RANGE_PROFILER) as h:  # one host each: a bad name spoils it
            evaluated[name] = float(h.evaluate(image, 0, [name])[0])
    assert evaluated == GH100_PEAKS
    availability = np.load(Path(__file__).parents[1] / "fixtures" / "gh100_counter_availability_range.npy")
    for name in ("roofline", "memory", "occupancy", "instructions"):
        metrics = list(gs.metric_set(name).metrics)
        peaks = [m for m in metrics if m.endswith(".peak_sustained")]
        assert peaks and set(peaks) <= set(GH100_PEAKS)
        assert gs.count_passes(metrics, chip="GH100", counter_availability=availability) == gs.count_passes(
            [m for m in metrics if m not in peaks], chip="GH100", counter_availability=availability)
