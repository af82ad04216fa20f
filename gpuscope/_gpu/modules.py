"""Which loaded modules were built with relocatable device code: read from each cubin as the driver loads it.

CUPTI's kernel replay restores much more device memory per pass once a module linked from relocatable device
code is loaded (docs/measurements.md: 48-90 ms per launch instead of 40 on an H100, even when that module never
runs). gpuscope cannot see the cause inside CUPTI, but it can see the modules: from the first range-profiling
session of a process on, :func:`watch` hears every module load (CUPTI's resource callback) and
:func:`relocatable_evidence` reads the cubin's ELF sections, so the kernel-replay cost warning states what was
observed instead of guessing. Modules loaded before the first session are not seen, and the warning says so.

What marks such a cubin (measured on cubins from Numba and CuPy with CUDA 13.0, kept as test fixtures):

* the toolkit note ``.note.nv.tkinfo`` records a link by the JIT linker of objects that ``ptxas`` compiled
  with ``-c`` (relocatable);
* sections of the CUDA device runtime (``cuda_device_runtime``), linked in for cooperative groups or dynamic
  parallelism;
* relocation sections for device code or data (``.rela.nv.*``, ``.rela.text.*``, ``.nv.rel.action``), which a
  whole-program compile resolves away (only ``.rela.debug_frame`` remains).
"""

from __future__ import annotations

import struct
import threading

__all__ = ["relocatable_evidence", "kernel_names", "watch", "Seen", "seen"]

_ELF = b"\x7fELF"
#: Section names are read inside the string table, and all of them together at most this many times its size: a
#: real cubin's names take less than the table (under 0.7 of it in the fixtures; a name shared by tail merging
#: counts again), while a crafted table without NULs, named at a different offset by each of 11,000 section
#: headers, took 7.6 GB and 14 s inside CUPTI's callback. Past that, the cubin is not read.
_NAME_BYTES_PER_TABLE_BYTE = 4


def _sections(cubin: bytes) -> list[tuple[str, memoryview]]:
    """(name, contents) of each section of a 64-bit little-endian ELF; [] for anything else. The contents are views
    of *cubin*, never copies (a crafted file's sections may all span the whole file)."""
    if len(cubin) < 64 or cubin[:4] != _ELF or cubin[4] != 2 or cubin[5] != 1:
        return []
    shoff = struct.unpack_from("<Q", cubin, 40)[0]
    entsize, count, names_index = struct.unpack_from("<HHH", cubin, 58)
    if entsize < 64 or shoff + count * entsize > len(cubin) or names_index >= count:
        return []
    headers = [struct.unpack_from("<IIQQQQ", cubin, shoff + i * entsize) for i in range(count)]
    names_at, names_size = headers[names_index][4:]
    names_end = names_at + names_size
    if names_end > len(cubin):
        return []
    budget = _NAME_BYTES_PER_TABLE_BYTE * names_size
    view = memoryview(cubin)
    out = []
    for name, kind, _flags, _addr, offset, size in headers:
        start = min(names_at + name, names_end)
        end = cubin.find(b"\0", start, names_end)
        budget -= (names_end if end < 0 else end) - start
        if budget < 0:
            return []
        label = cubin[start:end].decode(errors="replace") if end >= 0 else ""
        body = view[offset:offset + size] if kind != 8 and offset + size <= len(cubin) else view[:0]  # 8: NOBITS
        out.append((label, body))
    return out


def relocatable_evidence(cubin: bytes) -> list[str]:
    """What in *cubin* shows relocatable device code (empty: none; also for bytes that are not an ELF cubin)."""
    sections = _sections(bytes(cubin))
    evidence = []
    notes = next((bytes(body) for name, body in sections if name == ".note.nv.tkinfo"), b"")  # a linker makes one
    options = [s.decode(errors="replace") for s in notes.split(b"\0") if s.startswith(b"-")]
    if b"nvJIT" in notes and any("-c" in opt.split() for opt in options):
        evidence.append("linked by the JIT linker from objects compiled with ptxas -c (relocatable)")
    if any("cuda_device_runtime" in name for name, _ in sections):
        evidence.append("links the CUDA device runtime")
    relocations = sorted({".rela.text.*" if name.startswith(".rela.text.") else name for name, _ in sections
                          if (name.startswith((".rela.", ".rel.")) and name != ".rela.debug_frame")
                          or name == ".nv.rel.action"})
    if relocations:
        evidence.append("keeps relocations (" + ", ".join(relocations[:3]) + (", ..." if len(relocations) > 3 else "")
                        + ")")
    return evidence


def kernel_names(cubin: bytes) -> list[str]:
    """The user functions of *cubin* that have code (``.text.<name>`` sections, without the device runtime's)."""
    names = [name[len(".text."):] for name, _ in _sections(bytes(cubin)) if name.startswith(".text.")]
    return [n for n in names if not n.startswith(("__nv_static_", "cudaCG", "cudaGetParameterBuffer"))]


class Seen:
    """What :func:`watch` has heard since it started: modules loaded, and those with relocatable device code
    (``(kernel names, evidence)`` each)."""

    def __init__(self):
        self.watching = False
        self.error = ""  # why watching could not start, if it could not
        self.loaded = 0
        self.relocatable: list[tuple[list[str], list[str]]] = []


_seen = Seen()
_lock = threading.Lock()
_watcher = None


def _on_loaded(module_id: int, cubin: bytes) -> None:
    evidence = relocatable_evidence(cubin)
    with _lock:
        _seen.loaded += 1
        if evidence:
            _seen.relocatable.append((kernel_names(cubin)[:3], evidence))


def watch() -> Seen:
    """Start hearing module loads for the rest of the process (once; later calls only return :func:`seen`)."""
    global _watcher
    with _lock:
        if _watcher is not None or _seen.error:
            return _seen
        try:
            from gpuscope.cupti.callbacks import ModuleWatcher

            _watcher = ModuleWatcher(_on_loaded)
            _seen.watching = True
        except Exception as exc:  # another CUPTI subscriber: the warning says the modules are unknown
            _seen.error = f"{type(exc).__name__}: {exc}"
    return _seen


def pause() -> bool:
    """Stop hearing module loads for a moment (CUPTI is detached meanwhile); whether :func:`resume` should
    start again."""
    global _watcher
    with _lock:
        watcher, _watcher = _watcher, None
    if watcher is None:
        return False
    watcher.close()
    return True


def resume() -> None:
    """Hear module loads again after :func:`pause` (those loaded meanwhile are not heard)."""
    watch()


def seen() -> Seen:
    """What has been heard so far (nothing if :func:`watch` never ran)."""
    return _seen
