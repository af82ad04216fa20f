"""Range Datasets shaped as a kernel-mode session on an H100 builds them, with counter values chosen so that every
roofline, memory, occupancy and instruction quantity has an answer worked out by hand (used by test_sol*.py).

The layout is the real one: :func:`gpuscope._results.build.range_dataset` with the sets resolved on GH100 by the
host API, each metric's attrs as the session writes them, the device attrs of an H100 SXM. Only the values are made
up; the peaks per cycle are GH100's own, as the host API evaluates them (``.peak_sustained``).
"""

import functools

from gpuscope._gpu import device as _device
from gpuscope._gpu import metric_lists as _lists
from gpuscope._range_profiling.setup import _properties
from gpuscope._results import build
from gpuscope.cupti import host
from gpuscope.cupti._types import ProfilerType

T = "smsp__sass_thread_inst_executed_op_"
P = ".peak_sustained"
SETS = ("roofline", "memory", "occupancy", "instructions")

#: GH100's peaks per cycle (all units of the GPU), as CUPTI 13.1's host API evaluates them from an H100 image.
GH100_PEAKS = {
    "sm__sass_thread_inst_executed_op_dfma_pred_on.sum" + P: 8448.0,
    "sm__sass_thread_inst_executed_op_ffma_pred_on.sum" + P: 16896.0,
    "sm__sass_thread_inst_executed_op_hfma_pred_on.sum" + P: 16896.0,
    "sm__ops_path_tensor_src_fp64.sum" + P: 33792.0,
    "sm__ops_path_tensor_src_tf32_dst_fp32.sum" + P: 540672.0,
    "sm__ops_path_tensor_src_fp16.sum" + P: 1081344.0,
    "sm__ops_path_tensor_src_bf16_dst_fp32.sum" + P: 1081344.0,
    "sm__ops_path_tensor_src_fp8.sum" + P: 2162688.0,
    "l1tex__lsu_writeback_active_mem_lgds.sum" + P: 132.0,
    "lts__lts2xbar_cycles_active.sum" + P: 160.0,
    "dram__bytes.sum" + P: 1280.0,
    "dram__bytes_read.sum" + P: 1280.0,
    "l1tex__t_bytes.sum" + P: 67584.0,
    "l1tex__data_pipe_lsu_wavefronts.sum" + P: 132.0,
    "lts__t_bytes.sum" + P: 7680.0,
    "lts__t_sectors.sum" + P: 240.0,
    "sm__warps_active.avg" + P: 64.0,
    "sm__ctas_active.avg" + P: 32.0,
    "sm__pipe_tensor_cycles_active.sum" + P: 528.0,
    **{f"sm__inst_executed_pipe_{p}.sum" + P: v for p, v in (
        ("adu", 66.0), ("alu", 264.0), ("cbu", 528.0), ("fma", 528.0), ("fmaheavy", 264.0), ("fp64", 264.0),
        ("lsu", 132.0), ("tensor", 264.0), ("tex", 66.0), ("uniform", 264.0), ("xu", 66.0))},
}

#: The clocks of every row (Hz) and its duration (ns): 1 ms.
CLOCKS = {"gpu__time_duration.sum": 1e6, "sm__cycles_elapsed.avg.per_second": 2e9,
          "l1tex__cycles_elapsed.avg.per_second": 2e9, "lts__cycles_elapsed.avg.per_second": 1.8e9,
          "dram__cycles_elapsed.avg.per_second": 2.5e9}

#: A streaming kernel: 1 G FADD + 1 G FFMA (3 GFLOP fp32) in 1 ms; 1.5 GB DRAM, 3.2 GB from L2, 6.4 GB from L1.
STREAM = {f"{T}fadd_pred_on.sum": 1e9, f"{T}ffma_pred_on.sum": 1e9, "dram__bytes.sum": 1.5e9,
          "lts__lts2xbar_cycles_active.sum": 1e8, "l1tex__lsu_writeback_active_mem_lgds.sum": 5e7}
#: A tensor-core GEMM: 400 G fp16 tensor operations and 1 G FFMA in 1 ms; little traffic.
GEMM = {"sm__ops_path_tensor_src_fp16.sum": 4e11, f"{T}ffma_pred_on.sum": 1e9, "dram__bytes.sum": 1e8,
        "lts__lts2xbar_cycles_active.sum": 1e7, "l1tex__lsu_writeback_active_mem_lgds.sum": 1e7}

#: Memory traffic of the streaming kernel (the ``memory`` set).
STREAM_MEMORY = {
    "l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum": 2e9, "l1tex__t_bytes_pipe_lsu_mem_global_op_st.sum": 1e9,
    "l1tex__t_bytes_pipe_lsu_mem_local_op_ld.sum": 0.0, "l1tex__t_bytes_pipe_lsu_mem_local_op_st.sum": 0.0,
    "l1tex__t_bytes.sum": 3e9, "l1tex__data_pipe_lsu_wavefronts.sum": 1e8,
    "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum": 1.5e7, "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum": 5e6,
    "l1tex__t_sectors.sum": 3e9 / 32, "l1tex__t_sectors_lookup_hit.sum": 0.25 * 3e9 / 32,
    "lts__t_sectors_srcunit_tex_op_read.sum": 1.5e9 / 32, "lts__t_sectors_srcunit_tex_op_write.sum": 1e9 / 32,
    "lts__t_requests_srcunit_tex_op_read.sum": 1e7, "lts__t_requests_srcunit_tex_op_write.sum": 5e6,
    "lts__t_sectors.sum": 1e8, "lts__t_sectors_lookup_hit.sum": 5e7, "lts__t_bytes.sum": 3.2e9,
    "lts__t_sectors_aperture_sysmem_op_read.sum": 1e3, "lts__t_sectors_aperture_sysmem_op_write.sum": 0.0,
    "dram__bytes_read.sum": 1.5e9, "dram__bytes_write.sum": 1e9,
    "smsp__sass_inst_executed_op_global_ld.sum": 1.5e7, "smsp__sass_inst_executed_op_global_st.sum": 5e6,
    "smsp__sass_inst_executed_op_shared_ld.sum": 4e6, "smsp__sass_inst_executed_op_shared_st.sum": 1e6,
    "smsp__sass_data_bytes_mem_shared.sum": 6.4e8,
    "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum": 2e7, "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum": 6e6,
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum": 1e6,
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum": 2.5e5,
}

#: Occupancy counters of both kernels: 90 % and 60 % achieved; SMs active 99 % and 80 % of the elapsed cycles.
OCCUPANCY = ({"sm__warps_active.avg.pct_of_peak_sustained_active": 90.0, "sm__warps_active.avg.per_cycle_active": 57.6,
              "sm__ctas_launched.sum": 65536.0, "sm__warps_launched.sum": 524288.0, "sm__cycles_elapsed.avg": 2e6,
              "sm__cycles_active.avg": 1.98e6},
             {"sm__warps_active.avg.pct_of_peak_sustained_active": 60.0, "sm__warps_active.avg.per_cycle_active": 38.4,
              "sm__ctas_launched.sum": 4096.0, "sm__warps_launched.sum": 32768.0, "sm__cycles_elapsed.avg": 2e6,
              "sm__cycles_active.avg": 1.6e6})

#: Instruction counts: 400 M warp instructions, half on the FMA pipe, a quarter each on ALU and LSU.
INSTRUCTIONS = {"smsp__inst_executed.sum": 4e8, "smsp__inst_issued.sum": 4.1e8, "sm__cycles_active.avg": 1e6,
                "smsp__thread_inst_executed.sum": 9.6e9, "smsp__thread_inst_executed_pred_on.sum": 8e9,
                "smsp__inst_executed_pipe_fma.sum": 2e8, "smsp__inst_executed_pipe_fmaheavy.sum": 1e8,
                "smsp__inst_executed_pipe_alu.sum": 1e8, "smsp__inst_executed_pipe_lsu.sum": 1e8,
                "sm__pipe_tensor_cycles_active.sum": 5.28e7,
                f"{T}fp32_pred_on.sum": 6e9, f"{T}integer_pred_on.sum": 1.5e9, f"{T}memory_pred_on.sum": 5e8}

#: An H100 SXM5 as a session records it.
H100 = _device.DeviceInfo(index=0, name="NVIDIA H100 80GB HBM3", compute_capability=(9, 0), sm_count=132,
                          memory_bytes=85 << 30, sm_clock_khz=1980000, memory_clock_khz=2619000,
                          pci_bus_id="0000:00:00.0",
                          sm_limits={"sm_max_threads": 2048, "sm_max_blocks": 32, "sm_registers": 65536,
                                     "block_max_registers": 65536, "sm_shared_memory_bytes": 233472,
                                     "block_reserved_shared_memory_bytes": 1024})


@functools.cache
def _metrics(sets: tuple[str, ...]) -> tuple[list[str], dict]:
    metrics = _lists.resolve(list(sets), "GH100")
    with host.ProfilerHost("GH100", ProfilerType.RANGE_PROFILER) as h:
        properties = {m: _properties(h, m) for m in metrics}
    return metrics, properties


def recorded(rows, kernels, sets=SETS, blocks=((65536, 256), (4096, 256)), device=H100):
    """Range results of one launch per row, as a kernel-mode session builds them: *rows* are metric -> value
    (0 for the set's counters a row does not give; clocks, duration and GH100's peaks in every row), *kernels* the
    kernel names, *blocks* each row's (grid, block) sizes along x."""
    metrics, properties = _metrics(tuple(sets))
    records = []
    for i, (row, kernel) in enumerate(zip(rows, kernels, strict=True)):
        values = {m: 0.0 for m in metrics} | CLOCKS | GH100_PEAKS | row
        grid, block = blocks[i % len(blocks)]
        records.append({"name": kernel, "kernel": kernel, "symbol": kernel, "launch": i, "grid": (grid, 1, 1),
                        "block": (block, 1, 1), "start_ns": 1000 * i, "end_ns": 1000 * i + 900,
                        "values": [values[m] for m in metrics]})
    return build.range_dataset(records, metrics, properties, device, "GH100",
                               {"metric_set": list(sets), "mode": "kernel"})
