"""Counter-data images checked before CUPTI reads them.

CUPTI trusts a counter-data image completely: the offsets in it say where to read, with no check against the size
passed. On CUPTI 13.1, ``cuptiPmSamplingGetCounterDataInfo`` on a truncated PM image, evaluating a truncated or
bit-flipped one or a sample index past the end, and ``cuptiProfilerHostGetRangeName`` on a PM image all crash the
process (SIGSEGV); evaluating sample 400 of an image holding 261 returns plausible numbers. The image format is not
documented, so it cannot be validated field by field. Instead:

* images that CUPTI itself sized and initialised in this process (gpuscope's own) are **trusted**
  (:func:`trust`), and cost nothing more than an index check;
* any other image (loaded from a file, built by hand) is first read by CUPTI in a **child process**, with the image
  placed before 1 GiB (at least four times its size) of unreadable address space so that any read past its end faults there, not here: its counts, every
  range name (range profiler) and, when the metrics are known, every sample or range evaluated. If the child
  crashes, hangs or CUPTI refuses the image, :class:`~gpuscope.errors.CounterDataImageError` is raised; otherwise
  the image's counts are cached (by content) and the image is trusted from then on. That costs one child process
  (about a second) per distinct image per process.

Indices are checked against the image's own counts before every evaluation: samples ``< numCompletedSamples``
(PM sampling), ranges ``< numTotalRanges`` (range profiler).
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import os
import subprocess
import sys
import threading
import weakref

import numpy as np

from ..errors import CounterDataImageError

__all__ = ["Kind", "ImageInfo", "trust", "is_trusted", "check", "check_indices", "MAGIC", "CHECK_TIMEOUT_S"]

#: The first bytes of every counter-data image (CUPTI 12.6-13.1, both kinds).
MAGIC = b"LOPDATA\x00"
#: The smallest image that can hold CUPTI's header.
MIN_BYTES = 64
#: Seconds the child process may take to read an image.
CHECK_TIMEOUT_S = 60.0


class Kind(str, enum.Enum):
    """Which CUPTI API made an image."""

    PM_SAMPLING = "pm_sampling"
    RANGE_PROFILER = "range_profiler"


@dataclasses.dataclass(frozen=True)
class ImageInfo:
    """What CUPTI reports about a checked image: *count* is the samples that can be evaluated (PM sampling:
    ``numCompletedSamples``) or the ranges held (range profiler: ``numTotalRanges``)."""

    kind: Kind
    count: int


_lock = threading.Lock()
_trusted: dict[tuple[int, int], Kind] = {}  # (address, size) -> kind, while the array lives
_checked: dict[tuple, ImageInfo] = {}  # (digest, kind, chip, metrics) -> info


def _key(image: np.ndarray) -> tuple[int, int]:
    return image.ctypes.data, image.size


def as_image(image, what: str = "counter_data") -> np.ndarray:
    """*image* if it is a C-contiguous uint8 numpy array with CUPTI's header, else raise."""
    if not (isinstance(image, np.ndarray) and image.dtype == np.uint8 and image.ndim == 1
            and image.flags.c_contiguous):
        raise CounterDataImageError(
            f"{what} must be a counter-data image: a 1-D C-contiguous numpy uint8 array; got "
            f"{type(image).__name__}{getattr(image, 'shape', '')} of {getattr(image, 'dtype', '?')}."
        )
    if image.size < MIN_BYTES or image[: len(MAGIC)].tobytes() != MAGIC:
        raise CounterDataImageError(
            f"{what} ({image.size} bytes) is not a CUPTI counter-data image (it does not start with CUPTI's "
            "header): pass the image as CUPTI wrote it, e.g. as saved with numpy.save."
        )
    return image


def trust(image: np.ndarray, kind: Kind) -> None:
    """Record that CUPTI sized and initialised *image* for *kind* in this process (until the array is freed)."""
    key = _key(image)
    with _lock:
        _trusted[key] = Kind(kind)
    weakref.finalize(image, _forget, key)


def _forget(key) -> None:
    with _lock:
        _trusted.pop(key, None)


def is_trusted(image: np.ndarray, kind: Kind) -> bool:
    with _lock:
        return _trusted.get(_key(image)) is Kind(kind)


def _raw_count(image: np.ndarray, kind: Kind) -> int:
    """The image's count straight from CUPTI (only for trusted images)."""
    if kind is Kind.PM_SAMPLING:
        from . import pm_sampling

        return pm_sampling._info(image).completed
    from . import range_profiler

    return range_profiler._num_ranges_raw(image)


def check(image, kind: Kind, *, chip: str | None = None, metrics=None, what: str = "counter_data") -> ImageInfo:
    """Make sure CUPTI can read *image* as a *kind* image without crashing; return its counts.

    Parameters
    ----------
    image : numpy.ndarray
        The counter-data image.
    kind : Kind
        The API that should have made it.
    chip, metrics : optional
        With both, the child also evaluates *metrics* of the first and last sample or range on *chip*.
    what : str
        The argument's name, for messages.

    Raises
    ------
    CounterDataImageError
        Not an image, an image of the other kind, or one that CUPTI cannot read (truncated, corrupted).
    """
    kind = Kind(kind)
    image = as_image(image, what)
    if is_trusted(image, kind):
        return ImageInfo(kind, _raw_count(image, kind))
    digest = hashlib.blake2b(memoryview(image), digest_size=20).hexdigest()
    cache_key = (digest, kind, chip, tuple(metrics or ()))
    with _lock:
        info = _checked.get(cache_key)
    if info is None:
        info = _check_in_child(image, kind, chip, list(metrics or ()), what)
        with _lock:
            _checked[cache_key] = info
    trust(image, kind)
    return info


def check_indices(info: ImageInfo, first: int, count: int) -> None:
    """Raise unless ``first .. first+count-1`` are samples/ranges that *info*'s image holds."""
    unit = "samples" if info.kind is Kind.PM_SAMPLING else "ranges"
    if first < 0 or count < 0 or first + count > info.count:
        raise CounterDataImageError(
            f"Index {first if first < 0 or count < 0 else first + count - 1} is out of range: the counter-data "
            f"image holds {info.count} evaluable {unit} (0 to {info.count - 1})."
        )


_CHILD = r"""
import ctypes, json, mmap, sys
sys.path[:] = json.loads(sys.argv[1])
import numpy as np
from gpuscope.cupti import pm_sampling, range_profiler, host
from gpuscope.cupti._types import ProfilerType
kind, chip, metrics = sys.argv[2], sys.argv[3] or None, json.loads(sys.argv[4])
data = sys.stdin.buffer.read()
page = mmap.PAGESIZE
guard = max(1 << 30, 4 * len(data))  # unreadable address space after the image (costs no memory)
total = (len(data) + page - 1) // page * page + guard
m = mmap.mmap(-1, total)
start = total - guard - len(data)
m[start : start + len(data)] = data
libc = ctypes.CDLL(None, use_errno=True)
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
base = ctypes.addressof(ctypes.c_char.from_buffer(m))
assert libc.mprotect(base + total - guard, guard, 0) == 0  # PROT_NONE: a read past the image faults
image = np.frombuffer(m, dtype=np.uint8, count=len(data), offset=start)
try:
    ptype = ProfilerType.PM_SAMPLING if kind == "pm_sampling" else ProfilerType.RANGE_PROFILER
    with host.ProfilerHost(chip or host.supported_chips()[0], ptype) as h:  # CUPTI reads images after this only
        if kind == "pm_sampling":
            count = pm_sampling._info(image).completed
        else:
            count = range_profiler._num_ranges_raw(image)
            for i in range(count):
                host._range_name_raw(image, i)
        if chip and metrics and count:  # every sample or range: CUPTI reads only the parts it needs
            ev = h.evaluator(metrics)
            ev._evaluate_raw(image, 0, count, np.empty((count, len(metrics))))
    print(json.dumps({"count": count}))
except Exception as exc:
    print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
"""


def _check_in_child(image: np.ndarray, kind: Kind, chip, metrics, what: str) -> ImageInfo:
    from .._pm_workers import child_sys_path

    argv = [sys.executable, "-I", "-c", _CHILD, json.dumps(child_sys_path()), kind.value, chip or "",
            json.dumps(metrics)]
    try:
        out = subprocess.run(argv, input=image.tobytes(), capture_output=True, timeout=CHECK_TIMEOUT_S,
                             env=dict(os.environ))
    except subprocess.TimeoutExpired:
        raise CounterDataImageError(
            f"{what}: CUPTI did not finish reading this {kind.value} counter-data image in {CHECK_TIMEOUT_S:g} s "
            "(checked in a child process): it is corrupted or of another kind."
        ) from None
    if out.returncode < 0:
        raise CounterDataImageError(
            f"{what}: CUPTI crashed reading this {kind.value} counter-data image of {image.size} bytes (signal "
            f"{-out.returncode} in the child process that checks it): the image is truncated, corrupted or of "
            "another kind. Use the image exactly as CUPTI wrote it."
        )
    try:
        answer = json.loads(out.stdout.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        answer = {"error": f"the check exited with status {out.returncode}: {out.stderr.decode()[-500:].strip()}"}
    if "error" in answer:
        raise CounterDataImageError(f"{what} cannot be read as a {kind.value} counter-data image: {answer['error']}.")
    return ImageInfo(kind, int(answer["count"]))
