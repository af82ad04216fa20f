"""The CUPTI SASS Metrics API (cupti_sass_metrics.h): per-instruction counters from patched SASS.

CUPTI rewrites ("patches") each kernel's SASS so that every instruction counts itself; the counts come back per
(cubin CRC, function, PC offset), with PC offsets of the original, unpatched code (the same offsets PC sampling
and ``cuptiGetSassToSourceCorrelation`` use).

Call order (NVIDIA's CUPTI sample ``sass_metrics``; the header's return codes): ``cuptiProfilerInitialize``,
then :func:`properties` (metric name -> id) per metric, :func:`set_config` (per device), :func:`enable` (per
context; with lazy patching a function is patched at its first launch inside the enabled range), work, a
context synchronisation, :func:`data_properties` and :func:`flush` (both only *inside* the enabled range:
``INVALID_OPERATION`` outside it; a flush empties CUPTI's records), :func:`disable` (records not flushed are
dropped and counted), :func:`unset_config`. :func:`metrics` lists what a chip offers; on GH100 among them
``smsp__sass_inst_executed``, ``smsp__sass_thread_inst_executed`` and
``smsp__sass_thread_inst_executed_pred_on``.

Layouts: the header is byte-identical in CUPTI 12.9, 13.0 and 13.1 (checked here); cupti-ctypes-notes §2 found
the layouts unchanged from 12.6 to 13.5, and every ``cuptiSassMetrics*`` symbol exported by 12.6 ... 13.5.
``tests/unit/test_sass_metrics_shim.py`` checks every offset and size against g++ on the header
(``tools/sass_metrics_layouts.cpp``). Two traps of the header:

* ``CUpti_SassMetricsFlushData_Params_STRUCT_SIZE`` is ``CUPTI_PROFILER_STRUCT_SIZE(..., numOfInstances)`` = 40,
  not the end of its last field ``pMetricsData`` (48). CUPTI's sample passes 40 and CUPTI reads ``pMetricsData``
  all the same; a larger size than CUPTI's own may be rejected (cupti-ctypes-notes §3), so 40 it is.
* ``CUpti_SassMetrics_Data.cubinCrc`` is ``uint32_t`` (PC sampling's is ``uint64_t``; the values agree).

Memory: the caller allocates the records and, per record, the instance values (:func:`flush` does, in numpy).
Each record's ``functionName`` is CUPTI's allocation that the caller frees (the sample ``free()``\\s it per
record); :func:`flush` frees each distinct address once.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import enum
from ctypes import POINTER, Structure, c_char_p, c_size_t, c_uint8, c_uint32, c_uint64, c_void_p

import numpy as np

from gpuscope.cupti._api import Functions, params
from gpuscope.cupti._types import _Params

__all__ = [
    "RECORD_DTYPE",
    "VALUE_DTYPE",
    "MetricDetails",
    "OutputGranularity",
    "SassRecords",
    "available",
    "data_properties",
    "disable",
    "enable",
    "flush",
    "metrics",
    "num_metrics",
    "properties",
    "set_config",
    "unset_config",
]

#: Every cuptiSassMetrics* function is exported by CUPTI 12.6 ... 13.5 (cupti-ctypes-notes §10); gpuscope's oldest.
SINCE = (12, 6)


class OutputGranularity(enum.IntEnum):
    """``CUpti_SassMetrics_OutputGranularity``: one value per instruction for the GPU, per SM or per SM sub-partition."""

    GPU = 0
    SM = 1
    SMSP = 2


# ---------------------------------------------------------------------------------------------------------------
# Structs (cupti_sass_metrics.h; field names as in the header, LP64). Params' _fields_ are tuples: ctypes takes
# any sequence.


class CUpti_SassMetrics_MetricDetails(Structure):
    _fields_ = [
        ("metricId", c_uint64),  # uint64_t
        ("pMetricName", c_char_p),  # const char*
        ("pMetricDescription", c_char_p),  # const char*
    ]


class CUpti_SassMetrics_GetNumOfMetrics_Params(_Params):
    _fields_ = (
        ("structSize", c_size_t),
        ("pPriv", c_void_p),
        ("pChipName", c_char_p),  # [in]
        ("numOfMetrics", c_size_t),  # [out]
    )


class CUpti_SassMetrics_GetMetrics_Params(_Params):
    _fields_ = (
        ("structSize", c_size_t),
        ("pPriv", c_void_p),
        ("pChipName", c_char_p),  # [in]
        ("numOfMetrics", c_size_t),  # [in] from cuptiSassMetricsGetNumOfMetrics
        ("pMetricsList", POINTER(CUpti_SassMetrics_MetricDetails)),  # [out] caller's array
    )


class CUpti_SassMetrics_GetProperties_Params(_Params):
    _fields_ = (
        ("structSize", c_size_t),
        ("pPriv", c_void_p),
        ("pChipName", c_char_p),  # [in]
        ("pMetricName", c_char_p),  # [in]
        ("metric", CUpti_SassMetrics_MetricDetails),  # [out] id and description
    )


class CUpti_SassMetrics_Config(Structure):
    _fields_ = [
        ("metricId", c_uint64),  # uint64_t
        ("outputGranularity", c_uint8),  # uint8_t, a CUpti_SassMetrics_OutputGranularity
    ]


class CUpti_SassMetricsSetConfig_Params(_Params):
    _fields_ = (
        ("structSize", c_size_t),
        ("pPriv", c_void_p),
        ("numOfMetricConfig", c_size_t),  # [in]
        ("pConfigs", POINTER(CUpti_SassMetrics_Config)),  # [in]
        ("deviceIndex", c_uint32),  # [in]
    )


class CUpti_SassMetricsUnsetConfig_Params(_Params):
    _fields_ = (
        ("structSize", c_size_t),
        ("pPriv", c_void_p),
        ("deviceIndex", c_uint32),  # [in]
    )


class CUpti_SassMetricsEnable_Params(_Params):
    _fields_ = (
        ("structSize", c_size_t),
        ("pPriv", c_void_p),
        ("ctx", c_void_p),  # [in] CUcontext; NULL: the current one
        ("enableLazyPatching", c_uint8),  # [in] patch a function at its first launch inside the range
    )


class CUpti_SassMetricsDisable_Params(_Params):
    _fields_ = (
        ("structSize", c_size_t),
        ("pPriv", c_void_p),
        ("ctx", c_void_p),  # [in] CUcontext
        ("numOfDroppedRecords", c_size_t),  # [out] records not flushed before disable
    )


class CUpti_SassMetricsGetDataProperties_Params(_Params):
    _fields_ = (
        ("structSize", c_size_t),
        ("pPriv", c_void_p),
        ("ctx", c_void_p),  # [in] CUcontext
        ("numOfPatchedInstructionRecords", c_size_t),  # [out]
        ("numOfInstances", c_size_t),  # [out] values per metric and instruction (1 at GPU granularity)
    )


class CUpti_SassMetrics_InstanceValue(Structure):
    _fields_ = [
        ("metricId", c_uint64),  # uint64_t
        ("value", c_uint64),  # uint64_t
    ]


class CUpti_SassMetrics_Data(Structure):
    _fields_ = [
        ("structSize", c_size_t),  # the header says "[in]"; CUPTI's sample leaves it unset (malloc)
        ("pPriv", c_void_p),
        ("cubinCrc", c_uint32),  # [out] uint32_t (PC sampling's is uint64_t)
        ("functionIndex", c_uint32),  # [out]
        ("functionName", c_void_p),  # [out] const char*, CUPTI's allocation: the caller frees it
        ("pcOffset", c_uint32),  # [out]
        ("pInstanceValues", POINTER(CUpti_SassMetrics_InstanceValue)),  # [in] caller's array, [out] its values
    ]


class CUpti_SassMetricsFlushData_Params(_Params):
    _fields_ = (
        ("structSize", c_size_t),
        ("pPriv", c_void_p),
        ("ctx", c_void_p),  # [in] CUcontext
        ("numOfPatchedInstructionRecords", c_size_t),  # [in]
        ("numOfInstances", c_size_t),  # [in]
        ("pMetricsData", POINTER(CUpti_SassMetrics_Data)),  # [out] caller's array of records
    )

    @classmethod
    def struct_size(cls, version) -> int:
        """The header's STRUCT_SIZE ends at ``numOfInstances`` (40), before ``pMetricsData``: see the module doc."""
        return cls.numOfInstances.offset + cls.numOfInstances.size


#: numpy views of the record and value arrays :func:`flush` hands CUPTI (the same layouts as the ctypes structs).
RECORD_DTYPE = np.dtype({
    "names": ["structSize", "pPriv", "cubinCrc", "functionIndex", "functionName", "pcOffset", "pInstanceValues"],
    "formats": [np.uint64, np.uint64, np.uint32, np.uint32, np.uint64, np.uint32, np.uint64],
    "offsets": [getattr(CUpti_SassMetrics_Data, f).offset for f in
                ("structSize", "pPriv", "cubinCrc", "functionIndex", "functionName", "pcOffset", "pInstanceValues")],
    "itemsize": ctypes.sizeof(CUpti_SassMetrics_Data),
})
VALUE_DTYPE = np.dtype({"names": ["metricId", "value"], "formats": [np.uint64, np.uint64],
                        "offsets": [0, 8], "itemsize": ctypes.sizeof(CUpti_SassMetrics_InstanceValue)})

#: What each record's ``structSize`` is set to: STRUCT_SIZE(CUpti_SassMetrics_Data, pInstanceValues), the whole
#: struct (CUPTI's sample leaves the field unset, so CUPTI cannot require any one value of it).
DATA_STRUCT_SIZE = CUpti_SassMetrics_Data.pInstanceValues.offset + CUpti_SassMetrics_Data.pInstanceValues.size

# A value slot CUPTI did not write keeps this id (no metric has it), so extra slots are told from written ones.
_UNWRITTEN = np.uint64(0xFFFFFFFFFFFFFFFF)

_P = POINTER
_f = Functions(
    "cupti_sass_metrics.h",
    {
        # CUptiResult cuptiSassMetricsGetNumOfMetrics(CUpti_SassMetrics_GetNumOfMetrics_Params* pParams)
        "cuptiSassMetricsGetNumOfMetrics": [_P(CUpti_SassMetrics_GetNumOfMetrics_Params)],
        # CUptiResult cuptiSassMetricsGetMetrics(CUpti_SassMetrics_GetMetrics_Params* pParams)
        "cuptiSassMetricsGetMetrics": [_P(CUpti_SassMetrics_GetMetrics_Params)],
        # CUptiResult cuptiSassMetricsGetProperties(CUpti_SassMetrics_GetProperties_Params *pParams)
        "cuptiSassMetricsGetProperties": [_P(CUpti_SassMetrics_GetProperties_Params)],
        # CUptiResult cuptiSassMetricsSetConfig(CUpti_SassMetricsSetConfig_Params *pParams)
        "cuptiSassMetricsSetConfig": [_P(CUpti_SassMetricsSetConfig_Params)],
        # CUptiResult cuptiSassMetricsUnsetConfig(CUpti_SassMetricsUnsetConfig_Params *pParams)
        "cuptiSassMetricsUnsetConfig": [_P(CUpti_SassMetricsUnsetConfig_Params)],
        # CUptiResult cuptiSassMetricsEnable(CUpti_SassMetricsEnable_Params* pParams)
        "cuptiSassMetricsEnable": [_P(CUpti_SassMetricsEnable_Params)],
        # CUptiResult cuptiSassMetricsDisable(CUpti_SassMetricsDisable_Params* pParams)
        "cuptiSassMetricsDisable": [_P(CUpti_SassMetricsDisable_Params)],
        # CUptiResult cuptiSassMetricsGetDataProperties(CUpti_SassMetricsGetDataProperties_Params* pParams)
        "cuptiSassMetricsGetDataProperties": [_P(CUpti_SassMetricsGetDataProperties_Params)],
        # CUptiResult cuptiSassMetricsFlushData(CUpti_SassMetricsFlushData_Params* pParams)
        "cuptiSassMetricsFlushData": [_P(CUpti_SassMetricsFlushData_Params)],
    },
    since={name: SINCE for name in (
        "cuptiSassMetricsGetNumOfMetrics", "cuptiSassMetricsGetMetrics", "cuptiSassMetricsGetProperties",
        "cuptiSassMetricsSetConfig", "cuptiSassMetricsUnsetConfig", "cuptiSassMetricsEnable",
        "cuptiSassMetricsDisable", "cuptiSassMetricsGetDataProperties", "cuptiSassMetricsFlushData")},
)

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
_libc.free.argtypes = [c_void_p]
_libc.free.restype = None


def available() -> bool:
    """Whether the loaded CUPTI exports the SASS Metrics API (every one of its functions)."""
    return all(_f.has(name) for name in _f._bound)


@dataclasses.dataclass(frozen=True)
class MetricDetails:
    """``CUpti_SassMetrics_MetricDetails``, copied out of CUPTI's strings."""

    metric_id: int
    name: str
    description: str


def _details(d: CUpti_SassMetrics_MetricDetails, name: str = "") -> MetricDetails:
    text = (lambda p: p.decode(errors="replace") if p else "")
    return MetricDetails(int(d.metricId), text(d.pMetricName) or name, text(d.pMetricDescription))


def num_metrics(chip: str) -> int:
    """``cuptiSassMetricsGetNumOfMetrics``: how many SASS metrics *chip* (e.g. ``"GH100"``) offers."""
    p = params(CUpti_SassMetrics_GetNumOfMetrics_Params, pChipName=chip.encode())
    _f.cuptiSassMetricsGetNumOfMetrics(p)
    return int(p.numOfMetrics)


def metrics(chip: str) -> list[MetricDetails]:
    """``cuptiSassMetricsGetMetrics``: every SASS metric of *chip*, with id and description."""
    n = num_metrics(chip)
    array = (CUpti_SassMetrics_MetricDetails * max(n, 1))()
    p = params(CUpti_SassMetrics_GetMetrics_Params, pChipName=chip.encode(), numOfMetrics=n, pMetricsList=array)
    _f.cuptiSassMetricsGetMetrics(p)
    return [_details(array[i]) for i in range(n)]


def properties(chip: str, metric: str) -> MetricDetails:
    """``cuptiSassMetricsGetProperties``: id and description of one metric of *chip*."""
    p = params(CUpti_SassMetrics_GetProperties_Params, pChipName=chip.encode(), pMetricName=metric.encode())
    _f.cuptiSassMetricsGetProperties(p)
    return _details(p.metric, metric)


def set_config(device_index: int, metric_ids, granularity: OutputGranularity = OutputGranularity.GPU) -> None:
    """``cuptiSassMetricsSetConfig``: collect *metric_ids* on a device (pair with :func:`unset_config`)."""
    ids = [int(m) for m in metric_ids]
    configs = (CUpti_SassMetrics_Config * len(ids))(
        *[CUpti_SassMetrics_Config(metricId=m, outputGranularity=int(granularity)) for m in ids])
    _f.cuptiSassMetricsSetConfig(params(CUpti_SassMetricsSetConfig_Params, numOfMetricConfig=len(ids),
                                        pConfigs=configs, deviceIndex=int(device_index)))


def unset_config(device_index: int) -> None:
    """``cuptiSassMetricsUnsetConfig``: CUPTI forgets the device's configuration and frees what it allocated."""
    _f.cuptiSassMetricsUnsetConfig(params(CUpti_SassMetricsUnsetConfig_Params, deviceIndex=int(device_index)))


def enable(ctx: int, lazy_patching: bool = True) -> None:
    """``cuptiSassMetricsEnable`` on a context: kernels launched from now on are patched and counted."""
    _f.cuptiSassMetricsEnable(params(CUpti_SassMetricsEnable_Params, ctx=ctx, enableLazyPatching=int(lazy_patching)))


def disable(ctx: int) -> int:
    """``cuptiSassMetricsDisable``; returns ``numOfDroppedRecords`` (records not flushed before, now lost)."""
    p = params(CUpti_SassMetricsDisable_Params, ctx=ctx)
    _f.cuptiSassMetricsDisable(p)
    return int(p.numOfDroppedRecords)


def data_properties(ctx: int) -> tuple[int, int]:
    """``cuptiSassMetricsGetDataProperties``: (patched-instruction records, instances per value) held now."""
    p = params(CUpti_SassMetricsGetDataProperties_Params, ctx=ctx)
    _f.cuptiSassMetricsGetDataProperties(p)
    return int(p.numOfPatchedInstructionRecords), int(p.numOfInstances)


@dataclasses.dataclass
class SassRecords:
    """Flushed SASS-metric values as flat arrays: one row per (record, written value slot).

    ``value`` is the count of the metric ``metric_id`` at (``cubin_crc``, ``function``, ``pc_offset``) in one
    instance (the GPU, an SM or an SMSP, by the configured granularity). Summing over rows of the same key gives
    the instruction's total; the same PC may appear in several rows (one per metric, per instance, per flush).
    """

    cubin_crc: np.ndarray  # uint64
    function_index: np.ndarray  # uint32
    function: np.ndarray  # str: mangled name
    pc_offset: np.ndarray  # uint64
    metric_id: np.ndarray  # uint64
    value: np.ndarray  # uint64
    dropped_records: int = 0

    _ARRAYS = ("cubin_crc", "function_index", "function", "pc_offset", "metric_id", "value")

    @classmethod
    def empty(cls) -> SassRecords:
        return cls(*[np.zeros(0, dtype=d) for d in (np.uint64, np.uint32, str, np.uint64, np.uint64, np.uint64)])

    @classmethod
    def concat(cls, parts: list[SassRecords]) -> SassRecords:
        if not parts:
            return cls.empty()
        arrays = [np.concatenate([getattr(p, k) for p in parts]) for k in cls._ARRAYS]
        return cls(*arrays, dropped_records=sum(p.dropped_records for p in parts))

    def to_dict(self) -> dict[str, np.ndarray]:
        """Arrays for ``np.savez`` (recordings); :meth:`from_dict` reads them back."""
        out = {k: getattr(self, k) for k in self._ARRAYS}
        out["dropped_records"] = np.array([self.dropped_records], dtype=np.int64)
        return out

    @classmethod
    def from_dict(cls, data) -> SassRecords:
        return cls(*[np.asarray(data[k]) for k in cls._ARRAYS], dropped_records=int(data["dropped_records"][0]))


def _names(addresses: np.ndarray) -> dict[int, str]:
    """Each distinct ``functionName`` address as text, then freed once (CUPTI allocated them for the caller)."""
    out = {}
    for address in np.unique(addresses).tolist():
        if address:
            try:
                out[address] = ctypes.string_at(address).decode(errors="replace")
            finally:
                _libc.free(address)
    return out


def flush(ctx: int, num_records: int, num_instances: int, slots_per_record: int | None = None) -> SassRecords:
    """``cuptiSassMetricsFlushData``: copy out and empty CUPTI's records (call inside the enabled range).

    Parameters
    ----------
    num_records, num_instances : int
        From :func:`data_properties`.
    slots_per_record : int, optional
        Value slots allocated per record, at least ``num_instances`` (the header's count). The header leaves
        open whether a record of several metrics carries ``num_instances`` values or that many per metric;
        allocating ``num_instances x metrics`` slots, each marked unwritten, covers both, and only slots
        CUPTI wrote become rows.
    """
    n = int(num_records)
    slots = max(int(num_instances), int(slots_per_record or 0), 1)
    if n == 0:
        return SassRecords.empty()
    values = np.zeros(n * slots, dtype=VALUE_DTYPE)
    values["metricId"] = _UNWRITTEN
    records = np.zeros(n, dtype=RECORD_DTYPE)
    records["structSize"] = DATA_STRUCT_SIZE
    records["pInstanceValues"] = values.ctypes.data + np.arange(n, dtype=np.uint64) * (slots * VALUE_DTYPE.itemsize)
    p = params(CUpti_SassMetricsFlushData_Params, ctx=ctx, numOfPatchedInstructionRecords=n,
               numOfInstances=int(num_instances),
               pMetricsData=ctypes.cast(records.ctypes.data, POINTER(CUpti_SassMetrics_Data)))
    try:
        _f.cuptiSassMetricsFlushData(p)
    finally:
        names = _names(records["functionName"])
    written = (values["metricId"] != _UNWRITTEN).reshape(n, slots)
    row = np.repeat(np.arange(n), slots)[written.ravel()]
    return SassRecords(
        cubin_crc=records["cubinCrc"][row].astype(np.uint64),
        function_index=records["functionIndex"][row].astype(np.uint32),
        function=np.asarray([names.get(int(a), "") for a in records["functionName"][row]], dtype=str),
        pc_offset=records["pcOffset"][row].astype(np.uint64),
        metric_id=values["metricId"][written.ravel()].astype(np.uint64),
        value=values["value"][written.ravel()].astype(np.uint64),
    )
