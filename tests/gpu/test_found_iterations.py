"""Auto mode without annotations: the loop found in the launch stream gives iteration replay, values as kernel
mode's; an annotated loop after a setup kernel stays in iteration mode; code without a loop stays in kernel mode."""

import warnings

import pytest

import gpuscope as gs

cuda = pytest.importorskip("numba.cuda")
from benchmarks import workloads  # noqa: E402

N = 1 << 22
TOL_PP = 2.0


@cuda.jit
def fill_f(x, v):
    i = cuda.grid(1)
    if i < x.size:
        x[i] = v


# the shared stream and FMA kernels under names of their own
stream_f = workloads.jit_as("stream_f", workloads.stream)
fma_f = workloads.jit_as("fma_f", workloads.fma)


@pytest.fixture(scope="module")
def arrays():
    return workloads.StreamFma(N)  # ones: N for stream, N // 16 for fma


def setup(work):
    fill_f[N // 256, 256](work.a, 1.0)
    fill_f[N // 16 // 256, 256](work.x, 1.0)


def step(work):
    work.stream(kernel=stream_f)
    work.fma(500, kernel=fma_f)


def per_kernel_pp(ds):
    td = gs.topdown(ds)  # percent of IPC_MAX: differences are in percentage points
    out = {}
    for kernel in ("stream_f", "fma_f"):
        sel = td.isel(range=td.kernel.str.endswith(kernel).values)
        assert sel.sizes["range"] > 0
        out[kernel] = {v: float(sel[v].median()) for v in td.data_vars}
    return out


def test_an_unannotated_loop_is_found_and_matches_kernel_mode(arrays):
    setup(arrays)
    step(arrays)
    cuda.synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gs.GpuscopeWarning)
        with gs.Profiler("topdown", mode="kernel") as kprof:
            for _ in range(3):
                step(arrays)
        with gs.Profiler("topdown", mode="auto") as prof:
            setup(arrays)
            for _ in range(30):
                step(arrays)
    ds = prof.dataset
    assert ds.attrs["mode"] == "iteration" and ds.attrs["iterations_found_by"] == "repetition"
    assert ds.attrs["repetition_period"] == 2
    replay = ds.replay.values.tolist()
    kernel_rows = replay.count("kernel")
    assert ds.attrs["launches_before_repetition"] == 2 + 6  # setup + the three repeats found
    # while searching, kernel replay profiles one launch per kernel, grid and block: the two fills and one step
    assert kernel_rows == ds.attrs["launches_replayed_before_repetition"] == 4
    assert replay[:kernel_rows] == ["kernel"] * kernel_rows and set(replay[kernel_rows:]) == {"iteration"}
    launches = ds.launch.values.tolist()
    assert launches[:kernel_rows] == [0, 1, 2, 3] and launches[kernel_rows] >= 8  # the session's launch IDs
    iteration_rows = ds.isel(range=ds.replay.values == "iteration")
    # every complete group of 7 iterations gives one row per launch of the iteration, named by its kernel
    assert iteration_rows.sizes["range"] >= 2 * 2
    assert [k.rsplit(".", 1)[-1] for k in iteration_rows.kernel.values[:2]] == ["stream_f", "fma_f"]
    k, i = per_kernel_pp(kprof.dataset), per_kernel_pp(iteration_rows)
    worst = max(abs(k[kern][node] - i[kern][node]) for kern in k for node in k[kern])
    print("largest found-iteration vs kernel-mode difference (pp of IPC_MAX):", round(worst, 2))
    assert worst <= TOL_PP


def test_an_annotated_loop_after_a_setup_kernel_stays_in_iteration_mode(arrays):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gs.GpuscopeWarning)
        with gs.Profiler("topdown", mode="auto") as prof:
            setup(arrays)  # launches outside every range, before the first top-level range
            for _ in range(prof.passes + 1):
                with gs.range("step"):
                    step(arrays)
    ds = prof.dataset
    assert ds.attrs["mode"] == "iteration" and ds.attrs["launches_before_ranges"] == 2
    assert ds.replay.values.tolist() == ["kernel", "kernel", "iteration", "iteration"]
    assert ds.parent.values.tolist()[2:] == ["step", "step"]


def test_code_without_a_loop_stays_in_kernel_mode(arrays):
    with gs.Profiler(["smsp__inst_executed.sum"], mode="auto") as prof:
        setup(arrays)
        step(arrays)
    ds = prof.dataset
    assert ds.attrs["mode"] == "kernel" and ds.attrs["iterations_found_by"] == "none"
    assert ds.sizes["range"] == 4 and set(ds.replay.values.tolist()) == {"kernel"}


def test_a_loop_with_a_checkpoint_kernel_every_few_steps(arrays):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gs.GpuscopeWarning)
        with gs.Profiler(["smsp__inst_executed.sum", "sm__ctas_launched.sum"], mode="auto") as prof:
            for i in range(40):
                step(arrays)
                if i % 10 == 9:
                    fill_f[64, 256](arrays.c, 0.0)  # a checkpoint kernel, after every 10th step
    ds = prof.dataset
    assert ds.attrs["iterations_found_by"] == "repetition"
    # The first two checkpoints fall between iterations of the 2-launch step; at the third, ten steps and a
    # checkpoint have repeated three times, and auto mode follows that 21-launch loop instead (the checkpoint is
    # in its iterations from then on).
    assert ds.attrs["launches_between_iterations"] >= 3
    assert (ds.attrs["repetition_period"], ds.attrs["repetition_relocks"]) == (21, 1)
    it = ds.isel(range=ds.replay.values == "iteration")
    ctas = {}
    for kernel, value in zip([k.rsplit(".", 1)[-1] for k in it.kernel.values], it["sm__ctas_launched.sum"].values):
        ctas.setdefault(kernel, set()).add(int(value))
    assert ctas["stream_f"] == {N // 256} and ctas["fma_f"] == {N // 16 // 256}
    assert ctas.get("fill_f", {64}) == {64}  # a row of the checkpoint, if its group completed, is the checkpoint's
