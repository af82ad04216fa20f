"""PM sampling on a real GPU: short, long and idle workloads, user ranges, the overflow path, bad input."""

import json
import re
import time

import numpy as np
import pytest

import gpuscope
from gpuscope._results import trace as _trace
from gpuscope._pm_sampling.api import sample as gs_sample
from gpuscope.errors import GpuscopeWarning, NotSinglePassError, SamplerBusyError

cuda = pytest.importorskip("numba.cuda")
from benchmarks import workloads  # noqa: E402

SM_ACTIVE = "sm__cycles_active.avg.pct_of_peak_sustained_elapsed"
GR_ACTIVE = "gr__cycles_active.avg.pct_of_peak_sustained_elapsed"
DRAM_READ = "dram__read_throughput.avg.pct_of_peak_sustained_elapsed"


@pytest.fixture(scope="module")
def workload():
    work = workloads.StreamFma(16 << 20)  # stream over 3 x 64 MiB, fma over 1 Mi elements

    def run(seconds, kind="mixed"):
        t0 = time.perf_counter()
        k = 0
        while time.perf_counter() - t0 < seconds:
            for _ in range(10):
                if kind == "stream" or (kind == "mixed" and k % 2 == 0):
                    work.stream()
                else:
                    work.fma(2000)
                k += 1
            cuda.synchronize()
        return k

    run(0.1)
    return run


def test_short_workload_with_ranges(workload, tmp_path):
    with gpuscope.range("outside"):
        pass
    with gs_sample("pm-default", "100us") as s:
        with gpuscope.range("stream"):
            workload(0.2, "stream")
        with gpuscope.range("fma"):
            with gpuscope.range("inner"):
                workload(0.2, "fma")
    ds = s.dataset
    assert ds.attrs["trigger"] == "time" and ds.attrs["interval_ns"] == 100_000
    assert ds.attrs["chip"] == "GH100"
    assert ds.attrs["lost_samples"] == 0 and ds.attrs["overflows"] == 0
    assert 0.8 * 4000 <= ds.sizes["time"] <= 1.3 * 4000 + 200
    assert ds["time"].dtype == np.int64 and ds["time"].attrs["units"] == "ns"
    assert (np.diff(ds["time"].values) > 0).all()
    assert set(np.unique(ds["range"].values)) <= {"", "stream", "fma", "fma/inner"}
    inst = "sm__inst_executed_realtime.avg.pct_of_peak_sustained_elapsed"
    stream_inst = ds[inst].where(ds["range"] == "stream", drop=True)[1:].mean().item()
    fma_inst = ds[inst].where(ds["range"] == "fma/inner", drop=True)[1:].mean().item()
    assert fma_inst > stream_inst + 20  # the FMA phase issues far more instructions than the streaming one
    assert ds[SM_ACTIVE].where(ds["range"] == "fma/inner", drop=True).mean().item() > 50
    assert gpuscope.spans(ds)["path"].tolist() == ["stream", "fma", "fma/inner"]
    assert ds[SM_ACTIVE].attrs["units"] == "percent"
    # netCDF round trip and Chrome trace
    pytest.importorskip("h5netcdf")
    path = tmp_path / "pm.nc"
    gpuscope.save_dataset(ds, path)
    import xarray as xr

    back = gpuscope.open_dataset(path)
    xr.testing.assert_identical(back, ds)
    trace = _trace.to_chrome_trace(back, tmp_path / "pm.json")
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert [e["args"]["path"] for e in slices] == ["stream", "fma", "fma/inner"]
    assert json.loads((tmp_path / "pm.json").read_text())["traceEvents"]


def _loss(ds):
    keys = ("lost_samples", "overflows", "discarded_samples", "full_decodes", "decode_us_per_sample",
            "counter_data_images", "counter_data_pool", "session_start_ns", "session_end_ns", "stop_call_ns")
    return {k: ds.attrs[k] for k in keys} | {"kept": ds.sizes["time"]}


def test_pm_fast_every_20us_for_3s_loses_nothing(workload):
    # a workload that keeps the GPU busy (it waits for the GPU every 10 launches)
    with gs_sample("pm-fast", "20us") as s, gpuscope.range("mixed"):
        workload(3.0)
    ds = s.dataset
    assert ds.attrs["lost_samples"] == 0 and ds.attrs["overflows"] == 0, _loss(ds)
    assert ds.attrs["discarded_samples"] == 0 and ds.attrs["full_decodes"] == 0, _loss(ds)
    assert ds.attrs["counter_data_images"] > ds.attrs["counter_data_pool"]  # images were recycled while running
    assert 0.95 * 150_000 <= ds.sizes["time"] <= 1.05 * 150_000
    period = np.median(np.diff(ds["start_ns"].values))
    assert 19_000 <= period <= 21_000
    assert 0 < ds.attrs["decode_us_per_sample"] < 20
    # the range opens just after Start and closes before Stop, which waits for the running decode (tens of ms)
    assert (ds["range"].values == "mixed").mean() > 0.95


def test_pm_fast_values(workload):
    with gs_sample("pm-fast", "100us") as s:
        with gpuscope.range("stream"):
            workload(0.3, "stream")
        with gpuscope.range("fma"):
            workload(0.3, "fma")
    ds = s.dataset
    assert ds.attrs["lost_samples"] == 0, _loss(ds)
    stream = ds.where(ds["range"] == "stream", drop=True).isel(time=slice(3, -3))
    fma = ds.where(ds["range"] == "fma", drop=True).isel(time=slice(3, -3))
    read = "dram__bytes_read.sum.per_second"
    assert stream[read].median().item() > 1e12  # the streaming kernel reads well over 1 TB/s
    assert fma[read].median().item() < 0.1 * stream[read].median().item()
    assert fma["tpc__cycles_active.avg.pct_of_peak_sustained_elapsed"].median().item() > 50
    assert ds[read].attrs["units"] == "byte/second"


def test_launch_bound_python_loop_losses_are_accounted_for(workload):
    # a Python loop launching ~12,000 short kernels per second holds the GIL that the evaluator threads need:
    # whatever is lost must be counted, and kept + lost must cover the session
    with gs_sample("pm-fast", "20us") as s:
        workload(1.5, "stream")
    ds = s.dataset
    expected = (ds.attrs["session_end_ns"] - ds.attrs["session_start_ns"]) / 20_000
    assert ds.sizes["time"] + ds.attrs["lost_samples"] == pytest.approx(expected, rel=0.02), _loss(ds)


def test_decoding_slower_than_the_interval_is_counted_and_explained(workload):
    # pm-default costs ~40 us per sample to decode on the H100's host: at 20 us most samples cannot be kept
    with pytest.warns(GpuscopeWarning, match="Decoding is the limit") as record:
        with gs_sample("pm-default", "20us") as s:
            workload(1.5)
    ds = s.dataset
    assert ds.attrs["decode_us_per_sample"] > 20
    expected = (ds.attrs["session_end_ns"] - ds.attrs["session_start_ns"]) / 20_000
    # Stop was not held up by the decode thread (it waits for the running decode: up to a few hundred ms)
    assert 75_000 <= expected <= 100_000, _loss(ds)
    assert ds.attrs["lost_samples"] > 0.2 * expected
    assert ds.attrs["lost_samples"] + ds.sizes["time"] == pytest.approx(expected, rel=0.02), _loss(ds)
    message = next(str(r.message) for r in record if "Decoding is the limit" in str(r.message))
    assert re.search(r"interval='(50|100|200)us' or longer", message), message


def test_idle(workload):
    with gs_sample("pm-default", "100us") as s:
        time.sleep(0.3)
    ds = s.dataset
    assert ds.sizes["time"] >= 0.8 * 3000
    assert ds.attrs["lost_samples"] == 0
    assert ds[SM_ACTIVE][1:].mean().item() < 1.0
    assert set(np.unique(ds["range"].values)) == {""}


def test_overflow_is_counted_and_reported_then_usable(workload):
    with pytest.warns(GpuscopeWarning, match="overflowed"):
        with gs_sample("pm-default", "1us", hardware_buffer_size=1 << 20, decode_period=1.0) as s:
            workload(1.5)
    ds = s.dataset
    assert ds.attrs["overflows"] >= 1
    assert ds.attrs["lost_samples"] > 0
    with gs_sample("pm-default", "100us") as s2:  # the device is usable afterwards
        workload(0.1)
    assert s2.dataset.attrs["overflows"] == 0 and s2.dataset.sizes["time"] > 500


def test_bad_input_leaves_things_usable(workload):
    with pytest.raises(NotSinglePassError) as info:
        gs_sample(["sm__throughput.avg.pct_of_peak_sustained_elapsed", GR_ACTIVE]).start()
    assert info.value.drop == ("sm__throughput.avg.pct_of_peak_sustained_elapsed",)
    with pytest.raises(ValueError, match="shorter than"):
        gs_sample("pm-default", "100ns").start()
    with pytest.raises(gpuscope.UnknownMetricError):
        gs_sample(["sm__cycles_active.avg.not_a_rollup"]).start()
    with gs_sample("pm-default", "100us") as s:
        with pytest.raises(SamplerBusyError, match="already running"):
            gs_sample("pm-default", "100us").start()
        workload(0.05)
    assert s.dataset.sizes["time"] > 100


def test_exception_inside_block_stops_cleanly(workload):
    with pytest.raises(ZeroDivisionError):
        with gs_sample("pm-default", "100us") as s:
            with gpuscope.range("boom"):
                workload(0.05)
                1 / 0
    assert not s.running
    assert "boom" in set(s.dataset["range"].values)
    with gs_sample("pm-default", "100us") as s2:
        workload(0.05)
    assert s2.dataset.sizes["time"] > 100


_CTRL_C_CHILD = r"""
import os, signal, sys, threading, time
import numpy as np
from numba import cuda
import gpuscope as gs
from benchmarks.workloads import fma

x = cuda.to_device(np.ones(1 << 20, np.float32))
fma[4096, 256](x, 200); cuda.synchronize()
def interrupt(delays):
    for d in delays:
        time.sleep(d)
        os.kill(os.getpid(), signal.SIGINT)
threading.Thread(target=interrupt, args=([1.5, 0.01],), daemon=True).start()  # during the run, then during stop
try:
    with gs.sample(metrics="pm-fast", interval="20us"):
        while True:
            fma[4096, 256](x, 200)
except KeyboardInterrupt:
    pass
print("threads", sorted(t.name for t in threading.enumerate() if t.name.startswith("gpuscope-")))
print("children", len(os.listdir("/proc/self/task")) and sum(1 for p in os.listdir("/proc") if p.isdigit() and open(f"/proc/{p}/stat").read().split()[3] == str(os.getpid())))
"""

_AFTER_CHILD = r"""
import gpuscope as gs, time
with gs.sample(metrics="pm-fast", interval="100us") as s:
    time.sleep(0.3)
print("samples", s.dataset.sizes["time"])
"""


def test_two_ctrl_c_leave_nothing_behind(tmp_path):
    import glob
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]  # the child imports benchmarks.workloads
    out = subprocess.run([sys.executable, "-c", _CTRL_C_CHILD], capture_output=True, text=True, timeout=300, cwd=root)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "threads []" in out.stdout and "children 0" in out.stdout, out.stdout
    assert not glob.glob("/dev/shm/gpuscope-*")
    after = subprocess.run([sys.executable, "-c", _AFTER_CHILD], capture_output=True, text=True, timeout=300)
    assert after.returncode == 0, after.stderr[-3000:]
    assert int(after.stdout.split()[-1]) > 100


def test_a_killed_worker_is_counted(workload):
    import os
    import signal

    with pytest.warns(GpuscopeWarning, match="worker"):
        with gpuscope.sample(metrics="pm-fast", interval="20us") as s:
            workload(1.0)
            victim = s._decoder._backend._workers[0].proc.pid
            os.kill(victim, signal.SIGKILL)
            workload(1.0)
        t0 = time.perf_counter()
    ds = s.dataset
    assert ds.attrs["evaluation_workers_lost"] == 1
    assert ds.attrs["images_lost"] == 0
    assert time.perf_counter() - t0 < 5.0  # the stop did not wait for the dead worker
