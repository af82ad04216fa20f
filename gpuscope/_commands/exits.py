"""Exit statuses of the ``gpuscope`` command (docs/errors.md), and the one each error that reaches it stands for.

0 ok, 1 no GPU or driver, 2 CUPTI missing or unusable, 3 counters unreadable, profiling unsupported or the GPU busy,
4 bad input, 5 a file cannot be read or written or is not gpuscope's, 6 nothing was profiled, 7 ``compare
--fail-on`` found a difference beyond noise, 130 interrupted, 141 output closed early (``| head``).
"""

from __future__ import annotations

from gpuscope.errors import (
    CuptiNotFoundError,
    CuptiNotSupportedError,
    CuptiPermissionError,
    NoGpuError,
    NotGpuscopeDataError,
    ProfilerBusyError,
)

EXIT_OK, EXIT_NO_GPU, EXIT_NO_CUPTI, EXIT_NO_COUNTERS, EXIT_USAGE = 0, 1, 2, 3, 4
EXIT_FILE, EXIT_NOTHING_PROFILED, EXIT_CHANGED, EXIT_INTERRUPTED, EXIT_BROKEN_PIPE = 5, 6, 7, 130, 141


def exit_status(exc: BaseException) -> int:
    """The documented exit status for an error that reached the command line (docs/errors.md)."""
    if isinstance(exc, CuptiNotFoundError):
        return EXIT_NO_CUPTI
    if isinstance(exc, NoGpuError):
        return EXIT_NO_GPU
    if isinstance(exc, (CuptiPermissionError, ProfilerBusyError, CuptiNotSupportedError)):
        return EXIT_NO_COUNTERS
    if isinstance(exc, (NotGpuscopeDataError, OSError)):
        return EXIT_FILE
    return EXIT_USAGE


#: ``GPUSCOPE_QUICK_EXIT=0`` makes ``gpuscope run`` exit as python does, tearing CUPTI and the driver down.
QUICK_EXIT_ENV = "GPUSCOPE_QUICK_EXIT"


def quick_exit(code: int) -> None:
    """End the process after ``gpuscope run`` without the teardown the OS does anyway, where that loses nothing.

    Python's exit would release what gpuscope keeps (``cuptiRangeProfilerDisable``: 13 ms to 0.5 s), collect every
    module, and run CUPTI's and the driver's own teardown in the process (0.8 s of a 3-launch run on the H100,
    docs/measurements.md); the process's end frees the GPU's contexts, memory and counters all the same. Here: the
    ``atexit`` handlers of the script and its libraries run (gpuscope's release of what it keeps is left out), every
    file object still open for writing is flushed, then ``os._exit``. Nothing is skipped while a thread other than
    daemons is alive (Python would wait for it), or with ``GPUSCOPE_QUICK_EXIT=0``: then it returns and the caller
    exits as usual.
    """
    import atexit
    import gc
    import io
    import os
    import sys
    import threading

    if os.environ.get(QUICK_EXIT_ENV, "").strip().lower() in ("0", "off", "no", "false"):
        return
    if any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread()):
        return
    from gpuscope._gpu import keep as _keep

    atexit.unregister(_keep._at_exit)
    atexit._run_exitfuncs()
    for obj in gc.get_objects():  # files the script left open: their buffers, which Python's exit would flush
        try:  # isinstance itself raises on a weak proxy whose object is gone
            if isinstance(obj, io.IOBase) and not obj.closed and obj.writable():
                obj.flush()
        except Exception:  # noqa: BLE001  a file that cannot be flushed now could not be at exit either
            pass
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001  a closed pipe: nothing more can be said
            pass
    os._exit(code)
