"""``cuptiFinalize`` where CUPTI's guide says it is safe: at the exit of a driver call the detaching thread makes.

:func:`finalize_at_api_exit` is the call site of gpuscope's detach before PC sampling (:func:`gpuscope.cupti._api.
detach`). As torch's Kineto does (pytorch/kineto#686), it takes CUPTI's subscriber for one callback, the exit of
``cuCtxGetCurrent`` on this thread, unsubscribes there and finalizes; the subscriber's dispatch
(:mod:`gpuscope.cupti.subscriber`) hands it that callback.
"""

from __future__ import annotations

import threading
import warnings

from gpuscope.cupti import subscriber as _sub
from gpuscope.cupti.subscriber import (CBID_cuCtxGetCurrent, CUPTI_API_EXIT, CUPTI_CB_DOMAIN_DRIVER_API,
                                       CUpti_CallbackData)
from gpuscope.errors import CuptiError, GpuscopeWarning

__all__ = ["NotFinalized", "finalize_at_api_exit"]


class NotFinalized(RuntimeError):
    """:func:`finalize_at_api_exit` did not call ``cuptiFinalize``; the text says why."""


class _ExitCall:
    """The driver call of a detaching thread, at whose exit callback CUPTI is finalized; nothing else's."""

    def __init__(self, handle, finalize):
        self.thread = threading.get_ident()
        self.handle, self.finalize = handle, finalize
        self.done = False
        self.unsubscribed = False
        self.status = None  # cuptiFinalize's
        self.error = None  # what the callback raised: raised again on the detaching thread

    def on_callback(self, address) -> None:
        if self.done or threading.get_ident() != self.thread:  # another thread's call of the same function
            return
        if CUpti_CallbackData.from_address(address).callbackSite != CUPTI_API_EXIT:
            return
        self.done = True
        try:
            # unsubscribed first, as Kineto does: no callback of gpuscope's (which needs the GIL) starts on another
            # thread while cuptiFinalize holds every thread of the process back
            _sub._f.cuptiUnsubscribe(self.handle)
            self.unsubscribed = True
            self.status = self.finalize()
        except BaseException as exc:  # never raise into the driver
            self.error = exc


def finalize_at_api_exit(finalize) -> int:
    """Call *finalize* (``cuptiFinalize``) where CUPTI's guide says it is safe: in CUPTI's callback at the exit of a
    driver call, ``cuCtxGetCurrent``, made on this thread. A subscriber of its own enables that one callback; the
    callback acts only at the exit of this thread's own call (another thread's call of the same function at the same
    moment finalizes nothing), unsubscribes, then finalizes. Returns *finalize*'s status; what it raised is raised
    here.

    Raises
    ------
    NotFinalized
        Nothing was finalized: another CUPTI client holds the subscriber, CUPTI refused the subscriber (no driver),
        or CUPTI did not call back at the call's exit. The subscriber is given back.
    """
    with _sub._lock:
        if _sub._subscription or _sub._exit_call is not None:
            raise NotFinalized("gpuscope's CUPTI subscriber is in use (another detach under way, or a session "
                               "started meanwhile)")
        try:
            status, who, handle, callback = _sub._try_subscribe()
        except CuptiError as exc:  # without a driver: CUPTI_ERROR_UNKNOWN
            raise NotFinalized(f"CUPTI refused gpuscope the subscriber that the detach needs ({exc}), so "
                               "cuptiFinalize was not called") from None
        if status:
            raise NotFinalized(_sub.other_client_refusal(_sub._named(who)))
        _sub._retired.append(callback)  # CUPTI forgets the subscriber at the finalize: the C callback is never freed
        try:
            _sub._f.cuptiEnableCallback(1, handle, CUPTI_CB_DOMAIN_DRIVER_API, CBID_cuCtxGetCurrent)
        except BaseException:
            _sub._f.cuptiUnsubscribe(handle)
            raise
        call = _sub._exit_call = _ExitCall(handle, finalize)  # the subscriber's dispatch hands it the callback
    try:
        _call_the_driver()
    finally:
        with _sub._lock:
            _sub._exit_call = None
        if not call.unsubscribed:  # no callback, or the unsubscribe failed in it: CUPTI may still hold it
            _give_back_quietly(handle)
    if call.error is not None:
        raise call.error
    if not call.done:
        raise NotFinalized("CUPTI did not call back at the exit of cuCtxGetCurrent, so cuptiFinalize was not called")
    return call.status


def _give_back_quietly(handle) -> None:
    for step, args in (("cuptiEnableCallback", (0, handle, CUPTI_CB_DOMAIN_DRIVER_API, CBID_cuCtxGetCurrent)),
                       ("cuptiUnsubscribe", (handle,))):
        try:
            getattr(_sub._f, step)(*args)
        except Exception as exc:  # cleanup never raises
            warnings.warn(f"{step} failed: {exc}", GpuscopeWarning, stacklevel=3)


def _call_the_driver() -> None:
    """``cuCtxGetCurrent`` on this thread, through cuda.bindings (``cuInit`` first: nothing once the driver is up)."""
    from cuda.bindings import driver

    driver.cuInit(0)
    driver.cuCtxGetCurrent()
