"""What profiling sessions keep between them in a process: the enabled range profiler or PM sampler, and when it goes.

Measured on an H100 with CUPTI 13.0 (``probes/probe_session_keep.py``, docs/measurements.md):

* the first ``cuptiRangeProfilerStart`` after ``cuptiRangeProfilerEnable`` costs 150-220 ms with a 16-range
  counter-data image, 1.3 s with 1,024 ranges and 4.6 s with 4,096, and ``Disable`` 13 ms to 0.5 s the same way;
* on a profiler kept enabled with the same config and image, a whole one-range session (re-initialised image,
  Start, range, Stop, decode, evaluate) costs 4.5 ms;
* ``SetConfig`` with *another* config on a profiler that has already collected makes the next ``Start`` fail
  (``CUPTI_ERROR_UNKNOWN``) and a later session crash; re-enabling with a counter-data image made by an earlier
  profiler object crashes too;
* a range profiler kept enabled makes PM sampling fail (``HARDWARE_BUSY``) and PC sampling deliver no records.

So a session that ends cleanly hands its profiler, config and counter-data image here (:func:`keep`); the next
session on the same device and context with exactly the same configuration takes them back (:func:`take`), and
anything else releases them first. A release may be under way on another thread (the idle timer's or the
rendezvous listener's: a ``Disable`` takes up to 0.5 s); :func:`take`, :func:`release` and :func:`detach_cupti`
wait for it, so nothing enables a profiler, PC sampling or a detach beside one still being disabled. A release
tries every step (disable, ``cuptiProfilerDeInitialize``, the context) whatever fails before: a half-released
profiler would block every later detach. PM sampling is kept the same way (measured: ``SetConfig`` costs 80-290 ms
with a 32-512 MB hardware buffer and the image pool 0.5 s to initialise, while Start/Stop on a kept sampler costs
under 1 ms and 36 ms): its sampler (:class:`gpuscope._pm_sampling.sampler.SamplingObject`), configuration and
initialised image pool, and, evaluating in worker processes, the workers and the shared memory of that pool, all in
one :class:`Kept` and released together (workers stopped, disable, then the images); a PM sampler whose worker died
since its session is not taken back but released, and the session starts afresh. PM and PC sampling call
:func:`release` before they enable; so do process exit, a forked child (which forgets, never touches, its
parent's: it frees none of its images and only closes its copies of the workers' connections), and
:func:`gpuscope.release`.

What is kept never blocks another process: while this process holds a GPU's counters (a session open, from
:func:`session_open` to :func:`session_closed`, or something kept) it listens on the GPU's rendezvous
(:mod:`gpuscope._gpu.rendezvous`), and another gpuscope process of the same user that needs them asks; what is kept
is given back from the listener's thread (:func:`answer`), never while a session is open. A session that finds the
counters busy asks the holders and tries again once (:func:`retry_when_busy`). The listener ends when the process
holds nothing of the GPU's any more (timer, :func:`release`, exit; a forked child closes its copy of the socket).

Another CUPTI client of the process may call ``cuptiFinalize`` (torch.profiler's Kineto does at the end of a profile
in some versions): CUPTI then forgets what is kept here. gpuscope holds CUPTI's callback subscriber while a session is
open (:func:`gpuscope.cupti.profiler.initialize`), and lets go of it when only kept things are left
(:func:`gpuscope.cupti.profiler.lend_witness`): held longer, it kept torch.profiler from recording. While a witness
is held, :func:`take`, the releases and the next session's ``profiler.initialize`` ask CUPTI whether it still knows
it (:func:`gpuscope.cupti.callbacks.known`), and where CUPTI forgot it, everything kept is dropped without a CUPTI
call (:func:`_after_cupti_forgot`). A finalize while nothing is open is found when CUPTI refuses the kept profiler
at the next session's first Start (``Profiler._start_first``: dropped, set up afresh, said once). Where another
client holds the subscriber, it could finalize CUPTI unseen, so nothing is kept.

PC sampling starts from a CUPTI that has forgotten the process (:func:`detach_cupti`, ``cuptiFinalize``; off with
``GPUSCOPE_PC_DETACH=0``): CUPTI maps a kernel for PC sampling only if the kernel never ran while CUPTI was attached
outside a PC block, so a kernel profiled by range profiling earlier got no samples. Detaching drops everything
kept here first.

What is kept, and how one kept profiler is let go of, is :mod:`gpuscope._gpu.kept`'s; the host objects per chip and
metric list that sessions share, :mod:`gpuscope._gpu.hosts`'.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
import warnings

from gpuscope._gpu import rendezvous as _rendezvous
from gpuscope._gpu.hosts import HostSetup, host_for  # noqa: F401 (called through keep)
from gpuscope._gpu.hosts import drop as _drop_hosts
from gpuscope._gpu.imports import import_xarray_soon, imports_done, results_elsewhere  # noqa: F401 (called through keep)
from gpuscope._gpu.kept import Kept, abandon, forget, let_go
from gpuscope._util import env as _env
from gpuscope._util import launchers as _launchers
from gpuscope._util.shield import run_shielded
from gpuscope.cupti import _api
from gpuscope.errors import GpuscopeWarning, ProfilerBusyError

__all__ = ["Kept", "HostSetup", "take", "reuse", "keep", "release", "kept_devices", "host_for", "enabled", "seconds",
           "session_open", "session_closed", "answer", "retry_when_busy", "ask_holders", "detach_cupti", "DETACH_ENV"]

#: Seconds a range profiler is kept after its session (GPUSCOPE_KEEP; 0: never kept, "inf": until exit).
ENV = "GPUSCOPE_KEEP"
#: The default: the counters are the GPU's, not the process's, so a kept profiler also stops *other processes*
#: from profiling this GPU (HARDWARE_BUSY); kept briefly, it serves sessions that follow one another. Where a
#: launcher says several processes run on this host (torchrun, MPI, Slurm), nothing is kept unless GPUSCOPE_KEEP
#: says.
DEFAULT_SECONDS = 10.0

_lock = threading.Lock()
_given_back = threading.Condition(_lock)  # notified when a release under way ends
_kept: dict[int, Kept] = {}
_under_way: list[tuple[int, int]] = []  # (device, thread) of each release taken out of _kept and not yet ended
#: How long :func:`take`, :func:`release` and :func:`detach_cupti` wait for a release under way on another thread.
RELEASE_WAIT_S = 60.0
_warned: set[str] = set()  # GPUSCOPE_KEEP values already warned about: once each, not at every session
_sessions: dict[int, list[str]] = {}  # device -> what each session open on it is ("range profiling", "PM sampling")
_listeners: dict[int, _rendezvous.Listener] = {}  # device -> the rendezvous listener while its counters are held
_listen_lock = threading.Lock()  # taken before _lock, never after it
#: CUPTI_ERROR_HARDWARE_BUSY: another profiler holds the GPU's counters.
HARDWARE_BUSY = 26
#: The kinds of session, as :func:`session_open` is told and other processes are answered.
RANGE_SESSION, PM_SESSION = "range profiling", "PM sampling"


def seconds() -> float:
    """How long a range profiler is kept after its session: ``GPUSCOPE_KEEP`` seconds (``inf``, or more than a
    timer can wait: until exit or :func:`release`), else 10 s, or 0 (never) when a launcher says several processes
    run on this host (:func:`gpuscope._util.launchers.processes_on_this_host`). A value that is not one of those
    (``nan``, negative, text) is warned about once and the default used."""
    text = os.environ.get(ENV, "").strip().lower()
    if not text:
        return 0.0 if _launchers.processes_on_this_host() > 1 else DEFAULT_SECONDS
    if text in ("false", "no", "off"):
        return 0.0
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value >= 0:  # nan, negative or not a number
        with _lock:
            first = text not in _warned
            _warned.add(text)
        if first:  # attributed to this line: the caller may be a timer or teardown thread, with no user frame
            warnings.warn(f"{ENV}={text!r} is not a number of seconds: use a number from 0, inf (keep until exit) "
                          f"or off (never keep). Keeping for {DEFAULT_SECONDS:g} s.", GpuscopeWarning, stacklevel=1)
        return DEFAULT_SECONDS
    return float("inf") if value >= threading.TIMEOUT_MAX else value  # a longer Timer dies of OverflowError


def enabled() -> bool:
    """Whether sessions keep their range profiler for the next one (:func:`seconds` is not 0)."""
    return seconds() > 0


def take(device: int, key: tuple, context_id: int) -> Kept | None:
    """The kept profiler of *device* if its configuration is *key* on the same live context and it can still serve
    (a PM sampler's evaluation workers all alive: its ``usable()``), else None (whatever was kept is released first:
    CUPTI does not let an enabled profiler change its configuration). Returns only once no release is under way on
    *device*: a profiler being disabled there must not meet one being enabled."""
    from gpuscope.cupti import callbacks as _callbacks

    with _lock:
        kept = _kept.pop(device, None)
        same = kept is not None and kept.key == key and kept.context_id == context_id
        if kept is not None and not same:
            _under_way.append((device, threading.get_ident()))
    if kept is not None and kept.timer is not None:
        kept.timer.cancel()
    usable = getattr(kept.profiler, "usable", None) if same else None
    if usable is not None and not usable():  # outside the lock: it looks at processes
        same = False
        with _lock:
            _under_way.append((device, threading.get_ident()))
    if kept is not None and not same:
        _give_back(device, kept, alive=kept.context_id == context_id)
    _wait({device})
    if kept is not None:
        _listen(device)
    if same and not _callbacks.held(kept.witness):  # another client finalized CUPTI: the profiler is gone
        forget(kept)
        return None
    return kept if same else None


def reuse(device: int, key: tuple, context_id: int) -> Kept | None:
    """:func:`take`, for a session that holds its own context and profiler initialisation: the kept ones are
    released, the profiler and images are the session's. None when keeping is off."""
    if not enabled():
        return None
    kept = take(device, key, context_id)
    if kept is not None:
        from gpuscope.cupti import profiler

        try:
            kept.context.close()
        finally:
            profiler.deinitialize(kept=True)
    return kept


def keep(device: int, kept: Kept) -> None:
    """Hold *kept* for the next session on *device* (one per device; an older one is released) for :func:`seconds`.

    Released at once instead where another CUPTI client of the process holds CUPTI's subscriber
    (:func:`gpuscope.cupti.profiler.lend_witness` is None): it could finalize CUPTI without gpuscope seeing it."""
    from gpuscope.cupti import profiler

    kept.witness = profiler.lend_witness()  # the subscriber is given back: torch.profiler may take it
    if kept.witness is None:
        with _lock:
            _under_way.append((device, threading.get_ident()))
        _give_back(device, kept)
        return
    idle = seconds()
    if idle < float("inf"):
        kept.timer = threading.Timer(idle, _expire, args=(device, kept))
        kept.timer.name = "gpuscope-keep-timer"
        kept.timer.daemon = True
    with _lock:
        old = _kept.pop(device, None)
        if old is not None:
            _under_way.append((device, threading.get_ident()))
        _kept[device] = kept
    if kept.timer is not None:
        kept.timer.start()
    if old is not None:
        _give_back(device, old)
    _listen(device)


def _expire(device: int, kept: Kept) -> None:
    with _lock:
        if _kept.get(device) is not kept:  # taken, or replaced, since this timer started
            return
        del _kept[device]
        _under_way.append((device, threading.get_ident()))
    _give_back(device, kept)
    _listen(device)


def release(device: int | None = None) -> int:
    """Give back the GPU counters that gpuscope keeps between range-profiling sessions.

    A range-profiling session that ends cleanly leaves its CUPTI range profiler enabled, so that the next session
    with the same metrics and mode starts in milliseconds instead of 0.2-1.5 s. While it is kept, the counters are
    held: another profiler in this process (a CUPTI client other than gpuscope) cannot take them. gpuscope releases
    them itself after ``GPUSCOPE_KEEP`` seconds without a session (default 10; 0 turns keeping off, ``inf`` keeps
    until exit; where torchrun, MPI or Slurm started several processes on this host nothing is kept unless it is
    set), before PM and PC sampling, when a session needs another configuration, at process exit, and when a
    gpuscope process of the same user asks for them (:mod:`gpuscope._gpu.rendezvous`). The counters are the GPU's:
    while they are kept, other tools (Nsight Compute, DCGM) and other users' processes cannot profile this GPU.
    Call this before handing the GPU to another tool.

    Parameters
    ----------
    device : int, optional
        The device whose profiler to release; None (default): every device.

    Returns
    -------
    int
        How many kept profilers were released, counting a release already under way on another thread (the idle
        timer's), which this call waits for.
    """
    gone = _pop(device)
    for d, kept in gone:
        _give_back(d, kept)
        _listen(d)
    return len(gone) + _wait(None if device is None else {device})


def _pop(device: int | None) -> list[tuple[int, Kept]]:
    """Take what is kept on *device* (None: every device) out of the keeper, as releases under way."""
    with _lock:
        devices = list(_kept) if device is None else [device]
        gone = [(d, _kept.pop(d)) for d in devices if d in _kept]
        _under_way.extend((d, threading.get_ident()) for d, _ in gone)
        return gone


def _give_back(device: int, kept: Kept, alive: bool = True, quiet: bool = False) -> None:
    """Release *kept*, taken out of the keeper as a release under way on *device*, and say it ended. On the main
    thread Ctrl-C cannot cut it short (:func:`~gpuscope._util.shield.run_shielded`; the interrupt is raised once it
    is done): half a release would leave the counters held, or a PM sampler's workers running. Not at exit (*quiet*),
    where no thread may start."""
    try:
        if threading.current_thread() is threading.main_thread() and not quiet:
            run_shielded(let_go, kept, alive, quiet)
        else:
            let_go(kept, alive=alive, quiet=quiet)
    finally:
        with _given_back:
            _under_way.remove((device, threading.get_ident()))
            _given_back.notify_all()


def _wait(devices: set | None) -> int:
    """Wait (at most :data:`RELEASE_WAIT_S`) until no release is under way on *devices* (None: any) on another
    thread; how many were under way."""
    me = threading.get_ident()

    def others():
        return [d for d, thread in _under_way if thread != me and (devices is None or d in devices)]

    deadline = time.monotonic() + RELEASE_WAIT_S
    with _given_back:
        count = len(others())
        while others() and deadline > time.monotonic():
            _given_back.wait(deadline - time.monotonic())
    return count


def _releases_not_ended() -> list[int]:
    """Devices whose kept profiler is still being released on another thread."""
    me = threading.get_ident()
    with _lock:
        return sorted({d for d, thread in _under_way if thread != me})


def kept_devices() -> list[int]:
    """Devices on which a range profiler is kept now."""
    with _lock:
        return sorted(_kept)


def _after_cupti_forgot() -> None:
    """After ``cuptiFinalize`` (gpuscope's detach, or another client's: :func:`gpuscope.cupti._api.
    finalized_elsewhere`): drop what is kept without a CUPTI call, as CUPTI forgot it. Host objects stay: the host
    API needs no GPU and no attached CUPTI (gpuscope's own detach drops them all the same, before it finalizes)."""
    with _lock:
        gone = list(_kept.items())
        _kept.clear()
    for _, kept in gone:
        forget(kept)
    for device, _ in gone:
        _listen(device)


def session_open(device: int, what: str) -> None:
    """A session (*what*: :data:`RANGE_SESSION`, :data:`PM_SESSION`) now holds *device*'s counters: this process
    listens on the GPU's rendezvous, answers that a session is open and gives nothing back until
    :func:`session_closed`."""
    with _lock:
        _sessions.setdefault(device, []).append(what)
    _listen(device)


def session_closed(device: int, what: str) -> None:
    """The session of :func:`session_open` has closed (after it handed what it keeps to :func:`keep`)."""
    with _lock:
        open_ = _sessions.get(device, [])
        if what in open_:
            open_.remove(what)
        if not open_:
            _sessions.pop(device, None)
    _listen(device)


def answer(device: int) -> str:
    """What this process answers another gpuscope process that asks for *device*'s counters (on the rendezvous
    listener's thread): ``busy: ...`` while a session is open, else ``released (...)`` once what is kept is given
    back, or ``nothing kept``."""
    with _lock:
        open_ = list(_sessions.get(device, ()))
        kept = None if open_ else _kept.pop(device, None)
        if kept is not None:
            _under_way.append((device, threading.get_ident()))
    if open_:
        return f"{_rendezvous.BUSY}: a session is open ({', '.join(open_)})"
    if kept is None:
        return _rendezvous.NOTHING_KEPT
    _give_back(device, kept)
    _listen(device)
    return f"{_rendezvous.RELEASED} (the kept {kept.kind})"


def _listen(device: int) -> None:
    """Listen on *device*'s rendezvous while this process holds its counters (a session open or something kept);
    stop when it holds nothing. Call it after every change of either, never holding :data:`_lock`."""
    with _listen_lock:
        with _lock:
            wanted = bool(_sessions.get(device)) or device in _kept
        listener = _listeners.get(device)
        if wanted == (listener is not None):
            return
        if wanted:
            listener = _start_listener(device)
            if listener is not None:
                _listeners[device] = listener
            return
        del _listeners[device]
    listener.close()  # outside the lock: its thread may be giving back what was kept, and call here when done


def _start_listener(device: int) -> _rendezvous.Listener | None:
    """A listener for *device*, or None (warned about once): the session goes on, other processes only cannot ask."""
    try:
        return _rendezvous.Listener(_rendezvous.gpu_id(device), lambda: answer(device))
    except Exception as exc:
        text = f"rendezvous: {type(exc).__name__}: {exc}"
        with _lock:
            first = text not in _warned
            _warned.add(text)
        if first:
            warnings.warn(f"gpuscope: other processes cannot ask this one to give device {device}'s counters back "
                          f"({exc}); they get HARDWARE_BUSY while it keeps them ({ENV}=0 keeps nothing).",
                          GpuscopeWarning, stacklevel=3)
        return None


def retry_when_busy(device: int, call, what: str = ""):
    """``call()``, which starts using *device*'s counters; where CUPTI answers ``HARDWARE_BUSY``, ask this user's
    gpuscope processes that hold them to give them back (:func:`gpuscope._gpu.rendezvous.ask`, at most
    ``ASK_TIMEOUT_S``) and, where one did, call once more. *what* is the calling session's kind, left out of the
    sessions this process has open on *device*.

    Raises
    ------
    ProfilerBusyError
        Still busy: the message names what holds the counters (a gpuscope process, and whether a session is open
        there; this process's own session; or not gpuscope), ``holders`` what each process asked answered.
    """
    try:
        return call()
    except ProfilerBusyError as exc:
        if exc.status != HARDWARE_BUSY:
            raise
        error = exc
    gpu = _rendezvous.gpu_id(device)
    answers = _rendezvous.ask(gpu)
    if any(a.state == _rendezvous.RELEASED for a in answers):
        try:
            return call()
        except ProfilerBusyError as exc:
            if exc.status != HARDWARE_BUSY:
                raise
            error = exc
    with _lock:
        here = list(_sessions.get(device, ()))
    if what in here:
        here.remove(what)
    hint = f"The counters of device {device} ({gpu}) are busy: {_rendezvous.describe(answers, here=', '.join(here))}"
    raise ProfilerBusyError(error.status, error.func, error.cupti_message, hint,
                            [(a.pid, a.state) for a in answers]) from None


def ask_holders(device: int) -> list:
    """Ask this user's gpuscope processes that hold *device*'s counters to give them back, before a session whose
    availability query came from the cache. That query is what fails ``HARDWARE_BUSY`` (and is retried,
    :func:`retry_when_busy`) when another process keeps a profiler or a PM sampler; answered from the cache it asks
    nothing, and the new profiler would be refused later, at its first ``cuptiRangeProfilerStart``, where no retry
    can wait for an answer. Reads the listening holders first (``/proc/net/unix``) and asks only where there are
    some. Returns their answers."""
    gpu = _rendezvous.gpu_id(device)
    if not _rendezvous.holders(gpu):
        return []
    return _rendezvous.ask(gpu)


#: ``GPUSCOPE_PC_DETACH=0`` keeps CUPTI attached when PC sampling starts (the detach is on by default).
DETACH_ENV = "GPUSCOPE_PC_DETACH"


def detach_cupti() -> str:
    """Make CUPTI forget this process before PC sampling starts (``cuptiFinalize``), so that every kernel is
    mapped for PC sampling whatever ran before: CUPTI maps a kernel only if it did not run while CUPTI was
    attached outside a PC block (``probes/probe_pc_after_ranges.py``: a kernel profiled by a range session
    first got 0 of 190,549 samples; after a detach, all of them). Costs 2-28 ms, plus the host objects the next
    range session builds again.

    On unless ``GPUSCOPE_PC_DETACH=0`` (or off, no, false: :func:`gpuscope._util.env.flag`). CUPTI keeps the
    addresses it was given (PC sampling's data buffer, the activity buffers, host objects) and may use them at the
    finalize: those are never freed, or dropped first. What gpuscope can give back is given back first: kept
    profilers and samplers (a release under way on another thread is waited for), host objects, the callback
    subscription, the module watcher (resumed after). Nothing happens if CUPTI is not attached, if another CUPTI
    tool is injected (``CUDA_INJECTION64_PATH``) or another client of the process holds CUPTI's subscriber
    (:func:`gpuscope.cupti.callbacks.other_client`; torch.profiler's Kineto keeps it from its first profile on):
    their state would be lost; or while gpuscope uses CUPTI for something it cannot give back (an open session, a
    launch recorder, kernel activity records).

    ``cuptiFinalize`` is called where CUPTI's guide says it is safe, in CUPTI's callback at the exit of a driver call
    (``cuCtxGetCurrent``) that this thread makes (:func:`gpuscope.cupti.callbacks.finalize_at_api_exit`): not while
    another thread is in the middle of a CUDA or CUPTI call. Returns ``"detached"``, ``"not attached"`` or why it
    did not detach.
    """
    from gpuscope._gpu import modules as _modules

    if not _api.attached():
        return "not attached"
    if not _env.flag(DETACH_ENV, True):
        return f"off ({DETACH_ENV}=0)"
    if os.environ.get("CUDA_INJECTION64_PATH"):
        return "another CUPTI tool is injected (CUDA_INJECTION64_PATH)"
    from gpuscope.cupti import callbacks as _callbacks

    other = _callbacks.other_client()  # before anything is given back: a refusal then changes nothing
    if other is not None:
        return _callbacks.other_client_refusal(other)

    watching = _modules.pause()
    try:
        for _ in range(2):  # a session closing on another thread may keep its profiler between release and detach
            release()
            try:
                _api.detach(prepare=_drop_hosts, call_site=_callbacks.finalize_at_api_exit)
                return "detached"
            except _callbacks.NotFinalized as exc:
                return str(exc)
            except RuntimeError as exc:
                refused = exc
            if not kept_devices():
                break
    finally:
        if watching:
            _modules.resume()
    late = _releases_not_ended()
    if late:
        return (f"the kept profiler of device(s) {late} was still being released after {RELEASE_WAIT_S:g} s "
                "(cuptiRangeProfilerDisable did not return)")
    return f"gpuscope is using CUPTI: {refused}"


def _forget_in_child() -> None:
    """After ``os.fork``: the parent's profiler is not the child's to disable, nor its import thread or rendezvous
    listener the child's (its copy of the listener's socket is closed: the name ends with the parent), nor a kept PM
    sampler's evaluation workers (the child closes only its copies of their connections, and frees no image)."""
    global _lock, _given_back, _listen_lock
    _lock, _listen_lock = threading.Lock(), threading.Lock()
    _given_back = threading.Condition(_lock)
    _under_way.clear()  # the parent's threads' releases
    for listener in _listeners.values():
        listener.forget()
    _listeners.clear()
    _sessions.clear()
    for kept in _kept.values():
        abandon(kept.profiler)
        kept.timer = None  # the timer thread is the parent's
    _kept.clear()


def _at_exit() -> None:
    """At interpreter exit the context may already be gone (the process's exit frees everything anyway): quietly.
    The rendezvous listeners stop."""
    for device, kept in _pop(None):
        _give_back(device, kept, quiet=True)
    with _listen_lock:
        listeners = list(_listeners.values())
        _listeners.clear()
    for listener in listeners:
        listener.close()


os.register_at_fork(after_in_child=_forget_in_child)
atexit.register(_at_exit)
_api.on_detach(lambda: None, _after_cupti_forgot)
