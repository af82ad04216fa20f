"""`gpuscope demo` without a GPU: the same analysis on the H100 recordings shipped with the package."""

import io

import pytest

import gpuscope as gs
from gpuscope import cli
from gpuscope._commands import demo as _demo


def test_recorded_demo_report_and_files(tmp_path):
    out = io.StringIO()
    launches = gs.open_dataset(_demo.RECORDED_LAUNCHES)
    series = gs.open_dataset(_demo.RECORDED_SERIES)
    result = _demo.analyse(launches, series, tmp_path, recorded=True, out=out)
    text = out.getvalue()
    assert "RECORDED on NVIDIA H100" in text and "Not measured on this machine" in text
    assert result["verdicts"]["stream"] == "backend_memory"
    assert result["verdicts"]["fma"] == "backend_core"
    assert result["verdicts"]["divergent"] == "divergence_branch"
    # three 0.6 s stretches ran inside gs.range blocks: the memory-bound one is one phase, and fma and divergent,
    # alike in every PM metric, are one other phase (issue 15), so no segment is mostly "divergent"
    ranges = {r for _, r in result["segments"]}
    assert {"stream", "fma"} <= ranges and result["phases"] == 2
    stream = {lab for lab, r in result["segments"] if r == "stream"}
    others = {lab for lab, r in result["segments"] if r in ("fma", "divergent")}
    assert stream and others and not stream & others
    for name in ("topdown.png", "timeline.png", "launches.nc", "timeseries.nc"):
        assert (tmp_path / name).stat().st_size > 1000
    again = gs.open_dataset(tmp_path / "launches.nc")
    assert again.sizes == launches.sizes and again.attrs["chip"] == "GH100"


def test_demo_command_without_gpu(tmp_path, capsys):
    from gpuscope.cupti import _lib

    code = cli.main(["demo", "--recorded", "--out", str(tmp_path)])
    assert code == 0
    assert "Top-Down per kernel" in capsys.readouterr().out
    if not _lib.driver_available():
        assert cli.main(["demo", "--out", str(tmp_path / "auto")]) == 0


def test_the_no_gpu_line_is_one_balanced_clause(tmp_path, monkeypatch, capsys):
    def no_gpu():
        raise gs.NoGpuError("The NVIDIA driver is not available on this machine (Error loading libcuda.so.1: not "
                            "found). gpuscope can still list metrics offline.")

    monkeypatch.setattr("gpuscope._gpu.device.device_count", no_gpu)
    _demo.main(tmp_path)
    out, err = capsys.readouterr()
    line = next(ln for ln in err.splitlines() if ln.startswith("No GPU:"))  # a note, on stderr (issue 53)
    assert line == "No GPU: The NVIDIA driver is not available on this machine."
    assert "No GPU" not in out


def test_recorded_demo_fits_the_terminal_and_says_what_is_not_attributed(tmp_path):
    import numpy as np

    launches = gs.open_dataset(_demo.RECORDED_LAUNCHES)
    series = gs.open_dataset(_demo.RECORDED_SERIES)
    ranges = series["range"].values.astype(str)
    # the samples of the fma and divergent ranges lost their range: the phase they make has no Top-Down to join
    lost = series.assign_coords(range=("time", np.where(np.isin(ranges, ["fma", "divergent"]), "", ranges)))
    out = io.StringIO()
    _demo.analyse(launches, lost, tmp_path, recorded=True, out=out, width=80)
    text = out.getvalue()
    assert [line for line in text.splitlines() if len(line) > 80] == []
    assert "nan" not in text.lower()
    per_phase = text[text.index("Top-Down per phase"):]
    rows = [line.split() for line in per_phase.splitlines() if line[:1].isdigit() and "%" in line]
    assert len(rows) == 2 and rows[1][1:] == ["66.6%", "0.0%", "-", "-", "not", "attributed"]


def test_a_gpu_without_numba_shows_the_recordings_and_names_the_extra(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("gpuscope._gpu.device.device_count", lambda: 1)
    monkeypatch.setattr(_demo, "_numba_cuda", lambda: False)
    monkeypatch.setattr(_demo, "collect", lambda: pytest.fail("the demo's workload needs Numba"))
    assert _demo.main(tmp_path) == 0
    out = capsys.readouterr().out
    assert "Numba is not installed" in out and "pip install '.[cu13]' in a gpuscope checkout" in out
    assert "Not measured on this machine" in out and (tmp_path / "topdown.png").exists()


def test_recorded_demo_is_warning_free_and_tells_its_story(tmp_path, monkeypatch):
    """Issue 37, item 9: no raw GpuscopeWarning, the two tables say they come from two runs, the three kernels
    make two phases, and the timeline keeps every varying metric (PCIe included)."""
    import warnings

    from gpuscope.metrics import plot as _plot

    drawn = []
    timeline = _plot.timeline
    monkeypatch.setattr(_plot, "timeline", lambda ds, metrics=None, **kw: drawn.append(metrics) or
                        timeline(ds, metrics, **kw))
    out = io.StringIO()
    launches = gs.open_dataset(_demo.RECORDED_LAUNCHES)
    series = gs.open_dataset(_demo.RECORDED_SERIES)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _demo.analyse(launches, series, tmp_path, recorded=True, out=out, width=80)
        gs.topdown(launches)
    text = " ".join(out.getvalue().split())
    assert "Run 1, per launch" in text and "Run 2, over time: a separate run" in text
    assert "2 distinct phases" in text and "three phases" not in text
    assert "three phases" not in _demo.__doc__
    assert {"pcie__read_bytes.sum.per_second", "pcie__write_bytes.sum.per_second"} <= set(drawn[0])


def test_coverage_warns_only_when_the_user_can_act():
    """Passes that disagree are in the coordinate `consistent`; a missing optional stall reason still warns."""
    import warnings

    from gpuscope.metrics import topdown as td

    launches = gs.open_dataset(_demo.RECORDED_LAUNCHES)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = td.topdown(launches)
    assert not out["consistent"].values.all()
    gmma = td.stall_metric("gmma")
    assert gmma in launches and not launches[gmma].values.any()  # none of these kernels waits on a warpgroup MMA
    with warnings.catch_warnings():  # so without it the warp states still cover ~100% (median): nothing to collect
        warnings.simplefilter("error")
        td.topdown(launches.drop_vars(gmma), check="ignore")
        td.topdown(launches.drop_vars(gmma))
    # had a fifth of every launch's warp-cycles waited on one, leaving it out would leave 80%: collect it
    heavy = launches.copy()
    stalls = [v for v in heavy.data_vars if v.startswith("smsp__warp_issue_stalled_") and v != gmma]
    total = sum(heavy[v] for v in stalls)
    for v in stalls:
        heavy[v] = heavy[v] * 0.8
    heavy[gmma] = total * 0.2
    with pytest.warns(gs.GpuscopeWarning, match="gmma"):
        td.topdown(heavy.drop_vars(gmma))
