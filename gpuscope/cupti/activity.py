"""The CUPTI clock and kernel activity records (cupti_activity.h).

PM samples, activity records and gpuscope's user ranges are all stamped on this clock, so they line up.

Kernel records come from ``CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL`` (kernels are not serialised): each gives the
kernel's start and end on the GPU on the CUPTI clock. CUPTI asks for buffers and hands them back full through two
callbacks, registered once per process; each open :class:`KernelRecords` gets what arrives while it is open (several
may be open: PM sampling's ``kernels=True``, a range session naming the kernels of CUDA graph launches), all of it
or the records its filter on the correlation ID keeps. Only the leading fields of ``CUpti_ActivityKernel*`` are
read, up to ``graphId``, which every version from ``CUpti_ActivityKernel6`` to ``CUpti_ActivityKernel11`` (CUPTI 13.1)
lays out alike (the structs are packed; CUPTI 12.6 to 13.x deliver version 9 or later).

A kernel that a CUDA graph launch ran carries CUPTI's IDs of the graph and of its kernel node (``graphId``,
``graphNodeId``); a kernel launched on its own carries 0 in both.
"""

from __future__ import annotations

import ctypes
import os
import struct
import threading
from ctypes import CFUNCTYPE, POINTER, byref, c_size_t, c_uint8, c_uint32, c_uint64, c_void_p

import numpy as np

from gpuscope.cupti import _api
from gpuscope.cupti._api import Functions

__all__ = ["timestamp", "KernelRecords", "KernelRecord", "parse_kernel_records", "KERNEL_RECORD_FORMAT"]

CUPTI_ACTIVITY_KIND_KERNEL = 3
CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL = 10
CUPTI_ACTIVITY_FLAG_FLUSH_FORCED = 1
CUPTI_ERROR_MAX_LIMIT_REACHED = 12

#: Leading fields of CUpti_ActivityKernel6..11 (packed): kind (u32), cacheConfig (u8), sharedMemoryConfig (u8),
#: registersPerThread (u16), partitionedGlobalCacheRequested/Executed (u32 x2), start, end, completed (u64 x3),
#: deviceId, contextId, streamId (u32 x3), gridX..Z, blockX..Z (i32 x6), staticSharedMemory,
#: dynamicSharedMemory (i32 x2), localMemoryPerThread, localMemoryTotal, correlationId (u32 x3), gridId (i64),
#: name (const char*), reserved0 (void*), queued, submitted (u64 x2), launchType,
#: isSharedMemoryCarveoutRequested, sharedMemoryCarveoutRequested, padding (u8 x4), sharedMemoryExecuted (u32),
#: graphNodeId (u64, at byte 144), shmemLimitConfig (enum, u32), graphId (u32, at byte 156): 160 bytes.
KERNEL_RECORD_FORMAT = struct.Struct("<IBBHIIQQQIII6iiiIIIqQQQQBBBBIQII")
(_KIND, _START, _END, _DEVICE, _CONTEXT, _STREAM, _GRID, _BLOCK, _REGISTERS, _CORRELATION, _NAME, _GRAPH_NODE,
 _GRAPH) = (0, 6, 7, 9, 10, 11, slice(12, 15), slice(15, 18), 3, 22, 24, 33, 35)

_BUFFER_BYTES = 4 << 20  # per buffer CUPTI asks for: ~15,000 kernel records

# void bufferRequested(uint8_t** buffer, size_t* size, size_t* maxNumRecords)
_REQUESTED = CFUNCTYPE(None, POINTER(POINTER(c_uint8)), POINTER(c_size_t), POINTER(c_size_t))
# void bufferCompleted(CUcontext ctx, uint32_t streamId, uint8_t* buffer, size_t size, size_t validSize)
_COMPLETED = CFUNCTYPE(None, c_void_p, c_uint32, POINTER(c_uint8), c_size_t, c_size_t)

_f = Functions(
    "cupti_activity.h",
    {
        # CUptiResult cuptiGetTimestamp(uint64_t* timestamp)
        "cuptiGetTimestamp": [POINTER(c_uint64)],
        # CUptiResult cuptiActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc funcBufferRequested,
        #                                            CUpti_BuffersCallbackCompleteFunc funcBufferCompleted)
        "cuptiActivityRegisterCallbacks": [_REQUESTED, _COMPLETED],
        # CUptiResult cuptiActivityEnable(CUpti_ActivityKind kind)
        "cuptiActivityEnable": [ctypes.c_int],
        # CUptiResult cuptiActivityDisable(CUpti_ActivityKind kind)
        "cuptiActivityDisable": [ctypes.c_int],
        # CUptiResult cuptiActivityFlushAll(uint32_t flag)
        "cuptiActivityFlushAll": [c_uint32],
        # CUptiResult cuptiActivityGetNextRecord(uint8_t* buffer, size_t validBufferSizeBytes, CUpti_Activity** record)
        "cuptiActivityGetNextRecord": [c_void_p, c_size_t, POINTER(c_void_p)],
        # CUptiResult cuptiActivityGetNumDroppedRecords(CUcontext context, uint32_t streamId, size_t* dropped)
        "cuptiActivityGetNumDroppedRecords": [c_void_p, c_uint32, POINTER(c_size_t)],
    },
    allowed={"cuptiActivityGetNextRecord": {CUPTI_ERROR_MAX_LIMIT_REACHED}},
)


def timestamp() -> int:
    """The current CUPTI timestamp in nanoseconds."""
    value = c_uint64(0)
    _f.cuptiGetTimestamp(byref(value))
    return value.value


# ---------------------------------------------------------------------------------------------------------------
# Kernel records


class KernelRecord(tuple):
    """One kernel execution: ``(name, start_ns, end_ns, device, context, stream, grid, block, registers,
    correlation, graph_id, graph_node_id)``; *name* is the symbol as the driver has it (mangled); *graph_id* and
    *graph_node_id* are CUPTI's IDs of the graph and kernel node that ran it, 0 for a kernel launched on its own."""

    __slots__ = ()
    FIELDS = ("name", "start_ns", "end_ns", "device", "context", "stream", "grid", "block", "registers",
              "correlation", "graph_id", "graph_node_id")


def parse_kernel_records(buffer, offsets, name_at=ctypes.string_at, keep=None) -> list[tuple]:
    """Kernel records at byte *offsets* of *buffer* (bytes-like), as :class:`KernelRecord` tuples; records of
    other kinds are skipped, and with *keep* (a predicate on the correlation ID) those it refuses, before their
    names are read. *name_at* reads the NUL-terminated name at an address (tests pass a fake)."""
    out = []
    names: dict[int, str] = {}  # one read per name address in a buffer: launches of one kernel share it
    for off in offsets:
        f = KERNEL_RECORD_FORMAT.unpack_from(buffer, off)
        if f[_KIND] not in (CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_KERNEL):
            continue
        if keep is not None and not keep(f[_CORRELATION]):
            continue
        address = f[_NAME]
        name = names.get(address)
        if name is None:
            name = names[address] = name_at(address).decode(errors="replace") if address else ""
        out.append(KernelRecord((name, f[_START], f[_END], f[_DEVICE], f[_CONTEXT], f[_STREAM], f[_GRID], f[_BLOCK],
                                 f[_REGISTERS], f[_CORRELATION], f[_GRAPH], f[_GRAPH_NODE])))
    return out


_lock = threading.Lock()  # the buffers (taken on CUPTI's threads)
_switch = threading.Lock()  # opening and closing KernelRecords (never taken on CUPTI's threads)
_registered: list = []  # [requested, completed]: CUPTI keeps calling them for the life of the process
_buffers: dict[int, np.ndarray] = {}  # address -> the array CUPTI is filling
_sinks: tuple = ()  # the open KernelRecords


def _aligned_buffer() -> tuple[int, np.ndarray]:
    raw = np.empty(_BUFFER_BYTES + 8, dtype=np.uint8)
    start = (-raw.ctypes.data) % 8  # CUPTI wants ACTIVITY_RECORD_ALIGNMENT (8)
    view = raw[start : start + _BUFFER_BYTES]
    return view.ctypes.data, view


@_REQUESTED
def _on_requested(buffer, size, max_records):
    address, view = _aligned_buffer()
    with _lock:
        _buffers[address] = view
    buffer[0] = ctypes.cast(address, POINTER(c_uint8))
    size[0] = _BUFFER_BYTES
    max_records[0] = 0


@_COMPLETED
def _on_completed(context, stream, buffer, size, valid):
    address = ctypes.cast(buffer, c_void_p).value or 0
    with _lock:
        view = _buffers.pop(address, None)
    sinks = _sinks
    if view is None or not sinks or not valid:
        return
    try:
        offsets = []
        record = c_void_p(None)
        while _f.cuptiActivityGetNextRecord(address, valid, byref(record)) == 0:
            offsets.append(record.value - address)
        keeps = [sink.keep for sink in sinks]
        keep = None if None in keeps else (lambda c: any(k(c) for k in keeps))
        records = parse_kernel_records(view, offsets, keep=keep)
        for sink in sinks:
            sink._add(records)
    except Exception as exc:  # never raise into CUPTI's thread: the sinks report it
        for sink in sinks:
            sink.errors.append(f"{type(exc).__name__}: {exc}")


def _forget_in_child() -> None:  # a forked child gets neither CUPTI's registration nor its buffers
    global _lock, _switch, _sinks
    _lock, _switch = threading.Lock(), threading.Lock()
    _sinks = ()
    _buffers.clear()
    _registered.clear()


os.register_at_fork(after_in_child=_forget_in_child)


def _before_detach() -> None:
    """Flush what CUPTI still holds before :func:`_api.detach` (refuses while records are collected)."""
    if _sinks:
        raise RuntimeError("kernel activity records are being collected (gpuscope.sample(kernels=True), or the "
                           "kernels of CUDA graph launches in a gpuscope.Profiler session)")
    if _registered:
        _f.cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED)


_retired_buffers: list = []  # buffers CUPTI held when it detached: never freed under it


def _after_detach() -> None:  # CUPTI forgot the buffer callbacks
    with _lock:
        _registered.clear()
        _retired_buffers.extend(_buffers.values())
        _buffers.clear()


_api.on_detach(_before_detach, _after_detach)


class KernelRecords:
    """Kernel executions on the GPU while open: :meth:`open` enables CUPTI's concurrent-kernel activity (while any
    is open), :meth:`close` flushes (and disables it, the last to close) and returns the records.

    Parameters
    ----------
    keep : callable, optional
        ``keep(correlation_id) -> bool``: only the records it accepts are kept (CUPTI gives a kernel the correlation
        ID of the launch call that ran it; all kernels of one ``cuGraphLaunch`` share that call's). Called on
        CUPTI's threads: it must be quick, thread-safe and must not raise. None keeps every record.
    """

    def __init__(self, keep=None):
        self.keep = keep
        self.records: list[KernelRecord] = []
        self.errors: list[str] = []
        self.dropped = 0
        self._open = False

    @property
    def closed(self) -> bool:
        return not self._open

    def _add(self, records) -> None:
        keep = self.keep
        self.records.extend(records if keep is None else [r for r in records if keep(r[9])])

    def open(self) -> None:
        """Enable CUPTI's concurrent-kernel activity, the first to open (a refusal leaves nothing changed)."""
        global _sinks
        with _switch:
            if self._open:
                return
            with _lock:
                if not _registered:
                    _f.cuptiActivityRegisterCallbacks(_on_requested, _on_completed)
                    _registered.extend([_on_requested, _on_completed])
            if not _sinks:
                _f.cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL)
            _sinks = (*_sinks, self)
            self._open = True

    def close(self) -> list[KernelRecord]:
        """Flush (the caller has synchronised the device: records of unfinished kernels come without times),
        disable if no other is open, and return the records sorted by start. Safe to call twice.

        A flush hands CUPTI's buffers to every open KernelRecords: another one's kernels still running then come
        without end times (counted as incomplete by PM sampling)."""
        global _sinks
        with _switch:
            if not self._open:
                return self.records
            self._open = False
            try:
                _f.cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED)
            finally:
                try:
                    if _sinks == (self,):
                        _f.cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL)
                        _f.cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED)  # what came between flush and disable
                    dropped = c_size_t(0)
                    _f.cuptiActivityGetNumDroppedRecords(None, 0, byref(dropped))
                    self.dropped = int(dropped.value)
                finally:
                    _sinks = tuple(s for s in _sinks if s is not self)
        self.records.sort(key=lambda r: r[1])
        return self.records
