"""``gpuscope run``'s results: the Dataset saved, traced and reported, in the run's process or in a process of its own.

:func:`results` does what the run does with a session's Dataset once the script has run (save it with ``-o``, write
the ``--trace``, report it, or say that nothing was profiled) and returns what to print, so that the run prints it
in order wherever it was made.

:class:`ResultsWorker` is a process started with the run, before CUDA: it imports xarray, pandas and the report's
modules on a core of its own while the script runs, then builds the Dataset of a range-profiling session from
:meth:`gpuscope.Profiler.dataset_inputs` (records, metric names and attrs, sent through a pipe) and makes the
results. The profiled process then never imports xarray and pandas, about 0.5-0.9 s of its GIL on the H100 machine
that a thread could not hide (the process is GIL-bound: docs/measurements.md). Whatever goes wrong with the worker
(it cannot start, dies, or answers with an error), the run builds the results itself: nothing is lost.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

__all__ = ["ResultsWorker", "results", "EXIT_NOTHING_PROFILED"]

#: Exit status when the script succeeded but no launch or range was profiled (a filter that matched nothing).
EXIT_NOTHING_PROFILED = 6

#: What the worker imports while it waits for the session's data.
_IMPORTS = ("gpuscope._results.report", "gpuscope._results.io", "gpuscope._results.build",
            "gpuscope._pm_sampling.multi", "gpuscope._range_profiling.session")


def results(ds, request: dict) -> tuple[int, list[tuple[str, str]]]:
    """Save, trace and report *ds* as ``gpuscope run`` was asked (*request*: ``code`` the script's status,
    ``output``, ``trace``, ``report``, ``sampled`` (PM sampling), ``filters`` (the filters' text)); return the exit
    status and the lines to print, ``("out" | "err", text)`` in order."""
    from gpuscope._pm_sampling.multi import each_device

    code, lines = request["code"], []
    if request.get("output"):
        from gpuscope._results.io import save_dataset

        save_dataset(ds, request["output"])
        lines.append(("err", f"gpuscope run: saved {request['output']}"
                      + (" (the script failed; this is what was collected)" if code else "")))
    parts = each_device(ds)  # several devices sampled: each one's samples, reported and traced on its own
    size = sum(p.sizes.get("range", p.sizes.get("time", 0)) for p in parts)
    if request.get("trace") and size:
        from gpuscope._results.trace import to_perfetto

        to_perfetto(*parts, path=request["trace"])
        lines.append(("err", f"gpuscope run: wrote {request['trace']} (open it at https://ui.perfetto.dev)"))
    if size == 0:
        what = "no kernel launch was profiled" if not request.get("sampled") else "no PM sample was taken"
        filters = request.get("filters", "")
        lines.append(("err", f"gpuscope run: {what}" + (f": nothing matched {filters}" if filters else "")
                      + ". Check the names with: gpuscope run --mode kernel script.py (no filters) and the report's "
                      "kernel column."))
        return code or EXIT_NOTHING_PROFILED, lines
    if request.get("report"):
        from gpuscope._results.report import report

        for part in parts:
            label = f"\ndevice {part.attrs['device_index']}:" if len(parts) > 1 else ""
            table = report(part)
            text = table.to_text(width=request["width"]) if request.get("width") else str(table)
            lines.append(("out", f"{label}\n{text}"))
    return code, lines


class WorkerFailed(Exception):
    """The results process could not make the results (the run makes them itself)."""


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

    def results(self, inputs: dict, request: dict) -> tuple[int, list[tuple[str, str]]]:
        """Send the session's data; return what :func:`results` returned in the worker.

        Raises
        ------
        WorkerFailed
            The worker died, or could not build or report (its error, which the run's own attempt will raise
            again where it is the data's).
        """
        try:
            payload = pickle.dumps((inputs, request), protocol=pickle.HIGHEST_PROTOCOL)
            self._proc.stdin.write(payload)
            self._proc.stdin.close()
            out = self._proc.stdout.read()  # to the worker's exit, which follows its answer at once (os._exit)
        except (OSError, pickle.PicklingError, ValueError) as exc:
            self.close()
            raise WorkerFailed(f"the results process could not be reached: {exc}") from None
        try:
            status, answer = pickle.loads(out)
        except Exception:  # noqa: BLE001  died before answering (killed, out of memory, broken environment)
            self.close()
            raise WorkerFailed(f"the results process ended with status {self._proc.returncode} "
                               "without an answer") from None
        if status != "ok":
            raise WorkerFailed(f"the results process failed ({answer})")
        return answer

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
    try:
        from gpuscope._range_profiling.session import build_dataset

        inputs, request = pickle.loads(data)
        answer = ("ok", results(build_dataset(inputs), request))
    except Exception as exc:  # noqa: BLE001  the run tries again itself, and raises it there
        answer = ("error", f"{type(exc).__name__}: {exc}")
    sys.stdout.buffer.write(pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL))
    sys.stdout.buffer.flush()
    sys.stderr.flush()
    os._exit(0)  # the files are written and closed: the interpreter's teardown (0.3-0.5 s with pandas) helps no one

