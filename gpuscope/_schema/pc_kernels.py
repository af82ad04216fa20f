"""How each kernel of PC samples ran in the block: launch calls and CUDA graph kernel nodes.

PC records name a function, never a launch or a graph node (``correlationId`` is 0 in continuous mode), so PC
samples say per kernel which graph nodes ran it (:data:`KERNEL_LAUNCH_COORDS`, along ``kernel``), and list those
nodes along the dim ``graph_node`` (:data:`GRAPH_NODE_COORDS`), from CUPTI's kernel activity records
(:func:`gpuscope._results.build.pc_sampling_dataset` builds them). Throughout, 0 means "no graph node" (CUPTI's own
value for a kernel launched on its own) and -1 "unknown" (or, for an id, "not one").
"""

from __future__ import annotations

__all__ = ["KERNEL_LAUNCH_COORDS", "GRAPH_NODE_COORDS"]

#: Coords along ``kernel``: name -> description (int64 each; -1, :data:`gpuscope._schema.dataset.UNKNOWN_GRAPH`,
#: where not known: launches not counted, activity records not read; for an id also where it is not one).
KERNEL_LAUNCH_COORDS = {
    "kernel_launches": "launch calls of the kernel in the block (a CUDA graph's kernel nodes are none), -1 where "
                       "they were not counted",
    "kernel_graph_nodes": "CUDA graph kernel nodes that ran the kernel in the block (dim graph_node), 0 where none "
                          "did, -1 where unknown",
    "kernel_graph_id": "CUPTI's id of the graph whose nodes ran the kernel, 0 where no graph node did, -1 where "
                       "several graphs did or unknown",
    "kernel_graph_node_id": "CUPTI's id of the one graph kernel node that ran the kernel (all its samples are that "
                            "node's when kernel_launches is 0), 0 where none did, -1 where several did (PC samples "
                            "carry no node: they cannot be split among them) or unknown",
}

#: Coords along ``graph_node`` (one row per graph kernel node that ran in the block, in the order they first ran;
#: present where one did): name -> (key of :func:`gpuscope._pc_sampling.records.graph_nodes`' table, attrs).
#: ``node_kernel`` (str) names the node's kernel as the ``kernel`` dim does; the others are int64.
GRAPH_NODE_COORDS = {
    "node_graph_id": ("graph_id", {"description": "CUPTI's id of the CUDA graph (graphId of the kernel's activity "
                                                  "records)"}),
    "node_id": ("node_id", {"description": "CUPTI's id of the graph's kernel node (graphNodeId)"}),
    "node_executions": ("executions", {"description": "executions of the node in the block"}),
    "node_gpu_ns": ("gpu_ns", {"units": "ns", "description": "GPU time of those executions"}),
}
