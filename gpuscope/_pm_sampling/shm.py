"""Shared memory for counter-data images that worker processes read: reserved up front, never left behind.

Each image is an anonymous shared file: a ``memfd`` (Linux), or, where ``GPUSCOPE_SHM_DIR`` names a folder, a file
made there and unlinked at once. Either way it has no name once made, so nothing outlives the process however it
ends (SIGKILL, SIGTERM, a crash), and workers receive the open descriptors over their socket.

Every byte is reserved with ``posix_fallocate`` before it is mapped. A sparse file in a full tmpfs (Docker gives
``/dev/shm`` 64 MiB) kills the process with SIGBUS at the first write to a page that cannot be backed; a reserved
one cannot. Images are made while memory is available (at most half of what the folder or the machine has free) and
reservation succeeds; the caller gets fewer images than it asked for, with the reason, rather than an error.
"""

from __future__ import annotations

import errno
import mmap
import os
import tempfile

import numpy as np

__all__ = ["ENV_VAR", "SharedImage", "available_bytes", "reserve_images", "close_images"]

#: Environment variable naming a folder for the image files instead of anonymous memfds.
ENV_VAR = "GPUSCOPE_SHM_DIR"

#: Share of the available memory the images may take.
SHARE = 0.5


class SharedImage:
    """One reserved, mapped image: ``fd`` (to pass to workers), ``array`` (a writable uint8 view)."""

    def __init__(self, fd: int, size: int):
        self.fd = fd
        self.size = size
        self._map = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        self.array = np.frombuffer(self._map, dtype=np.uint8)

    def close_fd(self) -> None:
        """Close the descriptor (the mapping stays valid)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def close(self) -> None:
        """Close the descriptor and let go of the mapping: it is unmapped once no array made from :attr:`array` is
        left (unmapping earlier would leave such arrays pointing at nothing)."""
        self.close_fd()
        self.array = self._map = None


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _cgroup_available() -> int | None:
    """Memory this process's cgroup (v2) may still use, or None if it has no limit or none can be read."""
    try:
        with open("/proc/self/cgroup") as f:
            path = next((line.split(":", 2)[2].strip() for line in f if line.startswith("0::")), None)
        if path is None:
            return None
        folder = os.path.join("/sys/fs/cgroup", path.lstrip("/"))
        with open(os.path.join(folder, "memory.max")) as f:
            limit = f.read().strip()
        if limit == "max":
            return None
        with open(os.path.join(folder, "memory.current")) as f:
            return max(0, int(limit) - int(f.read().strip()))
    except (OSError, ValueError, StopIteration):
        return None


def available_bytes(folder: str | None) -> int | None:
    """Bytes that images may still take: free space in *folder* (``statvfs``), or for memfds (*folder* None) the
    machine's available memory and the cgroup's headroom, whichever is smaller; None if unknown."""
    if folder is not None:
        st = os.statvfs(folder)
        return st.f_bavail * st.f_frsize
    known = [v for v in (_meminfo_available(), _cgroup_available()) if v is not None]
    return min(known) if known else None


def _new_fd(folder: str | None) -> int:
    if folder is None:
        return os.memfd_create("gpuscope-pm-image", os.MFD_CLOEXEC)
    fd, path = tempfile.mkstemp(prefix="gpuscope-pm-", dir=folder)
    os.unlink(path)  # nameless from now on: nothing to clean up, whatever happens to the process
    return fd


def _check_folder(folder: str) -> None:
    """Raise, naming :data:`ENV_VAR` and what to do, unless *folder* is a folder this process may make files in."""
    named = f"{ENV_VAR} names {folder!r}"
    unset = f"or unset {ENV_VAR} to keep the images in anonymous shared memory"
    if not os.path.exists(folder):
        raise FileNotFoundError(f"{named}, which does not exist: create it, name another folder, {unset}")
    if not os.path.isdir(folder):
        raise NotADirectoryError(f"{named}, which is not a folder: name a folder, {unset}")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise PermissionError(f"{named}, where this user may not make files: name another folder, {unset}")


def reserve_images(count: int, size: int, folder: str | None = None) -> tuple[list[SharedImage], str]:
    """Make up to *count* reserved shared images of *size* bytes.

    Parameters
    ----------
    count, size
        Images wanted and bytes each.
    folder
        Where to make them (None: ``$GPUSCOPE_SHM_DIR`` if set, else anonymous memfds).

    Raises
    ------
    FileNotFoundError, NotADirectoryError, PermissionError
        ``$GPUSCOPE_SHM_DIR`` is missing, not a folder, or not writable: the message names it and what to do.

    Returns
    -------
    images, note
        The images made (maybe fewer than *count*, maybe none) and, if fewer, why ("" otherwise).
    """
    if folder is None:
        folder = os.environ.get(ENV_VAR) or None
        if folder is not None:
            _check_folder(folder)
    if folder is None and not hasattr(os, "memfd_create"):
        folder = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    where = folder or "anonymous shared memory"
    available = available_bytes(folder)
    fit = count if available is None else min(count, int(available * SHARE) // max(size, 1))
    note = ""
    if fit < count:
        note = (f"{where} has {available / 2**20:.0f} MiB free; {count} counter-data images of {size / 2**20:.1f} MiB "
                f"would take {count * size / 2**20:.0f} MiB, so the pool has {fit}")
    images: list[SharedImage] = []
    try:
        for _ in range(fit):
            fd = _new_fd(folder)
            try:
                os.posix_fallocate(fd, 0, size)
            except OSError as exc:
                os.close(fd)
                if exc.errno not in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG, errno.EDQUOT):
                    raise
                note = f"reserving {size / 2**20:.1f} MiB in {where} failed ({exc.strerror}) after {len(images)} images"
                break
            try:
                images.append(SharedImage(fd, size))
            except BaseException:
                os.close(fd)
                raise
    except BaseException:
        close_images(images)
        raise
    return images, note


def close_images(images) -> None:
    """Close the images' descriptors and let go of their mappings (safe twice); their memory goes once no array in
    this process and no other process maps it."""
    for image in images:
        image.close()
