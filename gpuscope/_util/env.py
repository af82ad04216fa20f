"""On/off environment variables (``GPUSCOPE_PC_DETACH``, ``GPUSCOPE_RESULTS_PROCESS``, ...), all read alike."""

from __future__ import annotations

import os
import threading
import warnings

from gpuscope.errors import GpuscopeWarning

__all__ = ["flag", "ON", "OFF"]

#: The spellings of on and of off, case and surrounding spaces aside.
ON = ("1", "true", "yes", "on")
OFF = ("0", "false", "no", "off")

_warned: set[tuple[str, str]] = set()
_lock = threading.Lock()


def flag(name: str, default: bool) -> bool:
    """Whether the environment variable *name* is on: one of :data:`ON` or :data:`OFF` (any case), *default* when
    it is unset or empty. Any other value is warned about once (:class:`~gpuscope.errors.GpuscopeWarning`, naming
    the spellings) and *default* used: a typo must not silently turn a feature off, nor stop a profiled program."""
    text = os.environ.get(name, "").strip().lower()
    if not text:
        return default
    if text in ON:
        return True
    if text in OFF:
        return False
    with _lock:
        first = (name, text) not in _warned
        _warned.add((name, text))
    if first:
        warnings.warn(f"{name}={text!r} is neither on ({', '.join(ON)}) nor off ({', '.join(OFF)}): using the "
                      f"default, {'on' if default else 'off'}.", GpuscopeWarning, stacklevel=2)
    return default
