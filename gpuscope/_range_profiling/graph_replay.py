"""CUDA graph launches profiled node by node in kernel and auto modes (``graphs="node"``, as ``ncu
--graph-profiling node``), or as one row per graph launch (``graphs="graph"``).

At a graph launch's entry (CUPTI's callback, on the launching thread) the session takes its baton (never waited
for), reads every node's parameters from gpuscope's copy of the graph (:mod:`gpuscope._gpu.graph_nodes`) and hands
the launch an executable graph with no node in place of the program's (``hGraphExec`` in the call's parameters). At
the call's exit, behind that empty graph on the launch's stream, it runs the nodes one by one: each kernel node is a
``cuLaunchKernel`` that the session hears like any launch, and profiles like one (CUPTI kernel replay saves and
restores memory around its passes and leaves the kernel's output, as an eager launch's). So the graph's work is done
once: by its nodes, in a topological order, with the same inputs. Rows get ``graph_exec`` (CUPTI's id of the
executable graph), ``graph_node`` (the kernel node's position in that order) and ``graph_launch`` (which launch of
that executable graph).

A launch is left to run as it is, unprofiled and counted by reason, where this is not safe or not possible: the
graph was instantiated before gpuscope watched (start the session, or ``gpuscope.watch_graphs()``, before the first
step), it holds nodes that cannot be run one by one (host, child-graph, conditional, memory nodes), a change to it
could not be followed, the launch is itself being captured, or another thread's profiled launch is in flight.
"""

from __future__ import annotations

import threading
from collections import Counter

import numpy as np

from gpuscope._range_profiling import launches as _launches

__all__ = ["GRAPH_MODES", "GraphReplay", "combine_graph_rows", "watch_graphs"]

GRAPH_MODES = ("node", "graph")

_REASONS = {
    "unknown": "instantiated before gpuscope watched graphs (start the session, or gpuscope.watch_graphs(), before "
               "the first step)",
    "unsupported": "holding nodes gpuscope cannot run one by one",
    "capturing": "launched inside a stream capture",
    "concurrent": "launched while another thread's profiled launch was in flight",
    "failed": "whose nodes could not be run",
}


class GraphReplay:
    """What a session does at each graph launch (module docstring), and what it counted."""

    def __init__(self, context):
        self.context = context  # () -> the session's CUcontext handle (known once the session has set up)
        self.replayed = 0  # graph launches run node by node
        self.nodes = 0  # kernel nodes launched so
        self.skipped: Counter = Counter()  # graph launches run as they are, by reason
        self.why: dict[str, str] = {}  # reason -> the first detail seen
        self.now = threading.local()  # on the replaying thread: (exec id, launch, node position) of the next launch
        self.errors: list[str] = []  # node runs the driver refused part way (that launch's work is incomplete)

    def current(self):
        """(graph_exec, graph_launch, graph_node) of the kernel node being launched on this thread, or None."""
        return getattr(self.now, "node", None)

    def on_launch(self, params: int, baton):
        """At a graph launch's entry: plan its nodes and give the launch an empty graph. Returns None where the
        launch runs as it is (counted), else the token for :meth:`on_exit`, which runs the nodes. The baton is held
        from here to the nodes' end."""
        from gpuscope._gpu import graph_nodes
        from gpuscope.cupti.graphs import GraphLaunchParams

        p = GraphLaunchParams.from_address(params)
        copy = graph_nodes.copy_of(p.hGraphExec or 0)
        if copy is None:
            return self._skip("unknown", "")
        if copy.unsupported:
            return self._skip("unsupported", copy.unsupported)
        if _launches.capturing(p.hStream or 0):
            return self._skip("capturing", "")
        if not baton.take():
            return self._skip("concurrent", f"behind {baton.what or 'a graph launch'}")
        if baton.depth == 1:
            baton.what = ""
        try:
            steps = graph_nodes.plan(copy, p.hStream or 0)
            empty = int(graph_nodes.empty_exec(self.context()))
        except Exception as exc:  # noqa: BLE001  nothing run: the graph runs as it is
            baton.give()
            return self._skip("failed", f"{type(exc).__name__}: {exc}")
        token = _Run(copy, steps, copy.launches, baton)
        copy.launches += 1
        p.hGraphExec = empty  # the program's launch runs nothing: its nodes run at the call's exit, once
        return token

    def on_exit(self, token) -> None:
        """At the graph launch's exit (the empty graph enqueued): run the nodes behind it on its stream. Not in the
        entry callback: there the driver has not yet taken the launch."""
        from gpuscope._gpu import graph_nodes

        copy = token.copy

        def before_kernel(position):
            self.now.node = (copy.exec_id, token.launch, position)

        try:
            self.nodes += graph_nodes.run(token.steps, before_kernel)
            self.replayed += 1
        except Exception as exc:  # noqa: BLE001  said loudly: this launch's work is incomplete
            self.errors.append(f"graph {copy.exec_id} launch {token.launch}: {type(exc).__name__}: {exc}")
        finally:
            self.now.node = None
            token.baton.give()

    def _skip(self, reason: str, detail: str) -> None:
        self.skipped[reason] += 1
        self.why.setdefault(reason, detail)
        return None

    def notes(self, mode: str) -> dict:
        """Dataset attrs: ``graph_profiling``, ``graph_launches_replayed``, ``graph_kernel_nodes`` and, per reason,
        ``graph_launches_not_replayed`` (reason -> count) with ``graph_not_replayed_why``."""
        notes = {"graph_profiling": mode, "graph_launches_replayed": self.replayed, "graph_kernel_nodes": self.nodes}
        if self.errors:
            notes["graph_replay_errors"] = self.errors[:20]
        from gpuscope._gpu import graph_nodes

        if graph_nodes.errors():  # graphs that could not be copied as they were made: their launches are "unknown"
            notes["graph_copy_errors"] = graph_nodes.errors()[:20]
        if self.skipped:
            notes["graph_launches_not_replayed"] = dict(self.skipped)
            notes["graph_not_replayed_why"] = {k: (_REASONS[k] + (f": {v}" if v else "")) for k, v in self.why.items()}
        return notes

    def message(self) -> str:
        """What the session says of the graph launches it ran as they were ("" where it ran all node by node)."""
        if self.errors:
            return (f"{len(self.errors)} CUDA graph launch(es) could not run all their nodes, so their work is "
                    f"incomplete: {self.errors[0]}")
        if not self.skipped:
            return ""
        parts = [f"{n} {_REASONS[k]}" + (f" ({self.why[k]})" if self.why.get(k) else "") for k, n in
                 self.skipped.items()]
        return "CUDA graph launches not profiled node by node: " + "; ".join(parts) + "."


class _Run:
    """A graph launch whose nodes are to run: its copy, the planned calls, which launch of the graph it is."""

    __slots__ = ("copy", "steps", "launch", "baton")

    def __init__(self, copy, steps, launch, baton):
        self.copy, self.steps, self.launch, self.baton = copy, steps, launch, baton


def watch_graphs(on: bool = True) -> None:
    """Copy the CUDA graphs this process instantiates from now on, for every later session, so that their
    launches can be profiled node by node (``Profiler(mode="kernel"|"auto", graphs=...)``); ``on=False`` stops
    (the copies made are kept) and gives CUPTI's subscriber back once no session needs it.

    A session in kernel, iteration or auto mode watches graphs while it is open, but JAX makes its graphs at the
    first steps (warm-up) and PyTorch at capture: call this before them when the session starts later. It holds
    CUPTI's one callback subscriber for the rest of the process (``torch.profiler`` cannot subscribe afterwards).
    ``gpuscope run`` needs it not: its session is open from the script's start.

    Raises
    ------
    ProfilerBusyError
        Another CUPTI client (torch.profiler) holds CUPTI's callback subscriber.
    """
    from gpuscope._gpu import graph_nodes

    if on:
        graph_nodes.watch(keep=True, strict=True)
    else:
        graph_nodes.unkeep()


def combine_graph_rows(rows: list[dict], metrics: list[str]) -> list[dict]:
    """``graphs="graph"``: the rows of one graph launch's kernel nodes as one row, as ``ncu --graph-profiling graph``
    gives one result per graph: counters added, rates and percentages weighted by each node's
    ``gpu__time_duration.sum``, peaks kept (:mod:`gpuscope.metrics.combine`). Rows of other launches stay."""
    from gpuscope.metrics.combine import DURATION, kind_of

    kinds = [kind_of(m) for m in metrics]
    weight_at = metrics.index(DURATION) if DURATION in metrics else None
    out, groups = [], {}
    for row in rows:
        key = (row.get("graph_exec", -1), row.get("graph_launch", -1))
        if key[1] < 0:
            out.append(row)
            continue
        if key not in groups:
            groups[key] = []
            out.append(key)
        groups[key].append(row)
    combined = []
    for item in out:
        if isinstance(item, dict):
            combined.append(item)
            continue
        members = groups[item]
        values = np.array([r["values"] for r in members], dtype=np.float64)
        w = values[:, weight_at] if weight_at is not None else np.ones(len(members))
        w = np.where(np.isfinite(w), w, 0.0)
        merged = []
        for i, kind in enumerate(kinds):
            column = values[:, i]
            if kind == "count":
                merged.append(float(np.nansum(column)) if np.isfinite(column).any() else float("nan"))
            elif kind == "peak":
                merged.append(float(np.nanmax(column)) if np.isfinite(column).any() else float("nan"))
            else:
                ok = np.isfinite(column) & (w > 0)
                merged.append(float((column[ok] * w[ok]).sum() / w[ok].sum()) if ok.any() else float("nan"))
        first, last = members[0], members[-1]
        exec_id, launch = item
        name = f"graph {exec_id}"
        parent = first.get("parent", "")
        row = {"name": f"{parent}/{name}" if parent else name, "depth": first.get("depth", 1), "parent": parent,
               "kernel": name, "kernel_qualname": f"CUDA graph {exec_id} ({len(members)} kernel nodes)",
               "symbol": "", "launch": first["launch"], "start_ns": first["start_ns"], "end_ns": last["end_ns"],
               "pass_group": first.get("pass_group", 0), "first_iteration": first.get("first_iteration", 0),
               "iterations": first.get("iterations", 1), "values": merged, "graph_exec": exec_id,
               "graph_launch": launch, "graph_nodes": len(members)}
        if "replay" in first:
            row["replay"] = first["replay"]
        combined.append(row)
    return combined
