"""gpuscope with MPI (mpi4py): gather every rank's Dataset at one rank, merged along a ``rank`` dim.

Needs ``mpi4py`` and an MPI library (gpuscope's ``mpi`` extra, ``pip install '.[mpi]'`` in a checkout, brings
mpi4py); ``import gpuscope`` does not import this module. Datasets travel as pickles (mpi4py's lowercase
``gather``): xarray Datasets of numpy arrays pickle exactly, attrs and all, with no temporary files. The root holds
every rank's Dataset in memory at once: about the sum of the per-rank file sizes, uncompressed (docs/multi-gpu.md).
"""

from __future__ import annotations

import dataclasses
import socket

from gpuscope._results import job as _job
from gpuscope._results import ranks as _ranks
from gpuscope.errors import RankDetectionError

__all__ = ["gather"]


def gather(ds, comm=None, root: int = 0):
    """Gather the Dataset of every rank of *comm* at *root* and merge them (:func:`gpuscope.merge_ranks`).

    Collective: every rank of *comm* must call it. Each Dataset is stamped with its rank in *comm* (and the
    communicator's size as ``world_size``) before it is sent, so a sub-communicator numbers its own ranks.

    Parameters
    ----------
    ds : xarray.Dataset
        This rank's gpuscope Dataset (``prof.dataset``, ``sampler.dataset`` or ``gs.open_dataset(...)``).
    comm : mpi4py.MPI.Comm, optional
        Default ``MPI.COMM_WORLD``.
    root : int
        The rank that receives the merged Dataset.

    Returns
    -------
    xarray.Dataset or None
        The merged Dataset at *root*, None on the other ranks.

    Raises
    ------
    ImportError
        mpi4py is not installed (gpuscope's ``mpi`` extra: ``pip install '.[mpi]'`` in a checkout).
    TypeError
        *ds* is not an xarray Dataset (raised on the rank that passed it, before any communication).
    gpuscope.errors.RankMergeError
        At *root*: the Datasets do not merge (different kinds or chips).

    Examples
    --------
    >>> merged = gpuscope.mpi.gather(prof.dataset)      # doctest: +SKIP
    >>> if merged is not None:                          # doctest: +SKIP
    ...     print(gs.imbalance(merged))
    """
    import xarray as xr
    from mpi4py import MPI

    from gpuscope._results import build as _results

    if not isinstance(ds, xr.Dataset):
        raise TypeError(f"gpuscope.mpi.gather takes this rank's xarray Dataset; got {type(ds).__name__}")
    comm = MPI.COMM_WORLD if comm is None else comm
    try:
        info = _job.rank_info()
    except RankDetectionError:  # the communicator says the rank; the launcher's odd variables need not stop this
        info = _job.RankInfo(local_rank=-1, local_world_size=-1, host=socket.gethostname(), launcher="unknown")
    info = dataclasses.replace(info, rank=comm.Get_rank(), world_size=comm.Get_size())
    datasets = comm.gather(_results.with_rank(ds, info), root=root)
    if comm.Get_rank() != root:
        return None
    return _ranks.merge_ranks(datasets, sources=[f"MPI rank {r}" for r in range(len(datasets))])
