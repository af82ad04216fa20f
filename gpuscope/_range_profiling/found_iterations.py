"""Auto mode without annotations: iterations found in the launch stream, then replayed as passes.

Until a loop shows, each (kernel, grid, block) is profiled once by kernel replay while
:mod:`gpuscope._range_profiling.repetition` searches the launch stream; from the first iteration after it is found,
iteration replay runs with the iterations it marks, a pass group begun anew when it follows another (longer) loop.
A top-level range that comes first hands the decision to the ranges. What auto mode leaves unprofiled is counted
(:mod:`gpuscope._range_profiling.coverage`). :class:`FoundIterations` is a mixin of
:class:`gpuscope._range_profiling.modes.PerLaunchModes`.
"""

from __future__ import annotations

from gpuscope._range_profiling.entry import _warn
from gpuscope._range_profiling.mode import Mode
from gpuscope._range_profiling.pass_groups import _capacity

__all__ = ["FoundIterations"]


class FoundIterations:
    """Iterations found in the launch stream (a mixin of :class:`gpuscope.Profiler`: it uses the session's state)."""

    _coverage = None  # auto mode following the launch stream: what it left unprofiled (coverage.Coverage)
    _found_period = None  # the period of the loop the pass group under way was begun on
    _first_loop = None  # (offset, found_at) of the loop found in the launch stream (the longest, if it relocked)

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
