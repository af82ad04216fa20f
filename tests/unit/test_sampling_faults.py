"""Faults of a PM sampler and its pipeline without a GPU (docs/reliability.md, "PM sampling"): range names thousands
of characters long; a start that fails at its last step. Evaluation workers are real processes. Waits below are
liveness bounds, not timings."""

import gc
import os
import threading

import numpy as np
import pytest
import xarray as xr

from gpuscope import _io, _multi_sampling, _pm_pipeline, _pm_workers, _results, _sampling
from gpuscope._sampling import Span
from gpuscope.cupti import pm_sampling as pm

from .test_pm_workers import AVAILABILITY


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


# -- a start that fails at its last step ---------------------------------------------------------------------
def gpuscope_threads():
    return [t.name for t in threading.enumerate() if t.name.startswith("gpuscope-") and t.is_alive()]


def memfd_images() -> list[str]:
    """This process's mappings and descriptors of shared images."""
    with open("/proc/self/maps") as maps:
        mapped = [line for line in maps if "gpuscope-pm-image" in line]
    fds = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if "gpuscope-pm-image" in target:
            fds.append(target)
    return mapped + fds


@pytest.mark.parametrize("error", [MemoryError, KeyboardInterrupt])
def test_a_failed_last_step_of_the_start_leaves_nothing_behind(pm_recording, monkeypatch, error):
    """The discard image was made after the rollback's `try`: a MemoryError or Ctrl-C there left 2 worker
    processes, the dispatcher and reader threads and 4 memfd mappings until exit."""
    meta, image, _ = pm_recording
    made = []

    class Recorded(_pm_workers.ProcessEvaluation):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    def no_memory(*args):
        raise error()

    monkeypatch.setattr(_pm_workers, "ProcessEvaluation", Recorded)
    monkeypatch.setattr(pm, "counter_data_size", lambda handle, metrics, n: image.size)
    monkeypatch.setattr(pm, "initialize_counter_data", lambda handle, target: None)
    monkeypatch.setattr(pm, "new_counter_data", no_memory)  # the discard image: the last step of the set-up
    gc.collect()
    before = memfd_images()  # an earlier test's images that are still referenced
    with pytest.raises(error):
        _pm_pipeline.Pipeline(1, meta["chip"], meta["metrics"], np.load(AVAILABILITY), samples_per_image=64,
                              pool_size=4, evaluators=2, period_s=0.01, clock=lambda: 0, evaluate_in="process")
    (backend,) = made
    assert backend.ready_workers == 2  # the workers had started
    assert all(w.proc.poll() is not None for w in backend._workers)  # and were stopped and reaped
    assert not gpuscope_threads()
    del backend, made[:]
    gc.collect()
    assert set(memfd_images()) <= set(before)
