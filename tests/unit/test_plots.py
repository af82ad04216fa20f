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
from gpuscope.metrics.plot_colors import _node_colors, node_words  # noqa: E402

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
        stack = [node_words(n) for n in cut if n not in small] + (
            [f"other ({len(small)} nodes < 0.5% each)"] if small else [])
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
FIXTURES = Path(__file__).parents[1] / "fixtures"


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
    assert "backend memory: long scoreboard" in names and names[-1].startswith("other (")


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
    assert row.get_ylabel() == "pcie read bytes\n(GB/s)"  # the report's unit
    assert row.yaxis.get_offset_text().get_text() == ""  # no "1e8" above the axis
    top = float(series["pcie__read_bytes.sum.per_second"].max()) / 1e9
    assert 0 < row.get_ylim()[1] < 2 * top  # drawn in GB/s, not bytes/s


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
    assert [lab.rsplit("  ", 1)[0] for lab in labels[:-1]] == [node_words(n.name) for n in listed]
    assert "frontend fetch  0.6%" in labels  # a sliver too narrow for a label inside its box
    assert not any("_" in lab for lab in labels)  # words, not snake_case
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
    assert "divergence replay" in [c.get_label() for c in level2.containers]  # drawn, near 0 everywhere
    assert "divergence replay" not in [t.get_text() for t in level2.get_legend().get_texts()]


def test_backend_and_backend_core_do_not_share_a_colour(launches):
    fig = launches.gpuscope.plot.topdown(level=[1, 2])
    colour = {c.get_label(): matplotlib.colors.to_rgb(c.patches[0].get_facecolor())
              for ax in fig.axes for c in ax.containers}
    assert _distinct(list(colour.values()), 0.15), colour
    assert colour["backend"] != colour["backend core"]


def test_hierarchy_leaves_no_blank_space_under_a_leaf(nodes):
    ax = gs.aggregate(nodes, by="kernel").gpuscope.plot.hierarchy().axes[0]
    for row in (-1, -2, -3):
        assert _row_cover(ax, row) == pytest.approx(100.0, abs=1.5), row
    assert not [t.get_text() for t in _texts(ax.figure) if t.get_fontsize() < 8]


# Machado, Oliveira & Fernandes (2009), severity 1: what readers with protanopia and deuteranopia see (linear RGB)
_MACHADO = {"protanopia": [[0.152286, 1.052583, -0.204868], [0.114503, 0.786281, 0.099216],
                           [-0.003882, -0.048116, 1.051998]],
            "deuteranopia": [[0.367322, 0.860646, -0.227968], [0.280085, 0.672501, 0.047413],
                             [-0.011820, 0.042940, 0.968881]]}


def _linear(rgb):
    c = np.asarray(matplotlib.colors.to_rgb(rgb), float)
    return np.where(c <= 0.04045, c / 12.92, ((c + 0.055) / 1.055) ** 2.4)


def _lab(linear):
    """CIELAB (D65) of a linear RGB colour: distances of about 10 and more are told apart at a glance."""
    xyz = np.array([[0.4124, 0.3576, 0.1805], [0.2126, 0.7152, 0.0722], [0.0193, 0.1192, 0.9505]]) @ linear
    f = np.cbrt(xyz / [0.95047, 1.0, 1.08883])
    return np.array([116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])])


def _closest(colours: dict) -> tuple[float, str, str]:
    """The closest two colours of *colours* for a reader of normal vision or either deficiency."""
    seen = {kind: {n: _lab(np.clip(np.asarray(m) @ _linear(c), 0, 1)) for n, c in colours.items()}
            for kind, m in _MACHADO.items()}
    seen["normal"] = {n: _lab(_linear(c)) for n, c in colours.items()}
    names = list(colours)
    return min((float(np.linalg.norm(lab[a] - lab[b])), a, b, kind) for kind, lab in seen.items()
               for i, a in enumerate(names) for b in names[i + 1:])


def test_colour_blind_readers_tell_the_top_down_nodes_apart(nodes):
    """Issue 53: the green retire and red backend_core bars read alike to the ~1 in 12 men with a red-green
    deficiency; frontend and frontend_fetch read alike to everyone."""
    fig = gs.aggregate(nodes, by="kernel").gpuscope.plot.hierarchy()
    ax = fig.axes[0]
    colours = {t.get_text().rsplit("  ", 1)[0]: h.get_facecolor() for t, h in
               zip(ax.get_legend().get_texts(), ax.get_legend().legend_handles, strict=True)
               if not t.get_text().startswith("(")}
    upper = {n: c for n, c in colours.items() if ":" not in n}  # levels 1 and 2, listed together
    assert {"retire", "backend core", "frontend", "frontend fetch"} <= set(upper)
    assert _closest(upper)[0] >= 10, _closest(upper)
    level2 = [n for n in td.level_cut(2, nodes.data_vars)]
    assert _closest({n: c for n, c in _node_colors(level2).items()})[0] >= 15


def test_a_level_1_colour_is_its_childrens_hue_and_none_of_theirs():
    import colorsys

    for parent in ("divergence", "frontend", "backend"):
        children = [n.name for n in td.NODES if n.parent == parent]
        colours = _node_colors([parent, *children])
        hue = {n: colorsys.rgb_to_hsv(*matplotlib.colors.to_rgb(c))[0] for n, c in colours.items()}
        low, high = min(hue[c] for c in children), max(hue[c] for c in children)
        assert low - 0.04 <= hue[parent] <= high + 0.04, (parent, hue)  # within the children's hues
        assert _closest(colours)[0] >= 10, _closest(colours)


@pytest.mark.parametrize("draw", ["topdown", "hierarchy"])
def test_a_plot_given_ax_leaves_the_callers_figure_alone(nodes, draw):
    """Issue 53: topdown(ax=) and hierarchy(ax=) replaced a constrained layout (a warning, and the layout lost)
    and clipped their titles on a 6 x 4 figure."""
    import warnings

    fig, ax = plt.subplots(figsize=(6, 4), layout="constrained")
    engine = fig.get_layout_engine()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        getattr(gs.aggregate(nodes, by="kernel").gpuscope.plot, draw)(ax=ax)
        fig.draw_without_rendering()
    assert fig.get_layout_engine() is engine
    whole = fig.bbox
    for text in (ax.title, ax._left_title, ax.xaxis.label, *ax.get_legend().get_texts()):
        if text.get_text():
            box = text.get_window_extent()
            assert whole.x0 - 1 <= box.x0 and box.x1 <= whole.x1 + 1 and box.y1 <= whole.y1 + 1, text.get_text()


def test_the_memory_chart_draws_its_boxes_whole():
    fig = gs.open_dataset(FIXTURES / "sol" / "sol_memory_gh100.nc").gpuscope.plot.memory_chart("stream")
    fig.draw_without_rendering()
    (ax,) = fig.axes
    inside = ax.bbox
    boxes = [p for p in ax.patches if type(p).__name__ == "FancyBboxPatch"]
    assert len(boxes) == 8
    for p in boxes:
        b = p.get_window_extent()
        assert inside.x0 <= b.x0 and b.x1 <= inside.x1 and inside.y0 <= b.y0 and b.y1 <= inside.y1


def test_the_roofline_says_what_it_left_out_and_bounds_only_what_is_near_a_roof():
    rl = gs.open_dataset(FIXTURES / "sol" / "sol_roofline_gh100.nc")
    fig = rl.gpuscope.plot.roofline()  # Tensor: one of the five kernels did such work
    (legend,) = fig.legends
    assert "4 of 5 kernels did no Tensor work: not drawn" in legend.get_title().get_text()
    texts = [t.get_text() for t in rl.gpuscope.plot.roofline("fp32").legends[0].get_texts()]
    far = next(t for t in texts if t.startswith("DeviceReduceSingleTileKernel"))
    assert "bound" not in far and "of its lowest ceiling (L2): far below every roof" in far
    assert any(t.startswith("DeviceReduceKernel:") and t.endswith("DRAM-bound") for t in texts)


def test_the_timeline_band_is_drawn_over_the_phase_shading():
    series = gs.open_dataset(DATA / "demo_timeseries.nc")
    fig = gs.phases(series, label_tolerance=2).gpuscope.plot.timeline(["dram__read_throughput.avg.pct_of_peak_"
                                                                       "sustained_elapsed"])
    ax = fig.axes[1]
    shading = [p.get_zorder() for p in ax.patches]
    bands = [c.get_zorder() for c in ax.collections]
    assert shading and bands and max(shading) < min(bands)


def test_the_pc_line_figure_says_why_loop_headers_hold_samples():
    from gpuscope.metrics import pc_plot
    from tests.fixtures.pc import recording

    label = pc_plot.plot_line_stalls(recording.dataset(), "fma").axes[0].get_xlabel().replace("\n", " ")
    assert "line table" in label and "loop header" in label and "cuda.grid" in label
    assert "Line 41 holds 81 of the 184 sampled instructions" in label
