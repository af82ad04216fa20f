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
