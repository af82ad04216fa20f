"""CUPTI's launch and module-load callbacks (cupti_callbacks.h): :class:`LaunchRecorder`, :class:`ModuleWatcher`.

:class:`LaunchRecorder` subscribes to the driver's launch entry points (``cuLaunchKernel``,
``cuLaunchKernelEx``, ``cuLaunchCooperativeKernel`` and their per-thread-stream variants) and calls back on
entry and exit of each, on the launching thread; :class:`ModuleWatcher` hears every module the driver loads. Both
listen through gpuscope's one CUPTI subscriber (:mod:`gpuscope.cupti.subscriber`: CUPTI allows one per process),
whose names the rest of gpuscope imports from here, as it does :func:`finalize_at_api_exit`
(:mod:`gpuscope.cupti.finalize`):

* :func:`finalize_at_api_exit` calls ``cuptiFinalize`` where CUPTI's guide says it is safe, in the exit callback
  of a driver call (``cuCtxGetCurrent``) that the detaching thread makes, as torch's Kineto does
  (pytorch/kineto#686);
* :func:`hold` keeps the subscriber while the CUPTI profiler is initialised (:mod:`gpuscope.cupti.profiler`), and
  :func:`known` asks CUPTI whether it still knows it: a ``cuptiFinalize`` by another client of the process makes
  CUPTI forget every subscriber, and what gpuscope kept in CUPTI with it.
"""

from __future__ import annotations

import ctypes
import dataclasses
import threading
import warnings
from ctypes import POINTER, Structure, c_uint, c_uint32, c_void_p

from gpuscope.cupti import subscriber as _sub
from gpuscope.cupti.finalize import NotFinalized, finalize_at_api_exit  # noqa: F401 (the detach's call site)
from gpuscope.cupti.subscriber import (  # noqa: F401 (the subscriber's names, as gpuscope's modules import them)
    CBID_cuCtxGetCurrent, CBID_cuGraphLaunch, CBID_cuGraphLaunch_ptsz, CBID_cuLaunchCooperativeKernel,
    CBID_cuLaunchCooperativeKernel_ptsz, CBID_cuLaunchKernel, CBID_cuLaunchKernel_ptsz, CBID_cuLaunchKernelEx,
    CBID_cuLaunchKernelEx_ptsz, CUPTI_API_ENTER, CUPTI_API_EXIT, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_CB_DOMAIN_NVTX,
    CUPTI_CB_DOMAIN_RESOURCE, CUPTI_CBID_RESOURCE_MODULE_LOADED, GRAPH_CBIDS, LAUNCH_CBIDS,
    CUpti_CallbackData, _EX, add_graph_watcher, add_nvtx_watcher, held, hold, known, let_go, other_client,
    other_client_refusal, remove_graph_watcher, remove_nvtx_watcher)
from gpuscope.errors import GpuscopeWarning

__all__ = ["Launch", "LaunchRecorder", "ModuleWatcher"]


class _LaunchParams(Structure):  # cuLaunchKernel_params / cuLaunchCooperativeKernel_params (generated_cuda_meta.h)
    _fields_ = [("f", c_void_p)] + [(n, c_uint) for n in ("gx", "gy", "gz", "bx", "by", "bz", "shared")] + [
        ("hStream", c_void_p)]


class _LaunchConfig(Structure):  # CUlaunchConfig (cuda.h), first fields
    _fields_ = [(n, c_uint) for n in ("gx", "gy", "gz", "bx", "by", "bz", "shared")] + [("hStream", c_void_p)]


class _LaunchExParams(Structure):  # cuLaunchKernelEx_params
    _fields_ = [("config", POINTER(_LaunchConfig)), ("f", c_void_p)]


@dataclasses.dataclass(frozen=True)
class Launch:
    """One kernel launch seen by the driver, at the entry of the launch call: symbol, grid, block, context, and the
    kernel function and dynamic shared memory the call was given.

    ``function`` is the launch call's ``f`` (a ``CUfunction``, or a ``CUkernel`` the driver accepts in its place) as
    an integer, 0 where the call gave none; the registers and static shared memory of the function are asked of the
    driver later, when rows are built (:mod:`gpuscope._gpu.functions`), never in the callback. ``shared_dynamic`` is
    the call's ``sharedMemBytes`` (``config->sharedMemBytes`` for ``cuLaunchKernelEx``): bytes of dynamic shared
    memory per block.
    """

    symbol: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    context: int
    function: int = 0
    shared_dynamic: int = 0
    stream: int = 0  # the launch's CUstream (0: the legacy default stream)


class LaunchRecorder:
    """Hear every kernel launch in this process while open (:meth:`close` stops it).

    At the launch call's entry, ``on_enter(launch)`` gets a :class:`Launch`; whatever it returns other than None
    is handed to ``on_exit(token)`` when the same call returns (on the same thread). The driver waits for both,
    so they must be quick, and they must not raise (an exception becomes a warning).

    gpuscope subscribes to CUPTI's callbacks (``cuptiSubscribe``) while any recorder or module watcher is open, and
    gives the subscription back when the last closes, so that another CUPTI client of the process (torch.profiler)
    can have it between gpuscope's sessions; the launch callbacks are enabled while any recorder is open and not
    paused. ``cuGraphLaunch`` calls are counted in :attr:`graph_launches`, and their CUPTI correlation IDs kept in
    :attr:`graph_correlations`: the kernels of a CUDA graph reach no launch callback, but their kernel activity
    records carry the correlation ID of the graph launch that ran them. Several recorders may be open (a
    ``Profiler`` session and a ``pc_sample`` block); each hears every launch.

    Parameters
    ----------
    on_enter : callable
        ``on_enter(launch) -> token or None``.
    on_exit : callable, optional
        ``on_exit(token)``, called only for a token that is not None.
    on_graph : callable, optional
        ``on_graph(correlation_id, params)`` at the entry of each graph launch (after it is counted), before its
        kernels run, with the address of the call's parameters (``cuGraphLaunch_params``: the callee may change
        them); it must not raise either. What it returns other than None is handed to ``on_graph_exit(token)`` at
        the same call's exit.
    on_graph_exit : callable, optional
        ``on_graph_exit(token)`` (see ``on_graph``).
    on_lost : callable, optional
        ``on_lost(token, thread_ident)`` for a token whose call's exit was not heard: the recorder was paused
        while the call ran (another thread paused it), or a call nested in it exited first. Each call's exit is
        matched to its entry by CUPTI's correlation ID, so one lost exit never shifts the others; at
        :meth:`resume`, the launch calls still pending from before the pause are given up (their exits, if they
        come, are ignored); graph launches are not (their exit runs the graph's nodes).

    Raises
    ------
    ProfilerBusyError
        Another CUPTI callback subscriber exists in this process (CUPTI allows one).
    """

    def __init__(self, on_enter, on_exit=None, on_graph=None, on_graph_exit=None, on_lost=None):
        self._on_enter, self._on_exit, self._on_graph = on_enter, on_exit, on_graph
        self._on_graph_exit = on_graph_exit or (lambda token: None)
        self._on_lost = on_lost or (lambda token, thread: None)
        self._pending = threading.local()  # this thread's calls entered, not yet exited: [correlation, token, graph]
        self._stacks: dict[int, list] = {}  # every thread's, by thread ident (to give up the pending at resume)
        self.graph_launches = 0  # cuGraphLaunch calls heard (a graph's kernels are not launches of their own)
        self.graph_correlations: set[int] = set()  # their correlation IDs, which their kernels' records carry
        _sub.known()  # a subscriber CUPTI forgot is never used
        with _sub._lock:
            _sub._subscribe()
            _sub._listen(self, True)
            _sub._open.add(self)
        self._open = True

    def _on_callback(self, cbid, address):
        try:
            d = CUpti_CallbackData.from_address(address)
            pending = getattr(self._pending, "stack", None)
            if pending is None:
                pending = self._pending.stack = self._stacks.setdefault(threading.get_ident(), [])
            if d.callbackSite != CUPTI_API_ENTER:
                self._exited(pending, d.correlationId)
                return
            if cbid in GRAPH_CBIDS:
                self.graph_launches += 1  # its kernel nodes reach no launch callback
                self.graph_correlations.add(d.correlationId)
                entry = [d.correlationId, None, True]
                pending.append(entry)
                if self._on_graph is not None:
                    entry[1] = self._on_graph(d.correlationId, d.functionParams or 0)
                return
            if cbid in _EX:
                p = _LaunchExParams.from_address(d.functionParams)
                g, function = p.config.contents, p.f
            else:
                g = _LaunchParams.from_address(d.functionParams)
                function = g.f
            launch = Launch((d.symbolName or b"").decode(errors="replace"), (g.gx, g.gy, g.gz), (g.bx, g.by, g.bz),
                            d.context or 0, function or 0, g.shared, g.hStream or 0)
            entry = [d.correlationId, None, False]
            pending.append(entry)
            token = self._on_enter(launch)
            if self._on_exit is not None:
                entry[1] = token
        except Exception as exc:  # never raise into the driver
            warnings.warn(f"gpuscope launch callback failed: {exc!r}", GpuscopeWarning, stacklevel=1)

    def _exited(self, pending: list, correlation: int) -> None:
        """A call's exit on this thread: its entry found by correlation ID (launch calls nest: a graph's nodes are
        launched from its callback); calls entered after it whose exits were not heard are given up."""
        for k in range(len(pending) - 1, -1, -1):
            if pending[k][0] == correlation:
                break
        else:
            return  # its entry was not heard (the recorder was paused, or opened, while the call ran)
        entries = pending[k:]
        del pending[k:]
        me = threading.get_ident()
        for _, token, _graph in reversed(entries[1:]):
            if token is not None:
                self._on_lost(token, me)
        _, token, graph = entries[0]
        if token is not None:
            if graph:
                self._on_graph_exit(token)
            else:
                self._on_exit(token)

    def _give_up_pending(self) -> None:
        """Every thread's launch calls entered before a pause: their exits may have come while paused, unheard.
        Graph launches are kept: the launch was handed an empty graph, and its exit runs the graph's nodes, so
        that exit is waited for (a graph launch still in flight at the resume would otherwise lose its work)."""
        for thread, pending in list(self._stacks.items()):
            entries = pending[:]
            pending[:] = [entry for entry in entries if entry[2]]
            for _, token, graph in reversed(entries):
                if token is not None and not graph:
                    try:
                        self._on_lost(token, thread)
                    except Exception as exc:  # noqa: BLE001  never raise into the caller's resume
                        warnings.warn(f"gpuscope launch callback failed: {exc!r}", GpuscopeWarning, stacklevel=2)

    @property
    def closed(self) -> bool:
        return not self._open

    def pause(self) -> None:
        """Stop hearing launches until :meth:`resume` (with no other recorder listening, launches then cost
        nothing extra)."""
        with _sub._lock:
            if self in _sub._open:
                _sub._listen(self, False)

    def resume(self) -> None:
        """Hear launches again after :meth:`pause`; calls still pending from before are given up (``on_lost``)."""
        with _sub._lock:
            if self in _sub._open:
                self._give_up_pending()
                _sub._listen(self, True)

    def close(self) -> None:
        """Stop hearing launches; CUPTI's launch callbacks are disabled when no recorder listens (safe to call
        twice)."""
        if not self._open:
            return
        self._open = False
        _sub.known()
        with _sub._lock:
            _sub._open.discard(self)
            try:
                _sub._listen(self, False)
            except Exception as exc:
                warnings.warn(f"cuptiEnableCallback(0) failed: {exc}", GpuscopeWarning, stacklevel=2)
            _sub._release_if_idle()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class _ResourceData(Structure):  # CUpti_ResourceData
    _fields_ = [("context", c_void_p), ("resourceHandle", c_void_p), ("resourceDescriptor", c_void_p)]


class _ModuleResourceData(Structure):  # CUpti_ModuleResourceData
    _fields_ = [("moduleId", c_uint32), ("cubinSize", ctypes.c_size_t), ("pCubin", c_void_p)]


class ModuleWatcher:
    """Hear every module the driver loads in this process while open: ``on_loaded(module_id, cubin_bytes)``.

    CUPTI's resource callback ``CUPTI_CBID_RESOURCE_MODULE_LOADED``, on the loading thread, with the image the
    driver loaded (after any linking). Modules loaded before the watcher opened are not heard. The callback must
    be quick and must not raise (an exception becomes a warning).

    Raises
    ------
    ProfilerBusyError
        Another CUPTI callback subscriber exists in this process (CUPTI allows one).
    """

    def __init__(self, on_loaded):
        self._on_loaded = on_loaded
        _sub.add_module_watcher(self)
        self._open = True

    def _on_callback(self, cbid, address):
        if cbid != CUPTI_CBID_RESOURCE_MODULE_LOADED:
            return
        try:
            resource = _ResourceData.from_address(address)
            module = _ModuleResourceData.from_address(resource.resourceDescriptor)
            cubin = ctypes.string_at(module.pCubin, module.cubinSize) if module.pCubin and module.cubinSize else b""
            self._on_loaded(int(module.moduleId), cubin)
        except Exception as exc:  # never raise into the driver
            warnings.warn(f"gpuscope module callback failed: {exc!r}", GpuscopeWarning, stacklevel=1)

    def close(self) -> None:
        """Stop hearing module loads (safe to call twice)."""
        if not self._open:
            return
        self._open = False
        _sub.remove_module_watcher(self)
