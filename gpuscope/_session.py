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
    CUPTI auto ranges with kernel replay: every kernel launched in the session is a range, CUPTI replays each
    launch as often as the metric set needs. User ranges only name the launches' parents.
"""

from __future__ import annotations

import enum
import threading
import warnings

import numpy as np

from . import _ranges
from .errors import GpuscopeWarning, MultiPassRangeError, SessionConflictError

__all__ = ["Profiler", "Mode", "replay", "active_session"]

_active: dict[int, Profiler] = {}
_active_lock = threading.Lock()


class Mode(str, enum.Enum):
    """How a :class:`Profiler` collects: ``"user"`` ranges with user replay, or ``"kernel"`` auto ranges."""

    USER = "user"
    KERNEL = "kernel"


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


def _warn(message: str) -> None:
    warnings.warn(message, GpuscopeWarning, stacklevel=3)


class _Row:
    """What gpuscope knows about one CUPTI range beyond its counters."""

    __slots__ = ("name", "kernel", "launch", "grid", "block", "start_ns", "end_ns", "count")

    def __init__(self, name, kernel="", launch=-1, grid=None, block=None):
        self.name, self.kernel, self.launch, self.grid, self.block = name, kernel, launch, grid, block
        self.start_ns = self.end_ns = -1
        self.count = 0


class Profiler:
    """A range-profiling session on one GPU.

    Use it as a context manager. While it is open, ``gpuscope.range`` blocks and ``@gpuscope.profile``
    kernels on its device are profiled; after it closes, :attr:`dataset` holds the results.

    Parameters
    ----------
    metrics : str or list of str
        A metric-set name from the catalog (``"launch"``, ``"speed-of-light"``, ``"topdown"``, ...) or exact
        CUPTI metric names.
    device : int
        CUDA device index.
    mode : {"user", "kernel"}
        ``"user"``: user ranges + user replay (also for decorated kernels: one range per launch, replayed with
        checkpoint restore when the set needs several passes). ``"kernel"``: CUPTI auto ranges + kernel replay.
    max_depth : int
        Range nesting levels CUPTI profiles (user mode). Each level costs one more cycle per pass; deeper
        ranges are not profiled (a warning says so).
    max_ranges : int
        Ranges the counter-data image holds per pass group (its size grows with it).
    progress : bool or None
        Show a tqdm bar for replays; None shows it on a terminal when a replay needs more than 4 cycles.
    sample_every : int
        Profile only every k-th execution of each top-level range (user mode): the 1st, (k+1)-th, ... The
        others run unprofiled, at full speed. CUPTI costs about 1.2 ms per profiled range on an H100 (it waits
        for the GPU at range boundaries), so for short regions in a long loop this is how to keep the
        overhead small; the values describe the profiled executions (coordinate ``iterations``).

    Attributes
    ----------
    metrics : list of str
    passes : int
        Passes the metric set needs (from the host API, known before anything runs).
    cycles : int
        Executions per pass group in user mode: ``passes * max_depth``.

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
    """

    def __init__(self, metrics="launch", device: int = 0, *, mode="user", max_depth: int = 1,
                 max_ranges: int = 1024, progress: bool | None = None, sample_every: int = 1):
        from . import _catalog, _device
        from .cupti import host, profiler
        from .cupti._types import ProfilerType

        self.mode = Mode(mode)
        if int(max_depth) < 1:
            raise ValueError(f"max_depth must be at least 1, not {max_depth}")
        self.device = int(device)
        self.max_depth = 1 if self.mode is Mode.KERNEL else int(max_depth)
        self.max_ranges = int(max_ranges)
        self.progress = progress
        if int(sample_every) < 1:
            raise ValueError(f"sample_every must be at least 1, not {sample_every}")
        self.sample_every = int(sample_every)
        self._seen: dict[str, int] = {}
        self.metric_set = metrics if isinstance(metrics, str) else ""
        _check_free(self.device)  # before any CUPTI call: CUPTI refuses them while another session is enabled
        self.device_info = _device.device_info(self.device)
        self._context = _device.PrimaryContext(self.device)
        profiler.initialize()
        try:
            self.chip = profiler.chip_name(self.device)
            self.metrics = _catalog.resolve(metrics, self.chip, "range")
            self._availability = profiler.counter_availability(self._context.handle)
            self._host = host.ProfilerHost(self.chip, ProfilerType.RANGE_PROFILER, self._availability)
            self._host.add_metrics(self.metrics)
            self._config = self._host.config_image()
            self.passes = host.num_passes(self._config)
            self.properties = {m: self._properties(m) for m in self.metrics}
        except BaseException:
            profiler.deinitialize()
            self._context.close()
            raise
        self.cycles = self.passes * self.max_depth
        self._state = "new"
        self._dataset = None
        self._rows: list[dict] = []

    def _properties(self, metric: str) -> dict:
        from . import _catalog

        p = self._host.metric_properties(metric)
        return {"units": _catalog.units_of(_catalog.split_name(metric)[1], p.units), "description": p.description, "metric_type": p.metric_type.name.lower(),
                "hw_unit": p.hw_unit}

    def __repr__(self):
        return (f"gpuscope.Profiler(metrics={self.metric_set or self.metrics!r}, device={self.device}, "
                f"mode={self.mode.value!r}, passes={self.passes}, state={self._state!r})")

    # -- lifecycle --------------------------------------------------------------------------------------
    @property
    def continuous(self) -> bool:
        """Whether one CUPTI pass spans the whole session (kernel mode, or one cycle in user mode)."""
        return self.mode is Mode.KERNEL or self.cycles == 1

    def start(self) -> Profiler:
        """Arm the session (``with`` does it). Raises SessionConflictError if this device has one."""
        from .cupti import callbacks, range_profiler
        from .cupti._types import ProfilerRange, ReplayMode

        if self._state != "new":
            raise SessionConflictError(f"This Profiler was already {self._state}; make a new one.")
        with _active_lock:
            _check_free(self.device)
            _active[self.device] = self
        self._thread = threading.get_ident()
        self._stack: list[bool] = []  # per open gpuscope range: was it pushed to CUPTI?
        self._open_rows: list[_Row] = []
        self._launch = 0
        self._recorder = self._rp = None
        try:
            self._context.make_current()
            self._rp = range_profiler.RangeProfiler(self._context.handle)
            self._image = self._rp.counter_data_image(self.metrics, self.max_ranges)
            if self.mode is Mode.KERNEL:
                self._recorder = callbacks.LaunchRecorder(annotate=self._annotate)
                self._pending_kernel = None
                self._rp.set_config(self._config, self._image, ProfilerRange.AUTO, ReplayMode.KERNEL, self.max_ranges)
            else:
                self._rp.set_config(self._config, self._image, ProfilerRange.USER, ReplayMode.USER, self.max_ranges,
                                    self.max_depth, 1, 0, 1)
            self._new_group()
            self._group_index = 0
            self._iteration: dict[str, int] = {}
            if self.continuous:
                self._rp.start()
                self._running = True
            _ranges.add_listener(self)
        except BaseException:
            self._state = "failed"
            self._teardown()
            raise
        self._state = "open"
        return self

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
            Nothing was collected because no top-level range completed a pass group.
        """
        if self._state == "new":  # never started: release the context and CUPTI's initialization only
            self._state = "closed"
            self._teardown()
        if self._state != "open":
            return
        error = None
        try:
            if self._stack:
                _warn(f"gpuscope.Profiler closed inside open ranges ({_ranges.current_path()!r}); they are dropped.")
            if self.continuous and self._running:
                self._rp.stop()
                self._running = False
                self._collect(self._group_index)
            elif self._group_cycles:
                error = self._incomplete_group()
        finally:
            self._teardown()
            self._state = "closed"
        if error is not None:
            raise error

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

    def _teardown(self) -> None:
        from .cupti import profiler

        _ranges.remove_listener(self)
        for name in ("_recorder", "_rp"):
            obj = getattr(self, name, None)
            if obj is not None:
                try:
                    if name == "_rp" and getattr(self, "_running", False):
                        obj.stop()
                except Exception as exc:
                    _warn(f"cuptiRangeProfilerStop during cleanup failed: {exc}")
                obj.close()
                setattr(self, name, None)
        self._running = False
        self._host.close()
        profiler.deinitialize()
        self._context.close()
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
            from . import _results

            attrs = {"metric_set": self.metric_set, "mode": self.mode.value, "passes": self.passes,
                     "cycles": self.cycles, "max_depth": self.max_depth, "sample_every": self.sample_every}
            self._dataset = _results.range_dataset(self._rows, self.metrics, self.properties, self.device_info,
                                                   self.chip, attrs)
        return self._dataset

    # -- the range listener (user mode) -----------------------------------------------------------------
    def range_push(self, path: str) -> None:
        if threading.get_ident() != self._thread or self.mode is Mode.KERNEL:
            return
        self._push(path, _Row(path))

    def range_pop(self, path: str) -> None:
        if threading.get_ident() != self._thread or self.mode is Mode.KERNEL:
            return
        self._pop(path)

    def _push(self, path: str, row: _Row, cupti_name: str | None = None) -> None:
        depth = path.count("/") + 1
        forward = depth <= self.max_depth and (not self._stack or self._stack[-1])
        if forward and depth == 1 and self.sample_every > 1:
            seen = self._seen[path] = self._seen.get(path, 0) + 1
            forward = (seen - 1) % self.sample_every == 0
        if forward and depth == 1 and not self.continuous:
            forward = self._begin_cycle(path)
        elif depth > self.max_depth and not getattr(self, "_warned_depth", False):
            self._warned_depth = True
            _warn(f"Range {path!r} is deeper than max_depth={self.max_depth} and is not profiled. Pass "
                  f"gpuscope.Profiler(max_depth={depth}) to profile it (each level needs one more cycle per pass).")
        self._stack.append(forward)
        if not forward:
            return
        self._rp.push_range(cupti_name or path.rsplit("/", 1)[-1])
        self._cycle_pushes += 1
        key = path if cupti_name is None else f"{path.rsplit('/', 1)[0]}/{cupti_name}" if depth > 1 else cupti_name
        known = self._group_rows.setdefault(key, row)
        if known.start_ns < 0:
            from .cupti.activity import timestamp

            known.start_ns = timestamp()
        known.count += 1
        self._open_rows.append(known)

    def _pop(self, path: str) -> None:
        if not self._stack:
            return
        forward = self._stack.pop()
        if not forward:
            return
        from .cupti.activity import timestamp

        row = self._open_rows.pop()
        if self.continuous or row.count == 1:
            row.end_ns = timestamp()
        self._rp.pop_range()
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

    def _collect(self, group: int) -> None:
        """Decode the finished pass group, evaluate its ranges and keep them as rows."""
        from .cupti import range_profiler

        dropped = self._rp.decode()
        if dropped:
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

    def _record(self, cupti_name: str, values, group: int) -> dict:
        if self.mode is Mode.KERNEL:
            return self._kernel_record(int(cupti_name), values)
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

    # -- kernels ----------------------------------------------------------------------------------------
    def _annotate(self):
        """Called by the launch recorder for every launch (kernel mode): parent path and decorated name."""
        name, self._pending_kernel = self._pending_kernel, None
        return (_ranges.current_path() or "", name)

    def _kernel_record(self, index: int, values) -> dict:
        launches = self._launches
        if index < len(launches):
            launch = launches[index]
            parent, label = launch.tag or ("", None)
            kernel = label or launch.symbol
            info = dict(kernel=kernel, grid=launch.grid, block=launch.block, start_ns=launch.enter_ns,
                        end_ns=launch.exit_ns)
        else:
            parent, kernel, info = "", str(index), {}
        name = f"{parent}/{kernel}" if parent else kernel
        return {"name": name, "depth": name.count("/") + 1, "parent": parent, "launch": index, "pass_group": 0,
                "first_iteration": 0, "iterations": 1, "values": values, **info}

    @property
    def _launches(self):
        if not hasattr(self, "_launch_list"):
            self._launch_list = self._recorder.take() if self._recorder is not None else []
        return self._launch_list

    def launch(self, kernel: str, grid, block, run):
        """Run one decorated kernel launch *run()* as a profiled range (used by ``gpuscope.profile``)."""
        if threading.get_ident() != self._thread:
            return run()
        if self.mode is Mode.KERNEL:
            self._pending_kernel = kernel
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

        Returns what the last run returned. With a one-cycle set, *fn* runs once.

        Raises
        ------
        SessionConflictError
            Called inside an open range, or from another thread than the session's.
        """
        from .cupti.checkpoint import Checkpoint

        name = name or getattr(fn, "__qualname__", "replay")
        if self.mode is Mode.KERNEL or self.continuous:
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

