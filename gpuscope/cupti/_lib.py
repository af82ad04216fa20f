"""Find and load libcupti, and tell which CUPTI version it is.

Search order:

1. ``GPUSCOPE_CUPTI_LIB``: a path to ``libcupti.so.*`` or to the folder that holds it, resolved once to one
   absolute path (a path with a ``/`` as it is, against the current folder if relative; a bare name where the
   dynamic loader finds it, as ``dlopen`` would) which is then probed and loaded;
2. ``cuda.pathfinder`` (pip wheels ``nvidia-cuda-cupti`` / ``nvidia-cuda-cupti-cu12``, conda, CUDA_HOME);
3. the CUDA toolkit folders under ``$CUDA_HOME``, ``$CUDA_PATH`` and ``/usr/local/cuda``.

libcupti ``dlopen``\\s ``libnvperf_host.so`` and ``libnvperf_target.so`` by bare name, which finds whatever the
loader's cache offers (often another CUDA version) and not the copies beside libcupti. So the two are loaded
first, ``RTLD_GLOBAL``, from libcupti's own folder; the later bare-name ``dlopen`` then reuses them.

CUPTI 13.2 and later try to load the driver at their first call, even for the host API, and crash or fail
where there is none. On a machine without a driver the version is therefore probed in a child process first.
"""

from __future__ import annotations

import ctypes
import dataclasses
import glob
import os
import subprocess
import threading

from gpuscope.cupti import _python
from gpuscope.cupti._types import MIN_VERSION, Version
from gpuscope.errors import CuptiNotFoundError, install_hint

__all__ = ["CuptiLibrary", "load", "version_from_api", "driver_available"]

ENV_VAR = "GPUSCOPE_CUPTI_LIB"
_SONAMES = ("libcupti.so.13", "libcupti.so.12")
_NVPERF = ("libnvperf_host.so", "libnvperf_target.so")
_TOOLKIT_SUBDIRS = ("extras/CUPTI/lib64", "targets/x86_64-linux/lib", "targets/sbsa-linux/lib", "lib64", "lib")

INSTALL_HELP = (
    "Install CUPTI with gpuscope's extra that matches your driver, cu13 (CUDA 13 drivers) or cu12 (CUDA 12 "
    f"drivers): {install_hint('cu13')}; on a machine without a GPU the extra is offline. Or point "
    "GPUSCOPE_CUPTI_LIB at a libcupti.so from a CUDA toolkit (e.g. /usr/local/cuda/extras/CUPTI/lib64)."
)


@dataclasses.dataclass(frozen=True)
class CuptiLibrary:
    """The loaded CUPTI: its path, how it was found, and its version."""

    path: str
    found_via: str
    api_version: int  # what cuptiGetVersion returns: 24..28 on 12.x, xxyyzz (130101) on 13.x
    version: Version  # (major, minor) of the CUDA release, e.g. (13, 1)
    cdll: ctypes.CDLL = dataclasses.field(repr=False, compare=False)

    @property
    def directory(self) -> str:
        return os.path.dirname(self.path)

    @property
    def version_string(self) -> str:
        return "%d.%d" % self.version

    def sibling(self, name: str) -> str:
        """Path of a library that ships beside libcupti (libcheckpoint.so, libpcsamplingutil.so)."""
        return os.path.join(self.directory, name)


def version_from_api(api_version: int) -> Version:
    """Map ``cuptiGetVersion``'s number to a CUDA release (major, minor).

    CUPTI 12.x returns its API version (24 in 12.6, 26 in 12.8, 28 in 12.9); 13.x returns xxyyzz.
    """
    if api_version >= 10000:
        return (api_version // 10000, (api_version // 100) % 100)
    table = {24: (12, 6), 25: (12, 7), 26: (12, 8), 27: (12, 8), 28: (12, 9)}
    if api_version in table:
        return table[api_version]
    return (12, 9) if api_version > 28 else (12, 5)


def driver_available() -> bool:
    """Whether the NVIDIA driver library can be loaded (through cuda.bindings; nothing is initialised)."""
    try:
        from cuda.bindings import driver

        err, _ = driver.cuDriverGetVersion()
        return int(err) == 0
    except Exception:
        return False


SET_HELP = (
    f"Set {ENV_VAR} to a libcupti.so.12 or libcupti.so.13 (CUPTI 12.6 or later) or to the folder that holds it, "
    "or unset it to use the CUPTI gpuscope finds itself."
)


def _override_error(value: str, problem: str) -> CuptiNotFoundError:
    return CuptiNotFoundError(f"{ENV_VAR}={value}: {problem}. {SET_HELP}")


_WHERE_LOADER_FINDS = r"""
import ctypes, ctypes.util, os, sys
try:
    lib = ctypes.CDLL(sys.argv[1])
except OSError as exc:
    print("noload", exc)
    raise SystemExit(0)
class LinkMap(ctypes.Structure):
    _fields_ = [("l_addr", ctypes.c_void_p), ("l_name", ctypes.c_char_p)]
libdl = ctypes.CDLL(None)
if not hasattr(libdl, "dlinfo"):  # glibc before 2.34
    libdl = ctypes.CDLL(ctypes.util.find_library("dl"))
link = ctypes.POINTER(LinkMap)()
if libdl.dlinfo(ctypes.c_void_p(lib._handle), 2, ctypes.byref(link)) != 0:  # RTLD_DI_LINKMAP
    print("noload dlinfo failed")
    raise SystemExit(0)
print("path", os.path.abspath(link.contents.l_name.decode()))
"""


def _loader_path(name: str) -> str:
    """The file the dynamic loader opens for the bare library name *name* (searched in a child process, which
    executes nothing from the current folder: loading a library runs its initialisers)."""
    try:
        out = subprocess.run([_python.interpreter(), "-I", "-c", _WHERE_LOADER_FINDS, name], capture_output=True,
                             text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise _override_error(name, f"could not ask the dynamic loader where it is ({exc})") from None
    kind, _, detail = out.stdout.strip().partition(" ")
    if out.returncode != 0 or kind not in ("path", "noload"):
        raise _override_error(name, f"loading it to see where it is crashed the probe (exit status {out.returncode})")
    if kind == "noload":
        raise _override_error(
            name,
            f"the dynamic loader does not find it ({detail}); a bare name is searched for as dlopen does "
            "(LD_LIBRARY_PATH, the loader's cache, the system folders), never in the current folder: give a path "
            "(./ for one there)",
        )
    return detail


def resolve_override(value: str) -> str:
    """The absolute path of the one library ``GPUSCOPE_CUPTI_LIB=value`` names; everything later (the version
    probe, the nvperf preload, the load) uses exactly this file.

    A folder: the libcupti.so.13 (else .12) in it. A path with a ``/`` (absolute, or relative to the current
    folder, ``./libcupti.so.13``): that file. A bare name (``libcupti.so.13``): the file ``dlopen`` opens for it
    (``LD_LIBRARY_PATH``, the loader's cache, the system folders), never one in the current folder, which
    ``dlopen`` does not search either.

    Raises
    ------
    CuptiNotFoundError
        The value names nothing, or a folder without libcupti; the message names the value and what to set.
    """
    if os.path.isdir(value):
        hits = [p for s in _SONAMES for p in sorted(glob.glob(os.path.join(value, s + "*")))]
        if not hits:
            raise _override_error(value, f"the folder {os.path.abspath(value)} has no libcupti.so.12/13 in it")
        return os.path.abspath(hits[0])
    if os.sep not in value:
        return _loader_path(value)
    if os.path.exists(value):
        return os.path.abspath(value)
    raise _override_error(value, f"{os.path.abspath(value)} does not exist")


def _candidates() -> list[tuple[str, str]]:
    """(path, found_via) pairs in search order, not yet loaded."""
    found: list[tuple[str, str]] = []
    override = os.environ.get(ENV_VAR)
    if override:
        return [(resolve_override(override), ENV_VAR)]
    for root in filter(None, (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda")):
        for sub in _TOOLKIT_SUBDIRS:
            for soname in _SONAMES:
                path = os.path.join(root, sub, soname)
                if os.path.exists(path):
                    found.append((os.path.realpath(path), "toolkit"))
    return found


def _pathfinder_path() -> tuple[str, str] | None:
    try:
        import cuda.pathfinder as pathfinder
    except ImportError:
        return None
    try:
        loaded = pathfinder.load_nvidia_dynamic_lib("cupti")
    except Exception:
        return None
    return loaded.abs_path, "cuda.pathfinder (%s)" % getattr(loaded, "found_via", "found")


_PROBE = r"""
import ctypes, os, sys
d = os.path.dirname(sys.argv[1])
try:
    for n in ("libnvperf_host.so", "libnvperf_target.so"):
        p = os.path.join(d, n)
        if os.path.exists(p):
            ctypes.CDLL(p, mode=ctypes.RTLD_GLOBAL)
    lib = ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)
except OSError as exc:
    print("noload", exc)
    raise SystemExit(0)
if not hasattr(lib, "cuptiGetVersion"):
    print("nosymbol")
    raise SystemExit(0)
print("calling", flush=True)  # a crash from here on is CUPTI's first call
v = ctypes.c_uint32(0)
rc = lib.cuptiGetVersion(ctypes.byref(v))
print(rc, v.value)
"""


def _not_cupti(path: str, found_via: str, problem: str) -> CuptiNotFoundError:
    """The error for a file that is not a working CUPTI library, saying what to set or install."""
    advice = SET_HELP if found_via == ENV_VAR else INSTALL_HELP
    origin = f" (from {ENV_VAR})" if found_via == ENV_VAR else f" (found via {found_via})"
    return CuptiNotFoundError(f"{path}{origin} {problem}. {advice}")


def _probe_version_in_child(path: str, found_via: str = "") -> int:
    """cuptiGetVersion in a child process: CUPTI 13.2+ without a driver crashes or fails at its first call.

    The child runs isolated (``python -I``): nothing in the current folder or ``PYTHON*`` variables is imported.
    Only a CUPTI library whose first call fails or crashes is reported as needing the driver; a file that does
    not load or is not CUPTI says so."""
    try:
        out = subprocess.run([_python.interpreter(), "-I", "-c", _PROBE, path], capture_output=True, text=True,
                             timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CuptiNotFoundError(f"Could not probe CUPTI at {path}: {exc}") from None
    lines = out.stdout.splitlines()
    first = lines[0].split(" ", 1) if lines else [""]
    if first[0] == "noload":
        raise _not_cupti(path, found_via, f"cannot be loaded as a library: {first[1] if len(first) > 1 else ''}")
    if first[0] == "nosymbol":
        raise _not_cupti(path, found_via, "is not a CUPTI library (it has no cuptiGetVersion)")
    fields = lines[1].split() if first[0] == "calling" and len(lines) > 1 else []
    if out.returncode != 0 or len(fields) != 2 or fields[0] != "0":
        if first[0] != "calling":  # the child died before reaching CUPTI: nothing says it is CUPTI's fault
            raise _not_cupti(path, found_via, f"could not be probed (the probe exited with status {out.returncode}: "
                             f"{out.stderr.strip()[-300:]})")
        raise CuptiNotFoundError(
            f"CUPTI at {path} does not work on this machine, which has no NVIDIA driver: CUPTI 13.2 and later "
            "load the driver even for offline metric queries (the probe "
            + (f"exited with status {out.returncode}" if out.returncode else f"got status {fields[:1]}")
            + f"). For offline use install CUPTI 13.1 with gpuscope's offline extra ({install_hint('offline')}), "
            f"or set {ENV_VAR} to a CUPTI 12.6-13.1 library."
        )
    return int(fields[1])


def _open(path: str, found_via: str) -> CuptiLibrary:
    directory = os.path.dirname(path)
    # Without a driver, ask a child process first: CUPTI 13.2+ would crash this one.
    api_version = None if driver_available() else _probe_version_in_child(path, found_via)
    try:
        for name in _NVPERF:
            nvperf = os.path.join(directory, name)
            if os.path.exists(nvperf):
                ctypes.CDLL(nvperf, mode=ctypes.RTLD_GLOBAL)
        cdll = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    except OSError as exc:
        raise _not_cupti(path, found_via, f"cannot be loaded as a library: {exc}") from None
    if not hasattr(cdll, "cuptiGetVersion"):
        raise _not_cupti(path, found_via, "is not a CUPTI library (it has no cuptiGetVersion)")
    if api_version is None:
        api = ctypes.c_uint32(0)
        status = cdll.cuptiGetVersion(ctypes.byref(api))
        if status != 0:
            raise _not_cupti(path, found_via, f"is not a working CUPTI: cuptiGetVersion failed with status {status}")
        api_version = api.value
    version = version_from_api(api_version)
    if version < MIN_VERSION:
        raise _not_cupti(path, found_via, "is CUPTI %d.%d; gpuscope needs 12.6 or later (Range Profiler and Profiler "
                         "Host API)" % version)
    return CuptiLibrary(path=path, found_via=found_via, api_version=api_version, version=version, cdll=cdll)


_lock = threading.Lock()  # held by load() while it loads
_soon_lock = threading.Lock()  # load_soon's own: a second load_soon must not wait for the loading under _lock
_loaded: CuptiLibrary | None = None
_loading: threading.Thread | None = None


def load_soon() -> None:
    """Start :func:`load` on a thread (once per process) and return at once: a session's first CUDA calls
    (``cuInit``, the primary context: 0.2 s on the H100) run while libcupti is found and loaded (0.17 s); the
    session's own :func:`load` then finds it loaded, or waits for the thread, or raises what loading raised."""
    global _loading
    with _soon_lock:
        if _loaded is not None or _loading is not None:
            return
        _loading = threading.Thread(target=_load_quietly, name="gpuscope-cupti-load", daemon=True)
        _loading.start()


def _load_quietly() -> None:
    try:
        load()
    except Exception:  # noqa: BLE001  the session's own load() raises it where the user sees it
        pass


def _forget_loading_in_child() -> None:  # a child forked while the thread held the lock has no such thread
    global _lock, _soon_lock, _loading
    _lock, _soon_lock, _loading = threading.Lock(), threading.Lock(), None


os.register_at_fork(after_in_child=_forget_loading_in_child)


def load() -> CuptiLibrary:
    """Load libcupti once per process (thread-safe) and return it.

    Raises
    ------
    CuptiNotFoundError
        No CUPTI was found, it cannot run here, or it is older than 12.6. The message says what to install.
    """
    global _loaded
    if _loaded is not None:
        return _loaded
    with _lock:
        if _loaded is not None:
            return _loaded
        candidates = _candidates()
        if not os.environ.get(ENV_VAR):
            from_pathfinder = _pathfinder_path()
            if from_pathfinder:
                candidates.insert(0, from_pathfinder)
        if not candidates:
            raise CuptiNotFoundError(f"CUPTI (libcupti.so) was not found. {INSTALL_HELP}")
        path, found_via = candidates[0]
        _loaded = _open(path, found_via)
        return _loaded
