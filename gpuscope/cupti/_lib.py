"""Find and load libcupti, and tell which CUPTI version it is.

Search order:

1. ``GPUSCOPE_CUPTI_LIB``: a path to ``libcupti.so.*`` or to the folder that holds it;
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
import sys
import threading

from ..errors import CuptiNotFoundError
from ._types import MIN_VERSION, Version

__all__ = ["CuptiLibrary", "load", "version_from_api", "driver_available"]

ENV_VAR = "GPUSCOPE_CUPTI_LIB"
_SONAMES = ("libcupti.so.13", "libcupti.so.12")
_NVPERF = ("libnvperf_host.so", "libnvperf_target.so")
_TOOLKIT_SUBDIRS = ("extras/CUPTI/lib64", "targets/x86_64-linux/lib", "targets/sbsa-linux/lib", "lib64", "lib")

INSTALL_HELP = (
    "Install CUPTI with gpuscope's extra that matches your driver: pip install 'gpuscope[cu13]' "
    "(CUDA 13 drivers) or 'gpuscope[cu12]' (CUDA 12 drivers); on a machine without a GPU use "
    "'gpuscope[offline]'. Or point GPUSCOPE_CUPTI_LIB at a libcupti.so from a CUDA toolkit "
    "(e.g. /usr/local/cuda/extras/CUPTI/lib64)."
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


def _candidates() -> list[tuple[str, str]]:
    """(path, found_via) pairs in search order, not yet loaded."""
    found: list[tuple[str, str]] = []
    override = os.environ.get(ENV_VAR)
    if override:
        if os.path.isdir(override):
            hits = [p for s in _SONAMES for p in sorted(glob.glob(os.path.join(override, s + "*")))]
            if not hits:
                raise CuptiNotFoundError(f"{ENV_VAR}={override} is a folder without libcupti.so.12/13 in it.")
            return [(hits[0], ENV_VAR)]
        if not os.path.exists(override):
            raise CuptiNotFoundError(f"{ENV_VAR}={override} does not exist.")
        return [(override, ENV_VAR)]
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
for n in ("libnvperf_host.so", "libnvperf_target.so"):
    p = os.path.join(d, n)
    if os.path.exists(p):
        ctypes.CDLL(p, mode=ctypes.RTLD_GLOBAL)
lib = ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL)
v = ctypes.c_uint32(0)
rc = lib.cuptiGetVersion(ctypes.byref(v))
print(rc, v.value)
"""


def _probe_version_in_child(path: str) -> int:
    """cuptiGetVersion in a child process: CUPTI 13.2+ without a driver crashes or fails at its first call.

    The child runs isolated (``python -I``): nothing in the current folder or ``PYTHON*`` variables is imported."""
    try:
        out = subprocess.run([sys.executable, "-I", "-c", _PROBE, path], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise CuptiNotFoundError(f"Could not probe CUPTI at {path}: {exc}") from None
    fields = out.stdout.split()
    if out.returncode != 0 or len(fields) != 2 or fields[0] != "0":
        raise CuptiNotFoundError(
            f"CUPTI at {path} does not work on this machine, which has no NVIDIA driver: CUPTI 13.2 and later "
            "load the driver even for offline metric queries (the probe "
            + (f"exited with status {out.returncode}" if out.returncode else f"got status {fields[:1]}")
            + "). For offline use install CUPTI 13.1, pip install 'gpuscope[offline]', or set "
            f"{ENV_VAR} to a CUPTI 12.6-13.1 library."
        )
    return int(fields[1])


def _open(path: str, found_via: str) -> CuptiLibrary:
    directory = os.path.dirname(path)
    for name in _NVPERF:
        nvperf = os.path.join(directory, name)
        if os.path.exists(nvperf):
            ctypes.CDLL(nvperf, mode=ctypes.RTLD_GLOBAL)
    # Without a driver, ask a child process first: CUPTI 13.2+ would crash this one.
    api_version = None if driver_available() else _probe_version_in_child(path)
    try:
        cdll = ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
    except OSError as exc:
        raise CuptiNotFoundError(f"Could not load CUPTI from {path}: {exc}. {INSTALL_HELP}") from None
    if api_version is None:
        api = ctypes.c_uint32(0)
        status = cdll.cuptiGetVersion(ctypes.byref(api))
        if status != 0:
            raise CuptiNotFoundError(f"cuptiGetVersion failed with status {status} for CUPTI at {path}. {INSTALL_HELP}")
        api_version = api.value
    version = version_from_api(api_version)
    if version < MIN_VERSION:
        raise CuptiNotFoundError(
            f"CUPTI at {path} is version %d.%d; gpuscope needs 12.6 or later (Range Profiler and Profiler Host "
            f"API). {INSTALL_HELP}" % version
        )
    return CuptiLibrary(path=path, found_via=found_via, api_version=api_version, version=version, cdll=cdll)


_lock = threading.Lock()
_loaded: CuptiLibrary | None = None


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
