"""The range Dataset schema (no GPU)."""

import numpy as np
import pytest

from gpuscope import _io, _results


def make():
    records = [
        {"name": "step", "depth": 1, "iterations": 4, "first_iteration": 0, "values": [10.0, 50.0]},
        {"name": "step/k", "depth": 2, "parent": "step", "kernel": "k", "launch": 0, "grid": (8, 1, 1),
         "block": (128, 1, 1), "start_ns": 5, "end_ns": 9, "values": [4.0, np.nan]},
    ]
    props = {"a.sum": {"units": "inst", "description": "A"}, "b.pct": {"units": "percent", "description": "B"}}
    return _results.range_dataset(records, ["a.sum", "b.pct"], props, chip="GH100", attrs={"passes": 2})


def test_schema_values_and_fills():
    ds = make()
    assert ds["a.sum"].dims == ("range",) and ds["a.sum"].values.tolist() == [10.0, 4.0]
    assert ds["b.pct"].attrs == {"units": "percent", "description": "B"}
    assert ds.parent.values.tolist() == ["", "step"]
    assert ds.launch.values.tolist() == [-1, 0]  # -1: a user range, not a launch
    assert ds.grid.values.tolist() == [[0, 0, 0], [8, 1, 1]]
    assert ds.start_ns.values.tolist() == [-1, 5]
    assert ds.attrs["kind"] == "range" and ds.attrs["metrics"] == ["a.sum", "b.pct"] and ds.attrs["passes"] == 2
    for value in ds.attrs.values():
        assert isinstance(value, (str, int, float, list))


def test_netcdf_roundtrip_is_lossless(tmp_path):
    pytest.importorskip("h5netcdf")
    import xarray as xr

    ds = make()
    ds.to_netcdf(tmp_path / "r.nc", engine="h5netcdf")
    xr.testing.assert_identical(ds, _io.open_dataset(tmp_path / "r.nc"))


def test_open_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="No gpuscope dataset"):
        _io.open_dataset(tmp_path / "nope.nc")
