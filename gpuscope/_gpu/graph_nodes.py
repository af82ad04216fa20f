"""The process's executable CUDA graphs as gpuscope copies them, so that their nodes can be run one by one.

A CUDA graph launch (``cuGraphLaunch``) gives CUPTI's launch callbacks and kernel replay nothing per kernel, and the
driver has no call that reads an executable graph's nodes back. So gpuscope copies each graph as it is instantiated
(CUPTI's ``GRAPHEXEC_CREATED`` callback gives the graph it was made from, valid only then: ``cuGraphClone`` in the
callback; PyTorch destroys its graph right after instantiating it), and follows every driver call that changes the
executable graph afterwards (``cuGraphExecKernelNodeSetParams``, as JAX does before each launch; ``cuGraphExecUpdate``;
``cuGraphNodeSetEnabled``; memset and memcpy parameters; ``cuGraphExecChildGraphNodeSetParams``, as XLA does for the
library calls it records into child graphs) by making the same change on the copy. A change gpuscope cannot follow
(a host node's, events, conditional nodes) marks the graph as not runnable node by node, with the reason.

Child graph nodes (XLA records cuBLAS and cuDNN calls into child graphs) are run as their own nodes, in place: a
topological order of the child inside the parent's, their kernel nodes numbered with the parent's.
:func:`plan` reads a copy's nodes in a topological order into the driver calls that run them on a stream, and
:func:`run` makes them: kernel nodes with ``cuLaunchKernel`` (their parameters as the copy holds them), memset and
memcpy nodes with the matching driver calls, empty and event nodes as nothing (one stream orders them).
:func:`empty_exec` is an executable graph with no node, which the graph launch itself is given instead of the
program's (:mod:`gpuscope._range_profiling.graph_replay`).

Graphs instantiated before :func:`watch` are not known (:func:`copy_of` returns None): start a session, or
``gpuscope.watch_graphs()``, before the first step.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field

from gpuscope._gpu.device import _check

__all__ = ["GraphCopy", "copy_of", "empty_exec", "errors", "plan", "run", "watch", "pause", "unkeep"]

#: Node types run one by one, and those run as nothing (their order is the stream's).
_RUN = ("CU_GRAPH_NODE_TYPE_KERNEL", "CU_GRAPH_NODE_TYPE_MEMSET", "CU_GRAPH_NODE_TYPE_MEMCPY")
_NOTHING = ("CU_GRAPH_NODE_TYPE_EMPTY", "CU_GRAPH_NODE_TYPE_EVENT_RECORD", "CU_GRAPH_NODE_TYPE_WAIT_EVENT")


@dataclass
class GraphCopy:
    """gpuscope's copy of the graph an executable graph runs, kept up to date with the calls that change it."""

    exec_handle: int
    graph: object  # the CUgraph clone (gpuscope's own)
    order: list = field(default_factory=list)  # (clone node, type name, child graph's own order or None)
    unsupported: str = ""  # why it cannot be run node by node ("" where it can)
    disabled: set = field(default_factory=set)  # clone nodes disabled in the executable graph (cuGraphNodeSetEnabled)
    launches: int = 0  # launches of the executable graph heard so far
    exec_id: int = -1  # CUPTI's id of the executable graph
    owned: list = field(default_factory=list)  # clones of child graphs set later (cuGraphExecChildGraphNodeSetParams)


_copies: dict[int, GraphCopy] = {}
_watcher = None
_kept = False  # watch(keep=True): not paused when the last session closes
_in_session = False  # a session's watch() since the last pause()
_lock = threading.Lock()
_empty: dict[int, object] = {}  # context -> an executable graph with no node
_errors: list[str] = []


def _topological(graph) -> list:
    """The nodes of *graph* in a topological order (``cuGraphGetEdges``: 13.x adds edge data; read by position)."""
    from cuda.bindings import driver

    n = driver.cuGraphGetNodes(graph, 0)[-1]
    nodes = list(_check(driver.cuGraphGetNodes(graph, n), "cuGraphGetNodes")[0])[:n]
    m = driver.cuGraphGetEdges(graph, 0)[-1]
    edges = _check(driver.cuGraphGetEdges(graph, m), "cuGraphGetEdges")  # (from, to, [edge data,] count)
    before = {int(x): set() for x in nodes}
    for a, b in zip(list(edges[0] or ())[:m], list(edges[1] or ())[:m]):
        before[int(b)].add(int(a))
    by_handle = {int(x): x for x in nodes}
    order, done = [], set()
    while len(order) < len(nodes):
        ready = [k for k, deps in before.items() if k not in done and deps <= done]
        if not ready:
            raise RuntimeError("the graph has a cycle")
        for k in ready:
            done.add(k)
            order.append(by_handle[k])
    return order


def _layout(graph, depth: int = 0) -> tuple[list, str]:
    """*graph*'s nodes in a topological order, a child graph node with its child's own order ((node, type name,
    child order or None) each), and why it cannot be run node by node ("" where it can)."""
    from cuda.bindings import driver

    order, unsupported = [], ""
    for node in _topological(graph):
        kind = _check(driver.cuGraphNodeGetType(node), "cuGraphNodeGetType").name
        if kind == "CU_GRAPH_NODE_TYPE_GRAPH" and depth < _CHILD_DEPTH:
            child = _check(driver.cuGraphChildGraphNodeGetGraph(node), "cuGraphChildGraphNodeGetGraph")
            sub, why = _layout(child, depth + 1)
            order.append((node, kind, sub))
            unsupported = unsupported or why
        elif kind in _RUN or kind in _NOTHING:
            order.append((node, kind, None))
        elif not unsupported:
            unsupported = f"it holds a {kind.replace('CU_GRAPH_NODE_TYPE_', '').lower()} node"
    return order, unsupported


#: How deep child graphs are followed (XLA nests one level; deeper ones are refused as "a graph node")
_CHILD_DEPTH = 8


def _copy(exec_handle: int, graph_handle: int) -> GraphCopy:
    from cuda.bindings import driver

    from gpuscope.cupti.graphs import graph_exec_id

    clone = _check(driver.cuGraphClone(driver.CUgraph(graph_handle)), "cuGraphClone")
    copy = GraphCopy(exec_handle, clone, exec_id=graph_exec_id(exec_handle))
    copy.order, copy.unsupported = _layout(clone)
    return copy


def _nodes(order: list, disabled=frozenset()):
    """(node, type name, position among the kernel nodes or -1, enabled) in run order, a child graph's nodes in
    its node's place; a disabled child graph node disables its nodes. Disabled kernel nodes keep their position."""
    position = 0
    stack = [(iter(order), True)]
    while stack:
        entries, enabled = stack[-1]
        entry = next(entries, None)
        if entry is None:
            stack.pop()
            continue
        node, kind, sub = entry
        on = enabled and int(node) not in disabled
        if sub is not None:
            stack.append((iter(sub), on))
            continue
        yield node, kind, (position if kind == "CU_GRAPH_NODE_TYPE_KERNEL" else -1), on
        position += kind == "CU_GRAPH_NODE_TYPE_KERNEL"


def _replace_child(copy: GraphCopy, node, child_graph: int) -> None:
    """``cuGraphExecChildGraphNodeSetParams`` on the copy: the child graph node *node* (the clone's, at the top
    level) runs *child_graph* from now on. gpuscope runs its own clone of it, valid only during the call."""
    from cuda.bindings import driver

    for i, (n, kind, sub) in enumerate(copy.order):
        if sub is not None and int(n) == int(node):
            clone = _check(driver.cuGraphClone(driver.CUgraph(child_graph)), "cuGraphClone")
            copy.owned.append(clone)
            new, why = _layout(clone, 1)
            if why:
                raise RuntimeError(why)
            copy.order[i] = (n, kind, new)
            return
    raise RuntimeError("a child graph node below the top level changed")


def _destroy(copy: GraphCopy) -> None:
    from cuda.bindings import driver

    for graph in (copy.graph, *copy.owned):
        driver.cuGraphDestroy(graph)


def _on_created(exec_handle: int, graph_handle: int) -> None:
    try:
        copy = _copy(exec_handle, graph_handle)
    except Exception as exc:  # noqa: BLE001  the graph stays unknown: its launches are counted as such
        _errors.append(f"copying a graph at its instantiation: {exc}")
        return
    old = _copies.pop(exec_handle, None)
    _copies[exec_handle] = copy
    if old is not None:
        _destroy(old)


def _on_destroyed(exec_handle: int) -> None:
    old = _copies.pop(exec_handle, None)
    if old is not None:
        _destroy(old)


def _on_call(name: str, address: int) -> None:
    """A driver call changed an executable graph: make the same change on its copy."""
    from cuda.bindings import driver

    from gpuscope.cupti import graphs as _cg

    if name.startswith("cuGraphExecUpdate"):
        p = _cg.ExecUpdateParams.from_address(address)
        if p.hGraphExec in _copies:
            _on_created(p.hGraphExec, p.hGraph)
        return
    if name == "cuGraphNodeSetEnabled":
        p = _cg.NodeSetEnabledParams.from_address(address)
    else:
        p = _cg.ExecNodeParams.from_address(address)
    copy = _copies.get(p.hGraphExec)
    if copy is None or copy.unsupported:
        return
    try:
        node = _check(driver.cuGraphNodeFindInClone(driver.CUgraphNode(p.hNode), copy.graph),
                      "cuGraphNodeFindInClone")
        if name == "cuGraphNodeSetEnabled":
            (copy.disabled.discard if p.isEnabled else copy.disabled.add)(int(node))
        elif name == "cuGraphExecKernelNodeSetParams_v2":
            params = driver.CUDA_KERNEL_NODE_PARAMS(_ptr=p.params)
            _check(driver.cuGraphKernelNodeSetParams(node, params), "cuGraphKernelNodeSetParams")
        elif name == "cuGraphExecKernelNodeSetParams":  # the v1 struct: no kern, no ctx at its end
            _check(driver.cuGraphKernelNodeSetParams(node, _kernel_params_v1(p.params)), "cuGraphKernelNodeSetParams")
        elif name == "cuGraphExecNodeSetParams":
            _check(driver.cuGraphNodeSetParams(node, driver.CUgraphNodeParams(_ptr=p.params)), "cuGraphNodeSetParams")
        elif name == "cuGraphExecMemsetNodeSetParams":
            params = driver.CUDA_MEMSET_NODE_PARAMS(_ptr=p.params)
            _check(driver.cuGraphMemsetNodeSetParams(node, params), "cuGraphMemsetNodeSetParams")
        elif name == "cuGraphExecChildGraphNodeSetParams":
            _replace_child(copy, node, p.params)
        elif name == "cuGraphExecMemcpyNodeSetParams":
            params = driver.CUDA_MEMCPY3D(_ptr=p.params)
            _check(driver.cuGraphMemcpyNodeSetParams(node, params), "cuGraphMemcpyNodeSetParams")
        else:
            copy.unsupported = f"{name} changed it"
    except Exception as exc:  # noqa: BLE001  never raise into the driver: the graph is not run node by node
        copy.unsupported = f"{name} could not be followed ({exc})"


def _kernel_params_v1(address: int):
    import ctypes

    from cuda.bindings import driver

    class V1(ctypes.Structure):  # CUDA_KERNEL_NODE_PARAMS_v1
        _fields_ = [("func", ctypes.c_void_p)] + [(n, ctypes.c_uint) for n in (
            "gridDimX", "gridDimY", "gridDimZ", "blockDimX", "blockDimY", "blockDimZ", "sharedMemBytes")] + [
            ("kernelParams", ctypes.c_void_p), ("extra", ctypes.c_void_p)]

    v1 = V1.from_address(address)
    out = driver.CUDA_KERNEL_NODE_PARAMS()
    out.func = driver.CUfunction(v1.func or 0)
    for name in ("gridDimX", "gridDimY", "gridDimZ", "blockDimX", "blockDimY", "blockDimZ", "sharedMemBytes"):
        setattr(out, name, getattr(v1, name))
    out.kernelParams = v1.kernelParams or 0
    return out


def watch(keep: bool = False, strict: bool = False) -> str:
    """Start copying the process's graphs as they are instantiated (once; later calls do nothing). With *keep*,
    go on after the last session closes (``gpuscope.watch_graphs``). Returns why it could not start, or "" (with
    *strict*, raises it: :class:`gpuscope.ProfilerBusyError` where another CUPTI client holds the subscriber)."""
    global _watcher, _kept, _in_session
    with _lock:
        _kept = _kept or keep
        _in_session = _in_session or not keep
        if _watcher is not None:
            return ""
        try:
            from gpuscope.cupti.graphs import GraphWatcher

            _watcher = GraphWatcher(_on_created, _on_destroyed, _on_call)
        except Exception as exc:  # noqa: BLE001  another CUPTI subscriber: graphs stay unknown, and the report says
            if strict:
                raise
            return f"{type(exc).__name__}: {exc}"
    return ""


def unkeep() -> None:
    """Undo :func:`watch`'s *keep*: stop now, unless a session is open (its close stops it)."""
    global _kept
    _kept = False
    if not _in_session:
        pause()


def pause(force: bool = False) -> bool:
    """Stop copying graphs (the last session closed, unless :func:`watch` was asked to keep on; or CUPTI is being
    detached: *force*); the copies made are kept. Whether it was watching."""
    global _watcher, _in_session
    with _lock:
        _in_session = False
        if _watcher is None or (_kept and not force):
            return False
        watcher, _watcher = _watcher, None
    watcher.close()
    return True


def copy_of(exec_handle: int) -> GraphCopy | None:
    """The copy of executable graph *exec_handle*, or None where it was instantiated before :func:`watch`."""
    return _copies.get(exec_handle)


def empty_exec(context: int):
    """An executable graph with no node, made once per context (a launch given it runs nothing)."""
    from cuda.bindings import driver

    empty = _empty.get(context)
    if empty is None:
        graph = _check(driver.cuGraphCreate(0), "cuGraphCreate")
        empty = _empty[context] = _check(driver.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
    return empty


def plan(copy: GraphCopy, stream: int) -> list:
    """The driver calls that run *copy*'s nodes in its topological order on *stream*: every node's parameters read
    first, so that a graph whose nodes cannot all be run is refused before anything ran (GpuscopeError, or
    RuntimeError for a node gpuscope cannot run). Kernel nodes
    with a thread-block cluster launch with it (``cuLaunchKernelEx``), as the graph would."""
    from cuda.bindings import driver

    s = driver.CUstream(stream)
    fill = {1: driver.cuMemsetD2D8Async, 2: driver.cuMemsetD2D16Async, 4: driver.cuMemsetD2D32Async}
    steps = []
    for node, kind, position, enabled in _nodes(copy.order, copy.disabled):
        if not enabled:
            continue
        if kind == "CU_GRAPH_NODE_TYPE_KERNEL":
            p = _check(driver.cuGraphKernelNodeGetParams(node), "cuGraphKernelNodeGetParams")
            # arguments in kernelParams, or packed in one buffer through extra (cuBLAS's kernels, in the child graphs
            # XLA records): both arrays are the node's own, valid while the node is (the driver's documentation)
            args = (int(p.kernelParams), 0) if int(p.kernelParams) else (0, int(p.extra))
            # fresh handles: cuda.bindings' struct fields are views into the struct, gone with it
            function = driver.CUfunction(int(p.func) or int(p.kern))
            cluster = _cluster(node)
            if cluster is None:
                steps.append((position, driver.cuLaunchKernel, (
                    function, p.gridDimX, p.gridDimY, p.gridDimZ, p.blockDimX, p.blockDimY, p.blockDimZ,
                    p.sharedMemBytes, s, *args), p))
            else:
                config = driver.CUlaunchConfig()
                config.gridDimX, config.gridDimY, config.gridDimZ = p.gridDimX, p.gridDimY, p.gridDimZ
                config.blockDimX, config.blockDimY, config.blockDimZ = p.blockDimX, p.blockDimY, p.blockDimZ
                config.sharedMemBytes, config.hStream = p.sharedMemBytes, s
                config.attrs, config.numAttrs = [cluster], 1
                steps.append((position, driver.cuLaunchKernelEx, (config, function, *args), p))
        elif kind == "CU_GRAPH_NODE_TYPE_MEMSET":
            p = _check(driver.cuGraphMemsetNodeGetParams(node), "cuGraphMemsetNodeGetParams")
            if p.elementSize not in fill:
                raise RuntimeError(f"a memset node of {p.elementSize}-byte elements")
            steps.append((-1, fill[p.elementSize], (driver.CUdeviceptr(int(p.dst)), p.pitch, p.value, p.width,
                                                    p.height, s), p))
        elif kind == "CU_GRAPH_NODE_TYPE_MEMCPY":
            p = _check(driver.cuGraphMemcpyNodeGetParams(node), "cuGraphMemcpyNodeGetParams")
            steps.append((-1, driver.cuMemcpy3DAsync, (p, s), p))
    return steps


def _cluster(node):
    """The kernel node's thread-block cluster as a launch attribute, or None (no cluster, or one of 1x1x1)."""
    from cuda.bindings import driver

    cid = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    err, value = driver.cuGraphKernelNodeGetAttribute(node, cid)
    if err != driver.CUresult.CUDA_SUCCESS:
        return None
    dims = (value.clusterDim.x, value.clusterDim.y, value.clusterDim.z)
    if dims in ((0, 0, 0), (1, 1, 1)):
        return None
    attr = driver.CUlaunchAttribute()
    attr.id = cid
    attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = dims
    return attr


def run(steps: list, before_kernel=None) -> int:
    """Make the calls of :func:`plan`; ``before_kernel(position)`` is called before each kernel node's launch.
    Returns the kernel nodes launched; a call the driver refuses raises GpuscopeError (those before it ran)."""
    launched = 0
    for position, call, args, _params in steps:  # _params: the struct the call's arguments were read from, kept
        if position >= 0:
            if before_kernel is not None:
                before_kernel(position)
            launched += 1
        _check(call(*args), call.__name__)
    return launched


def errors() -> list[str]:
    """What could not be copied (graphs whose launches then run as they are)."""
    return list(_errors)


def _forget_in_child() -> None:
    global _watcher, _lock, _kept
    _watcher, _kept, _lock = None, False, threading.Lock()
    _copies.clear()
    _empty.clear()


os.register_at_fork(after_in_child=_forget_in_child)
