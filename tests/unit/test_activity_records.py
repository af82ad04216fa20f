"""Kernel activity records (gpuscope.cupti.activity) without a GPU: the record layout against CUPTI's own header,
and the buffer plumbing with CUPTI's calls replaced, so what a flush hands back is parsed into executions."""

import ctypes
import re
from pathlib import Path

import numpy as np
import pytest

from gpuscope.cupti import activity

# The leading fields of CUpti_ActivityKernel6..11 as cupti_activity.h declares them (packed), up to graphId.
PREFIX = [
    ("kind", ctypes.c_uint32), ("cacheConfig", ctypes.c_uint8), ("sharedMemoryConfig", ctypes.c_uint8),
    ("registersPerThread", ctypes.c_uint16), ("partitionedGlobalCacheRequested", ctypes.c_uint32),
    ("partitionedGlobalCacheExecuted", ctypes.c_uint32), ("start", ctypes.c_uint64), ("end", ctypes.c_uint64),
    ("completed", ctypes.c_uint64), ("deviceId", ctypes.c_uint32), ("contextId", ctypes.c_uint32),
    ("streamId", ctypes.c_uint32), ("gridX", ctypes.c_int32), ("gridY", ctypes.c_int32), ("gridZ", ctypes.c_int32),
    ("blockX", ctypes.c_int32), ("blockY", ctypes.c_int32), ("blockZ", ctypes.c_int32),
    ("staticSharedMemory", ctypes.c_int32), ("dynamicSharedMemory", ctypes.c_int32),
    ("localMemoryPerThread", ctypes.c_uint32), ("localMemoryTotal", ctypes.c_uint32),
    ("correlationId", ctypes.c_uint32), ("gridId", ctypes.c_int64), ("name", ctypes.c_void_p),
    ("reserved0", ctypes.c_void_p), ("queued", ctypes.c_uint64), ("submitted", ctypes.c_uint64),
    ("launchType", ctypes.c_uint8), ("isSharedMemoryCarveoutRequested", ctypes.c_uint8),
    ("sharedMemoryCarveoutRequested", ctypes.c_uint8), ("padding", ctypes.c_uint8),
    ("sharedMemoryExecuted", ctypes.c_uint32), ("graphNodeId", ctypes.c_uint64),
    ("shmemLimitConfig", ctypes.c_uint32), ("graphId", ctypes.c_uint32),
]


class Kernel(ctypes.Structure):
    """A CUpti_ActivityKernel9 (CUPTI 12.x; 10 and 11 only add fields after it): the prefix gpuscope reads, then
    the fields it does not."""

    _pack_ = 1
    _fields_ = PREFIX + [("rest", ctypes.c_uint8 * 48)]  # pAccessPolicyWindow, channelID, ... (not read)


assert ctypes.sizeof(Kernel) == 208  # sizeof(CUpti_ActivityKernel9), measured with g++ against CUPTI 12.9's header
assert (Kernel.graphNodeId.offset, Kernel.graphId.offset, Kernel.correlationId.offset) == (144, 156, 92)  # idem


def _headers():
    import gpuscope

    roots = [Path(gpuscope.__file__).parents[1]]
    try:
        import nvidia

        roots += [Path(p) for p in nvidia.__path__]
    except ImportError:
        pass
    for root in roots:
        yield from root.glob("**/include/cupti_activity.h")
    yield from Path("/usr/local").glob("cuda*/include/cupti_activity.h")


def test_the_prefix_matches_every_kernel_record_in_cuptis_headers():
    header = next((h for h in _headers() if h.is_file()), None)
    if header is None:
        pytest.skip("no cupti_activity.h on this machine")
    text = "".join(re.sub(r"/\*.*?\*/", "", h.read_text(), flags=re.S)
                   for h in (header, header.with_name("cupti_activity_deprecated.h")) if h.is_file())
    versions = sorted({int(n) for n in re.findall(r"\} CUpti_ActivityKernel(\d+);", text)})
    assert versions and max(versions) >= 9, header
    for version in (v for v in versions if v >= 6):  # the first with graphId; CUPTI 12.6-13.x deliver 9 or later
        end = text.index(f"}} CUpti_ActivityKernel{version};")
        body = text[text.rindex("typedef struct PACKED_ALIGNMENT {", 0, end) : end].split("{", 1)[1]
        body = re.sub(r"union \{.*?\} cacheConfig;", "uint8_t cacheConfig;", body, flags=re.S)
        fields = re.findall(r"(\w+)\s*;", body)
        assert fields[: len(PREFIX)] == [name for name, _ in PREFIX], (header, version)
    assert ctypes.sizeof(Kernel) - 48 == activity.KERNEL_RECORD_FORMAT.size == 160


def _record(**values):
    rec = Kernel()
    for name, value in values.items():
        setattr(rec, name, value)
    return bytes(rec)


def test_records_are_parsed_field_by_field_and_other_kinds_skipped():
    names = {0x1000: b"_Z6streamPf", 0x2000: b"fma"}
    buf = (
        _record(kind=10, start=100, end=250, deviceId=1, contextId=7, streamId=13, gridX=64, gridY=2, gridZ=1,
                blockX=256, blockY=1, blockZ=1, registersPerThread=32, correlationId=99, name=0x1000,
                queued=90, submitted=95, sharedMemoryExecuted=1 << 16, shmemLimitConfig=1)
        + _record(kind=5, start=1, end=2, name=0x2000)  # a memcpy-like kind: not a kernel
        + _record(kind=3, start=300, end=400, correlationId=100, name=0x2000, graphId=3, graphNodeId=(1 << 40) + 7)
    )
    size = ctypes.sizeof(Kernel)
    got = activity.parse_kernel_records(buf, [0, size, 2 * size], name_at=names.__getitem__)
    assert len(got) == 2
    first = dict(zip(activity.KernelRecord.FIELDS, got[0]))
    assert first == {"name": "_Z6streamPf", "start_ns": 100, "end_ns": 250, "device": 1, "context": 7, "stream": 13,
                     "grid": (64, 2, 1), "block": (256, 1, 1), "registers": 32, "correlation": 99,
                     "graph_id": 0, "graph_node_id": 0}  # launched on its own
    second = dict(zip(activity.KernelRecord.FIELDS, got[1]))
    assert second["name"] == "fma" and (second["start_ns"], second["end_ns"]) == (300, 400)
    assert (second["graph_id"], second["graph_node_id"]) == (3, (1 << 40) + 7)  # a graph's kernel node


class FakeActivity:
    """CUPTI's activity calls: a forced flush hands every requested buffer back, filled with *records*."""

    def __init__(self, records):
        self.records, self.enabled, self.registered, self.dropped = records, [], 0, 3

    def cuptiActivityRegisterCallbacks(self, requested, completed):
        self.registered += 1
        self.completed = completed

    def cuptiActivityEnable(self, kind):
        self.enabled.append(kind)

    def cuptiActivityDisable(self, kind):
        self.enabled.remove(kind)

    def cuptiActivityFlushAll(self, flag):
        if not self.records:
            return
        size = ctypes.POINTER(ctypes.c_uint8)()
        nbytes, most = ctypes.c_size_t(), ctypes.c_size_t()
        activity._on_requested(ctypes.byref(size), ctypes.byref(nbytes), ctypes.byref(most))
        data = b"".join(self.records)
        ctypes.memmove(size, data, len(data))
        self.records = []
        self.completed(None, 0, size, nbytes.value, len(data))

    def cuptiActivityGetNextRecord(self, buffer, valid, record):
        step = ctypes.sizeof(Kernel)
        current = ctypes.cast(record, ctypes.POINTER(ctypes.c_void_p))[0]
        following = buffer if current is None else current + step
        if following + step > buffer + valid:
            return activity.CUPTI_ERROR_MAX_LIMIT_REACHED
        ctypes.cast(record, ctypes.POINTER(ctypes.c_void_p))[0] = following
        return 0

    def cuptiActivityGetNumDroppedRecords(self, context, stream, dropped):
        ctypes.cast(dropped, ctypes.POINTER(ctypes.c_size_t))[0] = self.dropped


def test_a_session_collects_the_flushed_records_sorted_and_counts_drops(monkeypatch):
    name = ctypes.create_string_buffer(b"_ZN8__main__6streamB2v1E")
    address = ctypes.addressof(name)
    fake = FakeActivity([_record(kind=10, start=s, end=s + 50, deviceId=0, correlationId=s, name=address)
                         for s in (500, 100, 300)])
    monkeypatch.setattr(activity, "_f", fake)
    monkeypatch.setattr(activity, "_registered", [])
    recs = activity.KernelRecords()
    recs.open()
    recs.open()  # twice is nothing more
    assert fake.enabled == [activity.CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL]
    out = recs.close()
    assert [r[1] for r in out] == [100, 300, 500] and {r[0] for r in out} == {"_ZN8__main__6streamB2v1E"}
    assert recs.dropped == 3 and recs.errors == [] and fake.enabled == []
    assert activity._sinks == () and activity._buffers == {}
    assert recs.close() is out  # twice is fine
    again = activity.KernelRecords()  # and the next one may open
    again.open()
    again.close()
    assert fake.registered == 1  # CUPTI's callbacks are registered once per process


def test_several_open_at_once_each_keep_what_their_filter_accepts(monkeypatch):
    """PM sampling's kernels=True and a range session naming graph kernels may be open together: CUPTI's activity
    is enabled once, each gets the records it keeps, the last to close disables it, and a name is read only for a
    record that someone keeps."""
    names = {}

    def kernel(start, correlation):
        buf = names.setdefault(correlation, ctypes.create_string_buffer(f"k{correlation}".encode()))
        return _record(kind=10, start=start, end=start + 10, correlationId=correlation, name=ctypes.addressof(buf))

    fake = FakeActivity([kernel(100, 7), kernel(200, 8), kernel(300, 7), kernel(400, 9)])
    monkeypatch.setattr(activity, "_f", fake)
    monkeypatch.setattr(activity, "_registered", [])
    everything = activity.KernelRecords()
    graphs = activity.KernelRecords(keep={7}.__contains__)
    everything.open()
    graphs.open()
    assert fake.enabled == [activity.CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL]  # once
    assert [r[9] for r in graphs.close()] == [7, 7]  # its flush hands the buffer to both
    assert fake.enabled == [activity.CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL]  # the other is still open
    assert [r[9] for r in everything.close()] == [7, 8, 7, 9] and fake.enabled == []
    assert activity._sinks == ()

    read = []
    only = activity.KernelRecords(keep={8}.__contains__)
    buf = b"".join([kernel(1, 7), kernel(2, 8)])
    size = ctypes.sizeof(Kernel)
    only._add(activity.parse_kernel_records(buf, [0, size], name_at=lambda a: read.append(a) or b"k8",
                                            keep=only.keep))
    assert [r[0] for r in only.records] == ["k8"] and len(read) == 1


def test_a_refused_enable_leaves_nothing_open(monkeypatch):
    fake = FakeActivity([])

    def refuse(kind):
        raise RuntimeError("CUPTI_ERROR_NOT_COMPATIBLE")

    fake.cuptiActivityEnable = refuse
    monkeypatch.setattr(activity, "_f", fake)
    monkeypatch.setattr(activity, "_registered", [])
    recs = activity.KernelRecords()
    with pytest.raises(RuntimeError, match="NOT_COMPATIBLE"):
        recs.open()
    assert activity._sinks == () and recs.close() == []


def test_executions_become_a_table_on_the_samples_clock(monkeypatch):
    import gpuscope as gs
    from gpuscope._results import build as _results

    ts = gs.open_dataset(Path(gs.__file__).parent / "data" / "demo_timeseries.nc")
    t0 = int(ts.attrs["session_start_ns"])
    records = [
        ("_ZN8__main__6streamB2v1E", t0 + 2000, t0 + 5000, 0, 1, 7, (1, 1, 1), (1, 1, 1), 16, 11),
        ("fma", t0 + 1000, t0 + 1500, 0, 1, 7, (1, 1, 1), (1, 1, 1), 16, 10),
        ("fma", t0 + 6000, 0, 0, 1, 7, (1, 1, 1), (1, 1, 1), 16, 12),  # flushed while running: no end
    ]
    with_exec = _results.with_executions(ts, {"records": records, "dropped": 2, "errors": [], "other_devices": 4})
    attrs = with_exec.attrs
    table = gs.kernel_executions(with_exec)
    assert table["kernel"].tolist() == ["fma", "stream"]  # as range results and PC samples name them
    assert table["kernel_qualname"].tolist() == ["fma", "__main__.stream"]
    assert table["start"].tolist() == [1000, 2000] and table["duration_ns"].tolist() == [500, 3000]
    assert table["correlation"].tolist() == [10, 11]
    assert attrs["kernel_records_incomplete"] == 1 and attrs["kernel_records_dropped"] == 2
    assert attrs["kernel_records_other_devices"] == 4
    with pytest.raises(ValueError, match="kernels=True"):
        gs.kernel_executions(ts)
    with pytest.raises(ValueError, match="PM sampling"):
        gs.kernel_executions(gs.open_dataset(Path(gs.__file__).parent / "data" / "demo_launches.nc"))


def test_the_execution_table_survives_a_netcdf_round_trip(tmp_path):
    import gpuscope as gs
    from gpuscope._results import build as _results

    ts = gs.open_dataset(Path(gs.__file__).parent / "data" / "demo_timeseries.nc")
    t0 = int(ts.attrs["session_start_ns"])
    one = [("fma", t0 + 1000, t0 + 1500, 0, 1, 7, (1, 1, 1), (1, 1, 1), 16, 10)]
    for records in (one, one * 3):
        with_exec = _results.with_executions(ts, {"records": records, "dropped": 0, "errors": []})
        gs.save_dataset(with_exec, tmp_path / "x.nc")
        back = gs.open_dataset(tmp_path / "x.nc")
        assert gs.kernel_executions(back).equals(gs.kernel_executions(with_exec))
        assert np.array_equal(back["start_ns"], ts["start_ns"])
