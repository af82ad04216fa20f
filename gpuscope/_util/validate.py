"""Argument checks shared by gpuscope's public entry points.

Each helper returns the value in its normal form (``int``, ``float``, ...) or raises a plain ``TypeError``
(wrong kind of value) or ``ValueError`` (right kind, wrong value) whose message names the argument, the value
given and what is allowed. Entry points call them first, before any CUDA or CUPTI work, so a bad argument
leaves nothing half made and gpuscope usable.

Pure Python and numpy: nothing here loads CUDA, CUPTI or xarray (xarray only when a Dataset is checked).
"""

from __future__ import annotations

import datetime
import math
import numbers
import os
import re
from collections.abc import Iterable

__all__ = [
    "integer",
    "positive_int",
    "real",
    "finite_positive_float",
    "duration",
    "choice",
    "names",
    "dataset",
    "path",
]

#: The largest value a C ``int64_t`` holds: integers passed on to CUDA or CUPTI stay below it (bigger ones wrap).
INT64_MAX = (1 << 63) - 1

_UNITS_NS = {"ns": 1, "us": 1_000, "µs": 1_000, "ms": 1_000_000, "s": 1_000_000_000}
_DURATION_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(ns|us|µs|ms|s)\s*$")


def _range_text(minimum, maximum) -> str:
    if minimum is not None and maximum is not None:
        return f"from {minimum:,} to {maximum:,}"
    if minimum is not None:
        return f"at least {minimum:,}"
    if maximum is not None:
        return f"at most {maximum:,}"
    return ""


def integer(value, name: str, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """*value* as an ``int`` within ``[minimum, maximum]``.

    Parameters
    ----------
    value
        A Python or numpy integer (``True``/``False`` and floats such as ``4.0`` are refused: they are usually
        a mistake).
    name : str
        The argument's name, for the message.
    minimum, maximum : int, optional
        Inclusive bounds. Give a maximum for values passed on to C (at most :data:`INT64_MAX`), so nothing wraps.

    Returns
    -------
    int

    Raises
    ------
    TypeError
        Not an integer.
    ValueError
        Outside the bounds.
    """
    allowed = f"an integer {_range_text(minimum, maximum)}".rstrip()
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be {allowed}; got {value!r} ({type(value).__name__}).")
    value = int(value)
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise ValueError(f"{name} must be {allowed}; got {value:,}.")
    return value


def positive_int(value, name: str, maximum: int | None = None) -> int:
    """*value* as an ``int`` from 1 to *maximum* (see :func:`integer`).

    Raises
    ------
    TypeError
        Not an integer.
    ValueError
        Below 1 or above *maximum*.
    """
    return integer(value, name, minimum=1, maximum=maximum)


def real(value, name: str, *, minimum: float | None = None, maximum: float | None = None,
         exclusive_minimum: bool = False) -> float:
    """*value* as a finite ``float`` within the bounds (NaN and infinities are refused).

    Parameters
    ----------
    value
        A Python or numpy real number (not a bool).
    name : str
        The argument's name, for the message.
    minimum, maximum : float, optional
        Bounds, inclusive unless *exclusive_minimum*.
    exclusive_minimum : bool
        The value must be greater than *minimum*.

    Returns
    -------
    float

    Raises
    ------
    TypeError
        Not a real number.
    ValueError
        NaN, infinite, or outside the bounds.
    """
    parts = []
    if minimum is not None:
        parts.append(f"{'above' if exclusive_minimum else 'at least'} {minimum:g}")
    if maximum is not None:
        parts.append(f"at most {maximum:g}")
    allowed = "a finite number" + (f" {' and '.join(parts)}" if parts else "")
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be {allowed}; got {value!r} ({type(value).__name__}).")
    value = float(value)
    if (
        not math.isfinite(value)
        or (minimum is not None and (value <= minimum if exclusive_minimum else value < minimum))
        or (maximum is not None and value > maximum)
    ):
        raise ValueError(f"{name} must be {allowed}; got {value!r}.")
    return value


def finite_positive_float(value, name: str, maximum: float | None = None) -> float:
    """*value* as a finite ``float`` above 0 (and at most *maximum*); see :func:`real`.

    Raises
    ------
    TypeError
        Not a real number.
    ValueError
        NaN, infinite, 0 or negative, or above *maximum*.
    """
    return real(value, name, minimum=0.0, maximum=maximum, exclusive_minimum=True)


def duration(value, name: str, *, minimum_ns: int = 1, maximum_ns: int = INT64_MAX, whole: bool = False) -> int:
    """A time span in whole nanoseconds.

    Parameters
    ----------
    value
        A string with a unit (``"20us"``, ``"0.5 ms"``, ``"1e-4s"``; units ns, us, µs, ms, s), a
        :class:`datetime.timedelta`, or a number of nanoseconds.
    name : str
        The argument's name, for the message.
    minimum_ns, maximum_ns : int
        Inclusive bounds on the rounded value.
    whole : bool
        Refuse a value that is not a whole number of nanoseconds instead of rounding it.

    Returns
    -------
    int
        Nanoseconds.

    Raises
    ------
    TypeError
        Neither a string, a timedelta nor a number.
    ValueError
        A string without a known unit, NaN, infinite, outside the bounds, or (*whole*) a fraction of a ns.
    """
    allowed = f"a time from {minimum_ns:,} ns to {maximum_ns:,} ns, e.g. '20us', '1ms' or a number of ns"
    if isinstance(value, datetime.timedelta):
        ns = value.total_seconds() * 1e9
    elif isinstance(value, numbers.Real) and not isinstance(value, bool):
        ns = float(value)
    elif isinstance(value, str):
        match = _DURATION_RE.match(value)
        if not match:
            raise ValueError(
                f"Cannot read {name}={value!r}: write a number and a unit, e.g. '20us', '100 us', '1ms' "
                "(units: ns, us, ms, s)."
            )
        ns = float(match.group(1)) * _UNITS_NS[match.group(2)]
    else:
        raise TypeError(f"{name} must be {allowed}; got {value!r} ({type(value).__name__}).")
    if not math.isfinite(ns) or not minimum_ns <= round(ns) <= maximum_ns:
        raise ValueError(f"{name} must be {allowed}; got {value!r}.")
    if whole and abs(ns - round(ns)) > 1e-3:  # a decimal string's float error is far below 1e-3 ns
        bare = isinstance(value, numbers.Real)
        hint = f"A number without a unit is ns: give a unit (e.g. '{ns:g}us' for µs) or " if bare else "Give "
        raise ValueError(f"{name} must be a whole number of nanoseconds; got {value!r} ({ns:g} ns). {hint}a whole "
                         f"number of ns, e.g. {round(ns)}.")
    return int(round(ns))


def choice(value, name: str, allowed: Iterable):
    """*value* if it is one of *allowed* (compared with ``==``; ``True`` does not count as ``1``).

    Raises
    ------
    ValueError
        Not one of *allowed*; the message lists them.
    """
    allowed = list(allowed)
    for option in allowed:
        if type(value) is type(option) or (isinstance(value, str) and isinstance(option, str)):
            if value == option:
                return option
    raise ValueError(f"{name} must be one of {', '.join(repr(a) for a in allowed)}; got {value!r}.")


def names(value, name: str) -> list[str]:
    """A non-empty list of non-empty strings, from one string or an iterable of them.

    Raises
    ------
    TypeError
        Not a string or an iterable of strings (e.g. None, a number, a list holding a number).
    ValueError
        An empty list or an empty name.
    """
    if isinstance(value, str):
        items = [value]
    elif isinstance(value, Iterable) and not isinstance(value, (bytes, dict)):
        items = list(value)
    else:
        raise TypeError(f"{name} must be a name or a list of names (str); got {value!r} ({type(value).__name__}).")
    bad = [v for v in items if not isinstance(v, str)]
    if bad:
        raise TypeError(f"{name} must hold names (str); got {bad[0]!r} ({type(bad[0]).__name__}) in {value!r}.")
    if not items or not all(items):
        raise ValueError(f"{name} must name at least one item, each a non-empty str; got {value!r}.")
    return items


def dataset(value, name: str):
    """*value* if it is an :class:`xarray.Dataset`.

    Raises
    ------
    TypeError
        Anything else (None, a DataArray, a path: the message says how to get a Dataset).
    """
    import xarray as xr

    if isinstance(value, xr.Dataset):
        return value
    hint = ""
    if isinstance(value, xr.DataArray):
        hint = " (a DataArray: pass the Dataset that holds it, or .to_dataset())"
    elif isinstance(value, (str, os.PathLike)):
        hint = " (a path: load it first with gpuscope.open_dataset(path))"
    raise TypeError(f"{name} must be an xarray.Dataset{hint}; got {type(value).__name__}.")


def path(value, name: str):
    """*value* if it is a file path (``str`` or :class:`os.PathLike`, not empty).

    Raises
    ------
    TypeError
        Not a str or PathLike (None, a number: an integer would be taken as an open file descriptor).
    ValueError
        An empty string.
    """
    if isinstance(value, bool) or not isinstance(value, (str, os.PathLike)):
        hint = " (an integer would be taken as an open file descriptor)" if isinstance(value, numbers.Integral) else ""
        raise TypeError(
            f"{name} must be a file path (str or pathlib.Path); got {value!r} ({type(value).__name__}){hint}."
        )
    if os.fspath(value) == "":
        raise ValueError(f"{name} must be a file path; got an empty string.")
    return value
