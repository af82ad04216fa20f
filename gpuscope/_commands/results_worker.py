"""``gpuscope run``'s results: the Dataset saved, traced and reported, in the run's process or in a process of its own.

:func:`results` does what the run does with a session's Dataset once the script has run (report it, or say that
nothing was profiled; then save it with ``-o`` and write the ``--trace``) and hands each stage's lines over as it
ends, so that the report is printed before any file is written (a write that fails, a full disk, costs its file and
nothing else: docs/reliability.md, "Output files").

:class:`ResultsWorker` is a process started with the run, before CUDA: it imports xarray, pandas and the report's
modules on a core of its own while the script runs, then builds the Dataset of a range-profiling session from
:meth:`gpuscope.Profiler.dataset_inputs` (records, metric names and attrs, sent through a pipe) and makes the
results. The profiled process then never imports xarray and pandas, about 0.5-0.9 s of its GIL on the H100 machine
that a thread could not hide (the process is GIL-bound: docs/measurements.md). Whatever goes wrong with the worker
(it cannot start, dies, or answers with an error), the run builds the results itself and does the stages the worker
did not finish: nothing is lost, nothing is done twice.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

from gpuscope._commands.exits import EXIT_FILE

__all__ = ["ResultsWorker", "results", "EXIT_NOTHING_PROFILED"]

#: Exit status when the script succeeded but no launch or range was profiled (a filter that matched nothing).
EXIT_NOTHING_PROFILED = 6

#: What the worker imports while it waits for the session's data.
_IMPORTS = ("gpuscope._results.report", "gpuscope._results.io", "gpuscope._results.build",
            "gpuscope._pm_sampling.multi", "gpuscope._range_profiling.session")


def results(ds, request: dict, emit=None) -> tuple[int, list[tuple[str, str]]]:
    """Report, save and trace *ds* as ``gpuscope run`` was asked; return the exit status and every line to print,
    ``("out" | "err", text)`` in order.

    *request*: ``code`` (the script's status), ``report``, ``width``, ``sampled`` (PM sampling), ``filters`` (the
    filters' text), ``output``, ``trace`` and ``html`` (absolute paths, resolved before the script ran), ``force`` (replace
    files that exist); ``done`` and ``failed``: the stages already done elsewhere (the results process, before it
    failed) and whether a write failed there. The stages run in the order of :data:`STAGES`, the report first:
    it is printed before anything is written, so a write that fails (a full disk) costs that file only, and the
    line that says so. ``emit(stage, lines, ok)``, if given, gets each stage's lines as soon as it ends.
    """
    from gpuscope._pm_sampling.multi import each_device

    done, failed, everything = set(request.get("done", ())), bool(request.get("failed")), []
    parts = each_device(ds)  # several devices sampled: each one's samples, reported and traced on its own
    size = sum(p.sizes.get("range", p.sizes.get("time", 0)) for p in parts)
    for stage in STAGES:
        if stage in done:
            continue
        ok, lines = _STAGE_FUNCTIONS[stage](ds, parts, size, request)
        failed = failed or not ok
        everything += lines
        if emit is not None:
            emit(stage, lines, ok)
    nothing = EXIT_NOTHING_PROFILED if size == 0 else 0
    return request["code"] or (EXIT_FILE if failed else nothing), everything


def _report(ds, parts, size, request) -> tuple[bool, list]:
    if size == 0:
        what = "no kernel launch was profiled" if not request.get("sampled") else "no PM sample was taken"
        filters = request.get("filters", "")
        return True, [("err", f"gpuscope run: {what}" + (f": nothing matched {filters}" if filters else "")
                       + ". Check the names with: gpuscope run --mode kernel script.py (no filters) and the "
                       "report's kernel column.")]
    if not request.get("report"):
        return True, []
    from gpuscope._results.report import report

    lines = []
    for part in parts:
        label = f"\ndevice {part.attrs['device_index']}:" if len(parts) > 1 else ""
        table = report(part)
        text = table.to_text(width=request["width"]) if request.get("width") else str(table)
        lines.append(("out", f"{label}\n{text}"))
    return True, lines


def _save(ds, parts, size, request) -> tuple[bool, list]:
    path = request.get("output")
    if not path:
        return True, []
    from gpuscope._results.io import save_dataset

    try:
        save_dataset(ds, path, overwrite=bool(request.get("force")))
    except OSError as exc:
        return False, [("err", _not_written(path, exc, "-o", request))]
    return True, [("err", f"gpuscope run: saved {path}"
                   + (" (the script failed; this is what was collected)" if request["code"] else ""))]


def _trace(ds, parts, size, request) -> tuple[bool, list]:
    path = request.get("trace")
    if not path or size == 0:
        return True, []
    from gpuscope._results.trace import to_perfetto, write_trace

    try:
        write_trace(to_perfetto(*parts), path, overwrite=bool(request.get("force")))
    except OSError as exc:
        return False, [("err", _not_written(path, exc, "--trace", request))]
    return True, [("err", f"gpuscope run: wrote {path} (open it at https://ui.perfetto.dev)")]


def _html(ds, parts, size, request) -> tuple[bool, list]:
    path = request.get("html")
    if not path or size == 0:
        return True, []
    from gpuscope._results.html import HtmlExtraMissing
    from gpuscope._results.html_pages import report_html
    from gpuscope._results.report import report

    if len(parts) > 1:
        return False, [("err", f"gpuscope run: error: {path} (--html) was not written: a page shows one device; "
                               "save with -o and make a page per device with gpuscope show --html.")]
    try:
        report_html(ds, path, report=report, overwrite=bool(request.get("force")))
    except HtmlExtraMissing as exc:
        return False, [("err", f"gpuscope run: error: {path} (--html) was not written: {exc}")]
    except OSError as exc:
        return False, [("err", _not_written(path, exc, "--html", request))]
    return True, [("err", f"gpuscope run: wrote {path} (open it in a browser)")]


def _not_written(path: str, exc: OSError, flag: str, request: dict) -> str:
    """The line that says a file of the run was not written, why, and what is still there."""
    why = exc.strerror or str(exc)
    if isinstance(exc, FileExistsError):  # not there when the run started: another run took the name meanwhile
        why = ("it was made by something else while the script ran, and gpuscope run does not overwrite it; pass "
               f"-f/--force to replace it, or give {flag} another name")
    return (f"gpuscope run: error: {path} ({flag}) was not written: {why}. What was there is as it was"
            + ("; the report above is what was collected." if request.get("report") else "."))


#: The stages of :func:`results`, in order: the report before the writes that may fail.
STAGES = ("report", "output", "trace", "html")
_STAGE_FUNCTIONS = {"report": _report, "output": _save, "trace": _trace, "html": _html}


class WorkerFailed(Exception):
    """The results process could not make the results (the run makes them itself). ``done``: the stages of
    :func:`results` it finished before, as ``(stage, ok)`` (their lines were given to ``emit`` already)."""

    def __init__(self, message: str, done=()):
        super().__init__(message)
        self.done = list(done)


class ResultsWorker:
    """The results process of one run (see the module docstring); :meth:`start` makes one, or None."""

    def __init__(self, proc: subprocess.Popen):
        self._proc = proc

    @classmethod
    def start(cls, imports=()) -> ResultsWorker | None:
        """Start the worker (``<python> -I -c``, with this process's import path, as gpuscope's other children:
        :mod:`gpuscope.cupti._python`), importing *imports* too while it waits (``h5netcdf`` for ``-o``); None where
        it cannot start (the run then makes its results itself)."""
        import json

        from gpuscope.cupti import _python

        try:
            proc = subprocess.Popen([_python.interpreter(), "-I", "-c", _BOOT, json.dumps(_python.sys_path()),
                                     json.dumps(list(imports))],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True)
        except OSError:  # no interpreter to start (a frozen application without GPUSCOPE_PYTHON), or no process
            return None
        from gpuscope._gpu import keep as _keep

        _keep.results_elsewhere(True)  # while it runs, sessions import no xarray in the background either
        return cls(proc)

    def results(self, inputs: dict, request: dict, emit=None) -> tuple[int, list[tuple[str, str]]]:
        """Send the session's data; return what :func:`results` returned in the worker. Each stage's lines go to
        ``emit(stage, lines, ok)`` as the worker sends them: the report before anything is written.

        Raises
        ------
        WorkerFailed
            The worker died, or could not build or report (its error, which the run's own attempt will raise
            again where it is the data's); its ``done`` says which stages it finished.
        """
        try:
            payload = pickle.dumps((inputs, request), protocol=pickle.HIGHEST_PROTOCOL)
            self._proc.stdin.write(payload)
            self._proc.stdin.close()
        except (OSError, pickle.PicklingError, ValueError) as exc:
            self.close()
            raise WorkerFailed(f"the results process could not be reached: {exc}") from None
        done, lines = [], []
        while True:
            try:
                frame = pickle.load(self._proc.stdout)
            except Exception:  # noqa: BLE001  died before answering (killed, out of memory, broken environment)
                self.close()
                raise WorkerFailed(f"the results process ended with status {self._proc.returncode} "
                                   "without an answer", done) from None
            if frame[0] == "stage":
                _, stage, stage_lines, ok = frame
                done.append((stage, ok))
                lines += stage_lines
                if emit is not None:
                    emit(stage, stage_lines, ok)
            elif frame[0] == "done":
                return frame[1], lines
            else:
                raise WorkerFailed(f"the results process failed ({frame[1]})", done)

    def close(self) -> None:
        """Stop the worker if it still runs (safe to call twice; the run calls it whatever happened)."""
        from gpuscope._gpu import keep as _keep

        _keep.results_elsewhere(False)
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        for stream in (self._proc.stdin, self._proc.stdout):
            if stream is not None and not stream.closed:
                stream.close()


#: The worker's first lines: Ctrl-C is the script's to stop, not the results' (the run still wants them).
_BOOT = ("import signal, sys, json; signal.signal(signal.SIGINT, signal.SIG_IGN); "
         "sys.path[:0] = json.loads(sys.argv[1]); from gpuscope._commands.results_worker import main; "
         "main(json.loads(sys.argv[2]))")


def _warm(save: bool = False) -> None:
    """Build a one-row Dataset while the script runs: xarray looks for its array modules (dask, cupy, sparse, ...)
    at its first Dataset, 0.2 s on the H100 machine. With *save* (the run saves with ``-o``), save it too, to a file
    removed at once: the first save pays xarray's backend lookup and h5py's set-up (0.27 s of a first 0.33 s save on
    a laptop-class CPU; the second took 0.07 s)."""
    import tempfile

    from gpuscope._range_profiling.session import build_dataset

    ds = build_dataset({"records": [{"name": "warm", "values": [0.0]}], "metrics": ["m"], "properties": {},
                        "device_info": None, "chip": "", "attrs": {}, "device_attrs": {}, "formulas": {}})
    if save:
        from gpuscope._results.io import save_dataset

        with tempfile.TemporaryDirectory(prefix="gpuscope-warm-") as tmp:
            save_dataset(ds, os.path.join(tmp, "warm.nc"))


def main(extra=()) -> None:  # the worker (started by _BOOT)
    import importlib

    for name in _IMPORTS:
        importlib.import_module(name)
    imported = set()
    for name in extra:  # what this run's options need (h5netcdf for -o): where it is missing, the save says so
        try:
            importlib.import_module(name)
            imported.add(name)
        except ImportError:
            pass
    try:
        _warm(save="h5netcdf" in imported)
    except Exception:  # noqa: BLE001  a warm-up that fails (no room in the temporary directory) leaves the real one
        pass
    data = sys.stdin.buffer.read()  # the run's data, or nothing when the run ended without it
    if not data:
        return

    def send(*frame) -> None:  # one frame at a time, so that the run has the report before a write begins
        sys.stdout.buffer.write(pickle.dumps(frame, protocol=pickle.HIGHEST_PROTOCOL))
        sys.stdout.buffer.flush()

    try:
        from gpuscope._range_profiling.session import build_dataset

        inputs, request = pickle.loads(data)
        code, _ = results(build_dataset(inputs), request, lambda stage, lines, ok: send("stage", stage, lines, ok))
        answer = ("done", code)
    except Exception as exc:  # noqa: BLE001  the run tries again itself, and raises it there
        answer = ("error", f"{type(exc).__name__}: {exc}")
    send(*answer)
    sys.stderr.flush()
    os._exit(0)  # the files are written and closed: the interpreter's teardown (0.3-0.5 s with pandas) helps no one

