"""CUPTI Callback API (cupti_callbacks.h) for kernel launches: names, grid, block and CUPTI times of each launch.

:class:`LaunchRecorder` subscribes to the driver's launch entry points (``cuLaunchKernel``,
``cuLaunchKernelEx``, ``cuLaunchCooperativeKernel`` and their per-thread-stream variants) and records one
:class:`Launch` per call, in call order: auto ranges "0", "1", ... of the range profiler are these launches in
the same order. CUPTI allows one subscriber per process.
"""

from __future__ import annotations

import ctypes
import dataclasses
import threading
import warnings
from ctypes import CFUNCTYPE, POINTER, Structure, c_char_p, c_int, c_uint, c_uint32, c_uint64, c_void_p

from ..errors import GpuscopeWarning
from ._api import Functions
from .activity import timestamp

__all__ = ["Launch", "LaunchRecorder"]

CUPTI_CB_DOMAIN_DRIVER_API = 1
CUPTI_API_ENTER, CUPTI_API_EXIT = 0, 1

# CUpti_driver_api_trace_cbid values (cupti_driver_cbid.h; values never change)
CBID_cuLaunchKernel = 307
CBID_cuLaunchKernel_ptsz = 442
CBID_cuLaunchCooperativeKernel = 477
CBID_cuLaunchKernelEx = 652
CBID_cuLaunchKernelEx_ptsz = 653
_CLASSIC = (CBID_cuLaunchKernel, CBID_cuLaunchKernel_ptsz, CBID_cuLaunchCooperativeKernel)
_EX = (CBID_cuLaunchKernelEx, CBID_cuLaunchKernelEx_ptsz)


class CUpti_CallbackData(Structure):
    _fields_ = [
        ("callbackSite", c_int),  # CUpti_ApiCallbackSite
        ("functionName", c_char_p),  # const char*
        ("functionParams", c_void_p),  # const void*
        ("functionReturnValue", c_void_p),  # void*
        ("symbolName", c_char_p),  # const char*
        ("context", c_void_p),  # CUcontext
        ("contextUid", c_uint32),  # uint32_t
        ("correlationData", POINTER(c_uint64)),  # uint64_t*
        ("correlationId", c_uint32),  # uint32_t
    ]


class _LaunchParams(Structure):  # cuLaunchKernel_params / cuLaunchCooperativeKernel_params (generated_cuda_meta.h)
    _fields_ = [("f", c_void_p)] + [(n, c_uint) for n in ("gx", "gy", "gz", "bx", "by", "bz", "shared")]


class _LaunchConfig(Structure):  # CUlaunchConfig (cuda.h), first fields
    _fields_ = [(n, c_uint) for n in ("gx", "gy", "gz", "bx", "by", "bz", "shared")]


class _LaunchExParams(Structure):  # cuLaunchKernelEx_params
    _fields_ = [("config", POINTER(_LaunchConfig)), ("f", c_void_p)]


# void CUPTIAPI callback(void* userdata, CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void* cbdata)
_CALLBACK = CFUNCTYPE(None, c_void_p, c_int, c_uint32, POINTER(CUpti_CallbackData))

_f = Functions(
    "cupti_callbacks.h",
    {
        # CUptiResult cuptiSubscribe(CUpti_SubscriberHandle* subscriber, CUpti_CallbackFunc callback, void* userdata)
        "cuptiSubscribe": [POINTER(c_void_p), _CALLBACK, c_void_p],
        # CUptiResult cuptiUnsubscribe(CUpti_SubscriberHandle subscriber)
        "cuptiUnsubscribe": [c_void_p],
        # CUptiResult cuptiEnableCallback(uint32_t enable, CUpti_SubscriberHandle subscriber,
        #                                 CUpti_CallbackDomain domain, CUpti_CallbackId cbid)
        "cuptiEnableCallback": [c_uint32, c_void_p, c_int, c_uint32],
    },
)


@dataclasses.dataclass(frozen=True)
class Launch:
    """One kernel launch seen by the driver: symbol, grid, block and CUPTI timestamps of the launch call."""

    symbol: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    enter_ns: int
    exit_ns: int
    tag: object = None  # what the recorder's ``annotate`` returned for this launch


class LaunchRecorder:
    """Record every kernel launch in this process while open (``cuptiSubscribe``; :meth:`close` unsubscribes).

    Parameters
    ----------
    annotate : callable, optional
        Called with no arguments on the launching thread after each launch; its result is the launch's ``tag``.

    Raises
    ------
    ProfilerBusyError
        Another CUPTI callback subscriber exists in this process (CUPTI allows one).
    """

    def __init__(self, annotate=None):
        self.launches: list[Launch] = []
        self._annotate = annotate
        self._lock = threading.Lock()
        self._enter = threading.local()
        self._callback = _CALLBACK(self._on_callback)  # kept alive as long as the subscription
        handle = c_void_p()
        _f.cuptiSubscribe(ctypes.byref(handle), self._callback, None)
        self._handle = handle.value
        try:
            for cbid in _CLASSIC + _EX:
                _f.cuptiEnableCallback(1, self._handle, CUPTI_CB_DOMAIN_DRIVER_API, cbid)
        except BaseException:
            _f.cuptiUnsubscribe(self._handle)
            raise

    def _on_callback(self, userdata, domain, cbid, data):
        try:
            d = data.contents
            if d.callbackSite == CUPTI_API_ENTER:
                self._enter.ns = timestamp()
                return
            if cbid in _EX:
                ex = ctypes.cast(d.functionParams, POINTER(_LaunchExParams)).contents
                g = ex.config.contents
            else:
                g = ctypes.cast(d.functionParams, POINTER(_LaunchParams)).contents
            launch = Launch(
                symbol=(d.symbolName or b"").decode(errors="replace"),
                grid=(g.gx, g.gy, g.gz),
                block=(g.bx, g.by, g.bz),
                enter_ns=getattr(self._enter, "ns", 0),
                exit_ns=timestamp(),
                tag=self._annotate() if self._annotate is not None else None,
            )
            with self._lock:
                self.launches.append(launch)
        except Exception as exc:  # never raise into the driver
            warnings.warn(f"gpuscope launch callback failed: {exc}", GpuscopeWarning, stacklevel=1)

    def take(self) -> list[Launch]:
        """The launches recorded so far, removing them from the recorder."""
        with self._lock:
            out, self.launches = self.launches, []
        return out

    @property
    def closed(self) -> bool:
        return self._handle is None

    def close(self) -> None:
        """``cuptiUnsubscribe`` (safe to call twice)."""
        if self._handle is not None:
            handle, self._handle = self._handle, None
            try:
                _f.cuptiUnsubscribe(handle)
            except Exception as exc:
                warnings.warn(f"cuptiUnsubscribe failed: {exc}", GpuscopeWarning, stacklevel=2)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
