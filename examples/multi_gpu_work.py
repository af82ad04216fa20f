"""The work both multi-GPU examples profile: a small Numba FMA kernel whose length grows with the rank, so the
merged Dataset shows a load imbalance (rank r runs (1 + r) x the inner iterations of rank 0)."""

import numpy as np

import gpuscope as gs

#: Counters that depend only on the work, not on timing: per rank they must equal a single-GPU run of the same work.
EXACT = ["sm__ctas_launched.sum", "smsp__inst_executed.sum"]
METRICS = EXACT + ["gpu__time_duration.sum", "sm__cycles_elapsed.max"]
SIZE = 1 << 20


def _kernel():
    from numba import cuda

    @cuda.jit
    def fma(x, iterations):
        i = cuda.grid(1)
        if i < x.size:
            v = x[i]
            for _ in range(iterations):
                v = v * 1.0001 + 0.5
            x[i] = v

    return fma


def work(launches: int = 4, rank: int | None = None) -> None:
    """*launches* launches of the FMA kernel on the current device, 200 * (1 + rank) inner iterations each."""
    from numba import cuda

    rank = gs.rank_info().rank if rank is None else rank
    fma = _kernel()
    x = cuda.to_device(np.ones(SIZE, np.float32))
    for _ in range(launches):
        fma[SIZE // 256, 256](x, 200 * (1 + max(rank, 0)))
    cuda.synchronize()


def summary(merged) -> str:
    """Per-rank time and instructions, and the imbalance, as text."""
    times = gs.rank_times(merged, by=None)
    imb = gs.imbalance(merged, by=None)
    lines = [f"{'rank':>4} {'host':>12} {'device':>6} {'GPU time (ms)':>14} {'instructions':>14}"]
    for r in merged["rank"].values.tolist():
        row = merged.sel(rank=r)
        lines.append(f"{r:>4} {str(row['host'].values):>12} {int(row['device']):>6} "
                     f"{float(times.sel(rank=r)) / 1e6:>14.3f} {float(row['smsp__inst_executed.sum'].sum()):>14.0f}")
    lines.append(f"imbalance (max/mean - 1): {float(imb['imbalance']):.3f}; slowest rank: {int(imb['slowest_rank'])}")
    return "\n".join(lines)
