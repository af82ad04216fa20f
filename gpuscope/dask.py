"""gpuscope on a Dask cluster: profile the same work on every GPU worker and gather the Datasets to the client.

Made for dask-cuda's ``LocalCUDACluster`` (one worker per GPU, each worker's ``CUDA_VISIBLE_DEVICES`` listing its
own GPU first, so device 0 in the worker is its GPU); any ``distributed`` cluster works. Needs ``distributed``
(gpuscope's ``dask`` extra: ``pip install '.[dask]'`` in a checkout); ``import gpuscope`` does not import this module.

Ranks: workers are numbered by name when every name is an integer (LocalCluster and LocalCUDACluster name them
0, 1, ...), else by address; local ranks count the workers of each host. Inside the task, :func:`gpuscope.rank_info`
returns that rank, so Datasets built there, and files named with :func:`gpuscope.rank_path`, carry it.
"""

from __future__ import annotations

import dataclasses
import socket

from gpuscope._results import job as _job
from gpuscope._results import ranks as _ranks

__all__ = ["workers", "gather", "profile"]


def workers(client) -> dict:
    """The rank each worker of *client*'s cluster gets: worker address -> :class:`gpuscope.RankInfo`.

    Parameters
    ----------
    client : distributed.Client

    Returns
    -------
    dict
        In rank order.

    Raises
    ------
    gpuscope.errors.RankMergeError
        The cluster has no workers (yet): wait for them, e.g. ``client.wait_for_workers(n)``.
    """
    from gpuscope.errors import RankMergeError

    info = client.scheduler_info(n_workers=-1)["workers"]
    if not info:
        raise RankMergeError("the Dask cluster has no workers; start them first (client.wait_for_workers(n))")
    names = {addr: w.get("name") for addr, w in info.items()}
    numbered = all(isinstance(n, int) or str(n).isdigit() for n in names.values())
    order = sorted(info, key=(lambda a: (int(names[a]), a)) if numbered else (lambda a: a))
    hosts = [info[a].get("host") or a.split("://")[-1].rsplit(":", 1)[0] for a in order]
    out = {}
    for rank, (addr, host) in enumerate(zip(order, hosts)):
        same_host = [a for a, h in zip(order, hosts) if h == host]
        out[addr] = _job.RankInfo(rank=rank, local_rank=same_host.index(addr), world_size=len(order),
                                    local_world_size=len(same_host), host=host, launcher="dask", device=0)
    return out


def _run(fn, args, kwargs, info, session, options):
    """On the worker: *fn* inside the rank (and the gpuscope session), returning the rank-stamped Dataset."""
    from gpuscope._results import build as _results

    info = dataclasses.replace(info, host=socket.gethostname())  # the worker's own name for its host
    with _job.assigned(info):
        if session is None:
            ds = fn(*args, **kwargs)
        else:
            ds = _profiled(fn, args, kwargs, session, {"device": info.device, **options})
    if not hasattr(ds, "attrs") or not hasattr(ds, "data_vars"):
        raise TypeError(f"gpuscope.dask.gather: {getattr(fn, '__name__', fn)!r} returned a "
                        f"{type(ds).__name__} on rank {info.rank}; it must return the gpuscope Dataset "
                        "(prof.dataset, sampler.dataset, or gpuscope.open_dataset(...))")
    return _results.with_rank(ds, info)


def _profiled(fn, args, kwargs, session: str, options: dict):
    import gpuscope as gs

    if session == "sample":
        with gs.sample(**options) as s:
            fn(*args, **kwargs)
        return s.dataset
    with gs.Profiler(**options) as prof:
        fn(*args, **kwargs)
    return prof.dataset


def _submit(client, fn, args, kwargs, session, options):
    ranks = workers(client)
    futures = [client.submit(_run, fn, args, kwargs, info, session, options, workers=[addr], pure=False,
                             allow_other_workers=False) for addr, info in ranks.items()]
    datasets = client.gather(futures)
    return _ranks.merge_ranks(datasets, sources=list(ranks))


def gather(client, fn, *args, **kwargs):
    """Run ``fn(*args, **kwargs)`` once on every worker, each under its rank, and merge the Datasets it returns.

    Use it when *fn* does its own profiling (its own ``gs.Profiler``, ``gs.sample`` or ``gs.open_dataset``);
    :func:`profile` wraps *fn* in a session for you.

    Parameters
    ----------
    client : distributed.Client
    fn : callable
        Returns a gpuscope Dataset. It runs in a worker thread; :func:`gpuscope.rank_info` there gives its rank.
    *args, **kwargs
        Passed to *fn* (sent to the workers: they must pickle).

    Returns
    -------
    xarray.Dataset
        :func:`gpuscope.merge_ranks` of the workers' Datasets (``rank`` dim, ``file`` coordinate = worker address).

    Raises
    ------
    TypeError
        *fn* returned something other than a Dataset (raised from the worker, naming the rank).
    gpuscope.errors.RankMergeError
        No workers, or Datasets that do not merge (see :func:`gpuscope.merge_ranks`).

    Examples
    --------
    >>> from dask_cuda import LocalCUDACluster                                  # doctest: +SKIP
    >>> client = distributed.Client(LocalCUDACluster())                         # doctest: +SKIP
    >>> merged = gpuscope.dask.gather(client, lambda: gs.open_dataset(gs.rank_path("prof-{rank}.nc")))  # doctest: +SKIP
    """
    return _submit(client, fn, args, kwargs, None, {})


def profile(client, fn, *args, session: str = "range", options: dict | None = None, **kwargs):
    """Run ``fn(*args, **kwargs)`` on every worker inside a gpuscope session on that worker's GPU, and gather the
    Datasets into one with a ``rank`` dim on the client.

    Parameters
    ----------
    client : distributed.Client
    fn : callable
        The work (launches kernels on the current device); its return value is ignored.
    session : {"range", "sample"}
        ``"range"``: a :class:`gpuscope.Profiler` (default options ``metrics="launch", mode="kernel"``: one range
        per kernel launch); ``"sample"``: :func:`gpuscope.sample` (PM sampling over time).
    options : dict, optional
        Keyword arguments of the session (``metrics``, ``mode``, ``interval``, ...); ``device`` defaults to the
        worker's GPU (0 under dask-cuda).
    *args, **kwargs
        Passed to *fn*.

    Returns
    -------
    xarray.Dataset

    Raises
    ------
    ValueError
        *session* is neither "range" nor "sample".
    gpuscope.errors.GpuscopeError
        Any error of the session on a worker (raised on the client), or see :func:`gather`.

    Examples
    --------
    >>> merged = gpuscope.dask.profile(client, step, x, options={"metrics": "launch"})  # doctest: +SKIP
    >>> gs.imbalance(merged)                                                          # doctest: +SKIP
    """
    if session not in ("range", "sample"):
        raise ValueError(f"session must be 'range' (gs.Profiler) or 'sample' (gs.sample); got {session!r}")
    defaults = {"metrics": "launch", "mode": "kernel"} if session == "range" else {}
    return _submit(client, fn, args, kwargs, session, {**defaults, **(options or {})})
