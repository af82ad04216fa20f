"""The CUPTI clock and kernel activity records (cupti_activity.h).

PM samples, activity records and gpuscope's user ranges are all stamped on this clock, so they line up.

Kernel records come from ``CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL`` (kernels are not serialised): each gives the
kernel's start and end on the GPU on the CUPTI clock. CUPTI asks for buffers and hands them back full through two
callbacks, registered once per process; :class:`KernelRecords` owns what arrives while it is open. Only the
leading fields of ``CUpti_ActivityKernel*`` are read, which every version from ``CUpti_ActivityKernel4`` (CUDA
9) to ``CUpti_ActivityKernel10`` (CUPTI 13) lays out alike (the structs are packed).
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

#: Leading fields of CUpti_ActivityKernel4..10 (packed): kind (u32), cacheConfig (u8), sharedMemoryConfig (u8),
#: registersPerThread (u16), partitionedGlobalCacheRequested/Executed (u32 x2), start, end, completed (u64 x3),
#: deviceId, contextId, streamId (u32 x3), gridX..Z, blockX..Z (i32 x6), staticSharedMemory,
#: dynamicSharedMemory (i32 x2), localMemoryPerThread, localMemoryTotal, correlationId (u32 x3), gridId (i64),
#: name (const char*).
KERNEL_RECORD_FORMAT = struct.Struct("<IBBHIIQQQIII6iiiIIIqQ")
_KIND, _START, _END, _DEVICE, _CONTEXT, _STREAM, _GRID, _BLOCK, _REGISTERS, _CORRELATION, _NAME = (
    0, 6, 7, 9, 10, 11, slice(12, 15), slice(15, 18), 3, 22, 24)

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
    correlation)``; *name* is the symbol as the driver has it (mangled)."""

    __slots__ = ()
    FIELDS = ("name", "start_ns", "end_ns", "device", "context", "stream", "grid", "block", "registers",
              "correlation")


def parse_kernel_records(buffer, offsets, name_at=ctypes.string_at) -> list[tuple]:
    """Kernel records at byte *offsets* of *buffer* (bytes-like), as :class:`KernelRecord` tuples; records of
    other kinds are skipped. *name_at* reads the NUL-terminated name at an address (tests pass a fake)."""
    out = []
    names: dict[int, str] = {}  # one read per name address in a buffer: launches of one kernel share it
    for off in offsets:
        f = KERNEL_RECORD_FORMAT.unpack_from(buffer, off)
        if f[_KIND] not in (CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, CUPTI_ACTIVITY_KIND_KERNEL):
            continue
        address = f[_NAME]
        name = names.get(address)
        if name is None:
            name = names[address] = name_at(address).decode(errors="replace") if address else ""
        out.append(KernelRecord((name, f[_START], f[_END], f[_DEVICE], f[_CONTEXT], f[_STREAM], f[_GRID], f[_BLOCK],
                                 f[_REGISTERS], f[_CORRELATION])))
    return out


_lock = threading.Lock()
_registered: list = []  # [requested, completed]: CUPTI keeps calling them for the life of the process
_buffers: dict[int, np.ndarray] = {}  # address -> the array CUPTI is filling
_sink = None  # the open KernelRecords


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
    sink = _sink
    if view is None or sink is None or not valid:
        return
    try:
        offsets = []
        record = c_void_p(None)
        while _f.cuptiActivityGetNextRecord(address, valid, byref(record)) == 0:
            offsets.append(record.value - address)
        sink._add(parse_kernel_records(view, offsets))
    except Exception as exc:  # never raise into CUPTI's thread: the sink reports it
        sink.errors.append(f"{type(exc).__name__}: {exc}")


def _forget_in_child() -> None:  # a forked child gets neither CUPTI's registration nor its buffers
    global _lock, _sink
    _lock = threading.Lock()
    _sink = None
    _buffers.clear()
    _registered.clear()


os.register_at_fork(after_in_child=_forget_in_child)


def _before_detach() -> None:
    """Flush what CUPTI still holds before :func:`_api.detach` (refuses while records are collected)."""
    if _sink is not None:
        raise RuntimeError("kernel activity records are being collected (gpuscope.sample(kernels=True))")
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
    """Kernel executions on the GPU while open: :meth:`open` enables CUPTI's concurrent-kernel activity,
    :meth:`close` flushes and disables it and returns the records. One at a time in a process."""

    def __init__(self):
        self.records: list[KernelRecord] = []
        self.errors: list[str] = []
        self.dropped = 0
        self._open = False

    def _add(self, records) -> None:
        self.records.extend(records)

    def open(self) -> None:
        global _sink
        with _lock:
            if _sink is not None:
                from gpuscope.errors import SessionConflictError

                raise SessionConflictError("kernel activity records are already being collected in this process")
            if not _registered:
                _f.cuptiActivityRegisterCallbacks(_on_requested, _on_completed)
                _registered.extend([_on_requested, _on_completed])
            _sink = self
        try:
            _f.cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL)
        except BaseException:
            _sink = None
            raise
        self._open = True

    def close(self) -> list[KernelRecord]:
        """Flush (the caller has synchronised the device: records of unfinished kernels come without times),
        disable, and return the records sorted by start. Safe to call twice."""
        global _sink
        if not self._open:
            return self.records
        self._open = False
        try:
            _f.cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED)
        finally:
            try:
                _f.cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL)
                _f.cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED)  # what arrived between flush and disable
                dropped = c_size_t(0)
                _f.cuptiActivityGetNumDroppedRecords(None, 0, byref(dropped))
                self.dropped = int(dropped.value)
            finally:
                _sink = None
        self.records.sort(key=lambda r: r[1])
        return self.records
