"""Every plot, drawn from the real H100/H200 recordings, as a paper's reader sees it (issue 37, item 11): texts of
8 pt or more at the printed size, inside the figure and apart, and legends that list only what is drawn
(tests/unit/legibility.py says how each is checked). The docs' own figures are checked in test_docs_pngs.py."""

import functools
import warnings
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt

import gpuscope as gs
import gpuscope.metrics.accessor  # registers ds.gpuscope
from gpuscope.metrics import pc_plot
from tests.fixtures.pc import recording as pc_recording

from . import legibility

FIXTURES = Path(__file__).parents[1] / "fixtures"
DATA = Path(gs.__file__).parent / "data"


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@functools.cache
def _open(path: Path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gs.GpuscopeWarning)
        return gs.open_dataset(path)


@functools.cache
def _pc():
    return pc_recording.dataset()


def _phases(path: Path, **options):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gs.GpuscopeWarning)
        return gs.phases(_open(path), **options)


FIGURES = {
    "timeline demo": lambda: _phases(DATA / "demo_timeseries.nc", label_tolerance=2).gpuscope.plot.timeline(),
    "timeline cupy_gemm": lambda: _phases(FIXTURES / "phases" / "cupy_gemm.nc").gpuscope.plot.timeline(),
    "timeline idle_gaps": lambda: _phases(FIXTURES / "phases" / "idle_gaps.nc").gpuscope.plot.timeline(),
    "timeline of launches": lambda: _open(DATA / "demo_launches.nc").gpuscope.plot.timeline(
        ["smsp__inst_executed.avg.per_cycle_active", "gpu__time_duration.sum"]),
    "roofline tensor": lambda: _open(FIXTURES / "sol" / "sol_roofline_gh100.nc").gpuscope.plot.roofline(),
    "roofline fp32": lambda: _open(FIXTURES / "sol" / "sol_roofline_gh100.nc").gpuscope.plot.roofline("fp32"),
    "roofline fp32 per range": lambda: _open(FIXTURES / "sol" / "sol_roofline_gh100.nc").gpuscope.plot.roofline(
        "fp32", by=None),
    "memory chart stream": lambda: _open(FIXTURES / "sol" / "sol_memory_gh100.nc").gpuscope.plot.memory_chart(
        "stream"),
    "memory chart gemm": lambda: _open(FIXTURES / "sol" / "sol_memory_gh100.nc").gpuscope.plot.memory_chart(2),
    "memory chart reduce": lambda: _open(FIXTURES / "sol" / "sol_memory_gh100.nc").gpuscope.plot.memory_chart(
        "DeviceReduceKernel"),
    "pc lines stream": lambda: pc_plot.plot_line_stalls(_pc(), "stream"),
    "pc lines fma by reason": lambda: pc_plot.plot_line_stalls(_pc(), "fma", by="reason"),
    "pc kernels": lambda: pc_plot.plot_kernel_stalls(_pc()),
    "pc kernels by reason": lambda: pc_plot.plot_kernel_stalls(_pc(), by="reason"),
}


@pytest.mark.parametrize("name", FIGURES)
def test_a_reader_finds_nothing_to_complain_about(name):
    fig = FIGURES[name]()
    assert legibility.problems(fig) == []


def test_the_checks_catch_what_a_reader_would():
    fig, ax = plt.subplots(figsize=(10, 3))  # printed 7 in wide: 8 pt becomes 5.6 pt
    ax.barh([0, 1], [100, 0.01], color=["C0", "C1"])
    ax.plot([0, 1], [0, 1], color="C2", linestyle="--")
    ax.legend([plt.Rectangle((0, 0), 1, 1, color="C1"), plt.Line2D([], [], color="C3")], ["tiny bar", "no such line"])
    ax.text(0.5, 0.5, "here", fontsize=12)
    ax.text(0.5, 0.5, "there", fontsize=12)
    ax.text(1.5, 0.5, "cut off at the edge", fontsize=12, transform=ax.transAxes)
    ax.text(100, 0, "across", fontsize=12, ha="center", va="center")  # over the end of the long bar
    found = legibility.problems(fig)
    assert any("'here'" in p and "pt when printed 7.0 in" not in p and "overlaps 'there'" in p for p in found)
    assert any(p.startswith("'0': 7.0 pt when printed 7.0 in wide") for p in found)  # a tick label, 10 pt * 0.7
    assert "'cut off at the edge': outside the figure" in found
    assert "'across' runs across the edge of a box" in found
    assert "legend entry 'tiny bar': no patch of its colour is visible" in found
    assert "legend entry 'no such line': no line of its colour and dashes is drawn" in found


def test_pc_categories_wear_the_colours_of_their_top_down_nodes():
    """A reader who sees both figures matches backend_memory by its colour (issued is retire's green)."""
    import matplotlib.colors

    def legend_colours(fig):
        legends = fig.legends or [ax.get_legend() for ax in fig.axes if ax.get_legend()]
        return {t.get_text(): matplotlib.colors.to_hex(h.get_facecolor())
                for lg in legends for t, h in zip(lg.get_texts(), lg.legend_handles, strict=True)}

    pc = legend_colours(pc_plot.plot_kernel_stalls(_pc()))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gs.GpuscopeWarning)
        td = legend_colours(gs.topdown(_open(DATA / "demo_launches.nc")).gpuscope.plot.topdown(level=2))
    assert {pc_plot.ISSUED_WORDS, "frontend decode", "backend core", "backend memory"} <= set(pc)
    assert pc[pc_plot.ISSUED_WORDS] == td["retire"]
    assert all(pc[c] == td[c] for c in ("frontend decode", "backend core", "backend memory"))


def test_stalls_too_small_to_see_are_gathered_and_named_once():
    data = pc_plot.kernel_stalls(_pc(), by="reason")
    fig = pc_plot.plot_kernel_stalls(_pc(), by="reason")
    (legend,) = fig.legends
    labels = [t.get_text() for t in legend.get_texts()]
    longest = float(data.sum("stall_reason").max())
    tiny = [str(r) for r in data.stall_reason.values if float(data.sel(stall_reason=r).max()) < longest / 100]
    assert len(tiny) > 2 and not set(tiny) & set(labels)  # no entry for a segment nobody can see ...
    assert labels[-1] == f"other: {len(tiny)} more (each < 1%)"  # ... they are one grey segment, named once
