"""Graph launches run node by node (graph_replay): when a launch runs as it is, and graph rows combined per launch
(pure logic; the node runs themselves are GPU tests, tests/gpu/test_graphs.py)."""

import ctypes

import numpy as np
import pytest

from gpuscope._gpu import graph_nodes
from gpuscope._range_profiling import graph_replay, launches
from gpuscope._range_profiling.graph_replay import GraphReplay, combine_graph_rows
from gpuscope._range_profiling.launches import Baton
from gpuscope.cupti.graphs import GraphLaunchParams

METRICS = ["gpu__time_duration.sum", "smsp__inst_executed.sum", "sm__throughput.avg.pct_of_peak_sustained_elapsed"]


def _row(launch, node, duration, inst, pct, exec_id=4):
    return {"name": f"k{node}", "parent": "", "depth": 1, "launch": 10 * launch + node, "start_ns": node,
            "end_ns": node + 1, "values": [duration, inst, pct], "graph_exec": exec_id, "graph_launch": launch,
            "graph_node": node}


def test_graph_rows_add_counts_and_weight_rates_by_duration():
    rows = [{"name": "eager", "values": [5.0, 1.0, 50.0]}, _row(0, 0, 1.0, 10.0, 20.0), _row(0, 1, 3.0, 30.0, 60.0),
            _row(1, 0, 2.0, 10.0, 40.0)]
    out = combine_graph_rows(rows, METRICS)
    assert [r["name"] for r in out] == ["eager", "graph 4", "graph 4"]
    assert out[1]["values"] == [4.0, 40.0, pytest.approx((20 * 1 + 60 * 3) / 4)]
    assert out[1]["graph_nodes"] == 2 and out[2]["graph_nodes"] == 1 and out[2]["graph_launch"] == 1
    assert out[1]["start_ns"] == 0 and out[1]["end_ns"] == 2


def _launch_params():
    p = GraphLaunchParams(0xE1, 0x5)
    return p, ctypes.addressof(p)


def test_a_graph_gpuscope_did_not_see_made_runs_as_it_is(monkeypatch):
    monkeypatch.setattr(graph_nodes, "copy_of", lambda handle: None)
    replay = GraphReplay(lambda: 1)
    p, address = _launch_params()
    assert replay.on_launch(address, Baton()) is None
    assert p.hGraphExec == 0xE1 and replay.skipped["unknown"] == 1
    assert "watch_graphs" in replay.message() and replay.notes("node")["graph_launches_not_replayed"] == {"unknown": 1}


def test_a_graph_is_run_node_by_node_at_its_exit_and_its_launch_given_an_empty_graph(monkeypatch):
    copy = graph_nodes.GraphCopy(0xE1, object(), exec_id=7)
    seen = []

    def run(steps, before_kernel):
        for position in steps:
            before_kernel(position)
            seen.append(replay.current())
        return len(steps)

    monkeypatch.setattr(graph_nodes, "copy_of", lambda handle: copy if handle == 0xE1 else None)
    monkeypatch.setattr(graph_nodes, "plan", lambda c, stream: [0, 1, 2])
    monkeypatch.setattr(graph_nodes, "run", run)
    monkeypatch.setattr(graph_nodes, "empty_exec", lambda context: 0xEEEE)
    monkeypatch.setattr(launches, "capturing", lambda stream: False)
    replay = GraphReplay(lambda: 1)
    baton = Baton()
    for launch in range(2):
        p, address = _launch_params()
        token = replay.on_launch(address, baton)
        assert p.hGraphExec == 0xEEEE and baton.held and seen == [(7, 0, 0), (7, 0, 1), (7, 0, 2)][:3 * launch]
        replay.on_exit(token)  # the empty graph enqueued: the nodes run behind it
    assert seen == [(7, 0, 0), (7, 0, 1), (7, 0, 2), (7, 1, 0), (7, 1, 1), (7, 1, 2)]
    assert replay.current() is None and not baton.held and replay.nodes == 6 and replay.replayed == 2


def test_a_node_the_driver_refuses_part_way_is_said_loudly(monkeypatch):
    copy = graph_nodes.GraphCopy(0xE1, object(), exec_id=7)

    def run(steps, before_kernel):
        raise RuntimeError("CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES")

    monkeypatch.setattr(graph_nodes, "copy_of", lambda handle: copy)
    monkeypatch.setattr(graph_nodes, "plan", lambda c, stream: [0])
    monkeypatch.setattr(graph_nodes, "run", run)
    monkeypatch.setattr(graph_nodes, "empty_exec", lambda context: 0xEEEE)
    monkeypatch.setattr(launches, "capturing", lambda stream: False)
    replay, baton = GraphReplay(lambda: 1), Baton()
    replay.on_exit(replay.on_launch(_launch_params()[1], baton))
    assert not baton.held and "incomplete" in replay.message()
    assert replay.notes("node")["graph_replay_errors"] == ["graph 7 launch 0: RuntimeError: "
                                                            "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"]


@pytest.mark.parametrize("why", ["unsupported", "capturing", "concurrent", "failed"])
def test_each_reason_to_run_a_graph_as_it_is_is_counted(monkeypatch, why):
    import threading

    copy = graph_nodes.GraphCopy(0xE1, object(), unsupported="it holds a host node" if why == "unsupported" else "")

    def plan(*args):
        raise RuntimeError("CUDA_ERROR_INVALID_VALUE")

    monkeypatch.setattr(graph_nodes, "copy_of", lambda handle: copy)
    monkeypatch.setattr(graph_nodes, "plan", plan)
    monkeypatch.setattr(launches, "capturing", lambda stream: why == "capturing")
    baton = Baton()
    if why == "concurrent":
        holder = threading.Thread(target=baton.take)
        holder.start()
        holder.join()
    replay = GraphReplay(lambda: 1)
    p, address = _launch_params()
    assert replay.on_launch(address, baton) is None
    assert p.hGraphExec == 0xE1 and replay.skipped == {why: 1}
    assert why != "concurrent" or baton.held  # not this thread's to give back
    assert np.all([k in graph_replay._REASONS for k in replay.notes("node")["graph_not_replayed_why"]])


@pytest.fixture
def fake_cupti(monkeypatch):
    from gpuscope.cupti import subscriber

    from tests.unit.test_subscriber import FakeCupti

    cupti = FakeCupti()
    monkeypatch.setattr(subscriber, "_f", cupti)
    for name, value in (("_subscription", []), ("_listening", ()), ("_module_watchers", ()), ("_open", set()),
                        ("_nvtx_watchers", ()), ("_holds", 0), ("_graph_watchers", ()), ("_graph_driver", frozenset()),
                        ("_graph_cbids", ((), ()))):
        monkeypatch.setattr(subscriber, name, value)
    return cupti


def test_the_graph_watcher_hears_graphs_made_and_changed_and_gives_the_subscriber_back(fake_cupti, monkeypatch):
    from gpuscope.cupti import callbacks, subscriber
    from gpuscope.cupti import graphs as cg

    monkeypatch.setattr(cg, "callback_ids", lambda names: {"cuGraphExecKernelNodeSetParams_v2": 692,
                                                           "cuGraphExecUpdate": 561})
    heard = []
    watcher = cg.GraphWatcher(lambda e, g: heard.append(("created", e, g)), lambda e: heard.append(("gone", e)),
                              lambda name, params: heard.append((name, params)))
    assert {(3, 18), (3, 19), (1, 692), (1, 561)} <= fake_cupti.enabled
    graph = cg.GraphData(graph=0x6A, graphExec=0xE1)
    resource = cg._ResourceData(resourceDescriptor=ctypes.addressof(graph))
    subscriber._dispatch(None, callbacks.CUPTI_CB_DOMAIN_RESOURCE, 18, ctypes.addressof(resource))
    subscriber._dispatch(None, callbacks.CUPTI_CB_DOMAIN_RESOURCE, 19, ctypes.addressof(resource))
    params, status = cg.ExecNodeParams(0xE1, 0xA0, 0x1234), ctypes.c_int(0)
    data = callbacks.CUpti_CallbackData(callbackSite=callbacks.CUPTI_API_EXIT, functionParams=ctypes.addressof(params),
                                        functionReturnValue=ctypes.addressof(status))
    subscriber._dispatch(None, callbacks.CUPTI_CB_DOMAIN_DRIVER_API, 692, ctypes.addressof(data))
    status.value = 1  # a call the driver refused changed nothing
    subscriber._dispatch(None, callbacks.CUPTI_CB_DOMAIN_DRIVER_API, 692, ctypes.addressof(data))
    data.callbackSite = callbacks.CUPTI_API_ENTER  # nor does a call's entry
    status.value = 0
    subscriber._dispatch(None, callbacks.CUPTI_CB_DOMAIN_DRIVER_API, 692, ctypes.addressof(data))
    assert heard == [("created", 0xE1, 0x6A), ("gone", 0xE1),
                     ("cuGraphExecKernelNodeSetParams_v2", ctypes.addressof(params))]
    watcher.close()
    assert not fake_cupti.enabled and subscriber._subscription == []  # nothing else held it
