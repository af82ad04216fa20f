"""Binding CUPTI functions: prototype tables, bind on first use, one checked-call path.

Each shim module declares one :class:`Functions` table per CUPTI header it wraps, every entry with its C
prototype as a comment::

    _f = Functions("cupti_profiler_host.h", {
        # CUptiResult cuptiProfilerHostInitialize(CUpti_Profiler_Host_Initialize_Params* pParams)
        "cuptiProfilerHostInitialize": [POINTER(T.CUpti_Profiler_Host_Initialize_Params)],
    })
    _f.cuptiProfilerHostInitialize(params)     # raises a CuptiError subclass on failure

Nothing is loaded until the first call. A symbol that the loaded CUPTI lacks fails when called, with a message
that names the CUPTI version that has it. A struct passed where the prototype says ``POINTER(Struct)``
is passed by reference (ctypes does that).
"""

from __future__ import annotations

import ctypes
import threading
import time
import warnings
from ctypes import POINTER, c_char_p, c_int, c_void_p

from gpuscope.cupti import _lib
from gpuscope.cupti._types import Version
from gpuscope.errors import CuptiNotFoundError, GpuscopeWarning, cupti_error

__all__ = ["Functions", "params", "version", "library", "error_message", "observe", "attached", "detach", "on_detach",
           "finalized_elsewhere", "CUPTI_SUCCESS"]

CUPTI_SUCCESS = 0
CUPTI_ERROR_NOT_READY = 13

_LIBRARY_FILES = {"cupti": None, "checkpoint": "libcheckpoint.so", "pcsamplingutil": "libpcsamplingutil.so"}
_extra_libs: dict[str, ctypes.CDLL] = {}
_extra_lock = threading.Lock()


def library() -> _lib.CuptiLibrary:
    """The loaded CUPTI (loads it on first use)."""
    return _lib.load()


def version() -> Version:
    """The (major, minor) version of the loaded CUPTI."""
    return _lib.load().version


def params(cls, **fields):
    """A params struct with ``structSize`` set for the loaded CUPTI version."""
    return cls.new(_lib.load().version, **fields)


def _cdll(which: str) -> ctypes.CDLL:
    lib = _lib.load()
    filename = _LIBRARY_FILES[which]
    if filename is None:
        return lib.cdll
    with _extra_lock:
        if which not in _extra_libs:
            path = lib.sibling(filename)
            try:
                _extra_libs[which] = ctypes.CDLL(path)
            except OSError as exc:
                raise CuptiNotFoundError(f"{filename} was not found beside {lib.path}: {exc}") from None
        return _extra_libs[which]


_message_fn = None
_observer = None
_attached = False  # a CUPTI call was made since the process started or CUPTI last detached
_detach_hooks: list[tuple] = []  # (before, after) from the shim modules that hold CUPTI state


def observe(callback) -> None:
    """Call ``callback(name, seconds)`` after every CUPTI call from now on (None: stop).

    For benchmarks that break a session's time down by CUPTI call (``benchmarks/bench_session_cost.py``); one
    observer per process. Costs one global lookup per call while none is set.
    """
    global _observer
    _observer = callback


def attached() -> bool:
    """Whether CUPTI is attached to the process: gpuscope made a CUPTI call since start or the last :func:`detach`."""
    return _attached


def on_detach(before, after) -> None:
    """Register a module's part of :func:`detach`: ``before()`` gives its CUPTI state back (it may raise to
    refuse: the detach then does not happen), ``after()`` forgets what CUPTI no longer has, without a CUPTI call
    (it runs after another client's ``cuptiFinalize`` too: :func:`finalized_elsewhere`)."""
    _detach_hooks.append((before, after))


def detach(prepare=None, call_site=None) -> None:
    """``cuptiFinalize``: CUPTI lets go of the process and forgets every kernel, module and subscriber it knew;
    the next CUPTI call attaches it afresh.

    The caller makes sure nothing holds CUPTI state (no open profiler, sampler, activity collection or launch
    listener); the shim modules' hooks give back what only they know of (the callback subscription, the
    activity buffers) and refuse with :class:`RuntimeError` if still in use. ``prepare()`` runs once every hook
    has agreed, just before CUPTI detaches. ``call_site(finalize) -> status`` calls ``finalize()`` where it is safe
    (:func:`gpuscope.cupti.callbacks.finalize_at_api_exit`: at the exit of a CUDA driver call, as CUPTI's guide
    says) and may refuse with :class:`RuntimeError` before it (nothing was finalized); without it, ``cuptiFinalize``
    is called here, and the caller makes sure that no other thread uses CUDA or CUPTI meanwhile. Measured on the
    H100 (CUPTI 13.0): 2-28 ms.
    """
    global _attached
    for before, _ in _detach_hooks:
        before()
    if prepare is not None:
        prepare()
    finalize = _cdll("cupti").cuptiFinalize  # resolved here, not in the driver's callback
    finalize.restype = c_int

    def call() -> int:
        began = time.perf_counter()
        status = finalize()
        if _observer is not None:
            _observer("cuptiFinalize", time.perf_counter() - began)
        return status

    status = call() if call_site is None else call_site(call)
    for _, after in _detach_hooks:
        after()
    if status != CUPTI_SUCCESS:
        raise cupti_error(status, "cuptiFinalize", error_message(status))
    _attached = False


#: What gpuscope says when it finds that another client of the process finalized CUPTI.
FINALIZED_ELSEWHERE = (
    "Another CUPTI client of this process finalized CUPTI (cuptiFinalize; torch.profiler's Kineto does at the end of "
    "a profile in some versions), and CUPTI forgot what gpuscope had in it: its callback subscriber, the range "
    "profiler or PM sampler kept between sessions, the CUPTI profiler's initialisation. gpuscope dropped them "
    "without using them and sets up afresh: the next session pays the full set-up. A gpuscope session open at that "
    "moment may have failed."
)


def finalized_elsewhere() -> None:
    """Another client of the process called ``cuptiFinalize`` (found by :func:`gpuscope.cupti.callbacks.known`):
    every module forgets what CUPTI forgot without calling CUPTI with it (the ``after`` hooks of :func:`on_detach`),
    and it is said once, as a :class:`~gpuscope.errors.GpuscopeWarning`."""
    for _, after in _detach_hooks:
        after()
    warnings.warn(FINALIZED_ELSEWHERE, GpuscopeWarning, stacklevel=3)


def reattach(context: int) -> None:
    """Attach CUPTI to the process again after :func:`detach`, through *context* (``cuptiGetContextId``): right
    after ``cuptiFinalize`` CUPTI 13.0 refuses ``cuptiProfilerInitialize`` (``CUPTI_ERROR_NOT_INITIALIZED``) until
    a call that names a context has run (measured on the H100, ``gpuscope/_pc_sampling/counters.py``)."""
    global _attached
    fn = _cdll("cupti").cuptiGetContextId
    fn.argtypes = [c_void_p, POINTER(ctypes.c_uint32)]
    fn.restype = c_int
    context_id = ctypes.c_uint32()
    status = fn(c_void_p(context), ctypes.byref(context_id))
    if status != CUPTI_SUCCESS:
        raise cupti_error(status, "cuptiGetContextId", error_message(status))
    _attached = True


def error_message(status: int) -> str:
    """CUPTI's own text for a status (``cuptiGetErrorMessage``, else ``cuptiGetResultString``)."""
    global _message_fn
    cdll = _lib.load().cdll
    if _message_fn is None:
        name = "cuptiGetErrorMessage" if hasattr(cdll, "cuptiGetErrorMessage") else "cuptiGetResultString"
        fn = getattr(cdll, name)
        fn.argtypes = [c_int, POINTER(c_char_p)]
        fn.restype = c_int
        _message_fn = fn
    text = c_char_p()
    if _message_fn(int(status), ctypes.byref(text)) != CUPTI_SUCCESS or not text.value:
        return f"CUptiResult {status}"
    return text.value.decode(errors="replace")


class _Bound:
    """One CUPTI function: resolved on first call, status checked on every call."""

    __slots__ = ("name", "argtypes", "since", "library", "allowed", "_fn")

    def __init__(self, name, argtypes, since, library, allowed):
        self.name, self.argtypes, self.since, self.library, self.allowed = name, argtypes, since, library, allowed
        self._fn = None

    def _resolve(self):
        cdll = _cdll(self.library)
        try:
            fn = getattr(cdll, self.name)
        except AttributeError:
            lib = _lib.load()
            have = f"CUPTI {self.since[0]}.{self.since[1]}" if self.since else "another CUPTI version"
            raise CuptiNotFoundError(
                f"{self.name} is not in the loaded CUPTI {lib.version_string} ({lib.path}); it needs {have}."
            ) from None
        fn.argtypes = self.argtypes
        fn.restype = c_int
        self._fn = fn
        return fn

    def __call__(self, *args):
        global _attached
        fn = self._fn or self._resolve()
        _attached = True
        if _observer is None:
            status = fn(*args)
        else:
            began = time.perf_counter()
            status = fn(*args)
            _observer(self.name, time.perf_counter() - began)
        if status != CUPTI_SUCCESS and status not in self.allowed:
            raise cupti_error(status, self.name, error_message(status))
        return status


class Functions:
    """A table of CUPTI functions from one header, bound lazily.

    Parameters
    ----------
    header : str
        The header the prototypes come from (for messages and docs).
    table : dict
        ``name -> argtypes``. Struct arguments are declared as ``POINTER(Struct)``; pass the struct itself.
    since : dict, optional
        ``name -> (major, minor)`` for functions that only later CUPTI versions export.
    library : str
        ``"cupti"`` (default), ``"checkpoint"`` or ``"pcsamplingutil"``.
    allowed : dict, optional
        ``name -> set of statuses`` that are returned rather than raised (e.g. NOT_READY for polling).
    """

    def __init__(self, header: str, table: dict, since=None, library: str = "cupti", allowed=None):
        self.header = header
        since = since or {}
        allowed = allowed or {}
        self._bound = {
            name: _Bound(name, list(argtypes), since.get(name), library, frozenset(allowed.get(name, ())))
            for name, argtypes in table.items()
        }

    def __getattr__(self, name):
        try:
            bound = self.__dict__["_bound"][name]
        except KeyError:
            raise AttributeError(f"{name} is not declared in gpuscope's table for {self.header}") from None
        return bound

    def has(self, name: str) -> bool:
        """Whether the loaded CUPTI exports *name*."""
        return hasattr(_cdll(self._bound[name].library), name)
