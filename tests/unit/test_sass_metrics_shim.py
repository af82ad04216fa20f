"""The SASS Metrics shim without a GPU: layouts against the header, struct sizes, and the flush path with CUPTI faked.

``data/cupti_sass_metrics_layouts.json`` is the output of ``tools/sass_metrics_layouts.cpp`` (g++ on
cupti_sass_metrics.h of CUPTI 12.9, 13.0 and 13.1: identical). The fakes stand where libcupti's functions are
bound, receive the same params structs, and write what the header says CUPTI writes.
"""

import ctypes
import json
from pathlib import Path

import numpy as np
import pytest

from gpuscope.cupti import sass_metrics as S
from gpuscope.errors import CuptiError, CuptiNotFoundError

LAYOUTS = json.loads((Path(__file__).parent / "data" / "cupti_sass_metrics_layouts.json").read_text())
VERSIONS = [(12, 6), (12, 9), (13, 0), (13, 1), (13, 5)]
_libc = ctypes.CDLL(None)
_libc.strdup.restype = ctypes.c_void_p
_libc.strdup.argtypes = [ctypes.c_char_p]


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_offsets_and_sizes_match_the_header(name):
    cls = getattr(S, name)
    expected = LAYOUTS[name]
    assert ctypes.sizeof(cls) == expected["sizeof"]
    assert [f[0] for f in cls._fields_] == [f[2] for f in expected["fields"]]
    for offset, size, field in expected["fields"]:
        assert (getattr(cls, field).offset, getattr(cls, field).size) == (offset, size), field


@pytest.mark.parametrize("name", sorted(n for n, v in LAYOUTS.items() if v["struct_size"] and n.endswith("Params")))
@pytest.mark.parametrize("version", VERSIONS, ids=lambda v: f"{v[0]}.{v[1]}")
def test_struct_size_is_the_headers_macro(name, version):
    assert getattr(S, name).struct_size(version) == LAYOUTS[name]["struct_size"]


def test_flush_struct_size_stops_before_the_data_pointer():
    # the header's macro ends at numOfInstances: 40, while pMetricsData ends at 48
    assert S.CUpti_SassMetricsFlushData_Params.struct_size((13, 1)) == 40
    assert S.CUpti_SassMetricsFlushData_Params.pMetricsData.offset == 40


def test_numpy_views_have_the_struct_layouts():
    for dtype, cls in ((S.RECORD_DTYPE, S.CUpti_SassMetrics_Data), (S.VALUE_DTYPE, S.CUpti_SassMetrics_InstanceValue)):
        assert dtype.itemsize == ctypes.sizeof(cls)
        for name in dtype.names:
            assert dtype.fields[name][1] == getattr(cls, name).offset, name
            assert dtype.fields[name][0].itemsize == getattr(cls, name).size, name
    assert S.DATA_STRUCT_SIZE == 48


class _Fake:
    """Stands in for bound CUPTI functions: ``install(name, fn)`` makes ``fn(params)`` the call's body."""

    def __init__(self, monkeypatch):
        self.monkeypatch = monkeypatch
        self.calls = []

    def install(self, name, body, status=0):
        def fn(p):
            self.calls.append((name, p.structSize))
            body(p)
            return status

        self.monkeypatch.setattr(S._f._bound[name], "_fn", fn)


@pytest.fixture
def fake(monkeypatch):
    return _Fake(monkeypatch)


def _write_records(rows, slots_written):
    """A FlushData body writing *rows* (crc, name, pc, [(metric id, value), ...]) as CUPTI would."""

    def body(p):
        assert p.numOfPatchedInstructionRecords == len(rows)
        for i, (crc, name, pc, values) in enumerate(rows):
            rec = p.pMetricsData[i]
            rec.cubinCrc, rec.pcOffset, rec.functionIndex = crc, pc, 3
            rec.functionName = _libc.strdup(name.encode())
            for j, (metric_id, value) in enumerate(values[:slots_written]):
                rec.pInstanceValues[j].metricId = metric_id
                rec.pInstanceValues[j].value = value

    return body


def test_flush_copies_written_slots_and_frees_names_once(fake, monkeypatch):
    freed = []
    real_free = S._libc.free

    class Libc:
        @staticmethod
        def free(address):
            freed.append(address)
            real_free(address)

    monkeypatch.setattr(S, "_libc", Libc)
    rows = [(0xDEADBEEF, "_Z1kv", 16, [(7, 64), (9, 2048)]), (0xDEADBEEF, "_Z1kv", 32, [(7, 64), (9, 1024)])]
    fake.install("cuptiSassMetricsFlushData", _write_records(rows, slots_written=2))
    rec = S.flush(ctx=1, num_records=2, num_instances=1, slots_per_record=3)
    assert fake.calls == [("cuptiSassMetricsFlushData", 40)]
    assert rec.pc_offset.tolist() == [16, 16, 32, 32]  # the third slot of each record was never written
    assert rec.metric_id.tolist() == [7, 9, 7, 9]
    assert rec.value.tolist() == [64, 2048, 64, 1024]
    assert rec.cubin_crc.tolist() == [0xDEADBEEF] * 4 and rec.function.tolist() == ["_Z1kv"] * 4
    assert len(freed) == 2 and len(set(freed)) == 2  # two records, two allocations, each freed once


def test_flush_of_nothing_calls_nothing(fake):
    assert S.flush(ctx=1, num_records=0, num_instances=1).value.size == 0
    assert fake.calls == []


def test_a_failed_flush_raises_with_cupti_s_name(fake):
    fake.install("cuptiSassMetricsFlushData", lambda p: None, status=7)
    with pytest.raises(CuptiError, match="cuptiSassMetricsFlushData"):
        S.flush(ctx=1, num_records=1, num_instances=1)


def test_metric_list_and_properties(fake):
    names = [b"smsp__sass_inst_executed", b"smsp__sass_thread_inst_executed"]
    keep = [ctypes.c_char_p(n) for n in names] + [ctypes.c_char_p(b"warp-level executions")]

    def count(p):
        assert p.pChipName == b"GH100"
        p.numOfMetrics = 2

    def fill(p):
        for i in range(p.numOfMetrics):
            p.pMetricsList[i].metricId = 100 + i
            p.pMetricsList[i].pMetricName = keep[i].value
            p.pMetricsList[i].pMetricDescription = keep[2].value

    def props(p):
        p.metric.metricId = 100 if p.pMetricName == names[0] else 0
        p.metric.pMetricDescription = keep[2].value

    fake.install("cuptiSassMetricsGetNumOfMetrics", count)
    fake.install("cuptiSassMetricsGetMetrics", fill)
    fake.install("cuptiSassMetricsGetProperties", props)
    listed = S.metrics("GH100")
    assert [(m.metric_id, m.name) for m in listed] == [(100, names[0].decode()), (101, names[1].decode())]
    one = S.properties("GH100", "smsp__sass_inst_executed")
    assert (one.metric_id, one.name, one.description) == (100, "smsp__sass_inst_executed", "warp-level executions")
    assert [c[1] for c in fake.calls] == [32, 40, 56]


def test_set_config_enable_disable_pass_what_they_are_given(fake):
    seen = {}

    def set_config(p):
        seen["configs"] = [(p.pConfigs[i].metricId, p.pConfigs[i].outputGranularity)
                           for i in range(p.numOfMetricConfig)]
        seen["device"] = p.deviceIndex

    fake.install("cuptiSassMetricsSetConfig", set_config)
    fake.install("cuptiSassMetricsEnable", lambda p: seen.update(lazy=p.enableLazyPatching, ctx=p.ctx))
    fake.install("cuptiSassMetricsDisable", lambda p: setattr(p, "numOfDroppedRecords", 12))

    def props(p):
        p.numOfPatchedInstructionRecords, p.numOfInstances = 5, 1

    fake.install("cuptiSassMetricsGetDataProperties", props)
    S.set_config(2, [11, 12])
    S.enable(0x1234, lazy_patching=True)
    assert S.data_properties(0x1234) == (5, 1)
    assert S.disable(0x1234) == 12
    assert seen == {"configs": [(11, 0), (12, 0)], "device": 2, "lazy": 1, "ctx": 0x1234}
    assert [c[1] for c in fake.calls] == [36, 25, 40, 32]  # the header's STRUCT_SIZEs


def test_a_cupti_without_the_api_says_which_version_has_it(monkeypatch):
    bound = S._f._bound["cuptiSassMetricsEnable"]
    monkeypatch.setattr(bound, "_fn", None)
    monkeypatch.setattr(bound, "name", "cuptiSassMetricsEnable_not_exported")
    with pytest.raises(CuptiNotFoundError, match=r"needs CUPTI 12\.6"):
        S.enable(1)


def test_records_round_trip_through_a_dict():
    rec = S.SassRecords(np.array([5], np.uint64), np.array([1], np.uint32), np.array(["k"]), np.array([16], np.uint64),
                        np.array([7], np.uint64), np.array([64], np.uint64), dropped_records=3)
    back = S.SassRecords.from_dict(rec.to_dict())
    assert back.value.tolist() == [64] and back.dropped_records == 3 and back.function.tolist() == ["k"]
    both = S.SassRecords.concat([rec, back])
    assert both.pc_offset.tolist() == [16, 16] and both.dropped_records == 6
