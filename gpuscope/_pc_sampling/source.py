"""From PC samples to source: which cubin a PC belongs to, its file and line, and the function as written.

PC records name their cubin by CRC (``cuptiGetCubinCrc``) and their function by its mangled name. gpuscope
finds the cubins the way each library keeps them:

* **Numba**: a ``@cuda.jit`` dispatcher compiles one cubin per signature (``overload.library.get_cubin(cc)``).
  Dispatchers passed in ``kernels=`` are used, and module-level dispatchers are found from the mangled name
  (``<module>::<function>``) without being passed.
* **CuPy**: ``RawKernel``/``ElementwiseKernel`` binaries are kept in CuPy's kernel cache
  (``$CUPY_CACHE_DIR``, default ``~/.cupy/kernel_cache``), each file a hash followed by the cubin.
* Anything else: ``bytes`` of a cubin, or a path to one.

Lines come from ``cuptiGetSassToSourceCorrelation``, which needs the kernel compiled with line info
(``@cuda.jit(lineinfo=True)``, CuPy ``options=("-lineinfo",)``). Without it, a PC keeps its function and offset.

CUPTI keeps, per process, the first cubin it was given for a CRC, and ``cuptiGetCubinCrc`` leaves the symbol
names out: a second Numba compile of the same function (same code, a new ``[abi:v<n>]`` version tag in its
name) has the same CRC, and CUPTI then rejects the new name (``CUPTI_ERROR_INVALID_PARAMETER``) while still
answering for the first one (H100, CUPTI 13.0; ``probes/probe_pc_between.py --steps``). :class:`SourceMap`
then asks with the name that resolved first for that CRC, if it differs only in that tag.
"""

from __future__ import annotations

import dataclasses
import linecache
import os
import re
import sys
from collections.abc import Iterable

from gpuscope._schema.names import (
    demangle as pretty_function,  # the function as written: module.function, ns::kernel<float>
)
from gpuscope._schema.names import demangled_text as demangle  # as c++filt prints it
from gpuscope._schema.names import numba_path as _numba_path
from gpuscope.errors import CuptiError

__all__ = ["CubinRegistry", "SourceMap", "demangle", "pretty_function", "numba_cubins", "cupy_cache_cubins"]

_ELF_MAGIC = b"\x7fELF"


# ---------------------------------------------------------------------------------------------------------------
# Cubins


def _cubin_bytes(obj) -> bytes:
    code = getattr(obj, "code", None)  # cuda.core ObjectCode (what numba-cuda 0.30 returns): bytes or a path
    if code is not None and not isinstance(obj, (bytes, str)):
        obj = code
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return bytes(obj)
    if isinstance(obj, (str, os.PathLike)):
        with open(obj, "rb") as fh:
            return fh.read()
    raise TypeError(f"expected cubin bytes or a path, got {type(obj).__name__}")


def numba_cubins(dispatcher, cc: tuple[int, int] | None = None) -> list[bytes]:
    """The cubins a Numba ``@cuda.jit`` dispatcher compiled, one per signature (none before the first launch).

    Raises
    ------
    TypeError
        *dispatcher* is not a Numba CUDA kernel.
    """
    overloads = getattr(dispatcher, "overloads", None)
    if not isinstance(overloads, dict):
        raise TypeError(
            f"{dispatcher!r} is not a Numba @cuda.jit kernel (no .overloads); pass cubin bytes or a path instead"
        )
    cubins = []
    for overload in overloads.values():
        library = getattr(overload, "library", None)
        if library is None:
            continue
        cubins.append(_cubin_bytes(library.get_cubin(cc=cc) if cc else library.get_cubin()))
    return cubins


def cupy_cache_dir() -> str:
    """CuPy's on-disk kernel cache folder (``$CUPY_CACHE_DIR`` or ``~/.cupy/kernel_cache``)."""
    return os.environ.get("CUPY_CACHE_DIR") or os.path.expanduser(os.path.join("~", ".cupy", "kernel_cache"))


def cupy_cache_cubins(directory: str | None = None) -> list[bytes]:
    """The cubins in CuPy's kernel cache (each file: a hash, then the binary); files without an ELF are skipped."""
    directory = directory or cupy_cache_dir()
    cubins = []
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    for name in names:
        if not name.endswith(".cubin"):
            continue
        try:
            with open(os.path.join(directory, name), "rb") as fh:
                data = fh.read()
        except OSError:
            continue
        at = data.find(_ELF_MAGIC)
        if 0 <= at <= 128:  # the prefix is a hex digest
            cubins.append(data[at:])
    return cubins


def _as_loaded(cubins: list[bytes]) -> list[bytes]:
    """Each cached cubin as the cache holds it and as CuPy loads it, with one NUL more: the module the driver loaded
    (CUPTI's module callback) was the cached cubin and a trailing NUL byte, so the CRC PC samples and SASS records
    carry is the longer one's (H100, CuPy 14.2, CUDA 13.0; ``cuModuleLoadData`` takes the image as a string)."""
    return [c for cubin in cubins for c in (cubin, cubin + b"\0")]


def _is_numba_dispatcher(obj) -> bool:
    return isinstance(getattr(obj, "overloads", None), dict) and hasattr(obj, "targetoptions")


def _numba_dispatcher_for(function: str):
    """The module-level Numba dispatcher a mangled kernel name points at (``cudapy::pkg::mod::fn``), if loaded."""
    path = _numba_path(function)
    if len(path) < 2:
        return None
    for split in range(len(path) - 1, 0, -1):
        module = sys.modules.get(".".join(path[:split]))
        if module is None:
            continue
        obj = module
        for attr in path[split:]:
            obj = getattr(obj, attr, None)
        if obj is not None and _is_numba_dispatcher(obj):
            return obj
    return None


class CubinRegistry:
    """Cubins by CRC, filled from Numba dispatchers, CuPy's cache, bytes or paths, and looked up by CRC.

    ``crc`` is a function ``bytes -> int`` (``cuptiGetCubinCrc``); tests can pass another.
    """

    def __init__(self, crc=None):
        if crc is None:
            from gpuscope.cupti.pc_sampling import cubin_crc as crc
        self._crc = crc
        self._cubins: dict[int, bytes] = {}
        self._cupy_scanned = False
        self._dispatchers_seen: set[int] = set()

    def __len__(self) -> int:
        return len(self._cubins)

    def __contains__(self, crc: int) -> bool:
        return int(crc) in self._cubins

    def add(self, obj) -> list[int]:
        """Add cubin bytes, a path, a Numba dispatcher or a CuPy kernel; returns the CRCs added.

        Raises
        ------
        TypeError
            *obj* is none of those.
        """
        if _is_numba_dispatcher(obj):
            self._dispatchers_seen.add(id(obj))
            cubins = numba_cubins(obj)
        elif type(obj).__module__.startswith("cupy"):
            cubins = _as_loaded(cupy_cache_cubins())  # CuPy keeps no handle on the binary; its cache does
            self._cupy_scanned = True
        else:
            cubins = [_cubin_bytes(obj)]
        crcs = []
        for cubin in cubins:
            crc = int(self._crc(cubin))
            self._cubins[crc] = cubin
            crcs.append(crc)
        return crcs

    def get(self, crc: int, function: str = "") -> bytes | None:
        """The cubin with this CRC; looks for the Numba dispatcher named by *function*, then CuPy's cache."""
        crc = int(crc)
        if crc in self._cubins:
            return self._cubins[crc]
        dispatcher = _numba_dispatcher_for(function) if function else None
        if dispatcher is not None and id(dispatcher) not in self._dispatchers_seen:
            self.add(dispatcher)
        if crc not in self._cubins and not self._cupy_scanned:
            self._cupy_scanned = True
            for cubin in _as_loaded(cupy_cache_cubins()):
                self._cubins.setdefault(int(self._crc(cubin)), cubin)
        return self._cubins.get(crc)

    def items(self) -> Iterable[tuple[int, bytes]]:
        return self._cubins.items()


# ---------------------------------------------------------------------------------------------------------------
# PCs to lines


@dataclasses.dataclass(frozen=True)
class Location:
    """Source of one PC: ``file`` is the full path ("" when unknown), ``line`` 0 when unknown."""

    file: str
    line: int
    text: str

    @property
    def known(self) -> bool:
        return self.line > 0


_UNKNOWN = Location("", 0, "")

# CRC -> function names cuptiGetSassToSourceCorrelation resolved in this process (CUPTI's own cache is per CRC)
_resolved: dict[int, set[str]] = {}
_VERSION_TAG = re.compile(r"B(\d+)v(\d+)")


def _without_version_tag(name: str) -> str:
    """A Numba mangled name without its ``[abi:v<n>]`` tag (``B2v3``), which changes with every compile."""
    return _VERSION_TAG.sub(lambda m: "" if int(m.group(1)) == 1 + len(m.group(2)) else m.group(0), name)


def _aliases(crc: int, function: str) -> list[str]:
    """Names CUPTI resolved before for this CRC that are *function* but for Numba's version tag."""
    bare = _without_version_tag(function)
    return sorted(n for n in _resolved.get(crc, ()) if n != function and _without_version_tag(n) == bare)


class SourceMap:
    """Maps (cubin CRC, mangled function, PC offset) to file, line and the line's text, with caching.

    ``lookup`` is ``(cubin, function, pc_offset) -> (line, file, directory)`` (``cuptiGetSassToSourceCorrelation``);
    ``sources`` maps a file name (full path or base name) to its text, for sources that are not on disk here
    (CuPy kernels compiled from strings, recordings made on another machine).
    """

    def __init__(self, registry: CubinRegistry, lookup=None, sources: dict[str, str] | None = None):
        if lookup is None:
            from gpuscope.cupti.pc_sampling import sass_to_source

            def lookup(cubin, function, pc_offset):
                loc = sass_to_source(cubin, function, pc_offset)
                return loc.line, loc.file, loc.directory

        self.registry = registry
        self._lookup = lookup
        self._sources = {k: v.splitlines() for k, v in (sources or {}).items()}
        self._cache: dict[tuple[int, str, int], Location] = {}
        #: mangled names of functions whose cubin was found but has no line info
        self.without_lineinfo: set[str] = set()
        #: mangled names of functions whose cubin was not found
        self.without_cubin: set[str] = set()

    def _line_text(self, path: str, line: int) -> str:
        for key in (path, os.path.basename(path)):
            if key in self._sources:
                lines = self._sources[key]
                return lines[line - 1].strip() if 0 < line <= len(lines) else ""
        return linecache.getline(path, line).strip()

    def _resolve(self, cubin: bytes, crc: int, function: str, pc_offset: int) -> tuple[int, str, str]:
        for name in (function, *_aliases(crc, function)):
            try:
                found = self._lookup(cubin, name, pc_offset)
            except CuptiError:
                continue
            _resolved.setdefault(crc, set()).add(name)
            return found
        return 0, "", ""

    def locate(self, crc: int, function: str, pc_offset: int) -> Location:
        key = (int(crc), function, int(pc_offset))
        if key in self._cache:
            return self._cache[key]
        cubin = self.registry.get(crc, function)
        loc = _UNKNOWN
        if cubin is None:
            self.without_cubin.add(function)
        else:
            line, file, directory = self._resolve(cubin, int(crc), function, int(pc_offset))
            if line > 0 and file:
                path = file if os.path.isabs(file) or not directory else os.path.join(directory, file)
                loc = Location(path, int(line), self._line_text(path, int(line)))
            else:
                self.without_lineinfo.add(function)
        self._cache[key] = loc
        return loc
