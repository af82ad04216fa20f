"""Profiler(sample_every=k): only every k-th execution of a top-level range is profiled."""

import numpy as np
import pytest

import gpuscope as gs
from gpuscope._commands import demo as _demo


@pytest.fixture(scope="module")
def work():
    from numba import cuda

    w = _demo.build_workload(n=1 << 20)
    w.launch("stream")
    cuda.synchronize()
    return w


def _profile(work, every, iterations):
    from numba import cuda

    with gs.Profiler(metrics=["smsp__inst_executed.sum", "sm__ctas_launched.sum"], sample_every=every) as prof:
        for _ in range(iterations):
            with gs.range("step"):
                work.launch("stream")
                cuda.synchronize()
    return prof.dataset


def test_every_fourth_execution(work):
    every = _profile(work, 4, 8)
    once = _profile(work, 1, 1)
    step = every.where(every.name == "step", drop=True)
    assert int(step["iterations"].values[0]) == 2
    assert every.attrs["sample_every"] == 4
    # CUPTI sums repeated executions of a path in one pass: two profiled executions, twice the counters
    np.testing.assert_allclose(step["sm__ctas_launched.sum"].values[0], 2 * once["sm__ctas_launched.sum"].values[0])


def test_bad_sample_every():
    with pytest.raises(ValueError, match="sample_every"):
        gs.Profiler(metrics="launch", sample_every=0)
