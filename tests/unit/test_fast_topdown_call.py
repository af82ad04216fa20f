"""gs.profile_fast_topdown without a GPU: the H100 PC-sampling recording and a range pass made of ncu's values
for the same kernels stand in for the two halves; the call must join them as gs.fast_topdown does."""

import numpy as np
import pytest
import xarray as xr

import gpuscope as gs
from gpuscope._pc_sampling import fast as _fast
from gpuscope.metrics import topdown as td

from .test_pc_fixtures import _ncu_dataset, recorded  # noqa: F401 (fixture)

FAST = [td.IPC_EXECUTED, td.IPC_ISSUED, td.THREADS_PER_INST]


class Half:
    """A session that calls nothing on a GPU and hands back a recorded Dataset."""

    def __init__(self, dataset, calls, **kwargs):
        self.dataset, self.kwargs, self.calls = dataset, kwargs, calls
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


def _run(pc, ranges, work=None, **options):
    calls = []
    ran = []
    result = gs.profile_fast_topdown(
        work or (lambda n: (ran.append(n), calls.append("work"))), 7,
        pc_sampler=lambda **kw: Half(pc, calls, **kw), profiler=lambda *a, **kw: Half(ranges, calls, set=a, **kw),
        **options)
    return result, calls, ran


def test_one_call_joins_the_pc_samples_and_the_range_pass(recorded):  # noqa: F811
    _, pc = recorded
    ncu = _ncu_dataset()
    ranges = _range_pass(ncu, ncu["kernel"].values)
    result, calls, ran = _run(pc, ranges, period=2**12)
    assert ran == [7, 7]  # the work ran twice: under PC sampling, then as the range pass
    prof, pcs = (c for c in calls if isinstance(c, Half))
    assert prof.kwargs == {"set": ("fast-topdown",), "mode": "iteration", "device": 0}
    assert pcs.kwargs == {"period": 2**12, "device": 0}
    # one iteration-mode session; PC sampling over its first (sizing) iteration, the range pass on the second
    assert [c if isinstance(c, str) else "session" for c in calls] == [
        "session", "enter", "step", "session", "enter", "work", "exit", "step", "work", "exit"]
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
