"""Images checked before CUPTI reads them: counter data, counter availability, configs.

CUPTI trusts a counter-data image completely: the offsets in it say where to read, with no check against the size
passed. On CUPTI 13.1, ``cuptiPmSamplingGetCounterDataInfo`` on a truncated PM image, evaluating a truncated or
bit-flipped one or a sample index past the end, and ``cuptiProfilerHostGetRangeName`` on a PM image all crash the
process (SIGSEGV); evaluating sample 400 of an image holding 261 returns plausible numbers. An image whose counts
CUPTI reads without harm can still crash it, or make it spin for ever, when its samples are evaluated. The image
format is not documented, so it cannot be validated field by field. Instead:

* images that CUPTI itself made in this process (gpuscope's own) are **trusted** (:func:`trust`) and read in
  place: counter-data images by address while the array lives (CUPTI writes samples into them, so their bytes
  change by CUPTI's own hand; writing into one by other means voids this), availability and config images by
  address and content (changed, they are checked like any other);
* any other image is **copied**, and only the copy reaches CUPTI: the bytes checked are the bytes read, whatever
  happens to the caller's array later or meanwhile. The copy's SHA-256 keys what was found out about it, per
  **use**: its counts alone (every range name too, for the range profiler), or its counts and every sample or
  range evaluated with given metrics on a given chip. Each use of each content is first tried by CUPTI in a
  **child process** (:func:`_check_in_child`), with the image placed before unreadable address space so that any
  read past its end faults there, not here. If the child crashes, hangs or CUPTI refuses the image,
  :class:`~gpuscope.errors.CounterDataImageError` is raised; the verdict, either way, is kept, so the same use of
  the same bytes costs no second child. A check that could not run (no Python interpreter to run it, an
  address-space limit, memory, the child killed) raises saying so, judges nothing and is not kept. That costs a
  copy and a hash per call (about 10 ms for an 8.7 MB image) and a child (about a second) per use and content.

Indices are checked against the image's own counts before every evaluation: samples ``< numCompletedSamples``
(PM sampling), ranges ``< numTotalRanges`` (range profiler).

Counter-availability and config images are FlatBuffers, and CUPTI trusts them as much: it is not even given the
size of an availability image, and on CUPTI 13.1 an empty, short or random one, or a real one with a few bytes
changed, crashes ``cuptiProfilerHostInitialize`` or ``ConfigAddMetrics``; an empty config image crashes
``GetNumOfPasses`` and a truncated one gives 0 passes. Images CUPTI made in this process (the device's
availability, :func:`~gpuscope.cupti.host.config_image`) are trusted. Any other one is copied and checked
(:func:`check_flat`): its FlatBuffer root table must lie inside it and name a chip CUPTI knows (the one asked for),
a config image must carry CUPTI's identifier ``LOPC``; then CUPTI reads it in a child process, as above (an
availability image: host object of the type asked for, config of one metric, its passes; a config image: its
passes, at least one). The verdict is kept by content, chip and host type.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import os
import signal
import struct
import subprocess
import threading
import weakref

import numpy as np

from gpuscope.cupti import _python
from gpuscope.errors import CounterDataImageError, ImageError

__all__ = ["Kind", "ImageInfo", "trust", "is_trusted", "check", "check_indices", "check_flat", "guard_bytes", "MAGIC",
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


#: The use of a counter-data image that reads only its counts (and, range profiler, every range name); every
#: other use reads them too.
_COUNTS = ("", ())


@dataclasses.dataclass(frozen=True)
class _Refused:
    """Why CUPTI could not read an image in the child: the message after the argument's name."""

    error: type
    reason: str


@dataclasses.dataclass
class _Verdicts:
    """What the child processes found out about one content of one kind: the uses that passed (all report the same
    count) and those refused, with why."""

    count: int = 0
    passed: set = dataclasses.field(default_factory=set)
    refused: dict = dataclasses.field(default_factory=dict)

    def of(self, kind: Kind, use: tuple) -> ImageInfo | _Refused | None:
        counts_refused = kind not in _FLAT and _COUNTS in self.refused  # then so is every use
        if use in self.refused or counts_refused:
            return self.refused.get(use) or self.refused[_COUNTS]
        if use in self.passed or (use == _COUNTS and self.passed and kind not in _FLAT):
            return ImageInfo(kind, self.count)
        return None


#: Re-entrant: a weakref finalizer (``_forget`` of another image) can run inside any allocation made while it is held,
#: on the same thread: a garbage collection during ``image.ctypes`` deadlocked a GPU test with a plain Lock.
_lock = threading.RLock()
#: CUPTI's own images: (address, size) -> (kind, SHA-256 of a FlatBuffer image or None), while the array lives.
_trusted: dict[tuple[int, int], tuple[Kind, bytes | None]] = {}
#: (SHA-256, kind) -> what the checks found.
_verdicts: dict[tuple[bytes, Kind], _Verdicts] = {}


def _key(image: np.ndarray) -> tuple[int, int]:
    return image.ctypes.data, image.size


def _digest(image: np.ndarray) -> bytes:
    return hashlib.sha256(memoryview(image)).digest()


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
    """Record that CUPTI made *image* for *kind* in this process: it is read in place, unchecked, until the array
    is freed (an availability or config image: while its bytes are the ones CUPTI made)."""
    kind = Kind(kind)
    key = _key(image)
    digest = _digest(image) if kind in _FLAT else None
    with _lock:
        _trusted[key] = (kind, digest)
    weakref.finalize(image, _forget, key)


def _forget(key) -> None:
    with _lock:
        _trusted.pop(key, None)


def is_trusted(image: np.ndarray, kind: Kind) -> bool:
    """Whether CUPTI made *image* for *kind* in this process (see :func:`trust`)."""
    kind = Kind(kind)
    key = _key(image)
    with _lock:
        found = _trusted.get(key)
    return found is not None and found[0] is kind and (found[1] is None or found[1] == _digest(image))


def check(image, kind: Kind, *, count, chip: str | None = None, metrics=None,
          what: str = "counter_data") -> tuple[np.ndarray, ImageInfo]:
    """Make sure CUPTI can read *image* as a *kind* image without crashing; return what CUPTI may read and the
    image's counts.

    Parameters
    ----------
    image : numpy.ndarray
        The counter-data image.
    kind : Kind
        The API that should have made it.
    count : callable
        ``count(image) -> int``: the image's samples or ranges straight from CUPTI, for an image CUPTI made in
        this process (passed in by the module of that API, which this one does not import).
    chip, metrics : optional
        With both, the use checked is evaluating *metrics* on *chip*: the child evaluates every sample or range
        with them. Without, the use is reading the counts (and range names).
    what : str
        The argument's name, for messages.

    Returns
    -------
    (numpy.ndarray, ImageInfo)
        The array to hand CUPTI: *image* itself if CUPTI made it in this process, else a read-only copy of the
        bytes that were checked. And the image's counts.

    Raises
    ------
    CounterDataImageError
        Not an image, an image of the other kind, or one that CUPTI cannot read (truncated, corrupted); or the
        check could not run (the message says what failed).
    """
    kind = Kind(kind)
    image = as_image(image, what)
    if is_trusted(image, kind):
        return image, ImageInfo(kind, int(count(image)))
    copy = _private_copy(image)
    names = sorted(set(metrics or ()))
    use = (chip, tuple(names)) if chip and names else _COUNTS
    return copy, _judged(copy, kind, use, what, lambda: _check_in_child(copy, kind, chip, names, what))


def _private_copy(image: np.ndarray) -> np.ndarray:
    """A read-only copy of *image* that nothing else refers to."""
    copy = image.copy()
    copy.flags.writeable = False
    return copy


def _judged(image: np.ndarray, kind: Kind, use: tuple, what: str, run) -> ImageInfo:
    """The verdict on *use* of *image*'s content: the one kept, else ``run()``'s (then kept); raise a refusal."""
    key = (_digest(image), kind)
    with _lock:
        verdict = _verdicts[key].of(kind, use) if key in _verdicts else None
    if verdict is None:
        verdict = run()
        with _lock:
            record = _verdicts.setdefault(key, _Verdicts())
            if isinstance(verdict, _Refused):
                record.refused[use] = verdict
            else:
                record.count = verdict.count
                record.passed.add(use)
    if isinstance(verdict, _Refused):
        raise verdict.error(f"{what}{verdict.reason}")
    return verdict


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

    Returns
    -------
    numpy.ndarray
        The array to hand CUPTI (which may keep it): *image* itself if CUPTI made it in this process, else a
        read-only copy of the bytes that were checked.

    Raises
    ------
    ImageError
        Not an image, one of another chip, or one CUPTI cannot read (truncated, corrupted); or the check could
        not run (the message says what failed).
    """
    kind = Kind(kind)
    label = _FLAT[kind][0]
    array = as_bytes(image, what)
    if is_trusted(array, kind):
        return array
    copy = _private_copy(array)
    named = _root_chip(copy.tobytes(), kind, what)
    if chip is not None and named != chip:
        raise ImageError(f"{what} is a {label} of {named}, not of {chip}: CUPTI would read it as {named}'s. Pass the "
                         f"image of a {chip} device.")
    if named not in known_chips():
        raise ImageError(f"{what} is a {label} of {named!r}, a chip this CUPTI does not know: it is corrupted, or "
                         "made by a newer CUPTI.")
    ptype = None if profiler_type is None else int(profiler_type)
    metrics = [PROBE_METRIC] if kind is Kind.AVAILABILITY else []
    info = _judged(copy, kind, (named, ptype), what, lambda: _check_in_child(copy, kind, named, metrics, what, ptype))
    if info.count < 1:
        raise ImageError(f"{what}: CUPTI finds no pass in this {label} of {copy.size} bytes (checked in a child "
                         "process): it is truncated or corrupted.")
    return copy


# -- the child process that tries an image ------------------------------------------------------------------

#: Unreadable address space placed after the image in the child: a read that far past its end faults there. At
#: least four times the image; it costs address space, not memory.
GUARD_BYTES = 1 << 30
#: Address space left free in the child for what CUPTI allocates while it reads an image (measured with the H100
#: recordings: 20 MB beyond the 440 MB that Python, numpy and the loaded CUPTI take).
CHILD_RESERVE_BYTES = 128 << 20
#: The smallest guard a check runs with, where an address-space limit (``ulimit -v``) leaves less than the full one.
MIN_GUARD_BYTES = 64 << 20


def guard_bytes(image_bytes: int, limit: int | None, in_use: int, page: int = 4096) -> int:
    """The guard after an image of *image_bytes* in a child that uses *in_use* bytes of address space under the
    limit *limit* (None: none): :data:`GUARD_BYTES` (at least four times the image), less where the limit leaves
    less after the image and :data:`CHILD_RESERVE_BYTES`.

    Raises
    ------
    MemoryError
        The limit leaves less than :data:`MIN_GUARD_BYTES`: the check cannot run (the image is not at fault).
    """
    want = max(GUARD_BYTES, 4 * image_bytes)
    if limit is None:
        return want
    image_pages = -(-image_bytes // page) * page
    room = (limit - in_use - image_pages - CHILD_RESERVE_BYTES) // page * page
    if room < MIN_GUARD_BYTES:
        raise MemoryError(
            f"the address-space limit (ulimit -v: {limit >> 20} MiB) leaves {max(room, 0) >> 20} MiB for the guard "
            f"placed after the image, less than the {MIN_GUARD_BYTES >> 20} MiB the check needs (CUPTI and Python "
            f"take {in_use >> 20} MiB, the image {image_pages >> 20} MiB, CUPTI's work {CHILD_RESERVE_BYTES >> 20} "
            "MiB); raise the limit"
        )
    return min(want, room)


_CHILD = r"""
import ctypes, json, mmap, resource, sys
sys.path[:] = json.loads(sys.argv[1])
def answer(**what):
    print(json.dumps(what), flush=True)
    raise SystemExit(0)
def said(exc):
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
try:  # a failure here is the check's, not the image's
    import numpy as np
    from gpuscope.cupti import _images, pm_sampling, range_profiler, host
    from gpuscope.cupti._types import ProfilerType
    first_chip = host.supported_chips()[0]  # loads CUPTI before the guard is sized to what is left
    task = json.loads(sys.argv[2])
    kind, chip, metrics = task["kind"], task["chip"], task["metrics"]
    data = sys.stdin.buffer.read()
    page = mmap.PAGESIZE
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    in_use = int(open("/proc/self/statm").read().split()[0]) * page
    guard = _images.guard_bytes(len(data), None if limit == resource.RLIM_INFINITY else limit, in_use, page)
    total = (len(data) + page - 1) // page * page + guard
    m = mmap.mmap(-1, total)
    start = total - guard - len(data)
    m[start : start + len(data)] = data
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    base = ctypes.addressof(ctypes.c_char.from_buffer(m))
    if libc.mprotect(base + total - guard, guard, 0) != 0:  # PROT_NONE: a read past the image faults
        raise OSError(ctypes.get_errno(), "mprotect of the guard failed")
    image = np.frombuffer(m, dtype=np.uint8, count=len(data), offset=start)
except Exception as exc:
    answer(failed=said(exc))
print(json.dumps({"ready": True}), flush=True)  # from here on, a hang is CUPTI's on the image
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
        with host.ProfilerHost(chip or first_chip, ptype) as h:  # CUPTI reads images after this only
            if kind == "pm_sampling":
                count = pm_sampling._info(image).completed
            else:
                count = range_profiler._num_ranges_raw(image)
                for i in range(count):
                    host._range_name_raw(image, i)
            if chip and metrics and count:  # every sample or range: CUPTI reads only the parts it needs
                ev = h.evaluator(metrics)
                ev._evaluate_raw(image, 0, count, np.empty((count, len(metrics))))
except MemoryError as exc:  # CuptiMemoryError too: memory ran out, which says nothing of the image
    answer(failed=said(exc))
except Exception as exc:
    answer(error=said(exc))
answer(count=count)
"""

_LABELS = {Kind.PM_SAMPLING: "pm_sampling counter-data image", Kind.RANGE_PROFILER: "range_profiler counter-data image",
           **{kind: label for kind, (label, _, _) in _FLAT.items()}}


def _check_in_child(image: np.ndarray, kind: Kind, chip, metrics, what: str,
                    profiler_type=None) -> ImageInfo | _Refused:
    """CUPTI's verdict on *image*, tried in a child process: its counts, or why CUPTI cannot read it.

    Raises
    ------
    ImageError, CounterDataImageError
        The check could not run (no interpreter to run it, an address-space limit, memory, the child killed):
        the message says what failed, and that the image was not judged.
    """
    label = _LABELS[kind]
    error = ImageError if kind in _FLAT else CounterDataImageError

    def not_checked(why: str) -> ImageError:
        return error(f"{what} could not be checked before CUPTI reads it: {why}. The {label} was not judged (it may "
                     "well be sound), and CUPTI has not read it.")

    task = {"kind": kind.value, "chip": chip or "", "metrics": list(metrics), "profiler_type": profiler_type}
    try:
        argv = [_python.interpreter(), "-I", "-c", _CHILD, json.dumps(_python.sys_path()), json.dumps(task)]
        out = subprocess.run(argv, input=image.tobytes(), capture_output=True, timeout=CHECK_TIMEOUT_S,
                             env=dict(os.environ))
    except subprocess.TimeoutExpired as exc:
        if b'"ready"' not in (exc.stdout or b""):  # the interpreter or CUPTI's loading hung, before the image
            raise not_checked(f"the child process that checks it did not get ready in {CHECK_TIMEOUT_S:g} s (is "
                              f"{argv[0]} a working Python that imports gpuscope? {_python.ENV_VAR} names the "
                              "interpreter to use)") from None
        return _Refused(error, f": CUPTI did not finish reading this {label} in {CHECK_TIMEOUT_S:g} s (checked in a "
                               "child process; a sound image takes about a second): it is corrupted or of another "
                               "kind.")
    except OSError as exc:
        raise not_checked(f"the child process that checks it could not be started: {exc}") from None
    if out.returncode == -signal.SIGKILL:
        raise not_checked("the child process that checks it was killed (SIGKILL: out of memory?)")
    if out.returncode < 0:
        return _Refused(error, f": CUPTI crashed reading this {label} of {image.size} bytes (signal "
                               f"{-out.returncode} in the child process that checks it): the image is truncated, "
                               "corrupted or of another kind. Use the image exactly as CUPTI wrote it.")
    try:
        answer = json.loads(out.stdout.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise not_checked(f"the child process that checks it exited with status {out.returncode} "
                          f"({out.stderr.decode(errors='replace')[-500:].strip()})") from None
    if "failed" in answer:
        raise not_checked(answer["failed"])
    if "error" in answer:
        return _Refused(error, f" cannot be read as a {label}: {answer['error']}.")
    return ImageInfo(kind, int(answer["count"]))
