"""benchmarks/record_sol_sets.py runs on the GPU machine only; its parsing of ncu's raw page and its comparisons
run here, on Datasets shaped as an H100 session records them and ncu rows made from them."""

import numpy as np
import pytest

from benchmarks import record_sol_sets as rs

from .sol_data import GEMM, INSTRUCTIONS, OCCUPANCY, STREAM, STREAM_MEMORY, recorded


@pytest.mark.parametrize("text, unit, value", [
    ("1,024.5", "byte", 1024.5), ("3.2", "Tbyte/second", 3.2e12), ("1.98", "Ghz", 1.98e9),
    ("79.84", "usecond", 79840.0), ("12", "percent", 12.0), ("1.28", "Kbyte/cycle", 1280.0),
    ("5", "cycle/nsecond", 5e9), ("n/a", "byte", np.nan), ("3", "inst", 3.0),
])
def test_ncu_values_in_base_units(text, unit, value):
    np.testing.assert_allclose(rs.to_base(text, unit), value)


def _ncu_rows(ds, scale=1.01):
    rows = []
    for i in range(ds.sizes["range"]):
        row = {m: float(ds[m].values[i]) * scale for m in ds.data_vars}
        row.update({"Grid Size": f"({int(ds.grid_x[i])}, 1, 1)", "Block Size": f"({int(ds.block_x[i])}, 1, 1)",
                    "launch__occupancy_limit_registers": 16.0, "sm__maximum_warps_per_active_cycle_pct": 100.0})
        rows.append(row)
    return {"rows": rows, "cmd": "ncu", "wall_s": 1.0}


@pytest.mark.parametrize("name, rows, kernels", [
    ("roofline", [STREAM, GEMM], ["stream", "gemm"]), ("memory", [STREAM_MEMORY], ["stream"]),
    ("occupancy", list(OCCUPANCY), ["stream", "fma"]), ("instructions", [INSTRUCTIONS], ["fma"]),
])
def test_comparison_of_a_set_with_ncu(name, rows, kernels, capsys):
    ds = recorded(rows, kernels, sets=(name,))
    ncu = _ncu_rows(ds)
    entry = rs.compare(name, ds, ncu, [16.0, 40.0][: len(rows)], [0.0] * len(rows))
    assert entry["problems"] == []
    medians = {m: d["median"] for m, d in entry["metrics"].items()}
    assert set(medians) == set(ds.data_vars)
    # ncu's rows are 1 % larger: |g - n| / n = 0.01 / 1.01 where a metric is not 0 (less in a median with zeros)
    assert max(medians.values()) == pytest.approx(0.01 / 1.01) and min(medians.values()) >= 0
    assert [launch["kernel"] for launch in entry["launches"]] == kernels
    first = entry["launches"][0]
    assert set(first["gpuscope"]) == set(first["gpuscope_formulas_on_ncu_values"])
    if name == "occupancy":
        assert first["gpuscope"]["block_limit registers"] == 16.0 and first["ncu_sections"]["block_limit registers"] == 16
        assert first["gpuscope"]["limited_by"] == "warps"
    rs.print_summary({name: entry})
    assert f"== {name} ==" in capsys.readouterr().out


def test_launches_that_do_not_match_are_not_compared():
    ds = recorded([STREAM, GEMM], ["stream", "gemm"], sets=("roofline",))
    ncu = _ncu_rows(ds)
    ncu["rows"][1]["Grid Size"] = "(1, 1, 1)"
    assert rs.compare("roofline", ds, ncu, [0, 0], [0, 0])["problems"] == [
        "launch 1: grid/block 4096/256 here, (1, 1, 1)/(256, 1, 1) in ncu"]
    ncu["rows"].pop()
    assert rs.compare("roofline", ds, ncu, [0], [0])["problems"] == ["gpuscope has 2 launches, ncu 1"]
