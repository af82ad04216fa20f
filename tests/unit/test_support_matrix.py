"""Every chip the loaded CUPTI lists x every built-in set: resolve, count passes, build the config image; and each
chip's warp stall reasons against its Top-Down table (CUPTI host API, no GPU).

The same tests run against CUPTI 12.9 from the ``nvidia-cuda-cupti-cu12`` wheel (``test_cupti12_line``) when it
is installed, as the ``test`` extra does.
"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import gpuscope as gs
from gpuscope import cli
from gpuscope._gpu import catalog as _catalog
from gpuscope._gpu import metric_lists as _lists
from gpuscope._gpu import support as _support
from gpuscope.cupti import host
from gpuscope.errors import UnsupportedChipError
from gpuscope.metrics import architectures as arch
from gpuscope.metrics import topdown as td

CHIPS = gs.list_chips()
SETS = sorted(gs.metric_sets())
STALL_PREFIX, STALL_SUFFIX = "smsp__warp_issue_stalled_", "_per_warp_active"


def _profilable(chip: str, kind: str) -> bool:
    try:
        _catalog._chip_metrics(chip, _catalog.MetricKind(kind))
        return True
    except UnsupportedChipError:  # CUPTI 12.x lists a few chips it cannot profile (GV11B; GV100 for PM sampling)
        return False


def _stall_reasons(chip: str, kind: str) -> set[str]:
    names = _catalog.list_metrics(chip, kind)
    return {n[len(STALL_PREFIX):-len(STALL_SUFFIX)] for n in names if n.startswith(STALL_PREFIX)
            and n.endswith(STALL_SUFFIX)}


@pytest.mark.parametrize("name", SETS)
@pytest.mark.parametrize("chip", CHIPS)
def test_every_set_resolves_on_every_chip(chip, name):
    kind = gs.metric_set(name).kind
    if not _profilable(chip, kind):
        with pytest.raises(UnsupportedChipError, match="cannot profile"):
            _lists.resolve(name, chip, kind)
        return
    res = _lists.resolution(name, chip, kind)
    mset = gs.metric_set(name)
    # what the chip collects is the set, less what was left out, with substitutes in place
    assert set(res.left_out) | set(res.substituted) <= set(mset.metrics)
    assert [m for m in mset.metrics if m in res.metrics] == [m for m in mset.metrics
                                                             if m not in res.left_out and m not in res.substituted]
    for original, used in res.substituted.items():
        assert set(used) <= set(res.metrics) and original not in res.metrics
    assert _lists.resolve(list(res.metrics), chip, kind) == list(res.metrics)  # every name is the chip's own
    image = _lists.config_image(list(res.metrics), chip, kind)
    assert len(image) > 0
    passes = host.num_passes(image)
    assert passes >= 1
    if kind == "sampling":
        assert passes == 1, f"{name} needs {passes} passes on {chip}: PM sampling collects one"
    attrs = res.attrs()
    assert bool(attrs) == (not res.complete)
    assert all(isinstance(v, list) and all(isinstance(x, str) for x in v) for v in attrs.values())


@pytest.mark.parametrize("chip", CHIPS)
def test_every_chip_has_a_topdown_table(chip):
    table = arch.for_chip(chip)
    assert chip in table.chips and table.ipc_max == table.smsp_per_sm == 4
    assert arch.architecture(table.compute_capabilities[0]) is table


@pytest.mark.parametrize("kind", ["range", "sampling"])
@pytest.mark.parametrize("chip", CHIPS)
def test_stall_reasons_match_the_table(chip, kind):
    if not _profilable(chip, kind):
        pytest.skip(f"this CUPTI cannot profile {chip} for {kind}")
    table = arch.for_chip(chip)
    listed = _stall_reasons(chip, kind)
    taken = set(table.stall_reasons) | set(table.optional_stall_reasons) | set(table.sub_reasons) | set(arch.NOT_STALLS)
    assert not listed - taken, f"{chip} lists stall reasons no Top-Down node takes: {sorted(listed - taken)}"
    expected = set(table.stall_reasons) | set(table.optional_stall_reasons) | set(arch.NOT_STALLS)
    assert not expected - listed, f"the {table.name} table expects reasons {chip} lacks: {sorted(expected - listed)}"
    for reason in listed - set(arch.NOT_STALLS):
        assert td._BY_NAME[table.node_of(reason)].level == 3


@pytest.mark.parametrize("chip", CHIPS)
def test_topdown_set_on_chip_is_its_tables(chip):
    if not _profilable(chip, "range"):
        pytest.skip(f"this CUPTI cannot profile {chip}")
    table = arch.for_chip(chip)
    names = _lists.resolve("topdown", chip)
    assert set(td.required_metrics(chip)) <= set(names)
    stalls = {n for n in names if n.startswith(STALL_PREFIX)}
    assert stalls == {arch.stall_metric(r) for r in (*table.stall_reasons, *arch.NOT_STALLS)}


def _synthetic(table: arch.Architecture, n: int = 6, seed: int = 0) -> xr.Dataset:
    """Counter values of *n* ranges as the chip's topdown set collects them, warp states summing to 100%."""
    rng = np.random.default_rng(seed)
    chip = table.chips[0]
    data = {
        td.IPC_EXECUTED: rng.uniform(0.05, 0.9, n),
        td.THREADS_PER_INST: rng.uniform(4, 32, n),
    }
    data[td.IPC_ISSUED] = data[td.IPC_EXECUTED] * rng.uniform(1.0, 1.1, n)
    states = (*table.stall_reasons, *arch.NOT_STALLS)
    pct = rng.dirichlet(np.ones(len(states)), n) * 100
    for i, reason in enumerate(states):
        data[arch.stall_metric(reason)] = pct[:, i]
    data["sm__cycles_elapsed.max"] = rng.uniform(1e4, 1e6, n)
    ds = xr.Dataset({k: ("range", v) for k, v in data.items()})
    ds.attrs.update(chip=chip, compute_capability="%d.%d" % table.compute_capabilities[0])
    return ds


@pytest.mark.parametrize("table", arch.ARCHITECTURES, ids=lambda a: a.name)
def test_every_family_topdown_sums_to_ipc_max(table):
    ds = _synthetic(table)
    out = td.topdown(ds, check="raise")
    assert out.attrs["topdown_architecture"] == table.name
    deviations = td.check_levels(out, tolerance=1e-9)
    assert max(deviations.values()) < 1e-9
    leaves = {n for n in out.data_vars if td._BY_NAME[n].level == 3 and td._BY_NAME[n].parent.startswith(
        ("frontend", "backend"))}
    assert leaves == {table.node_of(r) for r in table.stall_reasons}
    # the chip's name is enough, and wins over the compute capability
    xr.testing.assert_allclose(td.topdown(ds.assign_attrs(compute_capability="1.0")).retire, out.retire)


@pytest.mark.parametrize("chip", ["GH100", "GB202", "GA10B", "TU116"])
def test_chip_support_says_what_changed(chip):
    if chip not in CHIPS:
        pytest.skip(f"this CUPTI does not list {chip}")
    info = _support.chip_support(chip.lower())
    assert info.chip == chip and info.ipc_max == 4.0
    statuses = {s.name: s.status for s in info.sets}
    assert set(statuses) == set(SETS)
    assert bool(info.hardware) == (chip == "GH100")
    text = _support.format_support(info)
    assert ("verified: on hardware" in text) == (chip == "GH100")
    if chip == "GH100":
        assert set(statuses.values()) == {"complete"}
    if chip == "GB202":
        assert statuses["topdown"] == "reduced" and "imc_miss" in text
        assert "dram__bytes_read.sum -> dram__bytes_op_read.sum" in text


@pytest.mark.parametrize("name", SETS)
@pytest.mark.parametrize("chip", CHIPS)
def test_a_substitute_in_other_units_is_named(chip, name):
    """Issue 37, item 14: a set gives the same quantity on every chip, or its Dataset attrs and ``gpuscope metrics
    --sets`` say which metric became another quantity (B200's PCIe bytes per second, percent of peak there)."""
    kind = gs.metric_set(name).kind
    if not _profilable(chip, kind):
        return
    res = _lists.resolution(name, chip, kind)
    reference = _catalog._chip_metrics("GH100", _catalog.MetricKind(kind))
    here = _catalog._chip_metrics(chip, _catalog.MetricKind(kind))
    assert set(res.units_changed) <= set(res.substituted)
    for original, group in res.substituted.items():
        before, after = reference.info(original).units, {here.info(m).units for m in group}
        if original in res.units_changed:
            assert res.units_changed[original] == (before, ", ".join(sorted(after))) and after != {before}
        else:  # the same unit (Blackwell's syslts__ sectors are lts__ sectors of the system-memory slices)
            assert {u.removeprefix("sys") for u in after} == {before}
    attrs = res.attrs()
    assert len(attrs.get("metric_set_units_changed", [])) == len(res.units_changed)
    support = next(st for st in _support.chip_support(chip).sets if st.name == name)
    assert support.units_changed == res.units_changed
    for original in res.units_changed:
        before, after = res.units_changed[original]
        assert f"({before}) -> " in attrs["metric_set_units_changed"][list(res.units_changed).index(original)]
        assert support.substitution(original).endswith(f"(another quantity: {before} -> {after})")


@pytest.mark.parametrize("chip", ["GB100", "GB102", "GB110", "GB112"])
def test_pcie_traffic_of_pm_default_on_b200_is_marked_as_percent(chip, capsys):
    if chip not in CHIPS:
        pytest.skip(f"this CUPTI does not list {chip}")
    res = _lists.resolution("pm-default", chip, "sampling")
    throughput = "pcie__throughput.avg.pct_of_peak_sustained_elapsed"
    assert res.units_changed == {f"pcie__{d}_bytes.sum.per_second": ("byte/second", "percent")
                                 for d in ("read", "write")}
    assert res.attrs()["metric_set_units_changed"] == [
        f"pcie__{d}_bytes.sum.per_second (byte/second) -> {throughput} (percent)" for d in ("read", "write")]
    assert cli.main(["metrics", "--sets", "--chip", chip]) == 0
    out = capsys.readouterr().out
    assert (f"  substituted: pcie__read_bytes.sum.per_second -> {throughput} (another quantity: byte/second -> "
            f"percent)") in out
    assert not _lists.resolution("pm-default", "GH100", "sampling").units_changed  # where the set was verified


@pytest.mark.skipif(bool(os.environ.get("GPUSCOPE_CUPTI_LIB")), reason="runs inside the CUPTI 12 subprocess")
def test_cupti12_line():
    """The matrix and the stall-reason tables against CUPTI 12.9's host API (pip's nvidia-cuda-cupti-cu12)."""
    import importlib.util

    spec = importlib.util.find_spec("nvidia")
    libs = [Path(p) / "cuda_cupti" / "lib" / "libcupti.so.12" for p in (spec.submodule_search_locations or [])] \
        if spec else []
    lib = next((p for p in libs if p.exists()), None)
    if lib is None:
        pytest.skip("nvidia-cuda-cupti-cu12 is not installed (the test extra installs it)")
    env = dict(os.environ, GPUSCOPE_CUPTI_LIB=str(lib))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", __file__],
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout
