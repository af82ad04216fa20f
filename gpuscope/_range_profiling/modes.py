"""Per-launch collection in a session: kernel, iteration and auto modes (:class:`PerLaunchModes`).

The part of :class:`gpuscope.Profiler` that runs at kernel launches (CUPTI's launch callbacks): the mode chosen at
the first launch or top-level range, kernel replay started, iterations marked by a top-level range or by
``Profiler.step()`` and their boundaries, what the session says of the launches it selected. It mixes in the rest:
what happens at a launch call's entry and exit, never blocking (:mod:`gpuscope._range_profiling.entry`); iterations
found in the launch stream in auto mode (:mod:`gpuscope._range_profiling.found_iterations`); a pass group's end and
the completion of the last one (:mod:`gpuscope._range_profiling.pass_groups`); kernel mode's images and replay cost
(:mod:`gpuscope._range_profiling.kernel_images`); the launches' rows (:mod:`gpuscope._range_profiling.rows`). What
each launch becomes is :mod:`gpuscope._range_profiling.launches`'; the session's lifecycle is
:mod:`gpuscope._range_profiling.session`'s, whose ``Profiler`` mixes this class in; user ranges and user replay are
:mod:`gpuscope._range_profiling.user`'s.
"""

from __future__ import annotations

from gpuscope._range_profiling import ranges as _ranges
from gpuscope._range_profiling.entry import LaunchEntry, _readable, _warn  # noqa: F401 (_readable: session's too)
from gpuscope._range_profiling.found_iterations import FoundIterations
from gpuscope._range_profiling.kernel_images import KernelImages
from gpuscope._range_profiling.mode import Mode
from gpuscope._range_profiling.pass_groups import PassGroups, _capacity  # noqa: F401 (_capacity: session's too)
from gpuscope._range_profiling.rows import LaunchRows, evaluate_range  # noqa: F401 (evaluate_range: user mode's)
from gpuscope.errors import SessionConflictError

__all__ = ["Mode", "PerLaunchModes"]


class PerLaunchModes(FoundIterations, PassGroups, KernelImages, LaunchRows, LaunchEntry):
    """Kernel, iteration and auto modes of :class:`gpuscope.Profiler` (a mixin: it uses the session's state); what
    happens at a launch call's entry and exit is :class:`LaunchEntry`'s."""

    _graphs = None  # the kernels of CUDA graph launches (graphs.GraphKernels)
    graphs = "node"  # graphs="node" | "graph"

    def _use_kernel(self) -> None:
        from gpuscope._range_profiling import launches as _launches
        from gpuscope.cupti._types import ProfilerRange, ReplayMode
        from gpuscope.cupti.activity import timestamp

        self.mode_used = Mode.KERNEL
        if self._first_thread is None:  # else that thread configures it (the collector gets its rp once it ended)
            self._configure(ProfilerRange.AUTO, ReplayMode.KERNEL, self.max_ranges)
        self._collector = _launches.KernelReplay(self._rp, self._context.handle, self.filter, _readable,
                                                 self._annotate, timestamp,
                                                 capacity=0 if self._fixed_ranges else self.max_ranges,
                                                 on_full=self._flush_kernels, names=self._kernel_names())
        if self._first_began:  # started beside the code (first_start_beside): this pass is kernel replay's first
            self._first_taken = True
        else:
            self._start_first()
        self._collector.rp = self._rp  # a new one where the kept one was refused
        self._running = self._collector.running = True

    def _use_iteration(self) -> None:
        from gpuscope.cupti._types import ProfilerRange, ReplayMode

        self._stop_first_untaken()  # auto mode leaving kernel replay before its first launch
        self.mode_used = Mode.ITERATION
        self.cycles = self.passes
        if not self._size_from_first:
            self._configure(ProfilerRange.AUTO, ReplayMode.USER, self.max_ranges)
        self._collector = self._iteration_replay()

    def _iteration_replay(self):
        from gpuscope._range_profiling import launches as _launches
        from gpuscope.cupti.activity import timestamp

        return _launches.IterationReplay(self._rp, self._context.handle, self.filter, _readable, self._annotate,
                                         timestamp, self._kernel_names())

    def _kernel_names(self):
        """The process's table of kernel names (:func:`gpuscope._schema.names.kernel_names`), for all the
        session's collectors: a kernel keeps its name across them, and in every other Dataset of the process."""
        from gpuscope._schema.names import kernel_names

        return kernel_names()

    def _stop_kernel_pass(self) -> None:
        """Kernel mode: end the pass before collecting (it is stopped already while left-out launches run)."""
        if self._running and not self._collector.paused:
            self._rp.stop()
        self._running = self._collector.running = False

    def _enter_held(self, launch):
        collector = self._collector
        if collector is None:  # auto, undecided: a launch outside every range starts kernel replay
            if launch.context != self._context.handle or _ranges.current_path() is not None:
                return None
            self._use_kernel()
            if (self.mode is Mode.AUTO and not (self.filter.launch_skip or self.filter.launch_count)
                    and "repetition_error" not in self._notes):
                from gpuscope._range_profiling.coverage import Coverage
                from gpuscope._range_profiling.repetition import Tracker

                self._tracker = Tracker()  # ... until the launch stream shows a loop, or a top-level range comes
                self._coverage = Coverage()
                # the loop is found on signatures: meanwhile each is replayed once, not each launch
                self._collector.once, self._collector.repeats = set(), self._coverage.counts["searching"]
            collector = self._collector
        if self._tracker is not None and launch.context == self._context.handle:
            return self._follow(launch)
        return collector.on_enter(launch)

    def _report_selection(self) -> None:
        tracker = self._tracker
        if tracker is not None:
            self._notes.setdefault("iterations_found_by", "none")
            self._notes.update(repetition_extras_inside=tracker.extras_inside, repetition_restarts=tracker.restarts,
                               repetition_relocks=tracker.relocks, repetition_losses=tracker.losses)
        if self._coverage is not None:  # auto mode followed the launch stream: what it left unprofiled, and why
            from gpuscope._schema.names import short_name

            def wanted(symbol):  # launches the name filters leave out are theirs, not auto mode's
                return self.filter.name_matches(short_name(_readable(symbol)), symbol, _readable(symbol))

            no_loop = (tracker is not None and not tracker.locked and self.mode_used is Mode.KERNEL
                       and tracker.launches >= 30)
            attrs, message = self._coverage.summary(self._rows, lambda s: self._kernel_names().name(_readable(s)),
                                                    tracker.launches if tracker is not None else None, no_loop,
                                                    wanted if self.filter.active else None, self._first_loop)
            self._notes.update(attrs)
            if message:
                _warn(message)
        self._note_unsafe()
        c = self._collector
        if c is None:
            return
        self._notes.update(launches_left_out=c.left_out, launches_other_contexts=c.other_context)
        if self.filter.active and not any(r.get("launch", -1) >= 0 for r in self._rows) and c.left_out:
            _warn(f"No launch matched the kernel filters ({self.filter.describe()}); {c.left_out} launch(es) ran "
                  "unprofiled. Kernel names are shown by gpuscope.Profiler(mode='kernel') without filters, or "
                  "use 'regex:<pattern>'.")
        errors = getattr(c, "errors", None)
        if errors:
            _warn(f"{len(errors)} launch(es) could not be left out cleanly: {errors[0]}")

    # -- per-launch modes: kernel and iteration ---------------------------------------------------------
    def _annotate(self):
        """For the launch about to happen on this thread: (parent range path, decorated kernel name or None)."""
        name = getattr(self._pending, "kernel", None)
        self._pending.kernel = None
        return (_ranges.current_path() or "", name)

    def _iteration_push(self, path: str) -> None:
        if self._tracker is not None and self.mode_used is Mode.KERNEL:  # setup launches came first
            self._leave_kernel_phase()
        if self.mode_used is Mode.AUTO:
            self._use_iteration()
        if self.mode_used is not Mode.ITERATION or self._steps or self._tracker is not None:
            return
        if self._iter_path is None:
            self._iter_path = path
        if path == self._iter_path:
            self._begin_iteration()

    def step(self) -> None:
        """Mark an iteration boundary (iteration mode): end the running iteration, if any, and begin the next.

        Use it when the repeated work is not one top-level ``gpuscope.range``: call it at the top of each
        iteration of the loop; the session's close ends the last iteration.

        Raises
        ------
        SessionConflictError
            The session is not open, its mode is not iteration (or auto), or a top-level range already
            delimits the iterations.
        """
        if self._state != "open":
            raise SessionConflictError("Profiler.step() needs an open session (inside the with block).")
        if self.mode_used is Mode.AUTO:
            self._use_iteration()
        if self.mode_used is not Mode.ITERATION:
            raise SessionConflictError(f"Profiler.step() marks iterations of mode='iteration'; this session "
                                       f"collects in mode={self.mode_used.value!r}.")
        if self._iter_path is not None:
            raise SessionConflictError(f"The top-level range {self._iter_path!r} already delimits the iterations; "
                                       "use either a repeated top-level range or Profiler.step(), not both.")
        self._steps = True
        if self._collector.in_iteration:
            self._end_iteration()
        self._begin_iteration()

    def _begin_iteration(self) -> None:
        self._recorder.resume()
        if self._size_from_first:
            self._collector.begin_count()
        else:
            self._collector.begin(self._group_index)

    def _end_iteration(self) -> None:
        graphs = self._recorder.graph_launches if self._recorder is not None else 0
        if self._graph_replay is not None:
            graphs -= self._graph_replay.replayed  # run node by node: their kernel nodes were launches
        if self._collector.counting:  # the first iteration sized the image; the next one is pass 0
            self._recorder.pause()
            launches = self._collector.end_count()
            if not launches and graphs:
                raise self._graph_error(graphs)
            self._size_image(launches)
            self._size_from_first = False
            self._notes["sizing_iterations"] = 1
            return
        from gpuscope.errors import CuptiError

        try:
            result = self._collector.end()
        except CuptiError as exc:  # seen: CUPTI_ERROR_UNKNOWN from Stop after graph launches in the pass
            if graphs:
                raise self._graph_error(graphs) from exc
            raise
        self._recorder.pause()
        if result.all_passes_submitted:
            self._collect_iterations()

    def _note_graph_launches(self, count: int) -> None:
        """Count the CUDA graph launches of the session, name their kernels (the activity records are flushed
        here) and say what became of them: CUPTI's launch callbacks and kernel replay do not see a graph's kernel
        nodes; a user range around the graph launch does."""
        graphs, replay = self._graphs, self._graph_replay
        if graphs is not None:
            graphs.close(self._context)
        if replay is not None:
            self._notes.update(replay.notes(self.graphs))
            if replay.message():
                _warn(replay.message())
            count -= replay.replayed  # run node by node: profiled as their kernel nodes
        if not count:
            return
        self._notes["graph_launches"] = self._notes.get("graph_launches", 0) + int(count)
        if graphs is not None and self.mode_used is not Mode.USER:
            attrs, message = graphs.summary(int(count), self.mode_used.value)
            self._notes.update(attrs)
            _warn(message)

    def _graph_error(self, graphs: int):
        from gpuscope.errors import GpuscopeError

        return GpuscopeError(
            f"The iterations launched {graphs} CUDA graph(s) (cuGraphLaunch: torch.cuda.CUDAGraph.replay, "
            "torch.compile mode='reduce-overhead', CuPy graphs): iteration mode cannot profile kernels inside a "
            "graph that gpuscope did not copy as it was made (call gpuscope.watch_graphs() before the graphs are made: "
            "docs/graphs.md). Or use mode='user' with a gpuscope.range around each graph "
            "launch: each becomes one row (docs/range-profiling.md, 'CUDA graphs').")
