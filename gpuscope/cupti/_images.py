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

Counter-availability and config images are FlatBuffers, and CUPTI trusts them as much: it is not even given the
size of an availability image, and on CUPTI 13.1 an empty, short or random one, or a real one with a few bytes
changed, crashes ``cuptiProfilerHostInitialize`` or ``ConfigAddMetrics``; an empty config image crashes
``GetNumOfPasses`` and a truncated one gives 0 passes. Images CUPTI made in this process (the device's
availability, :func:`~gpuscope.cupti.host.config_image`) are trusted. Any other one is checked
(:func:`check_flat`): its FlatBuffer root table must lie inside it and name a chip CUPTI knows (the one asked for),
a config image must carry CUPTI's identifier ``LOPC``; then CUPTI reads it in a child process, as above (an
availability image: host object, config of one metric, its passes, the metrics per pass; a config image: its
passes, at least one). The answer is cached by content.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import os
import struct
import subprocess
import sys
import threading
import weakref

import numpy as np

from gpuscope.errors import CounterDataImageError, ImageError

__all__ = ["Kind", "ImageInfo", "trust", "is_trusted", "check", "check_indices", "check_flat", "MAGIC",
           "CHECK_TIMEOUT_S"]

#: The first bytes of every counter-data image (CUPTI 12.6-13.1, both kinds).
MAGIC = b"LOPDATA\x00"
#: The smallest image that can hold CUPTI's header.
MIN_BYTES = 64
#: Seconds the child process may take to read an image.
CHECK_TIMEOUT_S = 60.0


class Kind(str, enum.Enum):
    """What an image is: a counter-data image of one of two APIs, a counter-availability or a config image."""

    PM_SAMPLING = "pm_sampling"
    RANGE_PROFILER = "range_profiler"
    AVAILABILITY = "counter_availability"
    CONFIG = "config"


@dataclasses.dataclass(frozen=True)
class ImageInfo:
    """What CUPTI reports about a checked image: *count* is the samples that can be evaluated (PM sampling:
    ``numCompletedSamples``), the ranges held (range profiler: ``numTotalRanges``) or the passes of a config
    image (of the probe metric's config, for an availability image)."""

    kind: Kind
    count: int


_lock = threading.Lock()
_trusted: dict[tuple[int, int], Kind] = {}  # (address, size) -> kind, while the array lives
_checked: dict[tuple, ImageInfo] = {}  # (digest, kind, chip, metrics or profiler type) -> info


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


def check(image, kind: Kind, *, count, chip: str | None = None, metrics=None, what: str = "counter_data") -> ImageInfo:
    """Make sure CUPTI can read *image* as a *kind* image without crashing; return its counts.

    Parameters
    ----------
    image : numpy.ndarray
        The counter-data image.
    kind : Kind
        The API that should have made it.
    count : callable
        ``count(image) -> int``: the image's samples or ranges straight from CUPTI, for an image already trusted
        (passed in by the module of that API, which this one does not import).
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
        return ImageInfo(kind, int(count(image)))
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


# -- counter-availability and config images (FlatBuffers) ---------------------------------------------------

#: Per kind: what users call it, the root-table field that holds the chip name (measured: config images of CUPTI
#: 12.6-13.1, availability images of CUPTI 13.0 on the H100) and the call that makes a sound one.
_FLAT = {
    Kind.AVAILABILITY: ("counter-availability image", 1,
                        "gpuscope.cupti.profiler.counter_availability or pm_counter_availability returned it"),
    Kind.CONFIG: ("config image", 3, "gpuscope.cupti.host.config_image made it"),
}
#: The FlatBuffer file identifier of config images (bytes 4 to 7).
CONFIG_IDENTIFIER = b"LOPC"
#: The metric an availability image is tried with in the child (every chip of CUPTI 12.6-13.1 has it, for both
#: profiler types). In the fuzzing of the H100 images, none that passed with it crashed with other metrics.
PROBE_METRIC = "sm__cycles_elapsed.max"


def as_bytes(image, what: str) -> np.ndarray:
    """*image* (bytes, bytearray, memoryview or a 1-D uint8 numpy array) as a C-contiguous uint8 array."""
    if isinstance(image, (bytes, bytearray, memoryview)):
        return np.frombuffer(bytes(image), dtype=np.uint8).copy()
    if isinstance(image, np.ndarray) and image.dtype == np.uint8 and image.ndim == 1:
        return np.ascontiguousarray(image)
    raise ImageError(f"{what} must be bytes or a 1-D numpy uint8 array (an image as CUPTI wrote it); got "
                     f"{type(image).__name__}{getattr(image, 'shape', '')} of {getattr(image, 'dtype', '?')}.")


def _root_chip(data: bytes, kind: Kind, what: str) -> str:
    """The chip a FlatBuffer image names, once its root table is seen to lie inside it; else raise, saying why."""
    label, chip_field, source = _FLAT[kind]

    def refuse(why: str):
        raise ImageError(f"{what} ({len(data)} bytes) is not a CUPTI {label}: {why}. Pass the image exactly as "
                         f"{source} (e.g. saved with numpy.save).")

    n = len(data)
    if n < 16:
        refuse("it is too short to hold one")
    if kind is Kind.CONFIG and data[4:8] != CONFIG_IDENTIFIER:
        refuse(f"it does not carry CUPTI's identifier {CONFIG_IDENTIFIER.decode()} at byte 4")
    (root,) = struct.unpack_from("<I", data, 0)
    if root % 4 or not 8 <= root <= n - 4:
        refuse(f"its root table offset ({root}) does not point inside it")
    vtable = root - struct.unpack_from("<i", data, root)[0]
    if vtable % 2 or not 4 <= vtable <= n - 4:
        refuse("its root table's layout record lies outside it")
    vsize, tsize = struct.unpack_from("<HH", data, vtable)
    if vsize < 4 or vsize % 2 or vtable + vsize > n or tsize < 4 or root + tsize > n:
        refuse("its root table does not fit in it")
    fields = struct.unpack_from(f"<{(vsize - 4) // 2}H", data, vtable + 4)
    if any(f and not 4 <= f < tsize for f in fields):
        refuse("a field of its root table lies outside the table")
    at = fields[chip_field] if chip_field < len(fields) else 0
    if not at or at + 4 > tsize:
        refuse("it names no chip")
    at += root + struct.unpack_from("<I", data, root + at)[0]
    length = struct.unpack_from("<I", data, at)[0] if at % 4 == 0 and at + 4 <= n else -1
    name = data[at + 4 : at + 4 + length] if 0 < length <= 64 and at + 4 + length < n else b""
    if not (name and name.isascii() and name.isalnum() and data[at + 4 + length] == 0):
        refuse("its chip name is not a string inside it")
    return name.decode()


def check_flat(image, kind: Kind, *, chip: str | None = None, profiler_type=None, what: str,
               known_chips) -> np.ndarray:
    """A counter-availability or config image that CUPTI can read without crashing, as a uint8 array.

    Parameters
    ----------
    image : bytes-like or numpy.ndarray
        The image.
    kind : Kind
        ``AVAILABILITY`` or ``CONFIG``.
    chip : str, optional
        The chip the image is used for; it must be the one the image names.
    profiler_type : ProfilerType
        For an availability image: the host object type it is used with (the child tries it with that type).
    what : str
        The argument's name, for messages.
    known_chips : callable
        Returns the chip names this CUPTI knows (``host.supported_chips``).

    Raises
    ------
    ImageError
        Not an image, one of another chip, or one CUPTI cannot read (truncated, corrupted).
    """
    kind = Kind(kind)
    label = _FLAT[kind][0]
    array = as_bytes(image, what)
    if is_trusted(array, kind):
        return array
    named = _root_chip(array.tobytes(), kind, what)
    if chip is not None and named != chip:
        raise ImageError(f"{what} is a {label} of {named}, not of {chip}: CUPTI would read it as {named}'s. Pass the "
                         f"image of a {chip} device.")
    if named not in known_chips():
        raise ImageError(f"{what} is a {label} of {named!r}, a chip this CUPTI does not know: it is corrupted, or "
                         "made by a newer CUPTI.")
    digest = hashlib.blake2b(memoryview(array), digest_size=20).hexdigest()
    ptype = None if profiler_type is None else int(profiler_type)
    key = (digest, kind, named, ptype)
    with _lock:
        info = _checked.get(key)
    if info is None:
        metrics = [PROBE_METRIC] if kind is Kind.AVAILABILITY else []
        info = _check_in_child(array, kind, named, metrics, what, ptype)
        if info.count < 1:
            raise ImageError(f"{what}: CUPTI finds no pass in this {label} of {array.size} bytes (checked in a child "
                             "process): it is truncated or corrupted.")
        with _lock:
            _checked[key] = info
    return array


_CHILD = r"""
import ctypes, json, mmap, sys
sys.path[:] = json.loads(sys.argv[1])
import numpy as np
from gpuscope.cupti import _images, pm_sampling, range_profiler, host
from gpuscope.cupti._types import ProfilerType
task = json.loads(sys.argv[2])
kind, chip, metrics = task["kind"], task["chip"], task["metrics"]
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
    if kind == "counter_availability":  # as gpuscope uses one: a host object, a config, its passes
        ptype = ProfilerType(task["profiler_type"])
        _images.trust(image, _images.Kind.AVAILABILITY)  # this child is where it is tried
        with host.ProfilerHost(chip, ptype, image) as h:
            h.add_metrics(metrics)
            count = host.num_passes(h.config_image())
        host.max_metrics_per_pass(chip, ptype, image)
    elif kind == "config":
        _images.trust(image, _images.Kind.CONFIG)
        count = host.num_passes(image)
    else:
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

_LABELS = {Kind.PM_SAMPLING: "pm_sampling counter-data image", Kind.RANGE_PROFILER: "range_profiler counter-data image",
           **{kind: label for kind, (label, _, _) in _FLAT.items()}}


def child_sys_path() -> list[str]:
    """The parent's ``sys.path`` for a child process: the folder that holds this gpuscope first, then the rest
    without ``''`` and the current folder (``python -c`` and ``-m`` put those first; a child must not import from
    there). Used here and by PM sampling's evaluation workers."""
    package_parent = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # gpuscope/cupti/
    cwd = os.getcwd()
    rest = [p for p in sys.path if p and os.path.abspath(p) != cwd and os.path.abspath(p) != package_parent]
    return [package_parent, *rest]


def _check_in_child(image: np.ndarray, kind: Kind, chip, metrics, what: str, profiler_type=None) -> ImageInfo:
    label = _LABELS[kind]
    error = ImageError if kind in _FLAT else CounterDataImageError
    task = {"kind": kind.value, "chip": chip or "", "metrics": list(metrics), "profiler_type": profiler_type}
    argv = [sys.executable, "-I", "-c", _CHILD, json.dumps(child_sys_path()), json.dumps(task)]
    try:
        out = subprocess.run(argv, input=image.tobytes(), capture_output=True, timeout=CHECK_TIMEOUT_S,
                             env=dict(os.environ))
    except subprocess.TimeoutExpired:
        raise error(
            f"{what}: CUPTI did not finish reading this {label} in {CHECK_TIMEOUT_S:g} s "
            "(checked in a child process): it is corrupted or of another kind."
        ) from None
    if out.returncode < 0:
        raise error(
            f"{what}: CUPTI crashed reading this {label} of {image.size} bytes (signal "
            f"{-out.returncode} in the child process that checks it): the image is truncated, corrupted or of "
            "another kind. Use the image exactly as CUPTI wrote it."
        )
    try:
        answer = json.loads(out.stdout.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        answer = {"error": f"the check exited with status {out.returncode}: {out.stderr.decode()[-500:].strip()}"}
    if "error" in answer:
        raise error(f"{what} cannot be read as a {label}: {answer['error']}.")
    return ImageInfo(kind, int(answer["count"]))
