"""gpuscope's copy of a CUDA graph with child graph nodes (XLA records cuBLAS and cuDNN calls into child graphs:
H200, JAX 0.11, every step's graph held one), read through a stand-in for the driver's graph calls (no GPU)."""

import pytest

from gpuscope._gpu import graph_nodes

driver = pytest.importorskip("cuda.bindings.driver")
T = driver.CUgraphNodeType
OK = driver.CUresult.CUDA_SUCCESS


class FakeGraphs:
    """Graphs as {graph: [(node, type), ...]} with edges {graph: [(from, to), ...]}; nodes and graphs are ints."""

    def __init__(self):
        self.nodes = {}
        self.edges = {}
        self.child = {}  # child graph node -> its graph
        self.clones = 0

    def add(self, graph, nodes, edges=(), children=None):
        self.nodes[graph], self.edges[graph] = list(nodes), list(edges)
        self.child.update(children or {})

    def install(self, monkeypatch):
        monkeypatch.setattr(driver, "cuGraphGetNodes", lambda g, n: (OK, [x for x, _ in self.nodes[int(g)]][:n] if n
                                                                      else None, len(self.nodes[int(g)])))
        monkeypatch.setattr(driver, "cuGraphGetEdges", lambda g, m: (
            OK, [a for a, _ in self.edges[int(g)]][:m] if m else None, [b for _, b in self.edges[int(g)]][:m] if m
            else None, len(self.edges[int(g)])))
        types = {n: t for g in self.nodes.values() for n, t in g}
        monkeypatch.setattr(driver, "cuGraphNodeGetType", lambda n: (OK, types[int(n)]))
        monkeypatch.setattr(driver, "cuGraphChildGraphNodeGetGraph", lambda n: (OK, self.child[int(n)]))

        def clone(g):
            self.clones += 1
            return OK, int(g)  # the stand-in's clone is the graph itself

        monkeypatch.setattr(driver, "cuGraphClone", clone)


def test_a_child_graphs_nodes_run_in_its_nodes_place_and_are_numbered_with_the_parents(monkeypatch):
    g = FakeGraphs()
    # parent: kernel 1 -> child node 2 (a cuBLAS call: memset 21 -> kernel 22) -> kernel 3
    g.add(100, [(1, T.CU_GRAPH_NODE_TYPE_KERNEL), (2, T.CU_GRAPH_NODE_TYPE_GRAPH), (3, T.CU_GRAPH_NODE_TYPE_KERNEL)],
          [(1, 2), (2, 3)], {2: 200})
    g.add(200, [(21, T.CU_GRAPH_NODE_TYPE_MEMSET), (22, T.CU_GRAPH_NODE_TYPE_KERNEL)], [(21, 22)])
    g.install(monkeypatch)
    order, why = graph_nodes._layout(100)
    assert why == ""
    assert [(n, k.replace("CU_GRAPH_NODE_TYPE_", ""), pos, on) for n, k, pos, on in graph_nodes._nodes(order)] == [
        (1, "KERNEL", 0, True), (21, "MEMSET", -1, True), (22, "KERNEL", 1, True), (3, "KERNEL", 2, True)]
    # a disabled child graph node disables its nodes; the kernels after it keep their positions
    assert [(n, pos) for n, _, pos, on in graph_nodes._nodes(order, {2}) if on] == [(1, 0), (3, 2)]


def test_a_host_node_in_a_child_graph_makes_the_graph_unsupported(monkeypatch):
    g = FakeGraphs()
    g.add(100, [(1, T.CU_GRAPH_NODE_TYPE_GRAPH)], children={1: 200})
    g.add(200, [(21, T.CU_GRAPH_NODE_TYPE_HOST)])
    g.install(monkeypatch)
    assert graph_nodes._layout(100)[1] == "it holds a host node"


def test_a_child_graph_set_on_the_executable_graph_is_followed(monkeypatch):
    """cuGraphExecChildGraphNodeSetParams (XLA, when a traced library call's buffers change): the copy runs a clone
    of the new child graph, which it owns."""
    g = FakeGraphs()
    g.add(100, [(1, T.CU_GRAPH_NODE_TYPE_GRAPH), (3, T.CU_GRAPH_NODE_TYPE_KERNEL)], [(1, 3)], {1: 200})
    g.add(200, [(21, T.CU_GRAPH_NODE_TYPE_KERNEL)])
    g.add(300, [(31, T.CU_GRAPH_NODE_TYPE_MEMSET), (32, T.CU_GRAPH_NODE_TYPE_KERNEL)], [(31, 32)])
    g.install(monkeypatch)
    copy = graph_nodes.GraphCopy(0xE1, 100)
    copy.order, copy.unsupported = graph_nodes._layout(100)
    graph_nodes._replace_child(copy, 1, 300)
    assert [(n, pos) for n, _, pos, _ in graph_nodes._nodes(copy.order)] == [(31, -1), (32, 0), (3, 1)]
    assert copy.owned == [300]
    with pytest.raises(RuntimeError, match="below the top level"):
        graph_nodes._replace_child(copy, 31, 200)
