"""The code of the Top-Down, phases and trace pages runs on the shipped H100 recordings, prints what the page
says it prints, and draws figures a reader can use (every panel labelled, no legend over the data).

A ``python`` block on these pages that runs on a CPU is followed by the block of text it prints (``text``,
after at most one line of prose); blocks marked ``<!-- gpu -->`` need a device and are left to tests/gpu.
"""

import contextlib
import io
import re
import warnings
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import gpuscope as gs  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PAGES = ("topdown.md", "phases.md", "trace.md")
CODE = re.compile(r"(<!-- gpu -->\n)?```python\n(.*?)```\n", re.S)
OUTPUT = re.compile(r"\n(?:[^`\n][^\n]*\n\n)?```text\n(.*?)```", re.S)


def blocks():
    for page in PAGES:
        text = (ROOT / "docs" / page).read_text()
        for i, m in enumerate(CODE.finditer(text)):
            if m.group(1):
                continue
            out = OUTPUT.match(text, m.end())
            yield pytest.param(page, m.group(2), out.group(1) if out else None, id=f"{page}-{i}")


def _run(page, code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # what a snippet writes goes there, not into the checkout
    ns = {}  # a snippet defines every name it uses (gs.example_dataset opens the shipped recordings)
    printed = io.StringIO()
    with warnings.catch_warnings(), contextlib.redirect_stdout(printed):
        warnings.simplefilter("ignore", gs.GpuscopeWarning)  # the recording's coverage warning
        exec(compile(code, page, "exec"), ns)
    return printed.getvalue()


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def test_every_cpu_block_of_the_pages_is_checked():
    found = {page: 0 for page in PAGES}
    for param in blocks():
        found[param.values[0]] += 1
    assert all(found.values()), found  # a page whose blocks all moved or were marked gpu would test nothing


@pytest.mark.parametrize("page, code, expected", list(blocks()))
def test_block_prints_what_the_page_shows(page, code, expected, tmp_path, monkeypatch):
    assert expected is not None, f"a python block of {page} has no ```text block of what it prints after it"
    printed = _run(page, code, tmp_path, monkeypatch)
    assert [line.rstrip() for line in printed.splitlines()] == expected.splitlines()  # pandas pads lines


def _overlaps(a, b) -> bool:
    return a.x0 < b.x1 - 1 and b.x0 < a.x1 - 1 and a.y0 < b.y1 - 1 and b.y0 < a.y1 - 1


@pytest.mark.parametrize("page, code, expected", list(blocks()))
def test_block_figures_are_labelled_and_legends_stay_off_the_data(page, code, expected, tmp_path, monkeypatch):
    _run(page, code, tmp_path, monkeypatch)
    figures = [plt.figure(n) for n in plt.get_fignums()]
    if page != "trace.md":
        assert figures, f"{page} draws figures"
    for fig in figures:
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        plotted = [ax for ax in fig.axes if ax.lines or ax.patches or ax.collections]
        assert any(ax.get_xlabel() for ax in plotted), "no x-axis label"
        for ax in plotted:
            named_ticks = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]
            named_ticks = named_ticks and not any(re.fullmatch(r"[-−\d.,%a-zA-Zµ]*\d[-−\d.,%kMGTµmun]*", t)
                                                  for t in named_ticks)  # "level 1", not numbers
            assert ax.get_ylabel() or named_ticks, f"panel {ax.get_title()!r} has no y label"
            for other in fig.axes:
                legend = other.get_legend()
                if legend is not None:
                    assert not _overlaps(legend.get_window_extent(renderer), ax.get_window_extent(renderer)), (
                        f"the legend of {other.get_title()!r} covers the panel {ax.get_title(loc='left')!r}")
