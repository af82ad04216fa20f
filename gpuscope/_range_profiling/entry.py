"""What the per-launch modes do at a launch call's entry and exit, and at a graph launch's: never blocking.

CUPTI calls these on the launching thread, inside the driver and often inside a framework's own lock (XLA compiles
and autotunes on threads of its own; PyTorch launches backward from autograd threads). Nothing here waits without a
bound on anything another launching thread can hold (:mod:`gpuscope._range_profiling.launches`, "Never blocking the
program"): the session's baton is taken without waiting and held to the launch's exit; a launch that cannot be
profiled safely runs unprofiled and is counted by reason (``launches_concurrent``, ``launches_host_waiting``,
``launches_captured``, ``launches_before_start``); a graph launch's nodes are run one by one
(:mod:`gpuscope._range_profiling.graph_replay`). :class:`LaunchEntry` is a mixin of
:class:`gpuscope._range_profiling.modes.PerLaunchModes`, which decides what a held launch becomes
(``_enter_held``).
"""

from __future__ import annotations

import functools
import threading
import warnings
from collections import Counter

from gpuscope._range_profiling import launches as _launches
from gpuscope.errors import GpuscopeWarning

__all__ = ["FIRST_START_WAIT_S", "LaunchEntry"]


def _warn(message: str) -> None:
    warnings.warn(message, GpuscopeWarning, stacklevel=3)


def _readable(symbol: str) -> str:
    from gpuscope._schema.names import demangle

    return demangle(symbol)


class LaunchEntry:
    """The launch callbacks of a per-launch session (a mixin: it uses the session's state)."""

    _graph_replay = None  # graph launches run node by node (graph_replay.GraphReplay)

    # What every launch callback reads, made with the session (or at first use, for a session assembled in a test)
    @functools.cached_property
    def _baton(self):
        return _launches.Baton()  # which thread is inside a profiled launch (a bounded wait, none after one ran out)

    @functools.cached_property
    def _gates(self):
        return _launches.HostGates()  # streams behind a kernel that waits for the host

    @functools.cached_property
    def _unsafe(self) -> Counter:
        return Counter()  # launches run unprofiled rather than block the program, by reason

    @functools.cached_property
    def _behind(self) -> Counter:
        return Counter()  # what the baton's holder was launching when others found it taken

    def _on_enter(self, launch):
        """A launch's entry (CUPTI's callback, on the launching thread, inside the driver): never waits on anything
        another launching thread can hold (:mod:`gpuscope._range_profiling.launches`, "Never blocking the program").
        The baton is taken with a bounded wait (none once a wait ran out) and held to the launch's exit; a launch
        that still finds it held, or comes while the first Start is still under way on another thread, runs
        unprofiled and is counted."""
        if self._first_thread is not None or self._first_error is not None:
            ready = self._first_ready(threading.get_ident() == self._thread)
            if ready is None:  # the first Start is still under way beside the code
                self._unsafe["before_start"] += 1
                return None
            if not ready:
                return None  # CUPTI refused the first Start: nothing is profiled, close() says why
        if launch.context != self._context.handle:
            if self._collector is not None:
                self._collector.other_context += 1
            return None
        baton = self._baton
        if not baton.take(0.0 if baton.timed_out else _launches.BATON_WAIT_S):
            self._unsafe["concurrent"] += 1
            self._behind[baton.what] += 1  # what the holder is launching: said with the count
            if self._collector is not None:
                self._collector.on_concurrent(launch)
            return None
        if baton.depth == 1:
            baton.what = launch.symbol
        try:
            replayed_here = self._kernel_replay()
            if replayed_here and self._gates.closed(launch):  # waits for the host, or behind one: replayed
                # inside its launch call it would stall (iteration replay replays nothing there, and counts it)
                self._unsafe["host_waiting"] += 1
                _launches.stop_for(self._collector, "a launch waiting for the host")
                return _Held(None)
            if replayed_here and _launches.capturing(launch.stream):  # recorded into a graph, run later:
                # CUPTI makes no range of it, and its node is profiled at the graph's launch (graph_replay)
                self._unsafe["captured"] += 1
                _launches.stop_for(self._collector, "a launch inside stream capture")
                return _Held(None)
            token = self._enter_held(launch)
        except BaseException:
            baton.give()
            raise
        replay = self._graph_replay
        if token is not None and replay is not None:
            node = replay.current()  # a graph's kernel node, launched by gpuscope from the graph launch's callback
            if node is not None:
                token.graph_exec, token.graph_launch, token.graph_node = node
        return _Held(token)

    def _kernel_replay(self) -> bool:
        """Whether this launch would be replayed inside its launch call (kernel mode, or auto mode before it has
        found a loop): the launches that must never be replayed are checked for only then (a few microseconds)."""
        return self._collector is None or isinstance(self._collector, _launches.KernelReplay)

    def _first_ready(self, owner: bool):
        """Whether the first Start made beside the code succeeded (True), failed (False), or is still under way
        (None). The session's own thread waits for it, with a bound; other threads do not wait."""
        thread = self._first_thread
        if thread is not None:
            thread.join(FIRST_START_WAIT_S if owner else 0)
            if thread.is_alive():
                return None
        return self._first_started()

    def _on_exit(self, held):
        token = held.token
        try:
            if token is not None:
                self._collector.on_exit(token)
                if token is self._end_after:  # the last launch of a found iteration has run
                    self._end_after = None
                    self._end_found_iteration()
        finally:
            self._baton.give()

    def _on_lost(self, held, thread: int) -> None:
        """A launch whose exit was not heard (the recorder was paused while it ran on *thread*): its baton freed,
        so that the other threads' launches are profiled again, and counted (``launches_exit_unheard``)."""
        token = held.token if isinstance(held, _Held) else None
        if token is not None and self._collector is not None:
            self._collector.on_lost(token)
        self._unsafe["exit_unheard"] += 1
        self._baton.release(thread)

    def _note_unsafe(self) -> None:
        """Say which launches ran unprofiled because profiling them could have blocked the program (another
        thread's launch in flight, the first Start under way), and which rows were dropped for it."""
        notes = {f"launches_{k}": int(v) for k, v in self._unsafe.items() if v}
        self._notes.update(notes)
        if self._baton.timed_out:  # a launch waited BATON_WAIT_S for another's: later ones did not wait
            self._notes["baton_wait_timed_out_s"] = _launches.BATON_WAIT_S
        if self._behind:  # the launches in flight that others found: names CUPTI's replay was busy with
            self._notes["launches_concurrent_behind"] = {_readable(k) or "(a graph launch)": int(n)
                                                         for k, n in self._behind.most_common(5)}
        if notes:
            from gpuscope._results.report_inputs import unprofiled_note

            _warn(f"gpuscope ran launches unprofiled rather than block the program: {unprofiled_note(notes)}. "
                  + (f"A launch waited {_launches.BATON_WAIT_S:g} s for another thread's profiled launch to end "
                     "(the program holds something across its launches that the launch in flight needed), so "
                     "later launches did not wait. " if self._baton.timed_out else "")
                  + "Launching from one thread while the session runs profiles every launch "
                  "(docs/graphs.md, 'Threads').")

    def _on_graph(self, correlation: int, params: int = 0) -> None:
        """A CUDA graph launch (at its entry, on the launching thread): its nodes run one by one and are profiled
        as launches (:mod:`gpuscope._range_profiling.graph_replay`); where that cannot be done safely the graph runs
        as it is, and kernel and auto modes open kernel activity records at the first such launch, to name the
        graph's kernels (:mod:`gpuscope._range_profiling.graphs`)."""
        replay = self._graph_replay
        if replay is not None and params:
            token = replay.on_launch(params, self._baton)
            if token is not None:
                return token  # its nodes run at the call's exit (_on_graph_exit) as launches of their own
        recorder, graphs, collector = self._recorder, self._graphs, self._collector
        # Kernel replay stops before every graph launch, as before a left-out launch, and starts again at the next
        # launch it profiles (launches.KernelReplay): a graph launched while it ran left it no range for the
        # launches around it (H100, CUPTI 13.0: 0 rows for 3), and CUPTI refuses kernel activity records while it
        # runs (CUPTI_ERROR_NOT_COMPATIBLE)
        if self._baton.take():  # never waited for: another thread's profiled launch is in flight
            try:  # a refusal: the records are then refused too, and the summary says why
                _launches.stop_for(collector, "a CUDA graph launch")
            finally:
                self._baton.give()
        if recorder is not None and graphs is not None and graphs.may_open():
            graphs.open(recorder.graph_correlations.__contains__)

    def _on_graph_exit(self, token) -> None:
        """A graph launch's exit, its nodes planned at its entry: run them (graph_replay)."""
        self._graph_replay.on_exit(token)



class _Held:
    """The token of a launch that holds the session's baton: its collector's token (None: it runs unprofiled)."""

    __slots__ = ("token",)

    def __init__(self, token):
        self.token = token


#: How long the session's own thread waits at a launch for the first Start made beside its code (about 1 s is
#: usual); other threads never wait, and a launch that comes first runs unprofiled and is counted.
FIRST_START_WAIT_S = 60.0
