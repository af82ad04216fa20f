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

This module holds the session's options, lifecycle (start, close, the kept profiler) and Dataset; user ranges,
pass groups and user replay are :mod:`gpuscope._range_profiling.user`'s, kernel, iteration and auto modes
:mod:`gpuscope._range_profiling.modes`', both mixed into :class:`Profiler`.
"""

from __future__ import annotations

import os
import threading
import time
import weakref

from gpuscope._range_profiling import ranges as _ranges
from gpuscope._range_profiling.graphs import GraphKernels
from gpuscope._range_profiling.modes import Mode, PerLaunchModes, _capacity, _readable, _warn  # noqa: F401 (Mode, _capacity: API)
from gpuscope._range_profiling.user import UserRanges, _Row
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


#: Ranges of the counter-data image when ``max_ranges`` is not given (user and kernel modes): CUPTI's first Start
#: after Enable costs about 0.2 s with 64 ranges on an H100 and 1.3 s with 1,024 (docs/measurements.md), so the
#: image is small and emptied into rows whenever it fills.
DEFAULT_RANGES = 64


class Profiler(UserRanges, PerLaunchModes):
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

    def _set_up_beside(self, metrics, pass_groups) -> bool:
        """Whether the constructor leaves the rest of its work to a thread (:attr:`first_start_beside`, kernel and
        auto modes): only for a named set of gpuscope's with the default pass plan, whose names need no chip to
        be right, so that a typo in a metric name is still said before the caller's code runs."""
        from gpuscope._gpu import metric_lists as _lists

        return (self._start_beside and pass_groups is None and isinstance(metrics, str)
                and metrics in _lists.metric_sets("range"))

    @property
    def _start_beside(self) -> bool:
        """Whether the first Start is made on a thread beside the caller's code (:attr:`first_start_beside`: kernel
        and auto modes, without NVTX ranges)."""
        return self.first_start_beside and self.mode in (Mode.KERNEL, Mode.AUTO) and self._nvtx_filter is None

    def _setup_quietly(self, metrics, pass_groups) -> None:
        try:
            self._setup(metrics, pass_groups)
        except BaseException as exc:  # noqa: BLE001  said where the session is next used (the first Start's thread)
            self._setup_error = exc

    def _setup_waited(self) -> BaseException | None:
        """Wait for the constructor's work left to a thread, if any; what it raised (None: nothing)."""
        if self._setup_thread is not None:
            self._setup_thread.join()
        return self._setup_error

    def _set_up(self) -> None:
        """Wait for the constructor's work left to a thread, if any; raise what it raised."""
        if (error := self._setup_waited()) is not None:
            raise error

    def _setup(self, metrics, pass_groups) -> None:
        """The device, its primary context, CUPTI's profiler and the session's metrics, passes and config image
        (on the caller's thread, or on one beside it: :meth:`_set_up_beside`)."""
        from gpuscope._gpu import device as _device
        from gpuscope._gpu import keep as _keep
        from gpuscope._gpu import metric_lists as _lists
        from gpuscope._range_profiling import nvtx as _nvtx
        from gpuscope.cupti import profiler

        self.device_info = _device.device_info(self.device)
        context = _device.PrimaryContext(self.device)
        try:
            profiler.initialize(context.handle)
        except BaseException:
            context.close()
            raise
        self._context = context
        try:
            if self._nvtx_filter is not None:
                _nvtx.check_injection()
            self.chip = profiler.chip_name(self.device)
            resolved = _lists.resolution(metrics, self.chip, "range")
            self.metrics, self._set_attrs = list(resolved.metrics), resolved.attrs()
            # PM sampling's availability query (it needs no context, and gpuscope keeps it per device and
            # process): the config images built from it and from the range profiler's are byte-identical on
            # GH100 (tests/unit/test_host.py). Another process holding the counters makes it HARDWARE_BUSY.
            # With the first Start beside the caller's code, no image kept yet and this made on the caller's thread,
            # the query (0.1-0.16 s) is made on the first Start's thread instead, and the config built here without
            # it is checked there before the Enable.
            self._unchecked = (self._start_beside and self._setup_thread is None
                               and not profiler.availability_cached(self.device))
            if self._unchecked:
                self._availability = None
            else:
                if profiler.availability_cached(self.device):
                    _keep.ask_holders(self.device)  # the cache asks CUPTI nothing, so nothing would fail busy here
                self._availability = self._query_availability()

            self._plan, self._groups = None, ()
            if pass_groups is None:
                self._plan = _lists.consistent_plan(tuple(self.metrics), self.chip)
                self._groups = self._plan.groups if self._plan is not None else ()
            elif pass_groups == "ncu":
                self._plan = _lists.ncu_layout_plan(tuple(self.metrics), self.chip)
                self._groups = self._plan.groups
            elif pass_groups != "cupti":
                self._groups = _lists.checked_groups(pass_groups, self.metrics)
            if self._plan is not None:
                self.metrics = list(self._plan.requested)  # with the per-pass clocks, so that the Dataset has them

            if self._unchecked:  # not kept for other sessions until checked against the device's counters
                setup = self._host_setup(None)
            else:
                setup = _keep.host_for(self.device, self.chip, (tuple(self.metrics), self._groups),
                                       lambda: self._host_setup(self._availability))
            self._host, self._config, self.passes = setup.host, setup.config, setup.passes
            self.properties = {m: dict(p) for m, p in setup.properties.items()}
        except BaseException:
            self._context = None
            profiler.deinitialize()
            context.close()
            raise
        self.cycles = self.passes * self.max_depth

    def _query_availability(self):
        """PM sampling's counter-availability image of the device (kept per device and process); another process
        holding the counters is asked to give them back first (:func:`gpuscope._gpu.keep.retry_when_busy`)."""
        from gpuscope._gpu import keep as _keep
        from gpuscope.cupti import profiler

        return _keep.retry_when_busy(self.device, lambda: profiler.pm_counter_availability(self.device),
                                     _keep.RANGE_SESSION)

    def _host_setup(self, availability, properties: dict | None = None):
        """The CUPTI host object, config image, pass count and metric properties of this session's metrics (the
        *properties* given, where they are known already: they do not depend on the availability image)."""
        from gpuscope._gpu import keep as _keep
        from gpuscope.cupti import host
        from gpuscope.cupti._types import ProfilerType

        h = host.ProfilerHost(self.chip, ProfilerType.RANGE_PROFILER, availability)
        if self._groups:
            for group in self._groups:
                h.add_pass_group(group)
        else:
            h.add_metrics(self.metrics)
        config = h.config_image()
        config.flags.writeable = False
        if properties is None:
            properties = {m: _properties(h, m) for m in self.metrics}
        return _keep.HostSetup(h, config, host.num_passes(config), properties)

    def _check_availability(self) -> None:
        """On the first Start's thread, before the Enable: the availability query the constructor left to it
        (:attr:`first_start_beside`), and the config image made with its answer. Where that image differs from the
        one made without it (a counter the device cannot give), the session takes it and its pass count; either
        way, it is what later sessions of the process reuse."""
        from gpuscope._gpu import keep as _keep

        if not self._unchecked:
            return
        self._availability = self._query_availability()
        checked = self._host_setup(self._availability, {m: dict(p) for m, p in self.properties.items()})
        self._unchecked = False
        if bytes(checked.config) != bytes(self._config):
            self._host, self._config, self.passes = checked.host, checked.config, checked.passes
            self.cycles = self.passes * self.max_depth
            self._notes["config_changed_by_availability"] = 1
        _keep.host_for(self.device, self.chip, (tuple(self.metrics), self._groups), lambda: checked)

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

    def _setup_failure(self) -> BaseException | None:
        """What the setup made beside the code raised, waited for (None: it did not fail, or there is none); the
        first Start's thread, which raised it again, is then ended without its warning: start() raises it."""
        if self._setup_waited() is None:
            return None
        if self._first_thread is not None:
            self._first_thread.join()
            self._first_thread, self._first_began = None, False
        return self._setup_error

    def _hold_counters(self) -> None:
        """Until :meth:`_teardown`, other gpuscope processes that ask for the device's counters are told a session is
        open (:func:`gpuscope._gpu.keep.session_open`)."""
        from gpuscope._gpu import keep as _keep

        _keep.session_open(self.device, _keep.RANGE_SESSION)
        self._holding = True

    def _made_current(self) -> None:
        """The context current on this thread; its id, and the clock link of the session's start: the wall clock at a
        CUPTI time, so that open_ranks can put ranks' start_ns on one clock."""
        from gpuscope.cupti.activity import timestamp

        self._context.make_current()
        self._context_id = self._context.unique_id()
        self._notes.update(session_start_ns=int(timestamp()), wall_clock_ns=time.time_ns())

    def _configure(self, range_mode, replay_mode, ranges: int, depth: int = 1) -> None:
        """Make ``self._rp`` a stopped range profiler with this configuration and ``self._image`` its counter-data
        image: the one kept from an earlier session when it matches (see :mod:`gpuscope._gpu.keep`), else a new one.

        CUPTI cannot change an enabled profiler's configuration once it has collected, so a profiler this session
        already has is disabled first.
        """
        from gpuscope._gpu import keep as _keep
        from gpuscope.cupti import range_profiler

        key = (self._context.handle, tuple(self.metrics), self._groups, int(range_mode), int(replay_mode), int(ranges), int(depth))
        if key == self._key:
            return
        if self._rp is not None:
            rp, self._rp = self._rp, None
            rp.close()
        kept = _keep.reuse(self.device, key, self._context_id)
        self._configured, self._reused_now = (range_mode, replay_mode, ranges, depth), kept is not None
        if kept is not None:
            self._rp, self._image = kept.profiler, kept.image
            self._notes["profiler_reused"] = self._notes.get("profiler_reused", 0) + 1
        else:
            def enable():  # all or nothing: tried again once other processes gave the counters back
                rp = range_profiler.RangeProfiler(self._context.handle)
                try:
                    collected = self.metrics if self._plan is None else list(self._plan.collected)
                    image = rp.counter_data_image(collected, ranges)
                    rp.set_config(self._config, image, range_mode, replay_mode, ranges, depth, 1, 0, 1)
                except BaseException:
                    rp.close()
                    raise
                return rp, image

            self._rp, self._image = _keep.retry_when_busy(self.device, enable, _keep.RANGE_SESSION)
        self._key, self.max_ranges = key, int(ranges)
        if self._collector is not None:
            self._collector.rp = self._rp

    def _start_first_soon(self, configure: tuple | None = None) -> None:
        """The first ``cuptiRangeProfilerStart`` of kernel replay on a thread (:attr:`first_start_beside`), after
        the availability query and check the constructor left to it and, with *configure* (:meth:`_configure`'s
        arguments), the Enable and SetConfig; :meth:`_first_started` waits for it. Nothing else of the session
        touches ``self._rp`` until then."""
        def first():
            try:
                if self._setup_thread is not None:  # the constructor's work, left to a thread
                    self._set_up()
                    self._hold_counters()
                    self._made_current()
                else:
                    self._context.make_current()
                if configure is not None:
                    self._check_availability()
                    self._configure(*configure)
                if self._setup_thread is not None and self.mode is Mode.KERNEL:
                    self._use_kernel()  # the collector, now that the context is known (takes this pass as its first)
                self._start_first()
            except BaseException as exc:  # noqa: BLE001  said where the session is next used
                self._first_error = exc

        self._first_began = True
        self._first_thread = threading.Thread(target=first, name="gpuscope-first-start", daemon=True)
        self._first_thread.start()

    def _first_started(self) -> bool:
        """Wait for the first Start made beside the caller's code, if one is under way; False where it failed (the
        session then profiles nothing, and :meth:`close` raises what CUPTI said)."""
        thread = self._first_thread
        if thread is not None:
            thread.join()
            self._first_thread = None
            if self._first_error is not None:  # nothing started: nothing to stop at the close
                _warn(f"gpuscope: the session could not start ({self._first_error}); nothing is profiled, and its "
                      "close raises this error.")
                self._first_began = self._running = False
                if self._collector is not None:
                    self._collector.running = False
            elif self._collector is not None:
                self._collector.rp = self._rp  # a new one where the kept one was refused
        return self._first_error is None

    def _stop_first_untaken(self) -> None:
        """A pass started beside the code that kernel replay did not take (auto mode went to iteration replay, or
        the session ends before its first launch): stopped before its profiler is closed or kept."""
        if self._first_began and not self._first_taken and self._first_started():
            self._first_began = False
            self._rp.stop()

    def _start_first(self) -> None:
        """The session's first ``cuptiRangeProfilerStart``. A kept profiler that CUPTI refuses there was forgotten
        by CUPTI (another CUPTI client of the process called ``cuptiFinalize`` while nothing of gpuscope's was
        open, which gpuscope cannot see then: ``tests/gpu/test_finalize.py``): it is dropped untouched and the
        session sets up afresh, once, with a warning."""
        from gpuscope._gpu import keep as _keep
        from gpuscope.cupti import profiler
        from gpuscope.errors import CuptiError

        try:
            self._rp.start()
            return
        except CuptiError as exc:
            if not self._reused_now:
                raise
            refused = exc
        stale, self._rp, self._key = self._rp, None, None
        _keep.abandon(stale)  # never disabled: CUPTI forgot it
        profiler._after_detach()  # and its initialisation
        profiler.initialize(self._context.handle)
        self._configure(*self._configured)
        _warn(f"gpuscope: CUPTI refused the profiler kept from the last session ({refused}): another CUPTI client of "
              "this process finalized CUPTI since. The session set up a new one.")
        self._rp.start()

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
        if not self._first_started():  # CUPTI refused the first Start made beside the code: nothing was profiled
            self._state = "closed"
            self._teardown()
            raise self._first_error
        error = None
        clean = False  # the profiler stopped and no pass group half collected: it may be kept
        try:
            if self._stack:
                _warn(f"gpuscope.Profiler closed inside open ranges ({_ranges.current_path()!r}); they are dropped.")
            if self._nvtx is not None:
                self._nvtx.close()  # no NVTX range from here on
                self._notes.update(self._nvtx.notes())
            if self._recorder is not None:
                self._recorder.close()  # no launch callback from here on
                self._baton.reset()  # a launch whose exit was not heard holds it no more
                self._note_graph_launches(self._recorder.graph_launches)
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
                        self._take_found_group("incomplete_group")
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

    def _teardown(self, keep: bool = False) -> None:
        """Release what the session holds. With *keep* (a clean close: the profiler stopped, no pass group half
        collected, the image emptied), the range profiler goes to :mod:`gpuscope._gpu.keep` for the next session."""
        from gpuscope._gpu import keep as _keep
        from gpuscope.cupti import profiler

        nvtx, self._nvtx = self._nvtx, None
        if nvtx is not None:
            nvtx.close(report=False)
        _ranges.remove_listener(self)
        self._first_started()
        self._setup_waited()  # a session closed before it started: its setup may be under way
        collector = getattr(self, "_collector", None)
        started = ((getattr(self, "_running", False) and not getattr(collector, "paused", False))
                   or (getattr(collector, "in_iteration", False) and not getattr(collector, "counting", False))
                   or (self._first_began and not self._first_taken))
        recorder, self._recorder = getattr(self, "_recorder", None), None
        if recorder is not None:
            recorder.close()
        if self._graphs is not None:
            self._graphs.close()  # never raises; flushed already after a clean close
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
            if self._context is not None:  # else the setup made beside the code failed, and undid its own work
                profiler.deinitialize()
                self._context.close()
        self._running = False
        if getattr(self, "_holding", False):
            self._holding = False
            _keep.session_closed(self.device, _keep.RANGE_SESSION)
        with _active_lock:
            if _active.get(self.device) is self:
                del _active[self.device]
            last = not _active
        if last:  # CUPTI's one callback subscriber goes back: torch.profiler may have it between sessions
            from gpuscope._gpu import graph_nodes as _graph_nodes
            from gpuscope._gpu import modules as _modules

            _modules.pause()
            _graph_nodes.pause()  # unless gpuscope.watch_graphs() asked to go on

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
