"""PM sampling (cupti_pmsampling.h): the GPU's performance monitors read at a fixed interval, no replay.

1:1 with the C API. Call order (CUPTI user guide, PM sampling)::

    h = enable(device_index)
    set_config(h, config_image, hardware_buffer_size, interval, trigger, append_mode)
    image = new_counter_data(h, metrics, max_samples)      # GetCounterDataSize + CounterDataImageInitialize
    start(h) ... workload ... decode(h, image) ... stop(h)
    counter_data_info(image); sample_info(h, image, i)     # then evaluate with host.ProfilerHost(PM_SAMPLING)
    sample_times_into(h, image, 0, n, out)                 # many samples' timestamps at once
    disable(h)

``h`` is the ``CUpti_PmSampling_Object*`` as an integer. ``decode`` moves samples from the hardware buffer into
a counter-data image; it returns when the image is full or the buffer is empty. A hardware buffer that filled
before it was decoded shows as ``overflow`` or as ``CUPTI_ERROR_OUT_OF_MEMORY`` from ``cuptiPmSamplingDecodeData``.
"""

from __future__ import annotations

import dataclasses
from ctypes import POINTER, c_char_p

import numpy as np

from gpuscope.cupti import _images
from gpuscope.cupti import _types as T
from gpuscope.cupti._api import Functions, params, version
from gpuscope.cupti._types import PmAppendMode, PmDecodeStopReason, PmTriggerMode
from gpuscope.cupti.profiler import pm_counter_availability as counter_availability

__all__ = [
    "enable",
    "disable",
    "set_config",
    "start",
    "stop",
    "counter_availability",
    "counter_data_size",
    "initialize_counter_data",
    "new_counter_data",
    "decode",
    "Decoded",
    "counter_data_info",
    "CounterDataInfo",
    "sample_info",
    "sample_times_into",
    "has_append_mode",
]

_P = POINTER
_f = Functions(
    "cupti_pmsampling.h",
    {
        # CUptiResult cuptiPmSamplingEnable(CUpti_PmSampling_Enable_Params* pParams)
        "cuptiPmSamplingEnable": [_P(T.CUpti_PmSampling_Enable_Params)],
        # CUptiResult cuptiPmSamplingDisable(CUpti_PmSampling_Disable_Params* pParams)
        "cuptiPmSamplingDisable": [_P(T.CUpti_PmSampling_Disable_Params)],
        # CUptiResult cuptiPmSamplingSetConfig(CUpti_PmSampling_SetConfig_Params* pParams)
        "cuptiPmSamplingSetConfig": [_P(T.CUpti_PmSampling_SetConfig_Params)],
        # CUptiResult cuptiPmSamplingStart(CUpti_PmSampling_Start_Params* pParams)
        "cuptiPmSamplingStart": [_P(T.CUpti_PmSampling_Start_Params)],
        # CUptiResult cuptiPmSamplingStop(CUpti_PmSampling_Stop_Params* pParams)
        "cuptiPmSamplingStop": [_P(T.CUpti_PmSampling_Stop_Params)],
        # CUptiResult cuptiPmSamplingDecodeData(CUpti_PmSampling_DecodeData_Params* pParams)
        "cuptiPmSamplingDecodeData": [_P(T.CUpti_PmSampling_DecodeData_Params)],
        # CUptiResult cuptiPmSamplingGetCounterDataSize(CUpti_PmSampling_GetCounterDataSize_Params* pParams)
        "cuptiPmSamplingGetCounterDataSize": [_P(T.CUpti_PmSampling_GetCounterDataSize_Params)],
        # CUptiResult cuptiPmSamplingCounterDataImageInitialize(
        #     CUpti_PmSampling_CounterDataImage_Initialize_Params* pParams)
        "cuptiPmSamplingCounterDataImageInitialize": [_P(T.CUpti_PmSampling_CounterDataImage_Initialize_Params)],
        # CUptiResult cuptiPmSamplingGetCounterDataInfo(CUpti_PmSampling_GetCounterDataInfo_Params* pParams)
        "cuptiPmSamplingGetCounterDataInfo": [_P(T.CUpti_PmSampling_GetCounterDataInfo_Params)],
        # CUptiResult cuptiPmSamplingCounterDataGetSampleInfo(CUpti_PmSampling_CounterData_GetSampleInfo_Params* pParams)
        "cuptiPmSamplingCounterDataGetSampleInfo": [_P(T.CUpti_PmSampling_CounterData_GetSampleInfo_Params)],
    },
)


def _address(image: np.ndarray) -> int:
    if not (isinstance(image, np.ndarray) and image.dtype == np.uint8 and image.flags.c_contiguous):
        raise TypeError("A counter-data image is a C-contiguous numpy uint8 array.")
    return image.ctypes.data


def has_append_mode() -> bool:
    """Whether the loaded CUPTI's SetConfig has ``hwBufferAppendMode`` (CUPTI 12.8+)."""
    return version() >= T.CUpti_PmSampling_SetConfig_Params._since_["hwBufferAppendMode"]


def enable(device_index: int) -> int:
    """``cuptiPmSamplingEnable``: a PM sampling object for a device (by CUDA device index)."""
    p = params(T.CUpti_PmSampling_Enable_Params, deviceIndex=device_index)
    _f.cuptiPmSamplingEnable(p)
    return int(p.pPmSamplingObject)


def disable(handle: int) -> None:
    """``cuptiPmSamplingDisable``: release the object made by :func:`enable`."""
    _f.cuptiPmSamplingDisable(params(T.CUpti_PmSampling_Disable_Params, pPmSamplingObject=handle))


def set_config(
    handle: int,
    config: np.ndarray,
    hardware_buffer_size: int,
    interval: int,
    trigger: PmTriggerMode = PmTriggerMode.GPU_TIME_INTERVAL,
    append_mode: PmAppendMode = PmAppendMode.KEEP_OLDEST,
) -> None:
    """``cuptiPmSamplingSetConfig``.

    *interval* is in ns for ``GPU_TIME_INTERVAL`` and in sys-clock cycles for ``GPU_SYSCLK_INTERVAL``.
    *append_mode* is ignored by CUPTI older than 12.8, which has no such field. CUPTI keeps a pointer to
    *config*: keep the array alive while sampling.
    """
    fields = dict(
        pPmSamplingObject=handle,
        configSize=config.size,
        pConfig=_address(config),
        hardwareBufferSize=int(hardware_buffer_size),
        samplingInterval=int(interval),
        triggerMode=int(trigger),
    )
    if has_append_mode():
        fields["hwBufferAppendMode"] = int(append_mode)
    _f.cuptiPmSamplingSetConfig(params(T.CUpti_PmSampling_SetConfig_Params, **fields))


def start(handle: int) -> None:
    """``cuptiPmSamplingStart``."""
    _f.cuptiPmSamplingStart(params(T.CUpti_PmSampling_Start_Params, pPmSamplingObject=handle))


def stop(handle: int) -> None:
    """``cuptiPmSamplingStop``."""
    _f.cuptiPmSamplingStop(params(T.CUpti_PmSampling_Stop_Params, pPmSamplingObject=handle))


def counter_data_size(handle: int, metrics, max_samples: int) -> int:
    """``cuptiPmSamplingGetCounterDataSize``: bytes of a counter-data image for *max_samples* samples."""
    metrics = list(metrics)
    names = (c_char_p * len(metrics))(*[m.encode() for m in metrics])
    p = params(
        T.CUpti_PmSampling_GetCounterDataSize_Params,
        pPmSamplingObject=handle,
        pMetricNames=names,
        numMetrics=len(metrics),
        maxSamples=int(max_samples),
    )
    _f.cuptiPmSamplingGetCounterDataSize(p)
    return int(p.counterDataSize)


def initialize_counter_data(handle: int, image: np.ndarray) -> None:
    """``cuptiPmSamplingCounterDataImageInitialize``: (re)initialise an image, emptying it.

    The image must have the size :func:`counter_data_size` gave; it is trusted from then on
    (:mod:`gpuscope.cupti._images`)."""
    p = params(
        T.CUpti_PmSampling_CounterDataImage_Initialize_Params,
        pPmSamplingObject=handle,
        counterDataSize=image.size,
        pCounterData=_address(image),
    )
    _f.cuptiPmSamplingCounterDataImageInitialize(p)
    _images.trust(image, _images.Kind.PM_SAMPLING)


def new_counter_data(handle: int, metrics, max_samples: int) -> np.ndarray:
    """A fresh, initialised counter-data image for *max_samples* samples of *metrics*."""
    image = np.zeros(counter_data_size(handle, metrics, max_samples), dtype=np.uint8)
    initialize_counter_data(handle, image)
    return image


@dataclasses.dataclass(frozen=True)
class Decoded:
    """What one ``cuptiPmSamplingDecodeData`` call reported."""

    stop_reason: PmDecodeStopReason
    overflow: bool  # the hardware buffer overflowed: samples were lost before this decode


def decode(handle: int, image: np.ndarray) -> Decoded:
    """``cuptiPmSamplingDecodeData``: move samples from the hardware buffer into *image*.

    Raises
    ------
    CuptiMemoryError
        CUPTI_ERROR_OUT_OF_MEMORY: the hardware buffer filled before it was decoded.
    """
    p = params(
        T.CUpti_PmSampling_DecodeData_Params,
        pPmSamplingObject=handle,
        pCounterDataImage=_address(image),
        counterDataImageSize=image.size,
    )
    _f.cuptiPmSamplingDecodeData(p)
    reason = p.decodeStopReason
    reason = PmDecodeStopReason(reason) if reason in PmDecodeStopReason._value2member_map_ else PmDecodeStopReason.OTHER
    return Decoded(stop_reason=reason, overflow=bool(p.overflow))


def _check_populated(image: np.ndarray, first: int, count: int) -> np.ndarray:
    """What CUPTI may read of a sound *image* (see ``_images.check``); raise unless samples
    ``first .. first+count-1`` are populated in it."""
    image, _ = _images.check(image, _images.Kind.PM_SAMPLING, count=_completed, what="image")
    populated = _info(image).populated
    _images.check_indices(_images.ImageInfo(_images.Kind.PM_SAMPLING, populated), int(first), int(count))
    return image


@dataclasses.dataclass(frozen=True)
class CounterDataInfo:
    """``cuptiPmSamplingGetCounterDataInfo``: sample counts of a counter-data image."""

    total: int  # capacity
    populated: int
    completed: int  # samples that can be evaluated


def counter_data_info(image: np.ndarray) -> CounterDataInfo:
    """Sample counts of a counter-data image (needs no sampling object: works offline).

    Raises
    ------
    CounterDataImageError
        Not a PM sampling counter-data image that CUPTI can read (checked first: see :mod:`._images`).
    """
    image, _ = _images.check(image, _images.Kind.PM_SAMPLING, count=_completed, what="image")
    return _info(image)


def _info(image: np.ndarray) -> CounterDataInfo:
    """``cuptiPmSamplingGetCounterDataInfo`` unchecked: only for images known to be sound."""
    p = params(
        T.CUpti_PmSampling_GetCounterDataInfo_Params, pCounterDataImage=_address(image), counterDataImageSize=image.size
    )
    _f.cuptiPmSamplingGetCounterDataInfo(p)
    return CounterDataInfo(int(p.numTotalSamples), int(p.numPopulatedSamples), int(p.numCompletedSamples))


def _completed(image: np.ndarray) -> int:
    """Completed samples of a sound image (``_images.check``'s count for PM sampling images)."""
    return _info(image).completed


def sample_info(handle: int | None, image: np.ndarray, index: int) -> tuple[int, int]:
    """``cuptiPmSamplingCounterDataGetSampleInfo``: (start, end) CUPTI timestamps in ns of sample *index*.

    Raises
    ------
    CounterDataImageError
        *image* is not a sound PM sampling image or does not hold sample *index* (populated samples).
    """
    image = _check_populated(image, index, 1)
    p = params(
        T.CUpti_PmSampling_CounterData_GetSampleInfo_Params,
        pPmSamplingObject=handle,
        pCounterDataImage=_address(image),
        counterDataImageSize=image.size,
        sampleIndex=index,
    )
    _f.cuptiPmSamplingCounterDataGetSampleInfo(p)
    return int(p.startTimestamp), int(p.endTimestamp)


def sample_times_into(handle: int, image: np.ndarray, first: int, count: int, out: np.ndarray) -> None:
    """``cuptiPmSamplingCounterDataGetSampleInfo`` for samples ``first .. first+count-1``, one params struct reused:
    row ``k`` of *out* (int64, shape ``(>= count, 2)``) gets the (start, end) CUPTI timestamps of ``first + k``.

    Raises
    ------
    ValueError
        *out* is not a C-contiguous int64 array of shape ``(>= count, 2)``.
    """
    if not (isinstance(out, np.ndarray) and out.dtype == np.int64 and out.flags.c_contiguous):
        raise ValueError("out must be a C-contiguous int64 numpy array.")
    if out.ndim != 2 or out.shape[1] != 2 or out.shape[0] < count:
        raise ValueError(f"out must have shape (>= {count}, 2); got {out.shape}.")
    image = _check_populated(image, first, count)
    p = params(
        T.CUpti_PmSampling_CounterData_GetSampleInfo_Params,
        pPmSamplingObject=handle,
        pCounterDataImage=_address(image),
        counterDataImageSize=image.size,
    )
    get = _f.cuptiPmSamplingCounterDataGetSampleInfo
    for k in range(count):
        p.sampleIndex = first + k
        get(p)
        out[k, 0] = p.startTimestamp
        out[k, 1] = p.endTimestamp
