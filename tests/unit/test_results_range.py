"""The range Dataset schema (no GPU): scalar coords per range, indexes, extra record keys, long format."""

import numpy as np
import pytest
import xarray as xr

from gpuscope._results import io as _io
from gpuscope._results import build as _results
from gpuscope._schema import dataset as _dataset


def make():
    records = [
        {"name": "step", "depth": 1, "iterations": 4, "first_iteration": 0, "values": [10.0, 50.0]},
        {"name": "step/k", "depth": 2, "parent": "step", "kernel": "k", "launch": 0, "grid": (8, 1, 1),
         "block": (128, 1, 1), "start_ns": 5, "end_ns": 9, "values": [4.0, np.nan]},
        {"name": "step/k", "depth": 2, "parent": "step", "kernel": "k", "launch": 1, "grid": (8, 2, 1),
         "block": (128, 1, 1), "start_ns": 10, "end_ns": 19, "values": [6.0, 1.0]},
    ]
    props = {"a.sum": {"units": "inst", "description": "A"}, "b.pct": {"units": "percent", "description": "B"}}
    return _results.range_dataset(records, ["a.sum", "b.pct"], props, chip="GH100", attrs={"passes": 2})


def test_schema_values_and_fills():
    ds = make()
    assert ds.sizes == {"range": 3}
    assert ds["a.sum"].dims == ("range",) and ds["a.sum"].values.tolist() == [10.0, 4.0, 6.0]
    assert ds["b.pct"].attrs == {"units": "percent", "description": "B"}
    assert ds.parent.values.tolist() == ["", "step", "step"]
    assert ds.launch.values.tolist() == [-1, 0, 1]  # -1: a user range, not a launch
    assert ds.grid_x.values.tolist() == [0, 8, 8] and ds.grid_y.values.tolist() == [0, 1, 2]
    assert ds.block_x.values.tolist() == [0, 128, 128] and ds.block_z.values.tolist() == [0, 1, 1]
    assert all(ds[c].dims == ("range",) for c in ds.coords)
    assert ds.start_ns.values.tolist() == [-1, 5, 10]
    assert ds.attrs["kind"] == "range" and ds.attrs["metrics"] == ["a.sum", "b.pct"] and ds.attrs["passes"] == 2
    assert ds.attrs["gpuscope_schema"] == _dataset.SCHEMA_VERSION
    for value in ds.attrs.values():
        assert isinstance(value, (str, int, float, list))


def test_range_index_is_the_row_number():
    ds = make()
    assert list(ds.xindexes) == ["range"] and ds["range"].values.tolist() == [0, 1, 2]
    assert ds["range"].dtype == np.int64 and ds.indexes["range"].is_unique
    assert ds.sel(range=[0, 2])["a.sum"].values.tolist() == [10.0, 6.0]  # a list of rows, which raised before
    # by path or kernel (or any coord): a boolean selection, as the docs show; rows keep their numbers
    both = ds.isel(range=ds.name == "step/k")
    assert both["range"].values.tolist() == [1, 2] and both.launch.values.tolist() == [0, 1]
    assert ds.sel(range=ds.kernel.isin(["k"]))["a.sum"].values.tolist() == [4.0, 6.0]
    assert ds.where(ds.kernel == "k", drop=True)["range"].values.tolist() == [1, 2]


def test_to_dataframe_one_row_per_range():
    wide = make().to_dataframe()
    assert len(wide) == 3 and wide.index.name == "range" and wide.index.tolist() == [0, 1, 2]
    assert {"grid_x", "block_y", "name", "kernel", "a.sum"} <= set(wide.columns)
    assert wide["grid_y"].tolist() == [0, 1, 2]
    assert wide.loc[wide["name"] == "step/k", "a.sum"].tolist() == [4.0, 6.0]


def test_long_format():
    long = _dataset.to_dataframe(make())
    assert len(long) == 6 and list(long.columns[-3:]) == ["metric", "value", "unit"]
    a = long[long.metric == "a.sum"]
    assert a["value"].tolist() == [10.0, 4.0, 6.0] and set(a["unit"]) == {"inst"}
    assert a["range"].tolist() == [0, 1, 2] and a["name"].tolist() == ["step", "step/k", "step/k"]
    assert a["kernel"].tolist() == ["", "k", "k"]
    assert a["launch"].tolist() == [-1, 0, 1]
    only = _dataset.to_dataframe(make(), "b.pct")
    assert only["metric"].unique().tolist() == ["b.pct"] and only["value"].isna().sum() == 1
    with pytest.raises(ValueError, match="not numeric data variables"):
        _dataset.to_dataframe(make(), ["nope"])
    with pytest.raises(ValueError, match="takes an xarray.Dataset"):
        _dataset.to_dataframe(None)


def test_unknown_record_keys_become_coords():
    records = [
        {"name": "k", "kernel": "k", "symbol": "_Z1kPf", "iteration": 3, "weight": 0.5, "warm": True, "values": [1.0]},
        {"name": "k", "kernel": "k", "values": [2.0]},
    ]
    ds = _results.range_dataset(records, ["m"], {})
    assert ds.symbol.values.tolist() == ["_Z1kPf", ""] and ds.symbol.dims == ("range",)
    assert ds.iteration.values.tolist() == [3, -1] and ds.iteration.dtype == np.int64
    assert ds.weight.values[0] == 0.5 and np.isnan(ds.weight.values[1])
    assert ds.warm.values.tolist() == [True, False]
    with pytest.raises(ValueError, match="non-scalar"):
        _results.range_dataset([{"name": "k", "extra": (1, 2), "values": [1.0]}], ["m"], {})


def test_netcdf_roundtrip_is_lossless(tmp_path):
    ds = make()
    _io.save_dataset(ds, tmp_path / "r.nc")
    back = _io.open_dataset(tmp_path / "r.nc")
    xr.testing.assert_identical(ds, back)
    assert list(back.xindexes) == ["range"] and back["range"].values.tolist() == [0, 1, 2]


def test_open_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="No such file"):
        _io.open_dataset(tmp_path / "nope.nc")
