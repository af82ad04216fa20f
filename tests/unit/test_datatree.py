"""gpuscope.datatree and from_datatree on the H100's PM recordings: the samples at the root (one row each in
``to_dataframe()``), the span and execution tables as child nodes of variables along ``span`` / ``execution``, the
Dataset back identical; and what plain xarray sees of a saved file (``xr.open_datatree``): the same nodes."""

from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import gpuscope as gs
from gpuscope._results import build as _results
from gpuscope._schema import dataset as _dataset

from .test_ranks import _rank_copy
from .test_schema_tables import _with_executions

ROOT = Path(__file__).resolve().parents[2]
SERIES = Path(gs.__file__).parent / "data" / "demo_timeseries.nc"
PHASES = ["idle_gaps", "cupy_gemm", "launch_bound", "periodic_sync", "slow_drift", "lengths"]


@pytest.fixture(scope="module")
def series():
    return gs.open_dataset(SERIES)


def assert_same(back, ds):
    """*back* is *ds*: identical (attrs included), and every variable and table column of the same dtype (which
    ``assert_identical`` does not compare)."""
    xr.testing.assert_identical(back, ds)
    assert {k: v.dtype for k, v in back.variables.items()} == {k: v.dtype for k, v in ds.variables.items()}
    assert {k: back.attrs[k].dtype for k in _dataset.TABLE_ATTRS & set(back.attrs)} == {
        k: ds.attrs[k].dtype for k in _dataset.TABLE_ATTRS & set(ds.attrs)}


def assert_table_node(node, ds, dim, table):
    """*node* holds the table *table* of *ds* as one variable per column along *dim*, with the column's attrs."""
    alone = node.to_dataset(inherit=False)
    rows = len(ds.attrs[next(iter(table))])
    assert alone.sizes == {dim: rows} and len(alone.to_dataframe()) == rows
    assert [n for n in alone.data_vars if n in table] == list(table)
    for name, (_, attrs) in table.items():
        assert alone[name].dims == (dim,) and alone[name].attrs == attrs
        np.testing.assert_array_equal(alone[name].values, ds.attrs[name])


@pytest.mark.parametrize("name", ["demo_timeseries", *PHASES])
def test_the_tree_holds_the_samples_at_the_root_and_the_spans_along_their_own_dim(name):
    path = SERIES if name == "demo_timeseries" else ROOT / "tests" / "fixtures" / "phases" / f"{name}.nc"
    ds = gs.open_dataset(path)
    tree = gs.datatree(ds)
    assert isinstance(tree, xr.DataTree) and list(tree.children) == ["spans"]
    samples = tree.to_dataset(inherit=False)
    assert len(samples.to_dataframe()) == ds.sizes["time"] and samples.sizes == ds.sizes  # one row per sample
    assert not set(samples.attrs) & _dataset.TABLE_ATTRS
    assert all(samples[v].dims == ("time",) for v in samples.variables)
    assert_table_node(tree["spans"], ds, "span", _dataset.SPAN_TABLE)
    assert gs.spans(gs.from_datatree(tree)).equals(gs.spans(ds))
    assert_same(gs.from_datatree(tree), ds)


@pytest.mark.parametrize("graphs", [False, True])
def test_the_execution_table_is_a_child_of_its_own(series, graphs):
    ts = _with_executions(series, graphs=graphs)
    tree = gs.datatree(ts)
    assert list(tree.children) == ["spans", "executions"]
    assert_table_node(tree["executions"], ts, "execution", _dataset.EXEC_TABLE)
    runs = tree["executions"].to_dataset(inherit=False)
    assert runs["exec_graph_node_id"].values.tolist() == ([0, 40, 0, 41, 0] if graphs else [-1] * 5)
    assert runs["exec_start_ns"].attrs["units"] == "ns" and len(tree.to_dataset().to_dataframe()) == 18019
    # the root's time index reaches the children, as in every DataTree: a table alone is to_dataset(inherit=False)
    assert tree["executions"].to_dataset().sizes == {"execution": 5, "time": 18019}
    assert_same(gs.from_datatree(tree), ts)
    assert gs.kernel_executions(gs.from_datatree(tree)).equals(gs.kernel_executions(ts))


def test_a_dataset_without_a_table_has_no_such_child(series):
    assert "executions" not in gs.datatree(series).children  # recorded without kernels=True
    no_spans = series.copy()
    no_spans.attrs = {k: v for k, v in series.attrs.items() if k not in _dataset.SPAN_VARS}
    tree = gs.datatree(no_spans)
    assert not tree.children
    assert_same(gs.from_datatree(tree), no_spans)
    # a recording without gpuscope.range holds an empty span table: a child of no rows, as a saved file's group
    empty = _results.sampling_dataset([[1.0, 2.0]], ["m"], {}, [10, 20], [20, 30], None, [], 5, chip="GH100")
    tree = gs.datatree(empty)
    assert tree["spans"].to_dataset(inherit=False).sizes == {"span": 0}
    assert_same(gs.from_datatree(tree), empty)


def test_datasets_computed_from_samples_keep_their_tables_through_the_tree(series):
    ts = _with_executions(series.isel(time=slice(0, 2000)))
    ph = gs.phases(ts, topdown=False)  # dims besides time
    assert_same(gs.from_datatree(gs.datatree(ph)), ph)
    t0 = int(ts.attrs["session_start_ns"])
    merged = gs.merge_ranks([_rank_copy(ts, r, world=2, session=t0, wall=t0 + 1000 * r) for r in range(2)])
    tree = gs.datatree(merged)
    spans = tree["spans"].to_dataset(inherit=False)
    assert spans["span_rank"].values.tolist() == [0, 0, 0, 1, 1, 1]
    assert spans["span_start_ns"].attrs["clock"] == merged["start_ns"].attrs["clock"]  # the samples' clock
    assert tree["executions"].to_dataset(inherit=False)["exec_rank"].size == 10
    assert_same(gs.from_datatree(tree), merged)


def test_older_layouts_in_memory_are_converted_first(series):
    from .test_schema_tables import as_schema2

    ts = _with_executions(series.isel(time=slice(0, 2000)))
    assert_same(gs.from_datatree(gs.datatree(as_schema2(ts))), ts)


def test_a_saved_file_read_by_xarray_has_the_same_nodes(tmp_path, series):
    """What netCDF tools see: the file's groups are the tree's nodes, with the same variables along the same dims;
    strings are stored as integer codes (attr gpuscope_strings), so gpuscope.open_dataset reads the file."""
    ts = _with_executions(series, graphs=True)
    gs.save_dataset(ts, tmp_path / "t.nc")
    ours = gs.datatree(ts)
    theirs = xr.open_datatree(tmp_path / "t.nc", engine="h5netcdf")
    assert theirs.groups == ours.groups == ("/", "/spans", "/executions")
    for path in ours.groups:
        mine, stored = ours[path].to_dataset(inherit=False), theirs[path].to_dataset(inherit=False)
        assert stored.sizes == mine.sizes and list(stored.variables) == list(mine.variables)
        for name, variable in mine.variables.items():
            assert stored[name].dims == variable.dims
            if variable.dtype != object:
                np.testing.assert_array_equal(stored[name].values, variable.values)
                assert {k: v for k, v in stored[name].attrs.items() if k != "_FillValue"} == variable.attrs
    with pytest.raises(ValueError, match=r"gpuscope.open_dataset\(path\)"):
        gs.from_datatree(theirs)
    assert_same(gs.from_datatree(gs.datatree(gs.open_dataset(tmp_path / "t.nc"))), ts)


def test_what_is_not_pm_samples_is_refused_with_what_to_pass(series):
    launches = gs.open_dataset(Path(gs.__file__).parent / "data" / "demo_launches.nc")
    with pytest.raises(ValueError, match=r"PM samples .*kind='range'.* use them as Datasets"):
        gs.datatree(launches)
    with pytest.raises(ValueError, match="load a file first with gpuscope.open_dataset"):
        gs.datatree(str(SERIES))
    with pytest.raises(ValueError, match="kind='range'"):
        gs.from_datatree(xr.DataTree(launches))
    with pytest.raises(ValueError, match="already the Dataset"):
        gs.from_datatree(series)
    tree = gs.datatree(series)
    tree["phases"] = xr.DataTree(xr.Dataset({"x": ("phase", [1])}))
    with pytest.raises(ValueError, match=r"also has \['phases'\]"):
        gs.from_datatree(tree)
    tree = gs.datatree(series)
    tree["spans"] = xr.DataTree(tree["spans"].to_dataset(inherit=False).drop_vars("span_thread"))
    with pytest.raises(ValueError, match="lacks the column 'span_thread'"):
        gs.from_datatree(tree)
