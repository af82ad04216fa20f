"""On a GPU: `gpuscope check` says what each built-in set holds on this chip, and a session records in its attrs
what its set lost or swapped on the chip (nothing on a GH100, where every set was verified)."""

import json

import numpy as np
import pytest

import gpuscope as gs
from gpuscope import cli
from gpuscope._gpu import metric_lists as _lists
from gpuscope.metrics import catalog as sets_data


def test_check_says_what_each_set_holds(capsys):
    code = cli.main(["check", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == cli.EXIT_OK, report
    support = report["support"]
    assert support["chip"] == report["chip"] and support["ipc_max"] == 4.0
    assert {s["name"] for s in support["sets"]} == set(gs.metric_sets())
    if report["chip"] == "GH100":
        assert {s["status"] for s in support["sets"]} == {"complete"}
        assert support["verified"] == "hardware"
    cli.main(["check"])
    text = capsys.readouterr().out
    assert "Top-Down" in text and "sets" in text and "verified" in text


@pytest.fixture
def x():
    from numba import cuda

    return cuda.to_device(np.ones(1 << 16, np.float32))


def _kernel():
    from benchmarks.workloads import twice

    return twice


@pytest.mark.parametrize("reduced", [False, True])
def test_session_attrs_say_what_the_set_lost(x, monkeypatch, reduced):
    from numba import cuda

    real = _lists.resolution
    if reduced:  # as on a chip without DRAM byte counters (GA10B, GB20B): the launch set less those two
        def resolution(metrics, chip=None, kind="range"):
            res = real(metrics, chip, kind)
            keep = tuple(m for m in res.metrics if not m.startswith("dram__bytes"))
            return sets_data.SetOnChip(keep, {}, ("dram__bytes_read.sum", "dram__bytes_write.sum"))

        monkeypatch.setattr(_lists, "resolution", resolution)
    twice = _kernel()
    twice[64, 1024](x)
    cuda.synchronize()
    with gs.Profiler(metrics="launch", mode="kernel") as prof:
        twice[64, 1024](x)
        cuda.synchronize()
    ds = prof.dataset
    assert ds.attrs["metric_set"] == "launch"
    if reduced:
        assert list(ds.attrs["metric_set_left_out"]) == ["dram__bytes_read.sum", "dram__bytes_write.sum"]
        assert "dram__bytes_read.sum" not in ds and "sm__cycles_elapsed.max" in ds
    else:
        assert "metric_set_left_out" not in ds.attrs and "metric_set_substituted" not in ds.attrs
        assert "dram__bytes_read.sum" in ds
