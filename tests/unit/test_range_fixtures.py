"""Counter-data images recorded on an H100 (CUPTI 13.0), evaluated here with the real host API (no GPU)."""

import json
from pathlib import Path

import numpy as np
import pytest

from gpuscope.cupti import host, range_profiler
from gpuscope.cupti._types import ProfilerType

FIXTURES = Path(__file__).parents[1] / "fixtures" / "range"


def load(name):
    d = np.load(FIXTURES / f"{name}.npz")
    return d["counter_data"], d["config"], [str(m) for m in d["metrics"]], str(d["chip"]), json.loads(str(d["meta"]))


def evaluate(name):
    counter_data, config, metrics, chip, meta = load(name)
    with host.ProfilerHost(chip, ProfilerType.RANGE_PROFILER) as h:
        rows = {
            range_profiler.range_name(counter_data, i): dict(zip(metrics, h.evaluate(counter_data, i, metrics)))
            for i in range(range_profiler.num_ranges(counter_data))
        }
    return rows, config, meta


def test_auto_ranges_three_kernels_exact_counters():
    rows, config, meta = evaluate("auto_3kernels_gh100")
    assert list(rows) == ["0", "1", "2"]  # CUPTI names auto ranges by launch order
    assert host.num_passes(config) == 8
    # stream: 2^24 elements / 256 per block; fma and inc: 2^20 elements / 256 and / 128... per the recording
    assert [rows[r]["sm__ctas_launched.sum"] for r in rows] == [65536.0, 4096.0, 4096.0]
    assert rows["0"]["smsp__inst_executed.sum"] == 23592960.0
    assert rows["1"]["smsp__inst_executed.sum"] == 444170240.0
    # the streaming kernel reads two 64 MiB arrays from DRAM (within 0.1 %)
    assert rows["0"]["dram__bytes_read.sum"] == pytest.approx(2 * 64 * 2**20, rel=1e-3)
    assert 0 < rows["2"]["sm__throughput.avg.pct_of_peak_sustained_elapsed"] < rows["1"][
        "sm__throughput.avg.pct_of_peak_sustained_elapsed"] <= 100
    launches = meta["launches"]
    assert [tuple(l["grid"]) for l in launches] == [(65536, 1, 1), (4096, 1, 1), (4096, 1, 1)]
    assert [tuple(l["block"]) for l in launches] == [(256, 1, 1), (256, 1, 1), (128, 1, 1)]


def test_user_range_sums_its_kernels():
    rows, config, meta = evaluate("user_step_gh100")
    assert list(rows) == ["step"]
    assert host.num_passes(config) == 1
    # one "step" = one stream launch + one fma launch (see the auto-range recording)
    assert rows["step"]["sm__ctas_launched.sum"] == 65536.0 + 4096.0
    assert rows["step"]["smsp__inst_executed.sum"] == 23592960.0 + 444170240.0


def test_range_dataset_from_fixture_roundtrips(tmp_path):
    pytest.importorskip("h5netcdf")
    import xarray as xr

    from gpuscope._results import io as _io
    from gpuscope._results import build as _results

    rows, _, meta = evaluate("auto_3kernels_gh100")
    metrics = list(next(iter(rows.values())))
    records = [
        {"name": f"k{i}", "kernel": f"k{i}", "launch": i, "grid": l["grid"], "block": l["block"],
         "start_ns": l["enter_ns"], "end_ns": l["exit_ns"], "values": list(rows[str(i)].values())}
        for i, l in enumerate(meta["launches"])
    ]
    props = {m: {"units": "x", "description": m, "metric_type": "counter", "hw_unit": "sm"} for m in metrics}
    ds = _results.range_dataset(records, metrics, props, chip="GH100", attrs={"mode": "kernel", "passes": 8})
    assert ds.sizes["range"] == 3 and ds["sm__ctas_launched.sum"].values.tolist() == [65536.0, 4096.0, 4096.0]
    assert ds.grid_x.values.tolist() == [65536, 4096, 4096]
    assert (ds.end_ns > ds.start_ns).all()
    path = tmp_path / "auto.nc"
    _io.save_dataset(ds, path)
    xr.testing.assert_identical(ds, _io.open_dataset(path))
