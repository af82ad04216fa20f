"""Range results indexed by row number (schema 4): selection, alignment and merging with their Top-Down, as
xarray users expect, on the shipped H100 launch recording; files of schema 3 and older converted on open."""

import warnings
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import gpuscope as gs
from gpuscope._schema import dataset as _dataset

DATA = Path(gs.__file__).parent / "data"
IPC = "smsp__inst_executed.avg.per_cycle_active"


@pytest.fixture(scope="module")
def launches():
    return gs.open_dataset(DATA / "demo_launches.nc")


@pytest.fixture(scope="module")
def nodes(launches):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gs.GpuscopeWarning)  # the recording's warp-state coverage note
        return gs.topdown(launches)


def test_index_is_unique_and_selects_lists(launches):
    assert launches.indexes["range"].is_unique and launches["range"].values.tolist() == list(range(15))
    two = launches.sel(range=[1, 3])  # a list of rows: InvalidIndexError on the path index
    assert two["kernel"].values.tolist() == ["fma", "stream"]
    picked = launches.sel(range=launches.kernel.isin(["fma", "stream"]))  # by kernel name, as the docs show
    assert picked.sizes["range"] == 10 and set(picked.kernel.values) == {"fma", "stream"}
    assert launches.where(launches.kernel == "fma", drop=True)["range"].values.tolist() == [1, 4, 7, 10, 13]


def test_topdown_aligns_with_its_input(launches, nodes):
    ratio = nodes["retire"] / launches[IPC]  # aligned on range: raised "cannot reindex or align" before
    assert ratio.sizes["range"] == 15 and np.isfinite(ratio.values).all()
    every_other = nodes.isel(range=slice(None, None, 2))
    summed = every_other["retire"] + launches[IPC]  # inner join on the row numbers
    assert summed["range"].values.tolist() == list(range(0, 15, 2))
    back = launches.reindex(range=[14, 0, 99])
    assert back["kernel"].values[:2].tolist() == ["divergent", "stream"] and np.isnan(back[IPC].values[2])


def test_topdown_merges_with_its_input(launches, nodes):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # xarray's note on its coming compat default
        both = xr.merge([launches, nodes])  # MergeError on sm__cycles_elapsed.max before
    with xr.set_options(use_new_combine_kwarg_defaults=True):
        xr.testing.assert_identical(xr.merge([launches, nodes]), both)
    assert set(launches.data_vars) | set(nodes.data_vars) == set(both.data_vars)
    for node in ("retire", "frontend", "backend_memory_long_scoreboard"):
        xr.testing.assert_identical(both[node].reset_coords(drop=True), nodes[node].reset_coords(drop=True))
    assert both["consistent"].dims == ("range",) and both["warp_state_coverage"].dims == ("range",)
    # the weight is a coordinate of its own, with the values of the metric it copies
    np.testing.assert_array_equal(nodes["weight"].values, launches["sm__cycles_elapsed.max"].values)
    assert "sm__cycles_elapsed.max" not in nodes.variables
    # aggregating the merged Dataset gives the Top-Down's own answer
    xr.testing.assert_allclose(gs.aggregate(both, by="kernel")[list(nodes.data_vars)],
                               gs.aggregate(nodes, by="kernel"))


def test_schema3_files_get_row_numbers(tmp_path, launches, nodes):
    """A file saved by gpuscope with schema 3 indexed by path (non-unique): it opens with row numbers and gives
    the same answers."""
    old = launches.drop_vars("range").assign_coords(range=("range", launches["name"].values))
    old.attrs["gpuscope_schema"] = 3
    gs.save_dataset(old, tmp_path / "schema3.nc")
    back = gs.open_dataset(tmp_path / "schema3.nc")
    assert back.attrs["gpuscope_schema"] == _dataset.SCHEMA_VERSION
    xr.testing.assert_identical(back, launches)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gs.GpuscopeWarning)
        xr.testing.assert_identical(gs.topdown(back), nodes)
    # merged ranks of schema 3 Datasets (not read from files) are numbered too
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gs.GpuscopeWarning)  # no clock link in this copy
        merged = gs.merge_ranks([old.assign_attrs(rank=0), old.assign_attrs(rank=1)])
    assert merged["range"].values.tolist() == list(range(15))
