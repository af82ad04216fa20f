"""gpuscope's one CUPTI callback subscriber (cupti_callbacks.h): taken while anything listens, and what it hears.

CUPTI allows one subscriber per process. gpuscope subscribes while a launch recorder, a module, NVTX or graph watcher
is open (:mod:`gpuscope.cupti.callbacks`, :mod:`gpuscope.cupti.nvtx`, :mod:`gpuscope.cupti.graphs`) or the CUPTI
profiler is initialised (:func:`hold`), enables each domain's callbacks while something listens to it, hands every
callback to what listens (one C callback, :func:`_dispatch`), and gives the subscriber back when nothing needs it, so
that another CUPTI client of the process (torch.profiler) can subscribe between gpuscope's sessions.

:func:`known` asks CUPTI whether it still knows the subscriber: a ``cuptiFinalize`` by another client of the process
makes CUPTI forget every subscriber, and what gpuscope kept in CUPTI with it. The subscriber is given back for
gpuscope's own detach (:func:`gpuscope.cupti._api.detach`), whose ``cuptiFinalize`` runs in the exit callback of a
driver call (:mod:`gpuscope.cupti.finalize`); the names other modules use are re-exported by
:mod:`gpuscope.cupti.callbacks`.
"""

from __future__ import annotations

import ctypes
import os
import threading
import warnings
from ctypes import CFUNCTYPE, POINTER, Structure, c_char_p, c_int, c_uint32, c_uint64, c_void_p

from gpuscope.cupti import _api
from gpuscope.cupti._api import Functions
from gpuscope.errors import GpuscopeWarning

CUPTI_CB_DOMAIN_DRIVER_API = 1
CUPTI_API_ENTER, CUPTI_API_EXIT = 0, 1
CUPTI_ERROR_NOT_INITIALIZED = 15
CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED = 39

# CUpti_driver_api_trace_cbid values (cupti_driver_cbid.h; values never change)
CBID_cuLaunchKernel = 307
CBID_cuLaunchKernel_ptsz = 442
CBID_cuLaunchCooperativeKernel = 477
CBID_cuLaunchCooperativeKernel_ptsz = 478
CBID_cuLaunchKernelEx = 652
CBID_cuLaunchKernelEx_ptsz = 653
_CLASSIC = (CBID_cuLaunchKernel, CBID_cuLaunchKernel_ptsz, CBID_cuLaunchCooperativeKernel,
            CBID_cuLaunchCooperativeKernel_ptsz)
_EX = (CBID_cuLaunchKernelEx, CBID_cuLaunchKernelEx_ptsz)
#: The driver call at whose exit gpuscope finalizes CUPTI: it reads the calling thread's current context, needs
#: none, waits for nothing and makes no GPU work.
CBID_cuCtxGetCurrent = 304
CBID_cuGraphLaunch = 514
CBID_cuGraphLaunch_ptsz = 515
GRAPH_CBIDS = (CBID_cuGraphLaunch, CBID_cuGraphLaunch_ptsz)
LAUNCH_CBIDS = _CLASSIC + _EX + GRAPH_CBIDS


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


# void CUPTIAPI callback(void* userdata, CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void* cbdata)
# cbdata is taken as an address: CUpti_CallbackData.from_address is cheaper than a POINTER argument per call.
_CALLBACK = CFUNCTYPE(None, c_void_p, c_int, c_uint32, c_void_p)

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
        # CUptiResult cuptiSubscribe_v2(CUpti_SubscriberHandle* subscriber, CUpti_CallbackFunc callback,
        #                               void* userdata, CUpti_SubscriberParams* pParams)
        "cuptiSubscribe_v2": [POINTER(c_void_p), _CALLBACK, c_void_p, c_void_p],
    },
    since={"cuptiSubscribe_v2": (13, 0)},
    allowed={"cuptiSubscribe_v2": (39,), "cuptiSubscribe": (39,)},
)


class _SubscriberParams(Structure):  # CUpti_SubscriberParams (cupti_callbacks.h, 13.0+), up to oldSubscriberSize
    _fields_ = [("structSize", ctypes.c_size_t), ("subscriberName", c_char_p), ("oldSubscriberName", c_void_p),
                ("oldSubscriberSize", ctypes.c_size_t)]


#: What to say when another CUPTI client holds the one callback subscriber this process may have.
OTHER_CLIENT_HELP = (
    "Another CUPTI client in this process holds CUPTI's callback subscriber{who}: torch.profiler (PyTorch's "
    "Kineto keeps it from its first profile until the process ends), Nsight Systems, or a library loaded through "
    "CUDA_INJECTION64_PATH. gpuscope's kernel, iteration and auto modes and PC sampling need it to hear kernel "
    "launches, and taking NVTX ranges (nvtx=, gpuscope run --nvtx) needs it to hear NVTX calls; user mode "
    "(gpuscope.range, decorated kernels) and PM sampling do not. Profile in a process where that client has not run "
    "(or run it after gpuscope), or use mode='user' with gpuscope.range."
)


def other_client_refusal(who: str) -> str:
    """Why CUPTI is not detached while another client holds its subscriber (*who*: its name, or "")."""
    return (f"another CUPTI client of this process holds CUPTI's subscriber{f' ({who})' if who else ''}, "
            "torch.profiler's Kineto for one: cuptiFinalize would wipe its state")


CUPTI_CB_DOMAIN_RESOURCE = 3
CUPTI_CBID_RESOURCE_MODULE_LOADED = 6  # CUpti_CallbackIdResource (cupti_callbacks.h)
CUPTI_CB_DOMAIN_NVTX = 5  # CUpti_CallbackDomain (cupti_callbacks.h)

_lock = threading.Lock()
_subscription: list = []  # [handle, callback]: gpuscope's CUPTI subscriber while it holds one
_generation = 0  # counts gpuscope's subscriptions and CUPTI's finalizes: a witness (hold) names the one it was taken in
_holds = 0  # users of the CUPTI profiler holding the subscriber (hold): it is not given back while any do
_module_watchers: tuple = ()  # the open ModuleWatchers
_nvtx_watchers: tuple = ()  # the open NvtxWatchers (gpuscope.cupti.nvtx)
_nvtx_cbids: tuple = ()  # the NVTX callbacks they have enabled
_graph_watchers: tuple = ()  # the open GraphWatchers (gpuscope.cupti.graphs)
_graph_cbids: tuple = ((), ())  # (resource, driver) callbacks they have enabled
_graph_driver: frozenset = frozenset()  # the driver callbacks that go to them
_listening: tuple = ()  # the open, unpaused LaunchRecorders (a Profiler session and a pc_sample block may both be)
_open: set = set()  # every open LaunchRecorder, paused or not
_exit_call = None  # a detach under way: the call at whose exit CUPTI is finalized (gpuscope.cupti.finalize)
_retired: list = []  # C callbacks CUPTI held: never freed (CUPTI may still call one)


def _dispatch(userdata, domain, cbid, address):
    if domain == CUPTI_CB_DOMAIN_RESOURCE:
        if cbid == CUPTI_CBID_RESOURCE_MODULE_LOADED:
            for watcher in _module_watchers:
                watcher._on_callback(cbid, address)
        else:
            for watcher in _graph_watchers:
                watcher._on_callback(domain, cbid, address)
        return
    if cbid in _graph_driver and domain == CUPTI_CB_DOMAIN_DRIVER_API:
        for watcher in _graph_watchers:
            watcher._on_callback(domain, cbid, address)
        return
    if domain == CUPTI_CB_DOMAIN_NVTX:
        for watcher in _nvtx_watchers:
            watcher._on_callback(cbid, address)
        return
    if domain == CUPTI_CB_DOMAIN_DRIVER_API and cbid == CBID_cuCtxGetCurrent:
        call = _exit_call
        if call is not None:
            call.on_callback(address)
        return
    for recorder in _listening:
        recorder._on_callback(cbid, address)


def _try_subscribe() -> tuple[int, str, int, object]:
    """``cuptiSubscribe_v2`` (``cuptiSubscribe`` before CUPTI 13.0): (status, the incumbent's name as CUPTI gives
    it, the handle, the C callback)."""
    callback = _CALLBACK(_dispatch)
    handle = c_void_p()
    who = ""
    if _f.has("cuptiSubscribe_v2"):
        old = ctypes.create_string_buffer(256)
        p = _SubscriberParams(ctypes.sizeof(_SubscriberParams), b"gpuscope", ctypes.addressof(old), len(old))
        status = _f.cuptiSubscribe_v2(ctypes.byref(handle), callback, None, ctypes.byref(p))
        who = old.value.decode(errors="replace").strip()
    else:
        status = _f.cuptiSubscribe(ctypes.byref(handle), callback, None)
    return status, who, handle.value, callback


def _named(who: str) -> str:
    """The incumbent's name for messages: "" for CUPTI's placeholder of a client that gave none (Kineto)."""
    return "" if "not provided" in who else who


def _ours(who: str) -> bool:
    """Whether CUPTI's refusal names gpuscope's subscriber ("CUPTI for gpuscope"); before CUPTI 13.0 a refusal
    names no one and is taken as gpuscope's."""
    return not who or ("gpuscope" in who and "not provided" not in who)


def _take(handle, callback) -> None:
    """Hold the subscription CUPTI just granted (with _lock held), with the callbacks of what is open enabled on it:
    watchers that outlived a subscription CUPTI forgot hear again."""
    global _generation
    _subscription[:] = [handle, callback]
    _generation += 1
    _enable_what_is_open()


def _subscribe() -> None:
    """``cuptiSubscribe`` while gpuscope listens (with _lock held): CUPTI allows one subscriber per process, so
    gpuscope holds it only while a recorder or watcher is open or the CUPTI profiler is initialised
    (:func:`_release_if_idle`).

    Raises
    ------
    ProfilerBusyError
        Another CUPTI client holds the subscriber; named where CUPTI says who (``cuptiSubscribe_v2``).
    """
    if _subscription:
        return
    from gpuscope.errors import cupti_error

    status, who, handle, callback = _try_subscribe()
    if status:
        who = _named(who)
        raise cupti_error(status, "cuptiSubscribe", _api.error_message(status),
                          OTHER_CLIENT_HELP.format(who=f" ({who})" if who else ""))
    _take(handle, callback)


def known() -> bool:
    """Whether CUPTI still knows the subscriber that gpuscope holds (True where it holds none, or CUPTI cannot say).

    Asked by subscribing once more: CUPTI allows one subscriber, so while it knows gpuscope's it refuses and names
    gpuscope. A subscription granted, a refusal that names another client, or ``NOT_INITIALIZED`` mean that another
    CUPTI client of the process called ``cuptiFinalize`` since (torch.profiler's Kineto does at the end of a profile
    in some versions), and CUPTI forgot gpuscope's subscriber with everything else of gpuscope's. Then gpuscope drops
    the handle without calling CUPTI with it, keeps a subscription just granted for what it has open (their callbacks
    enabled on it), and forgets the rest too (:func:`_api.finalized_elsewhere`: one :class:`GpuscopeWarning`).
    """
    from gpuscope.errors import CuptiError, GpuscopeError

    with _lock:
        if not _subscription:
            return True
        try:
            status, who, handle, callback = _try_subscribe()
        except CuptiError as exc:
            if exc.status != CUPTI_ERROR_NOT_INITIALIZED:  # CUPTI cannot say (no GPU, a broken install)
                return True
            status, who = exc.status, ""
        except GpuscopeError:
            return True
        if status == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED and _ours(who):
            return True
        _retired.append(_subscription[1])  # the handle is CUPTI's no more: never used again
        _subscription.clear()
        if status == _api.CUPTI_SUCCESS:
            _take(handle, callback)
    _api.finalized_elsewhere()
    with _lock:
        _release_if_idle()
    return False


def hold() -> int | None:
    """Hold CUPTI's subscriber for a user of the CUPTI profiler (:func:`gpuscope.cupti.profiler.initialize`) until
    :func:`let_go`: while gpuscope holds it, another client's teardown that needs it cannot finalize CUPTI, and one
    that does not is seen (:func:`held`). Returns the witness: the subscription's generation; None where another
    CUPTI client of the process holds the subscriber (it may finalize CUPTI unseen: nothing should be kept
    between sessions); 0 where CUPTI cannot say (no GPU)."""
    global _holds
    from gpuscope.errors import CuptiError, GpuscopeError

    known()
    with _lock:
        try:
            _subscribe()
        except CuptiError as exc:
            return None if exc.status == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED else 0
        except GpuscopeError:
            return 0
        _holds += 1
        return _generation


def held(witness: int | None) -> bool:
    """Whether CUPTI still knows the subscription of *witness* (:func:`hold`): no ``cuptiFinalize`` since it was
    taken. True for a witness that vouches for nothing (0, None). Where another client finalized CUPTI, everything
    gpuscope had in CUPTI is forgotten first (:func:`known`)."""
    if not witness:
        return True
    known()
    with _lock:
        return bool(_subscription) and _generation == witness


def let_go(witness: int | None) -> None:
    """End a :func:`hold`; the subscriber is given back once nothing of gpuscope's needs it."""
    global _holds
    with _lock:
        if witness and witness == _generation and _holds:
            _holds -= 1
            _release_if_idle()


def other_client() -> str | None:
    """Whether another CUPTI client of this process (torch.profiler's Kineto keeps it from its first profile on)
    holds CUPTI's one callback subscriber: its name where CUPTI gives it, ``""`` where not, None where none does.
    Asks by subscribing and, where that succeeds, unsubscribing at once; while gpuscope holds the subscriber, it
    only makes sure that CUPTI still knows it (:func:`known`)."""
    from gpuscope.errors import CuptiError

    known()
    with _lock:
        if _subscription:
            return None
        try:
            status, who, handle, callback = _try_subscribe()
        except CuptiError:  # CUPTI cannot say (no GPU, a broken install): nothing known of another client
            return None
        if status:
            return _named(who)
        _unsubscribe(handle, callback)
        return None


def _unsubscribe(handle, callback) -> None:
    """``cuptiUnsubscribe``; the C *callback* CUPTI held is kept alive, never freed (CUPTI may still call it)."""
    _retired.append(callback)
    _f.cuptiUnsubscribe(handle)


def _release_if_idle() -> None:
    """Give CUPTI's subscriber back when nothing of gpuscope needs it (with _lock held), so that another CUPTI client
    of the process (torch.profiler) can subscribe between gpuscope's sessions."""
    if (_subscription and not _listening and not _open and not _module_watchers and not _nvtx_watchers
            and not _graph_watchers and not _holds):
        handle, callback = _subscription
        _subscription.clear()
        try:
            _unsubscribe(handle, callback)
        except Exception as exc:
            warnings.warn(f"cuptiUnsubscribe failed: {exc}", GpuscopeWarning, stacklevel=3)


def _listen(recorder, on: bool) -> None:
    """Add or remove *recorder* from the listeners, enabling CUPTI's launch callbacks while any listens (with
    _lock held)."""
    global _listening
    others = tuple(r for r in _listening if r is not recorder)
    if on:
        if not others:
            _enable(1)  # first: if CUPTI refuses, nothing changed
        _listening = (*others, recorder)
    else:
        _listening = others
        if not others:
            _enable(0)


def _enable(flag: int) -> None:
    if not _subscription:  # CUPTI forgot it (another client finalized CUPTI): nothing is enabled
        return
    for cbid in LAUNCH_CBIDS:
        _f.cuptiEnableCallback(flag, _subscription[0], CUPTI_CB_DOMAIN_DRIVER_API, cbid)


def _enable_what_is_open() -> None:
    """Enable, on a subscription CUPTI just granted, the callbacks of what gpuscope has open (with _lock held)."""
    wanted = [(CUPTI_CB_DOMAIN_DRIVER_API, cbid) for cbid in LAUNCH_CBIDS if _listening]
    wanted += [(CUPTI_CB_DOMAIN_RESOURCE, CUPTI_CBID_RESOURCE_MODULE_LOADED)] if _module_watchers else []
    wanted += [(CUPTI_CB_DOMAIN_NVTX, cbid) for cbid in _nvtx_cbids if _nvtx_watchers]
    if _graph_watchers:
        wanted += [(CUPTI_CB_DOMAIN_RESOURCE, cbid) for cbid in _graph_cbids[0]]
        wanted += [(CUPTI_CB_DOMAIN_DRIVER_API, cbid) for cbid in _graph_cbids[1]]
    for domain, cbid in wanted:
        try:
            _f.cuptiEnableCallback(1, _subscription[0], domain, cbid)
        except Exception as exc:
            warnings.warn(f"cuptiEnableCallback(1, domain {domain}, {cbid}) failed: {exc}", GpuscopeWarning,
                          stacklevel=4)


def _forget_in_child() -> None:  # a forked child has no CUPTI subscriber of its own
    global _listening, _lock, _module_watchers, _nvtx_watchers, _holds, _exit_call, _graph_watchers, _graph_driver
    _lock = threading.Lock()
    _listening = ()
    _module_watchers = _nvtx_watchers = _graph_watchers = ()
    _graph_driver = frozenset()
    _open.clear()
    _subscription.clear()
    _holds = 0
    _exit_call = None


os.register_at_fork(after_in_child=_forget_in_child)


def _before_detach() -> None:
    """Unsubscribe for :func:`_api.detach` (refuses while a launch recorder, paused or not, or a module watcher is
    open)."""
    with _lock:
        if _open or _module_watchers or _nvtx_watchers or _graph_watchers:  # a paused recorder resumes on this one
            nvtx = (f" (and {len(_nvtx_watchers)} NVTX watcher(s): a session taking NVTX ranges)" if _nvtx_watchers
                    else "")
            raise RuntimeError(f"{len(_open)} launch recorder(s) (a gpuscope.Profiler session in kernel, iteration "
                               f"or auto mode, or a pc_sample block) and {len(_module_watchers)} module watcher(s) "
                               f"are open{nvtx}")
        if _subscription and not _holds:  # what holds it holds the CUPTI profiler initialised: that hook refuses
            _unsubscribe(*_subscription)
            _subscription.clear()


def _after_detach() -> None:
    """CUPTI forgot every subscriber (a detach, or another client's ``cuptiFinalize``): no witness taken before
    holds any more."""
    global _generation, _holds
    with _lock:
        _generation += 1
        _holds = 0


_api.on_detach(_before_detach, _after_detach)

def add_nvtx_watcher(watcher, cbids) -> None:
    """Hand CUPTI's NVTX callbacks *cbids* to *watcher* (``watcher._on_callback(cbid, address)``), enabling them on
    gpuscope's subscriber while any NVTX watcher is open (:class:`gpuscope.cupti.nvtx.NvtxWatcher`).

    Raises
    ------
    ProfilerBusyError
        Another CUPTI callback subscriber exists in this process (CUPTI allows one); nothing is left enabled.
    """
    global _nvtx_watchers, _nvtx_cbids
    known()  # a subscriber CUPTI forgot is never used
    with _lock:
        _subscribe()
        if not _nvtx_watchers:
            _nvtx_cbids = tuple(cbids)
            try:
                for cbid in cbids:
                    _f.cuptiEnableCallback(1, _subscription[0], CUPTI_CB_DOMAIN_NVTX, cbid)
            except BaseException:
                _enable_nvtx_quietly(0, cbids)
                _release_if_idle()
                raise
        _nvtx_watchers = (*_nvtx_watchers, watcher)


def remove_nvtx_watcher(watcher, cbids) -> None:
    """Stop handing NVTX callbacks to *watcher*; disabled when no NVTX watcher is left (cleanup trouble is a
    warning)."""
    global _nvtx_watchers
    known()
    with _lock:
        _nvtx_watchers = tuple(w for w in _nvtx_watchers if w is not watcher)
        if not _nvtx_watchers and _subscription:
            _enable_nvtx_quietly(0, cbids)
        _release_if_idle()


def add_graph_watcher(watcher, resource_cbids, driver_cbids) -> None:
    """Hand CUPTI's graph resource callbacks *resource_cbids* and the driver callbacks *driver_cbids* to *watcher*
    (``watcher._on_callback(domain, cbid, address)``), enabled while any graph watcher is open
    (:class:`gpuscope.cupti.graphs.GraphWatcher`).

    Raises
    ------
    ProfilerBusyError
        Another CUPTI callback subscriber exists in this process (CUPTI allows one); nothing is left enabled.
    """
    global _graph_watchers, _graph_cbids, _graph_driver
    known()
    with _lock:
        _subscribe()
        if not _graph_watchers:
            _graph_cbids = (tuple(resource_cbids), tuple(driver_cbids))
            try:
                _enable_graph_quietly(1, raise_first=True)
            except BaseException:
                _enable_graph_quietly(0)
                _release_if_idle()
                raise
            _graph_driver = frozenset(driver_cbids)
        _graph_watchers = (*_graph_watchers, watcher)


def remove_graph_watcher(watcher) -> None:
    """Stop handing graph callbacks to *watcher*; disabled when no graph watcher is left (trouble is a warning)."""
    global _graph_watchers, _graph_driver
    known()
    with _lock:
        _graph_watchers = tuple(w for w in _graph_watchers if w is not watcher)
        if not _graph_watchers:
            _graph_driver = frozenset()
            if _subscription:
                _enable_graph_quietly(0)
        _release_if_idle()


def _enable_graph_quietly(flag: int, raise_first: bool = False) -> None:
    resource, driver = _graph_cbids
    for domain, cbids in ((CUPTI_CB_DOMAIN_RESOURCE, resource), (CUPTI_CB_DOMAIN_DRIVER_API, driver)):
        for cbid in cbids:
            try:
                _f.cuptiEnableCallback(flag, _subscription[0], domain, cbid)
            except Exception as exc:
                if raise_first:
                    raise
                warnings.warn(f"cuptiEnableCallback({flag}, domain {domain}, {cbid}) failed: {exc}", GpuscopeWarning,
                              stacklevel=3)


def _enable_nvtx_quietly(flag: int, cbids) -> None:
    for cbid in cbids:
        try:
            _f.cuptiEnableCallback(flag, _subscription[0], CUPTI_CB_DOMAIN_NVTX, cbid)
        except Exception as exc:
            warnings.warn(f"cuptiEnableCallback({flag}, NVTX {cbid}) failed: {exc}", GpuscopeWarning, stacklevel=3)


def add_module_watcher(watcher) -> None:
    """Hand CUPTI's module-loaded callback to *watcher* (``watcher._on_callback(cbid, address)``), enabled while any
    module watcher is open (:class:`gpuscope.cupti.callbacks.ModuleWatcher`).

    Raises
    ------
    ProfilerBusyError
        Another CUPTI callback subscriber exists in this process (CUPTI allows one).
    """
    global _module_watchers
    known()  # a subscriber CUPTI forgot is never used
    with _lock:
        _subscribe()
        if not _module_watchers:
            _f.cuptiEnableCallback(1, _subscription[0], CUPTI_CB_DOMAIN_RESOURCE, CUPTI_CBID_RESOURCE_MODULE_LOADED)
        _module_watchers = (*_module_watchers, watcher)


def remove_module_watcher(watcher) -> None:
    """Stop handing module loads to *watcher*; disabled when no module watcher is left (trouble is a warning)."""
    global _module_watchers
    known()
    with _lock:
        _module_watchers = tuple(w for w in _module_watchers if w is not watcher)
        if not _module_watchers and _subscription:
            try:
                _f.cuptiEnableCallback(0, _subscription[0], CUPTI_CB_DOMAIN_RESOURCE,
                                       CUPTI_CBID_RESOURCE_MODULE_LOADED)
            except Exception as exc:
                warnings.warn(f"cuptiEnableCallback(0) failed: {exc}", GpuscopeWarning, stacklevel=3)
        _release_if_idle()
