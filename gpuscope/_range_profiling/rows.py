"""A collected range's values, through the session's pass plan, and a profiled launch's row.

CUPTI evaluates the counters a pass plan collects (:mod:`gpuscope._gpu.pass_plan`); the plan computes the requested
metrics back from them. A launch's row holds its kernel, grid and block, times, pass group and iterations, and what
the launch asks of an SM (registers and static shared memory asked of the driver once per function and session,
:mod:`gpuscope._gpu.functions`). :class:`LaunchRows` is a mixin of
:class:`gpuscope._range_profiling.modes.PerLaunchModes`; user mode evaluates its ranges with :func:`evaluate_range`
too.
"""

from __future__ import annotations

from gpuscope._range_profiling.mode import Mode

__all__ = ["LaunchRows", "evaluate_range", "evaluate_raw", "values_of"]


def evaluate_range(owner, image, index: int):
    """The values of ``owner.metrics`` for range *index* of a decoded counter-data image, through the session's
    pass plan where it has one (:mod:`gpuscope._gpu.pass_plan`)."""
    return values_of(owner, evaluate_raw(owner, image, index))


def evaluate_raw(owner, image, index: int):
    """What CUPTI evaluates for range *index*: the pass plan's collected metrics, or ``owner.metrics`` without one.
    After an incomplete pass group, the metrics of the passes that did not run are NaN."""
    plan = getattr(owner, "_plan", None)
    return owner._host.evaluate(image, index, owner.metrics if plan is None else plan.collected)


def values_of(owner, raw):
    """``owner.metrics`` from :func:`evaluate_raw`'s values."""
    plan = getattr(owner, "_plan", None)
    return raw if plan is None else plan.values(raw)


class LaunchRows:
    """The rows of profiled launches (a mixin of :class:`gpuscope.Profiler`: it uses the session's state)."""

    _function_resources = None  # registers and static shared memory per kernel function (see _functions)

    def _launch_row(self, launch, index: int, values, group: int, first_iteration: int, iterations: int,
                    replay: str, borrowed: int = 0) -> dict:
        parent = launch.parent
        name = f"{parent}/{launch.kernel}" if parent else launch.kernel
        row = {"name": name, "depth": name.count("/") + 1, "parent": parent, "kernel": launch.kernel,
               "kernel_qualname": launch.qualname, "symbol": launch.symbol, "launch": index, "grid": launch.grid,
               "block": launch.block, "start_ns": launch.enter_ns, "end_ns": launch.exit_ns, "pass_group": group,
               "first_iteration": first_iteration, "iterations": iterations, "values": values}
        if replay == "iteration":  # passes taken from the same launch of the group before (an incomplete last group)
            row["passes_from_earlier_group"] = borrowed
        # the function's registers and static shared memory, asked of the driver once per function and session;
        # the dynamic shared memory is the launch call's (gpuscope._schema.dataset.RESOURCE_COORDS)
        registers, static = _functions(self)(launch.function)
        row.update(registers_per_thread=registers, shared_memory_static=static,
                   shared_memory_dynamic=launch.shared_dynamic)
        if self.mode is Mode.AUTO:  # rows of both replays may meet in one auto session: say which made each
            row["replay"] = replay
        if launch.graph_launch >= 0:  # a CUDA graph's kernel node (graph_replay)
            row.update(graph_exec=launch.graph_exec, graph_launch=launch.graph_launch, graph_node=launch.graph_node)
        return row

    def _launch_ids(self, reference, first_row: int) -> None:
        """Found iterations: the rows from *first_row* on (made with their position in the iteration as ``launch``)
        get their launch's ID in the session, that of *reference*'s launch (the group's first pass) there."""
        if self._tracker is not None:
            for row in self._rows[first_row:]:
                row["launch"] = reference[row["launch"]].launch_id


def _functions(session):
    """The session's :class:`gpuscope._gpu.functions.FunctionResources`: each kernel function's registers and static
    shared memory, asked of the driver at the first row of a launch of it (made on first use, kept on the session)."""
    functions = getattr(session, "_function_resources", None)
    if functions is None:
        from gpuscope._gpu.functions import FunctionResources

        functions = session._function_resources = FunctionResources()
    return functions
