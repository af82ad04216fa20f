"""User mode of a session: ranges pushed to CUPTI, pass groups of cycles, user replay (:class:`UserRanges`).

The part of :class:`gpuscope.Profiler` that follows ``gpuscope.range`` (the session is a range listener) and
decorated launches: in user mode each range up to ``max_depth`` is pushed to CUPTI, each execution of a top-level
range is one cycle, ``cycles`` of them make a pass group, which is decoded into rows when CUPTI has all its passes
(or, in one continuous pass, whenever the counter-data image fills); :meth:`UserRanges.replay` runs a callable
once per cycle, restoring device memory in between. In kernel, iteration and auto modes the listener hands the
top-level ranges to :class:`~gpuscope._range_profiling.modes.PerLaunchModes`. The session's options, lifecycle
and Dataset are :mod:`gpuscope._range_profiling.session`'s, whose ``Profiler`` mixes this class in.
"""

from __future__ import annotations

import os
import threading

import numpy as np

from gpuscope._range_profiling import ranges as _ranges
from gpuscope._range_profiling.modes import Mode, _warn, evaluate_range
from gpuscope.errors import SessionConflictError

__all__ = ["UserRanges"]


class _Row:
    """What gpuscope knows about one CUPTI range beyond its counters."""

    __slots__ = ("name", "kernel", "launch", "grid", "block", "start_ns", "end_ns", "count")

    def __init__(self, name, kernel="", launch=-1, grid=None, block=None):
        self.name, self.kernel, self.launch, self.grid, self.block = name, kernel, launch, grid, block
        self.start_ns = self.end_ns = -1
        self.count = 0


class UserRanges:
    """User ranges and user replay of :class:`gpuscope.Profiler` (a mixin: it uses the session's state)."""

    # -- pass groups -----------------------------------------------------------------------------------
    def _new_group(self):
        self._running = False
        self._group_path = None
        self._group_cycles = 0
        self._group_first = -1
        self._group_rows: dict[str, _Row] = {}
        self._group_pushes = None
        self._cycle_pushes = 0
        self._cycle_launch = 0
        self._bad_group = False

    # -- the range listener -----------------------------------------------------------------------------
    def _foreign(self) -> bool:
        """A range or launch on another thread than the session's (user mode profiles the session's thread)."""
        if threading.get_ident() == self._thread:
            return False
        thread = threading.current_thread()  # not its ident: idents of ended threads are handed out again
        if thread not in self._other_threads:
            self._other_threads.add(thread)
            if self.mode is Mode.USER:
                _warn(f"gpuscope.range and decorated launches on thread {threading.current_thread().name!r} are "
                      "not profiled: a user-mode session profiles the thread that opened it. Open the session on "
                      "that thread, or use mode='kernel' or 'iteration', which profile launches from every thread.")
        return True

    def range_push(self, path: str) -> None:
        if os.getpid() != self._pid or self._foreign():
            return
        if (self._first_thread is not None or self._first_error is not None) and not self._first_started():
            return  # CUPTI refused the first Start: nothing is profiled, close() says why
        if self._per_launch:
            if "/" not in path:
                self._iteration_push(path)
            return
        self._push(path, _Row(path))

    def range_pop(self, path: str) -> None:
        if os.getpid() != self._pid or self._foreign():
            return
        if self._first_error is not None:
            return
        if self._per_launch:
            if "/" not in path and path == self._iter_path and not self._steps and self._collector.in_iteration:
                self._end_iteration()
            return
        self._pop(path)

    def _push(self, path: str, row: _Row, cupti_name: str | None = None) -> None:
        depth = path.count("/") + 1
        forward = depth <= self.max_depth and (not self._stack or self._stack[-1])
        if forward and depth == 1 and self.sample_every > 1:
            seen = self._seen[path] = self._seen.get(path, 0) + 1
            forward = (seen - 1) % self.sample_every == 0
        began = False
        if forward and depth == 1 and not self.continuous:
            forward = began = self._begin_cycle(path)
        elif depth > self.max_depth and not getattr(self, "_warned_depth", False):
            self._warned_depth = True
            _warn(f"Range {path!r} is deeper than max_depth={self.max_depth} and is not profiled. Pass "
                  f"gpuscope.Profiler(max_depth={depth}) to profile it (each level needs one more cycle per pass).")
        self._stack.append(False)  # True only once CUPTI has the range, so a refused push leaves the stacks whole
        if not forward:
            return
        key = path if cupti_name is None else f"{path.rsplit('/', 1)[0]}/{cupti_name}" if depth > 1 else cupti_name
        if self.continuous and depth == 1 and key not in self._group_rows and len(self._group_rows) >= self.max_ranges:
            self._flush_ranges()
        try:
            self._rp.push_range(cupti_name or path.rsplit("/", 1)[-1])
        except BaseException:
            if began:  # end the cycle just begun; its group cannot be complete
                self._bad_group = True
                self._end_cycle()
            raise
        self._stack[-1] = True
        self._cycle_pushes += 1
        known = self._group_rows.setdefault(key, row)
        if known.start_ns < 0:
            from gpuscope.cupti.activity import timestamp

            known.start_ns = timestamp()
        known.count += 1
        self._open_rows.append(known)

    def _pop(self, path: str) -> None:
        if not self._stack:
            return
        forward = self._stack.pop()
        if not forward:
            return
        from gpuscope.cupti.activity import timestamp

        row = self._open_rows.pop()
        if self.continuous or row.count == 1:
            row.end_ns = timestamp()
        try:
            self._rp.pop_range()
        except BaseException:
            self._bad_group = True  # CUPTI's ranges and ours no longer match: the group is dropped, with a warning
            if not self._stack and not self.continuous:
                self._end_cycle()  # a top-level range ends its cycle even so, or no later range could start one
            raise
        if not self._stack and not self.continuous:
            self._end_cycle()

    def _begin_cycle(self, path: str) -> bool:
        if self._group_path is not None and path != self._group_path:
            _warn(f"Range {path!r} started while the pass group of {self._group_path!r} is incomplete "
                  f"({self._group_cycles}/{self.cycles}); it is not profiled. Run one top-level range per loop.")
            return False
        if self._group_path is None:
            self._group_path = path
            self._group_first = self._iteration.get(path, 0)
        self._iteration[path] = self._iteration.get(path, 0) + 1
        self._cycle_pushes = 0
        self._cycle_launch = 0
        self._rp.start()
        self._running = True
        return True

    def _end_cycle(self) -> None:
        result = self._rp.stop()
        self._running = False
        self._group_cycles += 1
        if self._group_pushes is None:
            self._group_pushes = self._cycle_pushes
        elif self._group_pushes != self._cycle_pushes:
            self._bad_group = True
        if result.all_passes_submitted:
            if self._group_cycles != self.cycles:
                _warn(f"CUPTI needed {self._group_cycles} cycles where gpuscope expected {self.cycles}.")
            self._collect(self._group_index)
            self._group_index += 1

    def _flush_ranges(self) -> None:
        """User mode, one continuous pass, the counter-data image full: collect what it holds and go on with it
        emptied (the ranges after this get rows of the next ``pass_group``)."""
        self._rp.stop()
        self._collect(self._group_index)
        self._group_index += 1
        self._rp.start()
        self._running = True
        self._notes["image_flushes"] = self._notes.get("image_flushes", 0) + 1

    def _collect(self, group: int) -> None:
        """Decode the finished pass group, evaluate its ranges and keep them as rows."""
        from gpuscope.cupti import range_profiler
        from gpuscope.cupti._types import ProfilerRange, ReplayMode

        dropped = self._rp.decode()
        if dropped and not self._fixed_ranges:
            _warn(f"{dropped} range(s) of pass group {group} did not fit the counter-data image ({self.max_ranges} "
                  f"ranges) and were dropped; the image is enlarged to {4 * self.max_ranges} for the next groups. "
                  "Pass gpuscope.Profiler(max_ranges=...) to size it yourself.")
            self._grow = True
        elif dropped:
            _warn(f"{dropped} range(s) did not fit the counter-data image and were dropped; pass "
                  f"gpuscope.Profiler(max_ranges=...) larger than {self.max_ranges}.")
        if self._bad_group:
            _warn(f"Pass group {group} of {self._group_path!r} is dropped: its executions did not contain the "
                  "same ranges (an exception, or a data-dependent branch).")
        else:
            image = self._image
            for index in range(range_profiler.num_ranges(image)):
                name = range_profiler.range_name(image, index, "/")
                self._rows.append(self._record(name, evaluate_range(self, image, index), group))
        self._rp.initialize_counter_data(self._image)
        self._new_group()
        if self._grow:
            self._grow = False
            self._configure(ProfilerRange.USER, ReplayMode.USER, min(4 * self.max_ranges, 1 << 20), self.max_depth)

    def _record(self, cupti_name: str, values, group: int) -> dict:
        row = self._group_rows.get(cupti_name) or _Row(cupti_name)
        name = row.name
        depth = name.count("/") + 1
        return {
            "name": name, "depth": depth, "parent": name.rsplit("/", 1)[0] if depth > 1 else "",
            "kernel": row.kernel, "launch": row.launch, "grid": row.grid, "block": row.block,
            "start_ns": row.start_ns, "end_ns": row.end_ns, "pass_group": group,
            "first_iteration": self._group_first if not self.continuous else 0,
            "iterations": self.cycles if not self.continuous else row.count,
            "values": values,
        }

    def launch(self, kernel: str, grid, block, run):
        """Run one decorated kernel launch *run()* as a profiled range (used by ``gpuscope.profile``)."""
        if self._per_launch:  # the launch callback names the launch after the decorated kernel
            self._pending.kernel = kernel
            try:
                return run()
            finally:
                self._pending.kernel = None
        if self._foreign() or os.getpid() != self._pid:
            return run()
        parent = _ranges.current_path()
        path = f"{parent}/{kernel}" if parent else kernel
        if parent is None and not self.continuous:  # a top-level launch: replay it here
            return self.replay(run, name=kernel, _launch=(grid, block))
        index = self._launch
        self._launch += 1
        cupti_name = f"{kernel}#{self._cycle_launch if not self.continuous else index}"
        self._cycle_launch += 1
        row = _Row(path, kernel, index, _dim3(grid), _dim3(block))
        self._push(path, row, cupti_name)
        try:
            return run()
        finally:
            self._pop(path)

    # -- user replay --------------------------------------------------------------------------------------
    def replay(self, fn, *args, name: str | None = None, _launch=None, **kwargs):
        """Run ``fn(*args, **kwargs)`` as a top-level range once per cycle, restoring device memory between.

        Returns what the last run returned. With a one-cycle set, or in kernel and iteration modes, *fn* runs
        once.

        Raises
        ------
        SessionConflictError
            Called inside an open range, or from another thread than the session's.
        """
        from gpuscope.cupti.checkpoint import Checkpoint

        name = name or getattr(fn, "__qualname__", "replay")
        if self._per_launch or self.continuous:
            with _ranges.Range(name):
                return fn(*args, **kwargs) if _launch is None else self._launch_in_range(fn, name, _launch)
        if _ranges.current_path() is not None or threading.get_ident() != self._thread:
            raise SessionConflictError(
                f"gpuscope.replay({name!r}) must run at top level on the session's thread, not inside range "
                f"{_ranges.current_path()!r}.")
        if self._group_cycles:
            raise SessionConflictError(f"gpuscope.replay({name!r}) while the pass group of {self._group_path!r} "
                                       "is incomplete; finish that loop first.")
        checkpoint = Checkpoint(self._context.handle)
        try:
            result = None
            for cycle in _progress(range(self.cycles), self._show_progress(), f"gpuscope replay {name}"):
                if cycle:
                    checkpoint.restore()
                with _ranges.Range(name):
                    result = fn(*args, **kwargs) if _launch is None else self._launch_in_range(fn, name, _launch)
            return result
        finally:
            checkpoint.close()

    def _launch_in_range(self, run, kernel, dims):
        """The body of a replayed top-level kernel launch: the launch coordinates go on the range's row."""
        if self._per_launch:
            return self.launch(kernel, dims[0], dims[1], run)
        row = self._group_rows.get(kernel)
        if row is not None and row.launch < 0:
            row.kernel, row.launch, row.grid, row.block = kernel, self._launch, _dim3(dims[0]), _dim3(dims[1])
            self._launch += 1
        return run()

    def _show_progress(self):
        if self.progress is not None:
            return bool(self.progress)
        return None if self.cycles > 4 else False


def _dim3(value):
    if value is None:
        return None
    if isinstance(value, (int, np.integer)):
        return (int(value), 1, 1)
    value = tuple(int(v) for v in value)
    return value + (1,) * (3 - len(value))


def _progress(iterable, show, description):
    if show is False:
        return iterable
    try:
        from tqdm.auto import tqdm
    except ImportError:  # tqdm is a dependency; without it there is no bar
        return iterable
    return tqdm(iterable, desc=description, disable=None if show is None else not show, leave=False)
