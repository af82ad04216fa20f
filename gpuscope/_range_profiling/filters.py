"""Which kernel launches a session profiles: ``kernels=``, ``exclude=``, ``launch_skip=``, ``launch_count=``.

The conventions are Nsight Compute's (``-k``, ``--launch-skip``, ``--launch-count``): a pattern is a kernel name
or ``"regex:<pattern>"``. A plain name matches a launch whose name (``fma``: what the report shows), qualified
name (``__main__.main.<locals>.fma`` for Numba, ``ns::kernel<float>`` for C++) or raw symbol equals it, or whose
qualified name ends with it after a dot (``fma`` and ``main.<locals>.fma`` both match
``__main__.main.<locals>.fma``); a regex is searched in the name, the qualified name and the raw symbol.
``launch_skip`` and ``launch_count`` count only launches that pass the name filters.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["KernelFilter"]


def _patterns(value, what: str) -> tuple:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    try:
        items = list(value)
    except TypeError:
        raise TypeError(f"{what} takes a kernel name, 'regex:<pattern>' or a list of them, not {value!r}") from None
    out = []
    for item in items:
        if not isinstance(item, str) or not item:
            raise TypeError(f"{what} entries are non-empty strings (kernel names or 'regex:<pattern>'), not {item!r}")
        if item.startswith("regex:"):
            try:
                out.append(re.compile(item[6:]))
            except re.error as exc:
                raise ValueError(f"{what}: {item!r} is not a valid regular expression ({exc})") from None
        else:
            out.append(item)
    return tuple(out)


def _matches(patterns, name: str, qualname: str, symbol: str) -> bool:
    for p in patterns:
        if isinstance(p, str):
            if p in (name, qualname, symbol) or qualname.endswith("." + p) or name.endswith("." + p):
                return True
        elif p.search(name) or p.search(qualname) or p.search(symbol):
            return True
    return False


def checked_int(value, what: str, minimum: int = 1, maximum: int | None = None, allow_none: bool = False):
    """*value* as an ``int`` in [*minimum*, *maximum*] (None passes with *allow_none*), else a message naming it.

    Shared by the kernel filters and :class:`gpuscope.Profiler`'s integer options.
    """
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{what} must be an integer, not {value!r}")
    value = int(value)
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"between {minimum} and {maximum}" if maximum is not None else f"at least {minimum}"
        hint = " (launch_count=0 would profile nothing; leave it None to profile every launch)" if (
            what == "launch_count") else ""
        raise ValueError(f"{what} must be {bound}, not {value}{hint}")
    return value


@dataclass
class KernelFilter:
    """Launch selection of a session (see the module docstring for the matching rules).

    Raises
    ------
    TypeError, ValueError
        A pattern that is not a string, an invalid regex, a negative ``launch_skip`` or ``launch_count < 1``.
    """

    kernels: tuple = ()
    exclude: tuple = ()
    launch_skip: int = 0
    launch_count: int | None = None

    @classmethod
    def build(cls, kernels=None, exclude=None, launch_skip=0, launch_count=None) -> KernelFilter:
        return cls(_patterns(kernels, "kernels"), _patterns(exclude, "exclude"),
                   checked_int(launch_skip, "launch_skip", 0),
                   checked_int(launch_count, "launch_count", 1, allow_none=True))

    @property
    def active(self) -> bool:
        """Whether any launch can be left out."""
        return bool(self.kernels or self.exclude or self.launch_skip or self.launch_count is not None)

    def name_matches(self, name: str, symbol: str, qualname: str | None = None) -> bool:
        """Whether a launch passes ``kernels=`` and ``exclude=`` (*qualname*: its qualified name, default *name*)."""
        qualname = name if qualname is None else qualname
        if self.kernels and not _matches(self.kernels, name, qualname, symbol):
            return False
        return not (self.exclude and _matches(self.exclude, name, qualname, symbol))

    def in_window(self, index: int) -> bool:
        """Whether the *index*-th name-matching launch (from 0) is inside ``launch_skip``/``launch_count``."""
        if index < self.launch_skip:
            return False
        return self.launch_count is None or index < self.launch_skip + self.launch_count

    def done(self, index: int) -> bool:
        """Whether no launch from the *index*-th matching one on can be selected."""
        return self.launch_count is not None and index >= self.launch_skip + self.launch_count

    def describe(self) -> str:
        parts = []
        for label, pats in (("kernels", self.kernels), ("exclude", self.exclude)):
            if pats:
                parts.append(f"{label}={[p if isinstance(p, str) else 'regex:' + p.pattern for p in pats]}")
        if self.launch_skip:
            parts.append(f"launch_skip={self.launch_skip}")
        if self.launch_count is not None:
            parts.append(f"launch_count={self.launch_count}")
        return ", ".join(parts) or "every launch"
