"""The Dask and MPI engines gather per-rank Datasets into one. Here the work returns H100 recordings (scaled by
rank) instead of profiling; tests/gpu/test_multi_gpu.py profiles for real on two GPUs."""

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import gpuscope as gs

DATA = Path(gs.__file__).parent / "data"
TIME = "gpu__time_duration.sum"


def recorded_per_rank(path, scale):
    """The recording as if this rank ran it (1 + scale * rank) times slower: what a worker's profile returns."""
    info = gs.rank_info()
    ds = gs.open_dataset(path)
    ds[TIME] = ds[TIME] * (1 + scale * info.rank)
    return ds


@pytest.fixture(scope="module")
def client():
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None,
                                  silence_logs=50) as cluster, distributed.Client(cluster) as c:
        c.wait_for_workers(2)
        yield c


def test_dask_gather_merges_one_dataset_per_worker(client):
    import gpuscope.dask

    ranks = gpuscope.dask.workers(client)
    assert [i.rank for i in ranks.values()] == [0, 1] and [i.local_rank for i in ranks.values()] == [0, 1]
    with pytest.warns(gs.GpuscopeWarning, match="no wall_clock_ns/session_start_ns clock link"):  # 0.1 files
        merged = gpuscope.dask.gather(client, recorded_per_rank, str(DATA / "demo_launches.nc"), scale=0.5)
    alone = gs.open_dataset(DATA / "demo_launches.nc")
    assert merged["rank"].values.tolist() == [0, 1] and merged["file"].values.tolist() == list(ranks)
    assert merged.attrs["launcher"] == "dask" and merged.attrs["world_size"] == 2
    np.testing.assert_array_equal(merged[TIME].sel(rank=0).values, alone[TIME].values)
    np.testing.assert_array_equal(merged[TIME].sel(rank=1).values, alone[TIME].values * 1.5)
    assert float(gs.imbalance(merged, by=None)["imbalance"]) == pytest.approx(1.5 / 1.25 - 1, rel=1e-12)


def test_dask_gather_refuses_what_is_not_a_dataset(client):
    import gpuscope.dask

    with pytest.raises(TypeError, match="returned a int on rank"):
        gpuscope.dask.gather(client, len, "abc")
    with pytest.raises(ValueError, match="session must be"):
        gpuscope.dask.profile(client, len, "abc", session="trace")


def test_engines_are_not_imported_by_gpuscope():
    code = "import gpuscope, sys; print(any(m in sys.modules for m in ('gpuscope.dask', 'gpuscope.mpi', 'distributed', 'mpi4py')))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"


def _mpiexec():
    pytest.importorskip("mpi4py")
    found = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or shutil.which("mpiexec")
    if not found:
        pytest.skip("no mpiexec (pip install mpich)")
    return found


def test_mpi_gather_at_root(tmp_path):
    mpiexec = _mpiexec()
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(f"""
        import gpuscope as gs, gpuscope.mpi
        ds = gs.open_dataset({str(DATA / "demo_launches.nc")!r})
        ds[{TIME!r}] = ds[{TIME!r}] * (1 + gs.rank_info().rank)
        merged = gpuscope.mpi.gather(ds)
        if merged is not None:
            gs.save_dataset(merged, {str(tmp_path / "merged.nc")!r})
        else:
            open({str(tmp_path / "worker-done")!r}, "w").close()
    """))
    run = subprocess.run([mpiexec, "-n", "2", sys.executable, str(script)], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    merged = gs.open_dataset(tmp_path / "merged.nc")
    alone = gs.open_dataset(DATA / "demo_launches.nc")
    assert merged["rank"].values.tolist() == [0, 1] and (tmp_path / "worker-done").exists()
    assert merged.attrs["launcher"] == "mpich" and merged.attrs["world_size"] == 2
    assert merged["local_rank"].values.tolist() == [0, 1]
    np.testing.assert_array_equal(merged[TIME].sel(rank=1).values, 2 * alone[TIME].values)
