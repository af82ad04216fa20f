"""Two GPUs, two processes: the Dask-CUDA and MPI examples each give a merged Dataset whose per-rank counters
equal a single-GPU run of the same work in this process. Two GPUs, one process: ``gs.sample(device=[0, 1])``
gives one Dataset with a device dim, each GPU busy while its own work ran. Skipped unless two GPUs (and the
engines) are present.

    source tests/gpu/device_env.sh && source tests/gpu/multi_env.sh && python3 -m pytest -m gpu tests/gpu/test_multi_gpu.py
"""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import gpuscope as gs
from gpuscope._gpu import device as _device
from gpuscope._results import job as _job

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "examples"))
import multi_gpu_work  # noqa: E402

pytestmark = pytest.mark.skipif(_device.device_count() < 2, reason="needs two GPUs")


@pytest.fixture(scope="module")
def single_gpu():
    """Each rank's work run here, alone, on device 0: the reference."""
    out = {}
    for rank in (0, 1):
        with _job.assigned(gs.RankInfo(rank=rank, world_size=2)):
            with gs.Profiler(metrics=multi_gpu_work.METRICS, mode="kernel", device=0) as prof:
                multi_gpu_work.work(4)
        out[rank] = prof.dataset
    return out


def _check(merged, single_gpu):
    assert merged["rank"].values.tolist() == [0, 1]
    assert sorted(merged["device"].values.tolist()) in ([0, 0], [0, 1])  # dask-cuda: device 0 of each worker
    for rank, alone in single_gpu.items():
        for metric in multi_gpu_work.EXACT:
            np.testing.assert_array_equal(merged[metric].sel(rank=rank).values, alone[metric].values)
    imb = gs.imbalance(merged, by=None)
    assert int(imb["slowest_rank"]) == 1 and float(imb["imbalance"]) > 0.1  # rank 1 runs 2x the iterations


def test_dask_cuda_two_workers(tmp_path, single_gpu):
    pytest.importorskip("dask_cuda")
    out = tmp_path / "dask.nc"
    run = subprocess.run([sys.executable, str(ROOT / "examples" / "dask_two_gpus.py"), "--out", str(out)],
                         capture_output=True, text=True, timeout=400)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    merged = gs.open_dataset(out)
    assert merged.attrs["launcher"] == "dask"
    _check(merged, single_gpu)
    assert (merged["wall_clock_ns"] > 0).all()  # every rank recorded its clock link


def test_mpirun_two_ranks(tmp_path, single_gpu):
    pytest.importorskip("mpi4py")
    mpiexec = shutil.which("mpiexec")
    if mpiexec is None:
        pytest.skip("no mpiexec (source tests/gpu/multi_env.sh)")
    out = tmp_path / "mpi.nc"
    files = str(tmp_path / "prof-{rank}.nc")
    run = subprocess.run([mpiexec, "-n", "2", sys.executable, str(ROOT / "examples" / "mpi_two_gpus.py"),
                          "--out", str(out), "--files", files], capture_output=True, text=True, timeout=400,
                         env={**os.environ, "CUDA_VISIBLE_DEVICES": "0,1"})
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    merged = gs.open_dataset(out)
    assert merged["device"].values.tolist() == [0, 1] and merged.attrs["launcher"] in ("mpich", "openmpi")
    _check(merged, single_gpu)
    from_files = gs.open_ranks(files)  # the same ranks from their own files
    for metric in multi_gpu_work.EXACT:
        np.testing.assert_array_equal(from_files[metric].values, merged[metric].values)
    # one clock: both ranks started within the job's few seconds on the wall clock
    starts = merged["start_ns"].where(merged["start_ns"] >= 0).min("range").values
    assert abs(starts[0] - starts[1]) < 60e9


def test_sample_both_gpus_from_one_process():
    """PM sampling of both GPUs in this process: GPU 0 works in range gpu0, then GPU 1 in range gpu1. Each device's
    samples must show its SMs busy in its own range and idle in the other's: the ranges are stamped on the CUPTI
    clock, so this holds only if both devices' sample timestamps are on that one clock."""
    from numba import cuda

    from benchmarks.workloads import fma

    size = 1 << 20
    arrays = {}
    for d in (0, 1):
        with cuda.gpus[d]:
            arrays[d] = cuda.to_device(np.ones(size, np.float32))
            fma[size // 256, 256](arrays[d], 10)  # compiled and loaded on this device before sampling
            cuda.synchronize()
    with gs.sample("pm-default", "100us", device=[0, 1]) as s:
        for d in (0, 1):
            with cuda.gpus[d], gs.range(f"gpu{d}"):
                t0 = time.perf_counter()
                while time.perf_counter() - t0 < 0.4:
                    for _ in range(10):
                        fma[size // 256, 256](arrays[d], 2000)
                    cuda.synchronize()
    ds = s.dataset
    assert ds["device"].values.tolist() == [0, 1] and ds.attrs["merged_devices"] == 2
    assert (ds["samples"].values > 4000).all(), ds["samples"].values  # ~0.8 s at 100 us on each device
    assert ds.attrs["lost_samples"] == sum(s.datasets[d].attrs["lost_samples"] for d in (0, 1))
    assert ds["start_ns"].attrs["clock"] == "cuptiGetTimestamp"
    active = "sm__cycles_active.avg.pct_of_peak_sustained_elapsed"
    for d in (0, 1):
        one = gs.select_device(ds, d)
        assert one.attrs["device_index"] == d and one.sizes["time"] == int(ds["samples"].sel(device=d))
        mine = one[active].where(one["range"] == f"gpu{d}", drop=True)[3:-3]
        other = one[active].where(one["range"] == f"gpu{1 - d}", drop=True)[3:-3]
        assert mine.size > 1000 and other.size > 1000, (d, mine.size, other.size)
        assert float(mine.median()) > 50 and float(other.median()) < 5, (d, float(mine.median()), float(other.median()))
    # both devices sampled the whole block: on each, the samples of the last range end at the same time (the
    # devices stop one after the other, so their very last samples differ by a stop's length: 285 ms on 2 x H200)
    ends = []
    for d in (0, 1):
        one = gs.select_device(ds, d)
        ends.append(float(one["end_ns"].where(one["range"] == "gpu1", drop=True).max()))
    assert abs(ends[0] - ends[1]) < 5e6, ends
