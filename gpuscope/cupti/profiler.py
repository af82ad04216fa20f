"""Target-side basics shared by the range profiler and PM sampling (cupti_profiler_target.h, cupti_target.h).

Profiler initialize/deinitialize, chip name, counter availability, and device support. These need a GPU and
its driver; ``ctx`` arguments are ``CUcontext`` handles as integers.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from ctypes import POINTER

import numpy as np

from gpuscope.cupti import _api, _images
from gpuscope.cupti import _types as T
from gpuscope.cupti._api import Functions, params, version
from gpuscope.cupti._types import ProfilerApi, SupportLevel

__all__ = [
    "initialize",
    "deinitialize",
    "chip_name",
    "counter_availability",
    "pm_counter_availability",
    "device_support",
    "DeviceSupport",
]

_f = Functions(
    "cupti_profiler_target.h",
    {
        # CUptiResult cuptiProfilerInitialize(CUpti_Profiler_Initialize_Params* pParams)
        "cuptiProfilerInitialize": [POINTER(T.CUpti_Profiler_Initialize_Params)],
        # CUptiResult cuptiProfilerDeInitialize(CUpti_Profiler_DeInitialize_Params* pParams)
        "cuptiProfilerDeInitialize": [POINTER(T.CUpti_Profiler_DeInitialize_Params)],
        # CUptiResult cuptiDeviceGetChipName(CUpti_Device_GetChipName_Params* pParams)   (cupti_target.h)
        "cuptiDeviceGetChipName": [POINTER(T.CUpti_Device_GetChipName_Params)],
        # CUptiResult cuptiProfilerGetCounterAvailability(CUpti_Profiler_GetCounterAvailability_Params* pParams)
        "cuptiProfilerGetCounterAvailability": [POINTER(T.CUpti_Profiler_GetCounterAvailability_Params)],
        # CUptiResult cuptiProfilerDeviceSupported(CUpti_Profiler_DeviceSupported_Params* pParams)
        "cuptiProfilerDeviceSupported": [POINTER(T.CUpti_Profiler_DeviceSupported_Params)],
    },
)

_pm = Functions(
    "cupti_pmsampling.h",
    {
        # CUptiResult cuptiPmSamplingGetCounterAvailability(CUpti_PmSampling_GetCounterAvailability_Params* pParams)
        "cuptiPmSamplingGetCounterAvailability": [POINTER(T.CUpti_PmSampling_GetCounterAvailability_Params)],
    },
)

# cuptiProfilerInitialize is process-wide; count users so that one client's deinitialize does not pull the
# rug from another (a range profiler and a PM sampler may be open together). A kept range profiler or PM sampler
# (gpuscope._gpu.keep) is a user too, so the count is what a cuptiFinalize would wipe: while a session is open gpuscope
# holds CUPTI's subscriber as its witness (callbacks.hold), and checks it before trusting the initialisation again.
_init_lock = threading.Lock()
_init_count = 0
CUPTI_ERROR_NOT_INITIALIZED = 15
_witness = None  # callbacks.hold()'s answer for the current initialisation
_sessions = 0  # users of the initialisation that are open sessions (the others are kept between sessions)


def initialize(context: int = 0) -> None:
    """``cuptiProfilerInitialize``, reference-counted: pair every call with :func:`deinitialize`.

    While a session is open (a user that is not something kept between sessions), gpuscope holds CUPTI's callback
    subscriber as the witness that CUPTI was not finalized under it (:func:`gpuscope.cupti.callbacks.hold`); it lets
    go of it when only kept users are left (:func:`lend_witness`, :func:`deinitialize`): held while gpuscope merely
    kept a profiler, it took the subscriber from torch.profiler, whose Kineto then recorded no GPU event (H100,
    PyTorch 2.11). A later user trusts the initialisation only once CUPTI is found to still know a witness held:
    where another client of the process finalized CUPTI since, everything gpuscope had in CUPTI is forgotten first
    and CUPTI's profiler is initialised afresh (:func:`gpuscope.cupti.callbacks.known`). Right after a
    ``cuptiFinalize`` CUPTI refuses that (``NOT_INITIALIZED``) until a call names a context: it is attached again
    through *context* (a ``CUcontext``; 0: the thread's current one) and asked once more."""
    global _init_count, _witness, _sessions
    from gpuscope.cupti import callbacks

    if _init_count:
        callbacks.held(_witness)  # another client's cuptiFinalize since resets the count (_after_detach)
    with _init_lock:
        if _init_count and _sessions:  # a session holds the witness already
            _init_count += 1
            _sessions += 1
            return
    witness = callbacks.hold()  # outside the lock: it may find a finalize and reset this module
    with _init_lock:
        try:
            if _init_count == 0:
                _initialize_after_any_finalize(context)
            if not _sessions:  # the first session: it holds the witness
                _witness, witness = witness, None
            _init_count += 1
            _sessions += 1
        finally:
            if witness is not None:  # not needed, or CUPTI refused: the hold ends
                callbacks.let_go(witness)


def _initialize_after_any_finalize(context: int) -> None:
    """``cuptiProfilerInitialize``; where CUPTI answers ``NOT_INITIALIZED`` (right after a ``cuptiFinalize``,
    measured on the H100 with CUPTI 13.0: gpuscope/_pc_sampling/counters.py), attach it again through *context* or
    the thread's current one (:func:`_api.reattach`) and ask once more."""
    from gpuscope.errors import CuptiError

    try:
        _f.cuptiProfilerInitialize(params(T.CUpti_Profiler_Initialize_Params))
        return
    except CuptiError as exc:
        context = context or _current_context()
        if exc.status != CUPTI_ERROR_NOT_INITIALIZED or not context:
            raise
    _api.reattach(context)
    _f.cuptiProfilerInitialize(params(T.CUpti_Profiler_Initialize_Params))


def _current_context() -> int:
    """The calling thread's current ``CUcontext`` (0: none, or no driver)."""
    try:
        from cuda.bindings import driver

        err, ctx = driver.cuCtxGetCurrent()
        return int(ctx) if int(err) == 0 and ctx else 0
    except Exception:  # no cuda-bindings, no driver: nothing to attach through
        return 0


def lend_witness() -> int | None:
    """A session's initialisation is handed to something kept between sessions (:func:`gpuscope._gpu.keep.keep`):
    where no session is left open, the subscriber goes back (torch.profiler may take it). Returns what vouches for
    the kept thing: None where another client held the subscriber (nothing should be kept), else 0 (nothing vouches
    any more: a finalize by another client while nothing is open is found when CUPTI refuses the kept profiler,
    :meth:`gpuscope.Profiler.start`)."""
    global _sessions

    with _init_lock:
        if not _init_count:
            return 0
        had = _witness
        _sessions = max(_sessions - 1, 0)
        _give_back_if_only_kept()
    return None if had is None else 0


def _give_back_if_only_kept() -> None:
    """Under ``_init_lock``: where no session is left open, let go of the subscriber the initialisation holds."""
    global _witness
    from gpuscope.cupti import callbacks

    if not _sessions and _witness:
        last, _witness = _witness, 0
        callbacks.let_go(last)


def _before_detach() -> None:
    if _init_count:
        raise RuntimeError(f"{_init_count} user(s) of the CUPTI profiler are open (cuptiProfilerInitialize): a "
                           "gpuscope.Profiler or gpuscope.sample session not yet closed")


def deinitialize(kept: bool = False) -> None:
    """Release one :func:`initialize` (*kept*: the one of something kept between sessions); the last one calls
    ``cuptiProfilerDeInitialize``. The subscriber goes back when no session is left open."""
    global _init_count, _witness, _sessions
    from gpuscope.cupti import callbacks

    with _init_lock:
        if _init_count == 0:
            return
        _init_count -= 1
        if not kept and _sessions:
            _sessions -= 1
        if _init_count:
            _give_back_if_only_kept()  # only kept users left: the subscriber goes back
            return
        last, _witness, _sessions = _witness, None, 0
        try:
            _f.cuptiProfilerDeInitialize(params(T.CUpti_Profiler_DeInitialize_Params))
        finally:
            callbacks.let_go(last)


def _after_detach() -> None:
    """CUPTI forgot its profiler initialisation (a detach, or another client's cuptiFinalize): no user holds one."""
    global _init_count, _witness, _sessions
    with _init_lock:
        _init_count, _witness, _sessions = 0, None, 0


def _forget_in_child() -> None:  # a forked child has no CUPTI profiler of its own
    global _init_lock, _init_count, _witness, _sessions
    _init_lock = threading.Lock()
    _init_count, _witness, _sessions = 0, None, 0


_api.on_detach(_before_detach, _after_detach)
os.register_at_fork(after_in_child=_forget_in_child)


def chip_name(device_index: int) -> str:
    """CUPTI's chip name of a device (e.g. ``"GH100"``). Needs :func:`initialize`."""
    p = params(T.CUpti_Device_GetChipName_Params, deviceIndex=device_index)
    _f.cuptiDeviceGetChipName(p)
    return p.pChipName.decode()


def counter_availability(ctx: int, allow_device_level_counters: bool = False) -> np.ndarray:
    """The range profiler's counter-availability image for a context (two calls: size, then data)."""
    p = params(T.CUpti_Profiler_GetCounterAvailability_Params, ctx=ctx)
    if version() >= (13, 1):
        p.bAllowDeviceLevelCounters = int(allow_device_level_counters)
    _f.cuptiProfilerGetCounterAvailability(p)
    image = np.zeros(p.counterAvailabilityImageSize, dtype=np.uint8)
    p.pCounterAvailabilityImage = image.ctypes.data
    _f.cuptiProfilerGetCounterAvailability(p)
    _images.trust(image, _images.Kind.AVAILABILITY)  # CUPTI's own: the host API need not check it
    return image


_pm_availability: dict[int, np.ndarray] = {}


def pm_counter_availability(device_index: int, cached: bool = True) -> np.ndarray:
    """PM sampling's counter-availability image for a device (two calls: size, then data).

    With *cached* (the default), the image is queried once per device and process and kept, read-only: the two
    calls take 0.11-0.16 s on the H100 (CUPTI 13.0), paid by every session otherwise, and the image describes
    the chip's counters, which do not change while the process runs.
    """
    if cached and device_index in _pm_availability:
        return _pm_availability[device_index]
    p = params(T.CUpti_PmSampling_GetCounterAvailability_Params, deviceIndex=device_index)
    _pm.cuptiPmSamplingGetCounterAvailability(p)
    image = np.zeros(p.counterAvailabilityImageSize, dtype=np.uint8)
    p.pCounterAvailabilityImage = image.ctypes.data
    _pm.cuptiPmSamplingGetCounterAvailability(p)
    image.flags.writeable = False
    _images.trust(image, _images.Kind.AVAILABILITY)
    _pm_availability[device_index] = image
    return image


os.register_at_fork(after_in_child=_pm_availability.clear)  # a child queries its own


def availability_cached(device_index: int) -> bool:
    """True when :func:`pm_counter_availability` will answer *device_index* from its cache, without CUPTI."""
    return device_index in _pm_availability


@dataclasses.dataclass(frozen=True)
class DeviceSupport:
    """``cuptiProfilerDeviceSupported``'s answer for one device and profiling API."""

    api: ProfilerApi
    overall: SupportLevel
    details: dict  # architecture, sli, vGpu, confidentialCompute, cmp, wsl, (13.1+) sku -> SupportLevel

    @property
    def supported(self) -> bool:
        return self.overall in (SupportLevel.SUPPORTED, SupportLevel.LIMITED_SUPPORT)

    def reasons(self) -> list[str]:
        """The aspects that are not supported, e.g. ``["vGpu: DISABLED"]``."""
        return [
            f"{k}: {v.name}"
            for k, v in self.details.items()
            if v not in (SupportLevel.SUPPORTED, SupportLevel.LIMITED_SUPPORT, SupportLevel.UNKNOWN)
        ]


def device_support(cu_device: int, api: ProfilerApi = ProfilerApi.RANGE_PROFILING) -> DeviceSupport:
    """Whether CUPTI can profile *cu_device* with *api*, and which aspect stops it if not."""
    p = params(T.CUpti_Profiler_DeviceSupported_Params, cuDevice=cu_device, api=int(api))
    _f.cuptiProfilerDeviceSupported(p)
    fields = ["architecture", "sli", "vGpu", "confidentialCompute", "cmp", "wsl"]
    if version() >= (13, 1):
        fields.append("sku")
    details = {}
    for name in fields:
        value = getattr(p, name)
        details[name] = SupportLevel(value) if value in SupportLevel._value2member_map_ else SupportLevel.UNKNOWN
    return DeviceSupport(api=ProfilerApi(api), overall=SupportLevel(p.isSupported), details=details)
