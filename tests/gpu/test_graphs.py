"""CUDA graphs profiled node by node (graphs="node") and as one row per launch (graphs="graph"), on a CuPy-captured
graph, a captured PyTorch graph and JAX's steps: the program's outputs bit-identical with and without profiling,
one row per kernel node execution."""

import numpy as np
import pytest

import gpuscope as gs

cp = pytest.importorskip("cupy")


@pytest.fixture(autouse=True)
def _unwatch():
    yield
    gs.watch_graphs(False)  # CUPTI's subscriber back for the tests after (torch.profiler)


def _captured():
    """A CuPy graph with three kernel nodes, a memset and a D2D memcpy; one node accumulates (a double run shows)."""
    n = 1 << 20
    a = cp.arange(n, dtype=cp.float32)
    t, out, acc, z, c = (cp.zeros(n, cp.float32) for _ in range(5))
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        s.begin_capture()
        cp.multiply(a, 2, out=t)
        cp.add(t, 1, out=out)
        cp.add(acc, a, out=acc)
        cp.cuda.runtime.memsetAsync(z.data.ptr, 0, z.nbytes, s.ptr)
        cp.cuda.runtime.memcpyAsync(c.data.ptr, out.data.ptr, out.nbytes, 3, s.ptr)
        g = s.end_capture()

    def run(times=3):
        for x in (acc, t, out, c):
            x.fill(0)
        z.fill(5)
        cp.cuda.Device().synchronize()
        for _ in range(times):
            g.launch(s)
        s.synchronize()
        return [x.get() for x in (acc, z, c, out, t)]

    return run


@pytest.mark.parametrize("graphs", ["node", "graph"])
def test_a_captured_graph_is_profiled_node_by_node_and_its_outputs_are_unchanged(graphs):
    gs.watch_graphs()  # the graph is captured before the session
    run = _captured()
    expected = run()
    with gs.Profiler("topdown", mode="kernel", graphs=graphs) as prof:
        got = run()
    for e, g in zip(expected, got):
        np.testing.assert_array_equal(e, g)  # bit-identical: every node ran once, in order
    ds = prof.dataset
    assert ds.attrs["graph_launches_replayed"] == 3 and ds.attrs["graph_kernel_nodes"] == 9
    eager = ds.isel(range=ds.graph_launch.values < 0)  # run()'s fill kernels before the launches
    assert eager.sizes["range"] == ds.sizes["range"] - (9 if graphs == "node" else 3)
    ds = ds.isel(range=ds.graph_launch.values >= 0)
    if graphs == "node":
        assert ds.sizes["range"] == 9
        assert sorted(set(ds.graph_launch.values.tolist())) == [0, 1, 2]
        assert ds.graph_node.values.tolist() == [0, 1, 2] * 3
        assert (ds.graph_exec.values >= 0).all()
        td = gs.topdown(ds)
        assert np.isfinite(td.retire.values).all()
    else:
        assert ds.sizes["range"] == 3 and (ds.graph_nodes.values == 3).all()
        assert np.isfinite(ds["sm__warps_active.sum"].values).all()  # the nodes' counts added


def test_a_graph_with_child_graph_nodes_runs_them_in_place():
    """XLA records library calls (cuBLAS, cuDNN) into child graphs: a parent graph of two child graph nodes (the same
    captured CuPy graph twice, in sequence) and a memset. Its kernel nodes are profiled in place, numbered with the
    parent's, and the results are bit-identical (the accumulation shows a double or a missing run)."""
    from cuda.bindings import driver

    n = 1 << 20
    a = cp.arange(n, dtype=cp.float32)
    acc, t, z = cp.zeros(n, cp.float32), cp.zeros(n, cp.float32), cp.ones(n, cp.float32)
    s = cp.cuda.Stream(non_blocking=True)
    cp.cuda.runtime.streamBeginCapture(s.ptr, 0)
    with s:
        cp.multiply(a, 2, out=t)
        cp.add(acc, t, out=acc)
    child = cp.cuda.runtime.streamEndCapture(s.ptr)
    gs.watch_graphs()  # before the parent is instantiated

    def ok(result):
        err, *values = result
        assert int(err) == 0, err
        return values[0] if values else None

    parent = ok(driver.cuGraphCreate(0))
    first = ok(driver.cuGraphAddChildGraphNode(parent, None, 0, driver.CUgraph(child)))
    second = ok(driver.cuGraphAddChildGraphNode(parent, [first], 1, driver.CUgraph(child)))
    memset = driver.CUDA_MEMSET_NODE_PARAMS()
    memset.dst, memset.elementSize, memset.width, memset.height, memset.value = z.data.ptr, 4, n, 1, 0
    ok(driver.cuGraphAddMemsetNode(parent, [second], 1, memset, driver.CUcontext(ok(driver.cuCtxGetCurrent()))))
    graph_exec = ok(driver.cuGraphInstantiate(parent, 0))

    def run(times=2):
        acc.fill(0)
        z.fill(1)
        cp.cuda.Device().synchronize()
        for _ in range(times):
            ok(driver.cuGraphLaunch(graph_exec, driver.CUstream(s.ptr)))
        s.synchronize()
        return acc.get(), z.get()

    expected = run()
    assert expected[0][5] == 2 * 2 * 2 * 5.0  # two launches, each two child runs of acc += 2a
    with gs.Profiler("topdown", mode="kernel") as prof:
        got = run()
    for e, g in zip(expected, got):
        np.testing.assert_array_equal(e, g)
    ds = prof.dataset
    assert ds.attrs["graph_launches_replayed"] == 2, dict(ds.attrs.get("graph_not_replayed_why", {}))
    nodes = ds.isel(range=ds.graph_launch.values >= 0)
    assert nodes.graph_node.values.tolist() == [0, 1, 2, 3] * 2  # the child's two kernels, twice, in place
    ok(driver.cuGraphExecDestroy(graph_exec))
    ok(driver.cuGraphDestroy(parent))


def test_a_torch_cuda_graph_replay_is_profiled_node_by_node():
    torch = pytest.importorskip("torch")
    x = torch.randn(2048, 2048, device="cuda")
    w = torch.randn(2048, 2048, device="cuda")
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for _ in range(2):
            y = torch.relu(x @ w)
    torch.cuda.current_stream().wait_stream(s)
    with gs.Profiler("topdown", mode="kernel") as prof:
        g = torch.cuda.CUDAGraph()  # PyTorch destroys the graph it instantiated: gpuscope copied it
        with torch.cuda.graph(g):
            y = torch.relu(x @ w) + 1
        g.replay()
        torch.cuda.synchronize()
        profiled = y.clone()
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(profiled, y)
    ds = prof.dataset
    nodes = ds.isel(range=ds.graph_launch.values >= 0)
    assert ds.attrs["graph_launches_replayed"] == 1 and nodes.sizes["range"] == ds.attrs["graph_kernel_nodes"] >= 2
    assert ds.attrs["launches_captured"] >= 2  # the capture's own launches recorded nodes, ran nothing


def test_jax_steps_get_a_row_per_kernel_node():
    import os
    import sys

    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # docs/jax.md: kernel replay saves what is held
    jax = pytest.importorskip("jax")
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent / "scripts"))
    import jax_mlp

    gs.watch_graphs()  # before JAX makes its graphs (the first steps)
    key = jax.random.PRNGKey(0)
    params = jax_mlp.init(key)
    m = jax.tree_util.tree_map(jax.numpy.zeros_like, params)
    v = jax.tree_util.tree_map(jax.numpy.zeros_like, params)
    x = jax.random.normal(jax.random.PRNGKey(1), (2048, 512))
    y = jax.random.normal(jax.random.PRNGKey(2), (2048, 256))
    state = (params, m, v)
    for t in range(1, 4):  # warm-up: compiled, autotuned, its graphs instantiated
        state = jax_mlp.step(*state, jax.numpy.float32(t), x, y)[:3]
    jax.block_until_ready(state)
    plain = jax_mlp.step(*state, jax.numpy.float32(4), x, y)
    with gs.Profiler("topdown", mode="kernel") as prof:
        profiled = jax_mlp.step(*state, jax.numpy.float32(4), x, y)
        jax.block_until_ready(profiled)
    same = all(np.array_equal(np.asarray(a), np.asarray(b))
               for a, b in zip(jax.tree_util.tree_leaves(plain), jax.tree_util.tree_leaves(profiled)))
    ds = prof.dataset
    print("jax step:", ds.sizes["range"], "rows;", dict(ds.attrs.get("graph_launches_not_replayed", {})),
          "bit-identical:", same)
    assert ds.attrs.get("graph_launches_replayed", 0) >= 1
    assert ds.sizes["range"] >= ds.attrs["graph_kernel_nodes"] >= 5
    assert same


def test_pm_and_pc_sampling_name_the_kernels_of_graph_launches():
    """A graph's kernels reach no launch callback, but their activity records and PC samples carry their names:
    PM sampling's execution table (kernels=True) and PC sampling's per-kernel stalls hold them."""
    run = _captured()
    run(times=1)
    with gs.sample("pm-default", "100us", kernels=True) as pm:
        run(times=20)
    execs = gs.kernel_executions(pm.dataset)
    graph_kernels = execs[execs["kernel"].str.contains("multiply|add")]
    assert len(graph_kernels) >= 3 * 20, execs["kernel"].value_counts()
    with gs.pc_sample() as pcs:
        run(times=200)
    names = [str(k) for k in pcs.dataset["kernel"].values]
    assert any("multiply" in k for k in names) and any("add" in k for k in names), names
    assert pcs.graph_launches == 200
