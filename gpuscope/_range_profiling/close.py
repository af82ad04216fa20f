"""What a range-profiling session does at its close: the last pass stopped and its rows collected, a pass group left
incomplete said, and what the session holds released or, after a clean close, kept for the next session
(:mod:`gpuscope._gpu.keep`).

:class:`SessionClose` is mixed into :class:`gpuscope._range_profiling.session.Profiler`, which holds the options, the
start and the registry of open sessions; the set-up is :mod:`gpuscope._range_profiling.setup`'s.
"""

from __future__ import annotations

import os

from gpuscope._range_profiling import ranges as _ranges
from gpuscope._range_profiling.modes import Mode, _warn
from gpuscope.errors import MultiPassRangeError


class SessionClose:
    """The session's close and teardown (a mixin of :class:`gpuscope.Profiler`)."""

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
                self._baton.close()  # a launch whose exit was not heard holds it no more, none waits for it
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
        if self._unregister():  # CUPTI's one callback subscriber goes back: torch.profiler may have it between sessions
            from gpuscope._gpu import graph_nodes as _graph_nodes
            from gpuscope._gpu import modules as _modules

            _modules.pause()
            _graph_nodes.pause()  # unless gpuscope.watch_graphs() asked to go on
