"""On a GPU: `gpuscope check`, the chip, counter availability, and pass counts against the offline host API."""

import json

import pytest

import gpuscope as gs
from gpuscope import cli
from gpuscope._gpu import device as _device
from gpuscope.cupti import profiler


@pytest.fixture(scope="module")
def availability():
    ctx = _device.PrimaryContext(0)
    profiler.initialize()
    try:
        yield profiler.chip_name(0), profiler.counter_availability(ctx.handle), profiler.pm_counter_availability(0)
    finally:
        profiler.deinitialize()
        ctx.close()


def test_check_reports_ready(capsys):
    code = cli.main(["check", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == cli.EXIT_OK, report
    assert report["counters_readable"] is True
    assert report["range_profiling"] == "SUPPORTED" and report["PM_sampling"] == "SUPPORTED"
    assert report["chip"] == gs.list_chips()[gs.list_chips().index(report["chip"])]


@pytest.mark.parametrize("name", sorted(gs.metric_sets()))
def test_device_availability_gives_offline_pass_counts(availability, name):
    chip, range_image, pm_image = availability
    mset = gs.metric_set(name)
    image = range_image if mset.kind == "range" else pm_image
    with_device = gs.count_passes(name, chip=chip, kind=mset.kind, counter_availability=image)
    offline = gs.count_passes(name, chip=chip, kind=mset.kind)
    assert with_device == offline
    from gpuscope.cupti import _api

    recorded = mset.recorded_passes(chip, "%d.%d" % _api.version())
    if recorded is not None:
        assert with_device == recorded


def test_default_chip_is_the_device(availability):
    chip = availability[0]
    assert gs.list_metrics()[:10] == gs.list_metrics(chip=chip)[:10]
