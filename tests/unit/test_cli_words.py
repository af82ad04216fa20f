"""The command line's words (issue 53, item 6 and part of item 4): every exit status in --help, the hardware unit
named as such, compare's warning about files of different devices and row labels that stay apart, counts of a
coordinate's values."""

from pathlib import Path

import pandas as pd
import pytest

import gpuscope as gs
from gpuscope import cli
from gpuscope._commands import exits
from gpuscope._results.report_table import _count, _new

DATA = Path(gs.__file__).parent / "data"


def test_help_lists_every_exit_status(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    statuses = [v for k, v in vars(exits).items() if k.startswith("EXIT_")]
    assert len(statuses) == 10
    for status in statuses:
        assert f" {status} " in text, status
    assert f"{exits.EXIT_CHANGED} compare --fail-on found a difference beyond noise" in text


def test_search_calls_the_hardware_unit_so(capsys):
    assert cli.main(["metrics", "--chip", "GH100", "--search", "long_scoreboard", "--names-only"]) == 0
    header = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("metric"))
    assert header.split()[:4] == ["metric", "type", "hw", "unit"]


def _with(path: Path, tmp_path: Path, **attrs) -> Path:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gs.GpuscopeWarning)
        ds = gs.open_dataset(path)
    out = tmp_path / path.name
    ds.assign_attrs(**attrs).to_netcdf(out)
    return out


def test_compare_warns_when_the_files_come_from_different_devices(tmp_path, capsys):
    h200 = _with(DATA / "demo_launches.nc", tmp_path, device_name="NVIDIA H200", sm_count=132)
    assert cli.main(["compare", str(DATA / "demo_launches.nc"), str(h200)]) == 0
    err = capsys.readouterr().err
    assert "the two files come from different devices (device_name NVIDIA H100 80GB HBM3 vs NVIDIA H200" in err
    assert cli.main(["compare", str(DATA / "demo_launches.nc"), str(DATA / "demo_launches.nc")]) == 0
    assert "different devices" not in capsys.readouterr().err


def test_two_long_labels_never_shorten_alike():
    a = "void cutlass::Kernel<cutlass::gemm::GemmUniversal<float, 128, 64, 4>>(Params)"
    b = "void cutlass::Kernel<cutlass::gemm::GemmUniversal<float, 128, 32, 4>>(Params)"
    frame = pd.DataFrame({"gpu_time_ms": [1.0, 2.0]}, index=pd.Index([a, b], name="kernel"))
    lines = _new(frame, "t", []).to_text(width=40).splitlines()
    header = lines.index("kernel") if "kernel" in lines else next(i for i, ln in enumerate(lines)
                                                                    if ln.startswith("kernel"))
    labels = [ln.split("  ")[0] for ln in lines[header + 1: header + 3]]
    assert all("..." in lab for lab in labels) and labels[0] != labels[1], lines  # shortened, and apart


def test_a_coordinates_values_are_counted_in_words():
    assert _count(2, "grid_x") == "2 grid_x values"
    assert _count(2, "kernel") == "2 kernels" and _count(3, "launch") == "3 launches"
