"""NVTX ranges as gpuscope ranges: ``gpuscope.Profiler(nvtx=...)``, ``gpuscope run --nvtx``, :func:`enable_nvtx`.

Research code and PyTorch mark their phases with NVTX (``torch.cuda.nvtx.range``, ``emit_nvtx``, the ``nvtx``
package). A session that takes NVTX ranges hears every NVTX range push and pop of the process through CUPTI
(:class:`gpuscope.cupti.nvtx.NvtxWatcher`) and turns each push that its filters select into a gpuscope range on
the pushing thread (:func:`gpuscope._range_profiling.ranges.push_for`), told to that session only: it is named,
nested and profiled as a ``gpuscope.range`` block of the same name would be ("step/forward").

What makes NVTX reach CUPTI: ``NVTX_INJECTION64_PATH`` naming the libcupti gpuscope loads before a library's
first NVTX call (NVTX 3 reads it once per library that embeds it; the ``nvtx`` package and PyTorch each embed their
own). :func:`enable_nvtx` sets it; a session checks it (:func:`check_injection`) and, where the ``nvtx`` package is
installed, pushes and pops one probe range through it to see that it arrives; where nothing can arrive it raises
:class:`~gpuscope.errors.NvtxUnavailableError` or warns, and at the end it says when no NVTX range was heard.

Filters (:class:`NvtxFilter`) are patterns in the spirit of ``ncu --nvtx-include``: ``[domain@]glob``, the glob
matched (``fnmatch``, case-sensitive) against the range's NVTX path on its thread (the messages of the NVTX ranges
open around it, then its own, joined by "/"), the domain glob against its domain's name ("NVTX" for the default
domain). A pattern selects a range when it matches the range or a range it is nested in. Ranges of the "gpuscope"
domain are never taken (``gpuscope.range`` makes those rows already).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
import sys
import threading
import warnings

from gpuscope._range_profiling import ranges as _ranges
from gpuscope.errors import GpuscopeWarning, NvtxUnavailableError, SessionConflictError, UnbalancedRangeError

__all__ = ["DEFAULT_DOMAIN", "NvtxFilter", "NvtxRanges", "check_injection", "enable_nvtx"]

INJECTION_VAR = "NVTX_INJECTION64_PATH"  # as gpuscope.cupti.nvtx.INJECTION_VAR, without loading the shim
DEFAULT_DOMAIN = "NVTX"  # the name the nvtx package gives NVTX's default domain; what "NVTX@..." patterns match
OWN_DOMAIN = "gpuscope"
UNNAMED = "?"  # a range whose message is a string registered before any session listened
PROBE = "gpuscope-nvtx-probe"

_domains: dict[int, str] = {0: DEFAULT_DOMAIN}  # domain handle -> name, heard while a session listened
_strings: dict[int, str] = {}  # registered string handle -> text, heard while a session listened
_taking: list = []  # the open NvtxRanges (one per process)
_taking_lock = threading.Lock()

HOW = ("Call gpuscope.enable_nvtx() at the top of the script, before anything makes an NVTX call (torch.cuda.nvtx, "
       "nvtx.annotate, gpuscope.range), or run it with gpuscope run --nvtx.")


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _cupti_path() -> str:
    from gpuscope.cupti import _api

    return _api.library().path


def enable_nvtx() -> str:
    """Route this process's NVTX calls to CUPTI, so that sessions can take NVTX ranges (``Profiler(nvtx=True)``).

    Sets ``NVTX_INJECTION64_PATH`` to the libcupti gpuscope loads (loading it, not CUDA). NVTX reads the variable
    once, at each library's first NVTX call: call this at the top of the script, before the first
    ``torch.cuda.nvtx``, ``nvtx.annotate`` or ``gpuscope.range``. A library whose NVTX started earlier stays
    silent; a warning says so where gpuscope can see it (the ``nvtx`` package). The variable stays set for the
    process and the processes it starts (their NVTX calls then load libcupti, cheaply, and go nowhere).

    Returns
    -------
    str
        The libcupti path the variable now names.

    Raises
    ------
    NvtxUnavailableError
        The variable already names another tool's library (Nsight Systems sets it for the programs it runs):
        NVTX goes to that tool.
    CuptiNotFoundError
        No usable libcupti.
    """
    path = _cupti_path()
    current = os.environ.get(INJECTION_VAR)
    if current and _same_file(current, path):
        return current
    if current:
        raise NvtxUnavailableError(
            f"{INJECTION_VAR} names {current}, another NVTX tool's library (Nsight Systems sets it for the programs "
            f"it runs): this process's NVTX calls go to that tool, and gpuscope does not take them from it. To take "
            "NVTX ranges with gpuscope, run the script without that tool.")
    os.environ[INJECTION_VAR] = path
    module = sys.modules.get("nvtx.nvtx")
    cached = getattr(getattr(module, "_get_domain_cached", None), "cache_info", None)
    if cached is not None and cached().currsize:
        warnings.warn(
            "The nvtx package made NVTX calls before gpuscope.enable_nvtx() (an nvtx.annotate, nvtx.push_range or "
            "gpuscope.range ran): its NVTX started without a tool and stays so, so its ranges will not reach "
            f"gpuscope. {HOW}", GpuscopeWarning, stacklevel=2)
    return path


def check_injection() -> None:
    """Refuse a session that asks for NVTX ranges where none can reach CUPTI.

    Raises
    ------
    NvtxUnavailableError
        ``NVTX_INJECTION64_PATH`` is not set, or names another library than the libcupti gpuscope loads.
    """
    current = os.environ.get(INJECTION_VAR)
    if not current:
        raise NvtxUnavailableError(
            f"NVTX ranges were asked for, but {INJECTION_VAR} is not set: this process's NVTX calls reach no tool, "
            f"so none can become a row. {HOW}")
    path = _cupti_path()
    if not _same_file(current, path):
        raise NvtxUnavailableError(
            f"NVTX ranges were asked for, but {INJECTION_VAR} names {current}, not the CUPTI gpuscope uses ({path}): "
            "NVTX calls go to that library. Unset the variable and call gpuscope.enable_nvtx() at the top of the "
            "script, or run it with gpuscope run --nvtx.")


@dataclasses.dataclass(frozen=True)
class NvtxPattern:
    """One ``[domain@]glob`` pattern (module docstring)."""

    text: str
    domain: str | None
    glob: str

    @classmethod
    def parse(cls, text, what: str) -> NvtxPattern:
        if not isinstance(text, str):
            raise TypeError(f"{what} entries are strings ('[domain@]range/path', globs allowed), not {text!r}")
        domain, at, glob = text.partition("@")
        if not at:
            domain, glob = None, text
        elif not domain:
            raise ValueError(f"{what}: {text!r} has no domain before '@'; write 'domain@range' (the default domain is "
                             f"{DEFAULT_DOMAIN!r}) or leave out 'domain@' to match ranges of every domain")
        glob = glob.removesuffix("/")  # ncu writes push/pop ranges as "range/"
        if not glob and domain is None:
            raise ValueError(f"{what}: an empty pattern matches nothing; give a range name or path such as 'step' or "
                             "'step/forward' (globs allowed: '*/forward')")
        if "//" in glob or glob.startswith("/") or glob.endswith("/"):
            raise ValueError(f"{what}: {text!r} has an empty level; NVTX paths are names joined by single '/' "
                             "('step/forward')")
        return cls(text, domain, glob or "*")

    def matches(self, domain: str | None, path: str) -> bool:
        if self.domain is not None and (domain is None or not fnmatch.fnmatchcase(domain, self.domain)):
            return False
        return fnmatch.fnmatchcase(path, self.glob)


def _patterns(value, what: str) -> tuple:
    if isinstance(value, str):
        value = [value]
    try:
        items = list(value)
    except TypeError:
        raise TypeError(f"{what} takes a pattern or a list of patterns ('[domain@]range/path'), not {value!r}"
                        ) from None
    return tuple(NvtxPattern.parse(item, what) for item in items)


@dataclasses.dataclass(frozen=True)
class NvtxFilter:
    """Which NVTX ranges a session takes: those matching an *include* pattern (every range if none is given) and no
    *exclude* pattern; a pattern that matches a range also matches the ranges nested in it."""

    include: tuple = ()
    exclude: tuple = ()

    @classmethod
    def build(cls, nvtx=None, exclude=None) -> NvtxFilter | None:
        """The filter for ``Profiler(nvtx=..., nvtx_exclude=...)``; None when NVTX ranges are not taken.

        *nvtx*: None or False (not taken, unless *exclude* is given), True (every range), a pattern or a list of
        patterns (those ranges). *exclude*: a pattern or a list of them.

        Raises
        ------
        TypeError
            A value of another kind.
        ValueError
            A bad pattern, an empty list, or ``nvtx=False`` with *exclude*.
        """
        if exclude is not None and nvtx is False:
            raise ValueError("nvtx_exclude= filters the NVTX ranges a session takes, but nvtx=False takes none; pass "
                             "nvtx=True (or include patterns) with it, or leave nvtx_exclude out")
        if nvtx is None or nvtx is False:
            if exclude is None:
                return None
            nvtx = True
        include = () if nvtx is True else _patterns(nvtx, "nvtx")
        if nvtx is not True and not include:
            raise ValueError("nvtx=[] names no NVTX range; pass nvtx=True for every range, or patterns such as "
                             "nvtx=['step'] or nvtx='*/forward'")
        dropped = () if exclude is None else _patterns(exclude, "nvtx_exclude")
        if exclude is not None and not dropped:
            raise ValueError("nvtx_exclude=[] names no NVTX range; leave it out, or give patterns")
        return cls(include, dropped)

    def describe(self) -> str:
        """The filter in a line (Dataset attr ``nvtx``): "all", or its patterns."""
        parts = [f"include {', '.join(p.text for p in self.include)}" if self.include else "all"]
        if self.exclude:
            parts.append(f"exclude {', '.join(p.text for p in self.exclude)}")
        return "; ".join(parts)


class _Owner:
    """Who opened one NVTX-taken range on the ranges' stacks (``stale`` once its session has closed)."""

    __slots__ = ("name", "stale")

    def __init__(self, name: str):
        self.name, self.stale = name, False

    def __repr__(self):
        return f"NVTX range {self.name!r}"


class _Open:
    """One NVTX range open on a thread while the session listens."""

    __slots__ = ("domain", "excluded", "included", "owner", "path")

    def __init__(self, domain, path, included, excluded):
        self.domain, self.path, self.included, self.excluded, self.owner = domain, path, included, excluded, None


def _name(text: str) -> str:
    """A gpuscope range name for an NVTX message: "/" separates range levels, so it becomes "|"."""
    text = text.replace("/", "|").replace("\0", "").strip()
    return text or "(no message)"


class NvtxRanges:
    """A session's NVTX ranges: hears NVTX (CUPTI's callbacks) from construction to :meth:`close` and drives
    *session*'s ranges with the ranges *filter* selects.

    Raises
    ------
    SessionConflictError
        Another session takes NVTX ranges in this process (one at a time).
    ProfilerBusyError
        Another CUPTI client holds CUPTI's callback subscriber (torch.profiler, Nsight Systems).
    """

    def __init__(self, session, filter: NvtxFilter):
        from gpuscope.cupti.nvtx import NvtxWatcher

        self._session, self.filter = session, filter
        self._local = threading.local()
        self._live: set = set()  # owners of taken ranges still open
        self._lock = threading.Lock()
        self.heard = self.taken = self.unnamed = 0
        self._probe_heard = False
        self._warned_nesting = False
        with _taking_lock:
            if _taking:
                raise SessionConflictError(
                    f"NVTX ranges are already taken by {_taking[0]._session!r}; one session at a time takes them. "
                    "Close it first, or leave nvtx= out here.")
            _taking.append(self)
        self._open = True  # before the first callback can come
        try:
            self._watcher = NvtxWatcher(self._on_call)
        except BaseException:
            self._open = False
            _taking.remove(self)
            raise
        self.probe = self._probe()
        if self.probe is False:
            warnings.warn(
                "NVTX calls of the nvtx package do not reach gpuscope: its NVTX started before "
                f"{INJECTION_VAR} named libcupti (NVTX reads it once per library, at its first call; an "
                "nvtx.annotate or gpuscope.range made one). Its ranges will not be rows; PyTorch's (torch.cuda.nvtx) "
                f"will only if PyTorch made no NVTX call before either. {HOW}", GpuscopeWarning, stacklevel=3)

    def _probe(self) -> bool | None:
        """Push and pop a range through the nvtx package and see whether it arrived (None: no nvtx package, or
        NVTX disabled by ``NVTX_DISABLE``)."""
        try:
            import nvtx
        except Exception:
            return None
        if not nvtx.enabled():
            return None
        self._local.probing = True
        try:
            nvtx.push_range(PROBE)
            nvtx.pop_range()
        except Exception:  # an nvtx package gpuscope does not know: no probe, the end-of-session check remains
            return None
        finally:
            self._local.probing = False
        return self._probe_heard

    # -- NVTX calls, on the calling thread ------------------------------------------------------------------
    def _on_call(self, call) -> None:
        kind = call.kind
        if kind == "domain":
            if call.handle:
                _domains[call.handle] = call.text
            return
        if kind == "string":
            if call.handle:
                _strings[call.handle] = call.text
            return
        if kind == "destroy":
            _domains.pop(call.domain, None)
            return
        if not self._open or _ranges.emitting():  # closed (a call in flight), or gpuscope.range's own NVTX range
            return
        if getattr(self._local, "probing", False):
            self._probe_heard = True
            return
        if _domains.get(call.domain) == OWN_DOMAIN:
            return
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        if kind == "push":
            self._push(stack, call)
        elif kind == "pop":
            self._pop(stack, call.domain)

    def _push(self, stack: list, call) -> None:
        self.heard += 1
        text = call.text if call.text is not None else _strings.get(call.handle)
        if text is None:
            self.unnamed += 1
            name = UNNAMED
        else:
            name = _name(text)
        domain = _domains.get(call.domain)
        parent = stack[-1] if stack else None
        path = f"{parent.path}/{name}" if parent is not None else name
        f = self.filter
        included = (parent is not None and parent.included) or any(p.matches(domain, path) for p in f.include)
        excluded = (parent is not None and parent.excluded) or any(p.matches(domain, path) for p in f.exclude)
        entry = _Open(call.domain, path, included, excluded)
        stack.append(entry)
        if (included or not f.include) and not excluded:
            owner = _Owner(name)
            _ranges.push_for(owner, name, self._session)
            entry.owner = owner
            self.taken += 1
            with self._lock:
                self._live.add(owner)

    def _pop(self, stack: list, domain: int) -> None:
        """NVTX pops the innermost open range of the popped domain (nesting is per thread and domain)."""
        index = next((i for i in range(len(stack) - 1, -1, -1) if stack[i].domain == domain), None)
        if index is None:  # pushed before the session listened
            return
        entry = stack.pop(index)
        owner = entry.owner
        if owner is None:
            return
        with self._lock:
            self._live.discard(owner)
        try:
            _ranges.pop_for(owner)
        except UnbalancedRangeError as exc:  # ranges opened inside it were closed with it
            for inner in stack[index:]:
                if inner.owner is not None:
                    with self._lock:
                        self._live.discard(inner.owner)
                    inner.owner = None
            if not self._warned_nesting:
                self._warned_nesting = True
                warnings.warn(f"NVTX ranges do not nest with the other ranges of their thread ({exc}). NVTX ranges "
                              "of different domains, and NVTX ranges and gpuscope.range blocks, must close in the "
                              "reverse order of opening to be profiled.", GpuscopeWarning, stacklevel=2)

    # -- the end ------------------------------------------------------------------------------------------
    def close(self, report: bool = True) -> None:
        """Stop hearing NVTX (safe to call twice). Taken ranges still open leave the stacks without a row: those
        of the calling thread now, those of other threads at their thread's next range. With *report*, warn when
        no NVTX range was heard or none was taken."""
        if not self._open:
            return
        self._open = False
        try:
            self._watcher.close()
        finally:
            with _taking_lock:
                if self in _taking:
                    _taking.remove(self)
            with self._lock:
                live, self._live = list(self._live), set()
            for owner in live:
                owner.stale = True
                _ranges.discard(owner)
        if report:
            self._report()

    def notes(self) -> dict:
        """Dataset attrs: the filter, and how many NVTX ranges were heard and taken."""
        return {"nvtx": self.filter.describe(), "nvtx_ranges_heard": self.heard, "nvtx_ranges_taken": self.taken}

    def _report(self) -> None:
        if self.unnamed:
            _warn(f"{self.unnamed} NVTX range(s) were named by strings registered before a session took NVTX "
                  f"ranges (the nvtx package registers each message once, at its first use); they are named "
                  f"{UNNAMED!r}. Open the session before the first nvtx.annotate of each message, or use "
                  "gpuscope run --nvtx, whose session opens before the script starts.")
        if not self.heard:
            probe = {True: "the probe range through the nvtx package did arrive, so NVTX works here: ",
                     False: "the nvtx package's NVTX started too early (a warning said so at the start); ",
                     None: ""}[self.probe]
            _warn(f"No NVTX range was heard while the session took NVTX ranges: {probe}did the code push none, "
                  "or did its library (PyTorch) make its first NVTX call before "
                  f"{INJECTION_VAR} was set? {HOW}")
        elif not self.taken:
            _warn(f"{self.heard} NVTX range(s) were heard, but none matched the NVTX filters "
                  f"({self.filter.describe()}); patterns match the NVTX path ('step/forward'), with 'domain@' for "
                  f"one domain (default domain: {DEFAULT_DOMAIN!r}).")


def _warn(message: str) -> None:
    warnings.warn(message, GpuscopeWarning, stacklevel=4)
