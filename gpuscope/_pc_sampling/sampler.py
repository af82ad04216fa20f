"""``gpuscope.pc_sample``: where and why warps stall, per PC and source line, from CUPTI PC sampling.

Continuous mode (kernels are not serialised); PC sampling is enabled at the start of the ``with`` block and
disabled at its end, each after a device synchronisation, so only the code inside is sampled; a background thread drains CUPTI while the block runs, and the rest is drained at the end.
Stall reasons keep CUPTI's names and are grouped into the Top-Down categories (:data:`STALL_REASONS`).
:func:`fast_topdown` turns the per-kernel stall fractions plus three IPC metrics from one range-profiler pass
into the Top-Down hierarchy.
"""

from __future__ import annotations

import threading
import time
import warnings
import weakref

import numpy as np

from gpuscope.errors import GpuscopeError, GpuscopeWarning, SamplerBusyError

__all__ = ["pc_sample", "PCSampler", "STALL_REASONS", "CUPTI_PREFIX", "records_dataset", "stall_percentages",
           "fast_topdown"]

#: Prefix of every stall-reason name CUPTI gives; the Dataset's ``stall_reason`` dim drops it.
CUPTI_PREFIX = "smsp__pcsamp_warps_issue_stalled_"

#: Warp state -> (Top-Down category, short description). Categories follow
#: :data:`gpuscope.metrics.topdown.STALL_PARENT` (the counter-based hierarchy), with ``issued`` for the two
#: states that are not stalls: ``selected`` (the warp issued) and ``not_selected`` (ready, another warp issued).
#: PC sampling says ``no_instructions`` where the counters say ``no_instruction``.
STALL_REASONS: dict[str, tuple[str, str]] = {
    "selected": ("issued", "the warp issued an instruction"),
    "not_selected": ("issued", "ready, but the scheduler issued another warp"),
    "no_instructions": ("frontend_fetch", "no instruction fetched yet, or an instruction cache miss"),
    "barrier": ("frontend_fetch", "waiting for sibling warps at a CTA barrier (__syncthreads)"),
    "membar": ("frontend_fetch", "waiting on a memory barrier"),
    "branch_resolving": ("frontend_fetch", "waiting for a branch target or the branch mask"),
    "sleeping": ("frontend_fetch", "all threads blocked, yielded or sleeping"),
    "misc": ("frontend_decode", "miscellaneous hardware reason"),
    "dispatch_stall": ("frontend_decode", "the dispatcher held the warp back (pipeline interlock)"),
    "math_pipe_throttle": ("backend_core", "waiting for an oversubscribed math pipe"),
    "wait": ("backend_core", "fixed-latency execution dependency (e.g. a dependent FMA)"),
    "gmma": ("backend_core", "waiting on a warpgroup MMA (Hopper tensor cores)"),
    "warpgroup_arrive": ("backend_core", "waiting at a warpgroup arrive barrier before a warpgroup MMA (Hopper)"),
    "long_scoreboard": ("backend_memory", "waiting for L1TEX data: global, local, texture"),
    "short_scoreboard": ("backend_memory", "waiting for MIO data: shared memory, special math"),
    "mio_throttle": ("backend_memory", "MIO instruction queue full"),
    "lg_throttle": ("backend_memory", "local/global memory instruction queue full"),
    "tex_throttle": ("backend_memory", "texture instruction queue full"),
    "drain": ("backend_memory", "after EXIT, waiting for memory writes to drain"),
    "imc_miss": ("backend_memory", "immediate constant cache miss"),
}

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


# ---------------------------------------------------------------------------------------------------------------
# Records -> Dataset (also used on recorded fixtures, without a GPU)


def _reason_table(cupti_names: list[str]):
    """Base states (without ``_not_issued``) in CUPTI's order, and name -> (column, is_not_issued)."""
    base: list[str] = []
    column: dict[str, tuple[int, bool]] = {}
    for full in cupti_names:
        if not full.startswith(CUPTI_PREFIX):
            continue  # smsp__pcsamp_sample_count, smsp__pcsamp_samples_data_dropped: counts, not warp states
        short = full[len(CUPTI_PREFIX):]
        not_issued = short.endswith("_not_issued")
        stem = short[: -len("_not_issued")] if not_issued else short
        if stem not in base:
            base.append(stem)
        column[full] = (base.index(stem), not_issued)
    return base, column


def sample_total(records, reason_indices, reason_names) -> int:
    """Every sample accounted for: those in the records, dropped ones, and those CUPTI could not attribute.

    A sample is counted once, in its warp state; the ``*_not_issued`` rows repeat samples already counted.
    CUPTI's own ``totalSamples`` (``records.total_samples``) is not used: on the H100 (CUPTI 13.0) it leaves out
    what a drain delivers in a process's first block and what ``cuptiPCSamplingDisable`` hands over, so at
    long periods it reports a few hundred samples where the records hold 10^5 (docs/pc-sampling.md).
    """
    _, column = _reason_table(list(reason_names))
    states = [int(i) for i, n in zip(reason_indices, reason_names) if n in column and not column[n][1]]
    delivered = int(np.sum(records.samples[np.isin(records.stall_reason_index, states)]))
    return delivered + int(records.dropped_samples) + int(records.non_user_kernel_samples)


def records_dataset(records, reason_indices, reason_names, source_map, *, device_info=None, chip="", attrs=None):
    """Build the PC-sampling Dataset from raw records (:class:`gpuscope.cupti.pc_sampling.PCRecords`).

    Parameters
    ----------
    records : PCRecords
        Rows of (cubin CRC, PC offset, function, stall-reason index, samples), possibly repeated per PC.
    reason_indices, reason_names : sequence
        CUPTI's stall-reason table (``cuptiPCSamplingGetStallReasons``).
    source_map : gpuscope._pc_sampling.source.SourceMap
        Maps PCs to file and line.

    Returns
    -------
    xarray.Dataset
        See :func:`gpuscope._results.build.pc_sampling_dataset`.
    """
    from gpuscope._results import build as _results
    from gpuscope._pc_sampling.source import pretty_function

    base, column = _reason_table(list(reason_names))
    by_index = {int(i): column[n] for i, n in zip(reason_indices, reason_names) if n in column}
    keys: dict[tuple[int, str, int], int] = {}
    samples_rows: list[tuple[int, int, bool, int]] = []
    for crc, fn, off, idx, n in zip(records.cubin_crc, records.function, records.pc_offset,
                                    records.stall_reason_index, records.samples):
        if int(idx) in by_index:
            row = keys.setdefault((int(crc), str(fn), int(off)), len(keys))
            samples_rows.append((row, *by_index[int(idx)], int(n)))
    samples = np.zeros((len(keys), len(base)), dtype=np.int64)
    not_issued = np.zeros_like(samples)
    for row, col, is_not_issued, n in samples_rows:
        (not_issued if is_not_issued else samples)[row, col] += n
    locations = [source_map.locate(crc, fn, off) for crc, fn, off in keys]
    pcs = {
        "function": [pretty_function(fn) for _, fn, _ in keys],
        "mangled_name": [fn for _, fn, _ in keys],
        "pc_offset": [off for _, _, off in keys],
        "cubin_crc": [crc for crc, _, _ in keys],
        "file": [loc.file for loc in locations],
        "line": [loc.line for loc in locations],
        "line_text": [loc.text for loc in locations],
    }
    reasons = {
        "name": base,
        "cupti_name": [CUPTI_PREFIX + b for b in base],
        "category": [STALL_REASONS.get(b, ("other", ""))[0] for b in base],
        "description": [STALL_REASONS.get(b, ("other", "not described by gpuscope"))[1] for b in base],
    }
    totals = {
        "total_samples": sample_total(records, reason_indices, reason_names),
        "cupti_total_samples": records.total_samples,
        "dropped_samples": records.dropped_samples,
        "non_user_kernel_samples": records.non_user_kernel_samples,
        "hardware_buffer_full": int(records.hardware_buffer_full),
    }
    extra = dict(attrs or {})
    # comma-separated strings, not lists: an empty list does not survive netCDF
    extra["functions_without_lineinfo"] = ", ".join(sorted(pretty_function(f) for f in source_map.without_lineinfo))
    extra["functions_without_cubin"] = ", ".join(sorted(pretty_function(f) for f in source_map.without_cubin))
    return _results.pc_sampling_dataset(pcs, samples, not_issued, reasons, totals, device_info, chip, extra)


# ---------------------------------------------------------------------------------------------------------------
# Fast Top-Down


def stall_percentages(pc, counter_names: bool = True):
    """Per-kernel warp-state percentages from PC samples, as the counter metrics Top-Down reads.

    Each kernel's samples over all warp states are 100%. With ``counter_names``, variables are named like the
    counter metrics (``smsp__warp_issue_stalled_<reason>_per_warp_active.pct``; ``no_instructions`` becomes
    ``no_instruction``) so that :func:`gpuscope.metrics.topdown.topdown` reads them.

    Returns
    -------
    xarray.Dataset
        Dim ``kernel``.
    """
    import xarray as xr

    from gpuscope.metrics.topdown import stall_metric

    from gpuscope.metrics.topdown import STALL_PARENT

    counts = pc["kernel_samples"].astype(float)
    pct = 100.0 * counts / counts.sum("stall_reason").where(lambda t: t > 0)
    out = {}
    for reason in pc["stall_reason"].values.tolist():
        name = "no_instruction" if reason == "no_instructions" else reason
        key = stall_metric(name) if counter_names else reason
        out[key] = pct.sel(stall_reason=reason, drop=True).assign_attrs(units="percent", source="pc_sampling")
    if counter_names:
        # A state the GPU has but CUPTI did not list, or that had no samples, is 0%, not missing.
        zero = xr.zeros_like(pct.isel(stall_reason=0, drop=True)).assign_attrs(units="percent", source="pc_sampling")
        for name in STALL_PARENT:
            out.setdefault(stall_metric(name), zero)
    return xr.Dataset(out, attrs=dict(pc.attrs))


def fast_topdown(pc, ipc, levels=(1, 2, 3), arch=None, check: str = "ignore"):
    """Top-Down from one range-profiler pass (IPC, issued IPC, warp efficiency) and PC-sampled stall shares.

    Parameters
    ----------
    pc : xarray.Dataset
        A PC-sampling Dataset (``pc_sample(...).dataset``).
    ipc : xarray.Dataset
        Dim ``kernel`` (names as in ``pc.kernel``) with ``smsp__inst_executed.avg.per_cycle_active``,
        ``smsp__inst_issued.avg.per_cycle_active`` and ``smsp__thread_inst_executed_per_inst_executed.ratio``.
    levels, arch, check
        As for :func:`gpuscope.metrics.topdown.topdown`; ``arch`` defaults to the compute capability in the
        attrs of *pc*; ``check`` defaults to ``"ignore"`` here (PC-sampled shares sum to 100% by construction).

    Returns
    -------
    xarray.Dataset
        The hierarchy per kernel; attr ``topdown_source="fast: 1 range pass + PC sampling"``.

    Raises
    ------
    ValueError
        A kernel of *ipc* has no PC samples.
    """
    from gpuscope.metrics import topdown as td

    stalls = stall_percentages(pc)
    missing = sorted(set(ipc["kernel"].values.tolist()) - set(stalls["kernel"].values.tolist()))
    if missing:
        raise ValueError(f"no PC samples for kernel(s) {missing}; PC-sampled kernels: {stalls['kernel'].values.tolist()}")
    merged = ipc.merge(stalls.sel(kernel=ipc["kernel"]), join="left", compat="override")
    merged.attrs = {**stalls.attrs, **ipc.attrs}
    result = td.topdown(merged, levels=levels, arch=arch or pc.attrs.get("compute_capability"), check=check)
    result.attrs["topdown_source"] = "fast: 1 range pass + PC sampling"
    return result


# ---------------------------------------------------------------------------------------------------------------
# The sampler


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


def _synchronize(context) -> None:
    from gpuscope._gpu import device as _device

    context.make_current()
    _device._check(_device._driver().cuCtxSynchronize(), "cuCtxSynchronize")


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
        samples is named even when CUPTI does not count its samples as unattributed (seen on the H100)."""
        from gpuscope.cupti import callbacks

        ctx = self._context.handle
        counts: dict[str, int] = {}

        def on_launch(launch):
            if launch.context == ctx:
                counts[launch.symbol] = counts.get(launch.symbol, 0) + 1

        try:
            self._recorder = callbacks.LaunchRecorder(on_launch)
        except GpuscopeError as exc:  # another CUPTI subscriber (not gpuscope) holds the callbacks
            self.drain_errors.append(f"launches not counted: {exc}")
            return
        self.launches = counts

    def _release(self) -> None:
        if self._buffer is not None:
            from gpuscope.cupti import pc_sampling as C

            C.return_buffer(self._buffer)  # kept for the next block: CUPTI may still write into it
        if self._recorder is not None:
            _quietly(self._recorder.close)
            self._recorder = None
        if self._context is not None:
            _quietly(self._context.close)
        with _active_lock:
            if _active.get(self.device) is self:
                del _active[self.device]

    def _drain_once(self) -> int:
        from gpuscope.cupti import pc_sampling as C

        with self._lock:
            part = C.get_data(self._context.handle, self._buffer)
            self._parts.append(part)
            return self._buffer.remaining_pcs

    def _settle(self) -> None:
        """Drain until CUPTI's worker threads have decoded everything: several empty polls in a row."""
        span = self.worker_sleep_ms / 1000.0
        deadline = time.monotonic() + max(1.0, 20 * span)
        empty = 0
        while empty < 3 and time.monotonic() < deadline:
            with self._lock:
                part = _get_data(self._context.handle, self._buffer)
                self._parts.append(part)
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
        self._parts = []
        total = sample_total(self.records, self.reason_indices, self.reason_names)
        if self.records.dropped_samples or self.records.hardware_buffer_full:
            warnings.warn(overflow_message(self.records.dropped_samples, total,
                                           bool(self.records.hardware_buffer_full), self.period_log2),
                          GpuscopeWarning, stacklevel=3)
        missing = self.kernels_without_samples()
        if missing:
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
        from gpuscope._pc_sampling.source import CubinRegistry, SourceMap, pretty_function
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
            "kernels_without_samples": ", ".join(f"{pretty_function(k)} ({n})"
                                                 for k, n in self.kernels_without_samples().items()),
            "drain_errors": "; ".join(self.drain_errors),
            "cupti_detach": self.cupti_detach,
        }
        ds = records_dataset(self.records, self.reason_indices, self.reason_names, source_map,
                             device_info=self.device_info, chip=chip, attrs=attrs)
        if ds.attrs["functions_without_lineinfo"]:
            warnings.warn(
                "no source lines for " + ds.attrs["functions_without_lineinfo"]
                + ": compile with line info (@cuda.jit(lineinfo=True), CuPy options=('-lineinfo',)); "
                "their samples keep function and PC offset.",
                GpuscopeWarning,
                stacklevel=3,
            )
        return ds


def overflow_message(dropped: int, total: int, buffer_full: bool, period_log2: int | None) -> str:
    """What a full buffer or dropped samples mean for the result, and what to do."""
    text = f"PC sampling dropped {dropped} of {total} samples" if dropped else "PC sampling lost samples"
    if buffer_full:
        longer = 2 ** max(15, (period_log2 or 10) + 3)
        text += (": CUPTI's hardware buffer filled, and CUPTI does not count what it lost then (on the H100, a "
                 "64 MiB buffer at period 2**10 kept 2.5 M of 7.9 M samples and counted none as dropped). The "
                 "stall shares may lean toward the kernels that ran first. Sample a shorter stretch of the "
                 f"workload, a longer period (period={longer} keeps up with CUPTI's decoding), or pass a larger "
                 "hardware_buffer_size")
    else:
        text += "; use a longer period or a larger hardware_buffer_size"
    return text + "."


# CUPTI's rule for which kernels it samples (measured on the H100, CUPTI 13.0; docs/pc-sampling.md)
_FIRST_LAUNCH_RULE = (
    "CUPTI maps a kernel for PC sampling only if it did not run while CUPTI was attached outside a pc_sample block "
    "(under gs.Profiler, or between blocks)"
)


def _rule(detach: str) -> str:
    if detach in ("detached", "not attached"):
        return ("CUPTI had forgotten the process when the block started, so these kernels were not hidden by "
                "earlier profiling.")
    return (f"{_FIRST_LAUNCH_RULE}; CUPTI was not detached first ({detach or 'unknown'}). Sample in a fresh process "
            "or before profiling those kernels; unless another CUPTI tool is injected, leave GPUSCOPE_PC_DETACH "
            "unset so that the block detaches CUPTI first (docs/pc-sampling.md).")


def unsampled_message(missing: dict[str, int], unattributed: int, total: int, detach: str = "") -> str:
    """Kernels that launched in a block but have no PC sample: what CUPTI counted for them, and why."""
    from gpuscope._pc_sampling.source import pretty_function

    names = ", ".join(f"{pretty_function(k)} ({n} launch{'es' if n > 1 else ''})" for k, n in missing.items())
    counted = (f"CUPTI counted {unattributed} of {total} samples as unattributed (non-user kernel samples)"
               if unattributed else "CUPTI counted no sample as unattributed: their samples were lost uncounted")
    return (f"No PC samples for {names}, which ran in the block; {counted}. {_rule(detach)} (A kernel "
            "shorter than one sampling period per SM may also get no sample.)")


def unattributed_message(unattributed: int, total: int, detach: str = "") -> str:
    """Why CUPTI counted samples it gave no records for, and what to do."""
    return (f"CUPTI could not attribute {unattributed} of {total} PC samples to a kernel (its non-user kernel "
            f"samples): they have no records. {_rule(detach)}")


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
