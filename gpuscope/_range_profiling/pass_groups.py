"""Iteration replay's pass groups at their end: a complete group's rows, a last group completed from the one before.

In iteration and auto modes pass k of a group runs on its k-th iteration; when the group's last pass is submitted its
launches, matched across the iterations by position, become rows (:meth:`PassGroups._collect_iterations`). A group
whose last iteration was cut short, or a last group that did not run all its passes at the session's close, takes the
counters of the passes that did not run from the same launches of the group before, where the pass plan says which
counters those are (``passes_from_earlier_group``). The counter-data image is sized for the iterations' launches.
:class:`PassGroups` is a mixin of :class:`gpuscope._range_profiling.modes.PerLaunchModes`.
"""

from __future__ import annotations

import numpy as np

from gpuscope._range_profiling.entry import _warn
from gpuscope._range_profiling.mode import Mode
from gpuscope._range_profiling.rows import evaluate_raw, values_of
from gpuscope.errors import MultiPassRangeError

__all__ = ["PassGroups"]


class PassGroups:
    """What iteration and auto modes do at a pass group's end (a mixin of :class:`gpuscope.Profiler`: it uses the
    session's state)."""

    _last_group = None  # iteration replay: (signatures, raw values) of the last complete group's rows, by position

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

    def _size_image(self, launches: int) -> None:
        """Size the counter-data image for iterations of *launches* launches (CUPTI's cost per range grows with it)."""
        from gpuscope.cupti._types import ProfilerRange, ReplayMode

        self._configure(ProfilerRange.AUTO, ReplayMode.USER, _capacity(launches))

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
