"""``gpuscope run``: profile an unmodified Python script in this process, the way ``ncu``/``nsys`` profile a program.

The script runs as ``__main__`` (``runpy.run_path``) with ``sys.argv = [script, *args]`` and its folder first on
``sys.path``, as ``python script.py`` runs it; a module given with ``-m`` runs as ``python -m module`` runs it
(``runpy.run_module(alter_sys=True)``: ``sys.argv[0]`` its file, the current folder first on ``sys.path``, a
package's ``__main__``). Both run inside a :class:`gpuscope.Profiler` (auto mode by default) or a PM sampler. The
exit status and exceptions pass through; whatever was collected is saved and reported even when the script fails.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import importlib.machinery
import importlib.util
import os
import runpy
import sys
import threading
import traceback

from gpuscope._commands import results_worker as _worker
from gpuscope._commands.results_worker import EXIT_NOTHING_PROFILED
from gpuscope._util import env as _env
from gpuscope.errors import GpuscopeError

__all__ = ["RunOptions", "run_script", "parse_sample", "EXIT_NOTHING_PROFILED"]


@dataclasses.dataclass
class RunOptions:
    """What ``gpuscope run`` was asked to do (the command-line options, parsed)."""

    script: str | None = None  # the script, or None with module
    args: list = dataclasses.field(default_factory=list)
    metrics: object = None  # a set name or a list of metric names; None with sample=None means "topdown"
    mode: str = "auto"
    kernels: list | None = None
    exclude: list | None = None
    launch_skip: int | None = None
    launch_count: int | None = None
    sample: tuple | None = None  # (metrics, interval) for PM sampling
    output: str | None = None
    trace: str | None = None  # a Perfetto/Chrome trace of the results (gpuscope.to_perfetto)
    html: str | None = None  # the report as one HTML page (gpuscope.report(ds, html=...))
    report: bool = True
    device: int | str | list = 0  # a list or "all": PM sampling on several devices (sample only)
    kernel_times: bool = False  # with sample: record kernel executions (gpuscope.sample(kernels=True))
    force: bool = False  # overwrite an existing output or trace file
    module: str | None = None  # -m: a module to run as python -m runs it, instead of a script
    nvtx: bool = False  # take the script's NVTX ranges as gpuscope ranges (NVTX routed to CUPTI before it starts)
    nvtx_include: list | None = None  # NVTX range patterns (imply nvtx)
    nvtx_exclude: list | None = None
    pass_groups: str | None = None  # "ncu" or "cupti": how the passes are laid out (None: gpuscope's plan)
    graphs: str | None = None  # "graph": a CUDA graph launch as one row (None: gpuscope's default, one per node)


class RunError(GpuscopeError, ValueError):
    """``gpuscope run`` was asked for something it cannot do (bad options, a missing script)."""


def parse_sample(text: str) -> tuple[str, str]:
    """``"pm-default@100us"`` -> ``("pm-default", "100us")``; the interval defaults to 100 us."""
    metrics, _, interval = text.partition("@")
    if not metrics.strip():
        raise RunError(f"--sample {text!r}: give a sampling set or metrics, e.g. --sample pm-default@100us")
    return metrics.strip(), (interval.strip() or "100us")


def check_options(opts: RunOptions) -> None:
    """Refuse what cannot work before the script starts.

    Raises
    ------
    RunError
        No script file, or no module of that name; range profiling and PM sampling asked for together; filters
        with PM sampling; negative counts; an output or trace file that exists (without ``force``).
    OSError
        An output file that cannot be written.
    """
    if opts.module is not None:
        find_module(opts.module)
    elif opts.script is None:
        raise RunError("Give what to profile: gpuscope run [options] script.py [args...], or a module as python -m "
                       "runs it: gpuscope run [options] -m module [args...].")
    elif not os.path.isfile(opts.script):
        raise RunError(f"No script {opts.script!r} (gpuscope run profiles a Python file: gpuscope run [options] "
                       "script.py [args...]; or a module: gpuscope run [options] -m module [args...]).")
    if opts.kernel_times and opts.sample is None:
        raise RunError("--kernel-times goes with --sample: range profiling records its kernels anyway.")
    if opts.pass_groups is not None and opts.sample is not None:
        raise RunError("--pass-groups lays out range profiling's passes; PM sampling (--sample) has one pass.")
    if not isinstance(opts.device, int):
        if opts.sample is None:
            raise RunError(f"--device {_device_text(opts.device)} goes with --sample (PM sampling of several "
                           "devices in one process); range profiling runs on one device: give one index, or one "
                           "process per GPU (docs/multi-gpu.md).")
        if opts.kernel_times:
            raise RunError(f"--kernel-times records the kernels of one device; --device {_device_text(opts.device)} "
                           "names several: give one index.")
    if opts.sample is not None:
        from gpuscope._gpu.metric_lists import expand

        expand(opts.sample[0], "sampling")  # a misspelt set is refused here, before the GPU is looked for
        if opts.metrics is not None:
            raise RunError("--sample and --set/--metrics cannot be used together: range profiling and PM sampling "
                           "cannot hold the GPU's counters at the same time (CUPTI reports HARDWARE_BUSY). Run the "
                           "script twice, once with each.")
        given = [f for f, v in (("-k/--kernels", opts.kernels), ("--exclude", opts.exclude),
                                ("--launch-skip", opts.launch_skip), ("--launch-count", opts.launch_count)) if v]
        if given:
            raise RunError(f"{', '.join(given)} select launches for range profiling; PM sampling (--sample) covers "
                           "the whole run.")
        if _takes_nvtx(opts):
            raise RunError("--nvtx, --nvtx-include and --nvtx-exclude take NVTX ranges for range profiling; PM "
                           "sampling (--sample) records gpuscope.range blocks, not NVTX ranges.")
    if _takes_nvtx(opts):
        from gpuscope._range_profiling.nvtx import NvtxFilter

        try:
            NvtxFilter.build(_nvtx_kwargs(opts)["nvtx"], opts.nvtx_exclude or None)
        except (TypeError, ValueError) as exc:
            raise RunError(str(exc).replace("nvtx_exclude", "--nvtx-exclude").replace("nvtx:", "--nvtx-include:")
                           ) from None
    for name, value in (("--launch-skip", opts.launch_skip), ("--launch-count", opts.launch_count)):
        if value is not None and value < 0:
            raise RunError(f"{name} must be 0 or more, not {value}.")
    _output_paths(opts)


def _output_paths(opts: RunOptions) -> dict:
    """``{"output": ..., "trace": ..., "html": ...}``: the absolute paths of the run's files (None where not asked for), resolved
    once before the script runs (a script that changes the current folder does not move them), each checked as
    :func:`gpuscope._util.outputs.check` does (no link, nothing but a regular file, no file that exists without
    ``force``)."""
    from gpuscope._util import outputs

    paths = {}
    for key, flag in (("output", "-o"), ("trace", "--trace"), ("html", "--html")):
        target = getattr(opts, key)
        try:
            paths[key] = outputs.check(target, overwrite=opts.force) if target else None
        except FileExistsError:
            raise RunError(f"{target!r} exists: gpuscope run does not overwrite it (as ncu does not). Pass "
                           f"-f/--force to replace it, or give {flag} another name.") from None
    return paths


def _device_text(device) -> str:
    return device if isinstance(device, str) else ",".join(map(str, device))


def _takes_nvtx(opts: RunOptions) -> bool:
    return bool(opts.nvtx or opts.nvtx_include or opts.nvtx_exclude)


def _nvtx_kwargs(opts: RunOptions) -> dict:
    """``nvtx=`` and ``nvtx_exclude=`` for the Profiler: --nvtx-include patterns, else every NVTX range."""
    kwargs = {"nvtx": list(opts.nvtx_include) if opts.nvtx_include else True}
    if opts.nvtx_exclude:
        kwargs["nvtx_exclude"] = list(opts.nvtx_exclude)
    return kwargs


def _profiler_kwargs(opts: RunOptions) -> dict:
    """Only the filters that were given: a Profiler without launch filters still runs a plain profile."""
    kwargs = {"mode": opts.mode}
    for name in ("kernels", "exclude", "launch_skip", "launch_count"):
        value = getattr(opts, name)
        if value is not None and value != []:
            kwargs[name] = value
    if _takes_nvtx(opts):
        kwargs.update(_nvtx_kwargs(opts))
    if opts.pass_groups is not None:
        kwargs["pass_groups"] = opts.pass_groups
    if opts.graphs is not None:
        kwargs["graphs"] = opts.graphs
    return kwargs


def _session(opts: RunOptions, profiler_factory=None, sampler_factory=None):
    if opts.sample is not None:
        if sampler_factory is None:
            from gpuscope._pm_sampling.api import sample as sampler_factory
        metrics, interval = opts.sample
        extra = {"kernels": True} if opts.kernel_times else {}
        return sampler_factory(metrics=metrics, interval=interval, device=opts.device, **extra)
    if profiler_factory is None:
        from gpuscope._range_profiling.session import Profiler as profiler_factory
    kwargs = _profiler_kwargs(opts)
    params = _parameters(profiler_factory)
    _check_supported(params, kwargs)
    if (opts.mode in ("kernel", "auto") and not _takes_nvtx(opts) and _env.flag(FIRST_START_VAR, True)
            and params is not None and _takes(params, "first_start_beside")):
        kwargs["first_start_beside"] = True  # CUPTI's first Start (and its queries) while the script imports
    return profiler_factory(opts.metrics if opts.metrics is not None else "topdown", device=opts.device, **kwargs)


def _parameters(factory):
    """*factory*'s parameters, or None where its signature cannot be read."""
    import inspect

    try:
        return inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return None


def _takes(params, name: str) -> bool:
    return name in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def _check_supported(params, kwargs) -> None:
    """A clear message for options the Profiler does not take (*params*: its parameters; None: not known)."""
    missing = [] if params is None else [k for k in kwargs if not _takes(params, k)]
    if missing:
        flags = {"kernels": "-k/--kernels", "exclude": "--exclude", "launch_skip": "--launch-skip",
                 "launch_count": "--launch-count", "mode": "--mode", "nvtx": "--nvtx", "nvtx_exclude": "--nvtx-exclude",
                 "pass_groups": "--pass-groups"}
        raise RunError(f"This gpuscope's Profiler does not support {', '.join(flags.get(m, m) for m in missing)} "
                       "yet; run without it.")


def _exit_code(exc: SystemExit) -> int:
    """What Python would exit with for ``sys.exit(code)``."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # sys.exit("message") prints the message and exits 1
    return 1


def _print_script_traceback(exc: BaseException, script: str) -> None:
    """The traceback as ``python script.py`` shows it: from the script's first frame, without gpuscope's."""
    tb = exc.__traceback__
    target = os.path.abspath(script)
    while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) != target:
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb or exc.__traceback__, file=sys.stderr)


@contextlib.contextmanager
def _first_on_path(folder: str):
    """``sys.path[0]`` is *folder* inside the block (as python sets it for a script or ``-m``), restored after."""
    saved = sys.path[0] if sys.path else None
    if sys.path:
        sys.path[0] = folder
    else:
        sys.path.insert(0, folder)
    try:
        yield
    finally:
        if saved is not None:
            sys.path[0] = saved


def find_module(name: str) -> str:
    """The file ``python -m name`` would run (a package's ``__main__.py``), found as python finds it, with the
    current folder first on ``sys.path``; nothing is imported, so a package's own code runs in the session only.

    Raises
    ------
    RunError
        *name* is not a module name, or no module (or package ``__main__``) of that name is found.
    """
    if not name:
        raise RunError("-m needs the module to run: gpuscope run [options] -m module [args...].")
    if not all(part.isidentifier() for part in name.split(".")):
        raise RunError(f"-m {name!r} is not a module name: gpuscope run [options] -m package.module [args...].")
    parts = name.split(".")
    importlib.invalidate_caches()  # modules written since this process started
    with _first_on_path(os.getcwd()):
        try:
            spec = importlib.util.find_spec(parts[0])  # a top-level name: found, not imported
        except (ImportError, ValueError):
            spec = None
        for depth in range(2, len(parts) + 1):  # submodules: looked up in the package's folders, not imported
            locations = spec.submodule_search_locations if spec is not None else None
            spec = importlib.machinery.PathFinder.find_spec(".".join(parts[:depth]), locations) if locations else None
        if spec is not None and spec.submodule_search_locations is not None:
            spec = importlib.machinery.PathFinder.find_spec(name + ".__main__", spec.submodule_search_locations)
            if spec is None:
                raise RunError(f"No module named {name}.__main__: {name!r} is a package and cannot be run directly "
                               "(as python -m says); give one of its modules, or add a __main__.py.")
    if spec is None or not spec.has_location or not spec.origin:
        raise RunError(f"No module named {name!r} with the current folder ({os.getcwd()}) first on sys.path, as "
                       f"python -m {name} would look for it.")
    return spec.origin


def execute(script: str | None, args, module: str | None = None) -> int:
    """Run *script*, or *module* as ``python -m`` does, as ``__main__`` with its own argv and ``sys.path[0]``;
    return the status Python would exit with."""
    if module is not None:
        origin, folder = find_module(module), os.getcwd()
        run = functools.partial(runpy.run_module, module, run_name="__main__", alter_sys=True)
    else:
        origin, folder = script, os.path.dirname(os.path.abspath(script))
        run = functools.partial(runpy.run_path, script, run_name="__main__")
    saved_argv = sys.argv[:]
    sys.argv = [origin, *args]
    try:
        with _first_on_path(folder):
            run()
        return 0
    except SystemExit as exc:
        return _exit_code(exc)
    except KeyboardInterrupt as exc:
        _print_script_traceback(exc, origin)
        return 130
    except BaseException as exc:  # noqa: BLE001  the script's failure is reported like python does, then we go on
        _print_script_traceback(exc, origin)
        return 1
    finally:
        sys.argv = saved_argv


def _filters(opts: RunOptions) -> str:
    parts = []
    if opts.kernels:
        parts.append("-k " + ",".join(opts.kernels))
    if opts.exclude:
        parts.append("--exclude " + ",".join(opts.exclude))
    if opts.launch_skip:
        parts.append(f"--launch-skip {opts.launch_skip}")
    if opts.launch_count is not None:
        parts.append(f"--launch-count {opts.launch_count}")
    parts += [f"--nvtx-include {p}" for p in opts.nvtx_include or ()] + [
        f"--nvtx-exclude {p}" for p in opts.nvtx_exclude or ()]
    return " ".join(parts)


#: What the results need once the script has run (xarray and pandas: 0.7 s to import on the H100 machine), imported
#: while the session starts, whose CUDA and CUPTI calls release the GIL (docs/measurements.md).
_RESULTS_MODULES = ("gpuscope._results.report", "gpuscope._results.io")


@contextlib.contextmanager
def _results_imported_meanwhile():
    """Import the results' modules on a thread while the block runs; wait for it at the end, so that no thread of
    ours is importing once the script starts (a script that forks would inherit the import locks it holds)."""

    def load():
        for name in _RESULTS_MODULES:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 (the import after the script raises it where it is needed)
                return

    thread = threading.Thread(target=load, name="gpuscope-run-imports", daemon=True)
    thread.start()
    try:
        yield
    finally:
        thread.join()


@contextlib.contextmanager
def _nvtx_routed(opts: RunOptions):
    """With --nvtx: NVTX goes to CUPTI from before the session and the script start (``gpuscope.enable_nvtx``);
    the variable is as it was once the script has run, so what runs after it does not inherit it."""
    if not _takes_nvtx(opts):
        yield
        return
    from gpuscope._range_profiling.nvtx import INJECTION_VAR, enable_nvtx

    saved = os.environ.get(INJECTION_VAR)
    enable_nvtx()
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(INJECTION_VAR, None)
        else:
            os.environ[INJECTION_VAR] = saved


def run_script(opts: RunOptions, *, profiler_factory=None, sampler_factory=None, out=None) -> int:
    """Profile ``opts.script`` (or ``opts.module``, as ``python -m``) and return the exit status for ``gpuscope run``.

    The status is the script's own when it is not 0 (1 for an uncaught exception, as with ``python``); otherwise
    :data:`EXIT_NOTHING_PROFILED` when nothing was profiled, else 0.

    Parameters
    ----------
    opts : RunOptions
    profiler_factory, sampler_factory : callable, optional
        What makes the session (default :class:`gpuscope.Profiler` and :func:`gpuscope.sample`); the session is
        a context manager with a ``.dataset`` after it closes.
    out : file, optional
        Where the report goes (default stdout).

    Raises
    ------
    RunError, OSError
        Before the script starts (see :func:`check_options`).
    GpuscopeError
        The session could not start (no GPU, unknown metric, counters busy) or close.
    """
    out = out or sys.stdout
    check_options(opts)
    opts = dataclasses.replace(opts, **_output_paths(opts))  # absolute: the script may change the current folder
    if opts.sample is None and profiler_factory is None:
        from gpuscope.cupti import _lib

        _lib.load_soon()  # libcupti (0.2 s) loads while the results process starts and the session's modules import
    worker = _results_worker(opts, profiler_factory)
    try:
        return _run(opts, profiler_factory, sampler_factory, out, worker)
    finally:
        if worker is not None:
            worker.close()


#: JAX reserves 75% of the GPU's memory at its first use unless told not to; kernel replay saves and restores the
#: device memory in use around each profiled launch's passes, so with that reserve every launch (and the graph
#: nodes gpuscope replays) costs seconds. ``gpuscope run`` in kernel and auto modes sets it to false where the
#: environment does not say (only the reserve changes, not what the script computes).
XLA_PREALLOCATE_VAR = "XLA_PYTHON_CLIENT_PREALLOCATE"


def _jax_without_reserve(opts: RunOptions) -> bool:
    """Set :data:`XLA_PREALLOCATE_VAR` to false for the script (kernel and auto modes, where it is unset)."""
    if opts.sample is None and opts.mode in ("kernel", "auto") and XLA_PREALLOCATE_VAR not in os.environ:
        os.environ[XLA_PREALLOCATE_VAR] = "false"
        return True
    return False


def _run(opts: RunOptions, profiler_factory, sampler_factory, out, worker) -> int:
    reserve_off = _jax_without_reserve(opts)
    with _nvtx_routed(opts):
        with contextlib.nullcontext() if worker is not None else _results_imported_meanwhile():
            session = _session(opts, profiler_factory, sampler_factory)
            session.__enter__()
        close_error = None
        streams = sys.stdout, sys.stderr
        try:
            code = execute(opts.script, opts.args, opts.module)
        finally:
            _flush(sys.stdout)  # the script's output before the report; a script may have closed it or set None
            try:
                session.__exit__(None, None, None)
            except GpuscopeError as exc:
                close_error = exc
            _restore(*streams)
    if reserve_off and "jax" in sys.modules:
        print(f"gpuscope run: note: {XLA_PREALLOCATE_VAR}=false was set for the script: JAX's reserve of 75% of the "
              "GPU's memory would make every replayed kernel save and restore it (set the variable yourself to "
              "choose; docs/jax.md)", file=sys.stderr)
    if close_error is not None:
        print(f"gpuscope run: error: {close_error}", file=sys.stderr)
        return code or 4
    request = {"code": code, "output": opts.output, "trace": opts.trace, "html": opts.html, "force": opts.force,
               "report": opts.report,
               "sampled": opts.sample is not None, "filters": _filters(opts)}
    printer = _Printer(out)
    if worker is not None:
        import shutil

        try:
            code, _ = worker.results(session.dataset_inputs(), {**request, "width": shutil.get_terminal_size().columns},
                                     printer.stage)
            return code
        except _worker.WorkerFailed as exc:
            print(f"gpuscope run: warning: {exc}; making the results in this process", file=sys.stderr)
            request.update(done=[stage for stage, _ in exc.done], failed=not all(ok for _, ok in exc.done))
    code, _ = _worker.results(session.dataset, request, printer.stage)
    return code


def _usable(stream) -> bool:
    return stream is not None and not getattr(stream, "closed", False)


def _flush(stream) -> None:
    """Flush *stream* where the script left one that can be flushed."""
    if _usable(stream):
        try:
            stream.flush()
        except (OSError, ValueError):  # a pipe whose reader is gone: the report says nothing more to it either
            pass


def _restore(stdout, stderr) -> None:
    """``sys.stdout`` and ``sys.stderr`` as they were before the script, where it set them to None or closed them."""
    if not _usable(sys.stdout) and _usable(stdout):
        sys.stdout = stdout
    if not _usable(sys.stderr) and _usable(stderr):
        sys.stderr = stderr


class _Printer:
    """Prints the results' lines as each stage ends: the report to *out*, or to stderr where the script closed
    *out* (said once), messages to stderr."""

    def __init__(self, out):
        self.out = out
        self.moved = False

    def stage(self, stage: str, lines, ok: bool) -> None:
        for stream, text in lines:
            target = sys.stderr
            if stream == "out" and _usable(self.out):
                target = self.out
            elif stream == "out" and not self.moved:
                self.moved = True
                print("gpuscope run: the script closed standard output; the report follows here", file=sys.stderr)
            if _usable(target):
                print(text, file=target)
                _flush(target)


#: ``GPUSCOPE_FIRST_START_BESIDE=0``: the range profiler's first ``cuptiRangeProfilerStart`` (kernel and auto modes)
#: is made before the script starts, not on a thread beside it (:attr:`gpuscope.Profiler.first_start_beside`).
FIRST_START_VAR = "GPUSCOPE_FIRST_START_BESIDE"

#: ``GPUSCOPE_RESULTS_PROCESS=0``: ``gpuscope run`` makes its results in the profiled process, not in a results
#: process of their own (:mod:`gpuscope._commands.results_worker`).
RESULTS_PROCESS_VAR = "GPUSCOPE_RESULTS_PROCESS"


def _results_worker(opts: RunOptions, profiler_factory):
    """The results process of this run: for a range-profiling session whose Profiler gives its Dataset's inputs
    (PM sampling and stand-in Profilers make their results here), unless GPUSCOPE_RESULTS_PROCESS=0."""
    if opts.sample is not None or not _env.flag(RESULTS_PROCESS_VAR, True):
        return None
    if profiler_factory is None:
        from gpuscope._range_profiling.session import Profiler as profiler_factory
    if not callable(getattr(profiler_factory, "dataset_inputs", None)):
        return None
    return _worker.ResultsWorker.start(("h5netcdf", "xarray.backends.h5netcdf_") if opts.output else ())
