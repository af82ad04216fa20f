"""Range-profiling sessions: ``gpuscope.Profiler``, ``gpuscope.replay``, one session per device.

Two collection modes (measured on an H100, see docs/range-profiling.md):

``"user"`` (default)
    CUPTI user ranges with user replay. Every ``gpuscope.range`` (up to ``max_depth`` levels) and every
    decorated kernel launch is a CUPTI range. A metric set that fits one pass with ``max_depth=1`` is collected
    in one continuous CUPTI pass; otherwise each execution of a top-level range is one *cycle* (CUPTI pass x
    nesting level), and ``cycles`` consecutive executions of the same top-level path make one *pass group*
    (iteration multiplexing), or :func:`replay` re-runs a callable ``cycles`` times, restoring device memory
    with the Checkpoint API in between.
``"kernel"``
    CUPTI auto ranges with kernel replay: every selected kernel launch in the session is a range, CUPTI replays
    each launch as often as the metric set needs. User ranges only name the launches' parents.
``"iteration"``
    Per-kernel metrics across repeated iterations (the repeated top-level range, or :meth:`Profiler.step`):
    pass k on the k-th iteration of a pass group, launches matched across iterations; no memory saved or
    restored (see :mod:`gpuscope._range_profiling.launches`).
``"auto"``
    ``"iteration"`` if the session first sees a top-level range. Launches outside every range before it are
    profiled by kernel replay while the launch stream is searched for a loop (:mod:`gpuscope._range_profiling.repetition`): a
    top-level range coming later switches to iteration mode over the ranges (setup launches keep their rows);
    a sequence of (kernel, grid, block) repeated three times switches to iteration mode over the iterations it
    marks; neither, and the session stays in kernel mode. ``Profiler.mode_used`` and the Dataset's ``mode``,
    ``iterations_found_by`` and per-row ``replay`` say what happened.
"""

from __future__ import annotations

import os
import threading
import time
import weakref

import numpy as np

from gpuscope._range_profiling import ranges as _ranges
from gpuscope._range_profiling.modes import Mode, PerLaunchModes, _capacity, _readable, _warn  # noqa: F401 (Mode, _capacity: API)
from gpuscope.errors import MultiPassRangeError, SessionConflictError

__all__ = ["Profiler", "Mode", "replay", "active_session"]

_active: dict[int, Profiler] = {}
_active_lock = threading.Lock()


def active_session(device: int | None = None) -> Profiler | None:
    """The open session on *device* (None: the only open session, if exactly one is open)."""
    with _active_lock:
        if device is not None:
            return _active.get(device)
        return next(iter(_active.values())) if len(_active) == 1 else None


def _check_free(device: int) -> None:
    other = _active.get(device)
    if other is not None:
        raise SessionConflictError(
            f"A gpuscope session is already open on device {device} ({other!r}). Close it first: one "
            "range-profiling session per device."
        )


class _Row:
    """What gpuscope knows about one CUPTI range beyond its counters."""

    __slots__ = ("name", "kernel", "launch", "grid", "block", "start_ns", "end_ns", "count")

    def __init__(self, name, kernel="", launch=-1, grid=None, block=None):
        self.name, self.kernel, self.launch, self.grid, self.block = name, kernel, launch, grid, block
        self.start_ns = self.end_ns = -1
        self.count = 0


#: Ranges of the counter-data image when ``max_ranges`` is not given (user and kernel modes): CUPTI's first Start
#: after Enable costs about 0.2 s with 64 ranges on an H100 and 1.3 s with 1,024 (docs/measurements.md), so the
#: image is small and emptied into rows whenever it fills.
DEFAULT_RANGES = 64


class Profiler(PerLaunchModes):
    """A range-profiling session on one GPU.

    Use it as a context manager. While it is open, ``gpuscope.range`` blocks and kernel launches on its device
    are profiled as the mode says; after it closes, :attr:`dataset` holds the results.

    Parameters
    ----------
    metrics : str or list of str
        A metric-set name from the catalog (``"launch"``, ``"speed-of-light"``, ``"topdown"``, ...) or exact
        CUPTI metric names.
    device : int
        CUDA device index.
    mode : {"user", "kernel", "iteration", "auto"}
        ``"user"``: user ranges + user replay (also for decorated kernels: one range per launch, replayed with
        checkpoint restore when the set needs several passes). ``"kernel"``: every selected launch is a range,
        CUPTI kernel replay (CUPTI saves and restores device memory for every pass: the cost grows with the
        memory the process holds). ``"iteration"``: every selected launch is a range; pass k runs on the k-th
        execution of the repeated top-level range (or between :meth:`step` calls); nothing is replayed.
        ``"auto"``: ``"iteration"`` over the top-level ranges, or over the iterations of a loop found in the launch
        stream (three repeats of the same kernels, grids and blocks); kernel replay for launches before either
        and where there is neither (module docstring).
    max_depth : int
        Range nesting levels CUPTI profiles (user mode). Each level costs one more cycle per pass; deeper
        ranges are not profiled (a warning says so).
    max_ranges : int or None
        Ranges the counter-data image holds. CUPTI's cost grows with it (on an H100 the first
        ``cuptiRangeProfilerStart`` of a profiler takes about 0.2 s with 64 ranges and 1.3 s with 1,024, and each
        range of a pass costs more), so by default (None) gpuscope keeps it small: 64 in user and kernel modes,
        emptied into rows whenever it fills (a user range path may then have rows in several ``pass_group`` values),
        and enlarged for the next pass group if a multi-pass group overflowed; in iteration mode it is sized from
        the first iteration, which runs unprofiled, to hold one iteration's launches. An explicit value fixes the
        size: what does not fit is dropped (a warning says how much).
    progress : bool or None
        Show a tqdm bar for replays; None shows it on a terminal when a replay needs more than 4 cycles.
    sample_every : int
        Profile only every k-th execution of each top-level range (user mode): the 1st, (k+1)-th, ... The
        others run unprofiled, at full speed. CUPTI costs about 1.2 ms per profiled range on an H100 (it waits
        for the GPU at range boundaries), so for short regions in a long loop this is how to keep the
        overhead small; the values describe the profiled executions (coordinate ``iterations``).
    kernels, exclude : str or list of str, optional
        Kernel and iteration modes: profile only launches whose name matches one of *kernels*, and none that
        matches *exclude*. An entry is a name (readable ``module.function``, the bare function name, or the
        raw symbol) or ``"regex:<pattern>"`` (searched in the readable name and the symbol). Launches left out
        run unprofiled, at full speed.
    launch_skip, launch_count : int
        Kernel and iteration modes: of the launches that pass the name filters, skip the first *launch_skip*
        and profile the next *launch_count* (None: all). In iteration mode they count within each iteration.
    report : bool
        Print :meth:`report` (one row per kernel or range: time, Top-Down verdict, advice) when the session
        closes.

    Attributes
    ----------
    metrics : list of str
    passes : int
        Passes the metric set needs (from the host API, known before anything runs).
    cycles : int
        Executions per pass group in user mode: ``passes * max_depth``; in iteration mode: ``passes``.
    mode_used : Mode
        The mode collecting (for ``"auto"``: the one it chose, or AUTO until it has chosen).

    Raises
    ------
    UnknownMetricError
        A metric the device's chip does not know (the message names close matches).
    SessionConflictError
        (on enter) A session is already open on this device.
    CuptiPermissionError
        This user may not read the GPU's performance counters.
    MultiPassRangeError
        (on exit) No top-level range ran often enough to fill one pass group (see the message for options).
    ValueError, TypeError
        A bad option (the message says which and what is allowed).
    """

    _fixed_ranges = _grow = False  # max_ranges given by the user; an image to enlarge before the next group
    _key, _context_id, _collector = None, 0, None
    _tracker = _end_after = None  # auto mode without ranges: the launch-stream tracker; a found iteration's last

    def __init__(self, metrics="launch", device: int = 0, *, mode="user", max_depth: int = 1,
                 max_ranges: int | None = None, progress: bool | None = None, sample_every: int = 1,
                 kernels=None, exclude=None, launch_skip: int = 0, launch_count: int | None = None,
                 report: bool = False):
        from gpuscope._gpu import catalog as _catalog
        from gpuscope._gpu import device as _device
        from gpuscope._gpu import keep as _keep
        from gpuscope._range_profiling.filters import KernelFilter, checked_int
        from gpuscope.cupti import host, profiler
        from gpuscope.cupti._types import ProfilerType

        try:
            self.mode = Mode(mode)
        except ValueError:
            raise ValueError(f"mode must be one of {[m.value for m in Mode]}, not {mode!r}") from None
        self.mode_used = self.mode
        self.max_depth = checked_int(max_depth, "max_depth")
        self.device = checked_int(device, "device", minimum=0)
        if self.mode is not Mode.USER:
            self.max_depth = 1
        self._size_from_first = max_ranges is None and self.mode in (Mode.ITERATION, Mode.AUTO)
        self._fixed_ranges = max_ranges is not None
        self.max_ranges = checked_int(DEFAULT_RANGES if max_ranges is None else max_ranges, "max_ranges",
                                      maximum=1 << 20)
        self.progress = progress
        self.sample_every = checked_int(sample_every, "sample_every")
        self.filter = KernelFilter.build(kernels, exclude, launch_skip, launch_count)
        if self.filter.active and self.mode is Mode.USER:
            raise ValueError("kernels=, exclude=, launch_skip= and launch_count= select kernel launches: use them "
                             "with mode='kernel', 'iteration' or 'auto' (user mode profiles gpuscope ranges and "
                             "decorated kernels only).")
        if self.sample_every > 1 and self.mode is not Mode.USER:
            raise ValueError("sample_every applies to mode='user'; in kernel and iteration modes use "
                             "launch_skip=/launch_count= or kernels= to profile fewer launches.")
        self._seen: dict[str, int] = {}
        self.print_report = bool(report)
        self.metric_set = metrics if isinstance(metrics, str) else ""
        _check_free(self.device)  # before any CUPTI call: CUPTI refuses them while another session is enabled
        self.device_info = _device.device_info(self.device)
        self._context = _device.PrimaryContext(self.device)
        profiler.initialize()
        try:
            self.chip = profiler.chip_name(self.device)
            resolved = _catalog.resolution(metrics, self.chip, "range")
            self.metrics, self._set_attrs = list(resolved.metrics), resolved.attrs()
            # PM sampling's availability query (it needs no context, and gpuscope keeps it per device and
            # process): the config images built from it and from the range profiler's are byte-identical on
            # GH100 (tests/unit/test_host.py).
            self._availability = profiler.pm_counter_availability(self.device)

            def make():
                h = host.ProfilerHost(self.chip, ProfilerType.RANGE_PROFILER, self._availability)
                h.add_metrics(self.metrics)
                config = h.config_image()
                config.flags.writeable = False
                return _keep.HostSetup(h, config, host.num_passes(config),
                                       {m: _properties(h, m) for m in self.metrics})

            setup = _keep.host_for(self.device, self.chip, tuple(self.metrics), make)
            self._host, self._config, self.passes = setup.host, setup.config, setup.passes
            self.properties = {m: dict(p) for m, p in setup.properties.items()}
        except BaseException:
            profiler.deinitialize()
            self._context.close()
            raise
        self.cycles = self.passes * self.max_depth
        self._state = "new"
        self._dataset = None
        self._rows: list[dict] = []
        self._notes: dict = {}

    def __repr__(self):
        mode = self.mode.value if self.mode_used is self.mode else f"{self.mode.value}->{self.mode_used.value}"
        return (f"gpuscope.Profiler(metrics={self.metric_set or self.metrics!r}, device={self.device}, "
                f"mode={mode!r}, passes={self.passes}, state={self._state!r})")

    # -- lifecycle --------------------------------------------------------------------------------------
    @property
    def continuous(self) -> bool:
        """Whether one CUPTI pass spans the whole session (kernel mode, or one cycle in user mode)."""
        return self.mode_used is Mode.KERNEL or (self.mode_used is Mode.USER and self.cycles == 1)

    @property
    def _per_launch(self) -> bool:
        return self.mode is not Mode.USER

    def start(self) -> Profiler:
        """Arm the session (``with`` does it). Raises SessionConflictError if this device has one."""
        from gpuscope.cupti import callbacks
        from gpuscope.cupti._types import ProfilerRange, ReplayMode
        from gpuscope.cupti.activity import timestamp

        if self._state != "new":
            raise SessionConflictError(f"This Profiler was already {self._state}; make a new one.")
        with _active_lock:
            _check_free(self.device)
            _active[self.device] = self
        self._thread = threading.get_ident()
        self._pid = os.getpid()
        self._stack: list[bool] = []  # per open gpuscope range: was it pushed to CUPTI?
        self._open_rows: list[_Row] = []
        self._launch = 0
        self._recorder = self._rp = self._collector = None
        self._pending = threading.local()  # decorated kernel name of the launch about to happen
        self._other_threads = weakref.WeakSet()  # threads warned about (an ended thread leaves it)
        self._iter_path = None
        self._steps = False
        self._new_group()
        self._group_index = 0
        self._iteration: dict[str, int] = {}
        try:
            self._context.make_current()
            self._context_id = self._context.unique_id()
            from gpuscope._gpu import keep as _keep
            from gpuscope._gpu import modules as _modules

            _modules.watch()  # modules loaded from here on are read (the kernel-replay cost warning)
            _keep.import_xarray_soon()  # the Dataset needs it; meanwhile CUPTI works without the GIL
            # the clock link: wall clock at a CUPTI time, so open_ranks can put ranks' start_ns on one clock
            self._notes.update(session_start_ns=int(timestamp()), wall_clock_ns=time.time_ns())
            if self.mode is Mode.USER:
                self._configure(ProfilerRange.USER, ReplayMode.USER, self.max_ranges, self.max_depth)
            elif self.mode is Mode.ITERATION:
                self._use_iteration()
            else:  # kernel, or auto until it chooses: configured here, not in a launch callback
                self._configure(ProfilerRange.AUTO, ReplayMode.KERNEL, self.max_ranges)
                if self.mode is Mode.KERNEL:
                    self._use_kernel()
            if self.mode is Mode.USER and self.continuous:
                self._rp.start()
                self._running = True
            if self._per_launch:
                self._recorder = callbacks.LaunchRecorder(self._on_enter, self._on_exit)
                if self.mode_used is Mode.ITERATION:
                    self._recorder.pause()  # launches between iterations cost nothing extra
            _ranges.add_listener(self)
        except BaseException:
            self._state = "failed"
            self._teardown()
            raise
        self._state = "open"
        return self

    def _configure(self, range_mode, replay_mode, ranges: int, depth: int = 1) -> None:
        """Make ``self._rp`` a stopped range profiler with this configuration and ``self._image`` its counter-data
        image: the one kept from an earlier session when it matches (see :mod:`gpuscope._gpu.keep`), else a new one.

        CUPTI cannot change an enabled profiler's configuration once it has collected, so a profiler this session
        already has is disabled first.
        """
        from gpuscope._gpu import keep as _keep
        from gpuscope.cupti import range_profiler

        key = (self._context.handle, tuple(self.metrics), int(range_mode), int(replay_mode), int(ranges), int(depth))
        if key == self._key:
            return
        if self._rp is not None:
            rp, self._rp = self._rp, None
            rp.close()
        kept = _keep.reuse(self.device, key, self._context_id)
        if kept is not None:
            self._rp, self._image = kept.profiler, kept.image
            self._notes["profiler_reused"] = self._notes.get("profiler_reused", 0) + 1
        else:
            self._rp = range_profiler.RangeProfiler(self._context.handle)
            self._image = self._rp.counter_data_image(self.metrics, ranges)
            self._rp.set_config(self._config, self._image, range_mode, replay_mode, ranges, depth, 1, 0, 1)
        self._key, self.max_ranges = key, int(ranges)
        if self._collector is not None:
            self._collector.rp = self._rp

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

    def close(self) -> None:
        """Stop collecting, decode, and release CUPTI (safe to call twice; ``with`` does it).

        Raises
        ------
        MultiPassRangeError
            Nothing was collected because no top-level range (or iteration) completed a pass group.
        """
        if self._state == "new":  # never started: release the context and CUPTI's initialization only
            self._state = "closed"
            self._teardown()
        if self._state != "open":
            return
        if os.getpid() != self._pid:  # a forked child: the session and its CUPTI state are the parent's
            self._state = "closed"
            return
        error = None
        clean = False  # the profiler stopped and no pass group half collected: it may be kept
        try:
            if self._stack:
                _warn(f"gpuscope.Profiler closed inside open ranges ({_ranges.current_path()!r}); they are dropped.")
            if self._recorder is not None:
                self._recorder.close()  # no launch callback from here on
            if self.mode_used is Mode.KERNEL:
                self._stop_kernel_pass()
                self._finish_kernels()
                clean = True
            elif self.mode_used is Mode.ITERATION:
                if self._tracker is not None:
                    self._end_found_iteration()
                elif self._collector.in_iteration:
                    self._end_iteration()
                clean = self._collector.group is None
                if self._tracker is not None:  # found iterations: an incomplete last group is said, never an error
                    if not clean and self._rows:
                        self._incomplete_iterations()  # warns
                    elif not clean:
                        self._collector.take_group()
                elif self._collector.group is not None or not self._rows:
                    error = self._incomplete_iterations()
            elif self.continuous and self._running:
                self._rp.stop()
                self._running = False
                self._collect(self._group_index)
                clean = True
            elif self._group_cycles:
                error = self._incomplete_group()
            else:
                clean = self.mode_used is Mode.USER
            self._report_selection()
        except BaseException:
            clean = False
            raise
        finally:
            self._teardown(keep=clean)
            self._state = "closed"
            from gpuscope._gpu import keep as _keep

            _keep.imports_done()
        if error is not None:
            raise error
        if self.print_report:
            try:
                print(self.report())
            except Exception as exc:  # a summary that cannot be made must not lose the results
                _warn(f"gpuscope.Profiler(report=True): no report ({type(exc).__name__}: {exc}); prof.dataset "
                      "holds the results.")

    def _incomplete_group(self):
        message = (
            f"The top-level range {self._group_path!r} ran {self._group_cycles} time(s), but the metric set "
            f"({len(self.metrics)} metrics, {self.passes} pass(es) x max_depth {self.max_depth}) needs "
            f"{self.cycles} executions per result. Options: re-run it with gpuscope.replay(fn, *args) or "
            "@gpuscope.range(name, replay=True) (device memory is restored between passes); run it in a loop "
            f"of at least {self.cycles} iterations (pass k runs on iteration k mod {self.cycles}); profile its "
            "kernels with @gpuscope.profile or Profiler(mode='kernel') (kernel replay); or choose a smaller "
            "metric set that needs one pass (gpuscope metrics passes ...)."
        )
        if self._rows:
            _warn(message + " The last, incomplete group was dropped.")
            return None
        return MultiPassRangeError(message)

    def _report_selection(self) -> None:
        tracker = self._tracker
        if tracker is not None:
            self._notes.setdefault("iterations_found_by", "none")
            self._notes.update(repetition_extras_inside=tracker.extras_inside, repetition_restarts=tracker.restarts)
            if not tracker.locked and self.mode_used is Mode.KERNEL and len(self._collector.selected) >= 30:
                _warn(f"No repeated sequence of launches was found in {len(self._collector.selected)} launches, so "
                      "every one was profiled by kernel replay. If the code loops, mark the loop body with "
                      "gpuscope.range('step') (or call prof.step() at each iteration) for iteration mode, which saves "
                      "and restores nothing.")
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

    def _teardown(self, keep: bool = False) -> None:
        """Release what the session holds. With *keep* (a clean close: the profiler stopped, no pass group half
        collected, the image emptied), the range profiler goes to :mod:`gpuscope._gpu.keep` for the next session."""
        from gpuscope._gpu import keep as _keep
        from gpuscope.cupti import profiler

        _ranges.remove_listener(self)
        collector = getattr(self, "_collector", None)
        started = ((getattr(self, "_running", False) and not getattr(collector, "paused", False))
                   or (getattr(collector, "in_iteration", False) and not getattr(collector, "counting", False)))
        recorder, self._recorder = getattr(self, "_recorder", None), None
        if recorder is not None:
            recorder.close()
        rp, self._rp = getattr(self, "_rp", None), None
        if rp is not None and keep and not started and _keep.enabled():
            _keep.keep(self.device, _keep.Kept(self._key, self._context_id, self._context, rp, self._config,
                                               self._image))
        else:
            if rp is not None:
                try:
                    if started:  # disabling a started range profiler breaks later sessions
                        rp.stop()
                except Exception as exc:
                    _warn(f"cuptiRangeProfilerStop during cleanup failed: {exc}")
                rp.close()
            profiler.deinitialize()
            self._context.close()
        self._running = False
        with _active_lock:
            if _active.get(self.device) is self:
                del _active[self.device]

    def __enter__(self):
        return self.start()

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()
        else:  # keep the user's exception; cleanup trouble becomes a warning
            try:
                self.close()
            except Exception as cleanup:
                _warn(f"gpuscope.Profiler cleanup after {exc_type.__name__}: {cleanup}")
        return False

    @property
    def dataset(self):
        """The results as an ``xarray.Dataset`` (dim ``range``), available once the session is closed.

        Raises
        ------
        SessionConflictError
            The session is still open (leave the ``with`` block first) or never ran.
        """
        if self._state != "closed":
            raise SessionConflictError("Profiler.dataset is ready once the session is closed (after the with block).")
        if self._dataset is None:
            from gpuscope._results import build as _results

            attrs = {"metric_set": self.metric_set, "mode": self.mode_used.value, "mode_requested": self.mode.value,
                     "passes": self.passes, "cycles": self.cycles, "max_depth": self.max_depth,
                     "sample_every": self.sample_every, "kernel_filter": self.filter.describe(), **self._set_attrs,
                     **self._notes}
            self._dataset = _results.range_dataset(self._rows, self.metrics, self.properties, self.device_info,
                                                   self.chip, attrs)
        return self._dataset

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
        if self._per_launch:
            if "/" not in path:
                self._iteration_push(path)
            return
        self._push(path, _Row(path))

    def range_pop(self, path: str) -> None:
        if os.getpid() != self._pid or self._foreign():
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
                self._rows.append(self._record(name, self._host.evaluate(image, index, self.metrics), group))
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

    def report(self, **options):
        """The readable per-kernel (and per-range) summary of :attr:`dataset` (see :func:`gpuscope.report`)."""
        from gpuscope._results.report import report

        return report(self.dataset, **options)


def _properties(host, metric: str) -> dict:
    from gpuscope._gpu import catalog as _catalog

    p = host.metric_properties(metric)
    return {"units": _catalog.units_of(_catalog.split_name(metric)[1], p.units), "description": p.description,
            "metric_type": p.metric_type.name.lower(), "hw_unit": p.hw_unit}


def _forget_sessions_in_child() -> None:
    """After ``os.fork``: the child must never drive the parent's CUPTI sessions (they stay the parent's)."""
    global _active_lock
    _active_lock = threading.Lock()
    _active.clear()


os.register_at_fork(after_in_child=_forget_sessions_in_child)


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


def replay(fn, *args, name: str | None = None, device: int | None = None, **kwargs):
    """Run a re-runnable callable once per pass of the active session, restoring device memory in between.

    ``gpuscope.replay(step, x, y)`` profiles ``step(x, y)`` as a top-level range named after the function (or
    *name*) with every metric of a multi-pass set: the first run's device memory is saved with the CUPTI
    Checkpoint API and restored before each later run, so the kernels see the same inputs each pass. Without
    an active session it just calls ``fn``.

    Returns
    -------
    object
        What the last run of *fn* returned.

    Raises
    ------
    SessionConflictError
        Called inside an open range, or while a loop's pass group is incomplete.
    """
    session = active_session(device)
    if session is None:
        return fn(*args, **kwargs)
    return session.replay(fn, *args, name=name, **kwargs)


_ranges.set_replay(replay)  # @gpuscope.range(replay=True) runs through it
