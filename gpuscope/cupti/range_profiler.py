"""The CUPTI Range Profiler (cupti_range_profiler.h): 1:1 with the C API, no policy.

Call order (CUPTI user guide 2.13): :class:`RangeProfiler` (``cuptiRangeProfilerEnable``) on a context;
:meth:`~RangeProfiler.counter_data_image` (GetCounterDataSize + CounterDataImageInitialize);
:meth:`~RangeProfiler.set_config`; then per pass ``start``, ranges (``push_range``/``pop_range`` for user
ranges, or kernel launches for auto ranges), ``stop``; ``decode``; :func:`num_ranges` and :func:`range_name`
read the image, and :meth:`gpuscope.cupti.host.ProfilerHost.evaluate` turns it into values.
``ctx`` arguments are ``CUcontext`` handles as integers.
"""

from __future__ import annotations

import ctypes
import dataclasses
import warnings
import weakref
from ctypes import POINTER, c_char_p

import numpy as np

from gpuscope.cupti import _images
from gpuscope.cupti import _types as T
from gpuscope.cupti._api import Functions, params
from gpuscope.cupti._types import ProfilerRange, ReplayMode
from gpuscope.errors import GpuscopeWarning

__all__ = ["RangeProfiler", "StopResult", "num_ranges", "range_name"]

_P = POINTER
_f = Functions(
    "cupti_range_profiler.h",
    {
        # CUptiResult cuptiRangeProfilerEnable(CUpti_RangeProfiler_Enable_Params* pParams)
        "cuptiRangeProfilerEnable": [_P(T.CUpti_RangeProfiler_Enable_Params)],
        # CUptiResult cuptiRangeProfilerDisable(CUpti_RangeProfiler_Disable_Params* pParams)
        "cuptiRangeProfilerDisable": [_P(T.CUpti_RangeProfiler_Disable_Params)],
        # CUptiResult cuptiRangeProfilerSetConfig(CUpti_RangeProfiler_SetConfig_Params* pParams)
        "cuptiRangeProfilerSetConfig": [_P(T.CUpti_RangeProfiler_SetConfig_Params)],
        # CUptiResult cuptiRangeProfilerStart(CUpti_RangeProfiler_Start_Params* pParams)
        "cuptiRangeProfilerStart": [_P(T.CUpti_RangeProfiler_Start_Params)],
        # CUptiResult cuptiRangeProfilerStop(CUpti_RangeProfiler_Stop_Params* pParams)
        "cuptiRangeProfilerStop": [_P(T.CUpti_RangeProfiler_Stop_Params)],
        # CUptiResult cuptiRangeProfilerPushRange(CUpti_RangeProfiler_PushRange_Params* pParams)
        "cuptiRangeProfilerPushRange": [_P(T.CUpti_RangeProfiler_PushRange_Params)],
        # CUptiResult cuptiRangeProfilerPopRange(CUpti_RangeProfiler_PopRange_Params* pParams)
        "cuptiRangeProfilerPopRange": [_P(T.CUpti_RangeProfiler_PopRange_Params)],
        # CUptiResult cuptiRangeProfilerDecodeData(CUpti_RangeProfiler_DecodeData_Params* pParams)
        "cuptiRangeProfilerDecodeData": [_P(T.CUpti_RangeProfiler_DecodeData_Params)],
        # CUptiResult cuptiRangeProfilerGetCounterDataSize(CUpti_RangeProfiler_GetCounterDataSize_Params* pParams)
        "cuptiRangeProfilerGetCounterDataSize": [_P(T.CUpti_RangeProfiler_GetCounterDataSize_Params)],
        # CUptiResult cuptiRangeProfilerCounterDataImageInitialize(
        #     CUpti_RangeProfiler_CounterDataImage_Initialize_Params* pParams)
        "cuptiRangeProfilerCounterDataImageInitialize": [_P(T.CUpti_RangeProfiler_CounterDataImage_Initialize_Params)],
        # CUptiResult cuptiRangeProfilerGetCounterDataInfo(CUpti_RangeProfiler_GetCounterDataInfo_Params* pParams)
        "cuptiRangeProfilerGetCounterDataInfo": [_P(T.CUpti_RangeProfiler_GetCounterDataInfo_Params)],
        # CUptiResult cuptiRangeProfilerCounterDataGetRangeInfo(
        #     CUpti_RangeProfiler_CounterData_GetRangeInfo_Params* pParams)
        "cuptiRangeProfilerCounterDataGetRangeInfo": [_P(T.CUpti_RangeProfiler_CounterData_GetRangeInfo_Params)],
    },
)


@dataclasses.dataclass(frozen=True)
class StopResult:
    """What ``cuptiRangeProfilerStop`` reports about the pass that just ended."""

    pass_index: int
    target_nesting_level: int
    all_passes_submitted: bool


def _addr(array: np.ndarray) -> int:
    return array.ctypes.data


def _disable(handle: int) -> None:
    try:
        _f.cuptiRangeProfilerDisable(params(T.CUpti_RangeProfiler_Disable_Params, pRangeProfilerObject=handle))
    except Exception as exc:  # cleanup must not raise
        warnings.warn(f"cuptiRangeProfilerDisable failed: {exc}", GpuscopeWarning, stacklevel=2)


class RangeProfiler:
    """A range profiler object on one context (``cuptiRangeProfilerEnable``; :meth:`close` disables it).

    Parameters
    ----------
    ctx : int
        The ``CUcontext`` handle to profile.

    Raises
    ------
    CuptiError
        Enable failed (e.g. ``ProfilerBusyError`` when another profiler holds the context).
    """

    def __init__(self, ctx: int):
        p = params(T.CUpti_RangeProfiler_Enable_Params, ctx=ctx)
        _f.cuptiRangeProfilerEnable(p)
        self.ctx = ctx
        self._handle = p.pRangeProfilerObject
        self._keep = {}  # id -> every buffer given to SetConfig (config images, counter data), until Disable
        self._finalizer = weakref.finalize(self, _disable, self._handle)

    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def close(self) -> None:
        """``cuptiRangeProfilerDisable`` (safe to call twice)."""
        self._finalizer()
        self._keep = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _h(self) -> int:
        if self.closed:
            raise ValueError("This RangeProfiler is closed (disabled); enable a new one.")
        return self._handle

    def counter_data_image(self, metrics, max_ranges: int, max_tree_nodes: int | None = None) -> np.ndarray:
        """A counter-data image for *metrics* and up to *max_ranges* ranges, sized and initialized by CUPTI."""
        image = np.zeros(self.counter_data_size(metrics, max_ranges, max_tree_nodes), dtype=np.uint8)
        self.initialize_counter_data(image)
        return image

    def counter_data_size(self, metrics, max_ranges: int, max_tree_nodes: int | None = None) -> int:
        """``cuptiRangeProfilerGetCounterDataSize``: bytes of a counter-data image for *metrics* and *max_ranges*.

        ``CounterDataImageInitialize`` takes no metric list: it lays an image out for the metrics and sizes of this
        object's last ``GetCounterDataSize``, so call this again before initialising an image of other metrics."""
        metrics = list(metrics)
        names = (c_char_p * len(metrics))(*[m.encode() for m in metrics])
        p = params(
            T.CUpti_RangeProfiler_GetCounterDataSize_Params,
            pRangeProfilerObject=self._h(),
            pMetricNames=ctypes.cast(names, POINTER(c_char_p)),
            numMetrics=len(metrics),
            maxNumOfRanges=max_ranges,
            maxNumRangeTreeNodes=max_tree_nodes or max_ranges,
        )
        _f.cuptiRangeProfilerGetCounterDataSize(p)
        return int(p.counterDataSize)

    def initialize_counter_data(self, image: np.ndarray) -> None:
        """``cuptiRangeProfilerCounterDataImageInitialize`` on an image of the size CUPTI asked for."""
        q = params(
            T.CUpti_RangeProfiler_CounterDataImage_Initialize_Params,
            pRangeProfilerObject=self._h(),
            counterDataSize=image.size,
            pCounterData=_addr(image),
        )
        _f.cuptiRangeProfilerCounterDataImageInitialize(q)
        _images.trust(image, _images.Kind.RANGE_PROFILER)

    def set_config(
        self,
        config: np.ndarray,
        counter_data: np.ndarray,
        range_mode: ProfilerRange,
        replay_mode: ReplayMode,
        max_ranges_per_pass: int,
        num_nesting_levels: int = 1,
        min_nesting_level: int = 1,
        pass_index: int = 0,
        target_nesting_level: int = 1,
    ) -> None:
        """``cuptiRangeProfilerSetConfig``. CUPTI keeps pointers to both buffers; this object keeps them, and those of
        every earlier SetConfig (CUPTI may still point at those after a change of configuration), alive until
        :meth:`close`."""
        p = params(
            T.CUpti_RangeProfiler_SetConfig_Params,
            pRangeProfilerObject=self._h(),
            configSize=config.size,
            pConfig=_addr(config),
            counterDataImageSize=counter_data.size,
            pCounterDataImage=_addr(counter_data),
            range=int(range_mode),
            replayMode=int(replay_mode),
            maxRangesPerPass=max_ranges_per_pass,
            numNestingLevels=num_nesting_levels,
            minNestingLevel=min_nesting_level,
            passIndex=pass_index,
            targetNestingLevel=target_nesting_level,
        )
        _f.cuptiRangeProfilerSetConfig(p)
        self._keep.update({id(config): config, id(counter_data): counter_data})

    def start(self) -> None:
        """``cuptiRangeProfilerStart``: begin a pass."""
        _f.cuptiRangeProfilerStart(params(T.CUpti_RangeProfiler_Start_Params, pRangeProfilerObject=self._h()))

    def stop(self) -> StopResult:
        """``cuptiRangeProfilerStop``: end a pass."""
        p = params(T.CUpti_RangeProfiler_Stop_Params, pRangeProfilerObject=self._h())
        _f.cuptiRangeProfilerStop(p)
        return StopResult(int(p.passIndex), int(p.targetNestingLevel), bool(p.isAllPassSubmitted))

    def push_range(self, name: str) -> None:
        """``cuptiRangeProfilerPushRange`` (user ranges)."""
        p = params(T.CUpti_RangeProfiler_PushRange_Params, pRangeProfilerObject=self._h(), pRangeName=name.encode())
        _f.cuptiRangeProfilerPushRange(p)

    def pop_range(self) -> None:
        """``cuptiRangeProfilerPopRange`` (user ranges)."""
        _f.cuptiRangeProfilerPopRange(params(T.CUpti_RangeProfiler_PopRange_Params, pRangeProfilerObject=self._h()))

    def decode(self) -> int:
        """``cuptiRangeProfilerDecodeData``: move collected data into the counter-data image; returns ranges dropped."""
        p = params(T.CUpti_RangeProfiler_DecodeData_Params, pRangeProfilerObject=self._h())
        _f.cuptiRangeProfilerDecodeData(p)
        return int(p.numOfRangeDropped)


def num_ranges(counter_data: np.ndarray) -> int:
    """``cuptiRangeProfilerGetCounterDataInfo``: ranges held in a counter-data image."""
    image = np.ascontiguousarray(counter_data, dtype=np.uint8)
    return _images.check(image, _images.Kind.RANGE_PROFILER, count=_num_ranges_raw)[1].count


def _num_ranges_raw(image: np.ndarray) -> int:
    """``cuptiRangeProfilerGetCounterDataInfo`` without the check (for the checking child process itself)."""
    p = params(T.CUpti_RangeProfiler_GetCounterDataInfo_Params, pCounterDataImage=_addr(image),
               counterDataImageSize=image.size)
    _f.cuptiRangeProfilerGetCounterDataInfo(p)
    return int(p.numTotalRanges)


def range_name(counter_data: np.ndarray, index: int, delimiter: str = "/") -> str:
    """``cuptiRangeProfilerCounterDataGetRangeInfo``: the name of range *index*, levels joined by *delimiter*."""
    image = np.ascontiguousarray(counter_data, dtype=np.uint8)
    image, info = _images.check(image, _images.Kind.RANGE_PROFILER, count=_num_ranges_raw)
    _images.check_indices(info, int(index), 1)
    p = params(
        T.CUpti_RangeProfiler_CounterData_GetRangeInfo_Params,
        pCounterDataImage=_addr(image),
        counterDataImageSize=image.size,
        rangeIndex=index,
        rangeDelimiter=delimiter.encode(),
    )
    _f.cuptiRangeProfilerCounterDataGetRangeInfo(p)
    return p.rangeName.decode() if p.rangeName else ""
