"""gs.profile_fast_topdown without a GPU: the H100 PC-sampling recording and a range pass made of ncu's values
for the same kernels stand in for the two halves; the call must join them as gs.fast_topdown does."""

import numpy as np
import pytest
import xarray as xr

import gpuscope as gs
from gpuscope._pc_sampling import fast as _fast
from gpuscope.metrics import topdown as td

from gpuscope._gpu import keep as _keep

from .test_detach import cupti  # noqa: F401 (fixture)
from .test_pc_fixtures import _ncu_dataset, recorded  # noqa: F401 (fixture)

FAST = [td.IPC_EXECUTED, td.IPC_ISSUED, td.THREADS_PER_INST]


class Half:
    """A session that calls nothing on a GPU and hands back a recorded Dataset (a PC block counts *launches*)."""

    passes = 1

    def __init__(self, dataset, calls, launches=None, **kwargs):
        self.dataset, self.kwargs, self.calls, self.launches = dataset, kwargs, calls, launches
        calls.append(self)

    def __enter__(self):
        self.calls.append("enter")
        return self

    def __exit__(self, *exc):
        self.calls.append("exit")
        return False

    def step(self):
        self.calls.append("step")


def _range_pass(ncu, names, launches=3):
    """Range results of *launches* launches per kernel, named as the range profiler names them."""
    rows = {m: ("range", np.repeat(ncu[m].values, launches)) for m in FAST}
    rows["sm__cycles_elapsed.max"] = ("range", np.full(len(names) * launches, 1000.0))
    kernel = np.repeat(names, launches)
    return xr.Dataset(rows, coords={"range": np.arange(kernel.size), "kernel": ("range", kernel)},
                      attrs={"kind": "range", "compute_capability": "9.0", "mode": "kernel"})


def _run(pc, ranges, work=None, launches=None, **options):
    calls = []
    ran = []
    counted = {"_Z6streamPf": 3, "_Z3fmaPf": 3} if launches is None else launches
    result = gs.profile_fast_topdown(
        work or (lambda n: (ran.append(n), calls.append("work"))), 7,
        pc_sampler=lambda **kw: Half(pc, calls, launches=counted, **kw),
        profiler=lambda *a, **kw: Half(ranges, calls, set=a, **kw), **options)
    return result, calls, ran


def test_one_call_joins_the_pc_samples_and_the_range_pass(recorded):  # noqa: F811
    _, pc = recorded
    ncu = _ncu_dataset()
    ranges = _range_pass(ncu, ncu["kernel"].values)
    result, calls, ran = _run(pc, ranges, period=2**12)
    assert ran == [7, 7]  # the work ran twice: under PC sampling, then as the range pass
    pcs, prof = (c for c in calls if isinstance(c, Half))
    # the image sized from the 6 launches the PC block counted: no sizing iteration
    assert prof.kwargs == {"set": ("fast-topdown",), "mode": "iteration", "device": 0, "max_ranges": 16}
    assert pcs.kwargs == {"period": 2**12, "device": 0, "hardware_buffer_size": _fast.FIRST_BUFFER}
    assert result.attrs["pc_blocks"] == 1
    # PC sampling first, with no session open (it detaches CUPTI), then the range pass in an iteration-mode session
    assert [c if isinstance(c, str) else "session" for c in calls] == [
        "session", "enter", "work", "exit", "session", "enter", "step", "work", "exit"]
    expected = _fast.fast_topdown(pc, ncu[FAST])
    for node in expected.data_vars:
        np.testing.assert_allclose(result[node].sel(kernel=expected["kernel"]), expected[node], rtol=1e-12)
        assert result[node].attrs["units"] == expected[node].attrs["units"]
    assert result["launches"].values.tolist() == [3, 3]
    per_kernel = pc["kernel_samples"].sum("stall_reason")
    np.testing.assert_allclose(result["samples_per_launch"], per_kernel.sel(kernel=result["kernel"]) / 3)
    assert result.attrs["pc_total_samples"] == 536398 and result.attrs["pc_dropped_samples"] == 0
    assert result.attrs["pc_hardware_buffer_full"] == 0
    assert "iteration-mode" in result.attrs["fast_topdown_collection"]
    assert result.attrs["kernels_without_pc_samples"] == [] and result.attrs["kernels_without_ipc"] == []


def test_short_names_are_matched_and_kernels_only_one_half_saw_are_named(recorded):  # noqa: F811
    _, pc = recorded
    ncu = _ncu_dataset()
    names = np.array(["fma", "unrelated_kernel"])  # a kernel both halves saw and one PC sampling never saw
    ranges = _range_pass(ncu.isel(kernel=[0, 0]), names, launches=2)
    with pytest.warns(gs.GpuscopeWarning, match=r"No PC samples for unrelated_kernel \(2 launches\).*left out"):
        result, _, _ = _run(pc, ranges)
    assert result["kernel"].values.tolist() == ["fma"]
    assert result["kernel_qualname"].values.tolist() == ["benchmarks.bench_pc_sampling.fma"]
    assert result.attrs["kernels_without_pc_samples"] == ["unrelated_kernel"]
    assert result.attrs["kernels_without_ipc"] == ["stream"]


def test_nothing_in_common_and_bad_input_say_what_to_do(recorded):  # noqa: F811
    _, pc = recorded
    ranges = _range_pass(_ncu_dataset().isel(kernel=[0]), np.array(["other"]))
    with pytest.raises(_fast.FastTopDownError, match="same each call"):
        _run(pc, ranges)
    ran = []
    with pytest.raises(ValueError, match="power of two"):
        _run(pc, ranges, work=lambda n: ran.append(n), period=1000)
    with pytest.raises(ValueError, match="check"):
        _run(pc, ranges, work=lambda n: ran.append(n), check="loud")
    assert ran == []  # refused before any work
    with pytest.raises(TypeError, match="callable"):
        gs.profile_fast_topdown(pc)


def test_where_the_pc_block_counted_no_launches_a_first_iteration_sizes_the_image(recorded):  # noqa: F811
    _, pc = recorded
    ncu = _ncu_dataset()
    result, calls, ran = _run(pc, _range_pass(ncu, ncu["kernel"].values), launches={})
    assert ran == [7, 7, 7]
    prof = [c for c in calls if isinstance(c, Half)][1]
    assert "max_ranges" not in prof.kwargs
    assert [c for c in calls if c in ("step", "work")] == ["work", "step", "work", "step", "work"]
    assert result["kernel"].values.tolist() == ["fma", "stream"]


class HoldingSession(Half):
    """A range session that holds CUPTI as gpuscope.Profiler does: the CUPTI profiler initialised from when it is
    made, a launch recorder while open; a clean close keeps its profiler (gpuscope._gpu.keep)."""

    def __init__(self, dataset, calls, **kwargs):
        from gpuscope.cupti import profiler

        super().__init__(dataset, calls, **kwargs)
        profiler.initialize()
        self.recorder = object()

    def __enter__(self):
        from gpuscope.cupti import subscriber

        subscriber._open.add(self.recorder)
        return super().__enter__()

    def __exit__(self, *exc):
        from gpuscope._gpu import keep as _keep
        from gpuscope.cupti import subscriber

        from .test_keep import FakeContext, FakeProfiler

        subscriber._open.discard(self.recorder)
        _keep.keep(0, _keep.Kept(("ctx", self.kwargs.get("mode")), 7, FakeContext(), FakeProfiler(), "c", "i"))
        return super().__exit__(*exc)


class DetachingBlock(Half):
    """A pc_sample block as far as CUPTI's state goes: it detaches CUPTI when it starts."""

    def __enter__(self):
        from gpuscope._gpu import keep as _keep

        self.cupti_detach = _keep.detach_cupti()
        return super().__enter__()


@pytest.mark.parametrize("before", [["iteration", "kernel"], ["iteration"]])
def test_fast_topdown_after_counter_sessions_detaches_cupti(recorded, cupti, before):  # noqa: F811
    """Issue 33 item 5: in a fresh process, an iteration-mode session, then a kernel-mode one, then
    profile_fast_topdown: 265 of 265 PC samples unattributed (in a PyTorch process after one iteration-mode session,
    2 kernels without samples). The fast Top-Down's own session was open when its PC block started, so CUPTI could
    not be detached, and kernels that ran under the earlier sessions got no PC records."""
    _, pc = recorded
    ncu = _ncu_dataset()
    calls = []
    for mode in before:  # the sessions before it, each closing cleanly: the last one's profiler stays kept
        with HoldingSession(None, calls, mode=mode):
            pass
    assert _keep.kept_devices() == [0]
    blocks = []

    def pc_sampler(**kw):
        blocks.append(DetachingBlock(pc, calls, launches={"_Z6streamPf": 3, "_Z3fmaPf": 3}, **kw))
        return blocks[-1]

    result = gs.profile_fast_topdown(lambda n: None, 7, pc_sampler=pc_sampler,
                                     profiler=lambda *a, **kw: HoldingSession(
                                         _range_pass(ncu, ncu["kernel"].values), calls, **kw))
    assert blocks[0].cupti_detach == "detached"
    assert cupti.calls.count("cuptiFinalize") == 1
    assert result["kernel"].values.tolist() == ["fma", "stream"]


def test_graph_launches_are_a_clear_error_naming_what_pc_sampling_saw(recorded):  # noqa: F811
    """Fast Top-Down cannot take a graph's kernels (PC sampling needs CUPTI detached, the graph copies need it
    attached): it stops after the PC block, names the kernels it sampled and what gives their Top-Down instead."""
    _, pc = recorded
    calls = []

    def sampler(**kw):
        block = Half(pc, calls, launches={})
        block.graph_launches = 10
        return block

    with pytest.raises(_fast.FastTopDownError, match=r"launched 10 CUDA graph launches .*PC-sampling half needs "
                                                     r"CUPTI detached") as caught:
        gs.profile_fast_topdown(lambda: calls.append("work"), pc_sampler=sampler,
                                profiler=lambda *a, **kw: pytest.fail("no range pass for graph launches"))
    text = str(caught.value)
    assert "gpuscope.pc_sample()" in text and f"PC sampling saw {pc['kernel'].values[0]}" in text
    assert "mode='kernel' or 'auto'" in text and "watch_graphs()" in text
    assert calls.count("work") == 1


def test_a_pc_block_whose_small_buffer_filled_runs_again_with_cuptis(recorded):  # noqa: F811
    """The PC block starts with a 32 MiB hardware buffer (a warm block costs 0.17 s instead of 0.43 s on the H100);
    where it filled, the work runs again under a block with CUPTI's 512 MiB, and the first block's warnings (the
    overflow) are not shown."""
    import warnings

    _, pc = recorded
    ncu = _ncu_dataset()
    calls, blocks = [], []

    class Filling(Half):
        def __exit__(self, *exc):
            full = self.kwargs.get("hardware_buffer_size") == _fast.FIRST_BUFFER
            self.dataset = pc.assign_attrs(hardware_buffer_full=int(full))
            if full:
                warnings.warn("PC sampling lost samples: CUPTI's hardware buffer filled", gs.GpuscopeWarning)
            return super().__exit__(*exc)

    def sampler(**kw):
        blocks.append(Filling(pc, calls, launches={"_Z6streamPf": 3, "_Z3fmaPf": 3}, **kw))
        return blocks[-1]

    with warnings.catch_warnings():
        warnings.simplefilter("error", gs.GpuscopeWarning)
        result = gs.profile_fast_topdown(lambda: calls.append("work"), pc_sampler=sampler,
                                         profiler=lambda *a, **kw: Half(_range_pass(ncu, ncu["kernel"].values),
                                                                        calls, **kw))
    assert [b.kwargs for b in blocks] == [{"period": 2**10, "device": 0, "hardware_buffer_size": _fast.FIRST_BUFFER},
                                          {"period": 2**10, "device": 0}]
    assert calls.count("work") == 3 and result.attrs["pc_blocks"] == 2
    assert "ran twice" in result.attrs["fast_topdown_collection"]
    assert result.attrs["pc_hardware_buffer_full"] == 0
