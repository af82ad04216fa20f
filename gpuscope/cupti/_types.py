"""CUPTI structs and enums, with the field names of the C headers.

Layouts are the superset of CUPTI 12.6 ... 13.5 (LP64). CUPTI rejects a ``structSize`` larger than the one it
was built with, and the ``*_STRUCT_SIZE`` macros are ``offsetof(last field) + sizeof(last field)``, not
``sizeof``. So each params struct lists, in ``_since_``, the CUPTI version that added each later field, and
:meth:`_Params.struct_size` computes the size that a given CUPTI version accepts. ``tests/unit/test_types.py``
checks every offset, size and per-version struct size against layouts measured with g++ on each header.
"""

from __future__ import annotations

import enum
from ctypes import (
    POINTER,
    Structure,
    Union,
    c_char_p,
    c_int,
    c_size_t,
    c_uint8,
    c_uint16,
    c_uint32,
    c_uint64,
    c_void_p,
    sizeof,
)

Version = tuple  # (major, minor), e.g. (13, 1)

#: The oldest CUPTI gpuscope supports (the Range Profiler and the Profiler Host API arrived in 12.6).
MIN_VERSION: Version = (12, 6)


class _Params(Structure):
    """A CUPTI params struct whose first field is its size (``structSize``, or ``size`` for PC sampling)."""

    _since_: dict[str, Version] = {}

    @classmethod
    def struct_size(cls, version: Version) -> int:
        """The ``structSize`` CUPTI *version* accepts: the end of the last field that version knows."""
        last = None
        for name, _ in cls._fields_:
            if cls._since_.get(name, MIN_VERSION) <= tuple(version):
                last = getattr(cls, name)
        return last.offset + last.size

    @classmethod
    def new(cls, version: Version, **fields):
        """An instance with its size field set for *version* and the given fields filled in."""
        params = cls(**fields)
        setattr(params, cls._fields_[0][0], cls.struct_size(version))
        return params


# ---------------------------------------------------------------------------------------------------------
# Enums (values identical in every header where they exist; only additions between versions)
# ---------------------------------------------------------------------------------------------------------


class ProfilerType(enum.IntEnum):
    """``CUpti_ProfilerType`` (cupti_profiler_host.h)."""

    RANGE_PROFILER = 0
    PM_SAMPLING = 1


class MetricType(enum.IntEnum):
    """``CUpti_MetricType``."""

    COUNTER = 0
    RATIO = 1
    THROUGHPUT = 2


class MetricCollectionScope(enum.IntEnum):
    """``CUpti_MetricCollectionScope`` (13.1+)."""

    CONTEXT = 0
    DEVICE = 1
    INVALID = 2


class ProfilerRange(enum.IntEnum):
    """``CUpti_ProfilerRange``."""

    AUTO = 1  # CUPTI_AutoRange
    USER = 2  # CUPTI_UserRange


class ReplayMode(enum.IntEnum):
    """``CUpti_ProfilerReplayMode``."""

    APPLICATION = 1
    KERNEL = 2
    USER = 3


class PmTriggerMode(enum.IntEnum):
    """``CUpti_PmSampling_TriggerMode``."""

    GPU_SYSCLK_INTERVAL = 0  # interval in sys-clock cycles
    GPU_TIME_INTERVAL = 1  # interval in ns; not on Turing or GA100


class PmDecodeStopReason(enum.IntEnum):
    """``CUpti_PmSampling_DecodeStopReason``."""

    OTHER = 0
    COUNTER_DATA_FULL = 1
    END_OF_RECORDS = 2


class PmAppendMode(enum.IntEnum):
    """``CUpti_PmSampling_HardwareBuffer_AppendMode`` (12.8+)."""

    KEEP_OLDEST = 0
    KEEP_LATEST = 1


class CacheControlMode(enum.IntEnum):
    """``CUpti_CacheControl_Mode`` (13.4+)."""

    NONE = 0
    ALL = 1
    L2 = 2


class SupportLevel(enum.IntEnum):
    """``CUpti_Profiler_Support_Level``."""

    UNKNOWN = 0
    UNSUPPORTED = 1
    DISABLED = 2
    SUPPORTED = 3
    LIMITED_SUPPORT = 4  # 13.4+


class ProfilerApi(enum.IntEnum):
    """``CUpti_Profiler_API``."""

    RANGE_PROFILING = 0
    PC_SAMPLING = 1
    SASS_METRICS = 2
    PM_SAMPLING = 3


class PCSamplingCollectionMode(enum.IntEnum):
    """``CUpti_PCSamplingCollectionMode``."""

    CONTINUOUS = 1
    KERNEL_SERIALIZED = 2


class PCSamplingOutputDataFormat(enum.IntEnum):
    """``CUpti_PCSamplingOutputDataFormat``."""

    PARSED = 1


class PCSamplingAttribute(enum.IntEnum):
    """``CUpti_PCSamplingConfigurationAttributeType``."""

    SAMPLING_PERIOD = 1  # uint32 n, 5..31: one sample every 2**n cycles
    STALL_REASON = 2
    SCRATCH_BUFFER_SIZE = 3
    HARDWARE_BUFFER_SIZE = 4
    COLLECTION_MODE = 5
    ENABLE_START_STOP_CONTROL = 6
    OUTPUT_DATA_FORMAT = 7
    SAMPLING_DATA_BUFFER = 8
    WORKER_THREAD_PERIODIC_SLEEP_SPAN = 9


class CheckpointOptimizations(enum.IntEnum):
    """``CUpti_CheckpointOptimizations``."""

    NONE = 0
    TRANSFER = 1


# ---------------------------------------------------------------------------------------------------------
# The union inside CUpti_PCSamplingConfigurationInfo (cupti_pcsampling.h)
# ---------------------------------------------------------------------------------------------------------


def _one(name, ctype):
    return type(name, (Structure,), {"_fields_": [(name[:1].lower() + name[1:-4], ctype)]})


class _StallReasonData(Structure):
    _fields_ = [("stallReasonCount", c_size_t), ("pStallReasonIndex", c_void_p)]  # size_t; uint32_t*


class _PCSamplingAttributeData(Union):
    _fields_ = [
        ("invalidData", c_uint64 * 3),
        ("samplingPeriodData", _one("SamplingPeriodData", c_uint32)),
        ("stallReasonData", _StallReasonData),
        ("scratchBufferSizeData", _one("ScratchBufferSizeData", c_size_t)),
        ("hardwareBufferSizeData", _one("HardwareBufferSizeData", c_size_t)),
        ("collectionModeData", _one("CollectionModeData", c_int)),
        ("enableStartStopControlData", _one("EnableStartStopControlData", c_uint32)),
        ("outputDataFormatData", _one("OutputDataFormatData", c_int)),
        ("samplingDataBufferData", _one("SamplingDataBufferData", c_void_p)),
        ("workerThreadPeriodicSleepSpanData", _one("WorkerThreadPeriodicSleepSpanData", c_uint32)),
    ]


assert sizeof(_PCSamplingAttributeData) == 24


# ---------------------------------------------------------------------------------------------------------
# Params structs, in header order: cupti_target.h / cupti_profiler_target.h, cupti_profiler_host.h,
# cupti_range_profiler.h, cupti_pmsampling.h, cupti_checkpoint.h, cupti_pcsampling.h.
# ---------------------------------------------------------------------------------------------------------


class CUpti_Profiler_Initialize_Params(_Params):
    _fields_ = [
        ("structSize", c_size_t),  # size_t
        ("pPriv", c_void_p),  # void*
    ]


class CUpti_Profiler_DeInitialize_Params(_Params):
    _fields_ = [
        ("structSize", c_size_t),  # size_t
        ("pPriv", c_void_p),  # void*
    ]


class CUpti_Device_GetChipName_Params(_Params):
    _fields_ = [
        ("structSize", c_size_t),  # size_t
        ("pPriv", c_void_p),  # void*
        ("deviceIndex", c_size_t),  # size_t
        ("pChipName", c_char_p),  # const char*
    ]


class CUpti_Profiler_GetCounterAvailability_Params(_Params):
    _fields_ = [
        ("structSize", c_size_t),  # size_t
        ("pPriv", c_void_p),  # void*
        ("ctx", c_void_p),  # CUcontext
        ("counterAvailabilityImageSize", c_size_t),  # size_t
        ("pCounterAvailabilityImage", c_void_p),  # uint8_t*
        ("bAllowDeviceLevelCounters", c_uint8),  # uint8_t
    ]
    _since_ = {'bAllowDeviceLevelCounters': (13, 1)}


class CUpti_Profiler_DeviceSupported_Params(_Params):
    _fields_ = [
        ("structSize", c_size_t),  # size_t
        ("pPriv", c_void_p),  # void *
        ("cuDevice", c_int),  # CUdevice
        ("isSupported", c_int),  # CUpti_Profiler_Support_Level
        ("architecture", c_int),  # CUpti_Profiler_Support_Level
        ("sli", c_int),  # CUpti_Profiler_Support_Level
        ("vGpu", c_int),  # CUpti_Profiler_Support_Level
        ("confidentialCompute", c_int),  # CUpti_Profiler_Support_Level
        ("cmp", c_int),  # CUpti_Profiler_Support_Level
        ("wsl", c_int),  # CUpti_Profiler_Support_Level
        ("api", c_int),  # CUpti_Profiler_API
        ("sku", c_int),  # CUpti_Profiler_Support_Level
    ]
    _since_ = {'sku': (13, 1)}


class CUpti_Profiler_IsPassCollected_Params(_Params):
    _fields_ = [
        ("structSize", c_size_t),  # size_t
        ("pPriv", c_void_p),  # void*
        ("ctx", c_void_p),  # CUcontext
        ("numRangesDropped", c_size_t),  # size_t
        ("numTraceBytesDropped", c_size_t),  # size_t
        ("onePassCollected", c_uint8),  # uint8_t
        ("allPassesCollected", c_uint8),  # uint8_t
    ]


class CUpti_Profiler_Host_Initialize_Params(_Params):
    _fields_ = [
        ("structSize", c_size_t),  # size_t
        ("pPriv", c_void_p),  # void*
        ("profilerType", c_int),  # CUpti_ProfilerType
        ("pChipName", c_char_p),  # const char*
        ("pCounterAvailabilityImage", c_void_p),  # const uint8_t*
        ("pHostObject", c_void_p),  # CUpti_Profiler_Host_Object*
        ("pSinglePassMetricSetName", c_char_p),  # const char*
    ]
    _since_ = {'pSinglePassMetricSetName': (13, 2)}


class CUpti_Profiler_Host_Deinitialize_Params(_Params):
    _fields_ = [
        ("structSize", c_size_t),  # size_t
        ("pPriv", c_void_p),  # void*
        ("pHostObject", c_void_p),  # struct CUpti_Profiler_Host_Object*
    ]


class CUpti_Profiler_Host_GetSupportedChips_Params(_Params):
    _fields_ = [
        ("structSize", c_size_t),  # size_t
        ("pPriv", c_void_p),  # void*
        ("numChips", c_size_t),  # size_t
        ("ppChipNames", POINTER(c_char_p)),  # const char* const*
    ]


class CUpti_Profiler_Host_GetBaseMetrics_Params(_Params):
    _fields_ = [
        ("structSize", c_size_t),  # size_t
        ("pPriv", c_void_p),  # void*
        ("pHostObject", c_void_p),  # struct CUpti_Profiler_Host_Object*
        ("metricType", c_int),  # CUpti_MetricType
        ("ppMetricNames", POINTER(c_char_p)),  # const char**
        ("numMetrics", c_size_t),  # size_t
    ]


class CUpti_Profiler_Host_GetSubMetrics_Params(_Params):
    _fields_ = [
        ("structSize", c_size_t),  # size_t
        ("pPriv", c_void_p),  # void*
        ("pHostObject", c_void_p),  # CUpti_Profiler_Host_Object*
        ("metricType", c_int),  # CUpti_MetricType
        ("pMetricName", c_char_p),  # const char*
        ("numOfSubmetrics", c_size_t),  # size_t
        ("ppSubMetrics", POINTER(c_char_p)),  # const char**
    ]


class CUpti_Profiler_Host_GetMetricProperties_Params(_Params):
    _fields_ = [
        ("structSize", c_size_t),  # size_t
        ("pPriv", c_void_p),  # void*
        ("pHostObject", c_void_p),  # CUpti_Profiler_Host_Object*
        ("pMetricName", c_char_p),  # const char*
        ("pDescription", c_char_p),  # const char*
        ("pHwUnit", c_char_p),  # const char*
        ("pDimUnit", c_char_p),  # const char*
        ("metricType", c_int),  # CUpti_MetricType
        ("metricCollectionScope", c_int),  # CUpti_MetricCollectionScope
    ]
    _since_ = {'metricCollectionScope': (13, 1)}


class CUpti_Profiler_Host_GetRangeName_Params(_Params):
    _fields_ = [
        ("structSize", c_size_t),  # size_t
        ("pPriv", c_void_p),  # void*
        ("pCounterDataImage", c_void_p),  # const uint8_t*
        ("counterDataImageSize", c_size_t),  # size_t
        ("rangeIndex", c_size_t),  # size_t
        ("delimiter", c_char_p),  # const char*
        ("pRangeName", c_void_p),  # const char*; caller frees with libc free()
    ]


class CUpti_Profiler_Host_EvaluateToGpuValues_Params(_Params):
    _fields_ = [
        ("structSize", c_size_t),  # size_t
        ("pPriv", c_void_p),  # void*
        ("pHostObject", c_void_p),  # CUpti_Profiler_Host_Object*
        ("pCounterDataImage", c_void_p),  # const uint8_t*
        ("counterDataImageSize", c_size_t),  # size_t
        ("rangeIndex", c_size_t),  # size_t
        ("ppMetricNames", POINTER(c_char_p)),  # const char**
        ("numMetrics", c_size_t),  # size_t
        ("pMetricValues", c_void_p),  # double*
    ]


class CUpti_Profiler_Host_ConfigAddMetrics_Params(_Params):
    _fields_ = [
        ("structSize", c_size_t),  # size_t
        ("pPriv", c_void_p),  # void*
        ("pHostObject", c_void_p),  # struct CUpti_Profiler_Host_Object*
        ("ppMetricNames", POINTER(c_char_p)),  # const char**
        ("numMetrics", c_size_t),  # size_t
    ]


class CUpti_Profiler_Host_GetConfigImageSize_Params(_Params):
    _fields_ = [
        ("structSize", c_size_t),  # size_t
        ("pPriv", c_void_p),  # void*
        ("pHostObject", c_void_p),  # CUpti_Profiler_Host_Object*
        ("configImageSize", c_size_t),  # size_t
    ]


class CUpti_Profiler_Host_GetConfigImage_Params(_Params):
    _fields_ = [
        ("structSize", c_size_t),  # size_t
        ("pPriv", c_void_p),  # void*
        ("pHostObject", c_void_p),  # CUpti_Profiler_Host_Object*
        ("configImageSize", c_size_t),  # size_t
        ("pConfigImage", c_void_p),  # uint8_t*
    ]


class CUpti_Profiler_Host_GetNumOfPasses_Params(_Params):
    _fields_ = [
        ("structSize", c_size_t),  # size_t
        ("pPriv", c_void_p),  # void*
        ("configImageSize", c_size_t),  # size_t
        ("pConfigImage", c_void_p),  # uint8_t*
        ("numOfPasses", c_size_t),  # size_t
    ]


class CUpti_Profiler_Host_GetMaxNumHardwareMetricsPerPass_Params(_Params):
    _fields_ = [
        ("structSize", c_size_t),  # size_t
        ("pPriv", c_void_p),  # void*
        ("profilerType", c_int),  # CUpti_ProfilerType
        ("pChipName", c_char_p),  # const char*
        ("pCounterAvailabilityImage", c_void_p),  # uint8_t*
        ("maxMetricsPerPass", c_size_t),  # size_t
    ]


class CUpti_Profiler_Host_GetSinglePassSets_Params(_Params):
    _fields_ = [
        ("structSize", c_size_t),  # size_t
        ("pPriv", c_void_p),  # void*
        ("pChipName", c_char_p),  # const char*
        ("numOfSinglePassSets", c_size_t),  # size_t
        ("ppSinglePassSets", POINTER(c_char_p)),  # const char**
    ]
    _since_ = {'structSize': (13, 2), 'pPriv': (13, 2), 'pChipName': (13, 2), 'numOfSinglePassSets': (13, 2), 'ppSinglePassSets': (13, 2)}


class CUpti_Profiler_Host_GetMetricsInSinglePassSet_Params(_Params):
    _fields_ = [
        ("structSize", c_size_t),  # size_t
        ("pPriv", c_void_p),  # void*
        ("pChipName", c_char_p),  # const char*
        ("pSinglePassSetName", c_char_p),  # const char*
        ("numOfMetricsInSinglePassSet", c_size_t),  # size_t
        ("metricsBufferSize", c_size_t),  # size_t
        ("pMetricsIndicesBuffer", c_void_p),  # size_t*
        ("pMetricsBuffer", c_void_p),  # uint8_t*
    ]
    _since_ = {'structSize': (13, 2), 'pPriv': (13, 2), 'pChipName': (13, 2), 'pSinglePassSetName': (13, 2), 'numOfMetricsInSinglePassSet': (13, 2), 'metricsBufferSize': (13, 2), 'pMetricsIndicesBuffer': (13, 2), 'pMetricsBuffer': (13, 2)}


class CUpti_Profiler_Host_SetDevicePartitionInfo_Params(_Params):
    _fields_ = [
        ("structSize", c_size_t),  # size_t
        ("pPriv", c_void_p),  # void*
        ("pHostObject", c_void_p),  # CUpti_Profiler_Host_Object*
        ("pDevicePartitionInfo", c_void_p),  # uint8_t*
        ("devicePartitionInfoSize", c_size_t),  # size_t
    ]
    _since_ = {'structSize': (13, 3), 'pPriv': (13, 3), 'pHostObject': (13, 3), 'pDevicePartitionInfo': (13, 3), 'devicePartitionInfoSize': (13, 3)}


class CUpti_RangeProfiler_Enable_Params(_Params):
    _fields_ = [
        ("structSize", c_size_t),  # size_t
        ("pPriv", c_void_p),  # void*
        ("ctx", c_void_p),  # CUcontext
        ("pRangeProfilerObject", c_void_p),  # CUpti_RangeProfiler_Object*
        ("cacheControlMode", c_int),  # CUpti_CacheControl_Mode
    ]
    _since_ = {'cacheControlMode': (13, 4)}


class CUpti_RangeProfiler_Disable_Params(_Params):
    _fields_ = [
        ("structSize", c_size_t),  # size_t
        ("pPriv", c_void_p),  # void*
        ("pRangeProfilerObject", c_void_p),  # CUpti_RangeProfiler_Object*
    ]


class CUpti_RangeProfiler_SetConfig_Params(_Params):
    _fields_ = [
        ("structSize", c_size_t),  # size_t
        ("pPriv", c_void_p),  # void*
        ("pRangeProfilerObject", c_void_p),  # CUpti_RangeProfiler_Object*
        ("configSize", c_size_t),  # size_t
        ("pConfig", c_void_p),  # const uint8_t*
        ("counterDataImageSize", c_size_t),  # size_t
        ("pCounterDataImage", c_void_p),  # uint8_t*
        ("range", c_int),  # CUpti_ProfilerRange
        ("replayMode", c_int),  # CUpti_ProfilerReplayMode
        ("maxRangesPerPass", c_size_t),  # size_t
        ("numNestingLevels", c_uint16),  # uint16_t
        ("minNestingLevel", c_uint16),  # uint16_t
        ("passIndex", c_size_t),  # size_t
        ("targetNestingLevel", c_uint16),  # uint16_t
    ]


class CUpti_RangeProfiler_Start_Params(_Params):
    _fields_ = [
        ("structSize", c_size_t),  # size_t
        ("pPriv", c_void_p),  # void*
        ("pRangeProfilerObject", c_void_p),  # CUpti_RangeProfiler_Object*
    ]


class CUpti_RangeProfiler_Stop_Params(_Params):
    _fields_ = [
        ("structSize", c_size_t),  # size_t
        ("pPriv", c_void_p),  # void*
        ("pRangeProfilerObject", c_void_p),  # CUpti_RangeProfiler_Object*
        ("passIndex", c_size_t),  # size_t
        ("targetNestingLevel", c_size_t),  # size_t
        ("isAllPassSubmitted", c_uint8),  # uint8_t
    ]


class CUpti_RangeProfiler_PushRange_Params(_Params):
    _fields_ = [
        ("structSize", c_size_t),  # size_t
        ("pPriv", c_void_p),  # void*
        ("pRangeProfilerObject", c_void_p),  # CUpti_RangeProfiler_Object*
        ("pRangeName", c_char_p),  # const char*
    ]


class CUpti_RangeProfiler_PopRange_Params(_Params):
    _fields_ = [
        ("structSize", c_size_t),  # size_t
        ("pPriv", c_void_p),  # void*
        ("pRangeProfilerObject", c_void_p),  # CUpti_RangeProfiler_Object*
    ]


class CUpti_RangeProfiler_DecodeData_Params(_Params):
    _fields_ = [
        ("structSize", c_size_t),  # size_t
        ("pPriv", c_void_p),  # void*
        ("pRangeProfilerObject", c_void_p),  # CUpti_RangeProfiler_Object*
        ("numOfRangeDropped", c_size_t),  # size_t
    ]


class CUpti_RangeProfiler_GetCounterDataSize_Params(_Params):
    _fields_ = [
        ("structSize", c_size_t),  # size_t
        ("pPriv", c_void_p),  # void*
        ("pRangeProfilerObject", c_void_p),  # CUpti_RangeProfiler_Object*
        ("pMetricNames", POINTER(c_char_p)),  # const char**
        ("numMetrics", c_size_t),  # size_t
        ("maxNumOfRanges", c_size_t),  # size_t
        ("maxNumRangeTreeNodes", c_uint32),  # uint32_t
        ("counterDataSize", c_size_t),  # size_t
    ]


class CUpti_RangeProfiler_CounterDataImage_Initialize_Params(_Params):
    _fields_ = [
        ("structSize", c_size_t),  # size_t
        ("pPriv", c_void_p),  # void*
        ("pRangeProfilerObject", c_void_p),  # CUpti_RangeProfiler_Object*
        ("counterDataSize", c_size_t),  # size_t
        ("pCounterData", c_void_p),  # uint8_t*
    ]


class CUpti_RangeProfiler_GetCounterDataInfo_Params(_Params):
    _fields_ = [
        ("structSize", c_size_t),  # size_t
        ("pPriv", c_void_p),  # void*
        ("pCounterDataImage", c_void_p),  # const uint8_t*
        ("counterDataImageSize", c_size_t),  # size_t
        ("numTotalRanges", c_size_t),  # size_t
    ]


class CUpti_RangeProfiler_CounterData_GetRangeInfo_Params(_Params):
    _fields_ = [
        ("structSize", c_size_t),  # size_t
        ("pPriv", c_void_p),  # void*
        ("pCounterDataImage", c_void_p),  # const uint8_t*
        ("counterDataImageSize", c_size_t),  # size_t
        ("rangeIndex", c_size_t),  # size_t
        ("rangeDelimiter", c_char_p),  # const char*
        ("rangeName", c_char_p),  # const char*
    ]


class CUpti_RangeProfiler_GetDevicePartitionInfo_Params(_Params):
    _fields_ = [
        ("structSize", c_size_t),  # size_t
        ("pPriv", c_void_p),  # void*
        ("pRangeProfilerObject", c_void_p),  # CUpti_RangeProfiler_Object*
        ("devicePartitionInfoSize", c_size_t),  # size_t
        ("pDevicePartitionInfo", c_void_p),  # uint8_t*
    ]
    _since_ = {'structSize': (13, 3), 'pPriv': (13, 3), 'pRangeProfilerObject': (13, 3), 'devicePartitionInfoSize': (13, 3), 'pDevicePartitionInfo': (13, 3)}


class CUpti_PmSampling_Enable_Params(_Params):
    _fields_ = [
        ("structSize", c_size_t),  # size_t
        ("pPriv", c_void_p),  # void*
        ("deviceIndex", c_size_t),  # size_t
        ("pPmSamplingObject", c_void_p),  # CUpti_PmSampling_Object*
    ]


class CUpti_PmSampling_Disable_Params(_Params):
    _fields_ = [
        ("structSize", c_size_t),  # size_t
        ("pPriv", c_void_p),  # void*
        ("pPmSamplingObject", c_void_p),  # CUpti_PmSampling_Object*
    ]


class CUpti_PmSampling_SetConfig_Params(_Params):
    _fields_ = [
        ("structSize", c_size_t),  # size_t
        ("pPriv", c_void_p),  # void*
        ("pPmSamplingObject", c_void_p),  # CUpti_PmSampling_Object*
        ("configSize", c_size_t),  # size_t
        ("pConfig", c_void_p),  # const uint8_t*
        ("hardwareBufferSize", c_size_t),  # size_t
        ("samplingInterval", c_uint64),  # uint64_t
        ("triggerMode", c_int),  # CUpti_PmSampling_TriggerMode
        ("hwBufferAppendMode", c_int),  # CUpti_PmSampling_HardwareBuffer_AppendMode
    ]
    _since_ = {'hwBufferAppendMode': (12, 8)}


class CUpti_PmSampling_Start_Params(_Params):
    _fields_ = [
        ("structSize", c_size_t),  # size_t
        ("pPriv", c_void_p),  # void*
        ("pPmSamplingObject", c_void_p),  # CUpti_PmSampling_Object*
    ]


class CUpti_PmSampling_Stop_Params(_Params):
    _fields_ = [
        ("structSize", c_size_t),  # size_t
        ("pPriv", c_void_p),  # void*
        ("pPmSamplingObject", c_void_p),  # CUpti_PmSampling_Object*
    ]


class CUpti_PmSampling_DecodeData_Params(_Params):
    _fields_ = [
        ("structSize", c_size_t),  # size_t
        ("pPriv", c_void_p),  # void*
        ("pPmSamplingObject", c_void_p),  # CUpti_PmSampling_Object*
        ("pCounterDataImage", c_void_p),  # uint8_t*
        ("counterDataImageSize", c_size_t),  # size_t
        ("decodeStopReason", c_int),  # CUpti_PmSampling_DecodeStopReason
        ("overflow", c_uint8),  # uint8_t
    ]


class CUpti_PmSampling_GetCounterAvailability_Params(_Params):
    _fields_ = [
        ("structSize", c_size_t),  # size_t
        ("pPriv", c_void_p),  # void*
        ("deviceIndex", c_size_t),  # size_t
        ("counterAvailabilityImageSize", c_size_t),  # size_t
        ("pCounterAvailabilityImage", c_void_p),  # uint8_t*
    ]


class CUpti_PmSampling_GetCounterDataSize_Params(_Params):
    _fields_ = [
        ("structSize", c_size_t),  # size_t
        ("pPriv", c_void_p),  # void*
        ("pPmSamplingObject", c_void_p),  # CUpti_PmSampling_Object*
        ("pMetricNames", POINTER(c_char_p)),  # const char**
        ("numMetrics", c_size_t),  # size_t
        ("maxSamples", c_uint32),  # uint32_t
        ("counterDataSize", c_size_t),  # size_t
    ]


class CUpti_PmSampling_CounterDataImage_Initialize_Params(_Params):
    _fields_ = [
        ("structSize", c_size_t),  # size_t
        ("pPriv", c_void_p),  # void*
        ("pPmSamplingObject", c_void_p),  # CUpti_PmSampling_Object*
        ("counterDataSize", c_size_t),  # size_t
        ("pCounterData", c_void_p),  # uint8_t*
    ]


class CUpti_PmSampling_GetCounterDataInfo_Params(_Params):
    _fields_ = [
        ("structSize", c_size_t),  # size_t
        ("pPriv", c_void_p),  # void*
        ("pCounterDataImage", c_void_p),  # const uint8_t*
        ("counterDataImageSize", c_size_t),  # size_t
        ("numTotalSamples", c_size_t),  # size_t
        ("numPopulatedSamples", c_size_t),  # size_t
        ("numCompletedSamples", c_size_t),  # size_t
    ]


class CUpti_PmSampling_CounterData_GetSampleInfo_Params(_Params):
    _fields_ = [
        ("structSize", c_size_t),  # size_t
        ("pPriv", c_void_p),  # void*
        ("pPmSamplingObject", c_void_p),  # CUpti_PmSampling_Object*
        ("pCounterDataImage", c_void_p),  # const uint8_t*
        ("counterDataImageSize", c_size_t),  # size_t
        ("sampleIndex", c_size_t),  # size_t
        ("startTimestamp", c_uint64),  # uint64_t
        ("endTimestamp", c_uint64),  # uint64_t
    ]


class CUpti_Checkpoint(_Params):
    _fields_ = [
        ("structSize", c_size_t),  # size_t
        ("ctx", c_void_p),  # CUcontext
        ("reserveDeviceMB", c_size_t),  # size_t
        ("reserveHostMB", c_size_t),  # size_t
        ("allowOverwrite", c_uint8),  # uint8_t
        ("optimizations", c_uint8),  # uint8_t
        ("pPriv", c_void_p),  # void *
    ]


class CUpti_PCSamplingStallReason(Structure):
    _fields_ = [
        ("pcSamplingStallReasonIndex", c_uint32),  # uint32_t
        ("samples", c_uint32),  # uint32_t
    ]


class CUpti_PCSamplingPCData(_Params):
    _fields_ = [
        ("size", c_size_t),  # size_t
        ("cubinCrc", c_uint64),  # uint64_t
        ("pcOffset", c_uint64),  # uint64_t
        ("functionIndex", c_uint32),  # uint32_t
        ("pad", c_uint32),  # uint32_t
        ("functionName", c_void_p),  # char*; caller frees with libc free()
        ("stallReasonCount", c_size_t),  # size_t
        ("stallReason", POINTER(CUpti_PCSamplingStallReason)),  # CUpti_PCSamplingStallReason *
        ("correlationId", c_uint32),  # uint32_t
    ]


class CUpti_PCSamplingData(_Params):
    _fields_ = [
        ("size", c_size_t),  # size_t
        ("collectNumPcs", c_size_t),  # size_t
        ("totalSamples", c_uint64),  # uint64_t
        ("droppedSamples", c_uint64),  # uint64_t
        ("totalNumPcs", c_size_t),  # size_t
        ("remainingNumPcs", c_size_t),  # size_t
        ("rangeId", c_uint64),  # uint64_t
        ("pPcData", POINTER(CUpti_PCSamplingPCData)),  # CUpti_PCSamplingPCData *
        ("nonUsrKernelsTotalSamples", c_uint64),  # uint64_t
        ("hardwareBufferFull", c_uint8),  # uint8_t
    ]


class CUpti_PCSamplingConfigurationInfo(Structure):
    _fields_ = [
        ("attributeType", c_int),  # CUpti_PCSamplingConfigurationAttributeType
        ("attributeStatus", c_int),  # CUptiResult
        ("attributeData", _PCSamplingAttributeData),  # union {...}
    ]


class CUpti_PCSamplingConfigurationInfoParams(_Params):
    _fields_ = [
        ("size", c_size_t),  # size_t
        ("pPriv", c_void_p),  # void*
        ("ctx", c_void_p),  # CUcontext
        ("numAttributes", c_size_t),  # size_t
        ("pPCSamplingConfigurationInfo", POINTER(CUpti_PCSamplingConfigurationInfo)),  # CUpti_PCSamplingConfigurationInfo *
    ]


class CUpti_PCSamplingEnableParams(_Params):
    _fields_ = [
        ("size", c_size_t),  # size_t
        ("pPriv", c_void_p),  # void*
        ("ctx", c_void_p),  # CUcontext
    ]


class CUpti_PCSamplingDisableParams(_Params):
    _fields_ = [
        ("size", c_size_t),  # size_t
        ("pPriv", c_void_p),  # void*
        ("ctx", c_void_p),  # CUcontext
    ]


class CUpti_PCSamplingStartParams(_Params):
    _fields_ = [
        ("size", c_size_t),  # size_t
        ("pPriv", c_void_p),  # void*
        ("ctx", c_void_p),  # CUcontext
    ]


class CUpti_PCSamplingStopParams(_Params):
    _fields_ = [
        ("size", c_size_t),  # size_t
        ("pPriv", c_void_p),  # void*
        ("ctx", c_void_p),  # CUcontext
    ]


class CUpti_PCSamplingGetDataParams(_Params):
    _fields_ = [
        ("size", c_size_t),  # size_t
        ("pPriv", c_void_p),  # void*
        ("ctx", c_void_p),  # CUcontext
        ("pcSamplingData", c_void_p),  # void *
    ]


class CUpti_PCSamplingGetNumStallReasonsParams(_Params):
    _fields_ = [
        ("size", c_size_t),  # size_t
        ("pPriv", c_void_p),  # void*
        ("ctx", c_void_p),  # CUcontext
        ("numStallReasons", c_void_p),  # size_t *
    ]


class CUpti_PCSamplingGetStallReasonsParams(_Params):
    _fields_ = [
        ("size", c_size_t),  # size_t
        ("pPriv", c_void_p),  # void*
        ("ctx", c_void_p),  # CUcontext
        ("numStallReasons", c_size_t),  # size_t
        ("stallReasonIndex", c_void_p),  # uint32_t *
        ("stallReasons", POINTER(c_char_p)),  # char **
    ]


class CUpti_GetCubinCrcParams(_Params):
    _fields_ = [
        ("size", c_size_t),  # size_t
        ("cubinSize", c_size_t),  # size_t
        ("cubin", c_void_p),  # const void*
        ("cubinCrc", c_uint64),  # uint64_t
    ]


class CUpti_GetSassToSourceCorrelationParams(_Params):
    _fields_ = [
        ("size", c_size_t),  # size_t
        ("cubin", c_void_p),  # const void*
        ("functionName", c_char_p),  # const char *
        ("cubinSize", c_size_t),  # size_t
        ("lineNumber", c_uint32),  # uint32_t
        ("pcOffset", c_uint64),  # uint64_t
        ("fileName", c_void_p),  # char *; caller frees with libc free()
        ("dirName", c_void_p),  # char *; caller frees with libc free()
    ]
