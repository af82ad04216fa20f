"""Rank detection, per-rank file names, merging per-rank Datasets (real H100 recordings copied per rank with
perturbed values) and the cross-rank analysis."""

import warnings
from pathlib import Path

import matplotlib
import numpy as np
import pytest
import xarray as xr

matplotlib.use("Agg")

import gpuscope as gs  # noqa: E402
from gpuscope._results import job as _job
from gpuscope._results import build as _results
from gpuscope._schema import dataset as _dataset

DATA = Path(gs.__file__).parent / "data"
PHASES = Path(__file__).resolve().parents[1] / "fixtures" / "phases"
TIME = "gpu__time_duration.sum"


# ---------------------------------------------------------------------------------------------------------
# detection


@pytest.mark.parametrize("env, expected", [
    ({}, (0, 0, 1, 1, "none", ())),
    ({"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"}, (5, 1, 8, 4, "torchrun", ())),
    ({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4",
      "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, (3, 1, 4, 2, "openmpi", ())),
    # MPICH/Hydra as measured here with the mpich wheel's mpiexec -n 2
    ({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2", "PMI_FD": "11"},
     (1, 1, 2, 2, "mpich", ())),
    ({"PMI_RANK": "6", "PMI_SIZE": "8", "PMI_LOCAL_RANK": "2"}, (6, 2, 8, -1, "mpich", ())),
    ({"SLURM_PROCID": "9", "SLURM_LOCALID": "1", "SLURM_NTASKS": "16"}, (9, 1, 16, -1, "slurm", ())),
    # mpirun inside an sbatch script: every rank inherits the batch step's SLURM_PROCID=0; Open MPI is closer
    ({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "SLURM_PROCID": "0", "SLURM_NTASKS": "1",
      "SLURM_LOCALID": "0"}, (3, -1, 4, -1, "openmpi", ("slurm",))),
    # srun --mpi=pmi2: PMI gives no local rank, Slurm agrees on the rank and gives it
    ({"PMI_RANK": "3", "PMI_SIZE": "8", "SLURM_PROCID": "3", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1"},
     (3, 1, 8, -1, "mpich", ("slurm",))),
    # torchrun under srun (one Slurm task per node): torchrun's per-process rank wins
    ({"RANK": "6", "LOCAL_RANK": "2", "WORLD_SIZE": "8", "SLURM_PROCID": "1", "SLURM_NTASKS": "2"},
     (6, 2, 8, -1, "torchrun", ("slurm",))),
])
def test_rank_info_per_launcher(env, expected):
    info = gs.rank_info(env)
    assert (info.rank, info.local_rank, info.world_size, info.local_world_size, info.launcher, info.ignored) == expected
    assert info.host and isinstance(info, gs.RankInfo)
    with pytest.raises(AttributeError):
        info.rank = 1  # frozen


@pytest.mark.parametrize("visible, local, device", [("", 3, 3), ("2", 3, 0), ("0,1", 3, 1), ("GPU-a,GPU-b,GPU-c", 4, 1)])
def test_device_follows_local_rank_and_visible_devices(visible, local, device):
    env = {"RANK": str(local), "LOCAL_RANK": str(local), "WORLD_SIZE": "8", "CUDA_VISIBLE_DEVICES": visible}
    info = gs.rank_info(env)
    assert info.device == device and info.visible_devices == visible


@pytest.mark.parametrize("env, words", [
    ({"RANK": "two", "WORLD_SIZE": "4"}, "RANK='two' is not an integer"),
    ({"OMPI_COMM_WORLD_RANK": "1"}, "OMPI_COMM_WORLD_SIZE is not"),
    ({"PMI_RANK": "4", "PMI_SIZE": "4"}, "PMI_RANK=4 is not a rank of PMI_SIZE=4"),
    ({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"}, "local rank (2)"),
])
def test_bad_launcher_variables_are_named(env, words):
    with pytest.raises(gs.RankDetectionError, match=words.replace("(", r"\(").replace(")", r"\)")) as e:
        gs.rank_info(env)
    assert isinstance(e.value, ValueError)


def test_dataset_attrs_carry_the_rank(monkeypatch):
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "2")
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "4")
    ds = _results.range_dataset([{"values": [1.0], "name": "a"}], ["m"], {}, chip="GH100")
    assert {k: ds.attrs[k] for k in ("rank", "world_size", "launcher")} == {"rank": 2, "world_size": 4,
                                                                           "launcher": "openmpi"}
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "x")
    with pytest.warns(gs.GpuscopeWarning, match="rank -1"):
        ds = _results.range_dataset([{"values": [1.0], "name": "a"}], ["m"], {}, chip="GH100")
    assert ds.attrs["rank"] == -1 and ds.attrs["launcher"] == "unknown"


def test_an_engine_assigns_the_rank():
    info = gs.RankInfo(rank=3, local_rank=1, world_size=4, local_world_size=2, host="w", launcher="dask")
    with _job.assigned(info):
        assert gs.rank_info() is info
        assert _results.rank_attrs()["rank"] == 3
    assert gs.rank_info().rank == 0


def test_rank_path():
    info = gs.rank_info({"PMI_RANK": "7", "PMI_SIZE": "16", "MPI_LOCALRANKID": "3"})
    assert gs.rank_path("out/prof-{rank:03d}-of-{world_size}.nc", info) == "out/prof-007-of-16.nc"
    assert gs.rank_path(Path("{host}-{local_rank}.nc"), info) == f"{info.host}-3.nc"
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['node'\]"):
        gs.rank_path("prof-{node}.nc", info)
    with pytest.raises(ValueError, match="every rank would write the same file"):
        gs.rank_path("prof.nc", info)
    with pytest.raises(TypeError, match="pattern"):
        gs.rank_path(7, info)


# ---------------------------------------------------------------------------------------------------------
# merging range results


def _rank_copy(ds, rank, world=3, host="node0", session=1_000, wall=1_000):
    out = ds.copy(deep=True)
    out.attrs.update(rank=rank, world_size=world, host=host, launcher="mpich", local_rank=rank % 2,
                     session_start_ns=session, wall_clock_ns=wall)
    return out


@pytest.fixture(scope="module")
def launches():
    return gs.open_dataset(DATA / "demo_launches.nc")


@pytest.fixture()
def range_ranks(launches):
    """Three ranks of the H100 launch recording: rank 1 slower by 1.5x and on another host with its CUPTI clock
    5 s behind; rank 2 ran only the first 4 launches plus one kernel the others did not."""
    r0 = _rank_copy(launches, 0)
    r1 = _rank_copy(launches, 1, host="node1", session=2_000, wall=5_000_002_000)
    r1[TIME] = r1[TIME] * 1.5
    r2 = _rank_copy(launches.isel(range=slice(0, 4)), 2)
    extra = _rank_copy(launches.isel(range=[2]), 2)
    extra = extra.assign_coords(name=("range", ["halo"]), kernel=("range", ["halo"]), range=("range", [4]))
    r2 = xr.concat([r2, extra], "range", combine_attrs="override")
    return [r2, r0, r1]  # out of order on purpose


def test_merge_range_results(range_ranks, launches):
    m = gs.merge_ranks(range_ranks, ["r2.nc", "r0.nc", "r1.nc"])
    assert m["rank"].values.tolist() == [0, 1, 2]
    assert m["file"].values.tolist() == ["r0.nc", "r1.nc", "r2.nc"]
    assert m["host"].values.tolist() == ["node0", "node1", "node0"]
    assert m.sizes["range"] == 16  # 15 launches + rank 2's halo
    assert m.attrs["kind"] == "range" and m.attrs["merged_ranks"] == 3 and m.attrs["world_size"] == 3
    # ranks 0 and 1 ran every launch, rank 1 at 1.5x the time; rank 2 ran four of them plus the halo kernel
    t = launches[TIME].values
    np.testing.assert_array_equal(m[TIME].sel(rank=0).values[:15], t)
    np.testing.assert_array_equal(m[TIME].sel(rank=1).values[:15], t * 1.5)
    np.testing.assert_array_equal(m[TIME].sel(rank=2).values[:4], t[:4])
    assert np.isnan(m[TIME].sel(rank=2).values[4:15]).all() and np.isnan(m[TIME].sel(rank=0).values[15])
    assert m[TIME].sel(rank=2).values[15] == t[2]
    assert m["name"].values[15] == "halo" and m["occurrence"].values.tolist()[:6] == [0, 0, 0, 1, 1, 1]
    assert m["launch"].sel(rank=2).values.tolist() == [0, 1, 2, 3] + [-1] * 11 + [2]
    assert m["range"].values.tolist() == list(range(16))  # row numbers, as in one rank's results
    assert m.isel(range=m["name"] == "fma").sizes["range"] == 5
    # one clock: rank 1's CUPTI times move by wall - session = 5 s
    start = launches["start_ns"].values
    np.testing.assert_array_equal(m["start_ns"].sel(rank=0).values[:15], start)
    np.testing.assert_array_equal(m["start_ns"].sel(rank=1).values[:15], start + 5_000_000_000)
    assert m["start_ns"].sel(rank=2).values[5] == -1
    assert "wall clock" in m["start_ns"].attrs["clock"]


def test_merged_file_round_trips(range_ranks, tmp_path):
    m = gs.merge_ranks(range_ranks)
    gs.save_dataset(m, tmp_path / "merged.nc")
    xr.testing.assert_identical(gs.open_dataset(tmp_path / "merged.nc"), m)


def test_open_ranks_from_files(range_ranks, tmp_path):
    for ds in range_ranks:
        gs.save_dataset(ds, tmp_path / gs.rank_path("prof-{rank}.nc", gs.RankInfo(rank=ds.attrs["rank"])))
    by_pattern = gs.open_ranks(str(tmp_path / "prof-{rank}.nc"))
    by_list = gs.open_ranks(sorted(tmp_path.glob("prof-*.nc")))
    xr.testing.assert_identical(by_pattern, by_list)
    assert by_pattern["file"].values.tolist() == [str(tmp_path / f"prof-{r}.nc") for r in range(3)]
    with pytest.raises(gs.RankMergeError, match="no files match"):
        gs.open_ranks(str(tmp_path / "none-*.nc"))


def test_merge_refuses_what_does_not_fit(range_ranks, launches):
    r0, r1 = range_ranks[1], range_ranks[2]
    with pytest.raises(gs.RankMergeError, match="rank 1: a.nc, b.nc"):
        gs.merge_ranks([r0, r1, r1.copy()], ["r0.nc", "a.nc", "b.nc"])
    other_chip = r1.copy()
    other_chip.attrs["chip"] = "GB100"
    with pytest.raises(gs.RankMergeError, match="r1.nc: range/GB100"):
        gs.merge_ranks([r0, other_chip], ["r0.nc", "r1.nc"])
    series = _rank_copy(gs.open_dataset(PHASES / "cupy_gemm.nc"), 1)
    with pytest.raises(gs.RankMergeError, match="different kinds"):
        gs.merge_ranks([r0, series])
    pc = r1.copy()
    pc.attrs["kind"] = "pc_sampling"
    with pytest.raises(gs.RankMergeError, match="only range results"):
        gs.merge_ranks([r0, pc])
    with pytest.raises(gs.RankMergeError, match="do not: \\['dataset 1'\\]"):
        gs.merge_ranks([r0, launches])
    with pytest.raises(gs.RankMergeError, match="nothing to merge"):
        gs.merge_ranks([])
    with pytest.raises(TypeError, match="item 1 is a str"):
        gs.merge_ranks([r0, "r1.nc"])


def test_old_files_merge_in_the_order_given(launches):
    with pytest.warns(gs.GpuscopeWarning) as record:
        m = gs.merge_ranks([launches, launches], ["x.nc", "y.nc"])
    text = " ".join(str(w.message) for w in record)
    assert "numbered in the order given" in text and "no wall_clock_ns/session_start_ns clock link" in text
    assert m["file"].values.tolist() == ["x.nc", "y.nc"]
    np.testing.assert_array_equal(m["start_ns"].sel(rank=1).values, launches["start_ns"].values)  # not moved


# ---------------------------------------------------------------------------------------------------------
# merging PM samples


def test_merge_pm_samples_on_one_clock():
    names = ["cupy_gemm", "idle_gaps", "lengths"]
    series = [gs.open_dataset(PHASES / f"{n}.nc") for n in names]
    # each rank's clock link: wall clock = CUPTI + (r * 1 ms - 7 s)
    ranks = [_rank_copy(ds, r, session=int(ds.attrs["session_start_ns"]),
                        wall=int(ds.attrs["session_start_ns"]) + r * 1_000_000 - 7_000_000_000)
             for r, ds in enumerate(series)]
    m = gs.merge_ranks(ranks)
    sizes = [ds.sizes["time"] for ds in series]
    assert m.sizes["sample"] == max(sizes) and m["samples"].values.tolist() == sizes
    offsets = [r * 1_000_000 - 7_000_000_000 for r in range(3)]
    origin = min(int(ds.attrs["session_start_ns"]) + o for ds, o in zip(series, offsets))
    assert m.attrs["time_origin_ns"] == origin
    metric = "sm__cycles_active.avg.pct_of_peak_sustained_elapsed"
    for r, (ds, off, n) in enumerate(zip(series, offsets, sizes)):
        row = m.sel(rank=r)
        np.testing.assert_array_equal(row[metric].values[:n], ds[metric].values)
        np.testing.assert_array_equal(row["end_ns"].values[:n], ds["end_ns"].values + off)
        np.testing.assert_array_equal(row["time"].values[:n], ds["end_ns"].values + off - origin)
        assert np.isnan(row[metric].values[n:]).all() and (row["time"].values[n:] == -1).all()
    # per-rank scalars that differ become rank coords; the workload's plan (a list) cannot and is named
    assert m["workload"].values.tolist() == names
    assert "workload_plan" in m.attrs["per_rank_attrs_dropped"]
    assert not any(k.startswith("span_") for k in m.attrs["per_rank_attrs_dropped"])
    # the span tables follow one another in one table, each row with its rank, on the wall clock
    counts = [len(gs.spans(ds)) for ds in series]
    assert "span" not in m.dims and len(m.attrs["span_path"]) == sum(counts)
    assert m.attrs["span_rank"].tolist() == [r for r, k in enumerate(counts) for _ in range(k)]
    table = gs.spans(m)
    assert table.columns.tolist() == ["path", "thread", "start_ns", "end_ns", "start", "end", "rank"]
    first = 0
    for r, (ds, off, n) in enumerate(zip(series, offsets, sizes)):
        own = gs.spans(ds)
        mine = table.iloc[first:first + len(own)]
        assert mine["path"].tolist() == own["path"].tolist() and (mine["rank"] == r).all()
        np.testing.assert_array_equal(mine["start_ns"].values, own["start_ns"].values + off)
        np.testing.assert_array_equal(mine["start"].values, own["start_ns"].values + off - origin)
        # each sample's span_index points at its own span in the merged table
        index = m["span_index"].sel(rank=r).values
        np.testing.assert_array_equal(index[:n], np.where(ds["span_index"].values >= 0,
                                                          ds["span_index"].values + first, -1))
        assert (index[n:] == -1).all()
        first += len(own)
    # a file's span group says the times' clock: that of start_ns
    assert _dataset.table_groups(m)[1]["spans"]["span_start_ns"].attrs["clock"] == m["start_ns"].attrs["clock"]


def test_merge_pm_execution_tables(tmp_path):
    from gpuscope._results import build as _results

    ts = gs.open_dataset(PHASES / "cupy_gemm.nc").isel(time=slice(0, 100))
    t0 = int(ts.attrs["session_start_ns"])
    parts = []
    for r in range(2):
        records = [("gemm", t0 + 100 * i, t0 + 100 * i + 50, 0, 1, 7, (1, 1, 1), (1, 1, 1), 16, i)
                   for i in range(r + 2)]
        one = _results.with_executions(ts, {"records": records, "dropped": 0, "errors": []})
        parts.append(_rank_copy(one, r, session=t0, wall=t0 + 1000 * r))
    m = gs.merge_ranks(parts)
    assert m.attrs["exec_rank"].tolist() == [0, 0, 1, 1, 1]
    np.testing.assert_array_equal(m.attrs["exec_start_ns"][2:], parts[1].attrs["exec_start_ns"] + 1000)
    table = gs.kernel_executions(m)
    assert table.columns[-1] == "rank" and table.groupby("rank").size().to_dict() == {0: 2, 1: 3}
    gs.save_dataset(m, tmp_path / "m.nc")
    xr.testing.assert_identical(gs.open_dataset(tmp_path / "m.nc"), m)


# ---------------------------------------------------------------------------------------------------------
# analysis


def test_imbalance_and_slowest_rank(range_ranks, launches):
    m = gs.merge_ranks(range_ranks)
    imb = gs.imbalance(m)
    t = launches[TIME].to_series().groupby(launches["kernel"].values).sum()
    for k in ("stream", "fma", "divergent"):
        row = imb.sel(kernel=k)
        r2 = launches[TIME].values[:4][launches["kernel"].values[:4] == k].sum()
        expected = np.array([t[k], 1.5 * t[k], r2])
        np.testing.assert_allclose(row["time"].values, expected, rtol=1e-12)
        assert float(row["imbalance"]) == pytest.approx(expected.max() / expected.mean() - 1, rel=1e-12)
        assert int(row["slowest_rank"]) == 1 and int(row["ranks"]) == 3
    halo = imb.sel(kernel="halo")
    assert int(halo["ranks"]) == 1 and int(halo["slowest_rank"]) == 2 and float(halo["imbalance"]) == 0
    assert np.isnan(halo["time"].sel(rank=0))
    whole = gs.imbalance(m, by=None)
    np.testing.assert_allclose(whole["time"].values, gs.rank_times(m, by=None).values, rtol=1e-12)
    assert int(whole["slowest_rank"]) == 1
    with pytest.raises(ValueError, match="merged across ranks"):
        gs.imbalance(launches)
    with pytest.raises(ValueError, match="by must be"):
        gs.imbalance(m, by="grid_x")


def test_topdown_per_rank_equals_single_rank_topdown(range_ranks, launches):
    m = gs.merge_ranks(range_ranks)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gs.GpuscopeWarning)
        per_rank = gs.rank_topdown(m)
        alone = gs.aggregate(gs.topdown(launches, levels=(1,)), by="kernel")
        first4 = gs.aggregate(gs.topdown(launches.isel(range=slice(0, 4)), levels=(1,)), by="kernel")
    for node in ("retire", "divergence", "frontend", "backend"):
        np.testing.assert_allclose(per_rank[node].sel(rank=0, kernel=alone.kernel).values, alone[node].values,
                                   rtol=1e-12)
        np.testing.assert_allclose(per_rank[node].sel(rank=1, kernel=alone.kernel).values, alone[node].values,
                                   rtol=1e-12)  # time changed, not the counters Top-Down reads
        np.testing.assert_allclose(per_rank[node].sel(rank=2, kernel=first4.kernel).values, first4[node].values,
                                   rtol=1e-12)


def test_plot_ranks(range_ranks):
    import matplotlib.pyplot as plt

    m = gs.merge_ranks(range_ranks)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gs.GpuscopeWarning)
        fig = gs.plot_ranks(m)
    bars, td = fig.axes
    widest = [p for p in bars.patches if p.get_linewidth() == 2]
    assert len(widest) == 4  # one slowest rank outlined per kernel (3) + halo
    assert [t.get_text() for t in bars.get_xticklabels()] == ["divergent", "fma", "halo", "stream"]
    assert [t.get_text() for t in td.get_xticklabels()] == ["rank 0", "rank 1", "rank 2"]
    plt.close(fig)
    fig = gs.plot_ranks(m.drop_vars([v for v in m.data_vars if v != TIME]))  # no Top-Down metrics: one panel
    assert len(fig.axes) == 1
    plt.close(fig)
