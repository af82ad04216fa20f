"""Units in the shipped H100 recordings are what gpuscope writes now, and an older file's units are fixed on load."""

import shutil
from pathlib import Path

import h5netcdf
import pytest
import xarray as xr

import gpuscope as gs
from gpuscope._gpu.catalog import split_name, units_of

ROOT = Path(__file__).parents[2]
RECORDINGS = sorted([*(ROOT / "gpuscope" / "data").glob("*.nc"), *(ROOT / "tests" / "fixtures").rglob("*.nc")])


def metric_units(path) -> dict:
    """metric variable -> its units attr, as stored in the file (read without gpuscope's conversions)."""
    with xr.open_dataset(path, engine="h5netcdf") as raw:
        return {str(name): var.attrs["units"] for name, var in raw.data_vars.items() if "metric_type" in var.attrs}


@pytest.mark.parametrize("path", RECORDINGS, ids=[p.name for p in RECORDINGS])
def test_every_unit_in_the_shipped_recordings_is_what_units_of_gives(path):
    units = metric_units(path)
    assert units  # every recording has metrics
    assert {n: u for n, u in units.items() if u != units_of(split_name(n)[1], u)} == {}


@pytest.mark.parametrize("name, metric, written, fixed", [
    ("demo_timeseries.nc", "pcie__read_bytes.sum.per_second", "byte/second/second", "byte/second"),
    ("demo_launches.nc", "smsp__inst_issued.avg.per_cycle_active", "instruction/gpc_cycle/cycle",
     "instruction/cycle"),
    ("demo_launches.nc", "smsp__inst_issued.avg.per_cycle_active", "instruction/gpc_cycle", "instruction/cycle"),
])
def test_an_older_files_units_are_fixed_on_load(tmp_path, name, metric, written, fixed):
    shipped = ROOT / "gpuscope" / "data" / name
    old = tmp_path / name
    shutil.copy(shipped, old)
    with h5netcdf.File(old, "r+") as nc:  # as gpuscope wrote it before units_of kept one denominator
        nc.variables[metric].attrs["units"] = written
    assert metric_units(old)[metric] == written
    loaded = gs.open_dataset(old)
    assert loaded[metric].attrs["units"] == fixed
    xr.testing.assert_identical(loaded, gs.open_dataset(shipped))  # nothing else changes
