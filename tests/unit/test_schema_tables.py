"""Schema 6: the span and execution tables of PM samples as Dataset attrs (one 1-D array per column), so that
every variable lies along the samples and ``ds.to_dataframe()`` has one row per sample; saved files hold the tables
as netCDF groups; each execution's kernel named as range results and PC samples of the process name it
(``exec_kernel``), its qualified name beside it (``exec_kernel_qualname``), CUPTI's graph and node ids
(``exec_graph_id``, ``exec_graph_node_id``). Files of schemas 2 to 5 (tables in list attrs, or as coordinates along
their own dims; ``exec_kernel`` qualified) and of schema 6 before the graph ids converted exactly on load (the ids
-1, unknown); the tables and the long format. Merges of the tables: test_ranks and test_multi_sampling."""

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
#: The description schemas 3 and 4 gave each sample's span_index.
V4_SPAN = {"description": "position along the span dim (span_path, span_start_ns, ...) of the innermost user range "
                          "open at the sample's midpoint, -1 where none"}


@pytest.fixture(scope="module")
def series():
    return gs.open_dataset(SERIES)


def _records(ts, n=5, graphs=False):
    """*n* kernel executions inside the recording's session, on two streams, one of them still running; with
    *graphs*, the stream kernels ran as the nodes 40 and 41 of CUDA graph 3 (one graph launch: one correlation id),
    the others on their own; without, the records end before their graph ids (as an older gpuscope kept them)."""
    t0 = int(ts.attrs["session_start_ns"])
    out = [("_ZN8__main__6streamB2v1E" if i % 2 else "fma", t0 + 1000 * i, t0 + 1000 * i + 600, 0, 1, 7 + i % 2,
            (1, 1, 1), (1, 1, 1), 16, 100 + i) for i in range(n)]
    if graphs:
        out = [r[:9] + ((200, 3, 40 + i // 2) if i % 2 else (r[9], 0, 0)) for i, r in enumerate(out)]
    return out + [("fma", t0 + 9_000_000, 0, 0, 1, 7, (1, 1, 1), (1, 1, 1), 16, 99)]


def _with_executions(ts, n=5, graphs=False):
    return _results.with_executions(ts, {"records": _records(ts, n, graphs), "dropped": 1, "errors": [],
                                         "other_devices": 2})


def before_graph_ids(ds):
    """*ds* (schema 6) as gpuscope wrote schema 6 before it read CUPTI's graph ids: no ``exec_graph_id`` and
    ``exec_graph_node_id``."""
    old = ds.copy()
    old.attrs = {k: v for k, v in ds.attrs.items() if k not in _dataset.GRAPH_COLUMNS}
    return old


def as_schema5(ds):
    """*ds* (schema 6) as gpuscope wrote schemas 2 to 5: ``exec_kernel`` held the qualified name, and nothing
    beside it."""
    old = before_graph_ids(ds)
    old.attrs["gpuscope_schema"] = 5
    if "exec_kernel_qualname" in ds.attrs:
        old.attrs["exec_kernel"] = old.attrs.pop("exec_kernel_qualname")
    return old


def as_schema2(ds):
    """*ds* (schema 6) laid out as gpuscope wrote schema 2: the tables as list attrs (``exec_kernel`` qualified),
    the sample's span as the coordinate ``span``."""
    ds = as_schema5(ds)
    attrs = {k: (v.tolist() if k in _dataset.TABLE_ATTRS else v) for k, v in ds.attrs.items()}
    attrs["gpuscope_schema"] = 2
    old = ds.rename_vars({"span_index": "span"})
    old["span"].attrs = dict(V2_SPAN)
    old.attrs = attrs
    return old


def as_schema4(ds):
    """*ds* (schema 6) laid out as gpuscope wrote schemas 3 and 4: the tables as coordinates along ``span`` and
    ``execution`` (``exec_kernel`` qualified), with the column attrs of the schema."""
    ds = as_schema5(ds)
    coords = {}
    for dim, table in _dataset.TABLE_GROUPS.values():
        for name in (n for n in ds.attrs if n in _dataset.TABLE_ATTRS and n.startswith(next(iter(table))[:5])):
            coords[name] = (dim, ds.attrs[name], dict(table.get(name, (None, {}))[1]))
    old = ds.assign_coords(coords)
    old.attrs = {k: v for k, v in ds.attrs.items() if k not in _dataset.TABLE_ATTRS}
    old.attrs["gpuscope_schema"] = 4
    old["span_index"].attrs = dict(V4_SPAN)
    return old


# ---------------------------------------------------------------------------------------------------------
# the layout


def test_to_dataframe_has_one_row_per_sample(series):
    """xarray's own verb: schemas 3 and 4 crossed every sample with every span and execution (54,057 rows for
    the 18,019 samples of the shipped recording)."""
    assert len(series.to_dataframe()) == 18019
    ts = _with_executions(series)
    frame = ts.to_dataframe()
    assert len(frame) == 18019 and frame.index.name == "time"
    assert {"range", "span_index", "start_ns"} <= set(frame.columns) and not set(frame.columns) & _dataset.TABLE_ATTRS
    assert len(ts.to_dataframe()) == len(as_schema4(ts).drop_dims(["span", "execution"]).to_dataframe())
    assert len(as_schema4(ts).to_dataframe()) == 18019 * 3 * 5  # what the old layout gave


def test_the_tables_are_attrs_of_one_array_per_column(series):
    ts = _with_executions(series)
    assert ts.sizes == {"time": 18019} and ts.attrs["gpuscope_schema"] == _dataset.SCHEMA_VERSION
    assert all(ts[v].dims == ("time",) for v in ts.variables)  # every variable along the samples
    assert {*_dataset.SPAN_VARS, *_dataset.EXEC_VARS} <= set(ts.attrs)
    for name, (dtype, _) in {**_dataset.SPAN_TABLE, **_dataset.EXEC_TABLE}.items():
        column = ts.attrs[name]
        assert isinstance(column, np.ndarray) and column.dtype == dtype and column.ndim == 1
    assert ts.attrs["span_path"].tolist() == ["stream", "fma", "divergent"]
    assert ts.attrs["exec_kernel"].tolist()[:2] == ["fma", "stream"]
    assert ts.attrs["exec_kernel_qualname"].tolist()[:2] == ["fma", "__main__.stream"]
    assert ts.attrs["kernel_records_incomplete"] == 1 and ts.attrs["kernel_records_other_devices"] == 2
    assert ts["span_index"].dims == ("time",) and ts["span_index"].attrs == _dataset.SAMPLE_SPAN_ATTRS
    # a sample's span_index is a row of the span table: the span's path is the sample's range
    inside = ts["span_index"].values >= 0
    paths = ts.attrs["span_path"][ts["span_index"].values[inside]]
    np.testing.assert_array_equal(paths, ts["range"].values[inside])
    # selections of samples keep the tables whole, one metric's included (schema 4 dropped them there)
    for part in (ts.isel(time=slice(100, 200)), ts[[ts.attrs["metrics"][0]]], ts.where(ts["range"] == "fma")):
        assert gs.spans(part).equals(gs.spans(ts)) and gs.kernel_executions(part).equals(gs.kernel_executions(ts))
    # xarray compares them as it compares any attr
    xr.testing.assert_identical(ts, ts.copy(deep=True))
    other = ts.copy()
    other.attrs = {**ts.attrs, "span_end_ns": ts.attrs["span_end_ns"] + 1}
    assert not other.identical(ts)
    with pytest.raises(ValueError, match="differ in length"):
        _dataset.table_attrs(_dataset.SPAN_TABLE, {"span_path": ["a"], "span_thread": [1, 2], "span_start_ns": [1],
                                                   "span_end_ns": [2]})


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
        "correlation", "graph_id", "graph_node_id"]
    assert runs["start"].tolist() == [0, 1000, 2000, 3000, 4000] and (runs["duration_ns"] == 600).all()
    assert runs["stream"].tolist() == [7, 8, 7, 8, 7] and runs["correlation"].tolist() == [100, 101, 102, 103, 104]
    assert (runs["graph_id"] == -1).all() and (runs["graph_node_id"] == -1).all()  # records without the ids
    # the phases of the samples carry the tables: by="kernels" finds the executions
    ph = gs.phases(ts, topdown=False)
    assert gs.kernel_executions(ph).equals(runs) and gs.spans(ph).equals(table)
    # a Dataset without kernels=True has an empty span table at most, and no execution table
    empty = _results.sampling_dataset([[1.0, 2.0]], ["m"], {}, [10, 20], [20, 30], None, [], 5, chip="GH100")
    assert empty.sizes == {"time": 2} and empty["span_index"].values.tolist() == [-1, -1]
    assert empty.attrs["span_path"].size == 0 and len(empty.to_dataframe()) == 2
    assert len(gs.spans(empty)) == 0 and gs.spans(empty).columns.tolist() == table.columns.tolist()
    with pytest.raises(ValueError, match="kernels=True"):
        gs.kernel_executions(empty)


@pytest.mark.parametrize("executions", [0, 1, 5])
def test_saved_tables_come_back_identical(tmp_path, series, executions):
    ts = _with_executions(series.isel(time=slice(0, 2000)), executions)
    gs.save_dataset(ts, tmp_path / "t.nc")
    back = gs.open_dataset(tmp_path / "t.nc")
    xr.testing.assert_identical(back, ts)
    assert len(gs.kernel_executions(back)) == executions
    assert gs.kernel_executions(back).equals(gs.kernel_executions(ts))
    empty = _results.sampling_dataset([[1.0]], ["m"], {}, [10], [20], None, [], 5, chip="GH100")
    gs.save_dataset(empty, tmp_path / "e.nc")
    xr.testing.assert_identical(gs.open_dataset(tmp_path / "e.nc"), empty)


def test_a_saved_file_holds_the_tables_as_groups(tmp_path, series):
    """What plain xarray sees in a file: the samples at the root (one row each), a group per table."""
    ts = _with_executions(series)
    gs.save_dataset(ts, tmp_path / "t.nc")
    with xr.open_dataset(tmp_path / "t.nc", engine="h5netcdf") as root:
        assert len(root.to_dataframe()) == 18019 and not set(root.attrs) & _dataset.TABLE_ATTRS
    tree = xr.open_datatree(tmp_path / "t.nc", engine="h5netcdf")
    assert sorted(tree.children) == ["executions", "spans"]
    spans = tree["spans"].to_dataset(inherit=False)  # a child node inherits the root's time index
    assert spans.sizes == {"span": 3} and spans["span_start_ns"].attrs["clock"] == "cuptiGetTimestamp"
    np.testing.assert_array_equal(spans["span_end_ns"].values, ts.attrs["span_end_ns"])
    with xr.open_dataset(tmp_path / "t.nc", engine="h5netcdf", group="executions") as runs:
        assert runs.sizes == {"execution": 5} and len(runs.to_dataframe()) == 5
    # a Dataset written by plain xarray keeps the tables in its attrs: gpuscope reads them there too
    plain = ts.copy()
    plain.attrs = {k: v for k, v in ts.attrs.items() if not isinstance(v, (bool, list, type(None)))}
    plain.to_netcdf(tmp_path / "plain.nc", engine="h5netcdf")
    again = gs.open_dataset(tmp_path / "plain.nc")
    assert gs.spans(again).equals(gs.spans(ts)) and gs.kernel_executions(again).equals(gs.kernel_executions(ts))
    assert isinstance(again.attrs["exec_stream"], np.ndarray) and again.attrs["exec_stream"].dtype == np.int64


# ---------------------------------------------------------------------------------------------------------
# CUPTI's graph and node ids


def test_graph_and_node_ids_are_columns_of_the_execution_table(tmp_path, series):
    ts = _with_executions(series.isel(time=slice(0, 2000)), graphs=True)
    runs = gs.kernel_executions(ts)
    assert runs["kernel"].tolist() == ["fma", "stream", "fma", "stream", "fma"]
    assert runs["graph_id"].tolist() == [0, 3, 0, 3, 0] and runs["graph_node_id"].tolist() == [0, 40, 0, 41, 0]
    assert runs["correlation"].tolist() == [100, 200, 102, 200, 104]  # one graph launch ran both nodes
    assert ts.attrs["exec_graph_id"].dtype == np.int64
    gs.save_dataset(ts, tmp_path / "g.nc")
    back = gs.open_dataset(tmp_path / "g.nc")
    xr.testing.assert_identical(back, ts)
    with xr.open_dataset(tmp_path / "g.nc", engine="h5netcdf", group="executions") as raw:
        assert raw["exec_graph_node_id"].values.tolist() == [0, 40, 0, 41, 0]
        assert "0 for a kernel launched on its own" in raw["exec_graph_id"].attrs["description"]


@pytest.mark.filterwarnings("ignore:timestamps stay on each rank's CUPTI clock")
@pytest.mark.parametrize("executions", [0, 5])
def test_a_file_from_before_the_graph_ids_loads_with_them_unknown(tmp_path, series, executions):
    """Schema 6 files written before gpuscope read CUPTI's graph ids lack the two columns: they load with -1 (unknown),
    never 0 (which says "launched on its own"), and the tables still merge with current ones."""
    ts = _with_executions(series.isel(time=slice(0, 2000)), executions, graphs=True)
    old = before_graph_ids(ts)
    gs.save_dataset(old, tmp_path / "old.nc")
    with xr.open_dataset(tmp_path / "old.nc", engine="h5netcdf", group="executions") as raw:
        assert not set(_dataset.GRAPH_COLUMNS) & set(raw.variables)
    back = gs.open_dataset(tmp_path / "old.nc")
    expected = ts.assign_attrs({name: np.full(executions, -1, dtype=np.int64) for name in _dataset.GRAPH_COLUMNS})
    xr.testing.assert_identical(back, expected)
    assert list(back.attrs).index("exec_graph_node_id") == list(back.attrs).index("exec_correlation") + 2
    assert gs.kernel_executions(old).equals(gs.kernel_executions(back))  # in memory too
    merged = gs.kernel_executions(gs.merge_ranks([back.assign_attrs(rank=0), ts.assign_attrs(rank=1)]))
    by_rank = {rank: merged[merged["rank"] == rank]["graph_id"].tolist() for rank in (0, 1)}
    assert by_rank == {0: [-1] * executions, 1: [0, 3, 0, 3, 0][:executions]}


# ---------------------------------------------------------------------------------------------------------
# schema 2 files


@pytest.mark.parametrize("name", ["idle_gaps", "cupy_gemm", "launch_bound", "periodic_sync", "slow_drift", "lengths"])
def test_schema2_recordings_convert_exactly(tmp_path, name):
    with xr.open_dataset(PHASES / f"{name}.nc", engine="h5netcdf") as raw:
        raw = raw.load()
    assert raw.attrs["gpuscope_schema"] == 2 and raw["span"].dims == ("time",)  # the fixture is schema 2
    paths = np.atleast_1d(raw.attrs["span_path"]).tolist()
    ds = gs.open_dataset(PHASES / f"{name}.nc")
    assert ds.attrs["gpuscope_schema"] == _dataset.SCHEMA_VERSION and ds.sizes == {"time": raw.sizes["time"]}
    assert ds.attrs["span_path"].tolist() == paths and len(ds.to_dataframe()) == raw.sizes["time"]
    for name_ in ("span_thread", "span_start_ns", "span_end_ns"):
        assert ds.attrs[name_].dtype == np.int64
        np.testing.assert_array_equal(ds.attrs[name_], np.atleast_1d(raw.attrs[name_]))
    np.testing.assert_array_equal(ds["span_index"].values, raw["span"].values)  # moved, not recomputed
    assert ds["span_index"].attrs == _dataset.SAMPLE_SPAN_ATTRS and "span" not in ds.variables
    for v in raw.data_vars:
        np.testing.assert_array_equal(ds[v].values, raw[v].values)
    # the stored span of each sample is the one gpuscope derives from the table
    table = {k: ds.attrs[k].tolist() for k in _dataset.SPAN_VARS}
    coords = _results.sample_coords(ds["start_ns"].values, ds["end_ns"].values, ds.attrs["session_start_ns"], table)
    np.testing.assert_array_equal(coords["span_index"].values, ds["span_index"].values)
    # and the converted Dataset saves and loads identical
    gs.save_dataset(ds, tmp_path / "v5.nc")
    xr.testing.assert_identical(gs.open_dataset(tmp_path / "v5.nc"), ds)


@pytest.mark.parametrize("executions", [0, 1, 5])
def test_a_schema2_file_with_executions_converts_to_what_schema6_writes(tmp_path, monkeypatch, series, executions):
    ts = _with_executions(series.isel(time=slice(0, 3000)), executions)
    old = as_schema2(ts)
    with monkeypatch.context() as m:  # list attrs as schema 2 stored them (gpuscope_attr_types), no groups
        m.setattr(_dataset, "table_groups", lambda ds: (ds, {}))
        gs.save_dataset(old, tmp_path / "v2.nc")
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
    assert len(gs.kernel_executions(again)) == executions
    assert gs.kernel_executions(again).equals(gs.kernel_executions(ts))
    assert gs.spans(again).equals(gs.spans(ts))


@pytest.mark.parametrize("executions", [0, 5])
def test_a_schema4_file_converts_to_what_schema6_writes(tmp_path, series, executions):
    ts = _with_executions(series.isel(time=slice(0, 3000)), executions)
    old = as_schema4(ts)
    assert old.sizes == {"time": 3000, "span": 3, "execution": executions}
    gs.save_dataset(old, tmp_path / "v4.nc")
    with xr.open_dataset(tmp_path / "v4.nc", engine="h5netcdf") as raw:
        assert raw["span_path"].dims == ("span",) and raw.attrs["gpuscope_schema"] == 4
    xr.testing.assert_identical(gs.open_dataset(tmp_path / "v4.nc"), ts)


@pytest.mark.parametrize("executions", [0, 1, 5])
def test_a_schema5_file_names_its_kernels_as_schema6_does(tmp_path, series, executions):
    """Schemas 2 to 5 held each execution's qualified name (``__main__.stream``) where range results said
    ``stream``: the qualified name moves to ``exec_kernel_qualname``, and the kernels are named within the file as a
    process names them."""
    ts = _with_executions(series.isel(time=slice(0, 3000)), executions)
    gs.save_dataset(as_schema5(ts), tmp_path / "v5.nc")
    with xr.open_dataset(tmp_path / "v5.nc", engine="h5netcdf") as raw:
        assert raw.attrs["gpuscope_schema"] == 5
    with xr.open_dataset(tmp_path / "v5.nc", engine="h5netcdf", group="executions") as raw:
        assert "exec_kernel" in raw.variables and "exec_kernel_qualname" not in raw.variables
    back = gs.open_dataset(tmp_path / "v5.nc")
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
    five = as_schema5(ts)
    assert gs.kernel_executions(five).equals(gs.kernel_executions(ts))
    xr.testing.assert_identical(_dataset.upgrade(five), ts)
    assert "exec_kernel_qualname" not in five.attrs and five.attrs["gpuscope_schema"] == 5  # left as it was
    four = as_schema4(ts)
    assert gs.spans(four).equals(gs.spans(ts)) and gs.kernel_executions(four).equals(gs.kernel_executions(ts))
    xr.testing.assert_identical(_dataset.upgrade(four), ts)
    assert four.sizes["span"] == 3 and four["span_index"].attrs == V4_SPAN  # left as it was


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
    # xarray's wide format: one row per sample, the metrics as columns
    samples = ts.to_dataframe()
    assert len(samples) == 18019 and {"span_index", *ts.attrs["metrics"]} <= set(samples.columns)
