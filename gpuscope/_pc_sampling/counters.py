"""``gpuscope.source_counters``: exact instruction counts per SASS instruction and source line (CUPTI SASS metrics).

CUPTI patches each kernel launched inside the ``with`` block (lazily, at its first launch there) so that every
instruction counts its executions: warp-level (``smsp__sass_inst_executed``), thread-level
(``smsp__sass_thread_inst_executed``: divergence) and predicated-on threads
(``smsp__sass_thread_inst_executed_pred_on``). The device is synchronised at the block's start and end; at the
end the counts are flushed (inside the enabled range, as CUPTI requires) and SASS metrics disabled and
unconfigured, whatever happened in the block. Counts are summed over every launch in the block. PC sampling
cannot run at the same time (it would sample the patched code), nor a range-profiling session (it would count
the patch's instructions): :func:`gpuscope.profile_source` runs the two one after the other.

**One block per process.** CUPTI 13.0 configures SASS metrics once per process: a second
``cuptiSassMetricsSetConfig`` fails with ``CUPTI_ERROR_OUT_OF_MEMORY``, after ``UnsetConfig``, a
``cuptiProfilerDeInitialize`` and even a ``cuptiFinalize`` alike, and a configuration kept enabled counts nothing
in a second enabled range (lazy patching patches a kernel once) while range profiling sees no launch and PC
sampling no sample (measured on the H100). So a block ends by making CUPTI forget the process
(``cuptiFinalize``, :func:`gpuscope._gpu.keep.detach_cupti`; without it the next range session gets no rows) and
attaching it again; a second block in the process is refused with an error that says so
(:data:`ONCE_MESSAGE`).
"""

from __future__ import annotations

import contextlib
import difflib
import threading
import warnings
import weakref

from gpuscope.errors import (
    GpuscopeError,
    GpuscopeWarning,
    SamplerBusyError,
    SessionConflictError,
    UnknownMetricError,
    UnsupportedChipError,
)

__all__ = ["DEFAULT_METRICS", "SourceCounters", "source_counters"]

#: Warp-level executions, thread-level executions (divergence) and predicated-on thread executions per instruction.
DEFAULT_METRICS = ("smsp__sass_inst_executed", "smsp__sass_thread_inst_executed",
                   "smsp__sass_thread_inst_executed_pred_on")

_active: dict[int, SourceCounters] = {}  # device index -> open block
_active_lock = threading.Lock()
_configured = False  # SASS metrics were configured in this process: CUPTI allows it once (module docstring)

#: Why a second block in a process is refused.
ONCE_MESSAGE = ("source_counters runs once per process: CUPTI configures SASS metrics once per process (a second "
                "cuptiSassMetricsSetConfig fails with CUPTI_ERROR_OUT_OF_MEMORY under CUPTI 13.0, whatever was "
                "released in between). Count in a new process (python -c, a subprocess, or the next run of the "
                "script), with every kernel of interest in the one block.")


def _check_free(device: int) -> None:
    """Raise when something that cannot share the device with SASS patching is open on it."""
    from gpuscope._pc_sampling import sampler as _sampler
    from gpuscope._range_profiling.session import active_session

    if device in _active:
        raise SamplerBusyError(f"a source_counters block is already open on device {device}; CUPTI configures SASS "
                               "metrics once per device. Leave the other block first, or count inside it.")
    if device in _sampler._active:
        raise SamplerBusyError(f"a pc_sample block is open on device {device}: PC sampling would sample the patched "
                               "code. Count source lines before or after it (gpuscope.profile_source runs both).")
    session = active_session(device)
    if session is not None:  # it would count the patch's instructions as the kernels'
        raise SessionConflictError(f"a gpuscope.Profiler session is open on device {device} ({session!r}); close it "
                                   "before counting source lines: it would count the patched code's instructions.")


def _unknown_metric(chip: str, name: str) -> UnknownMetricError:
    from gpuscope.cupti import sass_metrics as S

    try:
        known = [m.name for m in S.metrics(chip)]
    except GpuscopeError:
        known = []
    close = tuple(difflib.get_close_matches(name, known, n=3, cutoff=0.5))
    hint = f"; did you mean {', '.join(close)}?" if close else (f"; it has {len(known)}" if known else "")
    return UnknownMetricError(f"{name!r} is not a SASS metric CUPTI offers on {chip}{hint} "
                              "(gpuscope.cupti.sass_metrics.metrics(chip) lists them)", name, close)


class SourceCounters:
    """An open source-counters block on one device; use :func:`source_counters` to make one.

    Attributes
    ----------
    dataset : xarray.Dataset or None
        The result, set when the ``with`` block ends.
    records : gpuscope.cupti.sass_metrics.SassRecords or None
        The raw records, for saving or rebuilding the Dataset.
    launches : dict or None
        Mangled kernel name -> launches in the block on its context (None: not counted).
    """

    def __init__(self, metrics=DEFAULT_METRICS, device: int = 0, kernels=(), sources=None,
                 lazy_patching: bool = True):
        if isinstance(metrics, str):
            metrics = (metrics,)
        self.metric_names = tuple(dict.fromkeys(str(m) for m in metrics))
        if not self.metric_names:
            raise ValueError("metrics must name at least one SASS metric, e.g. 'smsp__sass_inst_executed'")
        self.device = int(device)
        self.lazy_patching = bool(lazy_patching)
        self._kernels = list(kernels)
        self._sources = dict(sources or {})
        self.dataset = None
        self.records = None
        self.launches: dict[str, int] | None = None
        self.notes: list[str] = []
        self.cupti_detach = ""  # what the detach at the block's end did (module docstring)
        self.metrics: dict[int, tuple[str, str]] = {}
        self.chip = ""
        self.device_info = None
        self._context = None
        self._recorder = None
        self._steps: list[str] = []  # what start() did, undone in reverse by _teardown
        self._finalizer = None
        self._state = "new"  # new -> counting -> closed

    def __enter__(self) -> SourceCounters:
        self.start()
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(failed=exc_type is not None)

    # -- start -----------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Configure and enable SASS metrics on the device's primary context (``with`` calls this).

        Raises
        ------
        NoGpuError
            No driver or no GPU.
        SamplerBusyError
            Another ``source_counters`` or a ``pc_sample`` block is open on the device.
        SessionConflictError
            A range-profiling session (``gpuscope.Profiler``) is open on the device.
        UnsupportedChipError
            CUPTI's SASS metrics do not support this device (architecture, vGPU, ...; the message says which).
        UnknownMetricError
            A metric the chip does not offer (the message suggests close names).
        CuptiNotFoundError
            The loaded CUPTI lacks the SASS Metrics API.
        """
        if self._state != "new":
            raise GpuscopeError("this source_counters block was already used; make a new one")
        with _active_lock:
            _check_free(self.device)
            if _configured:
                raise GpuscopeError(ONCE_MESSAGE)
            _active[self.device] = self
        try:
            self._setup()
        except BaseException:
            self._teardown(quiet=True)
            raise
        self._state = "counting"
        self._finalizer = weakref.finalize(self, _emergency_teardown, self._context.handle, self.device,
                                           list(self._steps))
        self._track_launches()

    def _setup(self) -> None:
        from gpuscope._gpu import device as _device
        from gpuscope._gpu import keep as _keep
        from gpuscope._pc_sampling.sampler import _synchronize
        from gpuscope.cupti import profiler
        from gpuscope.cupti import sass_metrics as S
        from gpuscope.cupti._types import ProfilerApi
        from gpuscope.errors import CuptiError

        self.device_info = _device.device_info(self.device)  # NoGpuError without a GPU
        _keep.release(self.device)  # nothing of range profiling or PM sampling stays enabled beside the patching
        _keep.import_xarray_soon()
        self._context = _device.PrimaryContext(self.device)
        _synchronize(self._context)  # work launched before the block is not counted
        profiler.initialize()
        self._steps.append("initialize")
        self.chip = profiler.chip_name(self.device)
        support = profiler.device_support(self.device, ProfilerApi.SASS_METRICS)
        if not support.supported:
            info = self.device_info
            raise UnsupportedChipError(
                f"CUPTI's SASS metrics do not support device {self.device} ({info.name}, {self.chip}, compute "
                f"capability {info.compute_capability_str}): {', '.join(support.reasons()) or support.overall.name}")
        if not S.available():
            from gpuscope.cupti import _api
            from gpuscope.errors import CuptiNotFoundError

            lib = _api.library()
            raise CuptiNotFoundError(f"the loaded CUPTI {lib.version_string} ({lib.path}) lacks the SASS Metrics API "
                                     f"(cuptiSassMetrics*); gpuscope uses it from CUPTI {S.SINCE[0]}.{S.SINCE[1]} on")
        for name in self.metric_names:
            try:
                details = S.properties(self.chip, name)
            except CuptiError:
                raise _unknown_metric(self.chip, name) from None
            self.metrics[details.metric_id] = (name, details.description)
        global _configured
        with _active_lock:
            _configured = True  # tried: a refusal (OUT_OF_MEMORY) would come back on every later try
        S.set_config(self.device, list(self.metrics))
        self._steps.append("config")
        S.enable(self._context.handle, self.lazy_patching)
        self._steps.append("enable")

    def _track_launches(self) -> None:
        """Count the block's launches per kernel (CUPTI's launch callbacks), for per-launch counts and for naming
        kernels that launched but got no counts."""
        from gpuscope._pc_sampling.sampler import _count_launches

        try:
            self._recorder, counts = _count_launches(self._context.handle)
        except GpuscopeError as exc:  # another CUPTI subscriber (not gpuscope) holds the callbacks
            self.notes.append(f"launches not counted: {exc}")
            return
        self.launches = counts

    # -- end -------------------------------------------------------------------------------------------------
    def _teardown(self, quiet: bool, dropped: list | None = None) -> Exception | None:
        """Undo what start() did, newest first, every step tried; returns the first error (warned if *quiet*)."""
        from gpuscope.cupti import profiler
        from gpuscope.cupti import sass_metrics as S

        undo = {
            "enable": lambda: (dropped if dropped is not None else []).append(S.disable(self._context.handle)),
            "config": lambda: S.unset_config(self.device),
            "initialize": profiler.deinitialize,
        }
        error = None
        steps = [*reversed(self._steps), "recorder", "detach", "context"]
        self._steps = []
        for step in steps:
            try:
                if step == "recorder":
                    if self._recorder is not None:
                        self._recorder.close()
                        self._recorder = None
                elif step == "detach":  # the patched kernels stay CUPTI's until it forgets the process
                    if "config" in steps and self._context is not None:
                        self.cupti_detach = self._detach()
                elif step == "context":
                    if self._context is not None:
                        self._context.close()
                else:
                    undo[step]()
            except Exception as exc:
                error = error or exc
                if quiet:
                    warnings.warn(f"source counters: cleanup step {step!r} failed: {exc}", GpuscopeWarning,
                                  stacklevel=4)
        with _active_lock:
            if _active.get(self.device) is self:
                del _active[self.device]
        return error

    def _detach(self) -> str:
        """Make CUPTI forget the process (the patching with it) and attach it again (:func:`_api.reattach`)."""
        from gpuscope._gpu import keep as _keep
        from gpuscope.cupti import _api

        outcome = _keep.detach_cupti()
        if outcome == "detached":
            _api.reattach(self._context.handle)
        else:
            self.notes.append(f"CUPTI was not detached after the block ({outcome}): range-profiling sessions in this "
                              "process may see no launch of the kernels counted here")
        return outcome

    def close(self, failed: bool = False) -> None:
        """Flush the counts, disable and unconfigure SASS metrics, and build :attr:`dataset`. Safe to call twice.

        With ``failed=True`` (an exception left the block) nothing is flushed or built, and trouble while
        tearing down becomes a warning so that the original exception is the one the caller sees.
        """
        from gpuscope._pc_sampling.sampler import _synchronize
        from gpuscope.cupti import sass_metrics as S

        if self._state != "counting":
            return
        self._state = "closed"
        if self._finalizer is not None:
            self._finalizer.detach()
        records, error = None, None
        if not failed:
            try:
                _synchronize(self._context)  # every launch of the block has run and counted
                num, instances = S.data_properties(self._context.handle)
                records = S.flush(self._context.handle, num, instances, slots_per_record=instances * len(self.metrics))
            except Exception as exc:
                error = exc
        dropped: list[int] = []
        if error is None:
            error = self._teardown(quiet=failed, dropped=dropped)
        else:  # the flush's error is the one to raise; the teardown's trouble is warned about
            self._teardown(quiet=True)
        if failed:
            return
        if error is not None:
            raise error
        records.dropped_records = sum(dropped)
        self.records = records
        from gpuscope._gpu import keep as _keep

        _keep.imports_done()
        self.dataset = self.build()
        self._warn_about(self.dataset)

    def kernels_without_counts(self) -> dict[str, int]:
        """Kernels launched in the block (on its context) without any count: mangled name -> launches."""
        if not self.launches or self.records is None:
            return {}
        counted = set(map(str, self.records.function))
        return {k: n for k, n in sorted(self.launches.items()) if k and k not in counted}

    def build(self, sources=None):
        """(Re)build the Dataset from :attr:`records`, e.g. with more ``sources`` for line text."""
        from gpuscope._pc_sampling.sass_records import counters_dataset
        from gpuscope._pc_sampling.source import CubinRegistry, SourceMap
        from gpuscope._schema.names import kernel_name

        if self.records is None:
            raise GpuscopeError("source_counters: the Dataset is built once the with block has ended")
        registry = CubinRegistry()
        for kernel in self._kernels:
            registry.add(kernel)
        source_map = SourceMap(registry, sources={**self._sources, **(sources or {})})
        attrs = {
            "lazy_patching": int(self.lazy_patching),
            "launches_counted": -1 if self.launches is None else sum(self.launches.values()),
            "kernels_without_counts": ", ".join(f"{kernel_name(k)} ({n})"
                                                for k, n in self.kernels_without_counts().items()),
            "notes": "; ".join(self.notes),
            "cupti_detach": self.cupti_detach,
        }
        return counters_dataset(self.records, self.metrics, source_map, launches=self.launches,
                                device_info=self.device_info, chip=self.chip, attrs=attrs)

    def _warn_about(self, ds) -> None:
        if ds.attrs["dropped_records"]:
            warnings.warn(f"source counters: CUPTI dropped {ds.attrs['dropped_records']} records at disable; the "
                          "counts are incomplete", GpuscopeWarning, stacklevel=4)
        if ds.attrs["kernels_without_counts"]:
            warnings.warn("source counters: no counts for " + ds.attrs["kernels_without_counts"] + " (launches in "
                          "the block); CUPTI did not patch them", GpuscopeWarning, stacklevel=4)
        if ds.attrs["functions_without_lineinfo"]:
            warnings.warn("no source lines for " + ds.attrs["functions_without_lineinfo"] + ": compile with line "
                          "info (@cuda.jit(lineinfo=True), CuPy options=('-lineinfo',)); their counts keep function "
                          "and PC offset.", GpuscopeWarning, stacklevel=4)


def _emergency_teardown(ctx: int, device: int, steps: list) -> None:
    """A block dropped without close(): leave nothing enabled or configured."""
    from gpuscope.cupti import profiler
    from gpuscope.cupti import sass_metrics as S

    for step, undo in (("enable", lambda: S.disable(ctx)), ("config", lambda: S.unset_config(device)),
                       ("initialize", profiler.deinitialize)):
        if step in steps:
            with contextlib.suppress(Exception):  # at garbage collection: nobody to tell
                undo()
    with _active_lock:
        _active.pop(device, None)


def source_counters(metrics=DEFAULT_METRICS, device: int = 0, *, kernels=(), sources=None,
                    lazy_patching: bool = True) -> SourceCounters:
    """Count executions of every SASS instruction of the kernels launched inside a ``with`` block.

    CUPTI patches each kernel at its first launch in the block; launches then run the patched code (slower:
    see docs/source.md for the cost). Counts are exact and summed over the block's launches.

    Parameters
    ----------
    metrics : sequence of str
        CUPTI SASS metric names (:data:`DEFAULT_METRICS`: warp-level, thread-level and predicated-on thread
        instruction executions).
    device : int
        GPU index (its primary context, the one Numba and CuPy use).
    kernels : sequence
        Numba dispatchers, CuPy kernels, cubin bytes or paths whose cubins map PCs to source lines (module-level
        Numba kernels and CuPy's cache are found without this), as for :func:`gpuscope.pc_sample`.
    sources : dict, optional
        File name -> source text, for line text of files not on disk here (CuPy kernels compiled from strings).
    lazy_patching : bool
        Patch a kernel at its first launch in the block (CUPTI's lazy patching, the default) rather than every
        loaded function at the start.

    Returns
    -------
    SourceCounters
        Use it in ``with``; ``.dataset`` holds the result afterwards (one row per instruction, dim ``pc``).

    Raises
    ------
    ValueError
        No metric named (raised here, before any CUDA).
    NoGpuError, SamplerBusyError, SessionConflictError, UnsupportedChipError, UnknownMetricError
        On entering the block: see :meth:`SourceCounters.start`.

    Examples
    --------
    >>> with gpuscope.source_counters(kernels=[saxpy]) as sc:             # doctest: +SKIP
    ...     saxpy[blocks, 256](2.0, x, y, out)
    >>> sc.dataset.smsp__sass_inst_executed.groupby("line").sum()         # doctest: +SKIP
    """
    return SourceCounters(metrics=metrics, device=device, kernels=kernels, sources=sources,
                          lazy_patching=lazy_patching)
