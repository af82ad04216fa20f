"""What a range-profiling session does before it collects: the device, its primary context, CUPTI's profiler, the
metrics, pass plan and config image (on the caller's thread, or on one beside it), the range profiler enabled or
taken back from :mod:`gpuscope._gpu.keep`, and the first ``cuptiRangeProfilerStart`` made beside the caller's code
(:attr:`gpuscope.Profiler.first_start_beside`).

:class:`SessionSetup` is mixed into :class:`gpuscope._range_profiling.session.Profiler`, which holds the options and
the lifecycle; what the session does at its close is :mod:`gpuscope._range_profiling.close`'s.
"""

from __future__ import annotations

import threading
import time

from gpuscope._range_profiling.modes import Mode, _warn


class SessionSetup:
    """The session's set-up and first Start (a mixin of :class:`gpuscope.Profiler`)."""

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


def _properties(host, metric: str) -> dict:
    from gpuscope._gpu import catalog as _catalog

    p = host.metric_properties(metric)
    return {"units": _catalog.units_of(_catalog.split_name(metric)[1], p.units), "description": p.description,
            "metric_type": p.metric_type.name.lower(), "hw_unit": p.hw_unit}
