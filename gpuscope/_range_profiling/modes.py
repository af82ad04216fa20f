"""Per-launch collection in a session: kernel, iteration and auto modes (:class:`PerLaunchModes`).

The part of :class:`gpuscope.Profiler` that runs at kernel launches (CUPTI's launch callbacks): kernel replay with
small images emptied when full, iterations as passes (marked by a top-level range, by ``Profiler.step()``, or found
in the launch stream by :mod:`gpuscope._range_profiling.repetition` in auto mode), the rows of launches and the kernel-replay cost
warning. What each launch becomes is :mod:`gpuscope._range_profiling.launches`'; what happens at a launch call's
entry and exit, never blocking, :mod:`gpuscope._range_profiling.entry`'s; the session's lifecycle is
:mod:`gpuscope._range_profiling.session`'s, whose ``Profiler`` mixes this class in; user ranges and user replay are
:mod:`gpuscope._range_profiling.user`'s.
"""

from __future__ import annotations

import enum

import numpy as np

from gpuscope._range_profiling import ranges as _ranges
from gpuscope._range_profiling.entry import LaunchEntry, _readable, _warn  # noqa: F401 (_readable: session's too)
from gpuscope.errors import MultiPassRangeError, SessionConflictError

__all__ = ["Mode", "PerLaunchModes"]


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


class Mode(str, enum.Enum):
    """How a :class:`Profiler` collects: ``"user"``, ``"kernel"``, ``"iteration"`` or ``"auto"`` (module docstring)."""

    USER = "user"
    KERNEL = "kernel"
    ITERATION = "iteration"
    AUTO = "auto"


class PerLaunchModes(LaunchEntry):
    """Kernel, iteration and auto modes of :class:`gpuscope.Profiler` (a mixin: it uses the session's state); what
    happens at a launch call's entry and exit is :class:`LaunchEntry`'s."""

    _coverage = None  # auto mode following the launch stream: what it left unprofiled (coverage.Coverage)
    _graphs = None  # the kernels of CUDA graph launches (graphs.GraphKernels)
    _found_period = None  # the period of the loop the pass group under way was begun on
    _first_loop = None  # (offset, found_at) of the loop found in the launch stream (the longest, if it relocked)
    _last_group = None  # iteration replay: (signatures, raw values) of the last complete group's rows, by position
    _function_resources = None  # registers and static shared memory per kernel function (see _functions)
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

    # -- auto mode without annotations: iterations found in the launch stream ---------------------------
    def _follow(self, launch):
        """Auto mode, no top-level range yet: kernel replay of one launch per (kernel, grid, block) while the tracker
        searches the launch stream for a repeated sequence of them; from the first iteration after it is found,
        iteration replay with the iterations it marks, a pass group begun anew when it follows another (longer)
        loop. A launch is profiled in a pass only at a position whose signature it has; the others are counted."""
        from gpuscope._range_profiling.repetition import Step

        tracker = self._tracker
        event = tracker.feed((launch.symbol, launch.grid, launch.block))
        kind = event.kind
        if self.mode_used is Mode.KERNEL:
            if kind is not Step.BEGIN:
                return self._collector.on_enter(launch)
            try:
                self._use_found_iterations()
            except Exception as exc:  # go on with kernel replay, from a profiler configured anew
                self._tracker = self._collector = None
                self.mode_used = Mode.AUTO
                self._notes["repetition_error"] = f"{type(exc).__name__}: {exc}"
                _warn(f"A loop was found in the launch stream, but iteration replay could not start ({exc}); "
                      "kernel replay goes on.")
                return self._enter_held(launch)
        c = self._collector
        if kind in (Step.BEGIN, Step.RESTART):
            if c.in_iteration:
                self._end_found_iteration()
            if tracker.repetition.period != self._found_period:
                self._follow_new_loop()
            c.begin(self._group_index)
        elif kind in (Step.LOST, Step.RELOCK):
            if c.in_iteration:
                self._end_found_iteration()
            self._notes.update(repetition_losses=tracker.losses, repetition_relocks=tracker.relocks)
        if kind in (Step.BEGIN, Step.RESTART, Step.INSIDE) or (kind is Step.EXTRA and c.in_iteration):
            token = c.on_enter(launch)
            if token is not None:
                token.launch_id = tracker.launches - 1  # the session's launch ID, as kernel replay's rows have
            if event.last:
                self._end_after = token
            return token
        self._notes["launches_between_iterations"] = self._notes.get("launches_between_iterations", 0) + 1
        self._coverage.add("searching" if kind is Step.SEARCHING else "between_iterations", launch.symbol)
        return None

    def _follow_new_loop(self) -> None:
        """The tracker follows another loop than the pass group under way was begun on (a longer one, or another
        after a loss): that group is dropped and the range profiler made anew (CUPTI counts a replay's passes from
        its configuration, which cannot change once used); the image is sized for the new period."""
        from gpuscope.cupti._types import ProfilerRange, ReplayMode

        if self._collector.group is not None:
            self._take_found_group("loop_changed")
            self._key = None  # the dropped group's passes were submitted to this profiler
        rep = self._tracker.repetition
        self._configure(ProfilerRange.AUTO, ReplayMode.USER, _capacity(len(rep.period)))
        if self._found_period is None or len(rep.period) > len(self._found_period):
            # a longer loop took over (the one followed was a repetition inside it, or in the setup): coverage
            # "from the loop's first iteration" counts from this one's
            self._first_loop = (rep.offset, rep.found_at)
        self._found_period = rep.period
        self._notes.update(repetition_period=len(rep.period), repetition_offset=rep.offset,
                           repetition_found_at=rep.found_at)

    def _take_found_group(self, reason: str, start: int = 0) -> None:
        """Drop the pass group under way; in auto mode its launches from position *start* of each iteration on are
        counted as unprofiled for *reason*."""
        group = self._collector.take_group()
        if self._coverage is not None and group is not None:
            self._coverage.add_passes(reason, group.passes, start)

    def _use_found_iterations(self) -> None:
        """The tracker found the loop: collect the launches kernel replay profiled so far, and go on in iteration
        mode (a profiler configured for user replay: CUPTI cannot change a used profiler's configuration)."""
        from gpuscope.cupti._types import ProfilerRange, ReplayMode

        kernel_phase = self._collector
        self._stop_kernel_pass()
        self._collect_kernels()
        rep = self._tracker.repetition
        self._configure(ProfilerRange.AUTO, ReplayMode.USER, _capacity(len(rep.period)))
        self._collector = self._iteration_replay()
        self.mode_used, self.cycles = Mode.ITERATION, self.passes
        self._found_period = rep.period
        self._first_loop = (rep.offset, rep.found_at)
        self._notes.update(iterations_found_by="repetition", repetition_period=len(rep.period),
                           repetition_offset=rep.offset, repetition_found_at=rep.found_at,
                           launches_before_repetition=kernel_phase.heard,
                           launches_replayed_before_repetition=len(kernel_phase.selected),
                           launches_left_out_before_repetition=kernel_phase.left_out)

    def _end_found_iteration(self) -> None:
        c = self._collector
        if not c.in_iteration:
            return
        if c.end().all_passes_submitted:
            self._collect_iterations()

    def _leave_kernel_phase(self) -> None:
        """Auto mode: a top-level range after launches outside every range (setup before the loop). The launches
        so far keep their kernel-replay rows; the ranges decide the mode from here on."""
        kernel_phase = self._collector
        self._stop_kernel_pass()
        self._collect_kernels()
        self._tracker = None
        self._notes["launches_before_ranges"] = len(kernel_phase.selected)
        self._collector = None
        self.mode_used = Mode.AUTO

    def _incomplete_iterations(self):
        group = self._collector.group
        ran = group.passes_run if group is not None else 0
        what = (f"the top-level range {self._iter_path!r}" if self._iter_path else
                "Profiler.step()" if self._steps else
                f"the loop found in the launch stream ({self._notes.get('repetition_period')} launches per iteration)"
                if self._tracker is not None else "no top-level range and no Profiler.step()")
        first = " plus one first iteration that sizes the counter-data image" if self._notes.get(
            "sizing_iterations") or self._size_from_first else ""
        message = (
            f"Iteration mode: the metric set needs {self.passes} iterations per result (one pass each){first}, and "
            f"{what} gave {ran} in the last pass group. Run the repeated work at least {self.passes} times "
            "inside the session: a loop whose body is one top-level gpuscope.range, or call prof.step() between "
            "iterations. For code that does not repeat use mode='kernel' (CUPTI kernel replay) or a one-pass "
            "metric set."
        )
        completed, positions = self._complete_last_group()
        self._take_found_group("incomplete_group", start=completed)
        if self._rows:
            if ran and completed < positions:
                _warn(message + (f" The last, incomplete group was dropped from launch {completed} of its "
                                 f"iterations on (their launches differ from the group before)" if completed else
                                 " The last, incomplete group was dropped") + ".")
            return None
        if self._group_index > 0:  # it repeated, but no launch was common to the iterations of any group (other
            # threads' launches interleaved with the loop's): an empty result that says why, not "repeat the work"
            _warn(f"{'Auto' if self.mode is Mode.AUTO else 'Iteration'} mode profiled {self._group_index} pass "
                  "group(s) of iterations and kept no launch: their iterations did not launch the same kernels (the "
                  "warnings above say where; launches_unmatched, launches_concurrent). Where launches of other "
                  "threads interleave with the loop's, use mode='kernel', which profiles each launch on its own, or "
                  "launch from one thread while the session runs.")
            return None
        return MultiPassRangeError(message)

    def _past_a_cut(self, passes, keep: int, count: int) -> tuple[list | None, int]:
        """A complete group whose last iteration was cut short (the loop ended inside it, or launches after it began
        one): the launches the other passes have in common past the cut (*keep*), as far as they are the launches
        of the group before, can take the cut pass's counters (known from the pass plan) from that group.

        Returns (indices of the cut pass's counters in the raw values, launches kept); (None, *keep*) where that
        cannot be done."""
        from gpuscope._range_profiling import launches as _launches

        if len(passes) < 2 or len(passes[-1]) >= len(passes[0]) or keep != len(passes[-1]) or not self._last_group:
            return None, keep
        cut_pass = self._pass_counters(len(passes) - 1)
        if cut_pass is None:
            return None, keep
        return cut_pass, self._like_the_group_before(passes[0], keep,
                                                     min(_launches.matched_prefix(passes[:-1]), count))

    def _pass_counters(self, k: int) -> list | None:
        """Indices in the raw values (:func:`evaluate_raw`) of the counters pass *k* collects: the pass plan's group
        *k*; None without a plan that says (CUPTI's own schedule, a last group of several passes)."""
        plan = getattr(self, "_plan", None)
        if plan is None or plan.several or k >= len(plan.groups):
            return None
        return [plan.collected.index(m) for m in plan.groups[k]]

    def _like_the_group_before(self, reference, start: int, stop: int) -> int:
        """From position *start*, up to *stop*, how far *reference*'s launches are those of the last complete group
        at the same positions (same kernel, grid and block)."""
        signatures = self._last_group[0]
        stop = min(stop, len(signatures))
        while start < stop and reference[start].signature == signatures[start]:
            start += 1
        return start

    def _launch_ids(self, reference, first_row: int) -> None:
        """Found iterations: the rows from *first_row* on (made with their position in the iteration as ``launch``)
        get their launch's ID in the session, that of *reference*'s launch (the group's first pass) there."""
        if self._tracker is not None:
            for row in self._rows[first_row:]:
                row["launch"] = reference[row["launch"]].launch_id

    def _note_completed(self, launches: int, borrowed: int) -> None:
        """Count *launches* completed with up to *borrowed* passes from the group before, over the session."""
        notes, key = self._notes, "launches_completed_from_earlier_group"
        notes[key] = notes.get(key, 0) + launches
        notes["passes_from_earlier_group"] = max(notes.get("passes_from_earlier_group", 0), borrowed)

    def _complete_last_group(self) -> tuple[int, int]:
        """Rows for the launches of an incomplete last pass group: the counters of the passes it ran, those of the
        other passes from the same launch of the group before (a launch of the same kernel, grid and block at the
        same position of its iterations). CUPTI decodes an image whose configuration's passes did not all run,
        and evaluates the counters of the passes that did not to NaN (``.devtmp`` probe on the H100, CUPTI 13.0:
        the passes that ran gave the values the group before gave, within 6% on kernel durations and 0.1% on
        instruction counts). The rows say it: ``passes_from_earlier_group`` and ``iterations`` (the passes run).

        The group's last iteration is often cut short: the loop ended inside it (a script's launches after its
        last step begin an iteration they do not finish). Launches past the end of that pass take its counters,
        known from the pass plan, from the group before too; without a plan they are not completed.

        Returns (launches completed per iteration, launches the group's iterations have in common); (0, n) when
        nothing could be completed."""
        from gpuscope._range_profiling import launches as _launches
        from gpuscope.cupti import range_profiler

        c, last = self._collector, self._last_group
        group = c.group if c is not None else None
        if group is None or not group.passes_run or c.in_iteration:
            return 0, 0
        passes, run = group.passes, group.passes_run
        common = _launches.matched_prefix(passes)
        if not last or run >= self.passes:
            return 0, common
        cut = None  # where the last iteration was cut short
        if run > 1 and len(passes[-1]) < len(passes[0]):
            cut = _launches.matched_prefix([passes[0], passes[-1]])
            common = _launches.matched_prefix(passes[:-1])
        try:
            self._rp.decode()
            common = min(common, range_profiler.num_ranges(self._image))
        except Exception as exc:  # the group is dropped as before
            self._notes["completion_error"] = f"{type(exc).__name__}: {exc}"
            return 0, common
        earlier = last[1]
        reference = passes[0]
        done = self._like_the_group_before(reference, 0, common)
        cut_pass = None if cut is None else self._pass_counters(run - 1)  # indices of the cut pass's counters
        if cut is not None and cut_pass is None:
            done = min(done, cut)
        first_row, completed, fewest = len(self._rows), 0, run
        for index in range(done):
            launch = reference[index]
            raw = np.asarray(evaluate_raw(self, self._image, index), dtype=np.float64)
            ran = run
            if cut is not None and index >= cut:
                raw[cut_pass] = np.nan
                ran = run - 1
            raw = np.where(np.isnan(raw), earlier[index], raw)
            completed += sum(1 for p in passes[:ran] if p[index].wanted)
            fewest = min(fewest, ran)
            if launch.wanted:
                self._rows.append(self._launch_row(launch, index, values_of(self, raw), group.index,
                                                   group.first_iteration, ran, "iteration",
                                                   borrowed=self.passes - ran))
        self._launch_ids(reference, first_row)
        if done:
            self._note_completed(completed, self.passes - fewest)  # the most passes a row took
        return done, common

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

    def _size_image(self, launches: int) -> None:
        """Size the counter-data image for iterations of *launches* launches (CUPTI's cost per range grows with it)."""
        from gpuscope.cupti._types import ProfilerRange, ReplayMode

        self._configure(ProfilerRange.AUTO, ReplayMode.USER, _capacity(launches))

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

    def _collect_iterations(self) -> None:
        from gpuscope._range_profiling import launches as _launches
        from gpuscope.cupti import range_profiler

        dropped = self._rp.decode()
        group = self._collector.take_group()
        image = self._image
        count = range_profiler.num_ranges(image)
        reference = group.passes[0]
        keep = min(_launches.matched_prefix(group.passes), count)
        cut = keep
        cut_pass, keep = self._past_a_cut(group.passes, keep, count)
        first_row = len(self._rows)
        earlier, completed = [], 0
        for index in range(keep):
            launch = reference[index]
            raw = np.asarray(evaluate_raw(self, image, index), dtype=np.float64)
            ran = self.passes
            if index >= cut:  # past the end of a last iteration cut short: its pass from the group before
                raw[cut_pass] = self._last_group[1][index][cut_pass]
                ran -= 1
                completed += sum(1 for p in group.passes[:ran] if p[index].wanted)
            earlier.append(raw)
            if launch.wanted:
                self._rows.append(self._launch_row(launch, index, values_of(self, raw), group.index,
                                                   group.first_iteration, ran, "iteration",
                                                   borrowed=self.passes - ran))
        if completed:
            self._note_completed(completed, 1)
        self._last_group = ([s.signature for s in reference[:keep]], earlier)
        self._launch_ids(reference, first_row)
        self._rp.initialize_counter_data(image)
        self._group_index += 1
        lost = [s.kernel for s in reference[keep:] if s.wanted]
        unmatched = sum(max(len(p) - keep, 0) for p in group.passes[1:])
        if self._coverage is not None:
            self._coverage.add_passes("unmatched", group.passes, keep)
        self._notes["launches_incomplete"] = self._notes.get("launches_incomplete", 0) + len(lost)
        self._notes["launches_unmatched"] = self._notes.get("launches_unmatched", 0) + unmatched
        longest = max(len(p) for p in group.passes)
        if dropped or longest > self.max_ranges:
            _warn(f"Iterations of group {group.index} launched up to {longest} kernels, more than the counter-data "
                  f"image holds ({self.max_ranges}): {dropped} launch range(s) were dropped. The image is enlarged "
                  "for the next groups; pass gpuscope.Profiler(max_ranges=...) to size it yourself.")
            self._size_image(2 * longest)
        if keep < max(len(p) for p in group.passes):
            k, first, other = _divergence(group.passes, keep)
            _warn(f"Iterations {group.first_iteration}-{group.first_iteration + group.passes_run - 1} did not launch "
                  f"the same kernels: launch {keep} was {first} in iteration {group.first_iteration} but {other} in "
                  f"iteration {group.first_iteration + k}. Kept the {keep} leading launch(es) common to all "
                  f"iterations; dropped {len(lost)} launch(es) from there ({sorted(set(lost))[:5]}) and "
                  f"{unmatched} launch(es) of later iterations. Values of kept launches are complete."
                  + _empty_last_iteration(group))

    def _flush_kernels(self) -> None:
        """Kernel mode, the counter-data image full (called at the entry of the launch that would not fit): collect
        what it holds and go on with it emptied."""
        collector = self._collector
        if not collector.paused:
            self._rp.stop()
        self._collect_kernels()
        self._rp.start()
        collector.paused = False
        self._notes["image_flushes"] = self._notes.get("image_flushes", 0) + 1

    def _collect_kernels(self) -> None:
        """Decode and evaluate the launches the image holds (those since the last flush)."""
        from gpuscope.cupti import range_profiler

        dropped = self._rp.decode()
        image = self._image
        collector = self._collector
        first = collector.image_first
        launches = collector.selected[first:]
        collector.image_first = len(collector.selected)
        count = range_profiler.num_ranges(image)
        if not dropped and count == self.max_ranges < len(launches):
            # a full image of the size the user fixed: CUPTI kept the first ranges and dropped the later launches
            # without counting them
            dropped = len(launches) - count
            launches = launches[:count]
            self._notes["launches_dropped"] = self._notes.get("launches_dropped", 0) + dropped
            _warn(f"{dropped} launch(es) did not fit the counter-data image and were dropped; pass "
                  f"gpuscope.Profiler(max_ranges=...) larger than {self.max_ranges}.")
            dropped = 0
        elif dropped:
            _warn(f"{dropped} launch(es) did not fit the counter-data image and were dropped; pass "
                  f"gpuscope.Profiler(max_ranges=...) larger than {self.max_ranges}.")
        if count != len(launches) - dropped and any(s.concurrent for s in launches):
            real = [s for s in launches if not s.concurrent]  # CUPTI made no range of the concurrent launches
            if count == len(real) - dropped:
                launches = real
        if count != len(launches) - dropped:
            _warn(f"CUPTI returned {count} kernel ranges for {len(launches)} recorded launches; the launches cannot "
                  "be told apart, so rows are named by CUPTI's range names without kernel names.")
            launches = None
        for index in range(count):
            values = evaluate_range(self, image, index)
            if launches is None:
                name = range_profiler.range_name(image, index, "/")
                self._rows.append({"name": name, "depth": 1, "parent": "", "launch": -1, "values": values,
                                   "pass_group": 0, "first_iteration": 0, "iterations": 1})
            elif launches[index].concurrent:  # a placeholder: its range is another thread's unprofiled launch
                continue
            elif launches[index].overlapped:  # CUPTI's order of it and a concurrent launch is not known
                self._unsafe["overlapped"] += 1
            else:
                self._rows.append(self._launch_row(launches[index], launches[index].launch_id, values, 0, 0, 1,
                                                   "kernel"))
        self._rp.initialize_counter_data(image)

    def _finish_kernels(self) -> None:
        self._collect_kernels()
        replay_ms = [(s.exit_ns - s.enter_ns) / 1e6 for s in self._collector.selected if s.exit_ns > 0]
        if replay_ms:
            self._notes["replay_ms_per_launch"] = float(np.median(replay_ms))
            # judged on the launches after the first, which may pay one-time costs (seen: 120 ms after a PC
            # sampling block, then 40; 147 ms for the second launch after CUPTI was detached)
            self._warn_replay_cost(float(np.median(replay_ms[1:] if len(replay_ms) > 1 else replay_ms)),
                                   len(replay_ms) - 1)

    def _warn_replay_cost(self, ms: float, judged: int | None = None) -> None:
        """Kernel replay dearer than expected, or memory that makes it dear: say what was observed, and what is
        cheaper. Causes are named only when seen: the memory this process holds, and loaded modules built with
        relocatable device code (read from their cubins as they loaded, :mod:`gpuscope._gpu.modules`)."""
        if self.passes < 2:
            return
        from gpuscope._gpu import device as _device
        from gpuscope._gpu import modules as _modules

        device_gib = _device.memory_used_gib(self.device)
        own_gib = _device.process_memory_gib(self.device)
        held = device_gib if own_gib is None else own_gib
        whose = "the device has" if own_gib is None else "this process holds"
        expected = (_REPLAY_FIXED_MS + _REPLAY_PASS_MS * self.passes
                    + _REPLAY_RESTORE_MS_PER_GIB * held * (self.passes - 1))
        seen = _modules.seen()
        dear = ms > 1.8 * expected
        if dear and not seen.relocatable and judged is not None and judged < _REPLAY_JUDGED:
            dear = False  # a time with no cause seen says nothing on one or two launches
        if not dear and held < _REPLAY_WARN_GIB:
            return
        causes = []
        if held >= _REPLAY_WARN_GIB:
            causes.append(f"{whose} {held:.1f} GiB of device memory in use, which CUPTI's kernel replay restores "
                          f"before each of the {self.passes - 1} passes after the first")
        if dear and seen.relocatable:
            names = sorted({n for kernels, _ in seen.relocatable for n in kernels})
            causes.append(f"{len(seen.relocatable)} loaded module(s) were built with relocatable device code "
                          f"({', '.join(_readable(n) for n in names[:3]) or 'no named kernel'}: "
                          f"{seen.relocatable[0][1][0]}); with one loaded, CUPTI restores much more per pass "
                          "(measured on an H100: 48-90 ms per launch instead of 40)")
        if dear and not seen.relocatable:
            heard = (f"none of the {seen.loaded} module(s) loaded while gpuscope sessions were open in this process "
                     "was built with relocatable device code (modules loaded outside sessions were not inspected)"
                     if seen.watching else f"the loaded modules could not be inspected ({seen.error})")
            causes.append(f"the cause is unknown: {whose} {held:.1f} GiB in use (about {expected:.0f} ms expected "
                          f"with it on an H100) and {heard}")
        _warn(f"Kernel replay cost {ms:.0f} ms per launch here ({self.passes} passes): " + "; ".join(causes)
              + ". mode='iteration' (pass k on the k-th iteration of a repeated top-level range, or between "
              "Profiler.step() calls) saves and restores nothing: about 1.1 ms per launch per pass on an H100, "
              "whatever the memory held.")
        self._notes.update(replay_memory_gib=round(held, 2), replay_memory_scope="process" if own_gib is not None
                           else "device", relocatable_modules=len(seen.relocatable))

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


# CUPTI kernel replay per launch on an H100 (CUPTI 13.0; docs/measurements.md): about 11 ms, plus 3.5 ms per
# pass, plus a restore of the device memory in use before every pass after the first (about 0.6 ms per GiB).
_REPLAY_FIXED_MS, _REPLAY_PASS_MS, _REPLAY_RESTORE_MS_PER_GIB = 11.0, 3.5, 0.62
_REPLAY_WARN_GIB = 4.0
_REPLAY_JUDGED = 3  # launches after the first before a cost alone (no cause seen) is warned about


def _functions(session):
    """The session's :class:`gpuscope._gpu.functions.FunctionResources`: each kernel function's registers and static
    shared memory, asked of the driver at the first row of a launch of it (made on first use, kept on the session)."""
    functions = getattr(session, "_function_resources", None)
    if functions is None:
        from gpuscope._gpu.functions import FunctionResources

        functions = session._function_resources = FunctionResources()
    return functions


def _capacity(launches: int) -> int:
    """Ranges of a counter-data image for iterations of *launches* launches: a power of two with room to spare, so
    that sessions with about as many launches share one kept configuration."""
    need = launches + max(8, launches // 4)
    return min(max(16, 1 << (need - 1).bit_length()), 1 << 20)


def _empty_last_iteration(group) -> str:
    """What to say where a group's last iteration launched nothing (the usual cause: ``prof.step()`` at the end of
    each iteration, as torch.profiler's ``step()`` is called, begins an empty iteration after the last one)."""
    if group.passes_run < 2 or group.passes[-1] or not group.passes[0]:
        return ""
    last = group.first_iteration + group.passes_run - 1
    return (f" Iteration {last} launched nothing: Profiler.step() begins an iteration, so a step() after the "
            "loop's last work begins an empty one. Call prof.step() at the top of each iteration, before its work.")


def _divergence(passes, position: int):
    """(pass index, what the first pass launched, what that pass launched) at the first differing *position*."""
    def at(p):
        if position >= len(p):
            return "nothing", None
        s = p[position]
        text = f"{s.kernel} grid={s.grid} block={s.block}"
        if s.concurrent:
            text += " (launched while another thread's launch was in flight)"
        elif s.overlapped:
            text += " (overlapped by another thread's launch)"
        return text, s.signature

    first, signature = at(passes[0])
    for k, p in enumerate(passes[1:], 1):
        text, sig = at(p)
        if sig != signature:
            return k, first, text
    return 0, first, first  # one pass, or the first pass's own launch is a placeholder: it is the reason
