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
    a sequence of (kernel, grid, block) repeated three times (twice if long, of many kernels) switches to
    iteration mode over the iterations it marks; neither, and the session stays in kernel mode.
    ``Profiler.mode_used`` and the Dataset's ``mode``, ``iterations_found_by`` and per-row ``replay`` say what
    happened.

This module holds the session's options, its start, the registry of open sessions and the Dataset; what the
session does before it collects (device, config image, the first Start beside the caller's code) is
:mod:`gpuscope._range_profiling.setup`'s, what it does at its close :mod:`gpuscope._range_profiling.close`'s; user
ranges, pass groups and user replay are :mod:`gpuscope._range_profiling.user`'s, kernel, iteration and auto modes
:mod:`gpuscope._range_profiling.modes`', all mixed into :class:`Profiler`.
"""

from __future__ import annotations

import os
import threading
import weakref

from gpuscope._range_profiling import ranges as _ranges
from gpuscope._range_profiling.close import SessionClose
from gpuscope._range_profiling.graphs import GraphKernels
from gpuscope._range_profiling.modes import Mode, PerLaunchModes, _capacity, _warn  # noqa: F401 (Mode, _capacity: API)
from gpuscope._range_profiling.setup import SessionSetup
from gpuscope._range_profiling.user import UserRanges, _Row
from gpuscope.errors import SessionConflictError

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


#: Ranges of the counter-data image when ``max_ranges`` is not given (user and kernel modes): CUPTI's first Start
#: after Enable costs about 0.2 s with 64 ranges on an H100 and 1.3 s with 1,024 (docs/measurements.md), so the
#: image is small and emptied into rows whenever it fills.
DEFAULT_RANGES = 64


class Profiler(SessionSetup, SessionClose, UserRanges, PerLaunchModes):
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
    nvtx : bool, str or list of str, optional
        Take the process's NVTX ranges (``torch.cuda.nvtx.range``, ``nvtx.annotate``) as ``gpuscope.range`` blocks
        of the same names: True for all, or ``[domain@]glob`` patterns matched against the NVTX path (``"step"``,
        ``"*/forward"``, ``"NVTX@step"``; a pattern also selects the ranges nested in what it matches). NVTX must
        reach CUPTI: call :func:`gpuscope.enable_nvtx` at the top of the script (docs/range-profiling.md).
    nvtx_exclude : str or list of str, optional
        NVTX ranges never taken (same patterns); given alone, every other NVTX range is taken.
    pass_groups : None, "cupti" or list of lists of str
        How metrics are split into passes. None (default): where the list holds warp-stall shares (the
        ``topdown`` set), gpuscope's consistent plan (:mod:`gpuscope._gpu.pass_plan`): each share's counters in
        one pass, and no share in the first pass, which under kernel replay is the only one not replayed; the
        shares of kernels of a few microseconds then add up to 100% of warp-active cycles and agree with ncu
        (``docs/topdown.md``). ``"ncu"``: Nsight Compute's own pass layout (measured on GH100: H100, H200), each
        share its stall counter over a warp-active count of another pass, as ncu computes it: to compare with ncu
        launch by launch, its inconsistencies on kernels under about 20 us included (their shares then need not
        add up to 100%). ``"cupti"``: CUPTI schedules the list as it likes. A list of lists: each list is a pass
        group CUPTI schedules on its own (metrics in no list form one more group).
    first_start_beside : bool
        Kernel and auto modes: make CUPTI's counter-availability query (the first session of the process), the
        range profiler's Enable and its first ``cuptiRangeProfilerStart`` (0.25-0.4 s of CUPTI, without the GIL)
        on a thread, so that the code after :meth:`start` runs meanwhile; the first launch, range or close waits
        for it. With a set's name (``"topdown"``) and the default pass plan, the constructor's own work goes to a
        thread too: CUDA's initialisation, the primary context, CUPTI's profiler and the config image (0.4-0.6 s on
        an H100), so that neither the constructor nor :meth:`start` makes a CUDA call on the caller's thread, and
        ``chip``, ``metrics``, ``passes`` and ``properties`` are filled once it ends (None or empty before). A
        metric list, another pass layout, or a name that is no set's is checked on the caller's thread as
        without this option, so that a wrong name is said at once. What CUDA or CUPTI refuses on the threads is
        warned at the first launch, nothing is profiled, and :meth:`close` raises it. ``gpuscope run`` sets it
        (``GPUSCOPE_FIRST_START_BESIDE=0`` does not). Other threads' launches never wait for it: they run
        unprofiled until it has started (``launches_before_start``).
    graphs : {"node", "graph"}
        Kernel, iteration and auto modes, CUDA graph launches (JAX's steps, ``torch.cuda.CUDAGraph.replay``,
        ``torch.compile(mode="reduce-overhead")``): ``"node"`` profiles each kernel node as a launch, one row each
        with ``graph_exec``, ``graph_launch`` and ``graph_node`` (as ``ncu --graph-profiling node``); ``"graph"``
        gives each graph launch one row, its nodes' counters added and rates weighted by duration (as ``ncu
        --graph-profiling graph``). Graphs instantiated before the session (or ``gpuscope.watch_graphs()``) are
        unknown to gpuscope and run as they are (docs/graphs.md).

    Attributes
    ----------
    metrics : list of str
    passes : int
        Passes the metric set needs (from the host API, known before anything runs; None while the setup of
        ``first_start_beside`` runs on its thread).
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
    NvtxUnavailableError
        NVTX ranges were asked for, but ``NVTX_INJECTION64_PATH`` does not route NVTX to gpuscope's CUPTI.
    ValueError, TypeError
        A bad option (the message says which and what is allowed).
    """

    _fixed_ranges = _grow = False  # max_ranges given by the user; an image to enlarge before the next group
    _key, _context_id, _collector = None, 0, None
    _reused_now = False  # the profiler of the last _configure was a kept one
    _tracker = _end_after = None  # auto mode without ranges: the launch-stream tracker; a found iteration's last
    _nvtx = None  # the NVTX ranges taken while open (nvtx.NvtxRanges)
    #: The constructor's ``first_start_beside`` (stand-in sessions of the tests set it on the class's instances).
    first_start_beside = False
    _first_thread = _first_error = None  # the thread of that Start, and what it raised
    _first_began = _first_taken = False  # a pass started beside; kernel replay took it as its first
    _unchecked = False  # the config was made without the availability query, left to the first Start's thread
    _setup_thread = _setup_error = None  # the constructor's work left to a thread (_set_up_beside), what it raised

    def __init__(self, metrics="launch", device: int = 0, *, mode="user", max_depth: int = 1,
                 max_ranges: int | None = None, progress: bool | None = None, sample_every: int = 1,
                 kernels=None, exclude=None, launch_skip: int = 0, launch_count: int | None = None,
                 report: bool = False, pass_groups=None, nvtx=None, nvtx_exclude=None,
                 first_start_beside: bool = False, graphs: str = "node"):
        from gpuscope._range_profiling import nvtx as _nvtx
        from gpuscope._range_profiling.filters import KernelFilter, checked_int
        from gpuscope.cupti import _lib

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
        from gpuscope._range_profiling.graph_replay import GRAPH_MODES

        if graphs not in GRAPH_MODES:
            raise ValueError(f"graphs must be one of {list(GRAPH_MODES)} (a CUDA graph's kernel nodes one row each, or "
                             f"each graph launch one row), not {graphs!r}")
        self.graphs = graphs
        self._nvtx_filter = _nvtx.NvtxFilter.build(nvtx, nvtx_exclude)
        self._seen: dict[str, int] = {}
        self.print_report = bool(report)
        self.metric_set = metrics if isinstance(metrics, str) else ""
        self.first_start_beside = bool(first_start_beside)
        _check_free(self.device)  # before any CUPTI call: CUPTI refuses them while another session is enabled
        _lib.load_soon()  # libcupti is found and loaded while CUDA initialises
        if self._set_up_beside(metrics, pass_groups):
            # CUDA's initialisation, CUPTI's queries and the config image on a thread, while the caller's code
            # starts: the first Start's thread (start()) waits for them, and so the first launch, range or close
            self.device_info = self.chip = self._context = None
            self.metrics, self._set_attrs, self.properties = [], {}, {}
            self.passes = self.cycles = None
            self._setup_thread = threading.Thread(target=self._setup_quietly, args=(metrics, pass_groups),
                                                  name="gpuscope-setup", daemon=True)
            self._setup_thread.start()
        else:
            self._setup(metrics, pass_groups)
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
        from gpuscope._gpu import keep as _keep
        from gpuscope.cupti import callbacks
        from gpuscope.cupti._types import ProfilerRange, ReplayMode

        if self._state != "new":
            raise SessionConflictError(f"This Profiler was already {self._state}; make a new one.")
        with _active_lock:
            _check_free(self.device)
            _active[self.device] = self
        beside = self._setup_thread is not None  # the device and its context are the setup thread's to make
        if not beside:  # else on the first Start's thread (the rendezvous is named by the GPU's PCI id: cuInit)
            self._hold_counters()
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
            if not beside:
                self._made_current()
            from gpuscope._gpu import modules as _modules

            _modules.watch()  # modules loaded while a session is open are read (the kernel-replay cost warning)
            _keep.import_xarray_soon()  # the Dataset needs it; meanwhile CUPTI works without the GIL
            if self.mode is Mode.USER:
                self._configure(ProfilerRange.USER, ReplayMode.USER, self.max_ranges, self.max_depth)
            elif self.mode is Mode.ITERATION:
                self._use_iteration()
            else:  # kernel, or auto until it chooses: configured here (or on the first Start's thread), not in a
                # launch callback
                kernel_replay = (ProfilerRange.AUTO, ReplayMode.KERNEL, self.max_ranges)
                if self._start_beside:
                    self._start_first_soon(kernel_replay)
                else:
                    self._configure(*kernel_replay)
                if self.mode is Mode.KERNEL and beside:
                    self.mode_used = Mode.KERNEL  # the first Start's thread makes the collector (it needs the context)
                elif self.mode is Mode.KERNEL:
                    self._use_kernel()
            if self.mode is Mode.USER and self.continuous:
                self._start_first()
                self._running = True
            if self._per_launch:
                from gpuscope._gpu import graph_nodes as _graph_nodes
                from gpuscope._range_profiling.graph_replay import GraphReplay

                why = _graph_nodes.watch()  # graphs instantiated from here on can be run node by node
                if not why:
                    self._graph_replay = GraphReplay(lambda: self._context.handle)
                self._graphs = GraphKernels(records=self.mode is not Mode.ITERATION)
                self._recorder = callbacks.LaunchRecorder(self._on_enter, self._on_exit, self._on_graph,
                                                          self._on_graph_exit, self._on_lost)
                if self.mode_used is Mode.ITERATION:
                    self._recorder.pause()  # launches between iterations cost nothing extra
            _ranges.add_listener(self)
            if self._nvtx_filter is not None:
                from gpuscope._range_profiling.nvtx import NvtxRanges

                self._nvtx = NvtxRanges(self, self._nvtx_filter)
        except BaseException as exc:
            self._state = "failed"
            cause = self._setup_failure() if isinstance(exc, Exception) else None
            self._teardown()
            if cause is not None:  # what made the rest fail (without a driver, CUPTI's callbacks say only UNKNOWN)
                raise cause from None
            raise
        self._state = "open"
        return self

    def _unregister(self) -> bool:
        """This session off the registry of open sessions; whether it was the last one open."""
        with _active_lock:
            if _active.get(self.device) is self:
                del _active[self.device]
            return not _active

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
        if self._setup_error is not None:  # no device, chip or metrics to describe (first_start_beside)
            raise SessionConflictError(f"The session could not be set up ({self._setup_error}), so it has no "
                                       "Dataset: nothing was profiled.")
        if self._dataset is None:
            self._dataset = build_dataset(self.dataset_inputs())
        return self._dataset

    def dataset_inputs(self) -> dict:
        """What :attr:`dataset` is built from, as plain picklable data (:func:`build_dataset`): ``gpuscope run``
        builds the Dataset in a process of its own (:mod:`gpuscope._commands.results_worker`)."""
        if self._state != "closed":
            raise SessionConflictError("Profiler.dataset is ready once the session is closed (after the with block).")
        records = self._rows
        if self.graphs == "graph" and any(r.get("graph_launch", -1) >= 0 for r in records):
            from gpuscope._range_profiling.graph_replay import combine_graph_rows

            records = combine_graph_rows(records, list(self.metrics))
        attrs = {"metric_set": self.metric_set, "mode": self.mode_used.value, "mode_requested": self.mode.value,
                 "passes": self.passes, "cycles": self.cycles, "max_depth": self.max_depth,
                 "sample_every": self.sample_every, "kernel_filter": self.filter.describe(), **self._set_attrs,
                 **self._notes}
        if self._plan is not None:
            attrs.update(self._plan.attrs())
        elif self._groups:
            attrs.update(pass_plan="given", pass_groups=[", ".join(g) for g in self._groups])
        else:
            attrs["pass_plan"] = "cupti"
        from gpuscope._results.build import _pm_device_attrs

        return {"records": records, "metrics": list(self.metrics), "properties": self.properties,
                "device_info": self.device_info, "chip": self.chip, "attrs": attrs,
                "device_attrs": _pm_device_attrs(self.device_info, self.chip),
                "formulas": self._plan.formulas() if self._plan is not None else {}}

    def report(self, **options):
        """The readable per-kernel (and per-range) summary of :attr:`dataset` (see :func:`gpuscope.report`)."""
        from gpuscope._results.report import report

        return report(self.dataset, **options)


def build_dataset(inputs: dict):
    """The range Dataset of :meth:`Profiler.dataset_inputs` (what :attr:`Profiler.dataset` returns)."""
    from gpuscope._results import build as _results

    ds = _results.range_dataset(inputs["records"], inputs["metrics"], inputs["properties"], inputs["device_info"],
                                inputs["chip"], inputs["attrs"], inputs.get("device_attrs"))
    for name, formula in inputs["formulas"].items():
        if name in ds:
            ds[name].attrs["formula"] = formula
    return ds


def _forget_sessions_in_child() -> None:
    """After ``os.fork``: the child must never drive the parent's CUPTI sessions (they stay the parent's)."""
    global _active_lock
    _active_lock = threading.Lock()
    _active.clear()


os.register_at_fork(after_in_child=_forget_sessions_in_child)


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
