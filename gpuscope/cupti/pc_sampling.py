"""The CUPTI PC Sampling API (cupti_pcsampling.h): warp stall reasons per PC, cubin CRC, SASS-to-source.

Call order (CUPTI user guide 2.10.6): ``enable(ctx)``, then ``set_attributes`` (the sampling-data buffer among
them), ``start``, work, ``stop``, then ``get_data`` until ``remaining_pcs == 0``, then ``disable``. Every call
takes the ``CUcontext`` as an integer. PC sampling can be enabled on one context per GPU at a time.

Memory: the PC records are written into a buffer the caller allocates (:class:`SamplingBuffer`). CUPTI keeps
the buffer's address, and the stall-reason index array's, past ``disable``: a ``cuptiFinalize`` later in the
process may still write there. So both come from pools that are never freed (:func:`lease_buffer`,
:func:`kept_indices`): a block takes a buffer and gives it back, and the next block of the same shape reuses it.
CUPTI keeps
each record's ``functionName`` (shared among records and reused across sessions: freeing it led to a double
free, so it is only read); the ``fileName``/``dirName`` of a SASS-to-source lookup are the caller's and are
freed at once.

CUPTI decodes the hardware buffer in worker threads that wake every WORKER_THREAD_PERIODIC_SLEEP_SPAN (default
100 ms): ``get_data`` right after the kernels finish may return nothing yet.

:func:`cubin_crc` and :func:`sass_to_source` read a cubin and need no GPU.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import threading
from ctypes import POINTER, c_char_p, c_size_t, c_void_p

import numpy as np

from gpuscope.cupti import _types as T
from gpuscope.cupti._api import Functions, params
from gpuscope.cupti._types import PCSamplingAttribute, PCSamplingCollectionMode, PCSamplingOutputDataFormat
from gpuscope.errors import CuptiError  # noqa: F401  (re-exported for callers)

__all__ = [
    "STALL_REASON_STRING_SIZE",
    "PCRecords",
    "SamplingBuffer",
    "enable",
    "disable",
    "start",
    "stop",
    "set_attributes",
    "get_attribute",
    "stall_reasons",
    "get_data",
    "cubin_crc",
    "sass_to_source",
    "SourceLocation",
    "PCSamplingAttribute",
    "PCSamplingCollectionMode",
    "PCSamplingOutputDataFormat",
]

#: ``CUPTI_STALL_REASON_STRING_SIZE``: the buffer each stall-reason name is written into.
STALL_REASON_STRING_SIZE = 128

_P = POINTER
_f = Functions(
    "cupti_pcsampling.h",
    {
        # CUptiResult cuptiPCSamplingEnable(CUpti_PCSamplingEnableParams *pParams)
        "cuptiPCSamplingEnable": [_P(T.CUpti_PCSamplingEnableParams)],
        # CUptiResult cuptiPCSamplingDisable(CUpti_PCSamplingDisableParams *pParams)
        "cuptiPCSamplingDisable": [_P(T.CUpti_PCSamplingDisableParams)],
        # CUptiResult cuptiPCSamplingStart(CUpti_PCSamplingStartParams *pParams)
        "cuptiPCSamplingStart": [_P(T.CUpti_PCSamplingStartParams)],
        # CUptiResult cuptiPCSamplingStop(CUpti_PCSamplingStopParams *pParams)
        "cuptiPCSamplingStop": [_P(T.CUpti_PCSamplingStopParams)],
        # CUptiResult cuptiPCSamplingGetData(CUpti_PCSamplingGetDataParams *pParams)
        "cuptiPCSamplingGetData": [_P(T.CUpti_PCSamplingGetDataParams)],
        # CUptiResult cuptiPCSamplingSetConfigurationAttribute(CUpti_PCSamplingConfigurationInfoParams *pParams)
        "cuptiPCSamplingSetConfigurationAttribute": [_P(T.CUpti_PCSamplingConfigurationInfoParams)],
        # CUptiResult cuptiPCSamplingGetConfigurationAttribute(CUpti_PCSamplingConfigurationInfoParams *pParams)
        "cuptiPCSamplingGetConfigurationAttribute": [_P(T.CUpti_PCSamplingConfigurationInfoParams)],
        # CUptiResult cuptiPCSamplingGetNumStallReasons(CUpti_PCSamplingGetNumStallReasonsParams *pParams)
        "cuptiPCSamplingGetNumStallReasons": [_P(T.CUpti_PCSamplingGetNumStallReasonsParams)],
        # CUptiResult cuptiPCSamplingGetStallReasons(CUpti_PCSamplingGetStallReasonsParams *pParams)
        "cuptiPCSamplingGetStallReasons": [_P(T.CUpti_PCSamplingGetStallReasonsParams)],
        # CUptiResult cuptiGetCubinCrc(CUpti_GetCubinCrcParams *pParams)
        "cuptiGetCubinCrc": [_P(T.CUpti_GetCubinCrcParams)],
        # CUptiResult cuptiGetSassToSourceCorrelation(CUpti_GetSassToSourceCorrelationParams *pParams)
        "cuptiGetSassToSourceCorrelation": [_P(T.CUpti_GetSassToSourceCorrelationParams)],
    },
)

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
_libc.free.argtypes = [c_void_p]
_libc.free.restype = None


def _take_string(address: int | None) -> str:
    """Copy a C string that CUPTI allocated, then ``free()`` it (the header says the caller owns it)."""
    if not address:
        return ""
    try:
        return ctypes.string_at(address).decode(errors="replace")
    finally:
        _libc.free(address)


def _ctx_params(cls, ctx: int):
    return params(cls, ctx=ctx)


def enable(ctx: int) -> None:
    """``cuptiPCSamplingEnable`` on a context."""
    _f.cuptiPCSamplingEnable(_ctx_params(T.CUpti_PCSamplingEnableParams, ctx))


def disable(ctx: int) -> None:
    """``cuptiPCSamplingDisable``: tears down sampling on the context (records left in CUPTI are discarded)."""
    _f.cuptiPCSamplingDisable(_ctx_params(T.CUpti_PCSamplingDisableParams, ctx))


def start(ctx: int) -> None:
    """``cuptiPCSamplingStart`` (needs ENABLE_START_STOP_CONTROL set)."""
    _f.cuptiPCSamplingStart(_ctx_params(T.CUpti_PCSamplingStartParams, ctx))


def stop(ctx: int) -> None:
    """``cuptiPCSamplingStop``; drain with :func:`get_data` afterwards."""
    _f.cuptiPCSamplingStop(_ctx_params(T.CUpti_PCSamplingStopParams, ctx))


_UNION_FIELD = {
    PCSamplingAttribute.SAMPLING_PERIOD: ("samplingPeriodData", "samplingPeriod"),
    PCSamplingAttribute.SCRATCH_BUFFER_SIZE: ("scratchBufferSizeData", "scratchBufferSize"),
    PCSamplingAttribute.HARDWARE_BUFFER_SIZE: ("hardwareBufferSizeData", "hardwareBufferSize"),
    PCSamplingAttribute.COLLECTION_MODE: ("collectionModeData", "collectionMode"),
    PCSamplingAttribute.ENABLE_START_STOP_CONTROL: ("enableStartStopControlData", "enableStartStopControl"),
    PCSamplingAttribute.OUTPUT_DATA_FORMAT: ("outputDataFormatData", "outputDataFormat"),
    PCSamplingAttribute.SAMPLING_DATA_BUFFER: ("samplingDataBufferData", "samplingDataBuffer"),
    PCSamplingAttribute.WORKER_THREAD_PERIODIC_SLEEP_SPAN: (
        "workerThreadPeriodicSleepSpanData",
        "workerThreadPeriodicSleepSpan",
    ),
}


def _config_info(attribute: PCSamplingAttribute, value) -> T.CUpti_PCSamplingConfigurationInfo:
    info = T.CUpti_PCSamplingConfigurationInfo(attributeType=int(attribute))
    if attribute == PCSamplingAttribute.STALL_REASON:
        indices = value  # a uint32 numpy array, kept alive by the caller
        info.attributeData.stallReasonData.stallReasonCount = indices.size
        info.attributeData.stallReasonData.pStallReasonIndex = indices.ctypes.data
        return info
    member, field = _UNION_FIELD[PCSamplingAttribute(attribute)]
    setattr(getattr(info.attributeData, member), field, int(value))
    return info


def set_attributes(ctx: int, attributes: list[tuple[PCSamplingAttribute, object]]) -> None:
    """``cuptiPCSamplingSetConfigurationAttribute`` with several attributes in one call.

    Values: ints for the scalar attributes, the buffer's address for SAMPLING_DATA_BUFFER, and a uint32 numpy
    array of stall-reason indices for STALL_REASON. When CUPTI rejects the call, the message names the
    attributes whose ``attributeStatus`` is not success.
    """
    infos = (T.CUpti_PCSamplingConfigurationInfo * len(attributes))(
        *[_config_info(PCSamplingAttribute(a), v) for a, v in attributes]
    )
    p = params(
        T.CUpti_PCSamplingConfigurationInfoParams,
        ctx=ctx,
        numAttributes=len(attributes),
        pPCSamplingConfigurationInfo=infos,
    )
    try:
        _f.cuptiPCSamplingSetConfigurationAttribute(p)
    except CuptiError as exc:
        bad = [
            f"{PCSamplingAttribute(a).name}={v if not isinstance(v, np.ndarray) else list(v)}"
            for (a, v), info in zip(attributes, infos)
            if info.attributeStatus != 0
        ]
        if bad:
            exc.args = (f"{exc.args[0]} [rejected: {', '.join(bad)}]",)
        raise


def get_attribute(ctx: int, attribute: PCSamplingAttribute) -> int:
    """``cuptiPCSamplingGetConfigurationAttribute`` for one scalar attribute."""
    info = T.CUpti_PCSamplingConfigurationInfo(attributeType=int(attribute))
    p = params(T.CUpti_PCSamplingConfigurationInfoParams, ctx=ctx, numAttributes=1, pPCSamplingConfigurationInfo=info)
    _f.cuptiPCSamplingGetConfigurationAttribute(p)
    member, field = _UNION_FIELD[PCSamplingAttribute(attribute)]
    return int(getattr(getattr(info.attributeData, member), field))


# Arrays and buffers whose addresses CUPTI was given; never freed (see the module docstring).
_INDICES: dict[bytes, np.ndarray] = {}
_FREE_BUFFERS: dict[tuple[int, int], list[SamplingBuffer]] = {}
_ALL_BUFFERS: list[SamplingBuffer] = []
_pool_lock = threading.Lock()


def kept_indices(indices) -> np.ndarray:
    """*indices* as a uint32 array that lives as long as the process (the STALL_REASON attribute's value)."""
    array = np.ascontiguousarray(indices, dtype=np.uint32)
    with _pool_lock:
        return _INDICES.setdefault(array.tobytes(), array)


def lease_buffer(num_pcs: int, num_stall_reasons: int) -> SamplingBuffer:
    """A free :class:`SamplingBuffer` of this shape, made if none is free; give it back with :func:`return_buffer`.

    Buffers are never freed: CUPTI may write into the last one it was given after PC sampling is disabled.
    """
    key = (int(num_pcs), int(num_stall_reasons))
    with _pool_lock:
        free = _FREE_BUFFERS.setdefault(key, [])
        if free:
            buffer = free.pop()
            buffer.reset()
            return buffer
        buffer = SamplingBuffer(*key)
        _ALL_BUFFERS.append(buffer)
        return buffer


def return_buffer(buffer: SamplingBuffer) -> None:
    """Give a leased buffer back for the next block of its shape (safe twice)."""
    buffer.release()
    with _pool_lock:
        free = _FREE_BUFFERS.setdefault((buffer.num_pcs, buffer.num_stall_reasons), [])
        if not any(b is buffer for b in free):
            free.append(buffer)


def stall_reasons(ctx: int) -> tuple[np.ndarray, list[str]]:
    """The device's stall reasons: (uint32 indices, CUPTI names such as ``smsp__pcsamp_warps_issue_stalled_wait``)."""
    count = c_size_t(0)
    _f.cuptiPCSamplingGetNumStallReasons(
        params(T.CUpti_PCSamplingGetNumStallReasonsParams, ctx=ctx, numStallReasons=ctypes.addressof(count))
    )
    n = count.value
    indices = np.zeros(n, dtype=np.uint32)
    names = [ctypes.create_string_buffer(STALL_REASON_STRING_SIZE) for _ in range(n)]
    name_ptrs = (c_char_p * n)(*[ctypes.cast(b, c_char_p) for b in names])
    _f.cuptiPCSamplingGetStallReasons(
        params(
            T.CUpti_PCSamplingGetStallReasonsParams,
            ctx=ctx,
            numStallReasons=n,
            stallReasonIndex=indices.ctypes.data,
            stallReasons=name_ptrs,
        )
    )
    return kept_indices(indices), [b.value.decode() for b in names]


# One row per (PC, stall reason) with samples > 0; arrays instead of objects so that large runs stay cheap.
_RECORD_FIELDS = ("cubin_crc", "pc_offset", "function_index", "correlation_id", "stall_reason_index", "samples")
_RECORD_DTYPES = (np.uint64, np.uint64, np.uint32, np.uint32, np.uint32, np.uint32)


@dataclasses.dataclass
class PCRecords:
    """PC samples as flat arrays: one row per (PC, stall reason) with samples, plus the buffer totals.

    ``function`` holds the (mangled) function name of each row. Rows from several :func:`get_data` calls are
    joined with :meth:`concat`; the same PC may appear more than once, and summing is the caller's business.
    """

    cubin_crc: np.ndarray
    pc_offset: np.ndarray
    function_index: np.ndarray
    correlation_id: np.ndarray
    stall_reason_index: np.ndarray
    samples: np.ndarray
    function: np.ndarray  # str
    total_samples: int = 0
    dropped_samples: int = 0
    non_user_kernel_samples: int = 0
    hardware_buffer_full: bool = False

    @classmethod
    def empty(cls) -> PCRecords:
        arrays = {k: np.zeros(0, dtype=d) for k, d in zip(_RECORD_FIELDS, _RECORD_DTYPES)}
        return cls(**arrays, function=np.zeros(0, dtype=str))

    @classmethod
    def concat(cls, parts: list[PCRecords]) -> PCRecords:
        if not parts:
            return cls.empty()
        arrays = {k: np.concatenate([getattr(p, k) for p in parts]) for k in (*_RECORD_FIELDS, "function")}
        return cls(
            **arrays,
            total_samples=sum(p.total_samples for p in parts),
            dropped_samples=sum(p.dropped_samples for p in parts),
            non_user_kernel_samples=sum(p.non_user_kernel_samples for p in parts),
            hardware_buffer_full=any(p.hardware_buffer_full for p in parts),
        )

    def to_dict(self) -> dict[str, np.ndarray]:
        """Arrays for ``np.savez`` (fixtures); :meth:`from_dict` reads them back."""
        out = {k: getattr(self, k) for k in (*_RECORD_FIELDS, "function")}
        out["totals"] = np.array(
            [self.total_samples, self.dropped_samples, self.non_user_kernel_samples, int(self.hardware_buffer_full)],
            dtype=np.uint64,
        )
        return out

    @classmethod
    def from_dict(cls, data) -> PCRecords:
        totals = [int(x) for x in data["totals"]]
        return cls(
            **{k: np.asarray(data[k]) for k in (*_RECORD_FIELDS, "function")},
            total_samples=totals[0],
            dropped_samples=totals[1],
            non_user_kernel_samples=totals[2],
            hardware_buffer_full=bool(totals[3]),
        )


class SamplingBuffer:
    """A ``CUpti_PCSamplingData`` with room for ``num_pcs`` PCs of ``num_stall_reasons`` reasons each.

    CUPTI writes into it at :func:`get_data` (and at disable, for records still pending); :meth:`take` copies
    the records out, frees the function names CUPTI allocated, and readies the buffer for the next call.
    """

    def __init__(self, num_pcs: int, num_stall_reasons: int):
        self.num_pcs = int(num_pcs)
        self.num_stall_reasons = int(num_stall_reasons)
        self._pcs = (T.CUpti_PCSamplingPCData * self.num_pcs)()
        self._reasons = (T.CUpti_PCSamplingStallReason * (self.num_pcs * self.num_stall_reasons))()
        base = ctypes.addressof(self._reasons)
        step = ctypes.sizeof(T.CUpti_PCSamplingStallReason) * self.num_stall_reasons
        for i, pc in enumerate(self._pcs):
            pc.size = ctypes.sizeof(T.CUpti_PCSamplingPCData)
            pc.stallReason = ctypes.cast(base + i * step, POINTER(T.CUpti_PCSamplingStallReason))
        self.data = T.CUpti_PCSamplingData(
            size=ctypes.sizeof(T.CUpti_PCSamplingData), collectNumPcs=self.num_pcs, pPcData=self._pcs
        )
        self._names: dict[int, str] = {}

    def _name(self, address: int | None) -> str:
        # CUPTI shares one functionName string among many records, and keeps handing out the same pointer in
        # later sessions of the process: freeing it at the end of one session crashed a later one with a double
        # free on the H100 (CUPTI 13.0), after names read back as garbage. So names are read, never freed.
        if not address:
            return ""
        if address not in self._names:
            self._names[address] = ctypes.string_at(address).decode(errors="replace")
        return self._names[address]

    def release(self) -> None:
        """Forget the function names read so far (CUPTI keeps ownership of them). Safe twice."""
        self._names.clear()

    def reset(self) -> None:
        """Empty the buffer for a new block: no records, no counts, no names."""
        d = self.data
        d.totalNumPcs = d.remainingNumPcs = 0
        d.totalSamples = d.droppedSamples = d.nonUsrKernelsTotalSamples = 0
        d.hardwareBufferFull = 0
        self._names.clear()

    @property
    def address(self) -> int:
        """Address of the ``CUpti_PCSamplingData`` (the SAMPLING_DATA_BUFFER attribute's value)."""
        return ctypes.addressof(self.data)

    @property
    def remaining_pcs(self) -> int:
        """PCs CUPTI still holds after the last fill (``remainingNumPcs``)."""
        return int(self.data.remainingNumPcs)

    def take(self) -> PCRecords:
        """The records CUPTI wrote since the last :meth:`take`, copied out; the buffer is emptied."""
        d = self.data
        n = int(d.totalNumPcs)
        rows: dict[str, list] = {k: [] for k in (*_RECORD_FIELDS, "function")}
        for i in range(n):
            pc = self._pcs[i]
            name = self._name(pc.functionName)
            for j in range(int(pc.stallReasonCount)):
                reason = pc.stallReason[j]
                if reason.samples == 0:
                    continue
                rows["cubin_crc"].append(pc.cubinCrc)
                rows["pc_offset"].append(pc.pcOffset)
                rows["function_index"].append(pc.functionIndex)
                rows["correlation_id"].append(pc.correlationId)
                rows["stall_reason_index"].append(reason.pcSamplingStallReasonIndex)
                rows["samples"].append(reason.samples)
                rows["function"].append(name)
        records = PCRecords(
            **{k: np.asarray(rows[k], dtype=dt) for k, dt in zip(_RECORD_FIELDS, _RECORD_DTYPES)},
            function=np.asarray(rows["function"], dtype=str),
            total_samples=int(d.totalSamples),
            dropped_samples=int(d.droppedSamples),
            non_user_kernel_samples=int(d.nonUsrKernelsTotalSamples),
            hardware_buffer_full=bool(d.hardwareBufferFull),
        )
        d.totalNumPcs = 0
        d.totalSamples = d.droppedSamples = d.nonUsrKernelsTotalSamples = 0
        d.hardwareBufferFull = 0
        return records


def get_data(ctx: int, buffer: SamplingBuffer) -> PCRecords:
    """``cuptiPCSamplingGetData`` into *buffer*, returning the records it brought (never synchronises)."""
    _f.cuptiPCSamplingGetData(params(T.CUpti_PCSamplingGetDataParams, ctx=ctx, pcSamplingData=buffer.address))
    return buffer.take()


def _as_bytes(cubin) -> bytes:
    data = bytes(cubin)
    if not data:
        raise ValueError("the cubin is empty")
    return data


def cubin_crc(cubin: bytes) -> int:
    """``cuptiGetCubinCrc``: the CRC that PC records carry in ``cubinCrc`` for this cubin. Needs no GPU."""
    data = _as_bytes(cubin)
    p = params(T.CUpti_GetCubinCrcParams, cubinSize=len(data), cubin=ctypes.cast(c_char_p(data), c_void_p))
    _f.cuptiGetCubinCrc(p)
    return int(p.cubinCrc)


@dataclasses.dataclass(frozen=True)
class SourceLocation:
    """Where a SASS instruction came from; ``line == 0`` and empty names when the cubin has no line info."""

    line: int
    file: str
    directory: str


def sass_to_source(cubin: bytes, function: str, pc_offset: int) -> SourceLocation:
    """``cuptiGetSassToSourceCorrelation`` for one PC of *function* (mangled name) in *cubin*. Needs no GPU.

    Raises
    ------
    CuptiError
        The cubin is invalid, or the function is not in it (CUPTI returns UNKNOWN for that).
    """
    data = _as_bytes(cubin)
    name = function.encode()
    p = params(
        T.CUpti_GetSassToSourceCorrelationParams,
        cubin=ctypes.cast(c_char_p(data), c_void_p),
        functionName=name,
        cubinSize=len(data),
        pcOffset=int(pc_offset),
    )
    try:
        _f.cuptiGetSassToSourceCorrelation(p)
    finally:
        file, directory = _take_string(p.fileName), _take_string(p.dirName)
    return SourceLocation(line=int(p.lineNumber), file=file, directory=directory)

