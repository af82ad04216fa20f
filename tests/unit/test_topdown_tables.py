"""Each Top-Down architecture table asks only for metrics that real chips of that architecture have (CUPTI host API)."""

import pytest

import gpuscope as gs
from gpuscope._gpu import metric_lists as _lists
from gpuscope.metrics import topdown as td

# One chip per table and compute capability, as CUPTI names them.
CHIPS = [("TU102", "7.5"), ("GA100", "8.0"), ("AD102", "8.9"), ("GH100", "9.0"), ("GB100", "10.0"), ("GB202", "12.0")]


@pytest.mark.parametrize("chip,cc", CHIPS)
def test_required_metrics_exist_on_chip(chip, cc):
    metrics = td.required_metrics(cc)
    assert _lists.resolve(metrics, chip, "range") == list(metrics)
    assert gs.count_passes(metrics, chip=chip, plan=False) <= 8
    # sessions collect it with the consistent pass plan: one or two passes more (docs/topdown.md)
    assert gs.count_passes(metrics, chip=chip) <= gs.count_passes(metrics, chip=chip, plan=False) + 2


def test_hopper_optional_gmma_exists_and_costs_one_pass():
    with_gmma = td.required_metrics("9.0", optional=True)
    assert td.stall_metric("gmma") in with_gmma
    assert gs.count_passes(with_gmma, chip="GH100") == gs.count_passes("topdown", chip="GH100") + 1


def test_blackwell_has_no_imc_miss():
    with pytest.raises(gs.UnknownMetricError):
        _lists.resolve([td.stall_metric("imc_miss")], "GB100")
    assert td.stall_metric("imc_miss") not in td.required_metrics("10.0")
