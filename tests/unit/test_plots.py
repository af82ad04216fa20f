"""Plots and the ``ds.gpuscope`` accessor, drawn with the Agg backend."""

import subprocess
import sys

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import gpuscope.metrics.accessor  # noqa: E402, F401  (registers ds.gpuscope)
from gpuscope.metrics import phases as ph  # noqa: E402
from gpuscope.metrics import plot  # noqa: E402
from gpuscope.metrics import topdown as td  # noqa: E402

from .test_phases import NAMES, time_series  # noqa: E402
from .test_topdown import STALLS_0, STALLS_1, range_dataset  # noqa: E402


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _stack_heights(ax) -> np.ndarray:
    """Total height of every bar position of a stacked bar chart."""
    totals = {}
    for patch in ax.patches:
        x = round(patch.get_x() + patch.get_width() / 2, 6)
        totals[x] = totals.get(x, 0.0) + patch.get_height()
    return np.array([totals[k] for k in sorted(totals)])


def _row_cover(ax, row) -> float:
    """How much of a row of the icicle chart its boxes cover (a box may span several rows)."""
    return sum(p.get_width() for p in ax.patches if p.get_y() < row < p.get_y() + p.get_height())


def test_importing_the_analysis_does_not_import_matplotlib():
    code = ("import sys, gpuscope.metrics.accessor, gpuscope.metrics.plot, gpuscope.metrics.phases; "
            "assert 'matplotlib' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_accessor_delegates_and_stores_only_the_dataset():
    ds = range_dataset()
    assert vars(ds.gpuscope) == {"_ds": ds}
    out = ds.gpuscope.topdown()
    assert set(out.data_vars) == set(td.topdown(ds).data_vars)
    np.testing.assert_allclose(out.retire, td.topdown(ds).retire)
    assert list(time_series().gpuscope.phases().segment_first.values) == [0, 1000, 2000, 3000]
    assert float(out.gpuscope.aggregate(by=None).retire) == pytest.approx(0.95 * 25)  # percent of IPC_MAX 4


def test_topdown_bars_stack_to_100_percent(tmp_path):
    ds = range_dataset()
    axes = ds.gpuscope.plot.topdown(level=[1, 2, 3]).axes
    assert len(axes) == 3
    nodes = td.topdown(ds)
    for ax, level in zip(axes, (1, 2, 3)):
        np.testing.assert_allclose(_stack_heights(ax), [100.0, 100.0])
        assert ax.get_ylabel().replace("\n", " ") == "% of peak issue rate (IPC_MAX 4)"
        cut = td.level_cut(level, nodes.data_vars)
        small = [n for n in cut if td._BY_NAME[n].level == 3 and float(abs(nodes[n]).max()) < plot.NEGLIGIBLE]
        stack = [n for n in cut if n not in small] + ([f"other ({len(small)} nodes < 0.5% each)"] if small else [])
        assert [c.get_label() for c in ax.containers] == stack  # bottom-up
        visible = [c.get_label() for c in ax.containers if max(p.get_height() for p in c) >= plot.NEGLIGIBLE]
        assert [t.get_text() for t in ax.get_legend().get_texts()] == visible[::-1]
    assert [t.get_text() for t in axes[0].get_xticklabels()] == ["fma", "stream"]
    axes[0].figure.savefig(tmp_path / "topdown.png")
    assert (tmp_path / "topdown.png").stat().st_size > 0


def test_topdown_bars_per_kernel_in_percent():
    ds = range_dataset(stalls=(STALLS_0, STALLS_1, STALLS_1), ipc=(0.5, 0.1, 0.3), issued=(0.55, 0.1, 0.3),
                       threads=(24.0, 32.0, 32.0), kernels=("fma", "stream", "fma"), launches=(0, 0, 1))
    ax = plot.topdown(ds, level=1, by="kernel").axes[0]
    np.testing.assert_allclose(_stack_heights(ax), [100.0, 100.0])
    retire = [p.get_height() for p in ax.patches[:2]]  # the first series drawn is retire
    np.testing.assert_allclose(retire, [(1.5 + 1.2) / 2 * 25, 0.4 * 25])
    with pytest.raises(ValueError, match="level 2"):
        plot.topdown(td.topdown(ds, levels=1), level=2)


def test_hierarchy_rows_fill_100_percent():
    ax = range_dataset().gpuscope.plot.hierarchy().axes[0]
    assert _row_cover(ax, -1) == pytest.approx(100.0)  # level 1 covers IPC_MAX
    assert _row_cover(ax, -2) == pytest.approx(100.0)  # level 2 too: retire (no children) reaches down
    assert _row_cover(ax, -3) == pytest.approx(100.0)


def test_timeline_shades_phases_and_ranges(tmp_path):
    out = ph.phases(time_series())
    fig = out.gpuscope.plot.timeline()
    band, *rows = fig.axes
    assert len(rows) == 3 and band.get_ylabel() == "range"
    # One shaded span per segment on every metric row, in its phase's colour.
    spans = rows[0].patches
    assert len(spans) == 4 and spans[0].get_facecolor() == spans[2].get_facecolor() != spans[1].get_facecolor()
    assert [t.get_text() for t in band.texts] == ["stepA", "stepB", "stepA", "stepC"]
    assert rows[-1].get_xlabel() == "time (ms)"
    fig.savefig(tmp_path / "timeline.png")
    assert (tmp_path / "timeline.png").stat().st_size > 0


def test_timeline_without_phases_and_selected_metric():
    fig = plot.timeline(time_series(), NAMES[0])
    band, row = fig.axes
    assert len(row.patches) == 0 and len(row.lines) == 1
    assert row.get_title(loc="left") == NAMES[0]  # the full name above the panel; the label is short


# --------------------------------------------------------------------------------------------------------------
# On the H100 recordings shipped for `gpuscope demo` (per-launch data with every coordinate a session writes)

import warnings  # noqa: E402
from pathlib import Path  # noqa: E402

import gpuscope as gs  # noqa: E402

DATA = Path(gs.__file__).parent / "data"


@pytest.fixture(scope="module")
def launches():
    return gs.open_dataset(DATA / "demo_launches.nc")


@pytest.fixture(scope="module")
def nodes(launches):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gs.GpuscopeWarning)  # coverage 94-100%: known for this recording
        return gs.topdown(launches)


def _distinct(colors, min_distance=0.08):
    rgb = np.array([matplotlib.colors.to_rgb(c) for c in colors])
    d = np.sqrt(((rgb[:, None] - rgb[None]) ** 2).sum(-1))[np.triu_indices(len(rgb), 1)]
    return d.min() > min_distance if d.size else True


def test_documented_topdown_levels_on_real_launches(launches):
    axes = launches.gpuscope.plot.topdown(level=[1, 2]).axes
    assert len(axes) == 2
    for ax in axes:
        np.testing.assert_allclose(_stack_heights(ax), 100.0, atol=2.5)  # one bar per launch, each sums to 100%
        assert len(_stack_heights(ax)) == 15
    labels = [t.get_text() for t in axes[0].get_xticklabels()]
    assert labels[:3] == ["stream#0", "fma#1", "divergent#2"]  # launch order, repeated paths get the launch
    cycles = launches["sm__cycles_elapsed.max"].values
    assert [t.get_text() for t in axes[0].texts] == [f"{c / cycles.sum():.0%}" for c in cycles]
    assert axes[0].texts[1].get_text() == "9%"  # an FMA launch: 9% of the run's cycles


def test_dynamic_bars_on_real_launches(nodes):
    ax = gs.dynamic(nodes, "stream").gpuscope.plot.topdown().axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == [f"stream#{i}" for i in (0, 3, 6, 9, 12)]
    retire = ax.containers[0]
    assert retire.get_label() == "retire" and all(27.5 < p.get_height() < 35 for p in retire)


def test_per_kernel_bars_sorted_by_time_share_and_distinct_colours(nodes):
    agg = gs.aggregate(nodes, by="kernel")
    ax = agg.gpuscope.plot.topdown(level=3).axes[0]
    labels = [t.get_text() for t in ax.get_xticklabels()]
    share = (agg["weight"] / agg["weight"].sum()).to_series()
    assert labels == share.sort_values(ascending=False, kind="stable").index.tolist()
    assert labels[-1] == "stream" and [t.get_text() for t in ax.texts][-1] == f"{share['stream']:.0%}"
    colours = [c.patches[0].get_facecolor() for c in ax.containers]
    assert _distinct(colours)
    names = [c.get_label() for c in ax.containers]
    assert "backend_memory_long_scoreboard" in names and names[-1].startswith("other (")


def test_hierarchy_on_per_kernel_aggregates(nodes):
    agg = gs.aggregate(nodes, by="kernel")
    ax = agg.gpuscope.plot.hierarchy().axes[0]
    assert _row_cover(ax, -1) == pytest.approx(100.0, abs=1.25)
    # the cycle-weighted whole-run retire equals the weighted mean of the groups
    expected = float((agg["retire"] * agg["weight"]).sum() / agg["weight"].sum())
    assert ax.patches[0].get_width() == pytest.approx(expected)


def test_timeline_on_real_series():
    series = gs.open_dataset(DATA / "demo_timeseries.nc")
    out = gs.phases(series, label_tolerance=2)
    fig = out.gpuscope.plot.timeline()
    band, *rows = fig.axes
    tensor = "sm__pipe_tensor_cycles_active_realtime.avg.pct_of_peak_sustained_elapsed"
    full = [r.get_title(loc="left") for r in rows]
    assert tensor not in full and len(rows) == 7  # the tensor pipe is idle throughout: no panel
    assert any(tensor in t.get_text() for t in fig.texts)
    for r in rows:  # no constant panel; labels short, with a unit
        y = r.lines[0].get_ydata()
        assert np.nanmax(y) > np.nanmin(y)
        assert all(len(line) <= 20 for line in r.get_ylabel().split("\n")) and r.get_ylabel().endswith(")")
        assert len(r.lines[0].get_xdata()) <= 1000  # one point per pixel column, not 18,019
        assert len(r.collections) == 1  # the min-max band
    assert rows[3].get_ylabel() == "dram read throughput\n(% of peak)"  # the unit on a line of its own
    # each range has one shade of grey; the phases take colours of their own palette, none a range's (issue 37)
    band_colors = {t.get_text(): None for t in band.texts}
    assert list(band_colors) == ["stream", "fma", "divergent"]
    range_rgb = [matplotlib.colors.to_rgb(p.get_facecolor()) for p in band.patches]
    assert _distinct(range_rgb)
    phase_rgb = [matplotlib.colors.to_rgb(p.get_facecolor()) for p in rows[0].patches]
    assert all(r == g == b for r, g, b in range_rgb)  # greys
    assert all(max(c) - min(c) > 0.2 for c in phase_rgb)  # colours
    assert _distinct(range_rgb + list(dict.fromkeys(phase_rgb)), 0.15)


# --------------------------------------------------------------------------------------------------------------
# What a reader needs of each figure the demo, the docs and the tutorials make (issue 25), on the recordings


def _drawn(fig):
    fig.canvas.draw()
    return fig.canvas.get_renderer()


def test_timeline_names_metrics_above_the_traces_and_explains_line_and_band():
    out = gs.phases(gs.open_dataset(DATA / "demo_timeseries.nc"), label_tolerance=2)
    fig = out.gpuscope.plot.timeline()
    renderer = _drawn(fig)
    band, *rows = fig.axes
    assert all(r.get_title(loc="left") in out.metric.values for r in rows)  # the full name above each panel
    assert all(r.get_legend() is None for r in rows)  # nothing drawn over the traces near 100%
    (legend,) = fig.legends
    assert legend.get_window_extent(renderer).y1 <= rows[-1].get_window_extent(renderer).y0  # below the panels
    texts = [t.get_text() for t in legend.get_texts()]
    assert texts[:2] == ["mean per pixel column", "25-75th percentile of its samples"]
    assert texts[2:] == [f"phase {p}" for p in out.phase_id.values]


def test_timeline_band_is_no_comb_down_to_zero():
    """In the demo's fma range the GPU is ~100% busy but dips for one or two samples every 6 ms: per pixel
    column the minimum is then ~0 in a third of the columns, a dense comb; the interquartile band stays up."""
    series = gs.open_dataset(DATA / "demo_timeseries.nc")
    name = "gr__cycles_active.avg.pct_of_peak_sustained_elapsed"
    t = (series.time.values - series.time.values[0]) / 1e6
    fma = t[series["range"].values == "fma"]

    def low_columns(fig):
        (band,) = fig.axes[1].collections
        v = np.concatenate([path.vertices for path in band.get_paths()])
        inside = (v[:, 0] > fma[0] + 1) & (v[:, 0] < fma[-1] - 1) & (v[:, 1] < 50)
        return inside.sum() / ((v[:, 0] > fma[0]) & (v[:, 0] < fma[-1])).sum()

    assert low_columns(plot.timeline(series, name)) < 0.02
    assert low_columns(plot.timeline(series, name, band=(0, 100))) > 0.1  # min-max: the comb
    for bad in ((75, 25), (10,), "iqr", (0, 101)):
        with pytest.raises(ValueError, match=r"band must be None or two percentiles .* got"):
            plot.timeline(series, name, band=bad)


def test_timeline_of_launches_draws_a_line_per_kernel_and_says_what_it_leaves_out(launches):
    with pytest.warns(gs.GpuscopeWarning, match=r"timeline draws 8 of the 18 metrics that vary; not drawn: .*"
                                                r"Pass metrics="):
        fig = plot.timeline(launches)
    rows = fig.axes
    assert len(rows) == 8
    for r in rows:
        assert len(r.lines) == 3  # stream, fma, divergent: no zig-zag across interleaved kernels
        xs = [line.get_xdata().tolist() for line in r.lines]
        assert xs == [[0, 3, 6, 9, 12], [1, 4, 7, 10, 13], [2, 5, 8, 11, 14]]
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == ["stream", "fma", "divergent"]
    caption = " ".join(t.get_text() for t in fig.texts)
    assert "not drawn (at most 8 panels; pass metrics= to choose)" in caption and "gpu__time_duration.sum" in caption
    assert "constant, not drawn" in caption
    chosen = plot.timeline(launches, ["gpu__time_duration.sum", "sm__cycles_elapsed.max"])  # asked for: no warning
    assert [r.get_title(loc="left") for r in chosen.axes] == ["gpu__time_duration.sum", "sm__cycles_elapsed.max"]


def test_timeline_ticks_and_units_of_rates_are_readable():
    series = gs.open_dataset(DATA / "demo_timeseries.nc")  # recorded with units byte/second/second
    fig = plot.timeline(series, ["pcie__read_bytes.sum.per_second"])
    _drawn(fig)
    row = fig.axes[1]
    assert row.get_ylabel() == "pcie read bytes\n(byte/s)"
    assert row.yaxis.get_offset_text().get_text() == ""  # no "1e8" above the axis
    assert any(t.get_text().endswith("M") for t in row.get_yticklabels())


def test_timeline_leaves_out_non_finite_samples_and_says_which_metric_has_none():
    series = gs.open_dataset(DATA / "demo_timeseries.nc")
    name = "dram__read_throughput.avg.pct_of_peak_sustained_elapsed"
    bad = series.assign({name: series[name].where(np.arange(series.sizes["time"]) % 5 != 0, np.inf),
                         "lost": ("time", np.full(series.sizes["time"], np.nan))})
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        fig = plot.timeline(bad, [name, "lost"])
    assert np.isfinite(fig.axes[1].lines[0].get_ydata()).all()
    assert "no finite value, not drawn: lost" in fig.texts[0].get_text()


def test_topdown_bars_explain_their_labels_and_axis(nodes):
    """The demo's topdown.png: "47%" above a bar is its share of the SM cycles; the x axis says what the bars are,
    also when the caller replaces the title."""
    ax = gs.aggregate(nodes, by="kernel").gpuscope.plot.topdown(level=2).axes[0]
    ax.set_title("Top-Down level 2 per kernel (RECORDED, GH100)")  # as gpuscope demo does
    assert [t.get_text() for t in ax.texts] == ["47%", "47%", "6%"]
    assert ax.get_xlabel().replace("\n", " ") == "kernel; the number above a bar is its share of all the SM cycles"
    per_launch = nodes.gpuscope.plot.topdown().axes[0]
    assert per_launch.get_xlabel().startswith("kernel launch or user range; the number above a bar")


def test_hierarchy_names_every_visible_node_in_a_legend(nodes):
    agg = gs.aggregate(nodes, by="kernel")
    ax = agg.gpuscope.plot.hierarchy().axes[0]
    whole = gs.aggregate(agg, by=None, weight="weight", dim="kernel")
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    listed = [n for n in td.NODES if n.name in whole and float(whole[n.name]) >= plot.NEGLIGIBLE]
    assert [lab.split()[0] for lab in labels[:-1]] == [n.name for n in listed]
    assert "frontend_fetch  0.6%" in labels  # a sliver too narrow for a label inside its box
    boxed = {t.get_text().split("\n")[0] for t in ax.texts}
    assert "fetch" not in boxed and "retire" in boxed
    small = sum(1 for n in td.NODES if n.name in whole and float(whole[n.name]) < plot.NEGLIGIBLE)
    assert labels[-1] == f"({small} nodes < 0.5% each not listed)"


def test_pc_stall_legends_stay_off_the_bars():
    """Under the bars in a figure of the plot's own (the bars keep the page's width), beside them in a given ax."""
    import matplotlib.pyplot as plt

    from gpuscope.metrics import pc_plot

    from .test_trace import _pc_recording

    pc = _pc_recording()
    axes = [pc_plot.plot_line_stalls(pc, k).axes[0] for k in pc.kernel.values.tolist()] + [pc_plot.plot_kernel_stalls(pc).axes[0]]
    for ax in axes:
        renderer = _drawn(ax.figure)
        (legend,) = ax.figure.legends
        assert legend.get_window_extent(renderer).y1 <= ax.get_window_extent(renderer).y0
        assert legend.get_title().get_text() == "Top-Down category"
        assert ax.get_xlim()[1] > max(p.get_x() + p.get_width() for p in ax.patches)  # the longest bar ends inside
    given = pc_plot.plot_kernel_stalls(pc, ax=plt.subplots(figsize=(9, 3))[1]).axes[0]
    renderer = _drawn(given.figure)
    assert given.get_legend().get_window_extent(renderer).x0 >= given.get_window_extent(renderer).x1
    stream = next(ax for ax in axes if ax.get_title().split(":")[0].endswith("stream"))
    ticks = [t.get_text() for t in stream.get_xticklabels()]
    assert "250k" in ticks and all(len(t) <= 4 for t in ticks)  # not 350000 running into its neighbours


def test_every_plot_returns_its_figure(tmp_path):
    """Issue 37, item 8: one kind of result, whatever the call: a matplotlib Figure (ax= draws into ax.figure)."""
    import matplotlib.pyplot as plt
    from matplotlib.figure import Figure

    from gpuscope.metrics import pc_plot

    nodes = range_dataset()
    assert isinstance(nodes.gpuscope.plot.topdown(level=1), Figure)
    assert len(nodes.gpuscope.plot.topdown(level=[1, 2]).axes) == 2
    assert isinstance(nodes.gpuscope.plot.hierarchy(), Figure)
    fig, ax = plt.subplots()
    assert nodes.gpuscope.plot.topdown(ax=ax) is fig and nodes.gpuscope.plot.hierarchy(ax=ax) is fig
    for name in ("plot_line_stalls", "plot_kernel_stalls"):
        assert "matplotlib.figure.Figure" in getattr(pc_plot, name).__doc__
    for name in ("roofline", "memory_chart", "timeline", "phase_topdown"):
        assert "matplotlib.figure.Figure" in getattr(plot, name).__doc__
    plt.close("all")


def test_every_plot_the_docs_name_is_on_the_accessor():
    """Issue 37, item 8: docs/index.md named plot.phase_topdown where no such name was; ds.gpuscope.plot has every
    plot of gpuscope.metrics.plot, and index.md names only real ones."""
    import re
    from pathlib import Path

    from gpuscope.metrics.accessor import PlotNamespace

    assert {n for n in plot.__all__ if n != "short_label"} <= set(dir(PlotNamespace))
    index = (Path(__file__).parents[2] / "docs" / "index.md").read_text()
    named = set(re.findall(r"\.gpuscope\.plot\.(\w+)\(", index)) | set(re.findall(r"`plot\.(\w+)", index))
    assert named and named <= set(dir(PlotNamespace)) and "`plot." not in index


# --------------------------------------------------------------------------------------------------------------
# Plots as a paper's reader sees them (issue 37, item 11)


def _texts(fig):
    _drawn(fig)
    return [t for t in fig.findobj(matplotlib.text.Text) if t.get_visible() and t.get_text().strip()]


def test_topdown_bars_are_legible_at_their_saved_size(launches, tmp_path):
    fig = launches.gpuscope.plot.topdown(level=[1, 2])
    assert fig.get_figwidth() <= 7.5  # a two-column paper figure, printed at its own size
    small = {t.get_text(): t.get_fontsize() for t in _texts(fig) if t.get_fontsize() < 8}
    assert not small, small
    fig.savefig(tmp_path / "t.png")
    from PIL import Image

    with Image.open(tmp_path / "t.png") as image:
        assert image.size[0] >= 1000  # not 705x369


def test_topdown_legend_lists_the_visible_bars_in_stack_order(launches, nodes):
    figs = [launches.gpuscope.plot.topdown(level=[1, 2]), gs.aggregate(nodes, by="kernel").gpuscope.plot.topdown(level=3)]
    for ax in [ax for fig in figs for ax in fig.axes]:
        visible = [c.get_label() for c in ax.containers
                   if max(p.get_height() for p in c) >= plot.NEGLIGIBLE]
        legend = [t.get_text() for t in ax.get_legend().get_texts()]
        assert legend == visible[::-1]  # the top entry is the top segment
    level2 = figs[0].axes[1]
    assert "divergence_replay" in [c.get_label() for c in level2.containers]  # drawn, near 0 everywhere
    assert "divergence_replay" not in [t.get_text() for t in level2.get_legend().get_texts()]


def test_backend_and_backend_core_do_not_share_a_colour(launches):
    fig = launches.gpuscope.plot.topdown(level=[1, 2])
    colour = {c.get_label(): matplotlib.colors.to_rgb(c.patches[0].get_facecolor())
              for ax in fig.axes for c in ax.containers}
    assert _distinct(list(colour.values()), 0.15), colour
    assert colour["backend"] != colour["backend_core"]


def test_hierarchy_leaves_no_blank_space_under_a_leaf(nodes):
    ax = gs.aggregate(nodes, by="kernel").gpuscope.plot.hierarchy().axes[0]
    for row in (-1, -2, -3):
        assert _row_cover(ax, row) == pytest.approx(100.0, abs=1.5), row
    assert not [t.get_text() for t in _texts(ax.figure) if t.get_fontsize() < 8]
