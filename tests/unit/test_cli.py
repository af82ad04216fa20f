"""The gpuscope command on a machine without a GPU."""

import json

import pytest

from gpuscope import cli
from gpuscope.cupti import _api, _lib


def run(capsys, *argv):
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_search(capsys):
    code, out, _ = run(capsys, "metrics", "--chip", "GH100", "--search", "long_scoreboard", "--names-only")
    assert code == 0
    assert "smsp__warp_issue_stalled_long_scoreboard_per_warp_active" in out
    assert "waiting for a scoreboard dependency on L1TEX" in out


def test_passes_of_the_papers_topdown_metrics(capsys):
    from tests.unit.test_catalog import PAPER_TOPDOWN

    code, out, _ = run(capsys, "metrics", "--chip", "GH100", "--passes", *PAPER_TOPDOWN)
    assert code == 0
    if _api.version() == (13, 1):
        assert out.startswith("7 passes for 21 metrics (GH100, range profiler, CUPTI 13.1; gpuscope's pass plan, "
                              "as many as CUPTI's own schedule)")
    assert "several passes on their own" not in out  # each stall share alone is one pass (not a plan of two)


def test_passes_json_for_a_set(capsys):
    code, out, _ = run(capsys, "metrics", "--chip", "GH100", "--passes", "launch", "--json")
    data = json.loads(out)
    assert code == 0 and data["passes"] == 1 and "gpu__time_duration.sum" in data["metrics"]


def test_multi_pass_sampling_set_is_refused(capsys):
    code, out, _ = run(capsys, "metrics", "--chip", "GH100", "--sampling", "--passes",
                       "sm__throughput.avg.pct_of_peak_sustained_elapsed")
    assert code == cli.EXIT_USAGE
    assert "needs a single pass" in out


def test_describe_base_lists_complete_names(capsys):
    code, out, _ = run(capsys, "metrics", "--chip", "GH100", "--describe", "sm__cycles_elapsed")
    assert code == 0 and "sm__cycles_elapsed.avg.per_second" in out and "# of cycles elapsed on SM" in out


@pytest.mark.parametrize(
    "argv,needle",
    [
        (("metrics", "--chip", "GH1OO", "--search", "x"), "is not supported by the loaded CUPTI"),
        (("metrics", "--chip", "GH100", "--passes", "sm__cycles_elapsed"), "needs a rollup"),
        (("metrics", "--chip", "GH100", "--passes", "not__a_metric.sum"), "Unknown metric"),
    ],
)
def test_bad_input_is_a_clear_error(capsys, argv, needle):
    code, _, err = run(capsys, *argv)
    assert code == cli.EXIT_USAGE
    assert err.startswith(f"gpuscope {argv[0]}: error:") and needle in err


def test_sets_and_chips(capsys):
    code, out, _ = run(capsys, "metrics", "--sets")
    assert code == 0 and "topdown (range, 23 metrics)" in out and "pm-default (sampling" in out
    code, out, _ = run(capsys, "metrics", "--chips", "--json")
    assert "GH100" in json.loads(out)


def test_check_without_gpu(capsys):
    if _lib.driver_available():
        pytest.skip("this machine has a driver")
    code, out, _ = run(capsys, "check", "--json")
    data = json.loads(out)
    assert code == cli.EXIT_NO_GPU and data["ok"] is False and data["driver"] is None
    assert data["cupti"]["version"] == "%d.%d" % _api.version()
    code, out, _ = run(capsys, "check")
    assert "no NVIDIA driver" in out and "NOT ready to profile" in out


def test_metrics_support_and_sets_on_a_chip(capsys):
    code, out, _ = run(capsys, "metrics", "--chip", "rtx 5090", "--support")
    assert code == 0 and out.startswith("GB202: Blackwell GB20x")
    assert "topdown         range    reduced" in out and "imc_miss" in out and "offline only" in out
    code, out, _ = run(capsys, "metrics", "--chip", "GB202", "--sets")
    assert code == 0 and "substituted: dram__bytes_read.sum -> dram__bytes_op_read.sum" in out
    assert "left out: smsp__warp_issue_stalled_imc_miss_per_warp_active.pct" in out
    code, out, _ = run(capsys, "metrics", "--chip", "GH100", "--support", "--json")
    data = json.loads(out)
    assert data["verified"] == "hardware" and {s["status"] for s in data["sets"]} == {"complete"}


def test_check_on_a_chip_works_offline(capsys):
    code, out, _ = run(capsys, "check", "--chip", "ga10b")
    assert code == 0 and "GA10B: Ampere Tegra (Orin), compute capability 8.7" in out
    assert "dram__bytes_read.sum: left out" in out
    code, _, err = run(capsys, "check", "--chip", "GB2O2")
    assert code == 4 and "Closest: GB202" in err
