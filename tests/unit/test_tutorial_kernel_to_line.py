"""The analysis half of tutorials/from_kernel_to_line.py (``explain``) on real recordings: the roofline, memory and
occupancy sets an H200 recorded of the same five launches (tests/fixtures/sol: Numba ``stream`` and ``fma``, a CuPy
fp16 GEMM and a CuPy sum in two cub kernels), and the PC samples an H100 recorded of ``stream`` and ``fma``
(tests/fixtures/pc). The collecting half needs a GPU: benchmarks/device_check.sh runs the tutorial."""

import importlib.util
import json
import runpy
from pathlib import Path

import matplotlib
import numpy as np
import pytest
import xarray as xr

import gpuscope as gs

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SOL = ROOT / "tests" / "fixtures" / "sol"


@pytest.fixture(scope="module")
def tutorial():
    return runpy.run_path(str(ROOT / "tutorials" / "from_kernel_to_line.py"), run_name="tutorial")


@pytest.fixture(scope="module")
def recorded():
    parts = [gs.open_dataset(SOL / f"sol_{name}_gh100.nc") for name in ("roofline", "memory", "occupancy")]
    ds = xr.merge(parts, compat="override", combine_attrs="override")  # the same launches; each set's own values
    spec = importlib.util.spec_from_file_location("pc_recording", ROOT / "tests" / "fixtures" / "pc" / "recording.py")
    recording = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recording)
    return ds, gs.source(pc=recording.dataset())


def test_explain_says_what_bounds_each_kernel_and_draws_both_figures(tutorial, recorded, tmp_path):
    ds, tables = recorded
    # what a kernel-mode session records for each launch (ncu's launch__ values of the same launches): the occupancy
    # needs no registers= then
    rows = json.loads((SOL / "ncu_occupancy.json").read_text())["rows"]
    registers = np.asarray(ds.attrs["launch_registers"], dtype=np.int64)
    ds = ds.assign_coords({"registers_per_thread": ("range", registers)} | {
        f"shared_memory_{part}": ("range", np.asarray([r[f"launch__shared_mem_per_block_{part}"] for r in rows],
                                                      dtype=np.int64)) for part in ("static", "dynamic")})
    try:
        text = tutorial["explain"](ds, tables, out=str(tmp_path))
    finally:
        plt.close("all")
    blocks = text.split("== ")
    stream = next(b for b in blocks if b.startswith("stream\n"))
    fma = next(b for b in blocks if b.startswith("fma\n"))
    # stream moves 3 x 64 MiB through DRAM at a few FLOP per byte: DRAM bounds it; fma computes on 4 MiB
    assert "roofline (fp64)" in stream and "bound: DRAM" in stream
    assert "bound: compute" in fma
    assert "busiest" in stream and "bytes per L1/TEX request" in stream
    assert any(b.startswith("stream (launch 0): occupancy") for b in blocks)
    given = tutorial["explain"](ds.drop_vars(["registers_per_thread"]), tables, out=str(tmp_path),
                                registers=xr.DataArray(registers, dims="range"))  # a Dataset without them
    plt.close("all")
    assert given == text
    # the PC samples' hottest lines, with their text
    hot = next(b for b in blocks if b.startswith("stream: hottest lines"))
    assert "samples (most: " in hot and "line " in hot
    assert (tmp_path / "roofline.png").stat().st_size > 10_000
    assert (tmp_path / "memory_chart.png").stat().st_size > 10_000
