"""Issue 37, item 14: the smaller things a new user trips on (each failed before)."""

import pandas as pd
import pytest

import gpuscope as gs
from gpuscope import cli
from gpuscope._commands import demo as _demo
from gpuscope._results.report_raw import _raw_value
from gpuscope._results.report_table import Report, _new


def run(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("option, typo, meant", [("--set", "topdwn", "topdown"), ("--sample", "pm-defalt", "pm-default")])
def test_a_misspelt_set_is_named_before_the_gpu_is_looked_for(capsys, tmp_path, option, typo, meant):
    script = tmp_path / "s.py"
    script.write_text("print(1)\n")
    code, _, err = run(capsys, "run", option, typo, str(script))
    assert code == cli.EXIT_USAGE and f"No metric set called {typo!r}. Did you mean {meant!r}" in err
    assert "driver" not in err


def test_no_doubled_punctuation_for_a_folder(capsys, tmp_path):
    code, _, err = run(capsys, "show", str(tmp_path))
    assert code == cli.EXIT_FILE and err.rstrip().endswith("give a .nc file in it.") and ".)." not in err


def test_one_pass_for_one_metric(capsys):
    code, out, _ = run(capsys, "metrics", "--chip", "GH100", "--passes", "sm__cycles_elapsed.max")
    assert code == 0 and out.startswith("1 pass for 1 metric (GH100")


def test_rounding_noise_prints_as_zero_and_raw_values_in_one_notation():
    frame = pd.DataFrame({"x": [45.4, 3.62e-14, 0.00051]}, index=pd.Index(["a", "b", "c"], name="row"))
    text = _new(frame, "t", []).to_text(80)
    assert "e-14" not in text and [line.split()[1] for line in text.splitlines()[2:5]] == ["45.4", "0", "0.00051"]
    assert [_raw_value(v) for v in (157616.0, 1164760.0, 0.5)] == ["157,616", "1,164,760", "0.5"]


def test_raw_headings_write_numbers_as_the_values_and_no_python_quotes(capsys):
    code, out, _ = run(capsys, "show", "--page", "raw", str(_demo.RECORDED_LAUNCHES))
    heading = " ".join(line.strip() for line in out.split("\n\n")[1].splitlines()[:4])  # the first launch, wrapped
    assert code == 0 and "parent (none)," in heading and "''" not in out
    assert "grid_x 65,536," in heading and "start_ns 1,795,337,037,571,677,920," in heading  # as 157,616 below
    assert "sm__cycles_elapsed.max\n      157,616 gpc_cycle" in out  # at 80 columns each value under its name


def test_the_warp_states_are_counted_alike(capsys):
    description = gs.metric_set("topdown").description
    assert "18 warp stall reasons" not in description and "16 + 2 on GH100" in description
    code, out, _ = run(capsys, "check", "--chip", "GH100")
    assert code == 0 and "16 stall reasons + optional gmma, and the states selected and not_selected" in out


def test_a_narrow_terminal_drops_the_least_important_column_first(capsys, monkeypatch):
    def header(columns: int) -> list[str]:
        monkeypatch.setenv("COLUMNS", str(columns))
        code, out, _ = run(capsys, "show", str(_demo.RECORDED_LAUNCHES))
        assert code == 0
        return next(line for line in out.splitlines() if line.startswith("kernel")).split()

    # as docs/report.md says: share, the time, bound_by and culprit stay longest; retire goes before bound_by
    assert header(60) == ["kernel", "gpu_time_ms", "share", "bound_by"]
    assert header(40) == ["kernel", "gpu_time_ms", "share"]
    assert isinstance(gs.report(gs.open_dataset(_demo.RECORDED_LAUNCHES)), Report)
