"""CUPTI's CUDA-graph callbacks (cupti_callbacks.h, cupti_activity.h): executable graphs made and destroyed, the
driver calls that change one, a graph launch's parameters, and CUPTI's ids of graphs. 1:1, no policy.

:class:`GraphWatcher` hears, on the calling thread:

* ``CUPTI_CBID_RESOURCE_GRAPHEXEC_CREATED``: an executable graph instantiated, with the graph it was made from
  (valid only during the callback: a caller that keeps its nodes must copy them there);
* ``CUPTI_CBID_RESOURCE_GRAPHEXEC_DESTROY_STARTING``;
* at the exit of each driver call that changes an executable graph (``cuGraphExecKernelNodeSetParams``,
  ``cuGraphExecUpdate``, ``cuGraphNodeSetEnabled``... :data:`EXEC_CALLS`) that succeeded, the call's name and its
  parameter struct (the ``<name>_params`` of generated_cuda_meta.h, read with the structs below).

Driver callback ids are found by name (``cuptiGetCallbackName``), since the ids of newer calls differ by version.
"""

from __future__ import annotations

import ctypes
import threading
import warnings
from ctypes import POINTER, Structure, c_char_p, c_int, c_uint, c_uint32, c_void_p

from gpuscope.cupti import callbacks as _callbacks
from gpuscope.cupti._api import Functions
from gpuscope.errors import GpuscopeWarning

__all__ = ["EXEC_CALLS", "GraphLaunchParams", "GraphWatcher", "callback_ids", "graph_exec_id"]

CUPTI_CBID_RESOURCE_GRAPHEXEC_CREATED = 18  # CUpti_CallbackIdResource
CUPTI_CBID_RESOURCE_GRAPHEXEC_DESTROY_STARTING = 19
RESOURCE_CBIDS = (CUPTI_CBID_RESOURCE_GRAPHEXEC_CREATED, CUPTI_CBID_RESOURCE_GRAPHEXEC_DESTROY_STARTING)

#: Driver calls that change an executable graph, heard at their exit.
EXEC_CALLS = (
    "cuGraphExecKernelNodeSetParams", "cuGraphExecKernelNodeSetParams_v2", "cuGraphExecUpdate", "cuGraphExecUpdate_v2",
    "cuGraphExecMemcpyNodeSetParams", "cuGraphExecMemsetNodeSetParams", "cuGraphExecNodeSetParams",
    "cuGraphNodeSetEnabled", "cuGraphExecChildGraphNodeSetParams", "cuGraphExecHostNodeSetParams",
    "cuGraphExecBatchMemOpNodeSetParams", "cuGraphExecExternalSemaphoresSignalNodeSetParams",
    "cuGraphExecExternalSemaphoresWaitNodeSetParams", "cuGraphExecEventRecordNodeSetEvent",
    "cuGraphExecEventWaitNodeSetEvent", "cuGraphExecConditionalNodeSetParams",
)

_f = Functions(
    "cupti_callbacks.h",
    {
        # CUptiResult cuptiGetCallbackName(CUpti_CallbackDomain domain, uint32_t cbid, const char** name)
        "cuptiGetCallbackName": [c_int, c_uint32, POINTER(c_char_p)],
        # CUptiResult cuptiGetGraphExecId(CUgraphExec graphExec, uint32_t* pId)
        "cuptiGetGraphExecId": [c_void_p, POINTER(c_uint32)],
    },
    allowed={"cuptiGetCallbackName": (1, 3), "cuptiGetGraphExecId": (1, 3)},
)


class GraphData(Structure):  # CUpti_GraphData
    _fields_ = [("graph", c_void_p), ("originalGraph", c_void_p), ("node", c_void_p), ("originalNode", c_void_p),
                ("nodeType", c_int), ("dependency", c_void_p), ("graphExec", c_void_p)]


class _ResourceData(Structure):  # CUpti_ResourceData
    _fields_ = [("context", c_void_p), ("resourceHandle", c_void_p), ("resourceDescriptor", c_void_p)]


class GraphLaunchParams(Structure):  # cuGraphLaunch_params / cuGraphLaunch_ptsz_params
    _fields_ = [("hGraphExec", c_void_p), ("hStream", c_void_p)]


class ExecNodeParams(Structure):  # the head of cuGraphExec*NodeSetParams_params: (hGraphExec, hNode, params, ...)
    _fields_ = [("hGraphExec", c_void_p), ("hNode", c_void_p), ("params", c_void_p)]


class ExecUpdateParams(Structure):  # cuGraphExecUpdate_params / cuGraphExecUpdate_v2_params (head)
    _fields_ = [("hGraphExec", c_void_p), ("hGraph", c_void_p)]


class NodeSetEnabledParams(Structure):  # cuGraphNodeSetEnabled_params
    _fields_ = [("hGraphExec", c_void_p), ("hNode", c_void_p), ("isEnabled", c_uint)]


_ids: dict[str, int] = {}
_ids_lock = threading.Lock()


def callback_ids(names) -> dict[str, int]:
    """Driver-API callback ids of *names* that this CUPTI knows (``cuptiGetCallbackName`` over every id once)."""
    with _ids_lock:
        if not _ids:
            name = c_char_p()
            for cbid in range(1, 1200):
                if _f.cuptiGetCallbackName(_callbacks.CUPTI_CB_DOMAIN_DRIVER_API, cbid, ctypes.byref(name)) == 0 \
                        and name.value:
                    _ids[name.value.decode()] = cbid
    return {n: _ids[n] for n in names if n in _ids}


def graph_exec_id(exec_handle: int) -> int:
    """CUPTI's id of an executable graph (the ``graphId`` its launches' records carry is the graph's), -1 where
    CUPTI does not give one."""
    out = c_uint32()
    return int(out.value) if _f.cuptiGetGraphExecId(exec_handle, ctypes.byref(out)) == 0 else -1


def _returned_success(d) -> bool:
    """Whether the driver call of callback data *d* returned CUDA_SUCCESS (at its exit)."""
    return bool(d.functionReturnValue) and ctypes.c_int.from_address(d.functionReturnValue).value == 0


class GraphWatcher:
    """Hear executable graphs made, destroyed and changed (module docstring) until :meth:`close`.

    ``on_created(exec, graph)``, ``on_destroyed(exec)`` and ``on_call(name, params_address)`` are called on the
    calling thread, inside the driver; they must be quick and must not raise (an exception becomes a warning).

    Raises
    ------
    ProfilerBusyError
        Another CUPTI callback subscriber exists in this process (CUPTI allows one).
    """

    def __init__(self, on_created, on_destroyed, on_call):
        self._on_created, self._on_destroyed, self._on_call = on_created, on_destroyed, on_call
        self._names = {cbid: name for name, cbid in callback_ids(EXEC_CALLS).items()}
        _callbacks.add_graph_watcher(self, RESOURCE_CBIDS, tuple(self._names))
        self._open = True

    def _on_callback(self, domain, cbid, address):
        try:
            if domain == _callbacks.CUPTI_CB_DOMAIN_RESOURCE:
                data = GraphData.from_address(_ResourceData.from_address(address).resourceDescriptor)
                if cbid == CUPTI_CBID_RESOURCE_GRAPHEXEC_CREATED:
                    self._on_created(data.graphExec or 0, data.graph or 0)
                elif cbid == CUPTI_CBID_RESOURCE_GRAPHEXEC_DESTROY_STARTING:
                    self._on_destroyed(data.graphExec or 0)
                return
            name = self._names.get(cbid)
            d = _callbacks.CUpti_CallbackData.from_address(address)
            if name is not None and d.callbackSite == _callbacks.CUPTI_API_EXIT and _returned_success(d):
                self._on_call(name, d.functionParams)
        except Exception as exc:  # never raise into the driver
            warnings.warn(f"gpuscope graph callback failed: {exc!r}", GpuscopeWarning, stacklevel=1)

    @property
    def closed(self) -> bool:
        return not self._open

    def close(self) -> None:
        """Stop hearing graphs (safe to call twice)."""
        if self._open:
            self._open = False
            _callbacks.remove_graph_watcher(self)


