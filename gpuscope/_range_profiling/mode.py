"""How a range-profiling session collects (:class:`Mode`): user ranges, kernel replay, iterations as passes, auto.

Every part of :class:`gpuscope.Profiler` reads the mode it was asked for (``mode``) and the one it collects in
(``mode_used``: auto mode decides as the program runs); :mod:`gpuscope._range_profiling.session` says what each does.
"""

from __future__ import annotations

import enum

__all__ = ["Mode"]


class Mode(str, enum.Enum):
    """How a :class:`Profiler` collects: ``"user"``, ``"kernel"``, ``"iteration"`` or ``"auto"`` (module docstring)."""

    USER = "user"
    KERNEL = "kernel"
    ITERATION = "iteration"
    AUTO = "auto"
