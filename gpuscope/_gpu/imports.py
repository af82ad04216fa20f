"""xarray imported on a thread while a session runs, and ``os.fork`` held until that import is done.

Sessions start the import (:func:`import_xarray_soon`) and wait for it when they close (:func:`imports_done`);
``gpuscope run``'s results process makes the Datasets elsewhere (:func:`results_elsewhere`). Sessions call these
through :mod:`gpuscope._gpu.keep`.
"""

from __future__ import annotations

import os
import sys
import threading
import warnings

from gpuscope.errors import GpuscopeWarning

_importer: threading.Thread | None = None
_import_lock = threading.Lock()
#: How long a fork waits for the background import of xarray (it takes 0.45-0.8 s); past that it forks, warned.
FORK_WAIT_S = 30.0
_fork = os.fork  # the os.fork that :func:`_fork_after_import` stands in front of while xarray is imported


def import_xarray_soon() -> None:
    """Import xarray on a background thread while a session runs (once per process): the first Dataset of a process
    otherwise waits 0.45-0.8 s for it, and CUDA's and CUPTI's calls release the GIL, so most of it overlaps.

    Until the import is done, ``os.fork`` waits for it (:func:`_fork_after_import`): a child forked meanwhile would
    inherit the module locks that the importing thread holds, which no thread of the child ever releases, and hang at
    its first ``import xarray`` (a DataLoader worker, a ``multiprocessing`` child started with fork)."""
    global _importer, _fork
    with _import_lock:
        if _importer is not None or "xarray" in sys.modules or _imports_elsewhere:
            return
        _importer = threading.Thread(target=_import_xarray, name="gpuscope-import", daemon=True)
        _fork, os.fork = os.fork, _fork_after_import
        _importer.start()


_imports_elsewhere = False  # results_elsewhere(): another process makes this process's Datasets


def results_elsewhere(on: bool = True) -> None:
    """While *on*, this process's session results are made in another process (``gpuscope run``'s results process,
    :mod:`gpuscope._commands.results_worker`): sessions import no xarray in the background."""
    global _imports_elsewhere
    _imports_elsewhere = bool(on)


def _import_xarray() -> None:
    try:
        import xarray  # noqa: F401
    except Exception:  # the Dataset's own import raises it where the user sees it
        pass
    finally:
        _put_fork_back()


def _put_fork_back() -> None:
    with _import_lock:
        if os.fork is _fork_after_import:  # unless someone has wrapped it since: then ours only calls on
            os.fork = _fork


def _fork_after_import() -> int:
    """``os.fork`` while gpuscope imports xarray in the background: the import is let finish first (at most
    :data:`FORK_WAIT_S`), then the process forks. Not an at-fork handler: modules imported during the wait register
    handlers whose after-fork half then runs without their before half, and handlers registered after gpuscope's
    run before it (logging's holds the lock that the import's ``logging.getLogger`` calls need)."""
    importer = _importer
    if importer is not None and importer is not threading.current_thread():
        importer.join(FORK_WAIT_S)
        if importer.is_alive():  # e.g. this thread is itself importing a module that the import waits for
            warnings.warn(f"gpuscope: os.fork() while xarray was still being imported in the background (waited "
                          f"{FORK_WAIT_S:g} s); the child may hang at its first import of xarray.", GpuscopeWarning,
                          stacklevel=2)
    return _fork()


def imports_done() -> None:
    """Wait for :func:`import_xarray_soon` (sessions call it when they close: no thread outlives them)."""
    importer = _importer
    if importer is not None and importer is not threading.current_thread():
        importer.join()


def _forget_in_child() -> None:
    """After ``os.fork``: a fork that did not wait for the import; its thread is not the child's."""
    global _import_lock, _importer
    _import_lock, _importer = threading.Lock(), None
    if os.fork is _fork_after_import:
        os.fork = _fork


os.register_at_fork(after_in_child=_forget_in_child)
