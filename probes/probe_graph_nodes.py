"""Probe: can a CUDA graph's kernel nodes be run one by one from inside CUPTI's cuGraphLaunch callback, and the
program's own launch made a no-op, with the outputs unchanged? And what do JAX and PyTorch do to their graphs?

``python probe_graph_nodes.py [cupy|jax|torch]``. Its own CUPTI subscriber (no gpuscope session):
- cupy: a captured graph (kernels, a memset, a D2D memcpy, an accumulation that shows a double run); a reference
  run; then (A) nodes run from the callback's clone and the launch's exec swapped in its params for an empty one;
  (B) nodes run from the clone and the exec's nodes disabled (cuGraphNodeSetEnabled) for that launch;
  whether nested launch callbacks reach the subscriber.
- jax / torch: which graph resource callbacks and exec-update calls a warm step makes (is the graph an exec was
  instantiated from destroyed? how are parameters updated?).
"""

import ctypes
import json
import sys
from collections import Counter
from ctypes import POINTER, Structure, c_char_p, c_int, c_uint32, c_void_p

from cuda.bindings import driver as drv

from gpuscope._gpu.graph_nodes import _topological as topo  # the order gpuscope runs nodes in
from gpuscope.cupti import _lib
from gpuscope.cupti.callbacks import CUpti_CallbackData

WHAT = sys.argv[1] if len(sys.argv) > 1 else "cupy"
cupti = _lib.load().cdll
CB = ctypes.CFUNCTYPE(None, c_void_p, c_int, c_uint32, c_void_p)
cupti.cuptiGetCallbackName.argtypes = [c_int, c_uint32, POINTER(c_char_p)]
cupti.cuptiSubscribe.argtypes = [POINTER(c_void_p), CB, c_void_p]
cupti.cuptiEnableCallback.argtypes = [c_uint32, c_void_p, c_int, c_uint32]
cupti.cuptiEnableDomain.argtypes = [c_uint32, c_void_p, c_int]


def names():
    out = {}
    for cbid in range(1, 1000):
        n = c_char_p()
        if cupti.cuptiGetCallbackName(1, cbid, ctypes.byref(n)) == 0 and n.value:
            out[n.value.decode()] = cbid
    return out


CBIDS = names()
BY_ID = {v: k for k, v in CBIDS.items()}
WATCH = [n for n in CBIDS if n.startswith(("cuGraphExec", "cuGraphLaunch", "cuGraphInstantiate", "cuGraphNodeSetEnabled",
                                           "cuGraphDestroy", "cuLaunchKernel", "cuGraphKernelNodeSetParams",
                                           "cuGraphUpload"))]


class ResourceData(Structure):
    _fields_ = [("context", c_void_p), ("resourceHandle", c_void_p), ("resourceDescriptor", c_void_p)]


class GraphData(Structure):
    _fields_ = [("graph", c_void_p), ("originalGraph", c_void_p), ("node", c_void_p), ("originalNode", c_void_p),
                ("nodeType", c_int), ("dependency", c_void_p), ("graphExec", c_void_p)]


class GraphLaunchParams(Structure):
    _fields_ = [("hGraphExec", c_void_p), ("hStream", c_void_p)]


seen = Counter()
execs = {}  # exec -> clone of the graph it was made from (cloned in the callback)
graphs_of = {}  # exec -> the graph handle it was made from
destroyed_graphs = set()
log = []
state = {"mode": None, "in_graph": False, "nested": 0, "errors": [], "swap_to": None, "disabled": []}


def ok(result):
    err = result[0] if isinstance(result, tuple) else result
    if err != drv.CUresult.CUDA_SUCCESS:
        raise RuntimeError(str(err))
    return result[1:] if isinstance(result, tuple) and len(result) > 2 else (result[1] if isinstance(result, tuple)
                                                                              and len(result) == 2 else None)


def run_nodes(graph, stream):
    """Launch the clone's nodes in a topological order on *stream*."""
    kinds = Counter()
    for node in topo(graph):
        err, t = drv.cuGraphNodeGetType(node)
        kinds[t.name] += 1
        if t == drv.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL:
            err, p = drv.cuGraphKernelNodeGetParams(node)
            ok(err)
            f = p.func if int(p.func) else drv.CUfunction(int(p.kern))
            ok(drv.cuLaunchKernel(f, p.gridDimX, p.gridDimY, p.gridDimZ, p.blockDimX, p.blockDimY, p.blockDimZ,
                                  p.sharedMemBytes, stream, int(p.kernelParams), 0))
        elif t == drv.CUgraphNodeType.CU_GRAPH_NODE_TYPE_MEMSET:
            err, p = drv.cuGraphMemsetNodeGetParams(node)
            ok(err)
            fn = {1: drv.cuMemsetD2D8Async, 2: drv.cuMemsetD2D16Async, 4: drv.cuMemsetD2D32Async}[p.elementSize]
            ok(fn(p.dst, p.pitch, p.value, p.width, p.height, stream))
        elif t == drv.CUgraphNodeType.CU_GRAPH_NODE_TYPE_MEMCPY:
            err, p = drv.cuGraphMemcpyNodeGetParams(node)
            ok(err)
            ok(drv.cuMemcpy3DAsync(p, stream))
        elif t in (drv.CUgraphNodeType.CU_GRAPH_NODE_TYPE_EMPTY,):
            pass
        else:
            raise RuntimeError(f"node type {t.name}")
    return kinds


def callback(userdata, domain, cbid, address):
    try:
        if domain == 3:  # resource
            seen[f"resource {cbid}"] += 1
            if cbid in (18, 10):
                r = ResourceData.from_address(address)
                g = GraphData.from_address(r.resourceDescriptor)
                if cbid == 18:
                    graphs_of[g.graphExec] = g.graph
                    err, clone = drv.cuGraphClone(drv.CUgraph(g.graph))
                    execs[g.graphExec] = clone if err == drv.CUresult.CUDA_SUCCESS else str(err)
                else:
                    destroyed_graphs.add(g.graph)
            return
        d = CUpti_CallbackData.from_address(address)
        name = BY_ID.get(cbid, str(cbid))
        site = "enter" if d.callbackSite == 0 else "exit"
        seen[f"{name} {site}"] += 1
        if state["in_graph"] and name.startswith("cuLaunchKernel"):
            state["nested"] += 1
        if name.startswith("cuGraphLaunch") and state["mode"] and not state["in_graph"]:
            p = GraphLaunchParams.from_address(d.functionParams)
            exec_ = p.hGraphExec
            if site == "enter":
                state["in_graph"] = True
                try:
                    state["kinds"] = dict(run_nodes(execs[exec_], drv.CUstream(p.hStream)))
                    if state["mode"] == "swap":
                        p.hGraphExec = state["swap_to"]
                    elif state["mode"] == "disable":
                        g = drv.CUgraph(graphs_of[exec_])
                        for node in topo(g):
                            ok(drv.cuGraphNodeSetEnabled(drv.CUgraphExec(exec_), node, 0))
                            state["disabled"].append((exec_, node))
                finally:
                    state["in_graph"] = False
            elif state["mode"] == "disable":
                for e, node in state["disabled"]:
                    ok(drv.cuGraphNodeSetEnabled(drv.CUgraphExec(e), node, 1))
                state["disabled"].clear()
    except Exception as exc:
        state["errors"].append(f"{type(exc).__name__}: {exc}")


_cb = CB(callback)


def subscribe():
    h = c_void_p()
    assert cupti.cuptiSubscribe(ctypes.byref(h), _cb, None) == 0
    for name in WATCH:
        cupti.cuptiEnableCallback(1, h, 1, CBIDS[name])
    for cbid in range(9, 20):
        cupti.cuptiEnableCallback(1, h, 3, cbid)
    return h


def probe_cupy():
    import cupy as cp

    n = 1 << 20
    a = cp.arange(n, dtype=cp.float32)
    t, out, acc, z, c = (cp.zeros(n, cp.float32) for _ in range(5))
    s = cp.cuda.Stream(non_blocking=True)
    subscribe()
    with s:
        s.begin_capture()
        cp.multiply(a, 2, out=t)
        cp.add(t, 1, out=out)
        cp.add(acc, a, out=acc)  # accumulates: a double run shows
        cp.cuda.runtime.memsetAsync(z.data.ptr, 0, z.nbytes, s.ptr)
        cp.cuda.runtime.memcpyAsync(c.data.ptr, out.data.ptr, out.nbytes, 3, s.ptr)
        g = s.end_capture()
    report = {"execs_seen": len(execs), "clone_ok": all(not isinstance(v, str) for v in execs.values())}

    def run(mode):
        acc.fill(0); z.fill(5); c.fill(0); out.fill(0); t.fill(0)
        cp.cuda.Device().synchronize()
        state["mode"] = mode
        for _ in range(3):
            g.launch(s)
        s.synchronize()
        state["mode"] = None
        return [float(x) for x in (acc[7], z[7], c[7], out[7], t[7])]

    report["reference"] = run(None)
    # an empty exec to swap in
    err, empty = drv.cuGraphCreate(0)
    err, empty_exec = drv.cuGraphInstantiate(empty, 0)
    state["swap_to"] = int(empty_exec)
    report["swap"] = run("swap")
    report["swap_errors"], state["errors"] = state["errors"], []
    report["nested_launch_callbacks_swap"], state["nested"] = state["nested"], 0
    report["disable"] = run("disable")
    report["disable_errors"], state["errors"] = state["errors"], []
    report["nested_launch_callbacks_disable"] = state["nested"]
    report["kinds"] = state.get("kinds")
    report["seen"] = dict(seen)
    print(json.dumps(report))


def probe_jax():
    import os
    sys.argv = [sys.argv[0], "8"]
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, "..", "tests", "gpu", "scripts"))
    import jax_mlp

    jax_mlp.STEPS = 3
    jax_mlp.main()  # warm: compiled, graphs made
    subscribe()
    seen.clear()
    jax_mlp.STEPS = 5
    jax_mlp.main()
    print(json.dumps({"seen": dict(seen), "execs": len(execs), "graphs_destroyed": len(destroyed_graphs),
                      "destroyed_of_execs": sum(g in destroyed_graphs for g in graphs_of.values()),
                      "errors": state["errors"][:5]}))


def probe_torch():
    import torch

    x = torch.randn(1024, 1024, device="cuda")
    w = torch.randn(1024, 1024, device="cuda")
    subscribe()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for _ in range(2):
            y = torch.relu(x @ w)
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        y = torch.relu(x @ w) + 1
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    print(json.dumps({"seen": dict(seen), "execs": len(execs), "graphs_destroyed": len(destroyed_graphs),
                      "destroyed_of_execs": sum(gr in destroyed_graphs for gr in graphs_of.values()),
                      "errors": state["errors"][:5]}))


if __name__ == "__main__":
    {"cupy": probe_cupy, "jax": probe_jax, "torch": probe_torch}[WHAT]()
