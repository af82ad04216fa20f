"""Profile a Numba kernel on every GPU of a Dask-CUDA cluster and gather one Dataset with a ``rank`` dim.

    python3 examples/dask_two_gpus.py [--gpus 0,1] [--out merged.nc]

Needs gpuscope's ``dask`` extra (``pip install '.[dask]'`` in a checkout: distributed, dask-cuda) and two GPUs.
Each worker runs ``work`` inside a gpuscope Profiler (kernel mode: one range per launch) on its own GPU; the client
prints per-rank GPU time, instructions and the imbalance.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cloudpickle  # noqa: E402
import multi_gpu_work  # noqa: E402

import gpuscope as gs  # noqa: E402
import gpuscope.dask  # noqa: E402

cloudpickle.register_pickle_by_value(multi_gpu_work)  # workers need not find examples/ on their path


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", default="0,1", help="CUDA_VISIBLE_DEVICES of the cluster (default 0,1)")
    parser.add_argument("--launches", type=int, default=4)
    parser.add_argument("--out", help="save the merged Dataset here (netCDF)")
    args = parser.parse_args(argv)

    from dask_cuda import LocalCUDACluster
    from distributed import Client

    with LocalCUDACluster(CUDA_VISIBLE_DEVICES=args.gpus, dashboard_address=None) as cluster, Client(cluster) as client:
        client.wait_for_workers(len(args.gpus.split(",")))
        merged = gpuscope.dask.profile(client, multi_gpu_work.work, args.launches,
                                       options={"metrics": multi_gpu_work.METRICS, "mode": "kernel"})
    print(multi_gpu_work.summary(merged))
    if args.out:
        gs.save_dataset(merged, args.out)
        print(f"saved {args.out}")
    return merged


if __name__ == "__main__":
    main()
