"""Which process of a multi-GPU job this is (rank, local rank, device, launcher), and per-rank file names.

Detection reads only environment variables (and, inside a Dask worker, ``distributed.get_worker()``): it loads
neither CUDA nor CUPTI nor ``distributed`` itself.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
import re
import socket
import sys

import numpy as np

from gpuscope._util.launchers import LAUNCHERS
from gpuscope._util.launchers import read as _read
from gpuscope.errors import RankDetectionError

__all__ = ["RankInfo", "rank_info", "rank_path"]


@dataclasses.dataclass(frozen=True)
class RankInfo:
    """Where this process sits in a multi-process job.

    Attributes
    ----------
    rank : int
        Global rank, 0 to ``world_size - 1`` (0 in a process that no launcher started; -1 where unknown, e.g. in a
        Dask worker not started by :func:`gpuscope.dask.profile`).
    local_rank : int
        Rank among the processes of this host (-1 where the launcher does not say).
    world_size : int
        Number of ranks (1 without a launcher; -1 where unknown).
    local_world_size : int
        Number of ranks on this host (-1 where the launcher does not say).
    host : str
        ``socket.gethostname()``.
    launcher : str
        Whose variables gave the rank: ``"dask"``, ``"torchrun"``, ``"openmpi"``, ``"mpich"`` (MPICH/Hydra,
        Intel MPI and other PMI launchers), ``"slurm"`` or ``"none"``.
    device : int
        The CUDA device ordinal this rank conventionally uses (pass it as ``device=`` to :class:`gpuscope.Profiler`
        or :func:`gpuscope.sample`): 0 when ``CUDA_VISIBLE_DEVICES`` leaves one device or was rotated by dask-cuda,
        else the local rank modulo the visible devices (the local rank when the variable is unset), else 0.
    visible_devices : str
        ``CUDA_VISIBLE_DEVICES`` as set ("" when unset).
    ignored : tuple of str
        Other launchers whose variables were also set and were overridden (see :func:`rank_info`).
    """

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    local_world_size: int = 1
    host: str = ""
    launcher: str = "none"
    device: int = 0
    visible_devices: str = ""
    ignored: tuple[str, ...] = ()

    def attrs(self) -> dict:
        """The Dataset attrs gpuscope stamps from this (netCDF-safe scalars)."""
        return {"rank": self.rank, "local_rank": self.local_rank, "world_size": self.world_size, "host": self.host,
                "launcher": self.launcher}


# Set by engines (gpuscope.dask) around the work of one task, where the environment cannot say the rank.
_assigned: contextvars.ContextVar[RankInfo | None] = contextvars.ContextVar("gpuscope_rank", default=None)


@contextlib.contextmanager
def assigned(info: RankInfo):
    """Within the block, :func:`rank_info` returns *info* (an engine that knows the rank sets it)."""
    token = _assigned.set(info)
    try:
        yield info
    finally:
        _assigned.reset(token)


def _int(var: str, text: str, launcher: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise RankDetectionError(f"{var}={text!r} is not an integer, so gpuscope cannot tell this process's "
                                 f"{launcher} rank; fix or unset {var}.") from None


def _from_launcher(launcher: str, env) -> tuple[int, int, int, int]:
    rank_var, local_var, size_var, local_size_var = LAUNCHERS[launcher]
    values = []
    for want in (rank_var, local_var, size_var, local_size_var):
        var, text = _read(env, want)
        values.append(-1 if var is None else _int(var, text, launcher))
    rank, local, size, local_size = values
    if _read(env, size_var)[0] is None:
        raise RankDetectionError(f"{rank_var} is set ({rank}) but {size_var} is not: a {launcher} rank needs the "
                                 f"world size too. Set {size_var}, or unset {rank_var} if this is not a "
                                 f"{launcher} job.")
    if not 0 <= rank < size:
        raise RankDetectionError(f"{rank_var}={rank} is not a rank of {size_var}={size} (ranks run from 0 to "
                                 f"{size - 1}); check the launcher's variables.")
    if local_size >= 0 and not 0 <= local < local_size:
        raise RankDetectionError(f"the local rank ({local}) is not below the local world size ({local_size}) in the "
                                 f"{launcher} variables; check them.")
    return rank, local, size, local_size


def _dask_worker():
    """The Dask worker running this code, or None (``distributed`` is only consulted if already imported)."""
    if "distributed" not in sys.modules:
        return None
    try:
        from distributed import get_worker

        return get_worker()
    except (ImportError, ValueError):  # ValueError: "No worker found" outside a worker
        return None


def _device(launcher: str, local_rank: int, visible: str) -> int:
    n_visible = len([d for d in visible.split(",") if d.strip()]) if visible else 0
    if launcher == "dask" and visible:
        return 0  # dask-cuda lists the worker's own GPU first
    if n_visible == 1 or local_rank < 0:
        return 0
    return local_rank % n_visible if n_visible else local_rank


def rank_info(env=None) -> RankInfo:
    """Rank, local rank, world size, host and device of this process, from its launcher's environment.

    The launcher closest to the process wins, in this order: a rank assigned by a gpuscope engine
    (:func:`gpuscope.dask.profile`), a Dask worker, torchrun (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
    ``LOCAL_WORLD_SIZE``: also any tool using torch.distributed's ``env://`` variables), Open MPI
    (``OMPI_COMM_WORLD_RANK``/``_LOCAL_RANK``/``_SIZE``/``_LOCAL_SIZE``), MPICH/Hydra and Intel MPI
    (``PMI_RANK``, ``PMI_SIZE``, ``MPI_LOCALRANKID`` or ``PMI_LOCAL_RANK``), Slurm (``SLURM_PROCID``,
    ``SLURM_LOCALID``, ``SLURM_NTASKS``). Variables of the others may disagree without error: ``mpirun`` inside
    an ``sbatch`` script leaves every rank with the batch step's ``SLURM_PROCID=0``, ``torchrun`` under ``srun``
    has one Slurm task per node. They are listed in :attr:`RankInfo.ignored`. A local rank the winner does not
    give is taken from another launcher that agrees on the rank (``srun --mpi=pmi2`` sets ``PMI_RANK`` and
    ``SLURM_LOCALID``). Cheap (no CUDA, no network): called for the attrs of every Dataset gpuscope makes.

    Parameters
    ----------
    env : mapping, optional
        The variables to read (default ``os.environ``).

    Returns
    -------
    RankInfo
        ``launcher="none"``, rank 0 of 1 when no launcher's variables are set.

    Raises
    ------
    gpuscope.errors.RankDetectionError
        The winning launcher's variables are incomplete (a rank without a world size), not integers, or out of
        range (rank not below the world size).

    Examples
    --------
    >>> gs.rank_info({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "8"}).rank
    3
    """
    given = _assigned.get()
    if given is not None:
        return given
    env = os.environ if env is None else env
    visible = env.get("CUDA_VISIBLE_DEVICES", "").strip()
    host = socket.gethostname()
    present = [name for name, names in LAUNCHERS.items() if _read(env, names[0])[0] is not None]
    worker = _dask_worker() if env is os.environ else None
    if worker is not None:
        name = worker.name
        rank = int(name) if isinstance(name, (int, np.integer)) or str(name).isdigit() else -1
        return RankInfo(rank, -1, -1, -1, host, "dask", _device("dask", -1, visible), visible, tuple(present))
    if not present:
        return RankInfo(host=host, device=_device("none", 0, visible), visible_devices=visible)
    launcher = present[0]
    rank, local, size, local_size = _from_launcher(launcher, env)
    if local < 0:
        for other in present[1:]:
            try:
                o_rank, o_local, _, o_local_size = _from_launcher(other, env)
            except RankDetectionError:
                continue
            if o_rank == rank and o_local >= 0:
                local, local_size = o_local, o_local_size
                break
    return RankInfo(rank, local, size, local_size, host, launcher, _device(launcher, local, visible), visible,
                    tuple(present[1:]))


FIELD = re.compile(r"{(\w*)[^{}]*}")


def rank_path(pattern: str | os.PathLike, info: RankInfo | None = None) -> str:
    """A file name for this rank: *pattern* with ``{rank}``, ``{local_rank}``, ``{world_size}``, ``{host}``,
    ``{launcher}`` and ``{device}`` filled in (format specs work: ``"prof-{rank:04d}.nc"``).

    Parameters
    ----------
    pattern : str or PathLike
        E.g. ``"out/prof-{rank}.nc"``.
    info : RankInfo, optional
        Default: :func:`rank_info`.

    Returns
    -------
    str

    Raises
    ------
    ValueError
        A field other than those above, or a pattern without ``{rank}`` or ``{host}`` (every rank would write the
        same file).
    TypeError
        *pattern* is not a str or PathLike.
    gpuscope.errors.RankDetectionError
        See :func:`rank_info`.

    Examples
    --------
    >>> gs.rank_path("prof-{rank:03d}.nc", gs.rank_info({"PMI_RANK": "7", "PMI_SIZE": "16"}))
    'prof-007.nc'
    """
    if not isinstance(pattern, (str, os.PathLike)):
        raise TypeError(f"rank_path needs a str or PathLike pattern such as 'prof-{{rank}}.nc'; got "
                        f"{type(pattern).__name__}")
    pattern = os.fspath(pattern)
    info = rank_info() if info is None else info
    fields = {"rank": info.rank, "local_rank": info.local_rank, "world_size": info.world_size, "host": info.host,
              "launcher": info.launcher, "device": info.device}
    used = set(FIELD.findall(pattern))
    unknown = sorted(used - set(fields))
    if unknown:
        raise ValueError(f"rank_path pattern {pattern!r} has unknown field(s) {unknown}; use {sorted(fields)}")
    if not used & {"rank", "host"}:
        raise ValueError(f"rank_path pattern {pattern!r} has no {{rank}} (or {{host}}) field, so every rank would "
                         "write the same file; e.g. 'prof-{rank}.nc'")
    return pattern.format(**fields)
