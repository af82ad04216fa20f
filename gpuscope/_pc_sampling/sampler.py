"""``gpuscope.pc_sample``: where and why warps stall, per PC and source line, from CUPTI PC sampling.

Continuous mode (kernels are not serialised); PC sampling is enabled at the start of the ``with`` block and
disabled at its end, each after a device synchronisation, so only the code inside is sampled; a background thread drains CUPTI while the block runs, and the rest is drained at the end.
The records become a Dataset in :mod:`gpuscope._pc_sampling.records` (stall reasons keep CUPTI's names and are
grouped into the Top-Down categories); :mod:`gpuscope._pc_sampling.messages` says what lost samples mean;
:func:`gpuscope._pc_sampling.fast.fast_topdown` turns the per-kernel stall fractions plus three IPC metrics from
one range-profiler pass into the Top-Down hierarchy.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import warnings
import weakref

import numpy as np

from gpuscope._pc_sampling.messages import overflow_message, unattributed_message, unsampled_message
from gpuscope._pc_sampling.records import graph_nodes, records_dataset, sample_total
from gpuscope._range_profiling.graphs import GraphKernels
from gpuscope.errors import GpuscopeError, GpuscopeWarning, SamplerBusyError

__all__ = ["pc_sample", "PCSampler"]

#: Period of the CUPTI default (it depends on the SM count) is used when ``period=None``.
MIN_PERIOD_LOG2, MAX_PERIOD_LOG2 = 5, 31

_active: dict[int, PCSampler] = {}  # device index -> open sampler
_active_lock = threading.Lock()


def _period_log2(period) -> int | None:
    if period is None:
        return None
    try:
        cycles = int(period)
    except (TypeError, ValueError):
        raise ValueError(f"period must be a number of cycles, got {period!r}") from None
    if cycles != period or cycles <= 0 or cycles & (cycles - 1):
        n = max(MIN_PERIOD_LOG2, min(MAX_PERIOD_LOG2, round(np.log2(max(float(period), 1.0)))))
        raise ValueError(
            f"period={period!r}: CUPTI samples every 2**n cycles with n in 5..31, so period must be a power of "
            f"two from 32 to 2147483648 cycles; the nearest is period={2**n}"
        )
    n = cycles.bit_length() - 1
    if not MIN_PERIOD_LOG2 <= n <= MAX_PERIOD_LOG2:
        raise ValueError(
            f"period={cycles} cycles is out of range: CUPTI accepts 2**5 = 32 to 2**31 = 2147483648 cycles"
        )
    return n


def default_hardware_buffer(period_log2: int | None) -> int | None:
    """PC sampling's device buffer in bytes for a period of ``2**period_log2`` cycles.

    CUPTI sets the buffer up at a block's first launch (0.29 s at 512 MiB, 0.11 s at 128 MiB on the H100), and
    a full buffer loses samples that CUPTI does not count. Below 2**15 the GPU makes samples faster than CUPTI
    decodes them (about 7.9 M samples in 30 ms of GPU time at 2**10, decoded at 15-20 M per second), so the
    buffer holds the backlog: CUPTI's 512 MiB (None). From 2**15 decoding keeps up, and 128 MiB is enough.
    """
    if period_log2 is None or period_log2 < 15:
        return None
    return 128 << 20


def _get_data(ctx, buffer):
    from gpuscope.cupti import pc_sampling as C

    return C.get_data(ctx, buffer)


def _count_launches(ctx: int, on_graph=None):
    """A launch recorder counting the launches on context *ctx* per kernel symbol, and the dict it fills (for the
    blocks that name kernels which ran but got nothing: ``pc_sample``, ``source_counters``); *on_graph* as
    :class:`~gpuscope.cupti.callbacks.LaunchRecorder` takes it.

    Raises
    ------
    GpuscopeError
        Another CUPTI client holds the callback subscriber.
    """
    from gpuscope.cupti import callbacks

    counts: dict[str, int] = {}

    def on_launch(launch):
        if launch.context == ctx:
            counts[launch.symbol] = counts.get(launch.symbol, 0) + 1

    return callbacks.LaunchRecorder(on_launch, on_graph=on_graph), counts


def _synchronize(context) -> None:
    context.synchronize()


class PCSampler:
    """An open PC-sampling session on one device; use :func:`pc_sample` to make one.

    Attributes
    ----------
    dataset : xarray.Dataset or None
        The result, set when the ``with`` block ends.
    records : PCRecords
        Raw records (all drains joined), for saving or rebuilding the Dataset.
    """

    def __init__(self, period=None, device: int = 0, kernels=(), sources=None, drain_interval: float = 0.1,
                 buffer_pcs: int = 10000, hardware_buffer_size: int | None = None,
                 scratch_buffer_size: int | None = None, mode: str = "continuous", start_stop: bool = False,
                 worker_sleep_ms: int = 10):
        from gpuscope._range_profiling.filters import checked_int

        if mode not in ("continuous", "serialized"):
            raise ValueError(f"mode must be 'continuous' or 'serialized', got {mode!r}")
        if drain_interval is not None and drain_interval <= 0:
            raise ValueError(f"drain_interval must be a positive number of seconds or None, got {drain_interval!r}")
        if int(buffer_pcs) < 1:
            raise ValueError(f"buffer_pcs must be at least 1, got {buffer_pcs!r}")
        self.period_log2 = _period_log2(period)
        self.device = int(device)
        self.mode = mode
        self.drain_interval = drain_interval
        self.buffer_pcs = int(buffer_pcs)
        self.hardware_buffer_size = default_hardware_buffer(self.period_log2) if hardware_buffer_size is None \
            else checked_int(hardware_buffer_size, "hardware_buffer_size", minimum=1 << 20)
        self.scratch_buffer_size = scratch_buffer_size
        self.start_stop = bool(start_stop)
        self.worker_sleep_ms = int(worker_sleep_ms)
        self._kernels = list(kernels)
        self._sources = dict(sources or {})
        self.dataset = None
        self.records = None
        self.reason_indices = None
        self.reason_names = None
        self.drain_errors: list[str] = []
        self._parts = []
        self._overflowed = False  # CUPTI's hardware buffer filled (GetData: OUT_OF_MEMORY)
        self._lock = threading.Lock()
        self._stop_event = threading.Event()
        self._thread = None
        self._context = None
        self._buffer = None
        self._state = "new"  # new -> sampling -> closed
        self._finalizer = None
        self._recorder = None
        #: whether CUPTI was detached when the block started ("detached", "not attached" or why not)
        self.cupti_detach = ""
        #: mangled name -> launches in the block on this context (None: not tracked, another recorder was open)
        self.launches: dict[str, int] | None = None
        #: CUDA graph launches in the block (their kernels are sampled, but are no launches of their own)
        self.graph_launches = 0
        self._graph_kernels = GraphKernels()  # their kernels' activity records: graph and node ids

    # -- lifecycle -------------------------------------------------------------------------------------------
    def __enter__(self) -> PCSampler:
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(failed=exc_type is not None)

    def _config(self):
        from gpuscope.cupti import pc_sampling as C

        mode = C.PCSamplingCollectionMode.CONTINUOUS if self.mode == "continuous" else C.PCSamplingCollectionMode.KERNEL_SERIALIZED
        attrs = [
            (C.PCSamplingAttribute.STALL_REASON, self.reason_indices),
            (C.PCSamplingAttribute.COLLECTION_MODE, mode),
            (C.PCSamplingAttribute.ENABLE_START_STOP_CONTROL, int(self.start_stop)),
            (C.PCSamplingAttribute.OUTPUT_DATA_FORMAT, C.PCSamplingOutputDataFormat.PARSED),
            (C.PCSamplingAttribute.SAMPLING_DATA_BUFFER, self._buffer.address),
        ]
        if self.period_log2 is not None:
            attrs.append((C.PCSamplingAttribute.SAMPLING_PERIOD, self.period_log2))
        if self.hardware_buffer_size is not None:
            attrs.append((C.PCSamplingAttribute.HARDWARE_BUFFER_SIZE, int(self.hardware_buffer_size)))
        attrs.append((C.PCSamplingAttribute.WORKER_THREAD_PERIODIC_SLEEP_SPAN, self.worker_sleep_ms))
        if self.scratch_buffer_size is not None:
            attrs.append((C.PCSamplingAttribute.SCRATCH_BUFFER_SIZE, int(self.scratch_buffer_size)))
        return attrs

    def start(self) -> None:
        """Enable, configure and start PC sampling (``with`` calls this).

        Raises
        ------
        SamplerBusyError
            Another ``pc_sample`` is open on the device.
        gpuscope.errors.CuptiPermissionError
            This user may not profile the GPU.
        gpuscope.errors.CuptiError
            CUPTI refused (another tool holds PC sampling on the GPU, an unsupported device, ...).
        """
        from gpuscope._gpu import device as _device
        from gpuscope._gpu import keep as _keep
        from gpuscope.cupti import pc_sampling as C

        if self._state != "new":
            raise GpuscopeError("this PC sampler was already used; make a new one with gpuscope.pc_sample()")
        with _active_lock:
            if self.device in _active:
                raise SamplerBusyError(
                    f"a PC sampler is already open on device {self.device}; CUPTI samples one context per GPU. "
                    "Leave the other 'with gpuscope.pc_sample()' block first, or sample inside it."
                )
            _active[self.device] = self
            alone = len(_active) == 1
        enabled = False
        try:
            # a kernel that ran while CUPTI was attached outside a PC block gets no samples: start from a CUPTI that
            # has forgotten the process (this also releases a kept range profiler, which blocks PC records)
            self.cupti_detach = _keep.detach_cupti() if alone else "another pc_sample block is open"
            _keep.release(self.device)
            _keep.import_xarray_soon()  # the Dataset needs it; meanwhile CUPTI works without the GIL
            self.device_info = _device.device_info(self.device)
            self._context = _device.PrimaryContext(self.device)
            _synchronize(self._context)  # work launched before the block is not sampled
            ctx = self._context.handle
            C.enable(ctx)
            enabled = True
            self.reason_indices, self.reason_names = C.stall_reasons(ctx)
            self._buffer = C.lease_buffer(self.buffer_pcs, len(self.reason_names))
            C.set_attributes(ctx, self._config())
            if self.start_stop:
                C.start(ctx)
        except BaseException:
            if enabled:
                _quietly(C.disable, self._context.handle)
            self._release()
            raise
        self._state = "sampling"
        self._finalizer = weakref.finalize(self, _emergency_disable, self._context.handle, self.device)
        self._track_launches()
        self._started_ns = time.perf_counter_ns()
        if self.drain_interval:
            self._thread = threading.Thread(target=self._drain_loop, name="gpuscope-pc-drain", daemon=True)
            self._thread.start()

    def _track_launches(self) -> None:
        """Count the block's launches per kernel (CUPTI's launch callbacks), so that a kernel that ran but got no
        samples is named even when CUPTI does not count its samples as unattributed (seen on the H100), and hear
        graph launches (:meth:`_on_graph`)."""
        try:
            self._recorder, counts = _count_launches(self._context.handle, on_graph=self._on_graph)
        except GpuscopeError as exc:  # another CUPTI subscriber (not gpuscope) holds the callbacks
            self.drain_errors.append(f"launches not counted: {exc}")
            return
        self.launches = counts

    def _on_graph(self, correlation: int, params: int) -> None:
        """At a graph launch's entry (CUPTI's callback, on the launching thread): open kernel activity records the
        first time, keeping those of graph launches, for the graph and node ids of the kernels PC samples name.
        PC records carry neither (nor the launch, in continuous mode). Never waits, never raises."""
        recorder = self._recorder
        if recorder is not None and self._graph_kernels.may_open():
            self._graph_kernels.open(recorder.graph_correlations.__contains__)

    def graph_nodes(self) -> tuple[dict | None, str]:
        """The CUDA graph kernel nodes that ran on this device in the block
        (:func:`gpuscope._pc_sampling.records.graph_nodes`; no row where no graph was launched), or None and why
        they are not known."""
        if self.launches is None:
            return None, "launches were not heard (another CUPTI client holds the callbacks)"
        if not self.graph_launches:
            return graph_nodes([]), ""
        records = self._graph_kernels.records
        if records is None:
            return None, self._graph_kernels.unavailable or "CUPTI's kernel activity records were not opened"
        return graph_nodes([r for r in records if r[3] == self.device]), ""  # deviceId: the CUDA ordinal

    def _release(self) -> None:
        if self._buffer is not None:
            from gpuscope.cupti import pc_sampling as C

            C.return_buffer(self._buffer)  # kept for the next block: CUPTI may still write into it
            self._buffer = None  # the next block of its shape owns it now
        if self._recorder is not None:
            _quietly(self._recorder.close)
            self.graph_launches = self._recorder.graph_launches
            self._recorder = None
        self._graph_kernels.close()  # flushed after close() synchronised: every kernel has its end time
        if self._context is not None:
            _quietly(self._context.close)
        with _active_lock:
            if _active.get(self.device) is self:
                del _active[self.device]

    def _drain_once(self) -> int:
        with self._lock:
            part = self._fetch()
            return self._buffer.remaining_pcs if part is not None else 0

    def _fetch(self):
        """``cuptiPCSamplingGetData`` once, its records kept; None once CUPTI's hardware buffer has overflowed.

        CUPTI answers ``OUT_OF_MEMORY`` when its hardware buffer is full (seen on the H100 at period 2**10 with
        buffers of 128 MiB and less, on a 1 ms kernel). The samples it lost are not counted; what it holds comes
        with the disable, so the block goes on to it, and the Dataset says the buffer was full (warned)."""
        from gpuscope.errors import CuptiMemoryError

        if self._overflowed:
            return None
        try:
            part = _get_data(self._context.handle, self._buffer)
        except CuptiMemoryError:
            self._overflowed = True
            return None
        self._parts.append(part)
        return part

    def _settle(self) -> None:
        """Drain until CUPTI's worker threads have decoded everything: several empty polls in a row."""
        span = self.worker_sleep_ms / 1000.0
        deadline = time.monotonic() + max(1.0, 20 * span)
        empty = 0
        while empty < 3 and time.monotonic() < deadline:
            with self._lock:
                part = self._fetch()
                if part is None:  # overflowed: the disable brings what CUPTI still holds
                    return
                remaining = self._buffer.remaining_pcs
            if remaining:
                continue
            empty = 0 if (part.total_samples or part.samples.size) else empty + 1
            time.sleep(span)

    def _drain_loop(self) -> None:
        while not self._stop_event.wait(self.drain_interval):
            try:
                self._context.make_current()
                self._drain_once()
            except Exception as exc:  # keep the data CUPTI holds; the final drain gets it
                self.drain_errors.append(f"{type(exc).__name__}: {exc}")
                return

    def close(self, failed: bool = False) -> None:
        """Stop sampling, drain everything, disable, and build :attr:`dataset`. Safe to call twice.

        With ``failed=True`` (an exception left the block), trouble while stopping becomes a warning so that
        the original exception is the one the caller sees.
        """
        from gpuscope.cupti import pc_sampling as C

        if self._state != "sampling":
            return
        self._state = "closed"
        self._stop_event.set()
        if self._thread is not None:
            self._thread.join()
        ctx = self._context.handle
        error = None
        try:
            _synchronize(self._context)  # everything launched inside the block has run
            if self.start_stop:
                C.stop(ctx)
            self._settle()
        except Exception as exc:
            error = exc
        finally:
            try:
                C.disable(ctx)
                self._parts.append(self._buffer.take())  # disable copies what CUPTI still held
            except Exception as exc:
                error = error or exc
            if self._finalizer is not None:
                self._finalizer.detach()
            self._release()
        if error is not None:
            if failed:
                warnings.warn(f"PC sampling did not stop cleanly: {error}", GpuscopeWarning, stacklevel=3)
                return
            raise error
        self.records = C.PCRecords.concat(self._parts)
        if self._overflowed:
            self.records = dataclasses.replace(self.records, hardware_buffer_full=True)
        self._parts = []
        total = sample_total(self.records, self.reason_indices, self.reason_names)
        if self.records.dropped_samples or self.records.hardware_buffer_full:
            warnings.warn(overflow_message(self.records.dropped_samples, total,
                                           bool(self.records.hardware_buffer_full), self.period_log2),
                          GpuscopeWarning, stacklevel=3)
        missing = self.kernels_without_samples()
        if missing:
            from gpuscope._schema.names import kernel_name

            missing = {kernel_name(k): n for k, n in missing.items()}
            warnings.warn(unsampled_message(missing, self.records.non_user_kernel_samples, total, self.cupti_detach),
                          GpuscopeWarning, stacklevel=3)
        elif self.records.non_user_kernel_samples:
            warnings.warn(unattributed_message(self.records.non_user_kernel_samples, total, self.cupti_detach),
                          GpuscopeWarning, stacklevel=3)
        if not failed:
            from gpuscope._gpu import keep as _keep

            _keep.imports_done()
            self.dataset = self.build()

    def kernels_without_samples(self) -> dict[str, int]:
        """Kernels launched in the block (on its context) that have no PC record: mangled name -> launches.
        Empty when launches were not tracked."""
        if not self.launches or self.records is None:
            return {}
        sampled = set(map(str, self.records.function))
        return {k: n for k, n in sorted(self.launches.items()) if k and k not in sampled}

    def build(self, sources=None):
        """(Re)build the Dataset from :attr:`records`, e.g. with more ``sources`` for line text."""
        from gpuscope._pc_sampling.source import CubinRegistry, SourceMap
        from gpuscope._schema.names import kernel_name
        from gpuscope.cupti import profiler

        registry = CubinRegistry()
        for kernel in self._kernels:
            registry.add(kernel)
        source_map = SourceMap(registry, sources={**self._sources, **(sources or {})})
        chip = ""
        try:
            profiler.initialize()
            try:
                chip = profiler.chip_name(self.device)
            finally:
                profiler.deinitialize()
        except Exception:
            pass  # the chip name is a label here; PC sampling itself did not need it
        attrs = {
            "collection_mode": self.mode,
            "sampling_period_cycles": 0 if self.period_log2 is None else 2**self.period_log2,
            "hardware_buffer_bytes": 512 << 20 if self.hardware_buffer_size is None else self.hardware_buffer_size,
            "launches_counted": -1 if self.launches is None else sum(self.launches.values()),
            "graph_launches": self.graph_launches,
            "kernels_without_samples": ", ".join(f"{kernel_name(k)} ({n})"
                                                 for k, n in self.kernels_without_samples().items()),
            "drain_errors": "; ".join(self.drain_errors),
            "cupti_detach": self.cupti_detach,
        }
        nodes, attrs["graph_ids_unavailable"] = self.graph_nodes()
        ds = records_dataset(self.records, self.reason_indices, self.reason_names, source_map,
                             device_info=self.device_info, chip=chip, attrs=attrs, launches=self.launches,
                             nodes=nodes)
        if ds.attrs["functions_without_lineinfo"]:
            warnings.warn(
                "no source lines for " + ds.attrs["functions_without_lineinfo"]
                + ": compile with line info (@cuda.jit(lineinfo=True), CuPy options=('-lineinfo',)); "
                "their samples keep function and PC offset.",
                GpuscopeWarning,
                stacklevel=3,
            )
        return ds


def _quietly(fn, *args) -> None:
    try:
        fn(*args)
    except Exception as exc:
        warnings.warn(f"cleanup failed: {exc}", GpuscopeWarning, stacklevel=3)


def _emergency_disable(ctx: int, device: int) -> None:
    """A sampler dropped without close(): leave CUPTI usable."""
    from gpuscope.cupti import pc_sampling as C

    try:
        C.stop(ctx)
    except Exception:
        pass
    try:
        C.disable(ctx)
    except Exception:
        pass
    with _active_lock:
        _active.pop(device, None)


def pc_sample(period=None, device: int = 0, *, kernels=(), sources=None, drain_interval: float | None = 0.1,
              buffer_pcs: int = 10000, hardware_buffer_size: int | None = None,
              scratch_buffer_size: int | None = None, mode: str = "continuous", start_stop: bool = False,
              worker_sleep_ms: int = 10) -> PCSampler:
    """Sample warp program counters and stall reasons of the kernels launched inside a ``with`` block.

    Kernels run as usual (continuous mode, no serialisation); only work launched inside the block is sampled
    (the device is synchronised at entry and exit). ``gpuscope.range`` blocks may be nested inside.

    Parameters
    ----------
    period : int, optional
        Cycles between samples per SM: a power of two from 32 to 2**31. Default: CUPTI's choice for the GPU.
        Shorter periods give more samples and more overhead.
    device : int
        GPU index (its primary context, the one Numba and CuPy use).
    kernels : sequence
        Numba dispatchers, CuPy kernels, cubin bytes or paths whose cubins map PCs to source lines. Module-level
        Numba kernels and kernels in CuPy's cache are found without this.
    sources : dict, optional
        File name -> source text, for line text of files not on disk here.
    drain_interval : float or None
        Seconds between background drains of CUPTI's buffers while the block runs; None drains only at the end.
    buffer_pcs : int
        PCs per drain.
    hardware_buffer_size, scratch_buffer_size : int, optional
        CUPTI's device buffer (default 512 MiB) and host scratch buffer (default 1 MiB), in bytes.
    mode : {"continuous", "serialized"}
        ``"serialized"`` runs one kernel at a time.
    start_stop : bool
        Also use CUPTI's start/stop control inside the enabled period. Off by default: on the H100 with CUPTI
        13.0 it gave no samples at all, while enabling at the block's start and disabling at its end (after a
        device synchronisation each) samples exactly the block.
    worker_sleep_ms : int
        How often CUPTI's decode threads wake (CUPTI's default is 100 ms); the end of the block waits a few of
        these periods for the last samples.

    Returns
    -------
    PCSampler
        Use it in ``with``; ``.dataset`` holds the result afterwards (see
        :func:`gpuscope._results.build.pc_sampling_dataset`).

    Raises
    ------
    ValueError
        A period that is not a power of two in range, or another bad argument (raised here, before any CUDA).
    SamplerBusyError
        On entering the block, when another PC sampler is open on the device.
    gpuscope.errors.CuptiPermissionError
        On entering, when this user may not profile the GPU.
    gpuscope.errors.CuptiError
        On entering, when CUPTI refuses PC sampling (another tool holds it, unsupported device).

    Examples
    --------
    >>> with gpuscope.pc_sample(period=2**12) as pcs:                     # doctest: +SKIP
    ...     stream[blocks, threads](x, y)
    >>> pcs.dataset.samples.sum("pc").to_series()                          # doctest: +SKIP
    """
    return PCSampler(period=period, device=device, kernels=kernels, sources=sources, drain_interval=drain_interval,
                     buffer_pcs=buffer_pcs, hardware_buffer_size=hardware_buffer_size,
                     scratch_buffer_size=scratch_buffer_size, mode=mode, start_stop=start_stop,
                     worker_sleep_ms=worker_sleep_ms)
