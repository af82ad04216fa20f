"""Profile a Numba kernel on every MPI rank, each on its own GPU, and gather one Dataset with a ``rank`` dim at
rank 0.

    mpiexec -n 2 python3 examples/mpi_two_gpus.py [--out merged.nc] [--files 'prof-{rank}.nc']

Needs gpuscope's ``mpi`` extra (``pip install '.[mpi]'`` in a checkout: mpi4py) and an MPI library
(``pip install mpich`` where there is none). Each rank profiles on ``gs.rank_info().device`` (its local rank among
the visible GPUs); with ``--files`` each rank also writes its own file, which ``gs.open_ranks`` merges later
without MPI.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import multi_gpu_work  # noqa: E402

import gpuscope as gs  # noqa: E402
import gpuscope.mpi  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--launches", type=int, default=4)
    parser.add_argument("--out", help="rank 0 saves the merged Dataset here (netCDF)")
    parser.add_argument("--files", help="each rank also saves its own Dataset: a gs.rank_path pattern")
    args = parser.parse_args(argv)

    from numba import cuda

    info = gs.rank_info()
    cuda.select_device(info.device)
    with gs.Profiler(metrics=multi_gpu_work.METRICS, mode="kernel", device=info.device) as prof:
        multi_gpu_work.work(args.launches)
    if args.files:
        gs.save_dataset(prof.dataset, gs.rank_path(args.files, info))
    merged = gpuscope.mpi.gather(prof.dataset)
    if merged is not None:
        print(multi_gpu_work.summary(merged))
        if args.out:
            gs.save_dataset(merged, args.out)
            print(f"saved {args.out}")


if __name__ == "__main__":
    main()
