"""A netCDF file read safely before xarray parses it: only a regular file, its bytes checked by HDF5 in a child process
with a deadline and a memory limit, so that a damaged file cannot hang, flood or crash the reader.

HDF5 trusts what a file declares. Random damage to a gpuscope file makes it raise errors of every type, spin at
100% CPU without end (ignoring Ctrl-C, since the spin is inside the C library), or allocate the size that a damaged
string length declares (GBs from a 108 KB file). :func:`read` therefore opens the file once without blocking
(a FIFO or device would block or never end), refuses anything but a regular file, reads its bytes, and has a child
process read every object and attribute of those same bytes with h5py under an address-space limit and a deadline:
only a file the child read to the end is handed to the caller, as bytes, so that what xarray then parses is
exactly what was checked. Verdicts are kept by content, so the same file is checked once per process.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import signal
import stat
import subprocess

from gpuscope.cupti import _python
from gpuscope.errors import NotGpuscopeDataError

__all__ = ["read", "deadline_s", "memory_budget"]

#: The deadline of the check is this many seconds plus :data:`SECONDS_PER_GB` per GB of file: a sound file is read
#: at well over 100 MB/s (gpuscope's 2.5 MB demo in 0.2 s), a spinning one never finishes.
BASE_DEADLINE_S = 60.0
SECONDS_PER_GB = 100.0
#: The address space the check may use beyond what it holds after its imports: this floor plus this many times the
#: file's size (the bytes themselves, the largest value read from them, compression).
MEMORY_FLOOR = 1 << 30
MEMORY_PER_BYTE = 8
#: A dataset that stores nothing (a netCDF dimension without values, or one left to its fill value) may declare this
#: many bytes at most: xarray would fill them in memory.
UNSTORED_LIMIT = 64 << 20
#: How much larger than what it stores a compressed (filtered) dataset may be: deflate's most is about 1032 times.
MAX_RATIO = 1100
#: The signature of an HDF5 file: at offset 0, or at 512, 1024, 2048, ... after a user block.
_SIGNATURE = b"\x89HDF\r\n\x1a\n"

_checked: collections.OrderedDict[bytes, None] = collections.OrderedDict()  # digests of files the child read whole
_KEEP = 64


def deadline_s(size: int) -> float:
    """The seconds the check of a file of *size* bytes may take."""
    return BASE_DEADLINE_S + SECONDS_PER_GB * size / 1e9


def memory_budget(size: int) -> int:
    """The bytes the check of a file of *size* bytes may allocate beyond its imports."""
    return MEMORY_FLOOR + MEMORY_PER_BYTE * size


def _refused(path, why: str) -> NotGpuscopeDataError:
    return NotGpuscopeDataError(f"{os.fspath(path)}: {why}. gpuscope writes its results with gpuscope run -o FILE.nc "
                                "or gpuscope.save_dataset.")


def _read_regular(path) -> bytes:
    """The bytes of the regular file at *path*; refused if it is not one. Opened without blocking: opening a FIFO
    for reading would wait for a writer, and reading a device may never end."""
    _regular(path, os.stat(path).st_mode)  # a socket cannot even be opened
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        _regular(path, os.fstat(fd).st_mode)  # what was opened, if the name changed meanwhile
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read()
    finally:
        os.close(fd)


def _regular(path, mode: int) -> None:
    if not stat.S_ISREG(mode):
        kind = ("a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a character device" if stat.S_ISCHR(mode)
                else "a block device" if stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode)
                else "not a regular file")
        raise _refused(path, f"it is {kind}, not a file; gpuscope reads saved results only from regular files "
                             "(copy the data to a file first)")


def _has_signature(data: bytes) -> bool:
    offset = 0
    while offset + len(_SIGNATURE) <= len(data):
        if data[offset:offset + len(_SIGNATURE)] == _SIGNATURE:
            return True
        offset = 512 if offset == 0 else offset * 2
    return False


def read(path) -> bytes:
    """The bytes of the netCDF-4 file at *path*, once HDF5 has read all of it safely in a child process.

    Raises
    ------
    gpuscope.errors.NotGpuscopeDataError
        Not a regular file (a FIFO, a device, a socket), not an HDF5 file, or HDF5 cannot read it: it fails, spins
        past :func:`deadline_s`, crashes, or declares more data than the file can hold. The message names the file
        and what went wrong.
    OSError
        The file cannot be opened or read (permissions).
    ChildProcessError
        The check cannot run (no Python interpreter to start it, or one that never got ready: the message says to
        set ``GPUSCOPE_PYTHON``); nothing is said of the file.
    """
    data = _read_regular(path)
    if not _has_signature(data):
        raise _refused(path, f"it is not a netCDF-4 (HDF5) file ({len(data)} bytes, no HDF5 signature)")
    digest = hashlib.sha256(data).digest()
    if digest in _checked:
        _checked.move_to_end(digest)
        return data
    why = _check_in_child(data)
    if why is not None:
        raise _refused(path, f"HDF5 cannot read it safely: {why}; the file is damaged or not one gpuscope wrote")
    _checked[digest] = None
    while len(_checked) > _KEEP:
        _checked.popitem(last=False)
    return data


_CHILD = r"""
import io, json, mmap, resource, sys
sys.path[:] = json.loads(sys.argv[1])
task = json.loads(sys.argv[2])
def answer(**what):
    print(json.dumps(what), flush=True)
    raise SystemExit(0)
try:  # a failure here is the check's, not the file's
    import numpy as np
    import h5py
except Exception as exc:
    answer(failed=f"{type(exc).__name__}: {exc}")
print(json.dumps({"ready": True}), flush=True)
data = sys.stdin.buffer.read()
in_use = int(open("/proc/self/statm").read().split()[0]) * mmap.PAGESIZE
hard = resource.getrlimit(resource.RLIMIT_AS)[1]
want = in_use + task["budget"]
resource.setrlimit(resource.RLIMIT_AS, (want if hard == resource.RLIM_INFINITY else min(want, hard), hard))

def too_large(name, what):
    answer(error=f"{name!r} declares {what}, more than the file of {len(data)} bytes can hold")

def vlen_lengths(d, n):
    # The lengths of a contiguous, unfiltered variable-length dataset, read from its stored descriptors (length,
    # heap address, index) before HDF5 allocates what they declare.
    size_of_address = d.file.id.get_create_plist().get_sizes()[0]
    record = np.dtype([("length", "<u4"), ("heap", f"V{size_of_address}"), ("index", "<u4")])
    offset = d.id.get_offset()
    if offset is None or offset + n * record.itemsize > len(data):
        return None
    return np.frombuffer(data, dtype=record, count=n, offset=offset)["length"]

def check_dataset(name, d):
    n = int(np.prod(d.shape, dtype=np.uint64)) if d.shape else (0 if d.shape is None else 1)
    vlen = h5py.check_vlen_dtype(d.dtype) is not None or d.dtype.kind == "O"
    declared = n * (16 if vlen else d.dtype.itemsize)
    stored = d.id.get_storage_size()
    filtered = d.id.get_create_plist().get_nfilters() > 0
    if stored == 0:  # nothing stored: a netCDF dimension without values, or fill values only
        if declared > task["unstored"]:
            too_large(name, f"{n} values of {d.dtype} ({declared} bytes) and stores none")
        return  # nothing to read
    chunk = int(np.prod(d.chunks)) * (16 if vlen else d.dtype.itemsize) if d.chunks else 0
    if declared > stored * (task["ratio"] if filtered else 1) + chunk:
        too_large(name, f"{n} values of {d.dtype} ({declared} bytes) and stores {stored}")
    if vlen and not filtered and d.chunks is None and n:
        lengths = vlen_lengths(d, n)
        if lengths is not None and int(lengths.sum(dtype=np.uint64)) > len(data):
            too_large(name, f"variable-length values of {int(lengths.sum(dtype=np.uint64))} bytes in all "
                            f"(one of {int(lengths.max())})")
    d[()]

def visit(name, obj):
    for key in obj.attrs:
        obj.attrs[key]
    if isinstance(obj, h5py.Dataset):
        check_dataset(name, obj)

try:
    with h5py.File(io.BytesIO(data), "r") as f:
        for key in f.attrs:
            f.attrs[key]
        f.visititems(visit)
except MemoryError:
    answer(error=f"it declares more data than the file of {len(data)} bytes can hold (reading it needed more than "
                 f"{task['budget'] >> 20} MiB)")
except Exception as exc:
    answer(error=f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)
answer(ok=True)
"""


def _check_in_child(data: bytes) -> str | None:
    """None when a child process read every object and attribute of *data* with h5py, else why it could not."""
    task = {"budget": memory_budget(len(data)), "unstored": UNSTORED_LIMIT, "ratio": MAX_RATIO}
    try:
        argv = [_python.interpreter(), "-I", "-c", _CHILD, json.dumps(_python.sys_path()), json.dumps(task)]
    except OSError as exc:
        raise ChildProcessError(f"gpuscope reads saved files in a child process, and cannot start one: {exc}") from None
    deadline = deadline_s(len(data))
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}  # no thread pools under the limit
    try:
        out = subprocess.run(argv, input=data, capture_output=True, timeout=deadline, env=env)
    except subprocess.TimeoutExpired as exc:
        if b'"ready"' not in (exc.stdout or b""):
            raise ChildProcessError(f"the child process that reads saved files did not start within {deadline:.0f} s (is "
                          f"{argv[0]} a working Python? {_python.ENV_VAR} names the interpreter to use)") from None
        return f"reading it did not finish in {deadline:.0f} s (in a child process, which was stopped)"
    except OSError as exc:
        raise ChildProcessError(f"gpuscope reads saved files in a child process, and cannot start one: {exc}") from None
    if out.returncode == -signal.SIGKILL:
        return "the child process that reads it was killed (SIGKILL: out of memory?)"
    if out.returncode < 0:
        return f"HDF5 crashed reading it (signal {-out.returncode} in the child process that reads it)"
    try:
        answer = json.loads(out.stdout.decode().strip().splitlines()[-1])
    except (ValueError, IndexError, UnicodeDecodeError):
        raise ChildProcessError(f"the child process that reads saved files exited with status {out.returncode} "
                      f"({out.stderr.decode(errors='replace')[-500:].strip()})") from None
    if "failed" in answer:
        raise ChildProcessError(f"the child process that reads saved files could not start its work: {answer['failed']}")
    return answer.get("error")
