"""The command line speaks ncu: comma lists, chip aliases, set kinds, description search, pipes, exit statuses."""

import json
import subprocess
import sys

import pytest

import gpuscope as gs
from gpuscope import cli
from gpuscope._gpu import catalog as _catalog
from gpuscope._gpu import chips as _chips
from gpuscope._gpu import metric_lists as _lists
from gpuscope._commands import demo as _demo
from gpuscope.cupti import _lib


def run(capsys, *argv):
    try:
        code = cli.main(list(argv))
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


def test_comma_separated_metrics_and_sets(capsys):
    code, out, _ = run(capsys, "metrics", "--chip", "GH100", "--passes", "topdown,launch", "--json")
    data = json.loads(out)
    both = list(dict.fromkeys(gs.metric_set("topdown").metrics + gs.metric_set("launch").metrics))
    assert code == 0 and data["metrics"] == both and data["kind"] == "range"
    code, out, _ = run(capsys, "metrics", "--chip", "GH100", "--passes",
                       "dram__bytes_read.sum,dram__bytes_write.sum", "sm__cycles_elapsed.max", "--json")
    assert json.loads(out)["metrics"] == ["dram__bytes_read.sum", "dram__bytes_write.sum", "sm__cycles_elapsed.max"]


@pytest.mark.parametrize("name,chip", [("h100", "GH100"), ("H100", "GH100"), ("gh100", "GH100"), ("A100", "GA100"),
                                       ("l4", "AD104"), ("GeForce RTX 4090", "AD102"), ("ga102", "GA102")])
def test_chip_names_any_case_and_products(capsys, name, chip):
    assert _chips.canonical_chip(name) == chip
    code, out, _ = run(capsys, "metrics", "--chip", name, "--passes", "launch")
    assert code == 0 and f"({chip}, range profiler" in out


def test_an_unknown_product_names_the_closest(capsys):
    code, _, err = run(capsys, "metrics", "--chip", "RTX 9999", "--passes", "launch")
    assert code == cli.EXIT_USAGE and "Closest: rtx 5090 (GB202), rtx 4090 (AD102)" in err


def test_unknown_chip_is_usage_error(capsys):
    code, _, err = run(capsys, "metrics", "--chip", "XX100", "--passes", "launch")
    assert code == cli.EXIT_USAGE and "is not supported by the loaded CUPTI" in err


def test_a_sampling_set_needs_no_sampling_flag(capsys):
    code, out, _ = run(capsys, "metrics", "--chip", "GH100", "--passes", "pm-default")
    assert code == 0 and out.startswith("1 pass for 8 metrics (GH100, PM sampling")
    code, _, err = run(capsys, "metrics", "--chip", "GH100", "--passes", "pm-default,launch")
    assert code == cli.EXIT_USAGE and "mix range profiling and PM sampling" in err
    code, _, err = run(capsys, "metrics", "--chip", "GH100", "--kind", "range", "--passes", "pm-default")
    assert code == cli.EXIT_USAGE and "pm-default is for sampling profiling, not range" in err


def test_search_over_descriptions_without_internal_names(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    # a phrase that is in CUPTI's description of gr__cycles_active ("# of cycles where GR was active"), in no name
    code, out, err = run(capsys, "metrics", "--chip", "GH100", "--sampling", "--search", "where gr was")
    assert code == 0 and "names and descriptions searched" in out
    hits = [line.split()[0] for line in out.splitlines()[1:] if "__" in line]
    assert "gr__cycles_active" in hits
    table = _catalog.descriptions("GH100", "sampling")
    assert all("where gr was" in table[h].lower() for h in hits)
    assert "metric descriptions from CUPTI once" in err
    assert list(tmp_path.glob("gpuscope/descriptions-GH100-sampling-cupti*.json"))
    # internal-only names are hidden unless asked for
    code, out, _ = run(capsys, "metrics", "--chip", "GH100", "--search", "internal_activity", "--names-only")
    assert code == cli.EXIT_NOTHING_PROFILED == 6 and "No range metric matches" in out  # as grep: nothing found
    code, out, _ = run(capsys, "metrics", "--chip", "GH100", "--search", "internal_activity", "--names-only",
                       "--internal")
    assert "lts__throughput_internal_activity" in out
    code, out, _ = run(capsys, "metrics", "--chip", "GH100")
    assert "TriageCompute" not in out and "dram__bytes_read" in out.splitlines()


def test_metrics_piped_into_head_has_no_traceback():
    done = subprocess.run(f"{sys.executable} -m gpuscope metrics --chip GH100 | head -3", shell=True,
                          capture_output=True, text=True)
    assert len(done.stdout.splitlines()) == 3
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr


def test_check_json_is_complete_without_a_gpu(capsys):
    if _lib.driver_available():
        pytest.skip("this machine has a driver")
    code, out, _ = run(capsys, "check", "--json")
    data = json.loads(out)
    assert code == cli.EXIT_NO_GPU and data["ok"] is False
    for key in ("cupti", "driver", "gpu", "chip", "range_profiling", "pm_sampling", "counters_readable"):
        assert key in data
    assert data["missing"][0]["what"] == "driver" and "no NVIDIA driver" in data["missing"][0]["why"]
    assert data["not_checked"]["chip"] == "needs driver"
    assert any("gpuscope metrics --chip" in line for line in data["offline"])


def test_show_prints_the_report_of_each_kind(capsys, tmp_path):
    code, out, _ = run(capsys, "show", str(_demo.RECORDED_LAUNCHES), str(_demo.RECORDED_SERIES))
    assert code == 0
    assert "gpuscope report: 15 launches, 3 kernels" in out and "backend_memory" in out
    assert "gpuscope report: PM sampling, 18019 samples" in out
    assert str(gs.report(gs.open_dataset(_demo.RECORDED_LAUNCHES))) in out


@pytest.mark.parametrize("content,needle", [(b"not a netcdf file", "it is not a netCDF-4 (HDF5) file"),
                                           (None, "is not a gpuscope Dataset")])
def test_show_refuses_other_files(capsys, tmp_path, content, needle):
    path = tmp_path / "other.nc"
    if content is None:
        import xarray as xr

        xr.Dataset({"x": ("foo", [1.0, 2.0])}).to_netcdf(path, engine="h5netcdf")
    else:
        path.write_bytes(content)
    code, _, err = run(capsys, "show", str(path))
    assert code == cli.EXIT_FILE and needle in err and "Traceback" not in err
    code, _, err = run(capsys, "show", str(tmp_path / "missing.nc"))
    assert code == cli.EXIT_FILE and "No such file:" in err and "missing.nc" in err
    code, _, err = run(capsys, "show", str(tmp_path))
    assert code == cli.EXIT_FILE and "is a folder, not a gpuscope dataset" in err and "Errno" not in err


def test_compare_command(capsys, tmp_path):
    ds = gs.open_dataset(_demo.RECORDED_LAUNCHES)
    slow = ds.copy(deep=True)
    slow["gpu__time_duration.sum"].values[slow["kernel"].values == "stream"] *= 1.25
    gs.save_dataset(slow, tmp_path / "slow.nc")
    code, out, _ = run(capsys, "compare", str(_demo.RECORDED_LAUNCHES), str(_demo.RECORDED_LAUNCHES))
    assert code == 0 and "0 of 153 differences" in out
    code, out, _ = run(capsys, "compare", str(_demo.RECORDED_LAUNCHES), str(tmp_path / "slow.nc"),
                       "--csv", str(tmp_path / "diff.csv"))
    assert code == 0 and "1 of 153 differences" in out
    line = next(x for x in out.splitlines() if x.startswith("stream"))
    assert "25.0%" in line and line.rstrip().endswith("True")
    import pandas as pd

    table = pd.read_csv(tmp_path / "diff.csv")
    assert len(table) == 153 and table["significant"].sum() == 1
    code, _, err = run(capsys, "compare", str(_demo.RECORDED_LAUNCHES), str(_demo.RECORDED_SERIES))
    assert code == cli.EXIT_USAGE and "range-profiling results" in err


def test_compare_fails_on_a_regression_for_ci(capsys, tmp_path):
    """Issue 37, item 12: --fail-on gives status 7 when a kernel got slower (or anything changed) beyond noise."""
    ds = gs.open_dataset(_demo.RECORDED_LAUNCHES)
    slow, fast = ds.copy(deep=True), ds.copy(deep=True)
    slow["gpu__time_duration.sum"].values[slow["kernel"].values == "stream"] *= 1.25
    fast["gpu__time_duration.sum"].values[fast["kernel"].values == "stream"] *= 0.75
    gs.save_dataset(slow, tmp_path / "slow.nc")
    gs.save_dataset(fast, tmp_path / "fast.nc")
    base = str(_demo.RECORDED_LAUNCHES)
    assert cli.EXIT_CHANGED == 7
    code, _, err = run(capsys, "compare", base, str(tmp_path / "slow.nc"), "--fail-on", "slower")
    assert code == cli.EXIT_CHANGED and "stream gpu_time_us" in err
    assert run(capsys, "compare", base, str(tmp_path / "fast.nc"), "--fail-on", "slower")[0] == cli.EXIT_OK
    assert run(capsys, "compare", base, str(tmp_path / "fast.nc"), "--fail-on", "change")[0] == cli.EXIT_CHANGED
    assert run(capsys, "compare", base, base, "--fail-on", "change")[0] == cli.EXIT_OK
    assert run(capsys, "compare", base, str(tmp_path / "slow.nc"))[0] == cli.EXIT_OK  # no gate asked for


def test_show_names_each_of_several_files(capsys, tmp_path):
    code, out, _ = run(capsys, "show", str(_demo.RECORDED_LAUNCHES), str(_demo.RECORDED_SERIES))
    assert code == 0
    assert f"== {_demo.RECORDED_LAUNCHES} ==" in out and f"== {_demo.RECORDED_SERIES} ==" in out
    assert out.index(str(_demo.RECORDED_LAUNCHES)) < out.index("15 launches") < out.index(str(_demo.RECORDED_SERIES))
    assert "== " not in run(capsys, "show", str(_demo.RECORDED_LAUNCHES))[1]


def test_demo_to_an_unwritable_folder(capsys):
    code, _, err = run(capsys, "demo", "--recorded", "--out", "/proc/nope")
    assert code == cli.EXIT_FILE and "cannot use /proc/nope" in err and "Traceback" not in err


@pytest.mark.parametrize("exc,code", [(gs.NoGpuError("x"), 1), (gs.CuptiNotFoundError("x"), 2),
                                      (gs.errors.CuptiPermissionError(35, "f", "m"), 3),
                                      (gs.ProfilerBusyError(26, "f", "m"), 3), (gs.UnknownMetricError("x"), 4),
                                      (ValueError("x"), 4), (FileNotFoundError("x"), 5),
                                      (gs.NotGpuscopeDataError("x"), 5)])
def test_exit_statuses_as_documented(exc, code):
    assert cli.exit_status(exc) == code
    from pathlib import Path

    doc = (Path(__file__).parents[2] / "docs" / "errors.md").read_text()
    assert f"| {code} |" in doc


def test_bad_usage_is_4_not_argparse_2(capsys):
    code, _, err = run(capsys, "metrics", "--type", "nonsense")
    assert code == cli.EXIT_USAGE and "invalid choice" in err


def test_nsight_compute_short_forms_of_run(monkeypatch):
    args = cli.build_parser().parse_args(["run", "-c", "3", "-s", "2", "--kernel-name", "regex:^(fma{1,2})$",
                                          "-k", "stream", "script.py", "-c", "9"])
    assert (args.launch_count, args.launch_skip) == (3, 2)  # the script's own "-c 9" stays the script's
    assert args.kernels == ["regex:^(fma{1,2})$", "stream"] and args.args == ["-c", "9"]
    assert _lists.split_list(args.kernels) == ["regex:^(fma{1,2})$", "stream"]


@pytest.mark.parametrize("value", ["nan", "inf", "-0.1"])
def test_compare_refuses_a_min_change_that_would_flag_nothing(capsys, tmp_path, value):
    """Issue 52, item 11: --min-change nan was accepted and disabled --fail-on (a 3x slowdown exited 0)."""
    base = str(_demo.RECORDED_LAUNCHES)
    code, _, err = run(capsys, "compare", base, base, "--min-change", value, "--fail-on", "slower")
    assert code == cli.EXIT_USAGE and "min_change must be a finite number >= 0" in err


def test_a_file_of_a_newer_schema_is_refused_not_read_as_this_one(capsys, tmp_path):
    """Issue 52, item 11: a file claiming gpuscope_schema 99 was read as schema 6."""
    ds = gs.open_dataset(_demo.RECORDED_LAUNCHES)
    ds.attrs["gpuscope_schema"] = 99
    ds.to_netcdf(tmp_path / "future.nc", engine="h5netcdf")
    with pytest.raises(gs.NotGpuscopeDataError, match="schema 99, newer than this gpuscope"):
        gs.open_dataset(tmp_path / "future.nc")
    code, _, err = run(capsys, "show", str(tmp_path / "future.nc"))
    assert code != 0 and "schema 99" in err and "Traceback" not in err


def test_control_characters_in_the_data_are_shown_never_obeyed(capsys, tmp_path):
    """Issue 52, item 10: ESC, OSC, BEL, CR and right-to-left overrides in kernel names reached the terminal."""
    ds = gs.open_dataset(_demo.RECORDED_LAUNCHES)
    evil = "fma\x1b]0;owned\x07\r\u202eevil"
    ds = ds.assign_coords(kernel=("range", [evil if k == "fma" else k for k in ds["kernel"].values.tolist()]))
    gs.save_dataset(ds, tmp_path / "evil.nc")
    for argv in (("show", str(tmp_path / "evil.nc")),
                 ("compare", str(tmp_path / "evil.nc"), str(tmp_path / "evil.nc"), "--all")):
        code, out, _ = run(capsys, *argv)
        assert code == 0 and not any(c in out for c in "\x1b\x07\r\u202e"), argv
        assert "\\x1b" in out and "\\u202e" in out
