"""The variables by which launchers of several processes (torchrun, MPI, Slurm) say which process this is and how
many there are: read by the rank detection (``gpuscope._results.job``) and by the keeper (``gpuscope._gpu.keep``)."""

from __future__ import annotations

import os

__all__ = ["LAUNCHERS", "read", "processes_on_this_host"]

#: Launchers in precedence order (the first whose variables are set wins) -> (rank, local rank, world size,
#: local world size) variable names; a tuple lists alternatives, the first set one is read. None: not provided.
LAUNCHERS = {
    "torchrun": ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"),
    "openmpi": ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE",
                "OMPI_COMM_WORLD_LOCAL_SIZE"),
    "mpich": ("PMI_RANK", ("MPI_LOCALRANKID", "PMI_LOCAL_RANK"), "PMI_SIZE", ("MPI_LOCALNRANKS", "PMI_LOCAL_SIZE")),
    "slurm": ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS", None),
}


def read(env, name) -> tuple[str | None, str | None]:
    """(variable name, value) of the first set variable among *name* (a name, a tuple of names, or None)."""
    for n in (name,) if isinstance(name, str) or name is None else name:
        if n is not None and env.get(n, "").strip() != "":
            return n, env[n].strip()
    return None, None


def processes_on_this_host(env=None) -> int:
    """How many processes the launchers say run on this host, so may share its GPUs: for every launcher, its
    local world size, or its world size where it gives none (this host runs some of them); the largest; 1
    without a launcher. A value that is not a whole number counts as 1 (``gpuscope.rank_info`` says what is wrong
    with it)."""
    env = os.environ if env is None else env
    counts = [1]
    for _rank, _local, size, local_size in LAUNCHERS.values():
        text = read(env, local_size)[1] or read(env, size)[1]
        try:
            counts.append(int(text or 1))
        except ValueError:
            pass
    return max(counts)
