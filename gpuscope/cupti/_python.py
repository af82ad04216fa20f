"""The Python interpreter and import path for gpuscope's child processes.

gpuscope starts Python children for work that must not run in the user's process: the image checks
(:mod:`._images`), the CUPTI probes of :mod:`._lib` and PM sampling's evaluation workers. Each runs
``<python> -I -c <code>``. ``sys.executable`` is that interpreter in an ordinary Python, but not everywhere: it is
empty in some embedded Pythons, and in a frozen application (PyInstaller, cx_Freeze: ``sys.frozen``) or an
embedding one (uWSGI) it is the application itself, which ``-I -c`` would start again. ``GPUSCOPE_PYTHON`` names
the interpreter to use instead: one of the same Python version that can import gpuscope's dependencies.
"""

from __future__ import annotations

import os
import re
import sys

__all__ = ["ENV_VAR", "interpreter", "sys_path"]

ENV_VAR = "GPUSCOPE_PYTHON"
#: Names a Python interpreter's executable has (python, python3.12, python3.11-dbg, pypy3, graalpy).
_INTERPRETER = re.compile(r"(python|pypy|graalpy)", re.IGNORECASE)


def interpreter() -> str:
    """The interpreter to start children with: ``$GPUSCOPE_PYTHON``, else ``sys.executable`` when it is one.

    Raises
    ------
    OSError
        There is none: the message says why (``sys.executable`` empty, missing, or the frozen or embedding
        application itself) and to set ``GPUSCOPE_PYTHON``. Callers turn it into their own error or fallback.
    """
    chosen = os.environ.get(ENV_VAR)
    path = chosen or sys.executable or ""
    if not chosen:
        if not path:
            raise OSError(f"sys.executable is empty (an embedded Python): set {ENV_VAR} to a Python interpreter")
        if getattr(sys, "frozen", False):
            raise OSError(f"this is a frozen application: sys.executable ({path}) is the application, not a Python "
                          f"interpreter; set {ENV_VAR} to one")
        if not _INTERPRETER.search(os.path.basename(path)):
            raise OSError(f"sys.executable ({path}) is not a Python interpreter (an application that embeds "
                          f"Python?); set {ENV_VAR} to one")
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        origin = ENV_VAR if chosen else "sys.executable"
        raise OSError(f"{origin} ({path}) is not an executable file")
    return path


def sys_path() -> list[str]:
    """The parent's ``sys.path`` for a child process: the folder that holds this gpuscope first, then the rest
    without ``''`` and the current folder (``python -c`` and ``-m`` put those first; a child must not import from
    there)."""
    package_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # gpuscope/cupti/
    cwd = os.getcwd()
    rest = [p for p in sys.path if p and os.path.abspath(p) != cwd and os.path.abspath(p) != package_parent]
    return [package_parent, *rest]
