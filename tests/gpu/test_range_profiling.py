"""Range profiling on the GPU: user ranges, decorators, multi-pass, exception safety (run on the H100)."""

import numpy as np
import pytest

import gpuscope as gs

cuda = pytest.importorskip("numba.cuda")
from benchmarks import workloads  # noqa: E402

CHEAP = ["smsp__inst_executed.sum", "sm__ctas_launched.sum"]
SEVEN = ["smsp__inst_executed.avg.per_cycle_active", "smsp__thread_inst_executed_per_inst_executed.ratio",
         "smsp__inst_issued.avg.per_cycle_active"] + [
    f"smsp__warp_issue_stalled_{s}_per_warp_active.pct"
    for s in ("no_instruction barrier membar branch_resolving sleeping misc dispatch_stall math_pipe_throttle "
              "long_scoreboard imc_miss mio_throttle drain lg_throttle short_scoreboard wait tex_throttle "
              "selected not_selected").split()]
N = 1 << 20


inc = workloads.jit_as("inc", workloads.tiny)  # x += 1, a kernel of its own named inc


@cuda.jit
def chain(x):  # modifies its own input: replays must see the same input each pass
    i = cuda.grid(1)
    if i < x.size:
        v = x[i]
        n = 0
        while v < 64.0:
            v = v * 2.0 + 1.0
            n += 1
        x[i] = v + n


@cuda.jit
def staged(x):  # 1 KiB of static shared memory, and the launch's dynamic shared memory
    tile = cuda.shared.array(256, np.float32)
    extra = cuda.shared.array(0, np.float32)
    i = cuda.grid(1)
    t = cuda.threadIdx.x
    if i < x.size:
        tile[t] = x[i]
        extra[t] = 1.0
    cuda.syncthreads()
    if i < x.size:
        x[i] = tile[t] + extra[t]


def _numba_one(value) -> int:
    """A Numba per-signature value (a dict where no signature is given) as one number."""
    return int(next(iter(value.values())) if isinstance(value, dict) else value)


@pytest.fixture
def x():
    return cuda.to_device(np.zeros(N, np.float32))


def row(ds, name):
    sel = ds.where(ds.name == name, drop=True)
    assert sel.sizes["range"] >= 1, f"no range {name!r} in {list(ds.name.values)}"
    return sel


def test_nested_ranges_and_dataset(x, tmp_path):
    with gs.Profiler(CHEAP, max_depth=2) as prof:
        assert prof.cycles == 2
        for _ in range(2):
            with gs.range("step"):
                with gs.range("a"):
                    inc[N // 256, 256](x)
                with gs.range("b"):
                    inc[N // 128, 128](x)
    ds = prof.dataset
    assert set(ds.name.values) == {"step", "step/a", "step/b"}
    assert float(row(ds, "step/a")["sm__ctas_launched.sum"][0]) == N // 256
    assert float(row(ds, "step/b")["sm__ctas_launched.sum"][0]) == N // 128
    assert float(row(ds, "step")["sm__ctas_launched.sum"][0]) == N // 256 + N // 128
    assert list(row(ds, "step/a").parent.values) == ["step"]
    assert int(row(ds, "step").iterations[0]) == 2
    assert ds["sm__ctas_launched.sum"].attrs["units"]
    pytest.importorskip("h5netcdf")
    path = tmp_path / "r.nc"
    ds.to_netcdf(path, engine="h5netcdf")
    import xarray as xr

    xr.testing.assert_identical(ds, gs.open_dataset(path))


def test_numba_decorator_user_mode(x):
    k = gs.profile(inc)
    with gs.Profiler(CHEAP) as prof:
        for _ in range(3):
            k[N // 256, 256](x)
    ds = prof.dataset
    assert list(ds.kernel.values) == ["inc"] * 3
    assert list(ds.launch.values) == [0, 1, 2]
    assert (int(ds.grid_x[0]), int(ds.grid_y[0]), int(ds.block_x[0])) == (N // 256, 1, 256)
    assert ds["sm__ctas_launched.sum"].values.tolist() == [N // 256] * 3
    assert float(x.copy_to_host()[0]) == 3.0


@pytest.mark.parametrize("mode", ["kernel", "iteration"])
def test_launch_rows_record_registers_and_shared_memory(x, mode):
    """Each launch row holds the function's registers per thread and static shared memory as the driver gives them
    (Numba's own numbers for its kernel) and the dynamic shared memory the launch asked for, so gs.occupancy(ds)
    needs no arguments; a user range has -1."""
    dynamic = 256 * 4
    staged[N // 256, 256, 0, dynamic](x)  # compiled and loaded before the session
    cuda.synchronize()
    with gs.Profiler(CHEAP, mode=mode) as prof:
        for _ in range(2 * prof.passes + 1):  # iteration mode: the first iteration sizes the image
            with gs.range("step"):
                staged[N // 256, 256, 0, dynamic](x)
                staged[N // 128, 128, 0, dynamic // 2](x)  # extra[t] needs a float per thread
    ds = prof.dataset
    assert ds.sizes["range"] >= 2
    registers = _numba_one(staged.get_regs_per_thread())
    static = _numba_one(staged.get_shared_mem_per_block())
    assert static == 1024
    assert set(ds.registers_per_thread.values.tolist()) == {registers}
    assert set(ds.shared_memory_static.values.tolist()) == {static}
    assert ds.shared_memory_dynamic.values.tolist()[:2] == [dynamic, dynamic // 2]
    occ = gs.occupancy(ds)
    assert occ.registers.values.tolist()[:2] == [registers] * 2
    assert occ.shared_memory.values.tolist()[:2] == [static + dynamic, static + dynamic // 2]
    assert np.isfinite(occ.theoretical_occupancy.values).all()
    with gs.Profiler(CHEAP) as prof:  # user mode: ranges, not launches
        for _ in range(prof.cycles):
            with gs.range("step"):
                staged[N // 256, 256, 0, dynamic](x)
    user = prof.dataset
    assert user.registers_per_thread.values.tolist() == [-1] and user.shared_memory_dynamic.values.tolist() == [-1]


def test_cupy_kernels():
    cp = pytest.importorskip("cupy")
    raw = gs.profile(cp.RawKernel(r'''extern "C" __global__ void twice(float* y, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] *= 2.0f; }''', "twice"))
    ew = gs.profile(cp.ElementwiseKernel("float32 a", "float32 b", "b = a + 1", "plus_one"))
    red = gs.profile(cp.ReductionKernel("float32 a", "float32 s", "a", "a + b", "s = a", "0", "total"))
    y = cp.ones(N, cp.float32)
    with gs.Profiler(CHEAP, mode="kernel") as prof:
        raw((N // 256,), (256,), (y, np.int32(N)))
        z = ew(y)
        s = red(z)
    assert float(s) == 3.0 * N
    ds = prof.dataset
    kernels = list(ds.kernel.values)
    assert kernels[:2] == ["twice", "plus_one"]
    # CuPy may split a reduction in two kernels, named total_pass1 and total_pass2 (it did on the H100)
    assert kernels[2] == "total" or kernels[2].startswith("total_pass")
    assert (int(ds.grid_x[0]), int(ds.grid_y[0]), int(ds.grid_z[0])) == (N // 256, 1, 1)
    assert ds["sm__ctas_launched.sum"].values[0] == N // 256
    assert int(ds.grid_x[1]) > 0  # CuPy chose it; the driver callback recorded it


def test_seven_pass_set_kernel_replay(x):
    k = gs.profile(chain)
    with gs.Profiler(SEVEN, mode="kernel") as prof:
        assert prof.passes >= 7
        k[N // 256, 256](x)
    ds = prof.dataset
    assert ds.sizes["range"] == 1 and ds.kernel.values[0] == "chain"
    assert not np.isnan(ds[SEVEN[0]].values[0]) and ds[SEVEN[0]].values[0] > 0
    assert float(x.copy_to_host()[0]) == 127.0 + 7  # CUPTI restored the input between passes


def test_user_replay_equals_single_pass(x):
    ref_x = cuda.to_device(np.zeros(N, np.float32))
    with gs.Profiler(CHEAP) as single:
        with gs.range("chain"):
            chain[N // 256, 256](ref_x)
    multi_metrics = CHEAP + ["sm__throughput.avg.pct_of_peak_sustained_elapsed", "gpu__time_duration.sum"]
    with gs.Profiler(multi_metrics, progress=False) as prof:
        assert prof.passes > 1
        gs.replay(lambda: chain[N // 256, 256](x), name="chain")
    a, b = single.dataset, prof.dataset
    for m in CHEAP:
        assert float(b[m][0]) == float(a[m][0])
    assert float(x.copy_to_host()[0]) == float(ref_x.copy_to_host()[0])  # one run's effect, not `passes` runs


def test_iteration_multiplexing(x):
    metrics = CHEAP + ["sm__throughput.avg.pct_of_peak_sustained_elapsed", "gpu__time_duration.sum"]
    with gs.Profiler(metrics) as prof:
        for _ in range(2 * prof.cycles + 1):
            with gs.range("step"):
                inc[N // 256, 256](x)
    ds = prof.dataset
    assert ds.pass_group.values.tolist() == [0, 1]
    assert ds.first_iteration.values.tolist() == [0, prof.cycles]
    assert ds.iterations.values.tolist() == [prof.cycles] * 2
    assert ds["sm__ctas_launched.sum"].values.tolist() == [N // 256] * 2


def test_one_shot_multipass_block_raises_and_profiler_stays_usable(x):
    metrics = CHEAP + ["sm__throughput.avg.pct_of_peak_sustained_elapsed", "gpu__time_duration.sum"]
    with pytest.raises(gs.MultiPassRangeError, match="gpuscope.replay"):
        with gs.Profiler(metrics):
            with gs.range("once"):
                inc[N // 256, 256](x)
    with gs.Profiler(CHEAP) as prof:
        with gs.range("after"):
            inc[N // 256, 256](x)
    assert prof.dataset["sm__ctas_launched.sum"].values.tolist() == [N // 256]


def test_exception_inside_range_and_second_session(x):
    with gs.Profiler(CHEAP) as prof:
        with pytest.raises(gs.SessionConflictError, match="already open"):
            gs.Profiler(CHEAP).start()
        with pytest.raises(ZeroDivisionError):
            with gs.range("boom"):
                inc[N // 256, 256](x)
                1 / 0
        with gs.range("fine"):
            inc[N // 256, 256](x)
    ds = prof.dataset
    assert set(ds.name.values) == {"boom", "fine"}
    assert float(row(ds, "fine")["sm__ctas_launched.sum"][0]) == N // 256


def test_unknown_metric_names_close_match():
    with pytest.raises(gs.UnknownMetricError):
        gs.Profiler(["smsp__inst_executd.sum"])
    with gs.Profiler(CHEAP):
        pass
