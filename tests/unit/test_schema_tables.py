"""Schemas 3 and 4: the span and execution tables of PM samples as coordinates along their own dims (``span``,
``execution``), each sample's span as ``span_index``; schema 4 names each execution's kernel as range results and PC
samples of the process do (``exec_kernel``), its qualified name beside it (``exec_kernel_qualname``). Files of schema
2 (tables in list attrs, the sample's span as the coordinate ``span``) and 3 (``exec_kernel`` qualified) converted
exactly on load; the tables and the long format. Merges of the tables: test_ranks and test_multi_sampling."""

from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import gpuscope as gs
from gpuscope._results import build as _results
from gpuscope._schema import dataset as _dataset

ROOT = Path(__file__).resolve().parents[2]
PHASES = ROOT / "tests" / "fixtures" / "phases"
SERIES = Path(gs.__file__).parent / "data" / "demo_timeseries.nc"
#: The description schema 2 gave each sample's span coordinate.
V2_SPAN = {"description": "index of that range execution in the attrs span_*, -1 where none"}


@pytest.fixture(scope="module")
def series():
    return gs.open_dataset(SERIES)


def _records(ts, n=5):
    """*n* kernel executions inside the recording's session, on two streams, one of them still running."""
    t0 = int(ts.attrs["session_start_ns"])
    out = [("_ZN8__main__6streamB2v1E" if i % 2 else "fma", t0 + 1000 * i, t0 + 1000 * i + 600, 0, 1, 7 + i % 2,
            (1, 1, 1), (1, 1, 1), 16, 100 + i) for i in range(n)]
    return out + [("fma", t0 + 9_000_000, 0, 0, 1, 7, (1, 1, 1), (1, 1, 1), 16, 99)]


def _with_executions(ts, n=5):
    return _results.with_executions(ts, {"records": _records(ts, n), "dropped": 1, "errors": [], "other_devices": 2})


def as_schema3(ds):
    """*ds* (schema 4) as gpuscope wrote schema 3: ``exec_kernel`` held the qualified name, and nothing beside it."""
    old = ds.copy()
    if "exec_kernel_qualname" in ds.variables:
        old = old.assign_coords(exec_kernel=old["exec_kernel_qualname"].variable.copy()).drop_vars(
            "exec_kernel_qualname")
        old["exec_kernel"].attrs = {"description": "readable kernel name, as the kernel coordinate of range results"}
    old.attrs = {**ds.attrs, "gpuscope_schema": 3}
    return old


def as_schema2(ds):
    """*ds* (schema 4) laid out as gpuscope wrote schema 2: the tables as list attrs (``exec_kernel`` qualified),
    the sample's span as the coordinate ``span``."""
    ds = as_schema3(ds)
    attrs = {k: v for k, v in ds.attrs.items()}
    for name in _dataset.SPAN_VARS + _dataset.EXEC_VARS:
        if name in ds.variables:
            attrs[name] = ds[name].values.tolist()
    attrs["gpuscope_schema"] = 2
    old = ds.drop_dims([d for d in ("span", "execution") if d in ds.dims]).rename_vars({"span_index": "span"})
    old["span"].attrs = dict(V2_SPAN)
    old.attrs = attrs
    return old


# ---------------------------------------------------------------------------------------------------------
# the layout


def test_the_tables_are_coordinates_along_their_own_dims(series):
    ts = _with_executions(series)
    assert ts.sizes == {"time": 18019, "span": 3, "execution": 5} and ts.attrs["gpuscope_schema"] == 4
    assert set(_dataset.SPAN_VARS) | set(_dataset.EXEC_VARS) | {"span_index"} <= set(ts.coords)
    assert all(ts[v].dims == ("time",) for v in ts.data_vars)  # the data variables are the metrics alone
    assert all(ts[v].dims == ("span",) for v in _dataset.SPAN_VARS)
    assert all(ts[v].dims == ("execution",) for v in _dataset.EXEC_VARS)
    assert ts["span_index"].dims == ("time",) and "span" not in ts.variables  # no coordinate named like a dim
    assert ts["span_path"].dtype == object and ts["exec_kernel"].values.tolist()[:2] == ["fma", "stream"]
    assert ts["exec_kernel_qualname"].values.tolist()[:2] == ["fma", "__main__.stream"]
    assert ts["span_start_ns"].attrs["clock"] == ts["exec_end_ns"].attrs["clock"] == "cuptiGetTimestamp"
    assert not any(k.startswith(("span_", "exec_")) for k in ts.attrs)
    assert ts.attrs["kernel_records_incomplete"] == 1 and ts.attrs["kernel_records_other_devices"] == 2
    # a sample's span_index is a position along span: the span's path is the sample's range
    inside = ts["span_index"].values >= 0
    paths = ts["span_path"].values[ts["span_index"].values[inside]]
    np.testing.assert_array_equal(paths, ts["range"].values[inside])
    # selections of samples keep the tables whole
    part = ts.isel(time=slice(100, 200))
    assert part.sizes["span"] == 3 and part.sizes["execution"] == 5
    assert gs.spans(part).equals(gs.spans(ts))


def test_spans_and_executions_keep_their_frames(series):
    ts = _with_executions(series)
    table = gs.spans(ts)
    assert table.index.name == "span" and table.columns.tolist() == ["path", "thread", "start_ns", "end_ns",
                                                                      "start", "end"]
    assert table["path"].tolist() == ["stream", "fma", "divergent"] and table["thread"].dtype == np.int64
    assert (table["start"] == table["start_ns"] - ts.attrs["session_start_ns"]).all()
    runs = gs.kernel_executions(ts)
    assert runs.index.name == "execution" and runs.columns.tolist() == [
        "kernel", "kernel_qualname", "symbol", "start_ns", "end_ns", "start", "end", "duration_ns", "stream",
        "correlation"]
    assert runs["start"].tolist() == [0, 1000, 2000, 3000, 4000] and (runs["duration_ns"] == 600).all()
    assert runs["stream"].tolist() == [7, 8, 7, 8, 7] and runs["correlation"].tolist() == [100, 101, 102, 103, 104]
    # the phases of the samples carry the tables: by="kernels" finds the executions
    ph = gs.phases(ts, topdown=False)
    assert gs.kernel_executions(ph).equals(runs) and gs.spans(ph).equals(table)
    # a Dataset without kernels=True has an empty span table at most, and no execution table
    empty = _results.sampling_dataset([[1.0, 2.0]], ["m"], {}, [10, 20], [20, 30], None, [], 5, chip="GH100")
    assert empty.sizes == {"time": 2, "span": 0} and empty["span_index"].values.tolist() == [-1, -1]
    assert len(gs.spans(empty)) == 0 and gs.spans(empty).columns.tolist() == table.columns.tolist()
    with pytest.raises(ValueError, match="kernels=True"):
        gs.kernel_executions(empty)


@pytest.mark.parametrize("executions", [0, 1, 5])
def test_saved_tables_come_back_identical(tmp_path, series, executions):
    ts = _with_executions(series.isel(time=slice(0, 2000)), executions)
    gs.save_dataset(ts, tmp_path / "t.nc")
    back = gs.open_dataset(tmp_path / "t.nc")
    xr.testing.assert_identical(back, ts)
    assert back.sizes["execution"] == executions and gs.kernel_executions(back).equals(gs.kernel_executions(ts))
    empty = _results.sampling_dataset([[1.0]], ["m"], {}, [10], [20], None, [], 5, chip="GH100")
    gs.save_dataset(empty, tmp_path / "e.nc")
    xr.testing.assert_identical(gs.open_dataset(tmp_path / "e.nc"), empty)


# ---------------------------------------------------------------------------------------------------------
# schema 2 files


@pytest.mark.parametrize("name", ["idle_gaps", "cupy_gemm", "launch_bound", "periodic_sync", "slow_drift", "lengths"])
def test_schema2_recordings_convert_exactly(tmp_path, name):
    with xr.open_dataset(PHASES / f"{name}.nc", engine="h5netcdf") as raw:
        raw = raw.load()
    assert raw.attrs["gpuscope_schema"] == 2 and raw["span"].dims == ("time",)  # the fixture is schema 2
    paths = np.atleast_1d(raw.attrs["span_path"]).tolist()
    ds = gs.open_dataset(PHASES / f"{name}.nc")
    assert ds.attrs["gpuscope_schema"] == 4 and ds.sizes == {"time": raw.sizes["time"], "span": len(paths)}
    assert ds["span_path"].values.tolist() == paths
    for name_ in ("span_thread", "span_start_ns", "span_end_ns"):
        assert ds[name_].dtype == np.int64
        np.testing.assert_array_equal(ds[name_].values, np.atleast_1d(raw.attrs[name_]))
    np.testing.assert_array_equal(ds["span_index"].values, raw["span"].values)  # moved, not recomputed
    assert ds["span_index"].attrs == _dataset.SAMPLE_SPAN_ATTRS
    assert not any(k.startswith("span_") for k in ds.attrs) and "span" not in ds.variables
    for v in raw.data_vars:
        np.testing.assert_array_equal(ds[v].values, raw[v].values)
    # the stored span of each sample is the one schemas 3 and 4 derive from the table
    table = {k: ds[k].values.tolist() for k in _dataset.SPAN_VARS}
    coords = _results.sample_coords(ds["start_ns"].values, ds["end_ns"].values, ds.attrs["session_start_ns"], table)
    np.testing.assert_array_equal(coords["span_index"].values, ds["span_index"].values)
    # and the converted Dataset saves and loads identical
    gs.save_dataset(ds, tmp_path / "v3.nc")
    xr.testing.assert_identical(gs.open_dataset(tmp_path / "v3.nc"), ds)


@pytest.mark.parametrize("executions", [0, 1, 5])
def test_a_schema2_file_with_executions_converts_to_what_schema4_writes(tmp_path, series, executions):
    ts = _with_executions(series.isel(time=slice(0, 3000)), executions)
    old = as_schema2(ts)
    gs.save_dataset(old, tmp_path / "v2.nc")  # list attrs as schema 2 stored them (gpuscope_attr_types)
    with xr.open_dataset(tmp_path / "v2.nc", engine="h5netcdf") as raw:
        assert "exec_kernel" in raw.attrs and "execution" not in raw.dims and raw.attrs["gpuscope_schema"] == 2
    back = gs.open_dataset(tmp_path / "v2.nc")
    xr.testing.assert_identical(back, ts)
    # written by plain xarray (no gpuscope_attr_types: a one-element list comes back a scalar, [] as "")
    plain = old.copy()
    plain.attrs = {k: ("" if isinstance(v, list) and not v else v) for k, v in old.attrs.items()
                   if not isinstance(v, (bool, type(None)))}
    plain.to_netcdf(tmp_path / "plain.nc", engine="h5netcdf")
    again = gs.open_dataset(tmp_path / "plain.nc")
    assert again.sizes.get("execution", 0) == executions
    assert gs.kernel_executions(again).equals(gs.kernel_executions(ts))
    assert gs.spans(again).equals(gs.spans(ts))


@pytest.mark.parametrize("executions", [0, 1, 5])
def test_a_schema3_file_names_its_kernels_as_schema4_does(tmp_path, series, executions):
    """Schema 3 held each execution's qualified name (``__main__.stream``) where range results said ``stream``: the
    qualified name moves to ``exec_kernel_qualname``, and the kernels are named within the file as a process names
    them."""
    ts = _with_executions(series.isel(time=slice(0, 3000)), executions)
    gs.save_dataset(as_schema3(ts), tmp_path / "v3.nc")
    with xr.open_dataset(tmp_path / "v3.nc", engine="h5netcdf") as raw:
        assert "exec_kernel_qualname" not in raw.variables and raw.attrs["gpuscope_schema"] == 3
    back = gs.open_dataset(tmp_path / "v3.nc")
    xr.testing.assert_identical(back, ts)
    assert gs.kernel_executions(back)["kernel"].tolist() == ["fma", "stream", "fma", "stream", "fma"][:executions]


def test_schema2_datasets_in_memory_are_read_and_left_as_they_were(series):
    ts = _with_executions(series)
    old = as_schema2(ts)
    before = old.copy(deep=True)
    assert gs.spans(old).equals(gs.spans(ts)) and gs.kernel_executions(old).equals(gs.kernel_executions(ts))
    xr.testing.assert_identical(_dataset.upgrade(old), ts)
    xr.testing.assert_identical(old, before)
    assert old.attrs == before.attrs and old["span"].attrs == V2_SPAN
    xr.testing.assert_identical(_dataset.upgrade(ts), ts)  # the current schema: as it is


# ---------------------------------------------------------------------------------------------------------
# tables as pandas frames


def test_long_format_leaves_the_tables_out_and_says_where_they_are(series):
    ts = _with_executions(series)
    long = gs.to_dataframe(ts)
    assert len(long) == 18019 * 8 and set(long["metric"]) == set(ts.attrs["metrics"])
    assert not {c for c in long.columns if c.startswith(("span_path", "exec_"))}
    assert {"time", "range", "span_index"} <= set(long.columns)
    with pytest.raises(ValueError, match=r"gpuscope.spans\(ds\) and gpuscope.kernel_executions\(ds\)"):
        gs.to_dataframe(ts, ["span_start_ns"])
    # the tables in xarray's own wide format
    spans = ts[list(_dataset.SPAN_VARS)].to_dataframe()
    assert spans.index.name == "span" and spans["span_path"].tolist() == ["stream", "fma", "divergent"]
    runs = ts[list(_dataset.EXEC_VARS)].to_dataframe()
    assert len(runs) == 5 and runs["exec_stream"].tolist() == [7, 8, 7, 8, 7]
    # xarray's ds.to_dataframe() crosses the samples with the tables; dropping their dims gives one row a sample
    samples = ts.drop_dims(["span", "execution"], errors="ignore").to_dataframe()
    assert len(samples) == 18019 and "span_index" in samples.columns
    assert len(series.drop_dims(["span", "execution"], errors="ignore").to_dataframe()) == 18019
