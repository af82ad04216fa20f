"""The CUPTI Profiler Host API (cupti_profiler_host.h): works with no GPU and no driver on CUPTI 12.6-13.1.

Chips, metric names and properties, config images, pass counts, and evaluation of counter-data images.
The strings CUPTI returns are owned by CUPTI and live only as long as the host object, so they are copied out
at once.
"""

from __future__ import annotations

import ctypes
import dataclasses
import weakref
from ctypes import POINTER, c_char_p

import numpy as np

from gpuscope.cupti import _types as T
from gpuscope.cupti._api import Functions, params
from gpuscope.cupti._types import MetricCollectionScope, MetricType, ProfilerType
from gpuscope.errors import GpuscopeWarning

__all__ = [
    "ProfilerHost",
    "Evaluator",
    "MetricProperties",
    "supported_chips",
    "num_passes",
    "max_metrics_per_pass",
    "config_image",
    "single_pass_sets",
    "range_name",
]

_P = POINTER
_f = Functions(
    "cupti_profiler_host.h",
    {
        # CUptiResult cuptiProfilerHostGetSupportedChips(CUpti_Profiler_Host_GetSupportedChips_Params* pParams)
        "cuptiProfilerHostGetSupportedChips": [_P(T.CUpti_Profiler_Host_GetSupportedChips_Params)],
        # CUptiResult cuptiProfilerHostInitialize(CUpti_Profiler_Host_Initialize_Params* pParams)
        "cuptiProfilerHostInitialize": [_P(T.CUpti_Profiler_Host_Initialize_Params)],
        # CUptiResult cuptiProfilerHostDeinitialize(CUpti_Profiler_Host_Deinitialize_Params* pParams)
        "cuptiProfilerHostDeinitialize": [_P(T.CUpti_Profiler_Host_Deinitialize_Params)],
        # CUptiResult cuptiProfilerHostGetBaseMetrics(CUpti_Profiler_Host_GetBaseMetrics_Params* pParams)
        "cuptiProfilerHostGetBaseMetrics": [_P(T.CUpti_Profiler_Host_GetBaseMetrics_Params)],
        # CUptiResult cuptiProfilerHostGetSubMetrics(CUpti_Profiler_Host_GetSubMetrics_Params* pParams)
        "cuptiProfilerHostGetSubMetrics": [_P(T.CUpti_Profiler_Host_GetSubMetrics_Params)],
        # CUptiResult cuptiProfilerHostGetMetricProperties(CUpti_Profiler_Host_GetMetricProperties_Params* pParams)
        "cuptiProfilerHostGetMetricProperties": [_P(T.CUpti_Profiler_Host_GetMetricProperties_Params)],
        # CUptiResult cuptiProfilerHostGetRangeName(CUpti_Profiler_Host_GetRangeName_Params* pParams)
        "cuptiProfilerHostGetRangeName": [_P(T.CUpti_Profiler_Host_GetRangeName_Params)],
        # CUptiResult cuptiProfilerHostEvaluateToGpuValues(CUpti_Profiler_Host_EvaluateToGpuValues_Params* pParams)
        "cuptiProfilerHostEvaluateToGpuValues": [_P(T.CUpti_Profiler_Host_EvaluateToGpuValues_Params)],
        # CUptiResult cuptiProfilerHostConfigAddMetrics(CUpti_Profiler_Host_ConfigAddMetrics_Params* pParams)
        "cuptiProfilerHostConfigAddMetrics": [_P(T.CUpti_Profiler_Host_ConfigAddMetrics_Params)],
        # CUptiResult cuptiProfilerHostGetConfigImageSize(CUpti_Profiler_Host_GetConfigImageSize_Params* pParams)
        "cuptiProfilerHostGetConfigImageSize": [_P(T.CUpti_Profiler_Host_GetConfigImageSize_Params)],
        # CUptiResult cuptiProfilerHostGetConfigImage(CUpti_Profiler_Host_GetConfigImage_Params* pParams)
        "cuptiProfilerHostGetConfigImage": [_P(T.CUpti_Profiler_Host_GetConfigImage_Params)],
        # CUptiResult cuptiProfilerHostGetNumOfPasses(CUpti_Profiler_Host_GetNumOfPasses_Params* pParams)
        "cuptiProfilerHostGetNumOfPasses": [_P(T.CUpti_Profiler_Host_GetNumOfPasses_Params)],
        # CUptiResult cuptiProfilerHostGetMaxNumHardwareMetricsPerPass(
        #     CUpti_Profiler_Host_GetMaxNumHardwareMetricsPerPass_Params* pParams)
        "cuptiProfilerHostGetMaxNumHardwareMetricsPerPass": [
            _P(T.CUpti_Profiler_Host_GetMaxNumHardwareMetricsPerPass_Params)
        ],
        # CUptiResult cuptiProfilerHostGetSinglePassSets(CUpti_Profiler_Host_GetSinglePassSets_Params* pParams)
        "cuptiProfilerHostGetSinglePassSets": [_P(T.CUpti_Profiler_Host_GetSinglePassSets_Params)],
        # CUptiResult cuptiProfilerHostGetMetricsInSinglePassSet(
        #     CUpti_Profiler_Host_GetMetricsInSinglePassSet_Params* pParams)
        "cuptiProfilerHostGetMetricsInSinglePassSet": [_P(T.CUpti_Profiler_Host_GetMetricsInSinglePassSet_Params)],
    },
    since={
        "cuptiProfilerHostGetSinglePassSets": (13, 2),
        "cuptiProfilerHostGetMetricsInSinglePassSet": (13, 2),
    },
)


@dataclasses.dataclass(frozen=True)
class MetricProperties:
    """What CUPTI says about one metric."""

    name: str
    description: str
    hw_unit: str
    units: str  # CUPTI's "dim unit", e.g. "percent", "nanosecond", "gpc_cycle"
    metric_type: MetricType
    scope: MetricCollectionScope | None  # CUPTI 13.1+; None before


def _strings(array, count: int) -> list[str]:
    return [array[i].decode() for i in range(count)]


def _u8(buffer) -> int:
    """Address of a bytes-like buffer (numpy array, ctypes array) for a ``uint8_t*`` field."""
    if isinstance(buffer, np.ndarray):
        return buffer.ctypes.data
    return ctypes.addressof(buffer)


def _as_u8_array(data) -> np.ndarray:
    """A C-contiguous uint8 numpy view or copy of bytes-like *data*."""
    if isinstance(data, np.ndarray) and data.dtype == np.uint8 and data.flags.c_contiguous:
        return data
    return np.frombuffer(bytes(data), dtype=np.uint8).copy()


def _availability(image, chip: str, profiler_type, what: str = "counter_availability"):
    """*image* checked as *chip*'s counter-availability image (see :mod:`gpuscope.cupti._images`), or None."""
    from gpuscope.cupti import _images

    if image is None:
        return None
    return _images.check_flat(image, _images.Kind.AVAILABILITY, chip=chip, profiler_type=profiler_type, what=what,
                              known_chips=supported_chips)


def supported_chips() -> list[str]:
    """Chip names the loaded CUPTI supports (e.g. ``"GH100"``)."""
    p = params(T.CUpti_Profiler_Host_GetSupportedChips_Params)
    _f.cuptiProfilerHostGetSupportedChips(p)
    return _strings(p.ppChipNames, p.numChips)


def num_passes(config: bytes | np.ndarray) -> int:
    """How many passes a config image needs.

    Raises
    ------
    ImageError
        *config* is not a config image CUPTI can read (empty, truncated, corrupted): checked before CUPTI reads it,
        see :mod:`gpuscope.cupti._images`.
    """
    from gpuscope.cupti import _images

    image = _images.check_flat(config, _images.Kind.CONFIG, what="config", known_chips=supported_chips)
    p = params(T.CUpti_Profiler_Host_GetNumOfPasses_Params, configImageSize=image.size, pConfigImage=_u8(image))
    _f.cuptiProfilerHostGetNumOfPasses(p)
    return int(p.numOfPasses)


def max_metrics_per_pass(chip: str, profiler_type: ProfilerType, counter_availability=None) -> int:
    """The most hardware metrics one pass can hold for *chip* and *profiler_type*.

    Raises
    ------
    ImageError
        *counter_availability* is not a sound availability image of *chip*.
    """
    image = _availability(counter_availability, chip, profiler_type)
    p = params(
        T.CUpti_Profiler_Host_GetMaxNumHardwareMetricsPerPass_Params,
        profilerType=int(profiler_type),
        pChipName=chip.encode(),
        pCounterAvailabilityImage=None if image is None else _u8(image),
    )
    _f.cuptiProfilerHostGetMaxNumHardwareMetricsPerPass(p)
    return int(p.maxMetricsPerPass)


def single_pass_sets(chip: str) -> list[str]:
    """Names of CUPTI's predefined single-pass metric sets for *chip* (CUPTI 13.2+)."""
    p = params(T.CUpti_Profiler_Host_GetSinglePassSets_Params, pChipName=chip.encode())
    _f.cuptiProfilerHostGetSinglePassSets(p)
    names = (c_char_p * p.numOfSinglePassSets)()
    p.ppSinglePassSets = ctypes.cast(names, POINTER(c_char_p))
    _f.cuptiProfilerHostGetSinglePassSets(p)
    return _strings(names, p.numOfSinglePassSets)


def _deinitialize(handle: int) -> None:
    try:
        _f.cuptiProfilerHostDeinitialize(params(T.CUpti_Profiler_Host_Deinitialize_Params, pHostObject=handle))
    except Exception as exc:  # cleanup must not raise
        import warnings

        warnings.warn(f"cuptiProfilerHostDeinitialize failed: {exc}", GpuscopeWarning, stacklevel=2)


class ProfilerHost:
    """A CUPTI Profiler Host object for one chip and profiler type.

    Works on a machine without a GPU. Metrics added with :meth:`add_metrics` accumulate into the object's
    configuration; :func:`config_image` makes a fresh object for each image.

    Parameters
    ----------
    chip : str
        CUPTI chip name, e.g. ``"GH100"`` (case-sensitive).
    profiler_type : ProfilerType
        ``RANGE_PROFILER`` or ``PM_SAMPLING``.
    counter_availability : bytes-like, optional
        The device's counter-availability image. Without it, CUPTI assumes every counter is available. One that
        CUPTI did not return in this process is checked first (:mod:`gpuscope.cupti._images`): CUPTI keeps and reads
        it without knowing its size, and crashes on a corrupted one.

    Raises
    ------
    CuptiValueError
        The chip name is not one CUPTI knows.
    ImageError
        *counter_availability* is not a sound counter-availability image of *chip*.
    """

    def __init__(self, chip: str, profiler_type=ProfilerType.RANGE_PROFILER, counter_availability=None):
        self.chip = chip
        self.profiler_type = ProfilerType(profiler_type)
        # CUPTI keeps the pointer; keep the buffer alive as long as the object.
        self._availability = _availability(counter_availability, chip, self.profiler_type)
        p = params(
            T.CUpti_Profiler_Host_Initialize_Params,
            profilerType=int(self.profiler_type),
            pChipName=chip.encode(),
            pCounterAvailabilityImage=None if self._availability is None else _u8(self._availability),
        )
        _f.cuptiProfilerHostInitialize(p)
        self._handle = p.pHostObject
        self._added: set[str] = set()
        self._finalizer = weakref.finalize(self, _deinitialize, self._handle)

    # -- lifetime ---------------------------------------------------------------------------------------
    @property
    def closed(self) -> bool:
        return not self._finalizer.alive

    def close(self) -> None:
        """Release the host object (safe to call twice)."""
        self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _h(self) -> int:
        if self.closed:
            raise ValueError("This ProfilerHost is closed.")
        return self._handle

    # -- metric enumeration -----------------------------------------------------------------------------
    def base_metrics(self, metric_type: MetricType) -> list[str]:
        """Base metric names of one type (without rollup or sub-metric suffix)."""
        p = params(T.CUpti_Profiler_Host_GetBaseMetrics_Params, pHostObject=self._h(), metricType=int(metric_type))
        _f.cuptiProfilerHostGetBaseMetrics(p)
        return _strings(p.ppMetricNames, p.numMetrics)

    def sub_metrics(self, name: str, metric_type: MetricType) -> list[str]:
        """Suffixes that complete a base metric of *metric_type* (e.g. ``.sum``, ``.avg.per_cycle_active``).

        CUPTI 12.x wants a full name (with a suffix); 13.0+ also accepts the bare base name.
        """
        p = params(
            T.CUpti_Profiler_Host_GetSubMetrics_Params,
            pHostObject=self._h(),
            metricType=int(metric_type),
            pMetricName=name.encode(),
        )
        _f.cuptiProfilerHostGetSubMetrics(p)
        return _strings(p.ppSubMetrics, p.numOfSubmetrics)

    def metric_properties(self, name: str) -> MetricProperties:
        """Description, units and type of a metric (full or base name)."""
        p = params(T.CUpti_Profiler_Host_GetMetricProperties_Params, pHostObject=self._h(), pMetricName=name.encode())
        _f.cuptiProfilerHostGetMetricProperties(p)
        has_scope = T.CUpti_Profiler_Host_GetMetricProperties_Params.struct_size((13, 1)) <= p.structSize
        return MetricProperties(
            name=name,
            description=(p.pDescription or b"").decode(),
            hw_unit=(p.pHwUnit or b"").decode(),
            units=(p.pDimUnit or b"").decode(),
            metric_type=MetricType(p.metricType),
            scope=MetricCollectionScope(p.metricCollectionScope) if has_scope else None,
        )

    # -- configuration ----------------------------------------------------------------------------------
    def add_metrics(self, metrics) -> None:
        """Add full metric names to this object's configuration (needed before evaluating them)."""
        new = [m for m in metrics if m not in self._added]
        if not new:
            return
        names = (c_char_p * len(new))(*[m.encode() for m in new])
        p = params(
            T.CUpti_Profiler_Host_ConfigAddMetrics_Params, pHostObject=self._h(), ppMetricNames=names, numMetrics=len(new)
        )
        _f.cuptiProfilerHostConfigAddMetrics(p)
        self._added.update(new)

    def add_pass_group(self, metrics) -> None:
        """Add *metrics* as a pass group of their own (one ``cuptiProfilerHostConfigAddMetrics`` call).

        CUPTI schedules each call's metrics into passes on their own and appends those passes to the config: a
        group that fits in one pass is collected in one pass, whatever the other groups hold, and a counter in two
        groups is collected twice (measured with CUPTI 13.0-13.1 on GH100: two groups of the same three stall
        reasons need 4 passes, the three together 2). Unlike :meth:`add_metrics`, names already added are added
        again.
        """
        metrics = list(metrics)
        if not metrics:
            return
        names = (c_char_p * len(metrics))(*[m.encode() for m in metrics])
        p = params(T.CUpti_Profiler_Host_ConfigAddMetrics_Params, pHostObject=self._h(), ppMetricNames=names,
                   numMetrics=len(metrics))
        _f.cuptiProfilerHostConfigAddMetrics(p)
        self._added.update(metrics)

    def config_image(self) -> np.ndarray:
        """The config image of the metrics added so far (uint8 array)."""
        p = params(T.CUpti_Profiler_Host_GetConfigImageSize_Params, pHostObject=self._h())
        _f.cuptiProfilerHostGetConfigImageSize(p)
        image = np.zeros(p.configImageSize, dtype=np.uint8)
        q = params(
            T.CUpti_Profiler_Host_GetConfigImage_Params,
            pHostObject=self._h(),
            configImageSize=image.size,
            pConfigImage=_u8(image),
        )
        _f.cuptiProfilerHostGetConfigImage(q)
        from gpuscope.cupti import _images

        _images.trust(image, _images.Kind.CONFIG)  # CUPTI's own: num_passes and set_config need not check it
        return image

    # -- evaluation -------------------------------------------------------------------------------------
    def evaluate(self, counter_data, range_index: int, metrics) -> np.ndarray:
        """Metric values (float64) of one range (range profiler) or sample (PM sampling) of a counter-data image.

        The metrics are added to this object's configuration first if they are not there yet.

        Raises
        ------
        CounterDataImageError
            *counter_data* is not a sound image of this object's profiler type, or does not hold *range_index*.
        """
        evaluator = self.evaluator(metrics)
        values = np.zeros((1, len(evaluator.metrics)), dtype=np.float64)
        evaluator.evaluate_into(_as_u8_array(counter_data), range_index, 1, values)
        return values[0]

    def evaluator(self, metrics) -> "Evaluator":
        """An :class:`Evaluator` of *metrics* on this host object, for evaluating many ranges or samples fast.

        The metrics are added to this object's configuration first if they are not there yet.
        """
        return Evaluator(self, metrics)


class Evaluator:
    """Evaluates a fixed list of metrics for many ranges or samples, reusing one params struct.

    Made by :meth:`ProfilerHost.evaluator`. Only the image, ``rangeIndex`` and ``pMetricValues`` change between
    calls, which makes evaluation about 2.5 times faster than :meth:`ProfilerHost.evaluate` per sample. One
    evaluator is not safe to use from two threads at once; give each thread its own host object and evaluator.
    """

    def __init__(self, host: ProfilerHost, metrics):
        self.metrics = list(metrics)
        host.add_metrics(self.metrics)
        self._host = host  # keeps the host object alive
        self._names = (c_char_p * len(self.metrics))(*[m.encode() for m in self.metrics])
        self._params = params(
            T.CUpti_Profiler_Host_EvaluateToGpuValues_Params,
            pHostObject=host._h(),
            ppMetricNames=self._names,
            numMetrics=len(self.metrics),
        )

    def evaluate_into(self, counter_data: np.ndarray, first: int, count: int, out: np.ndarray) -> None:
        """Evaluate ranges/samples ``first .. first+count-1`` of *counter_data* into rows ``0 .. count-1`` of *out*.

        Parameters
        ----------
        counter_data : numpy.ndarray
            A C-contiguous uint8 counter-data image.
        first, count : int
            The first range/sample index and how many to evaluate.
        out : numpy.ndarray
            C-contiguous float64, shape ``(>= count, len(metrics))``; row ``k`` gets range ``first + k``.

        Raises
        ------
        ValueError
            *out* has the wrong dtype, layout or shape, or the host object is closed.
        CounterDataImageError
            *counter_data* is not a sound image of the host object's profiler type (checked before CUPTI reads it,
            see :mod:`gpuscope.cupti._images`), or ``first .. first+count-1`` are not samples/ranges it holds.
        """
        m = len(self.metrics)
        if not (isinstance(out, np.ndarray) and out.dtype == np.float64 and out.flags.c_contiguous):
            raise ValueError("out must be a C-contiguous float64 numpy array.")
        if out.ndim != 2 or out.shape[1] != m or out.shape[0] < count:
            raise ValueError(f"out must have shape (>= {count}, {m}); got {out.shape}.")
        from gpuscope.cupti import _images, pm_sampling, range_profiler

        if self._host.profiler_type is ProfilerType.PM_SAMPLING:
            kind, counted = _images.Kind.PM_SAMPLING, pm_sampling._completed
        else:
            kind, counted = _images.Kind.RANGE_PROFILER, range_profiler._num_ranges_raw
        image, info = _images.check(counter_data, kind, count=counted, chip=self._host.chip, metrics=self.metrics)
        _images.check_indices(info, int(first), int(count))
        self._evaluate_raw(image, first, count, out)

    def _evaluate_raw(self, counter_data: np.ndarray, first: int, count: int, out: np.ndarray) -> None:
        """:meth:`evaluate_into` without any check (for images known to be sound)."""
        m = len(self.metrics)
        p = self._params
        p.pHostObject = self._host._h()
        p.pCounterDataImage = counter_data.ctypes.data
        p.counterDataImageSize = counter_data.size
        evaluate, base, row = _f.cuptiProfilerHostEvaluateToGpuValues, out.ctypes.data, 8 * m
        for k in range(count):
            p.rangeIndex = first + k
            p.pMetricValues = base + k * row
            evaluate(p)


def range_name(counter_data, range_index: int, delimiter: str = "/") -> str:
    """The full name of range *range_index* in a range-profiler counter-data image, levels joined by *delimiter*.

    Raises
    ------
    CounterDataImageError
        Not a sound range-profiler image (a PM sampling image crashes CUPTI here), or no range *range_index*.
    """
    from gpuscope.cupti import _images, range_profiler

    image, info = _images.check(counter_data, _images.Kind.RANGE_PROFILER, count=range_profiler._num_ranges_raw)
    _images.check_indices(info, int(range_index), 1)
    return _range_name_raw(image, range_index, delimiter)


def _range_name_raw(counter_data, range_index: int, delimiter: str = "/") -> str:
    """:func:`range_name` without checks (for images known to be sound)."""
    image = _as_u8_array(counter_data)
    p = params(
        T.CUpti_Profiler_Host_GetRangeName_Params,
        pCounterDataImage=_u8(image),
        counterDataImageSize=image.size,
        rangeIndex=range_index,
        delimiter=delimiter.encode(),
    )
    _f.cuptiProfilerHostGetRangeName(p)
    try:
        return ctypes.string_at(p.pRangeName).decode() if p.pRangeName else ""
    finally:
        if p.pRangeName:
            _libc_free(p.pRangeName)  # the header: the caller owns pRangeName


def _libc_free(address: int) -> None:
    free = ctypes.CDLL(None).free
    free.argtypes = [ctypes.c_void_p]
    free.restype = None
    free(address)


def config_image(chip: str, profiler_type: ProfilerType, metrics, counter_availability=None) -> np.ndarray:
    """A config image for *metrics* on *chip*, made on a fresh host object."""
    with ProfilerHost(chip, profiler_type, counter_availability) as host:
        host.add_metrics(list(metrics))
        return host.config_image()
