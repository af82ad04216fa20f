"""The HTML report without a browser: the same numbers as the terminal report, one file that needs no network,
the commands' --html, and a clear error without the html extra (the browser tests are tests/browser)."""

from __future__ import annotations

import re
import sys
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("plotly", reason="the HTML report needs the html extra: pip install -e '.[test]'")
pytest.importorskip("itables", reason="the HTML report needs the html extra: pip install -e '.[test]'")

import gpuscope as gs  # noqa: E402
from gpuscope._results import html, html_pages  # noqa: E402
from gpuscope._results.report_table import _number, _percent  # noqa: E402

DATA = Path(gs.__file__).parent / "data"


@pytest.fixture(scope="module")
def launches():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gs.GpuscopeWarning)
        return gs.open_dataset(DATA / "demo_launches.nc")


def test_table_numbers_print_as_the_terminal_prints_them(launches):
    report = gs.report(launches)
    frame = html.table_frame(report)
    for col in report.columns:
        if col == "advice" or not pd.api.types.is_numeric_dtype(report[col].dtype):
            continue
        header = f"{col} [{report.units[col]}]" if col in report.units and not col.endswith(report.units[col]) \
            else col
        for terminal, shown in zip(report[col], frame[header]):
            if report.units.get(col) == "%":
                assert _percent(terminal) == ("<0.1%" if shown and 0 < shown < 0.05 else f"{shown:.1f}%")
            else:
                assert _number(terminal).replace(",", "") == f"{shown:g}"
    assert "advice" not in frame and "share [%]" in frame and "gpu_time_ms" in frame


def test_page_needs_no_network_and_shows_the_reports_verdicts(launches, tmp_path):
    path = tmp_path / "r.html"
    report = gs.report(launches, html=path)
    text = path.read_text()
    assert not re.search(r"<script[^>]+src=|<link[^>]+href=|import\s[^;]*https?:", text)
    for kernel, bound in report["bound_by"].items():
        assert f"<b>{kernel}</b>: bound by <b>{bound}</b>" in text
    assert text.count("<option value=") == len(report)
    assert "Top-Down hierarchy: fma" in text  # a hierarchy per kernel


def test_hierarchy_values_are_the_reports(launches):
    from gpuscope._results.report_ranges import group_key
    from gpuscope._results.report_topdown import grouped_topdown, topdown_per_launch

    report = gs.report(launches)
    rows, _ = grouped_topdown(topdown_per_launch(launches)[0], group_key(launches))
    for kernel in report.index:
        for node in ("retire", "divergence", "frontend", "backend"):
            assert rows[kernel][node] == pytest.approx(report.loc[kernel, node])


def test_markup_in_names_is_shown_not_obeyed(launches, tmp_path):
    ds = launches.assign_coords(kernel=("range", np.where(launches["kernel"].values == "fma", "<b onclick=x>fma",
                                                           launches["kernel"].values)))
    text = html_pages.report_html(ds, report=gs.report)
    assert "<b onclick=x>" not in text and "&lt;b onclick=x&gt;fma" in text


def test_show_and_compare_write_pages(launches, tmp_path, capsys):
    from gpuscope.cli import main

    out = tmp_path / "show.html"
    assert main(["show", str(DATA / "demo_timeseries.nc"), "--html", str(out)]) == 0
    assert "Timeline" in out.read_text() and f"wrote {out}" in capsys.readouterr().err
    out = tmp_path / "compare.html"
    assert main(["compare", str(DATA / "demo_launches.nc"), str(DATA / "demo_launches.nc"), "--html", str(out)]) == 0
    assert "GPU time per launch" in out.read_text()
    assert main(["show", str(DATA / "demo_launches.nc"), str(DATA / "demo_launches.nc"), "--html", str(out)]) == 4
    assert "once per file" in capsys.readouterr().err


def test_without_the_extra_the_error_names_it(monkeypatch, launches):
    monkeypatch.setitem(sys.modules, "plotly", None)
    with pytest.raises(ImportError, match=r"gpuscope\[html\]"):
        html_pages.report_html(launches, report=gs.report)


def test_long_kernel_names_are_cut_in_the_middle_and_missing_values_shown_as_a_dash(launches):
    """A live PyTorch page (H200, --set full) showed each 400-character template name in a column 5 characters
    wide and 'None' for every Top-Down column of a kernel without a verdict."""
    long = "at::native::reduce_kernel<128, 4, at::native::ReduceOp<c10::BFloat16, at::native::func_wrapper_t<" \
           "c10::BFloat16, at::native::sum_functor<c10::BFloat16, float, c10::BFloat16>::operator()(" \
           "at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, c10::BFloat16, 4, 8> >"
    ds = launches.assign_coords(kernel=("range", np.where(launches["kernel"].values == "fma", long,
                                                           launches["kernel"].values)))
    report = gs.report(ds)
    report.loc[long, "retire"] = np.nan
    frame = html.table_frame(report)
    label = frame.columns[0]
    cut = [k for k in frame[label] if "..." in k]
    assert len(cut) == 1 and len(cut[0]) == html.LABEL_WIDTH
    assert cut[0].startswith("at::native::reduce_kernel") and cut[0].endswith("4, 8> >")
    row = frame[frame[label] == cut[0]].iloc[0]
    assert row["retire [%]"] == "-" and "None" not in frame.astype(str).to_numpy().ravel().tolist()


def test_an_existing_page_is_replaced_only_with_force(launches, tmp_path, capsys):
    from gpuscope.cli import main

    out = tmp_path / "show.html"
    out.write_text("mine")
    assert main(["show", str(DATA / "demo_launches.nc"), "--html", str(out)]) != 0
    assert out.read_text() == "mine" and "-f/--force" in capsys.readouterr().err
    assert main(["show", "-f", str(DATA / "demo_launches.nc"), "--html", str(out)]) == 0
    assert out.read_text().startswith("<!DOCTYPE html>")


def test_the_figures_legends_say_the_nodes_in_words(launches):
    """As the matplotlib figures do (issue 53): 'backend memory', not 'backend_memory'."""
    text = html_pages.report_html(launches, report=gs.report)
    assert '"name":"backend memory"' in text.replace(": ", ":") and '"name":"backend_memory"' not in text
