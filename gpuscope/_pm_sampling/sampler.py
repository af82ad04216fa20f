"""``gpuscope.sample``: hardware metrics over time (CUPTI PM sampling), aligned with ``gpuscope.range``.

How it works: the config image is checked to fit in one pass before anything starts; then a PM sampling object
is enabled on the device and started. A background thread that does nothing but ``DecodeData`` moves samples out
of the hardware buffer into a small, fixed pool of counter-data images; evaluator threads evaluate each image
while sampling runs (raw images cost ~21.7 KB per sample, far too much to keep) and return it to the pool. User
ranges are stamped with ``cuptiGetTimestamp``, the clock of the sample timestamps.

Lost samples are never dropped silently: the decode thread counts hardware-buffer overflows, and gaps in the
sample timestamps are counted as lost samples; both go into the Dataset's attrs (and a warning).

The pieces live in their own modules: :mod:`.plan` (interval, trigger, pool sizes, single-pass check),
:mod:`.pipeline` (decode and evaluator threads), :mod:`.workers` (evaluation in worker processes),
:mod:`.timeline` (ranges and lost samples over timestamps), :mod:`.series` (evaluated samples) and
:mod:`.results` (the Dataset and the account of lost samples, mixed into :class:`Sampler`); this module holds
the public :class:`Sampler`: its options, its lifecycle and the running samplers.
"""

from __future__ import annotations

import os
import threading
import time
import warnings

from gpuscope._pm_sampling.pipeline import Pipeline as _Pipeline
from gpuscope._pm_sampling.plan import (
    MIN_INTERVAL_NS,
    Trigger,
    check_single_pass,
    choose_trigger,
    default_image_pool,
    default_samples_per_image,
    parse_interval,
)
from gpuscope._pm_sampling.results import SamplerResults
from gpuscope._pm_sampling.timeline import RangeRecorder as _RangeRecorder
from gpuscope._util import validate as _validate
from gpuscope._util.shield import run_shielded
from gpuscope.errors import GpuscopeWarning, SamplerBusyError

__all__ = [
    "Sampler",
    "run_shielded",
]


# Bounds of Sampler's arguments: beyond them a value is a typo (or wraps in C), not a choice.
MAX_DEVICE = 1023
MAX_HARDWARE_BUFFER = 1 << 40  # 1 TiB of device memory
MAX_DECODE_PERIOD_S = 60.0
#: Shortest decode period: a shorter one only spins the decode thread (each decode reads all that is waiting) and
#: takes the GIL from the user's threads.
MIN_DECODE_PERIOD_S = 0.001
MAX_SAMPLES_PER_IMAGE = 1 << 20
MAX_IMAGE_POOL = 1 << 16
MAX_EVALUATORS = 256

_active: dict[int, "Sampler"] = {}
_active_lock = threading.Lock()


class Sampler(SamplerResults):
    """PM sampling on one device; make it with :func:`sample`.

    Use it as a context manager, or call :meth:`start` and :meth:`stop`. Read :attr:`dataset` afterwards.

    Attributes
    ----------
    metrics : list of str
        The sampled metrics (full CUPTI names).
    interval_ns : int
        The requested interval in ns (for the sys-clock trigger: the converted estimate).
    trigger : Trigger
        The trigger used.
    device : int
        CUDA device index.
    """

    def __init__(
        self,
        metrics="pm-default",
        interval="100us",
        device: int = 0,
        *,
        hardware_buffer_size: int = 512 << 20,
        decode_period: float = 0.01,
        samples_per_image: int | None = None,
        image_pool: int | None = None,
        evaluators: int = 2,
        evaluate_in: str = "process",
        kernels: bool = False,
    ):
        value, unit = parse_interval(interval)
        _validate.names(metrics, "metrics")
        device = _validate.integer(device, "device", minimum=0, maximum=MAX_DEVICE)
        hardware_buffer_size = _validate.integer(hardware_buffer_size, "hardware_buffer_size", minimum=1 << 20,
                                                 maximum=MAX_HARDWARE_BUFFER)
        decode_period = _validate.finite_positive_float(decode_period, "decode_period", maximum=MAX_DECODE_PERIOD_S)
        if decode_period < MIN_DECODE_PERIOD_S:
            raise ValueError(
                f"decode_period must be at least {MIN_DECODE_PERIOD_S:g} s; got {decode_period!r}. Each decode takes "
                "every sample waiting in the hardware buffer, so decoding more often loses nothing less; it only "
                "keeps the decode thread spinning and takes the GIL from your threads. Use 0.001 to 60 (default 0.01)."
            )
        if unit == "ns" and value < MIN_INTERVAL_NS:
            raise ValueError(
                f"Sampling interval {interval!r} ({value} ns) is shorter than gpuscope allows ({MIN_INTERVAL_NS} ns): "
                "PM sampling cannot deliver samples that fast (on the H100, 500 ns lost 99% of them). Use interval="
                f"'{MIN_INTERVAL_NS // 1000}us' or longer; a number without a unit is ns (docs/pm-sampling.md lists "
                "the shortest loss-free interval)."
            )
        if samples_per_image is not None:
            samples_per_image = _validate.integer(samples_per_image, "samples_per_image", minimum=2,
                                                  maximum=MAX_SAMPLES_PER_IMAGE)
        if image_pool is not None:
            image_pool = _validate.positive_int(image_pool, "image_pool", maximum=MAX_IMAGE_POOL)
        evaluators = _validate.positive_int(evaluators, "evaluators", maximum=MAX_EVALUATORS)
        evaluate_in = _validate.choice(evaluate_in, "evaluate_in", ("process", "thread"))
        self.kernels = _validate.choice(kernels, "kernels", (True, False))
        self.image_pool = None if image_pool is None else int(image_pool)
        self.evaluators = int(evaluators)
        self.evaluate_in = evaluate_in
        self._interval_value, self._interval_unit = value, unit
        self._requested_metrics = metrics
        self.device = int(device)
        self.hardware_buffer_size = int(hardware_buffer_size)
        self.decode_period = float(decode_period)
        self._samples_per_image = samples_per_image
        self.metrics: list[str] = []
        self.trigger: Trigger | None = None
        self.interval_ns: int = value if unit == "ns" else 0
        self._state = "new"
        self._pid: int | None = None  # the process that started it: a forked child must leave it alone
        self._torn_down = False  # set once the teardown of stop() has run to its end
        self._dataset = None
        self._handle = None
        self._object: SamplingObject | None = None  # the PM sampling object and what CUPTI was given with it
        self.reused = False  # the sampling object, pool and workers were kept from an earlier session
        self._context = None
        self._initialized = False
        self._decoder: _Pipeline | None = None
        self.lost_samples = 0
        self.stop_call_ns = 0
        self._recorder: _RangeRecorder | None = None
        self._kernel_records = None  # cupti.activity.KernelRecords while kernels=True runs

    # -- lifetime -----------------------------------------------------------------------------------------
    def __enter__(self):
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb):
        interrupted = None
        while True:  # a Ctrl-C that lands before stop() reaches its shielded teardown must not skip it
            try:
                self.stop()
                break
            except KeyboardInterrupt as ki:
                interrupted = interrupted or ki
                if self._torn_down:
                    break
        if interrupted is not None and exc_type is None:
            raise interrupted
        return False

    def start(self) -> "Sampler":
        """Check the metrics, enable PM sampling on the device and start sampling.

        Raises
        ------
        SamplerBusyError
            Another sampler runs on this device.
        NotSinglePassError
            The metrics need more than one pass; the message says which to drop or how to split them.
        UnknownMetricError
            A metric name that the chip cannot PM-sample (the message names close matches).
        ValueError
            An interval in cycles on a chip that samples on a time interval.
        CuptiPermissionError
            This user may not read GPU performance counters.
        CuptiNotSupportedError
            The device does not support PM sampling (MIG, vGPU, ...).
        ProfilerBusyError
            Another profiler (Nsight, another CUPTI client) holds the counters.
        """
        if self._state != "new":
            raise RuntimeError(f"This sampler was already started (state: {self._state}); make a new one.")
        self._pid = os.getpid()
        with _active_lock:
            other = _active.get(self.device)
            if other is not None:
                raise SamplerBusyError(
                    f"A PM sampler is already running on device {self.device} (metrics {other.metrics[:3]}...). "
                    "One sampler per device: stop it first, or sample all the metrics in one sampler."
                )
            _active[self.device] = self
        from gpuscope._gpu import keep as _keep

        _keep.session_open(self.device, _keep.PM_SESSION)  # other processes that ask are told it is open
        try:
            self._setup()
        except BaseException:
            try:
                run_shielded(self._teardown)
            finally:
                _keep.session_closed(self.device, _keep.PM_SESSION)
                with _active_lock:
                    _active.pop(self.device, None)
                self._state = "failed"
            raise
        self._state = "running"
        return self

    def _setup(self) -> None:
        from gpuscope._gpu import device as _device
        from gpuscope._gpu import keep as _keep
        from gpuscope._gpu import metric_lists as _lists
        from gpuscope._range_profiling import ranges as _ranges
        from gpuscope.cupti import activity, host, profiler
        from gpuscope.cupti import pm_sampling as pm
        from gpuscope.cupti._types import PmTriggerMode, ProfilerApi, ProfilerType

        self._context = _device.PrimaryContext(self.device)  # initialises the driver, keeps the device alive
        _keep.import_xarray_soon()  # the Dataset needs it; meanwhile CUPTI works without the GIL
        info = _device.device_info(self.device)
        support = profiler.device_support(self._context_device(), ProfilerApi.PM_SAMPLING)
        if not support.supported:
            from gpuscope.errors import CuptiNotSupportedError

            reasons = ", ".join(support.reasons()) or support.overall.name
            raise CuptiNotSupportedError(27, "cuptiProfilerDeviceSupported", "PM sampling is not supported", reasons)
        profiler.initialize(self._context.handle)
        self._initialized = True
        self.chip = profiler.chip_name(self.device)
        self.availability = _keep.retry_when_busy(self.device, lambda: pm.counter_availability(self.device),
                                                  _keep.PM_SESSION)
        resolved = _lists.resolution(self._requested_metrics, self.chip, "sampling")
        self.metrics, self._set_attrs = list(resolved.metrics), resolved.attrs()
        check_single_pass(self.metrics, self.chip, self.availability)
        self.trigger = choose_trigger(self.chip)
        self._check_interval(info)
        self.device_info = info
        trigger = PmTriggerMode.GPU_TIME_INTERVAL if self.trigger is Trigger.TIME else PmTriggerMode.GPU_SYSCLK_INTERVAL
        samples_per_image = self._samples_per_image or default_samples_per_image(self.interval_ns)
        # an earlier session's sampler, configured the same way, is taken back with its image pool and evaluation
        # workers; anything else kept is released first (a kept range profiler holds the counters: HARDWARE_BUSY)
        self._key = ("pm", self._context.handle, tuple(self.metrics), self.hardware_buffer_size, self._hw_interval,
                     int(trigger), samples_per_image, self.image_pool, self.evaluate_in, self.evaluators)
        self._context_id = self._context.unique_id()
        kept = _keep.reuse(self.device, self._key, self._context_id)
        images = None
        if kept is not None:
            self._object, images, self.reused = kept.profiler, kept.image, True
            self.config = self._object.config  # the image CUPTI was configured with: it keeps its address
            self.image_pool = len(images.images)
        else:
            self.config = host.config_image(self.chip, ProfilerType.PM_SAMPLING, self.metrics, self.availability)

            def enable():  # all or nothing: tried again once other processes gave the counters back
                handle = pm.enable(self.device)
                try:
                    pm.set_config(handle, self.config, self.hardware_buffer_size, self._hw_interval, trigger)
                except BaseException:
                    pm.disable(handle)
                    raise
                return SamplingObject(handle, self.config)

            self._object = _keep.retry_when_busy(self.device, enable, _keep.PM_SESSION)
        self._handle = self._object.handle
        if self.image_pool is None:
            image_bytes = pm.counter_data_size(self._handle, self.metrics, samples_per_image)
            self.image_pool = default_image_pool(samples_per_image, self.interval_ns, image_bytes)
        self._recorder = _RangeRecorder(activity.timestamp)
        self._decoder = _Pipeline(
            self._handle,
            self.chip,
            self.metrics,
            self.availability,
            samples_per_image=samples_per_image,
            pool_size=self.image_pool,
            evaluators=self.evaluators,
            evaluate_in=self.evaluate_in,
            period_s=self.decode_period,
            interval_ns=self.interval_ns,
            images=images,
            hold=self._object.hold,
            on_drain=self._recorder.anchor,
        )
        self._object.evaluation = self._decoder._backend  # closed with the sampling object, before its disable
        self.evaluate_in, self.image_pool = self._decoder.evaluate_in, self._decoder.pool_size
        if self._decoder.pool_note:
            warnings.warn(f"gpuscope PM sampling: {self._decoder.pool_note}.", GpuscopeWarning, stacklevel=4)
        self._open_at_start = [p for p in [_ranges.current_path()] if p]
        _ranges.add_stamp_log(self._recorder.log)
        if self.kernels:
            self._context.make_current()
            self._kernel_records = activity.KernelRecords()
            self._kernel_records.open()
        self.start_ns = activity.timestamp()
        self.wall_clock_ns = time.time_ns()  # the clock link: wall clock at CUPTI time start_ns
        self._wall_start = time.time()
        pm.start(self._handle)
        self._started = True
        self._decoder.start(self.start_ns)

    def _context_device(self) -> int:
        from gpuscope._gpu import device as _device

        err, dev = _device.bindings().cuDeviceGet(self.device)
        return int(dev)

    def _check_interval(self, info) -> None:
        if self._interval_unit == "cycles":
            self._hw_interval = self._interval_value
            # sys-clock rate is not exposed; the SM clock is the estimate, the measured interval is in attrs
            self.interval_ns = max(1, round(self._interval_value * 1e6 / info.sm_clock_khz))
            if self.trigger is Trigger.TIME:
                raise ValueError(
                    f"{self.chip} samples on a time interval; give the interval in time units (e.g. '20us'), "
                    "not cycles."
                )
            return
        if self.trigger is Trigger.SYSCLK:
            self._hw_interval = max(1, round(self.interval_ns * info.sm_clock_khz / 1e6))
        else:
            self._hw_interval = self.interval_ns

    def stop(self) -> None:
        """Stop sampling, decode what is left and release the device (safe to call twice).

        Waits for the evaluator threads to finish the last images. Warns (:class:`GpuscopeWarning`) if samples
        were lost, saying why and what to change. In a child forked while the sampler ran it does nothing: the
        sampler, its threads, workers and CUPTI state stay the parent's, which goes on sampling.
        """
        if self._state not in ("running", "stopping") or self._torn_down:
            return
        if self._forked:  # the parent's sampler: its threads, workers and CUPTI state are not this process's
            self._state = "forked"
            return
        self._state = "stopping"
        run_shielded(self._stop_once)
        message = self._loss_message()
        if message:
            warnings.warn(message, GpuscopeWarning, stacklevel=2)

    def _stop_once(self) -> None:
        try:
            self._stop()
        finally:
            self._torn_down = True

    def _stop(self) -> None:
        from gpuscope.cupti import activity
        from gpuscope.cupti import pm_sampling as pm

        def stop_sampling():
            if self._recorder is not None:
                self._recorder.anchor()  # the range stamps' last link to the CUPTI clock
            self.stop_ns = activity.timestamp()  # no sample can be expected after this
            pm.stop(self._handle)
            self.stop_call_ns = activity.timestamp() - self.stop_ns

        try:
            # not while a decode runs: a Stop during DecodeData lost the samples still in the hardware buffer
            self._decoder.stop_sampling(stop_sampling)
            self._started = False
            self._decoder.finish()
            if self._kernel_records is not None:
                self._close_kernel_records(synchronize=True)
        finally:
            try:
                self._teardown()
            finally:
                from gpuscope._gpu import keep as _keep

                _keep.session_closed(self.device, _keep.PM_SESSION)
                with _active_lock:
                    _active.pop(self.device, None)
                self._state = "stopped"
                if not hasattr(self, "stop_ns"):
                    self.stop_ns = activity.timestamp()
                self._values, self._stamps = self._decoder.series()
                self.lost_samples = self._count_lost()
                from gpuscope._gpu import keep as _keep

                _keep.imports_done()

    def _teardown(self) -> None:
        """Undo whatever :meth:`_setup` did, in reverse; trouble becomes warnings."""
        from gpuscope._gpu import keep as _keep
        from gpuscope._range_profiling import ranges as _ranges
        from gpuscope.cupti import pm_sampling as pm
        from gpuscope.cupti import profiler

        steps = []
        if self._recorder is not None:
            steps.append(("remove range stamp log", lambda: _ranges.remove_stamp_log(self._recorder.log)))
        if self._kernel_records is not None and self._kernel_records._open:
            steps.append(("kernel activity records", self._close_kernel_records))
        started = getattr(self, "_started", False)
        spare = getattr(self._decoder, "spare", None)
        owner, self._object = self._object, None
        keep = (owner is not None and spare is not None and not started and self._context is not None
                and _keep.enabled())
        handle, self._handle = self._handle, None
        if self._decoder is not None and started:
            steps.append(("stop", lambda: (pm.stop(handle), self._decoder.finish())))
        elif self._decoder is not None and not keep:
            steps.append(("evaluation workers", self._decoder.close_workers))
        if keep:
            # a clean stop: the sampling object, its configuration, its image pool and (evaluating in worker
            # processes) the workers that map that pool serve the next session, all of them together: the object
            # keeps the addresses of the images it was given, so none is freed while it lives
            context, self._context = self._context, None
            self._initialized = False
            steps.append(("keep", lambda: _keep.keep(self.device, _keep.Kept(
                self._key, self._context_id, context, owner, owner.config, spare))))
        elif owner is not None:  # the evaluation workers, then cuptiPmSamplingDisable, then the images
            steps.append(("cuptiPmSamplingDisable", owner.close))
        if self._initialized:
            self._initialized = False
            steps.append(("cuptiProfilerDeInitialize", profiler.deinitialize))
        if self._context is not None:
            context, self._context = self._context, None
            steps.append(("release context", context.close))
        for what, step in steps:
            try:
                step()
            except Exception as exc:
                warnings.warn(f"gpuscope PM sampling cleanup ({what}) failed: {exc}", GpuscopeWarning, stacklevel=3)
        self._started = False

    def close(self) -> None:
        """Same as :meth:`stop` (safe to call twice)."""
        self.stop()

    def _close_kernel_records(self, synchronize: bool = False) -> None:
        """Flush and disable CUPTI's kernel activity (after the device finished its kernels, if *synchronize*:
        a kernel still running when the records are flushed has no end time and is counted as incomplete)."""
        if synchronize:
            self._context.synchronize()
        self._kernel_records.close()

    # -- state --------------------------------------------------------------------------------------------
    @property
    def _forked(self) -> bool:
        """True in a child forked from the process that started this sampler."""
        return self._pid is not None and os.getpid() != self._pid

    @property
    def running(self) -> bool:
        return self._state == "running" and not self._forked


def _forget_in_child() -> None:
    """After ``os.fork``: the parent's samplers are not the child's (it may start its own on any device)."""
    global _active_lock
    _active_lock = threading.Lock()
    _active.clear()


os.register_at_fork(after_in_child=_forget_in_child)


#: Images and configs of sampling objects that were never disabled (a disable that failed, a context gone, a parent's
#: object in a forked child): CUPTI may still hold their addresses, so they are never freed.
_never_freed: list = []


class SamplingObject:
    """A CUPTI PM sampling object (``cuptiPmSamplingEnable``) and everything CUPTI was given with it.

    CUPTI keeps the addresses it is given: the config image of ``SetConfig`` and the counter-data images initialised
    and decoded into for the object. So the object holds every one of them (:meth:`hold`) until it is disabled, and
    the evaluation workers whose shared memory holds its pool (:attr:`evaluation`) are stopped with it. A session
    that ends cleanly hands it to :mod:`gpuscope._gpu.keep` with its pool; the next session configured the same way
    takes all of it back. :meth:`close` ends them in order: workers stopped and joined, ``cuptiPmSamplingDisable``,
    then the images let go of (their memory unmapped once nothing else holds them).
    """

    def __init__(self, handle: int, config):
        self.handle = handle
        self.config = config
        self.evaluation = None  # the ProcessEvaluation of its pool, or None (evaluated in threads)
        self._held = [config]

    def hold(self, image) -> None:
        """Keep *image*, whose address CUPTI has been or is about to be given, until the object is disabled."""
        self._held.append(image)

    def usable(self) -> bool:
        """Whether it can serve another session: its evaluation workers, if any, all alive and idle (asked when
        :func:`gpuscope._gpu.keep.take` hands it back; a worker that died since the last session makes it unusable,
        and that session starts afresh)."""
        return self.handle is not None and (self.evaluation is None or self.evaluation.reusable())

    def close(self) -> None:
        """Stop the evaluation workers, ``cuptiPmSamplingDisable``, then let go of the images (once; safe twice).
        If the disable fails, the images are never freed."""
        from gpuscope.cupti import pm_sampling as pm

        evaluation, self.evaluation = self.evaluation, None
        handle, self.handle = self.handle, None
        try:
            if evaluation is not None:
                evaluation.close()
        finally:
            if handle is not None:
                try:
                    pm.disable(handle)
                except BaseException:
                    self.detach()
                    raise
            self._held = []

    def detach(self) -> None:
        """Never disable it (its context is gone, its disable failed, or it is a forked child's copy of the parent's):
        its images are kept for good, and its workers stopped (in a forked child only the child's copies of their
        connections are closed: the workers are the parent's)."""
        self.handle = None
        _never_freed.extend(self._held)
        self._held = []
        evaluation, self.evaluation = self.evaluation, None
        if evaluation is not None:
            evaluation.close()
