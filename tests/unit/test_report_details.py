"""The details page, compare and the trace on the H200 recordings of the roofline, memory, occupancy and instructions
sets (tests/fixtures/sol): every value the page shows is the analysis's value of the same Dataset, every section
the Dataset cannot give is named with the set that collects it, and ``gpuscope show --page details`` and
``gpuscope compare`` print them from saved files."""

import functools
import json
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr

import gpuscope as gs
from gpuscope import cli
from gpuscope._commands import demo as _demo
from gpuscope._results.report import Details, report

FIXTURES = Path(__file__).parents[1] / "fixtures" / "sol"
SETS = ("roofline", "memory", "occupancy", "instructions")
SECTION = {"roofline": "speed of light", "memory": "memory workload", "occupancy": "occupancy",
           "instructions": "instructions"}
GEMM = "nvjet_sm90_hsh_256x128_64x4_1x2_h_bz_coopA_NNT"


@functools.cache
def recording(name: str) -> xr.Dataset:
    return gs.open_dataset(FIXTURES / f"sol_{name}_gh100.nc")


def launch_shapes(ds):
    return (xr.DataArray(ds.attrs["launch_registers"], dims="range"),
            xr.DataArray(ds.attrs["launch_shared_memory_bytes"], dims="range"))


def page(ds, **options) -> pd.DataFrame:
    out = report(ds, page="details", **options)
    assert isinstance(out, Details)
    return out


def value(frame, kernel, section, quantity):
    return frame.loc[(kernel, section, quantity), "value"]


def test_speed_of_light_is_the_rooflines():
    ds = recording("roofline")
    d, rl = page(ds), gs.roofline(ds, by="kernel")
    for kernel in ("stream", "fma", GEMM):
        r = rl.sel(kernel=kernel)
        p = str(r["dominant_precision"].values)
        assert value(d, kernel, "speed of light", "dominant precision") == p
        assert value(d, kernel, "speed of light", f"{p} FLOP/s") == float(r["flop_rate"].sel(precision=p))
        assert value(d, kernel, "speed of light", f"{p} peak FLOP/s") == float(r["peak_flop_rate"].sel(precision=p))
        assert value(d, kernel, "speed of light", "bound") == str(r["bound"].sel(precision=p).values)
        assert value(d, kernel, "speed of light", "of attainable") == pytest.approx(
            100 * float(r["achieved_fraction"].sel(precision=p)), rel=1e-12)
        for level in ("L1", "L2", "DRAM"):
            assert value(d, kernel, "speed of light", f"{level} bandwidth") == float(r["bandwidth"].sel(level=level))
            assert value(d, kernel, "speed of light", f"{level} intensity") == float(
                r["intensity"].sel(precision=p, level=level))
    # what docs/sol.md says of these launches: fma computes in fp64 at 21 % of its peak, the GEMM is L2-bound
    assert value(d, "fma", "speed of light", "dominant precision") == "fp64"
    assert value(d, "fma", "speed of light", "fp64 of peak") == pytest.approx(21.3, abs=0.05)
    assert value(d, GEMM, "speed of light", "bound") == "L2"
    assert ("stream", "speed of light", "fp32 FLOP/s") not in d.index  # a precision without work is not shown


def test_memory_workload_is_the_analysis():
    ds = recording("memory")
    d, mw = page(ds), gs.memory_workload(ds, by="kernel")
    for kernel in ("stream", "fma", GEMM):
        r = mw.sel(kernel=kernel)
        for level in ("L1/TEX", "L2", "DRAM"):
            assert value(d, kernel, "memory workload", f"{level} bandwidth") == float(r["bandwidth"].sel(level=level))
            assert value(d, kernel, "memory workload", f"{level} busy") == float(r["busy"].sel(level=level))
        for level in ("L1/TEX", "L2"):
            assert value(d, kernel, "memory workload", f"{level} hit rate") == float(r["hit_rate"].sel(level=level))
        assert value(d, kernel, "memory workload", "busiest unit") == str(r["busiest_level"].values)
    assert ("stream", "memory workload", "DRAM hit rate") not in d.index  # DRAM has no hit rate
    assert value(d, "stream", "memory workload", "DRAM busy") == pytest.approx(68.2, abs=0.05)  # docs/sol.md


def test_instructions_are_the_mix():
    ds = recording("instructions")
    d, im = page(ds), gs.instruction_mix(ds, by="kernel")
    for kernel in ("fma", GEMM):
        r = im.sel(kernel=kernel)
        assert value(d, kernel, "instructions", "executed instructions") == float(r["inst_executed"])
        assert value(d, kernel, "instructions", "busiest pipe") == str(r["busiest_pipe"].values)
        shown = d.xs((kernel, "instructions"), level=(0, 1))
        pipes = [q for q in shown.index if q.endswith(" pipe utilization")]
        ran = r["pipe_instructions"] > 0
        assert sorted(q.split()[0] for q in pipes) == sorted(r["pipe"].values[ran.values].tolist())
        utilization = [shown.loc[q, "value"] for q in pipes]
        assert utilization == sorted(utilization, reverse=True)  # the busiest first
        for q in pipes:
            assert shown.loc[q, "value"] == float(r["pipe_utilization"].sel(pipe=q.split()[0]))
    assert value(d, GEMM, "instructions", "busiest pipe") == "tensor"
    assert value(d, GEMM, "instructions", "tensor pipe utilization") == pytest.approx(94.9, abs=0.05)  # docs/sol.md


def test_occupancy_is_the_analysis_with_registers_and_the_measured_part_without():
    ds = recording("occupancy")
    regs, smem = launch_shapes(ds)
    oc = gs.occupancy(ds, registers=regs, shared_memory=smem)
    d = page(ds, registers=regs, shared_memory=smem)
    for i, kernel in enumerate(["stream", "fma", GEMM]):
        row = oc.isel(range=i)
        assert value(d, kernel, "occupancy", "achieved occupancy") == pytest.approx(
            float(row["achieved_occupancy"]), rel=1e-12)
        assert value(d, kernel, "occupancy", "SM active") == pytest.approx(float(row["sm_active"]), rel=1e-12)
        assert value(d, kernel, "occupancy", "theoretical occupancy") == float(row["theoretical_occupancy"])
        assert value(d, kernel, "occupancy", "limited by") == str(row["limited_by"].values)
        assert value(d, kernel, "occupancy", "blocks per SM") == float(row["blocks_per_sm"])
        assert value(d, kernel, "occupancy", "waves per SM") == float(row["waves_per_sm"])
    assert value(d, GEMM, "occupancy", "blocks per SM") == 1  # ncu's block limit (docs/sol.md)
    without = page(ds)
    assert ("fma", "occupancy", "achieved occupancy") in without.index
    assert ("fma", "occupancy", "theoretical occupancy") not in without.index
    assert any("registers per thread" in n for n in without.notes)


def with_launch_resources(ds):
    """*ds* as a kernel-mode session records it now: each launch's registers per thread and static and dynamic shared
    memory as coords (ncu's launch__ values of the same launches, tests/fixtures/sol/ncu_<set>.json)."""
    rows = json.loads((FIXTURES / f"ncu_{ds.attrs['metric_set']}.json").read_text())["rows"]
    return ds.assign_coords({name: ("range", np.asarray([r[f"launch__{key}"] for r in rows], dtype=np.int64))
                             for name, key in (("registers_per_thread", "registers_per_thread"),
                                               ("shared_memory_static", "shared_mem_per_block_static"),
                                               ("shared_memory_dynamic", "shared_mem_per_block_dynamic"))})


THEORETICAL = ("theoretical occupancy", "theoretical warps per SM", "blocks per SM", "limited by",
               "registers per thread", "shared memory per SM", "waves per SM")


def test_a_kernel_mode_recording_shows_theoretical_occupancy_without_registers():
    ds = recording("occupancy")
    launches = with_launch_resources(ds)
    regs, smem = launch_shapes(ds)
    d, given = page(launches), page(ds, registers=regs, shared_memory=smem)
    for kernel in launches.kernel.values.tolist():
        for quantity in THEORETICAL:
            assert value(d, kernel, "occupancy", quantity) == value(given, kernel, "occupancy", quantity)
    assert value(d, GEMM, "occupancy", "limited by") == "registers+shared_memory"
    assert not any("registers per thread" in n for n in d.notes)
    # launches the driver could not tell about: the others are shown, and a note says why those are not
    unknown = launches.assign_coords(registers_per_thread=("range", [16, -1, 168, 32, 32]))
    partial = page(unknown)
    assert np.isnan(value(partial, "fma", "occupancy", "theoretical occupancy"))
    assert value(partial, "stream", "occupancy", "theoretical occupancy") == value(d, "stream", "occupancy",
                                                                                   "theoretical occupancy")
    assert any("only for the launches whose registers" in n for n in partial.notes)
    # user ranges record none: the note says where registers come from
    none = page(launches.assign_coords(registers_per_thread=("range", [-1] * 5)))
    assert ("fma", "occupancy", "theoretical occupancy") not in none.index
    assert any("kernel, iteration or auto mode records them" in n for n in none.notes)


def test_show_details_of_a_kernel_mode_file_shows_theoretical_occupancy(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    launches = with_launch_resources(recording("occupancy"))
    path = saved(tmp_path, launches, "occupancy")
    assert gs.open_dataset(path).registers_per_thread.values.tolist() == [16, 16, 168, 32, 32]
    assert cli.main(["show", str(path), "--page", "details"]) == 0
    out = capsys.readouterr().out
    gemm = out[out.index(f"\n{GEMM}\n"):]
    assert "    theoretical occupancy" in gemm and "    limited by                registers+shared_memory" in gemm
    assert "registers=" not in out


@pytest.mark.parametrize("name", SETS)
def test_a_page_says_what_is_missing_and_which_set_collects_it(name):
    d = page(recording(name))
    sections = set(d.index.get_level_values("section"))
    assert sections == {"launch", SECTION[name]}
    for other in SETS:
        if other != name:
            note = next(n for n in d.notes if f"no {SECTION[other]}" in n or f"no measured {other}" in n)
            assert f"the {other!r} set collects" in note and "'full'" in note
    text = d.to_text(width=100)
    assert text.startswith(f"gpuscope details: 5 launches, 5 kernels, metric set {name}")
    assert all(len(line) <= 100 for line in text.splitlines())


def test_a_recording_of_every_set_shows_every_section():
    # the four sets of the same five launches in one Dataset, as a session with the 'full' set records them
    parts = [recording(n) for n in SETS]
    full = parts[0].assign({v: ("range", p[v].values, p[v].attrs) for p in parts[1:] for v in p.data_vars
                            if v not in parts[0]})
    regs, smem = launch_shapes(full)
    d = page(full, registers=regs, shared_memory=smem)
    assert set(d.index.get_level_values("section")) == {"launch", *SECTION.values()}
    assert not d.notes
    assert value(d, "fma", "memory workload", "L2 hit rate") == float(
        gs.memory_workload(full, by="kernel")["hit_rate"].sel(kernel="fma", level="L2"))


def test_the_page_prints_values_with_their_units():
    text = page(recording("roofline")).to_text(width=120)
    fma = text[text.index("\nfma\n"):]
    assert "    fp64 FLOP/s          7.13 TFLOP/s" in fma
    assert "    DRAM peak bandwidth  4.81 TB/s" in fma
    assert "    bound                compute" in fma


def test_the_details_page_is_for_range_results():
    with pytest.raises(ValueError, match="range results only"):
        report(gs.open_dataset(_demo.RECORDED_SERIES), page="details")
    with pytest.raises(ValueError, match="page must be one of"):
        report(recording("roofline"), page="source")
    with pytest.raises(ValueError, match="takes"):
        report(recording("roofline"), registers=16)  # the summary page has no theoretical occupancy


# -- the command line on saved files ----------------------------------------------------------------------------


def saved(tmp_path, ds, name):
    path = tmp_path / f"{name}.nc"
    gs.save_dataset(ds, path)
    return path


def test_show_details_of_a_saved_file(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    path = saved(tmp_path, recording("memory"), "memory")
    csv = tmp_path / "details.csv"
    assert cli.main(["show", str(path), "--page", "details", "--csv", str(csv)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("gpuscope details: 5 launches, 5 kernels, metric set memory")
    assert "    DRAM busy              68.2%" in out and "no speed of light section" in out
    table = pd.read_csv(csv)
    assert list(table.columns) == ["kernel", "section", "quantity", "value", "unit"]
    row = table[(table.kernel == "stream") & (table.quantity == "DRAM busy")].iloc[0]
    assert float(row["value"]) == float(gs.memory_workload(recording("memory"), by="kernel")["busy"].sel(
        kernel="stream", level="DRAM")) and row["unit"] == "%"
    # the default page is the summary, as before
    assert cli.main(["show", str(path)]) == 0
    assert capsys.readouterr().out.startswith("gpuscope report: 5 launches")


def twice(ds, scale=None, factor=1.0):
    """Each launch of *ds* twice (launches 1.0x and 1.01x as long: two samples with spread), the duration of
    *scale*'s launches multiplied by *factor*."""
    longer = ds.copy(deep=True)
    longer["gpu__time_duration.sum"] = longer["gpu__time_duration.sum"] * 1.01
    out = xr.concat([ds, longer], "range")
    out = out.assign_coords(range=np.arange(out.sizes["range"]))
    if scale is not None:
        hit = out["kernel"].values == scale
        out["gpu__time_duration.sum"].values[hit] *= factor
    return out


def test_compare_judges_the_new_quantities(tmp_path, capsys):
    ds = recording("roofline")
    base, new = saved(tmp_path, twice(ds), "base"), saved(tmp_path, twice(ds, "stream", 1.25), "new")
    c = gs.compare(gs.open_dataset(base), gs.open_dataset(new))
    rate = c.loc[("stream", "roofline.flop_rate.fp64")]
    assert rate["unit"] == "FLOP/second" and rate["relative"] == pytest.approx(-20.0, abs=0.2)
    assert rate["significant"]
    assert c.loc[("stream", "roofline.bandwidth.DRAM"), "significant"]
    assert not c.loc[("fma", "roofline.flop_rate.fp64"), "significant"]
    assert rate["base"] == pytest.approx(float(gs.roofline(twice(ds))["flop_rate"].sel(precision="fp64")[
        twice(ds)["kernel"].values == "stream"].mean()), rel=1e-12)
    assert cli.main(["compare", str(base), str(new), "--fail-on", "change"]) == cli.EXIT_CHANGED
    err = capsys.readouterr().err
    assert "stream roofline.flop_rate.fp64" in err or "stream gpu_time_us" in err
    assert cli.main(["compare", str(base), str(base), "--fail-on", "change"]) == cli.EXIT_OK


def test_compare_counts_percentages_in_points():
    ds = twice(recording("memory"))
    new = ds.copy(deep=True)
    hit = new["kernel"].values == "fma"
    # fma's L2 hit rate from 86.2 to 87.2 %: 1.2 % of the base, but 1 point, under the 2 points flagged
    new["lts__t_sectors_lookup_hit.sum"].values[hit] += 0.01 * new["lts__t_sectors.sum"].values[hit]
    c = gs.compare(ds, new)
    row = c.loc[("fma", "memory.hit_rate.L2")]
    assert row["unit"] == "%" and row["change"] == pytest.approx(1.0, rel=1e-6)
    assert not row["significant"]
    new["lts__t_sectors_lookup_hit.sum"].values[hit] += 0.02 * new["lts__t_sectors.sum"].values[hit]
    assert gs.compare(ds, new).loc[("fma", "memory.hit_rate.L2"), "significant"]


def test_the_trace_carries_the_new_quantities():
    ds = recording("instructions")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gs.GpuscopeWarning)
        trace = gs.to_perfetto(ds)
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    im = gs.instruction_mix(ds)
    assert [e["name"] for e in slices][:2] == ["stream", "fma"]
    for i, e in enumerate(slices):
        assert e["args"]["instructions.pipe_utilization.alu"] == pytest.approx(
            float(im["pipe_utilization"].isel(range=i).sel(pipe="alu")), rel=1e-12)
    assert slices[2]["args"]["instructions.pipe_utilization.tensor"] == pytest.approx(94.9, abs=0.05)
