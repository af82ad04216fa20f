"""The roofline chart and the memory chart, drawn with the Agg backend on range Datasets shaped as an H100 session
records them (tests/unit/sol_data.py): what each draws is checked against the analysis it draws."""

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import gpuscope as gs  # noqa: E402
import gpuscope.metrics.accessor  # noqa: E402, F401  (registers ds.gpuscope)
from gpuscope.metrics import plot  # noqa: E402
from gpuscope.metrics.plot_roofline import si  # noqa: E402

from .sol_data import GEMM, STREAM, STREAM_MEMORY, recorded  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


@pytest.fixture(scope="module")
def launches():
    """Two streaming launches and a GEMM, with the roofline and memory sets."""
    row = STREAM | STREAM_MEMORY
    return recorded([row, GEMM, row], ["stream", "gemm", "stream"])


def _texts(ax) -> list[str]:
    return [t.get_text() for t in ax.texts]


def _legend_texts(fig) -> list[str]:
    return [t.get_text() for lg in fig.findobj(matplotlib.legend.Legend) for t in lg.get_texts()]


def test_si_prefixes():
    assert si(3.2e12, "B/s") == "3.2 TB/s"
    assert si(6.7584e13, "FLOP/s") == "67.6 TFLOP/s"
    assert si(512, "B") == "512 B"
    assert si(float("nan"), "B") == "- B"


def test_roofline_draws_the_ceilings_and_a_point_per_level(launches, tmp_path):
    ax = launches.gpuscope.plot.roofline("fp32").axes[0]
    rl = gs.roofline(launches, by="kernel")
    peak = float(rl.peak_flop_rate.sel(precision="fp32").median())
    lines = ax.get_lines()
    flat = [ln for ln in lines if len(ln.get_ydata()) == 2 and np.allclose(ln.get_ydata(), peak)]
    assert flat, "the peak-work ceiling"
    # each level's ceiling: x times its peak bandwidth below the ridge, the peak above it
    for level, style in (("L1", ":"), ("L2", "--"), ("DRAM", "-")):
        bw = float(rl.peak_bandwidth.sel(level=level).median())
        slope = [ln for ln in lines if ln.get_linestyle() == style and len(ln.get_xdata()) == 256]
        assert len(slope) == 1
        x, y = np.asarray(slope[0].get_xdata()), np.asarray(slope[0].get_ydata())
        np.testing.assert_allclose(y, np.minimum(x * bw, peak))
        assert f"{level} {si(bw, 'B/s')}" in _legend_texts(ax.figure)  # the ceilings' legend names each
    # both kernels did fp32 work: one marker per level each, at the kernel's intensity and FLOP/s
    markers = [ln for ln in lines if ln.get_marker() in ("^", "s", "o") and len(ln.get_xdata()) == 1]
    assert len(markers) == 6
    points = {(round(float(ln.get_xdata()[0]), 6), float(ln.get_ydata()[0])) for ln in markers}
    stream = rl.sel(kernel="stream", precision="fp32")
    for level in ("L1", "L2", "DRAM"):
        assert (round(float(stream.intensity.sel(level=level)), 6), float(stream.flop_rate)) in points
    legend = _legend_texts(ax.figure)
    assert "stream: 3 TFLOP/s, DRAM-bound" in legend and any(t.startswith("gemm:") for t in legend)
    assert f"FP32 peak\n{si(peak, 'FLOP/s')}" in legend
    assert ax.get_xscale() == ax.get_yscale() == "log"
    ax.figure.savefig(tmp_path / "roofline.png")


def test_roofline_picks_the_precision_with_the_most_work(launches):
    ax = plot.roofline(launches).axes[0]  # the GEMM's 400 G tensor operations outweigh 8 G fp32 ones
    assert ax.get_title() == "Roofline, Tensor (NVIDIA H100 80GB HBM3)"
    rl = gs.roofline(launches, by=None)
    ax = plot.roofline(rl, "fp32").axes[0]  # a computed roofline, one point per launch
    assert len([ln for ln in ax.get_lines() if ln.get_marker() == "o" and len(ln.get_xdata()) == 1]) == 3
    with pytest.raises(ValueError, match="no row did fp64 work"):
        plot.roofline(launches, "fp64")
    with pytest.raises(ValueError, match="not in the roofline"):
        plot.roofline(launches, "int8")


def test_memory_chart_puts_the_numbers_on_the_diagram(launches, tmp_path):
    ax = launches.gpuscope.plot.memory_chart("stream").axes[0]
    mw = gs.memory_workload(launches, by="kernel").sel(kernel="stream")
    texts = _texts(ax)
    # two stream launches combined: 2 x 2 GB read at L1/TEX, the hit rates and busy shares of the units
    assert "L1/TEX Cache" in texts and "Device Memory" in texts and "System Memory" in texts
    assert "hit 25.0%\nbusy 37.9%" in texts  # busy: percent of the unit's peak, as the footnote says
    assert "hit 50.0%\nbusy 23.1%" in texts
    assert "busy 78.1%" in texts
    assert any("busy in\n% of the unit's peak" in t for t in texts)
    assert "30 M req\nread 3 GB" in texts and "write 2 GB" in texts  # L1/TEX <-> L2
    assert "read 3 GB" in texts and "write 2 GB" in texts  # L2 <-> DRAM
    assert "ld 30 M inst\nst 10 M inst" in texts  # the kernel's instructions that address global memory
    assert "40 M req" in texts and "6 GB" in texts  # global -> L1/TEX
    assert float(mw.busiest_share) == pytest.approx(78.125)
    assert ax.get_title() == "Memory chart: stream (busiest: DRAM, 78.1% of its peak)"
    frames = {tuple(np.round(p.get_edgecolor()[:3], 3)) for p in ax.patches}
    assert (0.753, 0.224, 0.169) in frames  # the busiest unit's red frame
    ax.figure.savefig(tmp_path / "memory.png")


def test_memory_chart_asks_which_row(launches):
    with pytest.raises(ValueError, match="pick one with select="):
        plot.memory_chart(launches)
    with pytest.raises(ValueError, match="neither a position nor a label"):
        plot.memory_chart(launches, "nope")
    ax = plot.memory_chart(launches, 0, by=None).axes[0]  # the first launch on its own
    assert "ld 15 M inst\nst 5 M inst" in _texts(ax)
