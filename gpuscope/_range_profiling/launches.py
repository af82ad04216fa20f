"""Per-kernel collection in ``"kernel"`` and ``"iteration"`` modes: what happens at every kernel launch.

Both modes hear launches through CUPTI's launch callbacks (:class:`gpuscope.cupti.callbacks.LaunchRecorder`),
on the launching thread, at the launch call's entry and exit.

``"kernel"`` (:class:`KernelReplay`)
    CUPTI auto ranges + kernel replay: CUPTI replays each profiled launch once per pass inside the launch call,
    saving and restoring device memory around each pass. A launch the filters leave out runs with the range
    profiler stopped (``cuptiRangeProfilerStop`` at its entry, ``Start`` at its exit; about 10 us), so CUPTI
    neither replays nor counts it, and the i-th CUPTI range is the i-th selected launch. While auto mode searches
    the launch stream for a loop, each (symbol, grid, block) is replayed once and its later launches run stopped
    the same way (``KernelReplay.once``): the loop is found on its signatures, not on replays.
``"iteration"`` (:class:`IterationReplay`)
    CUPTI auto ranges + user replay across repeated iterations: pass k of the metric set runs on the k-th
    iteration of a pass group (an execution of the repeated top-level range, or what lies between two
    ``Profiler.step()`` calls), every launch in the iteration being one range. Nothing is saved or restored, so
    the cost does not depend on the device memory the process holds. The i-th range of a pass is that
    iteration's i-th launch: launches are matched across the group's iterations by position, kernel symbol,
    grid and block (as Nsight Compute's application replay does), and only the leading launches that every
    iteration has in common are kept; the rest are counted and reported, never mislabelled. CUPTI counts every
    launch of an iteration (a pass cannot leave one out: stopping the profiler ends the pass), so filters choose
    the rows kept, not the launches counted. (User ranges pushed from the launch callback would allow that; they
    were tried only while an earlier kernel-mode session was left started, a bug since fixed that crashed any later
    session, so whether they work is not known.)

Never blocking the program. Launch callbacks run on the program's threads, inside the driver and often inside a
framework's own locks (XLA compiles and autotunes on threads of its own, which load modules and launch kernels while
the main thread waits for them). A lock held from a launch's entry to its exit, waited for at the next launch's entry,
deadlocked such a program (a JAX step under ``gpuscope run``: an XLA thread waited in the launch callback for the lock
while its holder's launch waited inside the driver). So the session's :class:`Baton` is taken at a launch's entry
with a *bounded* wait (:data:`BATON_WAIT_S`) and given back at its exit: the holder's launch reaches CUPTI with
nothing of another thread's in between. Threads that launch independently (eight threads each launching a kernel)
wait their turn and are all profiled; where one wait runs out, the program holds something across its launches that
the holder needs, and from then on the session's launches take the baton without waiting: a launch that finds it
taken runs unprofiled at once (a JAX step pays one wait, then runs on). CUPTI still makes it a range where the
profiler is started, so it is recorded as a placeholder (``concurrent``), its range dropped, and the holder whose launch
it overlapped is marked ``overlapped`` (CUPTI's order of the two is not known): both are counted and reported, never
mislabelled. The collectors below take no lock of their own: their caller holds the baton.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field

from gpuscope._range_profiling.filters import KernelFilter
from gpuscope._schema.names import KernelNames, kernel_names, short_name

#: Seconds a launch waits at its entry for another thread's profiled launch to end (a kernel replay of the ``full``
#: set took up to 0.5 s a launch on an H200), before the session stops waiting for the baton (module docstring).
BATON_WAIT_S = 2.0

__all__ = ["BATON_WAIT_S", "Baton", "HostGates", "capturing", "HOST_WAITING", "Selected", "KernelReplay", "IterationReplay",
           "matched_prefix", "stop_for"]


class Baton:
    """Which thread is inside a profiled launch: taken at the launch's entry, given back at its exit.

    :meth:`take` waits at most *wait* seconds: a launch that still finds the baton held by another thread runs
    unprofiled (module docstring); :attr:`timed_out` counts the waits that ran out. The holder may take it again (a graph launch whose nodes are launched from its callback, or a
    launch whose last exit was never heard: the recorder was paused meanwhile); it is free again once given back as
    often as taken. :meth:`reset` frees it at a session's close, where no launch of the session is in flight.
    """

    def __init__(self):
        self._lock = threading.Lock()
        self.holder: int | None = None  # the thread ident of the holder
        self.depth = 0
        self.what = ""  # what the holder took it for (a kernel's symbol), for the counts of refusals
        self.refused = 0  # takes refused: launches that found another thread's launch in flight
        self.timed_out = 0  # waits that ran out
        self.closed = False  # the session closed: a launch still waiting for the baton then runs unprofiled

    def take(self, wait: float = 0.0) -> bool:
        me = threading.get_ident()
        if self.holder == me:
            self.depth += 1
            return True
        if not self.closed and (self._lock.acquire(blocking=False) or (wait > 0 and self._wait(wait))):
            if self.closed:  # taken after the session's close freed it: the session is gone
                self._lock.release()
                return False
            self.holder, self.depth = me, 1
            return True
        self.refused += 1
        return False

    def _wait(self, wait: float) -> bool:
        if self._lock.acquire(timeout=wait):
            return True
        self.timed_out += 1
        return False

    def give(self) -> None:
        if self.holder == threading.get_ident():
            self.depth -= 1
            if self.depth <= 0:
                self.holder, self.depth = None, 0
                self._lock.release()

    def release(self, thread: int) -> None:
        """Free the baton if *thread* holds it: the exit of that thread's launch was not heard (the recorder was
        paused meanwhile), so it will never give it back."""
        if self.holder == thread:
            self.reset()

    def close(self) -> None:
        """The session's close: no launch takes the baton from here on (one still waiting for it gives up)."""
        self.closed = True
        self.reset()

    def reset(self) -> None:
        if self.holder is not None:
            self.holder, self.depth = None, 0
            try:
                self._lock.release()
            except RuntimeError:
                pass

    @property
    def held(self) -> bool:
        return self.holder is not None


#: Kernels that wait for the host: XLA's autotuning timer launches ``DelayKernel``, which spins until the launching
#: thread sets a flag, after it has launched the kernels it times. Replaying it (or a kernel behind it on its
#: stream) inside the launch call waits for a flag that the thread sets only once the call returns: JAX under kernel
#: replay stalled there for minutes (XLA: "Delay kernel timed out").
HOST_WAITING = ("DelayKernel",)


class HostGates:
    """Streams on which a kernel waits for the host: launches there run unprofiled until the stream has drained
    (``cuStreamQuery``, never waited for)."""

    def __init__(self):
        self.streams: set[int] = set()

    def closed(self, launch) -> bool:
        """Whether *launch* must run unprofiled: it waits for the host, or such a kernel may still be running. On
        any stream: kernel replay waits for the whole device, the spinning kernel included (seen: an XLA thread's
        replayed launch on another stream held the session's baton for the rest of a JAX run)."""
        if any(k in launch.symbol for k in HOST_WAITING):
            self.streams.add(launch.stream)
            return True
        for stream in list(self.streams):
            if _busy(stream):
                return True
            self.streams.discard(stream)
        return False


def capturing(stream: int) -> bool:
    """Whether *stream* is being captured into a CUDA graph (``cuStreamIsCapturing``): a launch there records a node
    and runs nothing, so CUPTI makes no range of it."""
    try:
        from cuda.bindings import driver

        err, status = driver.cuStreamIsCapturing(driver.CUstream(stream))
    except Exception:  # noqa: BLE001  no driver to ask (launches simulated without a GPU): nothing is captured
        return False
    return err == driver.CUresult.CUDA_SUCCESS and status != driver.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE


def _busy(stream: int) -> bool:
    try:
        from cuda.bindings import driver

        return driver.cuStreamQuery(driver.CUstream(stream))[0] == driver.CUresult.CUDA_ERROR_NOT_READY
    except Exception:  # noqa: BLE001  no driver to ask: nothing runs
        return False


@dataclass
class Selected:
    """A launch that became a CUPTI range, with what gpuscope knows about it."""

    symbol: str
    kernel: str  # its name in the session: the decorated or function name, longer where two kernels share it
    parent: str  # the user range path open on the launching thread
    grid: tuple
    block: tuple
    enter_ns: int
    exit_ns: int = -1
    wanted: bool = True  # False: a launch the filters leave out (iteration mode counts it all the same)
    qualname: str = ""  # the readable (demangled) symbol: module.outer.<locals>.function, ns::kernel<float>
    launch_id: int = -1  # which launch of the session's context it was, counting those the filters left out
    function: int = 0  # the launch call's CUfunction handle, 0 where unknown (callbacks.Launch.function)
    shared_dynamic: int = 0  # bytes of dynamic shared memory per block the launch call asked for
    concurrent: bool = False  # a placeholder: launched while another thread's launch held the baton (never a row)
    overlapped: bool = False  # a concurrent launch came while this one was in flight: CUPTI's order of the two unknown
    graph_exec: int = -1  # a CUDA graph's kernel node run by gpuscope (graph_replay): CUPTI's id of the graph exec
    graph_launch: int = -1  # which launch of that executable graph
    graph_node: int = -1  # the kernel node's position in the graph's topological order

    @property
    def signature(self) -> tuple:
        """What matches a launch across passes; a launch whose CUPTI range is not known for sure matches none."""
        if self.concurrent or self.overlapped:
            return ("<concurrent>", id(self))
        return (self.symbol, self.grid, self.block)


class _Base:
    """Launch selection shared by both modes: context, thread-safety, name filters, skip/count window."""

    def __init__(self, rp, context: int, kfilter: KernelFilter, name_of, annotate, timestamp,
                 names: KernelNames | None = None):
        self.rp = rp
        self._timestamp = timestamp
        self.context = context
        self.filter = kfilter
        self._name_of = name_of  # symbol -> readable (qualified) name, cached
        self._names: dict[str, str] = {}
        # the names rows get: short, longer only where two kernels share one (the process's table, by default)
        self.kernel_names = names if names is not None else kernel_names()
        self._annotate = annotate  # () -> (parent path, decorated name or None), on the launching thread
        self._in_flight: Selected | None = None  # the launch holding the baton, while it is one of ours
        self.heard = 0  # launches of this context heard, whether the filters keep them or not (launch IDs)
        self.matched = 0  # launches that passed the name filters (for launch_skip/launch_count)
        self.left_out = 0  # launches of this context the filters left out
        self.other_context = 0  # launches in other contexts (not profiled by this session)
        self.concurrent = 0  # launches that came while another thread's launch was in flight (run unprofiled)

    def _placeholder(self, launch) -> Selected:
        """A concurrent launch's entry: never a row; the launch in flight is marked overlapped."""
        self.concurrent += 1
        if self._in_flight is not None:
            self._in_flight.overlapped = True
        return Selected(launch.symbol, short_name(self.readable(launch.symbol)), "", launch.grid, launch.block,
                        self._timestamp(), wanted=False, concurrent=True, function=launch.function)

    def readable(self, symbol: str) -> str:
        name = self._names.get(symbol)
        if name is None:
            name = self._names[symbol] = self._name_of(symbol)
        return name

    def _choose(self, launch, index_base: int = 0, keep_rejected: bool = False):
        """A :class:`Selected` for a launch of this context that passes the filters, else None (counted).

        With *keep_rejected*, a launch the filters leave out comes back too, marked ``wanted=False``.
        """
        if launch.context != self.context:
            self.other_context += 1
            return None
        launch_id, self.heard = self.heard, self.heard + 1
        parent, label = self._annotate()
        qualname = self.readable(launch.symbol)
        short = label or short_name(qualname)
        wanted = True
        f = self.filter
        if f.active:
            if not f.name_matches(short, launch.symbol, qualname):
                wanted = False
            else:
                index = self.matched - index_base
                self.matched += 1
                wanted = f.in_window(index)
        if not wanted:
            self.left_out += 1
            if not keep_rejected:
                return None
        name = self.kernel_names.name(qualname, short) if wanted else short  # rows' names: told apart if need be
        return Selected(launch.symbol, name, parent, launch.grid, launch.block, self._timestamp(), wanted=wanted,
                        qualname=qualname, launch_id=launch_id, function=launch.function,
                        shared_dynamic=launch.shared_dynamic)

    def on_lost(self, token):
        """*token*'s exit was not heard (the recorder was paused while it ran): it keeps no exit time, and no longer
        holds the launch in flight."""
        if self._in_flight is token:
            self._in_flight = None


class KernelReplay(_Base):
    """``"kernel"`` mode: CUPTI kernel replay of each selected launch; left-out launches run unprofiled."""

    def __init__(self, rp, context, kfilter, name_of, annotate, timestamp, capacity: int = 0, on_full=None,
                 names: KernelNames | None = None):
        super().__init__(rp, context, kfilter, name_of, annotate, timestamp, names)
        self.selected: list[Selected] = []
        self.image_first = 0  # index in selected of the first launch the counter-data image holds
        self.capacity = capacity  # launches the image holds (0: no limit here); when full, on_full() empties it
        self._on_full = on_full
        self.running = False  # whether the session has started the range profiler (set by the session)
        self.paused = False  # stopped for left-out launches, to start again before the next selected one
        self.errors: list[str] = []
        # With a set: the signatures replayed so far, each replayed once; later launches of one run stopped and
        # are counted by symbol in `repeats` (both set by the session).
        self.once: set | None = None
        self.repeats: Counter = Counter()

    def on_enter(self, launch):
        """A launch's entry, with the session's baton held: the Selected to profile, or None (run unprofiled)."""
        chosen = self._choose(launch)
        if chosen is not None and self.once is not None:
            if chosen.signature in self.once:
                self.repeats[chosen.symbol] += 1
                chosen = None
            else:
                self.once.add(chosen.signature)
        if chosen is None:
            if launch.context == self.context:  # left-out launches run stopped: CUPTI neither replays nor counts them
                stop_for(self, "a left-out launch")
            return None
        if self.capacity and len(self.selected) - self.image_first >= self.capacity:
            self._on_full()  # collects the full image, empties it and starts the profiler
        elif self.paused:  # started again only when a selected launch comes: left-out launches pay once
            self.rp.start()
            self.paused = False
        self.selected.append(chosen)
        self._in_flight = chosen
        return chosen

    def on_concurrent(self, launch) -> None:
        """A launch of this context that found another thread's launch in flight: it runs at once, unprofiled.
        Where the profiler is started CUPTI makes it a range all the same, so a placeholder keeps the count."""
        if launch.context != self.context:
            self.other_context += 1
            return
        if self.running and not self.paused:
            self.selected.append(self._placeholder(launch))
        else:
            self.concurrent += 1

    def on_exit(self, token):
        token.exit_ns = self._timestamp()
        self._in_flight = None


def stop_for(collector, what: str) -> None:
    """Kernel replay stopped for a launch about to run unprofiled (*what*: a left-out launch, a graph launch, ...):
    CUPTI neither replays nor counts it; it starts again at the next launch it profiles (:class:`KernelReplay`).
    Nothing to do for a collector not running kernel replay (iteration replay replays nothing in a launch call).
    A refusal is kept in the collector's ``errors``, said at the close."""
    if getattr(collector, "running", False) and not getattr(collector, "paused", True):
        try:
            collector.rp.stop()
            collector.paused = True
        except Exception as exc:  # noqa: BLE001
            collector.errors.append(f"cuptiRangeProfilerStop before {what}: {exc}")


def matched_prefix(passes: list[list]) -> int:
    """How many leading launches every pass of a group has in common (same symbol, grid, block, in order).

    With CUPTI auto ranges the i-th range of each pass is that pass's i-th launch, so only positions before the
    first difference in any pass are the same launch in every pass; from there on a pass counted other kernels.
    """
    if not passes:
        return 0
    first = [s.signature for s in passes[0]]
    common = len(first)
    for p in passes:  # a launch whose range is not known for sure ends the common part in every pass
        common = next((i for i, s in enumerate(p[:common]) if s.concurrent or s.overlapped), common)
    for later in passes[1:]:
        n = min(common, len(later))
        common = next((i for i in range(n) if later[i].signature != first[i]), n)
    return common


@dataclass
class _Group:
    index: int
    first_iteration: int
    passes: list = field(default_factory=list)  # per pass: the Selected launches of that iteration, in order

    @property
    def passes_run(self) -> int:
        return len(self.passes)


class IterationReplay(_Base):
    """``"iteration"`` mode: pass k on the k-th iteration of a group; every launch in an iteration is an auto range."""

    def __init__(self, rp, context, kfilter, name_of, annotate, timestamp, names: KernelNames | None = None):
        super().__init__(rp, context, kfilter, name_of, annotate, timestamp, names)
        self.in_iteration = False
        self.counting = False  # the current iteration only counts launches (see begin_count)
        self.counted = 0
        self.iteration = 0  # iterations begun so far
        self.group: _Group | None = None
        self._base = 0  # self.matched at the start of the current iteration: skip/count are per iteration

    def begin_count(self) -> None:
        """Start an iteration that is not profiled, only counted (it sizes the counter-data image)."""
        self.counted = 0
        self.counting = self.in_iteration = True
        self.iteration += 1

    def end_count(self) -> int:
        """End the counted iteration; returns how many launches of this context it made."""
        self.counting = self.in_iteration = False
        return self.counted

    def begin(self, group_index: int) -> None:
        """Start an iteration (a pass): ``cuptiRangeProfilerStart``."""
        if self.group is None:
            self.group = _Group(group_index, self.iteration)
        self.group.passes.append([])
        self._base = self.matched
        self.rp.start()
        self.in_iteration = True
        self.iteration += 1

    def end(self):
        """End the iteration: ``cuptiRangeProfilerStop``; returns CUPTI's StopResult."""
        self.in_iteration = False
        return self.rp.stop()

    def take_group(self) -> _Group:
        group, self.group = self.group, None
        return group

    def on_enter(self, launch):
        """A launch's entry, with the session's baton held."""
        if not self.in_iteration:
            return None
        if self.counting:
            self.counted += launch.context == self.context
            return None
        chosen = self._choose(launch, self._base, keep_rejected=True)  # CUPTI counts left-out launches too
        if chosen is None:
            return None
        self.group.passes[-1].append(chosen)
        self._in_flight = chosen
        return chosen

    def on_concurrent(self, launch) -> None:
        """A launch that found another thread's launch in flight: CUPTI counts it in the pass, so a placeholder
        holds its position (the passes then differ there, and only the leading launches common to all are kept)."""
        if launch.context != self.context:
            self.other_context += 1
            return
        if not self.in_iteration or self.counting:
            if self.counting:
                self.counted += 1
            return
        if self.group is not None and self.group.passes:
            self.group.passes[-1].append(self._placeholder(launch))

    def on_exit(self, token):
        token.exit_ns = self._timestamp()
        self._in_flight = None
