"""Top-Down on the H100 classifies the demo kernels: streaming is memory-bound, the FMA chain core-bound, and the
one-lane FMA chain divergence-bound."""

import pytest

import gpuscope as gs
from gpuscope._commands import demo as _demo

LOST = ("divergence", "frontend", "backend_core", "backend_memory")


@pytest.fixture(scope="module")
def per_kernel():
    from numba import cuda

    work = _demo.build_workload(decorate=gs.profile)
    for name in _demo.PHASES:
        work.launch(name)
    cuda.synchronize()
    with gs.Profiler(metrics="topdown", mode="kernel") as prof:
        for _ in range(3):
            for name in _demo.PHASES:
                work.launch(name)
        cuda.synchronize()
    ds = prof.dataset
    assert ds.sizes["range"] == 9
    return gs.aggregate(gs.topdown(ds), by="kernel")


@pytest.mark.parametrize("kernel,expected", [("stream", "backend_memory"), ("fma", "backend_core"),
                                             ("divergent", "divergence")])
def test_dominant_node(per_kernel, kernel, expected):
    names = [str(k) for k in per_kernel["kernel"].values]
    row = per_kernel.isel(kernel=[i for i, n in enumerate(names) if n.endswith(kernel)][0])
    lost = {n: float(row[n]) for n in LOST}
    assert max(lost, key=lost.get) == expected, lost


def test_levels_sum_to_100_percent(per_kernel):
    total = sum(per_kernel[n] for n in ("retire", *LOST))
    assert float(abs(total - 100.0).max()) < 2.0
