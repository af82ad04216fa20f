"""Teardown that Ctrl-C cannot cut short (used by PM sampling's start, stop and pipeline set-up)."""

from __future__ import annotations

import threading

__all__ = ["run_shielded"]


def run_shielded(fn, *args):
    """Run *fn* to its end even if Ctrl-C (or another signal handler's exception) arrives meanwhile.

    *fn* runs in a helper thread, which Python never interrupts with signals; this thread waits for it, catching
    ``KeyboardInterrupt``, and re-raises the first one once *fn* is done (an exception from *fn* wins). Teardown
    made this way cannot be cut short: the sampler is always unregistered and PM sampling always disabled.
    """
    outcome: list = [None, None]
    finished = threading.Event()

    def body():
        try:
            outcome[0] = fn(*args)
        except BaseException as exc:  # handed to the caller
            outcome[1] = exc
        finally:
            finished.set()

    helper = threading.Thread(target=body, name="gpuscope-teardown")
    interrupted = None
    try:
        helper.start()  # a signal may arrive while start() waits for the thread to run
    except BaseException as exc:
        interrupted = exc
    waiting = True
    while waiting:  # every bytecode of the wait sits inside the try: a signal can land between any two
        try:  # not Thread.join: on Python 3.11 an interrupted join marks a running thread as stopped
            finished.wait()
            helper.join()  # finished is set: the thread is about to end, a join cannot block
            waiting = False
        except BaseException as exc:  # KeyboardInterrupt, or an exception from a signal handler
            interrupted = interrupted or exc  # and wait again: returns at once if the thread is done
    if outcome[1] is not None:
        raise outcome[1]
    if interrupted is not None:
        raise interrupted
    return outcome[0]
