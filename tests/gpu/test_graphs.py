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


def _jax_step(watch: bool):
    """jax and a warm JAX training step (tests/gpu/scripts/jax_mlp.py: compiled, autotuned, its CUDA graphs made):
    ``step()`` runs the fourth step from the same state and returns its outputs. *watch*: gs.watch_graphs() first,
    so that gpuscope copies the graphs JAX makes."""
    import os
    import sys

    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # docs/jax.md: kernel replay saves what is held
    jax = pytest.importorskip("jax")
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent / "scripts"))
    import jax_mlp

    if watch:
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
    return jax, lambda: jax_mlp.step(*state, jax.numpy.float32(4), x, y)


def test_jax_steps_get_a_row_per_kernel_node():
    jax, step = _jax_step(watch=True)
    plain = step()
    with gs.Profiler("topdown", mode="kernel") as prof:
        profiled = step()
        jax.block_until_ready(profiled)
    same = all(np.array_equal(np.asarray(a), np.asarray(b))
               for a, b in zip(jax.tree_util.tree_leaves(plain), jax.tree_util.tree_leaves(profiled)))
    ds = prof.dataset
    print("jax step:", ds.sizes["range"], "rows;", dict(ds.attrs.get("graph_launches_not_replayed", {})),
          "bit-identical:", same)
    assert ds.attrs.get("graph_launches_replayed", 0) >= 1
    assert ds.sizes["range"] >= ds.attrs["graph_kernel_nodes"] >= 5
    assert same


def _ids_hold_together(runs):
    """Every execution of an execution table recorded now has its graph ids (never -1, unknown), and a kernel has a
    graph id exactly where it has a node id (CUPTI: 0 in both for a kernel launched on its own)."""
    assert (runs["graph_id"] >= 0).all() and (runs["graph_node_id"] >= 0).all()
    assert ((runs["graph_id"] == 0) == (runs["graph_node_id"] == 0)).all()


def _launches_ran_the_same_nodes(graph, launches):
    """*graph*: the executions of one CUDA graph's kernel nodes. Each of its *launches* (one correlation id each)
    ran every kernel node once, the same nodes each time, all of one graph."""
    nodes = graph.groupby("correlation")["graph_node_id"].apply(sorted)
    assert len(nodes) == launches, graph[["kernel", "correlation", "graph_id", "graph_node_id"]]
    first = nodes.iloc[0]
    assert len(first) >= 2 and len(set(first)) == len(first) and all(n == first for n in nodes), nodes
    assert graph["graph_id"].nunique() == 1


def test_pm_and_pc_sampling_name_the_kernels_of_graph_launches_with_their_graph_and_node_ids():
    """A graph's kernels reach no launch callback, but their activity records and PC samples carry their names:
    PM sampling's execution table (kernels=True) and PC sampling's per-kernel stalls hold them, with CUPTI's ids of
    the graph and of the node that ran them; the fill kernels that run() launches on its own have none (0)."""
    run = _captured()
    run(times=1)
    with gs.sample("pm-default", "100us", kernels=True) as pm:
        run(times=20)
    execs = gs.kernel_executions(pm.dataset)
    _ids_hold_together(execs)
    in_graph = execs["kernel"].str.contains("multiply|add")
    graph_kernels = execs[in_graph]
    assert len(graph_kernels) >= 3 * 20, execs["kernel"].value_counts()
    assert (graph_kernels["graph_id"] > 0).all()
    # run()'s fill kernels ran on their own (0); the memset and memcpy nodes may run as kernels of the driver's,
    # then with the graph's id, once per launch each (an H200 run in a fresh process: two such per launch)
    extra = execs[~in_graph & (execs["graph_id"] > 0)]
    assert len(extra) % 20 == 0 and set(extra["graph_id"]) <= set(graph_kernels["graph_id"]), extra
    assert (execs[~in_graph & (execs["graph_id"] == 0)]["graph_node_id"] == 0).all()
    _launches_ran_the_same_nodes(graph_kernels, 20)  # three kernel nodes per launch
    with gs.pc_sample() as pcs:
        run(times=200)
    ds = pcs.dataset
    names = [str(k) for k in ds["kernel"].values]
    assert any("multiply" in k for k in names) and any("add" in k for k in names), names
    if not _pc_graph_ids(pcs, 200):
        return
    assert ds.sizes["graph_node"] == 3 and (ds.node_executions.values == 200).all(), ds.node_executions.values
    assert ds.node_graph_id.values.min() > 0 and len(set(ds.node_graph_id.values.tolist())) == 1
    assert ds.node_id.values.min() > 0
    multiply = [k for k in names if "multiply" in k]
    adds = [k for k in names if "add" in k]
    assert ds.kernel_graph_nodes.sel(kernel=multiply).values.tolist() == [1]  # one node: its samples are that node's
    assert ds.kernel_graph_node_id.sel(kernel=multiply).item() in ds.node_id.values.tolist()
    assert int(ds.kernel_graph_nodes.sel(kernel=adds).sum()) == 2  # the two add nodes (one kernel or two)
    assert (ds.kernel_launches.sel(kernel=multiply + adds) == 0).all()  # no launch call of their own
    assert (ds.kernel_graph_id.sel(kernel=multiply + adds) == ds.node_graph_id.values[0]).all()


def _torch_graph():
    """torch, a captured PyTorch graph (a GEMM, ReLU, an add: several kernel nodes) made without gpuscope watching,
    and its input."""
    torch = pytest.importorskip("torch")
    x = torch.randn(2048, 2048, device="cuda")
    w = torch.randn(2048, 2048, device="cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up before the capture (cuBLAS handle and workspace)
        for _ in range(2):
            torch.relu(x @ w) + 1
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        torch.relu(x @ w) + 1
    torch.cuda.synchronize()
    return torch, g, x


def test_pm_executions_of_a_torch_graph_carry_its_graph_and_node_ids():
    torch, g, x = _torch_graph()
    y = torch.sin(x)  # compiled and loaded before the session
    torch.cuda.synchronize()
    with gs.sample("pm-default", "100us", kernels=True) as pm:
        torch.sin(x, out=y)  # a launch of its own, before the replays
        torch.cuda.synchronize()
        for _ in range(3):
            g.replay()
        torch.cuda.synchronize()
        torch.sin(x, out=y)  # and one after
        torch.cuda.synchronize()
    runs = gs.kernel_executions(pm.dataset)
    print(runs[["kernel", "correlation", "graph_id", "graph_node_id"]].to_string())
    _ids_hold_together(runs)
    graph = runs[runs["graph_id"] > 0]
    _launches_ran_the_same_nodes(graph, 3)
    alone = runs[(runs["start_ns"] < graph["start_ns"].min()) | (runs["start_ns"] > graph["end_ns"].max())]
    assert len(alone) >= 2 and (alone["graph_id"] == 0).all() and (alone["graph_node_id"] == 0).all()
    if hasattr(g, "raw_cuda_graph_exec"):  # PyTorch 2.7 on: which of CUPTI's ids is graphId? (printed, not assumed)
        from gpuscope.cupti.graphs import graph_exec_id

        print("graphId", int(graph["graph_id"].iloc[0]), "cuptiGetGraphExecId",
              graph_exec_id(int(g.raw_cuda_graph_exec())))



def _pc_graph_ids(pcs, launches) -> bool:
    """Whether CUPTI gave the PC-sampling block its kernel activity records (graph and node ids). On the H200 with
    CUPTI 13.0 it refused them beside PC sampling (CUPTI_ERROR_NOT_COMPATIBLE): then every id is -1 (unknown), never
    0 or a made-up node, and the Dataset says why."""
    ds = pcs.dataset
    assert pcs.graph_launches >= launches
    why = ds.attrs["graph_ids_unavailable"]
    if why == "":
        return True
    assert "kernel activity records could not be opened" in why, why
    assert (ds.kernel_graph_id.values == -1).all() and (ds.kernel_graph_node_id.values == -1).all()
    return False

def test_pc_samples_of_a_torch_graph_say_which_node_ran_each_kernel():
    torch, g, x = _torch_graph()
    y = torch.sin(x)
    torch.cuda.synchronize()
    with gs.pc_sample() as pcs:
        for _ in range(50):
            g.replay()
            torch.sin(x, out=y)  # launch calls of their own
        torch.cuda.synchronize()
    ds = pcs.dataset
    print(ds[["kernel_launches", "kernel_graph_nodes", "kernel_graph_id", "kernel_graph_node_id"]].to_dataframe())
    assert pcs.graph_launches == 50
    if not _pc_graph_ids(pcs, 50):
        return
    assert ds.sizes["graph_node"] >= 2 and (ds.node_executions.values == 50).all(), ds.node_executions.values
    graph_id = int(ds.node_graph_id.values[0])
    assert graph_id > 0 and (ds.node_graph_id.values == graph_id).all() and ds.node_id.values.min() > 0
    nodes = ds.kernel_graph_nodes.values
    sampled = ds.kernel.values[nodes > 0]
    assert sampled.size >= 1, "no kernel of the graph was sampled"  # the GEMM at least
    assert (ds.kernel_graph_id.sel(kernel=sampled) == graph_id).all()
    assert (ds.kernel_launches.sel(kernel=sampled) == 0).all()
    one = ds.kernel_graph_node_id.sel(kernel=ds.kernel.values[nodes == 1]).values
    assert set(one.tolist()) <= set(ds.node_id.values.tolist()) and (one > 0).all()
    alone = ds.kernel.values[ds.kernel_launches.values >= 50]  # sin
    assert alone.size == 1, ds.kernel_launches.to_series()
    assert int(ds.kernel_graph_nodes.sel(kernel=alone[0])) == 0 and int(ds.kernel_graph_id.sel(kernel=alone[0])) == 0
    assert int(ds.kernel_graph_node_id.sel(kernel=alone[0])) == 0


def test_jax_steps_give_pm_executions_and_pc_samples_their_graph_and_node_ids():
    """JAX runs its step as CUDA graphs (XLA command buffers): PM executions and PC samples of a step, without
    gpuscope.watch_graphs(), carry CUPTI's graph and node ids."""
    jax, step = _jax_step(watch=False)
    with gs.sample("pm-default", "100us", kernels=True) as pm:
        jax.block_until_ready(step())
    runs = gs.kernel_executions(pm.dataset)
    _ids_hold_together(runs)
    graph = runs[runs["graph_id"] > 0]
    print("jax step:", len(runs), "executions,", len(graph), "in", graph["graph_id"].nunique(), "graphs,",
          graph["correlation"].nunique(), "graph launches")
    assert len(graph) >= 5
    with gs.pc_sample() as pcs:
        for _ in range(5):
            jax.block_until_ready(step())
    ds = pcs.dataset
    print(ds[["kernel_launches", "kernel_graph_nodes", "kernel_graph_id", "kernel_graph_node_id"]].to_dataframe())
    if not _pc_graph_ids(pcs, 5):
        return
    assert ds.sizes["graph_node"] >= 5 and ds.node_graph_id.values.min() > 0 and ds.node_id.values.min() > 0
    assert (ds.kernel_graph_nodes.values > 0).any()
    assert ((ds.kernel_graph_nodes.values > 0) == (ds.kernel_graph_id.values != 0)).all()


def test_gpuscope_run_on_an_unmodified_jax_script_ends_and_profiles_every_kernel_node_of_its_steps(tmp_path):
    """Issue 50: ``gpuscope run`` (auto mode, the default) on an unmodified JAX training script, default XLA flags:
    XLA compiles and autotunes on its own threads while the main thread waits, then runs each step as a CUDA graph.
    The run ends well within its deadline (it once hung for good), and every kernel node of the step's graph has
    rows with the Top-Down."""
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("jax")
    script = Path(__file__).parent / "scripts" / "jax_mlp.py"
    out = tmp_path / "jax.nc"
    done = subprocess.run([sys.executable, "-m", "gpuscope", "run", "--set", "topdown", "-o", out, script, "30"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=240)
    print(done.stdout[-3000:], done.stderr[-3000:])
    assert done.returncode == 0
    ds = gs.open_dataset(out)
    nodes = ds.isel(range=ds["graph_launch"].values >= 0)
    per_node = {int(n) for n in nodes["graph_node"].values}
    print("jax run:", ds.sizes["range"], "rows,", nodes.sizes["range"], "of graph nodes,", len(per_node), "nodes")
    assert len(per_node) >= 20  # the step's graph: 27-30 kernel nodes on the H200 (docs/measurements.md)
    shares = gs.topdown(nodes)
    assert np.isfinite(shares["retire"].values).mean() > 0.95
