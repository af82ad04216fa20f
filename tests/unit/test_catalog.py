"""The metric catalog and the named metric sets, offline on GH100 and GA100."""

from pathlib import Path

import numpy as np
import pytest

import gpuscope as gs
from gpuscope._gpu import catalog as _catalog
from gpuscope._gpu import metric_lists as _lists
from gpuscope.cupti import _api
from gpuscope.errors import UnknownMetricError, UnsupportedChipError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"  # not the working folder: tests run from anywhere

PAPER_TOPDOWN = ["smsp__inst_executed.avg.per_cycle_active", "smsp__thread_inst_executed_per_inst_executed.ratio",
                 "smsp__inst_issued.avg.per_cycle_active"] + [
    f"smsp__warp_issue_stalled_{s}_per_warp_active.pct"
    for s in ("no_instruction barrier membar branch_resolving sleeping misc dispatch_stall math_pipe_throttle "
              "long_scoreboard imc_miss mio_throttle drain lg_throttle short_scoreboard wait tex_throttle "
              "selected not_selected").split()
]


def test_split_name():
    assert _catalog.split_name("smsp__inst_executed.avg.per_cycle_active") == (
        "smsp__inst_executed", ".avg.per_cycle_active")
    assert _catalog.split_name("TriageCompute.sm__throughput.avg.pct_of_peak_sustained_elapsed") == (
        "TriageCompute.sm__throughput", ".avg.pct_of_peak_sustained_elapsed")
    assert _catalog.split_name("gr__cycles_active") == ("gr__cycles_active", "")


@pytest.mark.parametrize("name", sorted(gs.metric_sets()))
def test_metric_sets_are_valid_and_passes_recorded(name):
    mset = gs.metric_set(name)
    assert _lists.resolve(name, "GH100", mset.kind) == list(mset.metrics)
    kind = "range" if mset.kind == "range" else "pm"
    availability = np.load(FIXTURES / f"gh100_counter_availability_{kind}.npy")
    passes = gs.count_passes(name, chip="GH100", kind=mset.kind, counter_availability=availability)
    recorded = mset.recorded_passes("GH100", "%d.%d" % _api.version())
    assert recorded is not None, f"record the pass count of {name} for this CUPTI: {passes}"
    assert passes == recorded
    if mset.kind == "sampling":
        assert passes == 1


def test_topdown_set_is_the_papers():
    # the paper's 21 metrics, then the aggregation weight and the duration (no extra pass)
    assert list(gs.metric_set("topdown").metrics) == PAPER_TOPDOWN + ["sm__cycles_elapsed.max", "gpu__time_duration.sum"]
    assert gs.count_passes(PAPER_TOPDOWN, chip="GH100", plan=False) == (
        7 if _api.version() == (13, 1) else gs.count_passes("topdown", chip="GH100", plan=False))
    # sessions collect it with the consistent pass plan: the durations and the instruction counts first
    assert gs.count_passes(PAPER_TOPDOWN, chip="GH100") == gs.count_passes("topdown", chip="GH100") == 7


def test_search_lists_real_metrics_with_descriptions():
    hits = gs.search_metrics("long_scoreboard", chip="GH100")
    names = [h.name for h in hits]
    assert "smsp__warp_issue_stalled_long_scoreboard_per_warp_active" in names
    assert all(h.description for h in hits)
    glob = gs.search_metrics("smsp__warp_issue_stalled_*_per_warp_active", chip="GH100")
    assert len(glob) >= 18


def test_describe_full_name_has_units():
    info = gs.describe_metric("smsp__warp_issue_stalled_long_scoreboard_per_warp_active.pct", chip="GH100")
    assert (info.metric_type, info.units, info.hw_unit) == ("RATIO", "percent", "smsp")
    assert gs.describe_metric("dram__bytes_read.sum.per_second", chip="GH100").units == "byte/second"
    assert gs.describe_metric("smsp__inst_executed.avg.per_cycle_active", chip="GH100").units == "instruction/cycle"


def test_unknown_metric_names_closest():
    with pytest.raises(UnknownMetricError) as info:
        gs.count_passes(["sm__cycle_elapsed.sum"], chip="GH100")
    assert "sm__cycles_elapsed" in info.value.suggestions
    assert isinstance(info.value, ValueError)
    assert "gpuscope metrics --chip GH100 --search" in str(info.value)


def test_counter_without_rollup():
    with pytest.raises(UnknownMetricError, match=r"needs a rollup: \.sum, \.avg, \.min or \.max") as info:
        _lists.resolve(["sm__cycles_elapsed"], "GH100")
    assert info.value.suggestions == ("sm__cycles_elapsed.sum",)


def test_bad_sub_metric_suggests():
    with pytest.raises(UnknownMetricError) as info:
        _lists.resolve(["dram__bytes_read.summ"], "GH100")
    assert "dram__bytes_read.sum" in info.value.suggestions


def test_metric_of_the_other_kind():
    with pytest.raises(UnknownMetricError, match="exists for range profiling"):
        _lists.resolve(["smsp__threads_launched.sum"], "GH100", "sampling")


def test_set_of_the_other_kind():
    with pytest.raises(ValueError, match="'pm-default' is for sampling"):
        _lists.resolve("pm-default", "GH100", "range")


@pytest.mark.parametrize("chip,hint", [("XX100", r"Closest: h100 \(GH100\)"), ("GB2O2", "Closest: GB202"),
                                       ("RTX 9999", r"Closest: rtx 5090 \(GB202\)")])
def test_bad_chip(chip, hint):
    with pytest.raises(UnsupportedChipError, match=hint):
        gs.list_metrics(chip=chip)


@pytest.mark.parametrize("chip", ["GH100", "gh100", "h100", "H200", "NVIDIA H100 80GB HBM3"[:11]])
def test_the_api_reads_chip_names_as_the_cli_does(chip):
    """Issue 37, item 7: one resolver for chip= and --chip (any case, product names)."""
    assert gs.count_passes("topdown", chip=chip) == gs.count_passes("topdown", chip="GH100")
    assert gs.list_metrics(chip=chip) == gs.list_metrics(chip="GH100")


def test_other_chip_and_sampling_lists():
    ga100 = gs.list_metrics(chip="GA100")
    assert "sm__cycles_elapsed" in ga100 and len(ga100) > 2000
    pm = gs.list_metrics(chip="GH100", kind="sampling", metric_type="counter")
    assert "gr__cycles_active" in pm
    full = gs.list_metrics(chip="GH100", metric_type="throughput", full=True)
    assert "sm__throughput.avg.pct_of_peak_sustained_elapsed" in full


def test_resolve_dedups_and_rejects_empty():
    assert _lists.resolve(["dram__bytes_read.sum", "dram__bytes_read.sum"], "GH100") == ["dram__bytes_read.sum"]
    with pytest.raises(ValueError, match="No metrics"):
        _lists.resolve([], "GH100")


def test_no_chip_without_gpu_says_pass_chip():
    from gpuscope.cupti import _lib
    from gpuscope.errors import NoGpuError

    if _lib.driver_available():
        pytest.skip("this machine has a driver")
    with pytest.raises(NoGpuError, match=r"chip= in Python, --chip on the command line\): GH100") as info:
        gs.list_metrics()
    assert "chip='GH100'" not in str(info.value)  # no Python syntax where the command line shows it


@pytest.mark.parametrize(
    "suffix, cupti_units, expected",
    [
        (".sum.per_second", "byte", "byte/second"),  # CUPTI 13.1: the numerator's unit
        (".sum.per_second", "byte/second", "byte/second"),  # CUPTI 13.0 on the H100 already says per second
        (".avg.per_cycle_active", "inst", "inst/cycle"),
        (".avg.per_cycle_active", "instruction/gpc_cycle", "instruction/cycle"),  # CUPTI 13.0: per cycle, as 13.1
        (".sum.per_second", "byte/second/second", "byte/second"),
        (".avg.pct_of_peak_sustained_elapsed", "cycle", "percent"),
        (".ratio", "", "ratio"),
        (".sum", "byte", "byte"),
        (".sum.peak_sustained", "byte", "byte/cycle"),  # the most per cycle, as ncu writes it
        (".sum.peak_sustained", "byte/cycle", "byte/cycle"),
        (".sum.peak_sustained_elapsed", "byte", "byte"),  # the most over the range's elapsed cycles: a count
    ],
)
def test_units_of(suffix, cupti_units, expected):
    assert _catalog.units_of(suffix, cupti_units) == expected


@pytest.mark.parametrize("words, expected", [
    (["a,b", "c"], ["a", "b", "c"]),
    (["regex:^(fma{1,2})$"], ["regex:^(fma{1,2})$"]),  # a regex is never split at its commas
    (["stream,regex:a{1,2}|b", "fma"], ["stream", "regex:a{1,2}|b", "fma"]),
    ([" , x ,"], ["x"]),
])
def test_split_list_keeps_a_regex_whole(words, expected):
    assert _lists.split_list(words) == expected


def test_count_passes_infers_the_kind_of_a_set_as_the_cli_does():
    assert gs.count_passes("pm-default", chip="GH100") == gs.count_passes("pm-default", chip="GH100",
                                                                          kind="sampling") == 1
    assert gs.count_passes("topdown", chip="GH100") == gs.count_passes("topdown", chip="GH100", kind="range")
