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
    for ax, level in zip(axes, (1, 2, 3)):
        np.testing.assert_allclose(_stack_heights(ax), [4.0, 4.0])
        assert len(ax.get_legend().get_texts()) == len(td.level_cut(level, td.topdown(ds).data_vars))
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
    assert len(row.patches) == 0 and len(row.lines) == 1 and row.get_ylabel().startswith(NAMES[0])
