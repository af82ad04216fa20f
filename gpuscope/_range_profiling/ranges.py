"""``gpuscope.range``: named, nested regions of user code.

A range is a context manager and a function decorator. Ranges nest per thread and are named by path
("step/fwd"). Entering one pushes the path on the calling thread's stack, emits an NVTX range (domain
"gpuscope") so Nsight tools see it, and tells every registered *listener*; leaving it tells the listeners and
pops the path, in ``finally``, also when the body raises.

Listeners are how sessions hear about ranges (the range profiler pushes/pops CUPTI ranges, the PM sampler
stamps times). The contract::

    listener.range_push(path)   # on the pushing thread, after the path is on the stack
    listener.range_pop(path)    # on the popping thread, before the path leaves the stack; also on exceptions

A listener that raises does not reach user code: its exception becomes a :class:`GpuscopeWarning` and the
stack stays balanced. With no listener a range costs a list append, an NVTX push (only where a tool is attached)
and their undoing. A *stamp log* (:func:`add_stamp_log`, PM sampling's) is cheaper than a listener: it gets a
tuple of the host clock, push or pop, path and thread at every push and pop.

The NVTX ranges a session takes (``gpuscope.Profiler(nvtx=...)``, :mod:`gpuscope._range_profiling.nvtx`) enter
the same stacks through :func:`push_for` and :func:`pop_for`: they name and nest like gpuscope ranges, are told
to that session only, and emit no NVTX range of their own. gpuscope's own NVTX calls are marked (:func:`emitting`)
so that the session hearing NVTX does not take them twice. The "gpuscope" NVTX domain is created at the first
range, not at import: NVTX reads ``NVTX_INJECTION64_PATH`` at its first call, which may come after import. Ranges
emit NVTX only where a tool is attached to the process (:data:`TOOL_VARIABLES` set, as Nsight Systems and Nsight
Compute do). Without one, NVTX calls would reach nothing but gpuscope's own CUPTI, which ignores gpuscope's ranges:
the ``nvtx`` package (0.2.17) also asks the CUDA driver for a tool at its first call
(``cuNvtxGetInjectionInitializer`` of ``libcuda.so.1``), so a first range made inside a session, with that CUPTI
attached, may route every later range through it (issue 52, item 13: ``probes/probe_cost_regressions.py``).
"""

from __future__ import annotations

import builtins
import functools
import os
import threading
import time
import warnings

from gpuscope.errors import GpuscopeWarning, UnbalancedRangeError

__all__ = ["range", "Range", "add_listener", "remove_listener", "current_path", "listeners", "push_for", "pop_for",
           "discard", "emitting", "add_stamp_log", "remove_stamp_log"]

_local = threading.local()
_UNSET = object()
_DOMAIN = _UNSET  # the nvtx package's "gpuscope" domain, made at the first range (None: no tool, or no nvtx package)

#: Environment variables that attach a tool to the process: NVTX's own, and CUDA's (a tool injected into the driver
#: may take NVTX through it). With neither set at the first range, gpuscope's ranges make no NVTX call.
TOOL_VARIABLES = ("NVTX_INJECTION64_PATH", "CUDA_INJECTION64_PATH")


def _domain():
    global _DOMAIN
    if _DOMAIN is _UNSET:
        _DOMAIN = None
        if any(os.environ.get(name) for name in TOOL_VARIABLES):
            try:  # NVTX is optional at run time: without it ranges are still recorded by gpuscope's listeners
                import nvtx as _nvtx

                _DOMAIN = _nvtx.get_domain("gpuscope")
            except Exception:  # pragma: no cover - depends on the environment
                _DOMAIN = None
    return _DOMAIN


def emitting() -> bool:
    """Whether the calling thread is inside one of gpuscope's own NVTX calls (a range's NVTX push or pop)."""
    return getattr(_local, "emitting", False)


def _emit(push: bool, path: str = "") -> None:
    domain = _DOMAIN if _DOMAIN is not _UNSET else _domain()
    if domain is None:  # no tool attached: the common case costs this test only
        return
    _local.emitting = True
    try:
        if push:
            domain.push_range(domain.get_event_attributes(message=path))
        else:
            domain.pop_range()
    finally:
        _local.emitting = False


_listeners: tuple = ()
_listeners_lock = threading.Lock()


def add_listener(listener) -> None:
    """Register an object with ``range_push(path)`` and ``range_pop(path)`` methods (idempotent)."""
    global _listeners
    for method in ("range_push", "range_pop"):
        if not callable(getattr(listener, method, None)):
            raise TypeError(f"a range listener needs a {method}(path) method; got {listener!r}")
    with _listeners_lock:
        if listener not in _listeners:
            _listeners = (*_listeners, listener)


def remove_listener(listener) -> None:
    """Unregister a listener (no error if it is not registered)."""
    global _listeners
    with _listeners_lock:
        _listeners = tuple(item for item in _listeners if item is not listener)


#: The stamp logs: functions that take ``(time.perf_counter_ns(), is_push, path, thread id)`` at every push and pop
#: of a gpuscope range (``list.append`` of PM sampling's range recorder). Cheaper than a listener, as a range inside
#: a sampled loop must be: no method lookup, no exception guard (appending to a list does not fail).
_stamp_logs: tuple = ()


def add_stamp_log(log) -> None:
    """Register *log* (a callable taking one tuple, such as a list's ``append``): every gpuscope range's push and
    pop from now on calls it with ``(time.perf_counter_ns(), is_push, path, threading.get_ident())``. Ranges taken
    from NVTX by a session (:func:`push_for`) are not logged."""
    global _stamp_logs
    with _listeners_lock:
        if log not in _stamp_logs:
            _stamp_logs = (*_stamp_logs, log)


def remove_stamp_log(log) -> None:
    """Unregister a stamp log (no error if it is not registered)."""
    global _stamp_logs
    with _listeners_lock:
        _stamp_logs = tuple(item for item in _stamp_logs if item != log)


_now = time.perf_counter_ns  # the stamp logs' clock (a name of this module's, for the tests)


def _stamp(is_push: bool, path: str) -> None:
    stamp = (_now(), is_push, path, threading.get_ident())
    for log in _stamp_logs:
        log(stamp)


def _forget_listeners_in_child() -> None:
    """After ``os.fork`` the child starts with no listeners nor stamp logs: the parent's sessions and samplers are
    not its own."""
    global _listeners, _listeners_lock, _stamp_logs
    _listeners = ()
    _stamp_logs = ()
    _listeners_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_listeners_in_child)


def listeners() -> tuple:
    """The registered listeners, in registration order."""
    return _listeners


def _stack() -> list:
    try:
        stack = _local.stack
    except AttributeError:
        stack = _local.stack = []
    while stack and getattr(stack[-1][1], "stale", False):  # left by a session that has closed (push_for)
        stack.pop()
    return stack


def current_path() -> str | None:
    """The innermost open range path of the calling thread, or None outside every range."""
    stack = _stack()
    return stack[-1][0] if stack else None


def _notify(targets, method: str, path: str) -> None:
    for listener in targets:
        try:
            getattr(listener, method)(path)
        except Exception as exc:  # a profiler's trouble must not break the user's program
            warnings.warn(
                f"gpuscope range listener {listener!r}.{method}({path!r}) raised {type(exc).__name__}: {exc}",
                GpuscopeWarning,
                stacklevel=3,
            )


# One open range on a thread's stack is a tuple (path, owner, notified, nvtx): its path, who opened it, the listeners
# it told, and whether it emitted NVTX. A tuple, not an object: a range is entered in user loops (a class with
# __slots__ cost 0.3 us more a range).


def _push(owner, name: str, targets=None) -> str:
    stack = _stack()
    path = f"{stack[-1][0]}/{name}" if stack else name
    if targets is None:  # a gpuscope range: every listener, and NVTX where a tool is attached
        targets = _listeners
        stack.append((path, owner, targets, True))
        if _DOMAIN is not None:
            _emit(True, path)
        if _stamp_logs:
            _stamp(True, path)
    else:
        targets = tuple(t for t in targets if t in _listeners)
        stack.append((path, owner, targets, False))
    if targets:
        _notify(targets, "range_push", path)
    return path


def _pop_entry(stack: list) -> None:
    path, _, notified, nvtx = stack[-1]
    if nvtx and _stamp_logs:  # a gpuscope range (push_for's emit no NVTX and are not logged)
        _stamp(False, path)
    if not notified:  # no listener was told: nothing can raise
        stack.pop()
        if nvtx and _DOMAIN is not None:
            _emit(False)
        return
    try:
        live = _listeners  # those told and still registered (all of them, unless the registry changed since)
        _notify(notified if notified is live else [item for item in notified if item in live], "range_pop", path)
    finally:
        stack.pop()
        if nvtx and _DOMAIN is not None:
            _emit(False)


def push_for(owner, name: str, listener) -> str:
    """Open a range named *name* on the calling thread, told to *listener* only (if it is registered), without an
    NVTX range of gpuscope's; return its path. *owner* closes it with :func:`pop_for`; an owner whose ``stale``
    attribute is true is dropped from the stacks at the next range operation of its thread."""
    return _push(owner, name, (listener,))


def pop_for(owner) -> None:
    """Close the range *owner* opened with :func:`push_for` (as a gpuscope range's exit does).

    Raises
    ------
    UnbalancedRangeError
        It is not open on the calling thread, or inner ranges were still open (they were closed with it).
    """
    _pop(owner)


def discard(owner) -> bool:
    """Take *owner*'s range off the calling thread's stack, telling no listener; whether it was there."""
    stack = _stack()
    for i in builtins.range(len(stack) - 1, -1, -1):
        if stack[i][1] is owner:
            del stack[i]
            return True
    return False


def _pop(owner) -> None:
    stack = _stack()
    if stack and stack[-1][1] is owner:
        if stack[-1][2] or _stamp_logs:
            _pop_entry(stack)
        elif stack.pop()[3] and _DOMAIN is not None:  # nothing to tell: _pop_entry's first branch, inlined
            _emit(False)
        return
    depth = next((i for i in reversed(builtins.range(len(stack))) if stack[i][1] is owner), None)
    if depth is None:
        raise UnbalancedRangeError(
            f"{owner!r} was exited on a thread where it is not open "
            f"(open here: {current_path()!r}). Enter and exit a range on the same thread, with `with` or as a "
            "decorator."
        )
    inner = [entry[0] for entry in stack[depth + 1 :]]
    while len(stack) > depth:  # close the inner ones too, so the stack stays consistent
        _pop_entry(stack)
    raise UnbalancedRangeError(
        f"{owner!r} was exited while inner ranges {inner} were still open; they were closed "
        "with it. Exit ranges in the reverse order of entering them (use `with` blocks)."
    )


#: gpuscope.replay, handed over by the session module when it loads (this module stays below it: sampling and
#: sessions both import it). Until then no session can be open, and replay would just call the function.
_replay = None


def set_replay(replay) -> None:
    """Called once by :mod:`gpuscope._range_profiling.session` with its :func:`replay`."""
    global _replay
    _replay = replay


class Range:
    """A named region of code: ``with gpuscope.range("step"):`` or ``@gpuscope.range("step")``.

    Parameters
    ----------
    name : str or callable
        The range's name, one path component (no "/"; nest ranges to build paths). Used bare as a decorator
        (``@gpuscope.range``) the function's ``__qualname__`` is the name.
    replay : bool
        As a decorator only: run each call of the function through :func:`gpuscope.replay`, once per pass of
        the active session, restoring device memory between passes. Use it for re-runnable functions whose
        metric set needs more than one pass.

    Raises
    ------
    TypeError
        If *name* is not a string.
    ValueError
        If *name* is empty or contains "/".
    UnbalancedRangeError
        On exit, if the range is not the innermost open range of the calling thread.

    Examples
    --------
    >>> with gpuscope.range("step"):
    ...     with gpuscope.range("fwd"):      # path "step/fwd"
    ...         kernel[grid, block](x)
    """

    __slots__ = ("name", "replay", "__weakref__")

    def __new__(cls, name="", *, replay: bool = False):
        # validated here, with no __init__: one Python call less for every range a loop enters
        if name.__class__ is not str:
            if callable(name):  # bare decorator: @gpuscope.range
                return cls(name.__qualname__, replay=replay)(name)
            if not isinstance(name, str):
                raise TypeError(f"a range name must be a str, not {type(name).__name__} ({name!r})")
        if not name or "/" in name or "\0" in name:
            raise ValueError(
                f"invalid range name {name!r}: use a non-empty name without '/' or NUL characters; nest ranges "
                "to make paths such as 'step/fwd'"
            )
        self = object.__new__(cls)
        self.name = name
        self.replay = True if replay else False
        return self

    def __repr__(self):
        return f"gpuscope.range({self.name!r})"

    def __enter__(self):
        _push(self, self.name)
        return self

    def __exit__(self, exc_type, exc, tb):
        _pop(self)
        return False

    def __call__(self, fn):
        if not callable(fn):
            raise TypeError(f"gpuscope.range({self.name!r}) decorates callables, not {type(fn).__name__}")
        if self.replay:

            @functools.wraps(fn)
            def replayed(*args, **kwargs):
                if _replay is None:  # the session module never loaded: no session is open, nothing to replay
                    return fn(*args, **kwargs)
                return _replay(fn, *args, name=self.name, **kwargs)

            return replayed

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            _push(self, self.name)
            try:
                return fn(*args, **kwargs)
            finally:
                _pop(self)

        return wrapper


# The public name. Defined last: below this line the module's ``range`` is gpuscope.range, not the builtin.
range = Range  # noqa: A001
