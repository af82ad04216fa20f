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
    assert float(out.gpuscope.aggregate(by=None).retire) == pytest.approx(0.95)


def test_topdown_bars_stack_to_ipc_max(tmp_path):
    ds = range_dataset()
    axes = ds.gpuscope.plot.topdown(level=[1, 2, 3])
    assert len(axes) == 3
    nodes = td.topdown(ds)
    for ax, level in zip(axes, (1, 2, 3)):
        np.testing.assert_allclose(_stack_heights(ax), [4.0, 4.0])
        cut = td.level_cut(level, nodes.data_vars)
        small = [n for n in cut if td._BY_NAME[n].level == 3 and float(abs(nodes[n]).max()) < plot.NEGLIGIBLE * 4]
        texts = [t.get_text() for t in ax.get_legend().get_texts()]
        assert texts == [n for n in cut if n not in small] + ([f"other ({len(small)} nodes < 0.5% each)"] if small else [])
    assert [t.get_text() for t in axes[0].get_xticklabels()] == ["fma", "stream"]
    axes[0].figure.savefig(tmp_path / "topdown.png")
    assert (tmp_path / "topdown.png").stat().st_size > 0


def test_topdown_bars_per_kernel_in_percent():
    ds = range_dataset(stalls=(STALLS_0, STALLS_1, STALLS_1), ipc=(0.5, 0.1, 0.3), issued=(0.55, 0.1, 0.3),
                       threads=(24.0, 32.0, 32.0), kernels=("fma", "stream", "fma"), launches=(0, 0, 1))
    ax = plot.topdown(ds, level=1, by="kernel", fraction=True)
    np.testing.assert_allclose(_stack_heights(ax), [100.0, 100.0])
    retire = [p.get_height() for p in ax.patches[:2]]  # the first series drawn is retire
    np.testing.assert_allclose(retire, [(1.5 + 1.2) / 2 * 25, 0.4 * 25])
    with pytest.raises(ValueError, match="level 2"):
        plot.topdown(td.topdown(ds, levels=1), level=2)


def test_hierarchy_rows_fill_ipc_max():
    ax = range_dataset().gpuscope.plot.hierarchy()
    rows = {}
    for patch in ax.patches:
        rows.setdefault(round(patch.get_y() + patch.get_height() / 2), []).append(patch.get_width())
    assert sum(rows[-1]) == pytest.approx(4.0)  # level 1 covers IPC_MAX
    assert sum(rows[-2]) == pytest.approx(4.0 - 0.95)  # level 2 under divergence, frontend, backend


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
    assert row.get_legend().get_texts()[0].get_text() == NAMES[0]  # the full name; the label is short


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
    axes = launches.gpuscope.plot.topdown(level=[1, 2])
    assert len(axes) == 2
    for ax in axes:
        np.testing.assert_allclose(_stack_heights(ax), 4.0, atol=0.1)  # one bar per launch, each sums to IPC_MAX
        assert len(_stack_heights(ax)) == 15
    labels = [t.get_text() for t in axes[0].get_xticklabels()]
    assert labels[:3] == ["stream#0", "fma#1", "divergent#2"]  # launch order, repeated paths get the launch
    cycles = launches["sm__cycles_elapsed.max"].values
    assert [t.get_text() for t in axes[0].texts] == [f"{c / cycles.sum():.0%}" for c in cycles]
    assert axes[0].texts[1].get_text() == "9%"  # an FMA launch: 9% of the run's cycles


def test_dynamic_bars_on_real_launches(nodes):
    ax = gs.dynamic(nodes, "stream").gpuscope.plot.topdown()
    assert [t.get_text() for t in ax.get_xticklabels()] == [f"stream#{i}" for i in (0, 3, 6, 9, 12)]
    retire = ax.containers[0]
    assert retire.get_label() == "retire" and all(1.1 < p.get_height() < 1.4 for p in retire)


def test_per_kernel_bars_sorted_by_time_share_and_distinct_colours(nodes):
    agg = gs.aggregate(nodes, by="kernel")
    ax = agg.gpuscope.plot.topdown(level=3)
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
    ax = agg.gpuscope.plot.hierarchy()
    level1 = [p.get_width() for p in ax.patches if round(p.get_y() + p.get_height() / 2) == -1]
    assert sum(level1) == pytest.approx(4.0, abs=0.05)
    # the cycle-weighted whole-run retire equals the weighted mean of the groups
    expected = float((agg["retire"] * agg["weight"]).sum() / agg["weight"].sum())
    assert ax.patches[0].get_width() == pytest.approx(expected)


def test_timeline_on_real_series():
    series = gs.open_dataset(DATA / "demo_timeseries.nc")
    out = gs.phases(series, label_tolerance=2)
    fig = out.gpuscope.plot.timeline()
    band, *rows = fig.axes
    tensor = "sm__pipe_tensor_cycles_active_realtime.avg.pct_of_peak_sustained_elapsed"
    full = [r.get_legend().get_texts()[0].get_text() for r in rows]
    assert tensor not in full and len(rows) == 7  # the tensor pipe is idle throughout: no panel
    assert any(tensor in t.get_text() for t in fig.texts)
    for r in rows:  # no constant panel; labels short, with a unit
        y = r.lines[0].get_ydata()
        assert np.nanmax(y) > np.nanmin(y)
        assert len(r.get_ylabel()) < 40 and r.get_ylabel().endswith(")")
        assert len(r.lines[0].get_xdata()) <= 1000  # one point per pixel column, not 18,019
        assert len(r.collections) == 1  # the min-max band
    assert rows[3].get_ylabel() == "dram read throughput (% of peak)"
    # each range has one colour; the phase that fills the stream range takes that colour
    band_colors = {t.get_text(): None for t in band.texts}
    assert list(band_colors) == ["stream", "fma", "divergent"]
    range_rgb = [matplotlib.colors.to_rgb(p.get_facecolor()) for p in band.patches]
    assert _distinct(range_rgb)
    phase = out["phase"].values
    stream_phase = int(np.bincount(phase[out["range"].values == "stream"]).argmax())
    first = rows[0].patches[int(np.flatnonzero(out["segment_phase"].values == stream_phase)[0])]
    assert matplotlib.colors.to_rgb(first.get_facecolor()) == pytest.approx(range_rgb[0])
