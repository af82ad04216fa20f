"""The gpuscope error family.

Every error gpuscope raises derives from :class:`GpuscopeError`. Errors that stand for a familiar kind of
failure also derive from the matching builtin, so ``except PermissionError`` or ``except ValueError`` catches
them without knowing gpuscope. Errors that come from a CUPTI call are :class:`CuptiError` and carry the
failing function, CUPTI's status code and CUPTI's own message.

Policy: a call that fails leaves nothing half made (partial setup is rolled back); trouble while cleaning up
becomes a :class:`GpuscopeWarning`, never an exception that hides the original one.
"""

from __future__ import annotations

__all__ = [
    "GpuscopeError",
    "GpuscopeWarning",
    "CuptiNotFoundError",
    "CuptiError",
    "CuptiPermissionError",
    "CuptiValueError",
    "CuptiMemoryError",
    "CuptiNotSupportedError",
    "ProfilerBusyError",
    "NoGpuError",
    "UnknownMetricError",
    "UnsupportedChipError",
    "cupti_error",
    "MissingMetricsError",
    "UnbalancedRangeError",
    "MultiPassRangeError",
    "SessionConflictError",
    "NvtxUnavailableError",
    "NotSinglePassError",
    "SamplerBusyError",
    "NotGpuscopeDataError",
    "ImageError",
    "CounterDataImageError",
    "RankDetectionError",
    "RankMergeError",
]

COUNTER_PERMISSION_HELP = (
    "This user may not read GPU performance counters. Ask an administrator to allow it "
    "(load the nvidia module with NVreg_RestrictProfilingToAdminUsers=0, e.g. a line "
    "'options nvidia NVreg_RestrictProfilingToAdminUsers=0' in /etc/modprobe.d/ and a reboot), "
    "or run as root. See https://developer.nvidia.com/ERR_NVGPUCTRPERM"
)

BUSY_HELP = (
    "Another profiler holds the GPU's counters: Nsight Compute or Nsight Systems attached to this process, "
    "another CUPTI client, a second gpuscope session on the same device, or another process's gpuscope, which "
    "keeps its range profiler for GPUSCOPE_KEEP seconds (default 10) after its last session (gpuscope sessions of "
    "the same user ask for it back; gpuscope.release() there gives it back at once). Close it and try again."
)


def install_hint(extra: str) -> str:
    """How to install gpuscope with *extra* (``cu13``, ``offline``, ...): gpuscope is not on PyPI, so from a
    checkout or from a wheel built from one (docs/quickstart.md#install)."""
    return (f"pip install '.[{extra}]' in a gpuscope checkout, or pip install 'gpuscope-<version>-py3-none-any.whl"
            f"[{extra}]' with a wheel built from one (gpuscope is not on PyPI)")


class GpuscopeError(Exception):
    """Base class of every error gpuscope raises."""


class GpuscopeWarning(UserWarning):
    """Something went wrong that did not stop the work (cleanup trouble, lost samples, approximations)."""


class CuptiNotFoundError(GpuscopeError, ImportError):
    """libcupti could not be found or loaded, or it is older than gpuscope supports."""


class NoGpuError(GpuscopeError, RuntimeError):
    """No usable NVIDIA GPU or driver on this machine."""


class UnknownMetricError(GpuscopeError, ValueError):
    """A metric name that the chip does not know, or that is incomplete (a counter without a rollup)."""

    def __init__(self, message: str, name: str = "", suggestions: tuple[str, ...] = ()):
        super().__init__(message)
        self.name = name
        self.suggestions = tuple(suggestions)


class UnsupportedChipError(GpuscopeError, ValueError):
    """A chip name that the loaded CUPTI does not support."""


class CuptiError(GpuscopeError):
    """A CUPTI call returned an error status.

    Attributes
    ----------
    status : int
        The ``CUptiResult`` value.
    func : str
        The CUPTI function that failed.
    cupti_message : str
        CUPTI's own text for the status.
    """

    def __init__(self, status: int, func: str, cupti_message: str, hint: str = ""):
        self.status = int(status)
        self.func = func
        self.cupti_message = cupti_message
        self.hint = hint
        text = f"{func} failed: {cupti_message} (CUptiResult {self.status})"
        if hint:
            text += f". {hint}"
        super().__init__(text)

    def __reduce__(self):
        return (type(self), (self.status, self.func, self.cupti_message, self.hint))


class CuptiPermissionError(CuptiError, PermissionError):
    """The user may not read GPU performance counters (CUPTI_ERROR_INSUFFICIENT_PRIVILEGES)."""


class CuptiValueError(CuptiError, ValueError):
    """CUPTI rejected an argument: a bad metric name, chip name or parameter."""


class CuptiMemoryError(CuptiError, MemoryError):
    """CUPTI ran out of memory, or a counter-data buffer is full."""


class CuptiNotSupportedError(CuptiError, RuntimeError):
    """The operation is not supported on this device, driver or configuration."""


class ProfilerBusyError(CuptiError, RuntimeError):
    """The counters are in use by another profiler or session.

    Where CUPTI said ``HARDWARE_BUSY`` as a session started, gpuscope first asked the gpuscope processes of this
    user that hold this GPU's counters to give them back and tried again once (docs/reliability.md); the message
    then says who holds them.

    Attributes
    ----------
    holders : tuple of (int, str)
        Each gpuscope process that was asked: its process id and what it said (``"released"``, ``"busy"``: a
        session is open there, ``"no answer"``, ...). Empty where none was asked: then no gpuscope process of this
        user holds the counters.
    """

    def __init__(self, status: int, func: str, cupti_message: str, hint: str = "", holders=()):
        super().__init__(status, func, cupti_message, hint)
        self.holders = tuple((int(pid), str(state)) for pid, state in holders)

    def __reduce__(self):
        return (type(self), (self.status, self.func, self.cupti_message, self.hint, self.holders))


# CUptiResult values (cupti_result.h; values never change between versions).
_STATUS_CLASS = {
    1: CuptiValueError,  # INVALID_PARAMETER
    8: CuptiMemoryError,  # OUT_OF_MEMORY
    17: CuptiValueError,  # INVALID_METRIC_NAME
    26: ProfilerBusyError,  # HARDWARE_BUSY
    27: CuptiNotSupportedError,  # NOT_SUPPORTED
    35: CuptiPermissionError,  # INSUFFICIENT_PRIVILEGES
    36: ProfilerBusyError,  # OLD_PROFILER_API_INITIALIZED
    38: CuptiNotSupportedError,  # LEGACY_PROFILER_NOT_SUPPORTED
    39: ProfilerBusyError,  # MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED
    43: CuptiNotSupportedError,  # MIG_DEVICE_NOT_SUPPORTED
    44: CuptiNotSupportedError,  # SLI_DEVICE_NOT_SUPPORTED
    45: CuptiNotSupportedError,  # WSL_DEVICE_NOT_SUPPORTED
    46: CuptiValueError,  # INVALID_CHIP_NAME
}

_STATUS_HINT = {
    26: BUSY_HELP,
    35: COUNTER_PERMISSION_HELP,
    36: "The legacy CUPTI Profiling API is already in use in this process; only one profiling API at a time.",
    39: BUSY_HELP,
    43: "Profiling a MIG instance is not supported by this CUPTI/driver; profile the whole GPU.",
}


def cupti_error(status: int, func: str, cupti_message: str, hint: str = "") -> CuptiError:
    """Build the right :class:`CuptiError` subclass for a CUPTI status."""
    cls = _STATUS_CLASS.get(int(status), CuptiError)
    hint = hint or _STATUS_HINT.get(int(status), "")
    return cls(status, func, cupti_message, hint)


class MissingMetricsError(GpuscopeError, ValueError):
    """An analysis needs metrics that the Dataset does not hold.

    Attributes
    ----------
    missing : tuple of str
        The exact CUPTI metric names that are missing.
    """

    def __init__(self, message: str, missing: tuple[str, ...] = ()):
        super().__init__(message)
        self.missing = tuple(missing)

    def __reduce__(self):
        return (type(self), (str(self), self.missing))


class UnbalancedRangeError(GpuscopeError, RuntimeError):
    """A ``gpuscope.range`` was exited out of order, or on a thread where it is not open."""


class MultiPassRangeError(GpuscopeError, RuntimeError):
    """A range that runs once needs more passes than one run of it can collect."""


class SessionConflictError(GpuscopeError, RuntimeError):
    """A second gpuscope session was opened on a device that already has one, or a session was misused."""


class NvtxUnavailableError(GpuscopeError, RuntimeError):
    """NVTX ranges were asked for, but this process's NVTX calls cannot reach the CUPTI gpuscope uses
    (``NVTX_INJECTION64_PATH`` is not set, or names another tool's library)."""


class NotSinglePassError(GpuscopeError, ValueError):
    """A metric list that needs more than one pass where only one is possible (PM sampling).

    Attributes
    ----------
    passes : int
        Passes the whole list needs.
    drop : tuple of str
        Metrics that need more than one pass even on their own: they cannot be sampled at all.
    groups : tuple of tuple of str
        The other metrics split into lists that each fit in one pass (sample them in separate runs).
    """

    def __init__(self, message: str, passes: int = 0, drop=(), groups=()):
        super().__init__(message)
        self.passes = int(passes)
        self.drop = tuple(drop)
        self.groups = tuple(tuple(g) for g in groups)

    def __reduce__(self):
        return (type(self), (str(self), self.passes, self.drop, self.groups))


class SamplerBusyError(GpuscopeError, RuntimeError):
    """A PM sampler is already running on this device (one per device at a time)."""


class NotGpuscopeDataError(GpuscopeError, ValueError):
    """A file or Dataset that gpuscope did not write (no ``kind`` attribute, none of its dims)."""


class ImageError(GpuscopeError, ValueError):
    """A CUPTI image (counter availability, config, counter data) that CUPTI cannot read safely: not an image,
    truncated, corrupted, of another chip or kind. Checked before CUPTI is called: CUPTI itself would crash."""


class CounterDataImageError(ImageError):
    """A counter-data image that CUPTI cannot read safely (not an image, truncated, corrupted, of the other kind),
    or a sample/range index it does not hold. Checked before CUPTI is called: CUPTI itself would crash."""


class RankDetectionError(GpuscopeError, ValueError):
    """The launcher's environment variables (torchrun, Open MPI, MPICH/Intel MPI, Slurm) do not describe a rank:
    a variable is missing, not an integer, or out of range (a rank not below the world size)."""


class RankMergeError(GpuscopeError, ValueError):
    """Per-rank Datasets that cannot be combined into one: different kinds or chips, two files of the same rank,
    some files with a rank and some without, or no file at all."""
