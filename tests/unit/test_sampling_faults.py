"""Faults of a PM sampler and its pipeline without a GPU (docs/reliability.md, "PM sampling"): range names thousands
of characters long."""

import numpy as np
import xarray as xr

from gpuscope import _io, _multi_sampling, _results, _sampling
from gpuscope._sampling import Span


# -- long range names ----------------------------------------------------------------------------------------
def long_named_samples(n=20_000, name_length=1_000, device=None):
    """A PM Dataset as Sampler._build makes it: *n* samples, the first 15,000 inside a range with a very long
    name (the same spans for any *n*, as for the devices of one process)."""
    name = "r" * name_length
    start = np.arange(n, dtype=np.int64) * 1000 + 10_000
    spans = [Span(name, 1, 10_600, 10_000 + 1000 * 14_999), Span(f"{name}/inner", 1, 20_000, 30_000)]
    ranges = _sampling.innermost_ranges(start + 500, spans)
    device_attrs = {} if device is None else {"device_index": device}
    ds = _results.sampling_dataset(
        values=np.ones((1, n)), metrics=["m"], properties={"m": {"units": "percent"}}, start_ns=start,
        end_ns=start + 1000, ranges=ranges, spans=spans, session_start_ns=10_000, chip="GH100",
        attrs={"interval_ns": 1000, "lost_samples": 0, **device_attrs},
    )
    return ds, name


def assert_names_shared(values, distinct):
    """Each distinct name is one str object: the coordinate costs a pointer per sample, not a name."""
    assert values.dtype == object
    assert len({id(v) for v in values.ravel()}) == distinct


def test_a_long_range_name_costs_its_length_once(tmp_path):
    """A 1,000-character name over 20,000 samples made an 80 MB <U1000 coordinate (10,000 characters over
    200,000 samples: 7.6 GB); now it is 8 bytes a sample, in memory and after a netCDF round trip."""
    ds, name = long_named_samples()
    values = ds["range"].values
    assert values.nbytes == 8 * values.size
    assert_names_shared(values, 3)  # "", the name, the inner range
    assert values[0] == "" and values[1] == name and values[12] == f"{name}/inner" and values[-1] == ""
    path = tmp_path / "long.nc"
    _io.save_dataset(ds, path)
    assert path.stat().st_size < 2_000_000  # each name stored once (as sample strings it was 20 MB)
    back = _io.open_dataset(path)
    xr.testing.assert_identical(back, ds)
    assert_names_shared(back["range"].values, 3)
    assert "gpuscope_strings" not in back["range"].attrs


def test_long_range_names_stay_shared_across_devices(tmp_path):
    one, name = long_named_samples(device=0)
    two, _ = long_named_samples(n=15_000, device=1)
    both = _multi_sampling.combine_devices([one, two])
    assert both["range"].shape == (2, 20_000)
    assert_names_shared(both["range"].values, 3)
    assert both["range"].values[1, -1] == ""  # padding past device 1's last sample
    path = tmp_path / "both.nc"
    _io.save_dataset(both, path)
    back = _io.open_dataset(path)
    xr.testing.assert_identical(back, both)
    again = _multi_sampling.select_device(back, 1)
    assert again.sizes["time"] == 15_000 and again["range"].values[1] == name
    assert_names_shared(again["range"].values, 3)
