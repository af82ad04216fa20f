"""PC samples of CUDA graph kernels without a GPU: the graph and node ids of each sampled kernel, from kernel activity
records built with the ctypes layout of CUpti_ActivityKernel (tests/unit/test_activity_records.py) and read by the
same parser, through a block whose CUPTI calls are replaced. PC records carry no node, and in continuous mode no
launch either (the recorded H100 fixture: every correlationId 0), so a kernel's samples belong to a graph node only
where one node ran that kernel."""

import ctypes
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import gpuscope as gs
from gpuscope._pc_sampling import records as _pcrecords
from gpuscope._pc_sampling import sampler as P
from gpuscope._pc_sampling import source as _source
from gpuscope.cupti import activity
from gpuscope.cupti import pc_sampling as C
from gpuscope.cupti.pc_sampling import PCRecords
from tests.unit.test_activity_records import FakeActivity, Kernel, _record
from tests.unit.test_pc_sampling import _Buffer, _Context

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "pc"
PREFIX = _pcrecords.CUPTI_PREFIX
NAMES = [PREFIX + "long_scoreboard", PREFIX + "selected"]
INDICES = np.array([14, 39], dtype=np.uint32)
#: the kernels of the block: launched on their own, one node of a graph, two nodes of one graph, nodes of two graphs
PLAIN, ONE, TWO, SHARED = "_Z5plainPf", "one_node", "two_nodes", "two_graphs"

_names: dict[str, ctypes.Array] = {}  # the names the records point to, alive for the whole module


def _kernel(symbol, start, correlation, graph=0, node=0, device=0):
    """The bytes of one CUpti_ActivityKernel record, as CUPTI fills its buffer."""
    name = _names.setdefault(symbol, ctypes.create_string_buffer(symbol.encode()))
    return _record(kind=activity.CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL, start=start, end=start + 100,
                   deviceId=device, correlationId=correlation, name=ctypes.addressof(name), graphId=graph,
                   graphNodeId=node)


def _parsed(raw: list[bytes]):
    size = ctypes.sizeof(Kernel)
    return activity.parse_kernel_records(b"".join(raw), [i * size for i in range(len(raw))])


#: Two launches (correlation ids 200, 201) of graph 3 (nodes 40, 41, 42) and one of graph 4 (node 50), and a plain
#: launch (7) between them.
RECORDS = [
    _kernel(ONE, 1000, 200, 3, 40), _kernel(TWO, 1200, 200, 3, 41), _kernel(TWO, 1400, 200, 3, 42),
    _kernel(SHARED, 1600, 200, 3, 43),
    _kernel(PLAIN, 2000, 7),
    _kernel(ONE, 3000, 201, 3, 40), _kernel(TWO, 3200, 201, 3, 41), _kernel(TWO, 3400, 201, 3, 42),
    _kernel(SHARED, 3600, 201, 3, 43),
    _kernel(SHARED, 4000, 202, 4, 50),
]


def test_graph_nodes_are_one_row_per_node_in_the_order_they_first_ran():
    nodes = _pcrecords.graph_nodes(_parsed(RECORDS))
    assert nodes == {"symbol": [ONE, TWO, TWO, SHARED, SHARED], "graph_id": [3, 3, 3, 3, 4],
                     "node_id": [40, 41, 42, 43, 50], "executions": [2, 2, 2, 2, 1],
                     "gpu_ns": [200, 200, 200, 200, 100]}
    assert _pcrecords.graph_nodes(_parsed([_kernel(PLAIN, 1, 7)])) == {  # launched on its own: no node
        "symbol": [], "graph_id": [], "node_id": [], "executions": [], "gpu_ns": []}


def _pc_records():
    """Samples of the four kernels (one PC each): continuous mode, every correlation id 0."""
    functions = [PLAIN, ONE, TWO, SHARED]
    return PCRecords(
        cubin_crc=np.full(8, 5, dtype=np.uint64), pc_offset=np.repeat(np.arange(4, dtype=np.uint64) * 16, 2),
        function_index=np.zeros(8, np.uint32), correlation_id=np.zeros(8, np.uint32),
        stall_reason_index=np.tile(INDICES, 4), samples=np.array([5, 1, 6, 2, 7, 3, 8, 4], dtype=np.uint32),
        function=np.repeat(functions, 2), total_samples=36, dropped_samples=0)


def _dataset(launches, nodes):
    smap = _source.SourceMap(_source.CubinRegistry(crc=lambda b: 5), lookup=lambda c, f, o: (0, "", ""))
    return _pcrecords.records_dataset(_pc_records(), INDICES, NAMES, smap, chip="GH100", launches=launches,
                                      nodes=nodes)


def test_each_kernel_says_which_graph_node_ran_it(tmp_path):
    ds = _dataset({PLAIN: 3, "_Z5otherv": 1}, _pcrecords.graph_nodes(_parsed(RECORDS)))
    columns = ("kernel_launches", "kernel_graph_nodes", "kernel_graph_id", "kernel_graph_node_id")
    table = {str(k): tuple(int(ds[c].sel(kernel=k)) for c in columns) for k in ds.kernel.values}
    assert table == {
        "plain": (3, 0, 0, 0),  # launched on its own: 0, CUPTI's "no graph"
        ONE: (0, 1, 3, 40),  # one node ran it: its samples are that node's
        TWO: (0, 2, 3, -1),  # two nodes of graph 3: the samples cannot be split among them
        SHARED: (0, 2, -1, -1),  # nodes of graphs 3 and 4
    }
    assert ds.sizes["graph_node"] == 5
    assert ds.node_kernel.values.tolist() == [ONE, TWO, TWO, SHARED, SHARED]  # as the kernel dim names them
    assert ds.node_graph_id.values.tolist() == [3, 3, 3, 3, 4] and ds.node_id.values.tolist() == [40, 41, 42, 43, 50]
    assert ds.node_executions.values.tolist() == [2, 2, 2, 2, 1] and ds.node_gpu_ns.attrs["units"] == "ns"
    assert ds.kernel_samples.sel(kernel=ONE).values.tolist() == [6, 2]  # the stalls of node 40
    gs.save_dataset(ds, tmp_path / "pc.nc")
    xr.testing.assert_identical(gs.open_dataset(tmp_path / "pc.nc"), ds)


def test_without_launch_counts_or_graph_records_the_kernels_say_unknown():
    ds = _dataset(None, None)
    for name in ("kernel_launches", "kernel_graph_nodes", "kernel_graph_id", "kernel_graph_node_id"):
        assert ds[name].values.tolist() == [-1] * 4, name
    assert "graph_node" not in ds.dims
    none = _dataset({PLAIN: 2}, _pcrecords.graph_nodes([]))  # no graph launch in the block
    assert none.kernel_graph_nodes.values.tolist() == [0] * 4 and none.kernel_graph_node_id.values.tolist() == [0] * 4
    assert none.kernel_launches.sel(kernel=["plain", ONE]).values.tolist() == [2, 0] and "graph_node" not in none.dims


def test_the_recorded_fixture_has_no_launch_in_its_pc_records():
    """The H100 recording (continuous mode): CUPTI's correlationId is 0 in every PC record, as cupti_pcsampling.h
    says, so PC records alone tie no sample to a launch or a node; built without the block's launch counts and
    activity records, every kernel's graph ids are unknown (-1), never 0."""
    data = np.load(FIXTURE / "pc_records.npz")
    assert data["correlation_id"].size > 0 and not data["correlation_id"].any()
    registry = _source.CubinRegistry()
    for name in ("stream0.cubin", "fma0.cubin"):
        registry.add(str(FIXTURE / name))
    ds = _pcrecords.records_dataset(PCRecords.from_dict(data), data["reason_indices"],
                                    [str(n) for n in data["reason_names"]], _source.SourceMap(registry), chip="GH100")
    assert sorted(ds.kernel.values.tolist()) == ["fma", "stream"]
    assert (ds.kernel_graph_id.values == -1).all() and (ds.kernel_graph_node_id.values == -1).all()


# ---------------------------------------------------------------------------------------------------------
# a block: activity records opened at its first graph launch


class _Recorder:
    """The block's launch recorder, as CUPTI's callbacks leave it after two graph launches."""

    def __init__(self):
        self.graph_correlations: set[int] = set()
        self.graph_launches = 0

    def launch_graph(self, sampler, correlation):
        self.graph_launches += 1
        self.graph_correlations.add(correlation)
        sampler._on_graph(correlation, 0)

    def close(self):
        pass


def _block(monkeypatch, fake):
    """A PC block in the middle of its run, with CUPTI's calls replaced: *fake* stands for CUPTI's activity API."""
    monkeypatch.setattr(activity, "_f", fake)
    monkeypatch.setattr(activity, "_registered", [])
    monkeypatch.setattr(P, "_synchronize", lambda ctx: None)
    monkeypatch.setattr(P, "_get_data", lambda ctx, buf: PCRecords.empty())
    monkeypatch.setattr(P.PCSampler, "_settle", lambda self: None)
    monkeypatch.setattr(C, "disable", lambda ctx: None)
    monkeypatch.setattr(C, "return_buffer", lambda buf: None)
    sampler = P.PCSampler(period=1024, drain_interval=None)
    sampler._state, sampler._context, sampler._buffer = "sampling", _Context(), _Buffer(_pc_records())
    sampler.reason_indices, sampler.reason_names, sampler.device_info = INDICES, NAMES, None
    sampler._recorder, sampler.launches = _Recorder(), {PLAIN: 1}
    return sampler


def test_a_block_reads_the_graph_and_node_ids_of_the_kernels_of_its_graph_launches(monkeypatch):
    other_device = _kernel(ONE, 5000, 201, 9, 90, device=1)
    fake = FakeActivity(RECORDS[:4] + RECORDS[5:9] + [RECORDS[4], other_device])
    sampler = _block(monkeypatch, fake)
    recorder = sampler._recorder
    assert fake.enabled == []  # nothing opened before a graph launch
    recorder.launch_graph(sampler, 200)
    assert fake.enabled == [activity.CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL]
    recorder.launch_graph(sampler, 201)  # opened once
    sampler.close()
    assert fake.enabled == [] and activity._sinks == ()  # flushed and closed with the block
    ds = sampler.dataset
    assert ds.attrs["graph_launches"] == 2 and ds.attrs["graph_ids_unavailable"] == ""
    # the plain launch's record is not kept (correlation 7), nor the other device's
    assert ds.node_graph_id.values.tolist() == [3, 3, 3, 3] and ds.node_executions.values.tolist() == [2] * 4
    assert int(ds.kernel_graph_node_id.sel(kernel=ONE)) == 40 and int(ds.kernel_graph_id.sel(kernel=ONE)) == 3
    assert int(ds.kernel_graph_nodes.sel(kernel="plain")) == 0 and int(ds.kernel_launches.sel(kernel="plain")) == 1


def test_a_block_whose_activity_records_are_refused_says_why_and_leaves_the_ids_unknown(monkeypatch):
    fake = FakeActivity(RECORDS)

    def refuse(kind):
        raise RuntimeError("CUPTI_ERROR_NOT_COMPATIBLE")

    fake.cuptiActivityEnable = refuse
    sampler = _block(monkeypatch, fake)
    sampler._recorder.launch_graph(sampler, 200)
    sampler.close()
    ds = sampler.dataset
    assert "NOT_COMPATIBLE" in ds.attrs["graph_ids_unavailable"] and "graph_node" not in ds.dims
    assert (ds.kernel_graph_nodes.values == -1).all() and (ds.kernel_graph_id.values == -1).all()
    assert int(ds.kernel_launches.sel(kernel="plain")) == 1  # the launch count stands


def test_a_block_without_graph_launches_opens_no_activity_records(monkeypatch):
    fake = FakeActivity(RECORDS)
    sampler = _block(monkeypatch, fake)
    sampler.close()
    ds = sampler.dataset
    assert fake.enabled == [] and fake.registered == 0  # CUPTI's activity API never touched
    assert ds.attrs["graph_launches"] == 0 and ds.attrs["graph_ids_unavailable"] == ""
    assert (ds.kernel_graph_nodes.values == 0).all() and (ds.kernel_graph_id.values == 0).all()
