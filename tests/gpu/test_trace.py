"""gs.to_perfetto on a live run: Top-Down per launch (kernel replay) then PM sampling, on one CUPTI clock."""

import json

import gpuscope as gs
from gpuscope._commands import demo as _demo


def test_live_run_trace_lines_up(tmp_path):
    launches, series = _demo.collect(launches_per_kernel=2, phase_seconds=0.2, log=lambda *_: None)
    ph = gs.phases(series)
    trace = gs.to_perfetto(tmp_path / "run.json", launches, series, ph)
    assert json.loads((tmp_path / "run.json").read_text()) == trace
    events = trace["traceEvents"]
    tracks = {e["tid"]: e["args"]["name"] for e in events if e["name"] == "thread_name"}
    kernels = [e for e in events if e["ph"] == "X" and tracks[e["tid"]] == "kernels"]
    assert [e["name"] for e in kernels] == ["stream", "fma", "divergent"] * 2
    assert all(0 < e["args"]["topdown.retire"] <= 100.0 for e in kernels)  # percent of peak
    user = [e for e in events if e["ph"] == "X" and tracks[e["tid"]].startswith("ranges (thread")]
    assert [e["name"] for e in user] == ["stream", "fma", "divergent"]
    # the launches were profiled before sampling started; both are on CUPTI's clock, so they follow each other
    # within seconds (not the ~1e18 ns apart that mixing clocks would give)
    assert kernels[0]["ts"] == 0.0
    assert kernels[-1]["ts"] < user[0]["ts"] < kernels[-1]["ts"] + 60e6
    segments = [e for e in events if e["ph"] == "X" and tracks[e["tid"]] == "phases"]
    assert len(segments) == ph.sizes["segment"] >= 2
    assert segments[0]["ts"] <= user[0]["ts"] and segments[-1]["ts"] + segments[-1]["dur"] >= user[-1]["ts"]
    counters = [e for e in events if e["ph"] == "C"]
    assert len(counters) == series.sizes["time"] * len(series.attrs["metrics"])
    assert min(e["ts"] for e in counters) >= 0
