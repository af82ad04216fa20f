"""netCDF round trips (gs.save_dataset / gs.open_dataset) and conversion of schema-1 and -2 files, on the H100 recordings."""

import os
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import gpuscope as gs
from gpuscope._schema import dataset as gs_dataset
from gpuscope._util import outputs as _outputs

DATA = Path(gs.__file__).parent / "data"
SCHEMA1 = Path(__file__).parents[1] / "fixtures" / "schema1"  # the recordings as first shipped


def raw(name, folder=SCHEMA1):
    with xr.open_dataset(folder / name, engine="h5netcdf") as ds:
        return ds.load()


def test_schema1_launches_convert_exactly():
    old = raw("demo_launches.nc")
    assert old.sizes == {"range": 15, "xyz": 3}  # schema 1
    ds = gs.open_dataset(SCHEMA1 / "demo_launches.nc")
    assert ds.sizes == {"range": 15} and ds.attrs["gpuscope_schema"] == gs_dataset.SCHEMA_VERSION
    for what in ("grid", "block"):
        for i, axis in enumerate("xyz"):
            np.testing.assert_array_equal(ds[f"{what}_{axis}"].values, old[what].values[:, i])
    assert ds.grid_x.values.tolist()[:3] == [65536, 4096, 4096] and set(ds.block_x.values) == {256}
    for name in old.data_vars:
        np.testing.assert_array_equal(ds[name].values, old[name].values)
    assert len(ds.to_dataframe()) == 15  # one row per launch (45 in schema 1)
    assert ds["range"].values.tolist() == list(range(15))  # row numbers, unique (schema 4)
    assert set(ds.isel(range=ds.kernel == "fma")["range"].values) == {1, 4, 7, 10, 13}


def test_schema1_series_convert_exactly():
    old = raw("demo_timeseries.nc")
    assert old.sizes == {"time": 18019, "span": 3}
    ds = gs.open_dataset(SCHEMA1 / "demo_timeseries.nc")
    assert ds.sizes == {"time": 18019} and ds.attrs["gpuscope_schema"] == gs_dataset.SCHEMA_VERSION
    assert list(ds.data_vars) == list(old.data_vars)[:8]
    assert len(ds.to_dataframe()) == 18019  # one row per sample (54,057 in schemas 1 to 4)
    assert ds.attrs["span_path"].tolist() == old["span_path"].values.tolist()
    table = gs.spans(ds)
    assert table["path"].tolist() == ["stream", "fma", "divergent"]
    np.testing.assert_array_equal(table["start_ns"].values, old["span_start_ns"].values)
    np.testing.assert_array_equal(table["end_ns"].values, old["span_end_ns"].values)
    # the derived per-sample span index agrees with the range path the recording stored per sample
    paths = np.array(table["path"].tolist() + [""])[ds["span_index"].values]
    np.testing.assert_array_equal(paths, ds["range"].values)
    assert np.bincount(ds["span_index"].values + 1).tolist() == [11, 6006, 6010, 5992]
    # per execution of a range: the streaming range reads DRAM far more than the FMA range
    dram = ds["dram__read_throughput.avg.pct_of_peak_sustained_elapsed"].groupby("span_index").mean()
    assert dram.sel(span_index=0) > 10 * dram.sel(span_index=1)


@pytest.mark.parametrize("name", ["demo_launches.nc", "demo_timeseries.nc"])
def test_shipped_recordings_are_the_current_schema_and_the_first_recordings_converted(name):
    """Issue 37, item 10: plain xr.open_dataset sees the layout docs/design.md describes (attr gpuscope_schema),
    and the files hold exactly what the schema-1 recordings convert to."""
    assert raw(name, DATA).attrs["gpuscope_schema"] == gs_dataset.SCHEMA_VERSION
    xr.testing.assert_identical(gs.open_dataset(DATA / name), gs.open_dataset(SCHEMA1 / name))


@pytest.mark.parametrize("name", ["demo_launches.nc", "demo_timeseries.nc"])
def test_converted_recordings_roundtrip_losslessly(tmp_path, name):
    ds = gs.open_dataset(DATA / name)
    gs.save_dataset(ds, tmp_path / name)
    back = gs.open_dataset(tmp_path / name)
    xr.testing.assert_identical(ds, back)  # attrs included: the span table's arrays compare element by element
    assert back.attrs.keys() == ds.attrs.keys() and type(back.attrs["metrics"]) is list


def test_attrs_of_every_type_roundtrip(tmp_path):
    ds = gs.open_dataset(DATA / "demo_launches.nc")
    ds.attrs.update(flag=True, off=False, nothing=None, one=["x"], one_int=[3], empty=[], flags=[True, False],
                    options={"interval": "20us", "n": 2})
    first = ds.attrs["metrics"][0]
    ds[first].attrs.update(one=[1.5], checked=False)
    gs.save_dataset(ds, tmp_path / "a.nc")
    back = gs.open_dataset(tmp_path / "a.nc")
    xr.testing.assert_identical(ds, back)
    assert back.attrs["flag"] is True and back.attrs["off"] is False and back.attrs["nothing"] is None
    assert back.attrs["one"] == ["x"] and back.attrs["one_int"] == [3] and back.attrs["empty"] == []
    assert back.attrs["flags"] == [True, False] and back.attrs["options"] == {"interval": "20us", "n": 2}
    assert back[first].attrs["one"] == [1.5] and back[first].attrs["checked"] is False
    assert "gpuscope_attr_types" not in back.attrs
    # other readers see plain netCDF values
    plain = xr.open_dataset(tmp_path / "a.nc", engine="h5netcdf")
    assert plain.attrs["flag"] == 1 and plain.attrs["nothing"] == "" and plain.attrs["one"] == "x"
    plain.close()


def test_one_metric_series_exports_after_a_round_trip(tmp_path):
    ds = gs.open_dataset(DATA / "demo_timeseries.nc")
    metric = "sm__cycles_active.avg.pct_of_peak_sustained_elapsed"
    one = ds[[metric]]  # the span table comes along (Dataset attrs)
    one.attrs["metrics"] = [metric]
    gs.save_dataset(one, tmp_path / "one.nc")
    back = gs.open_dataset(tmp_path / "one.nc")
    assert back.attrs["metrics"] == [metric]
    trace = gs.to_chrome_trace(back)
    counters = [e for e in trace["traceEvents"] if e["ph"] == "C"]
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(counters) == 18019 and [e["name"] for e in slices] == ["stream", "fma", "divergent"]
    assert slices[1]["dur"] == pytest.approx(int(ds.attrs["span_end_ns"][1] - ds.attrs["span_start_ns"][1]) / 1e3)
    # a file written by plain xarray (one metric comes back as a str) exports too
    one.to_netcdf(tmp_path / "plain.nc", engine="h5netcdf")
    assert gs.open_dataset(tmp_path / "plain.nc").attrs["metrics"] == [metric]


def test_bad_input_messages(tmp_path):
    ds = gs.open_dataset(DATA / "demo_launches.nc")
    ds.attrs["mixed"] = [1, "a"]
    with pytest.raises(ValueError, match="attr 'mixed' of the Dataset: a list attr must hold only"):
        gs.save_dataset(ds, tmp_path / "x.nc")
    ds.attrs["mixed"] = object()
    with pytest.raises(ValueError, match="cannot store an attr of type object"):
        gs.save_dataset(ds, tmp_path / "x.nc")
    with pytest.raises(ValueError, match="writes an xarray.Dataset"):
        gs.save_dataset(None, tmp_path / "x.nc")
    with pytest.raises(ValueError, match="needs a path"):
        gs.save_dataset(xr.Dataset(), None)
    with pytest.raises(ValueError, match="needs a path"):
        gs.open_dataset(None)
    with pytest.raises(ValueError, match="PM sampling"):
        gs.spans(ds)


def test_long_format_on_recordings():
    launches = gs.open_dataset(DATA / "demo_launches.nc")
    long = gs.to_dataframe(launches)
    assert len(long) == 15 * len(launches.data_vars)
    assert {"range", "name", "kernel", "launch", "grid_x", "metric", "value", "unit"} <= set(long.columns)
    cycles = long[long.metric == "sm__cycles_elapsed.max"]
    assert set(cycles["unit"]) == {launches["sm__cycles_elapsed.max"].attrs["units"]}
    assert cycles.groupby("kernel")["value"].median().to_dict() == pytest.approx(
        launches["sm__cycles_elapsed.max"].groupby("kernel").median().to_series().to_dict())
    series = gs.open_dataset(DATA / "demo_timeseries.nc")
    long = gs.to_dataframe(series, ["pcie__read_bytes.sum.per_second"])
    unit = series["pcie__read_bytes.sum.per_second"].attrs["units"]  # CUPTI's own spelling
    assert len(long) == 18019 and set(long["unit"]) == {unit} and unit.startswith("byte/second")
    assert {"time", "start_ns", "end_ns", "range", "span_index"} <= set(long.columns)


def test_a_failed_save_leaves_the_file_that_was_there(tmp_path):
    ds = gs.open_dataset(DATA / "demo_launches.nc")
    path = tmp_path / "launches.nc"
    gs.save_dataset(ds, path)
    good = path.read_bytes()
    # xarray refuses the object variable only after it has begun the file: this used to leave an empty netCDF
    bad = ds.assign(junk=("range", np.array([{"a": 1}] * ds.sizes["range"], dtype=object)))
    with pytest.raises(ValueError, match="junk"):
        gs.save_dataset(bad, path)
    assert path.read_bytes() == good and sorted(p.name for p in tmp_path.iterdir()) == ["launches.nc"]
    xr.testing.assert_identical(gs.open_dataset(path), ds)


def test_an_interrupted_save_leaves_the_file_that_was_there(tmp_path, monkeypatch):
    ds = gs.open_dataset(DATA / "demo_launches.nc")
    path = tmp_path / "launches.nc"
    gs.save_dataset(ds, path)
    good = path.read_bytes()
    written = []

    def ctrl_c_at_the_flush(tmp):  # Ctrl-C once the new file is written, before it is flushed and renamed
        written.append((tmp, Path(tmp).stat().st_size))
        raise KeyboardInterrupt

    monkeypatch.setattr(_outputs, "_fsync", ctrl_c_at_the_flush)
    with pytest.raises(KeyboardInterrupt):
        gs.save_dataset(ds.assign_attrs(note="second"), path)
    (tmp, size), = written
    assert Path(tmp).parent == tmp_path and Path(tmp) != path and size > 0  # beside it, not it
    assert path.read_bytes() == good and sorted(p.name for p in tmp_path.iterdir()) == ["launches.nc"]


def test_a_save_refuses_a_symlink_and_makes_the_usual_file_mode(tmp_path):
    """Decided (issue 52, item 9): no output is written through a link; it used to replace the file the link named,
    and a dangling link made the file wherever it pointed (another user's link in a shared folder)."""
    ds = gs.open_dataset(DATA / "demo_launches.nc")
    (tmp_path / "runs").mkdir()
    link = tmp_path / "latest.nc"
    link.symlink_to(tmp_path / "runs" / "one.nc")
    with pytest.raises(OSError, match="is a symbolic link"):
        gs.save_dataset(ds, link)
    assert link.is_symlink() and not (tmp_path / "runs" / "one.nc").exists()
    gs.save_dataset(ds, tmp_path / "runs" / "one.nc")
    umask = os.umask(0o022)
    os.umask(umask)
    assert (tmp_path / "runs" / "one.nc").stat().st_mode & 0o777 == 0o666 & ~umask
    with pytest.raises(IsADirectoryError, match="runs"):
        gs.save_dataset(ds, tmp_path / "runs")
    with pytest.raises(FileNotFoundError) as missing:
        gs.save_dataset(ds, tmp_path / "nope" / "x.nc")
    assert missing.value.filename == str(tmp_path / "nope" / "x.nc")  # the path asked for, not a temporary one


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


@pytest.mark.parametrize("mode", [0o600, 0o640, 0o444], ids=oct)
def test_a_save_over_a_file_keeps_its_mode(tmp_path, umask_022, mode):
    """With umask 022, a save over a 0600 file used to leave it 0644: results readable by every user. While the new
    file is written it is readable by its owner only."""
    ds = gs.open_dataset(DATA / "demo_launches.nc")
    path = tmp_path / "private.nc"
    gs.save_dataset(ds, path)
    path.chmod(mode)
    modes = []

    def write(tmp):
        modes.append(os.stat(tmp).st_mode & 0o777)
        ds.to_netcdf(tmp, engine="h5netcdf")

    _outputs.write(path, write)
    assert modes == [0o600] and path.stat().st_mode & 0o777 == mode
    gs.save_dataset(ds, path)
    assert path.stat().st_mode & 0o777 == mode


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a file to another user")
def test_a_save_over_a_file_keeps_its_owner_and_group(tmp_path):
    ds = gs.open_dataset(DATA / "demo_launches.nc")
    path = tmp_path / "theirs.nc"
    gs.save_dataset(ds, path)
    os.chown(path, 65534, 65534)  # nobody's
    gs.save_dataset(ds, path)
    assert (path.stat().st_uid, path.stat().st_gid) == (65534, 65534)


def test_a_save_flushes_the_file_then_renames_then_flushes_the_folder(tmp_path, monkeypatch):
    """Without fsync before the rename, a power loss could leave an empty file where the old one was."""
    ds = gs.open_dataset(DATA / "demo_launches.nc")
    path = tmp_path / "launches.nc"
    gs.save_dataset(ds, path)
    events = []
    fsync, replace = os.fsync, os.replace

    def recorded_fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        fsync(fd)

    def recorded_replace(src, dst):
        events.append(("replace", os.fspath(src), os.fspath(dst)))
        replace(src, dst)

    monkeypatch.setattr(os, "fsync", recorded_fsync)
    monkeypatch.setattr(os, "replace", recorded_replace)
    gs.save_dataset(ds, path)
    assert [e[0] for e in events] == ["fsync", "replace", "fsync"]
    tmp = events[1][1]
    assert events[0][1] == tmp and events[1][2] == str(path) and events[2][1] == str(tmp_path)


def test_a_save_over_a_hard_linked_file_says_the_other_names_keep_the_old_contents(tmp_path):
    """Decided: the atomic replace is kept (writing in place would leave a damaged file when a save fails), so the
    other names of a hard-linked file keep the old contents, and the save says so instead of breaking the link
    silently."""
    ds = gs.open_dataset(DATA / "demo_launches.nc")
    path, other = tmp_path / "run.nc", tmp_path / "backup.nc"
    gs.save_dataset(ds, path)
    os.link(path, other)
    changed = ds.assign_attrs(note="second run")
    with pytest.warns(gs.GpuscopeWarning, match=rf"{path} had 1 other hard link\(s\): they keep the old contents"):
        gs.save_dataset(changed, path)
    xr.testing.assert_identical(gs.open_dataset(path), changed)
    xr.testing.assert_identical(gs.open_dataset(other), ds)
