"""``gpuscope.profile_source``: the source view of a workload in one call (PC sampling, then SASS counters).

PC sampling and SASS patching cannot share launches (PC sampling would sample the patched code), so *work* runs
twice: first inside :func:`gpuscope.pc_sample` (first, because a PC block starts by detaching CUPTI, which it
cannot do beside an open gpuscope session), then inside :func:`gpuscope.source_counters`. The two Datasets are
joined per kernel and source line by :func:`gpuscope.source`.
"""

from __future__ import annotations

__all__ = ["profile_source"]


def profile_source(work, *args, period=2**10, metrics=None, device: int = 0, kernels=(), sources=None, **kwargs):
    """Run ``work(*args, **kwargs)`` twice, under PC sampling and under SASS counters, and join the two per line.

    Parameters
    ----------
    work : callable
        Launches the kernels to look at; run twice (keep it to a representative slice: tens of milliseconds of
        GPU time). Its device memory is not restored between the runs.
    period : int
        PC-sampling period in cycles (a power of two, 32 to 2**31).
    metrics : sequence of str, optional
        SASS metrics (default :data:`gpuscope._pc_sampling.counters.DEFAULT_METRICS`).
    device, kernels, sources
        As for :func:`gpuscope.pc_sample` and :func:`gpuscope.source_counters`.

    Returns
    -------
    dict of str to xarray.Dataset
        :func:`gpuscope.source`'s tables, one per kernel; each table's attrs also hold ``pc_total_samples``
        and ``counters_launches_counted``. To keep the two Datasets themselves, use :func:`gpuscope.pc_sample` and
        :func:`gpuscope.source_counters` directly and join them with :func:`gpuscope.source`.

    Raises
    ------
    TypeError
        *work* is not callable (before any GPU work).
    ValueError
        A bad *period* (before any GPU work).
    NoGpuError, SamplerBusyError, SessionConflictError, UnsupportedChipError, UnknownMetricError
        As :func:`gpuscope.pc_sample` and :func:`gpuscope.source_counters` raise them.
    """
    from gpuscope._pc_sampling.counters import DEFAULT_METRICS, source_counters
    from gpuscope._pc_sampling.sampler import _period_log2, pc_sample
    from gpuscope.metrics.source import source

    if not callable(work):
        raise TypeError(f"work must be callable, got {type(work).__name__}")
    _period_log2(period)  # a bad period fails here, before the first run
    counters = source_counters(metrics or DEFAULT_METRICS, device, kernels=kernels, sources=sources)
    with pc_sample(period=period, device=device, kernels=kernels, sources=sources) as pcs:
        work(*args, **kwargs)
    with counters:
        work(*args, **kwargs)
    tables = source(counters.dataset, pcs.dataset)
    for table in tables.values():
        table.attrs["pc_total_samples"] = int(pcs.dataset.attrs["total_samples"])
        table.attrs["counters_launches_counted"] = int(counters.dataset.attrs["launches_counted"])
    return tables
