"""Output files, every one written the same way: never through a link, never over anything but a regular file,
complete or not at all, and replaced only where the caller allows it.

``gpuscope run -o``/``--trace``, ``show``/``compare --csv``, ``demo``'s files, :func:`gpuscope.save_dataset` and
:func:`gpuscope.to_perfetto` all write through :func:`write` (docs/reliability.md, "Output files"). The content is
written to a new file beside the target (``O_EXCL``: never someone else's file), flushed to disk, then renamed over
the target (``os.replace``: the name is replaced, a link there is never followed), or, where the caller does not
allow replacing, linked to the target's name (``os.link`` fails when anything is there, a dangling link included),
so that of several processes writing one new name, one wins and the others are told.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
import warnings

from gpuscope.errors import GpuscopeWarning

__all__ = ["check", "write", "write_bytes"]

#: What a non-regular file at an output path is called in the error.
_KINDS = ((stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"), (stat.S_ISFIFO, "named pipe (FIFO)"),
          (stat.S_ISSOCK, "socket"))

#: errno values of a file system that cannot make a hard link (FAT, some network file systems)
_NO_HARD_LINKS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK, errno.ENOSYS}


def check(path, *, overwrite: bool = True, hint: str = "") -> str:
    """The absolute path of *path* as an output file, refused before anything is written where it cannot be one.

    Resolve output paths with it once, before a program that may change the current folder runs (``gpuscope run``).
    Nothing is created. Links in the folders above the file are followed (``/tmp`` may be one); a link at the
    file's own name is not.

    Parameters
    ----------
    path : str or PathLike
    overwrite : bool
        Whether an existing regular file may be replaced.
    hint : str
        Added to the error for a file that exists (e.g. "pass -f/--force to replace it").

    Raises
    ------
    OSError
        *path* is a symbolic link (``ELOOP``; dangling or not), a folder (:class:`IsADirectoryError`), a device,
        FIFO or socket (``EINVAL``), a file that exists while *overwrite* is false (:class:`FileExistsError`), or
        its folder is missing (:class:`FileNotFoundError`) or not writable (:class:`PermissionError`). The error's
        ``filename`` is *path* as given and its ``strerror`` says what to do.
    """
    target = os.path.abspath(os.fspath(path))
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        st = None
    except NotADirectoryError:  # a file where a folder of the path should be
        raise NotADirectoryError(errno.ENOTDIR, "a part of its folder is a file", os.fspath(path)) from None
    if st is not None:
        if stat.S_ISLNK(st.st_mode):
            raise OSError(errno.ELOOP, f"it is a symbolic link (to {os.readlink(target)}): gpuscope writes no file "
                                       "through a link; give the path it points to, or remove the link",
                          os.fspath(path))
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(errno.EISDIR, "it is a folder: give a file name in it", os.fspath(path))
        kind = next((name for test, name in _KINDS if test(st.st_mode)), None)
        if kind is not None:
            raise OSError(errno.EINVAL, f"it is a {kind}, not a regular file: gpuscope replaces only regular files; "
                                        "give the path of a file", os.fspath(path))
        if not overwrite:
            raise FileExistsError(errno.EEXIST, "it exists, and gpuscope does not overwrite it"
                                  + (f": {hint}" if hint else ""), os.fspath(path))
    folder = os.path.dirname(target)
    if not os.path.isdir(folder):
        raise FileNotFoundError(errno.ENOENT, f"its folder {folder} does not exist", os.fspath(path))
    if not os.access(folder, os.W_OK | os.X_OK):
        raise PermissionError(errno.EACCES, f"its folder {folder} is not writable", os.fspath(path))
    return target


def write(path, fill, *, overwrite: bool = True, hint: str = "") -> str:
    """Write a file with ``fill(tmp)``, which writes the whole content to the path *tmp* it is given; return the
    absolute path written.

    The file is complete or not there: ``fill`` writes a new file beside *path*, which is flushed to disk and then
    renamed to *path*; a ``fill`` that raises (a full disk, Ctrl-C) leaves what was at *path* as it was, and no
    temporary file. A regular file already at *path* (*overwrite*) is replaced by one with its mode (the new one is
    readable by its owner only while it is written) and, as far as this process may give them, its owner and
    group; a new file gets 0o666 less the umask. Without *overwrite* the new file takes the name only where nothing
    is there at the end either (another process may have made it meanwhile). A file with other hard links is
    replaced under this name only, with a :class:`~gpuscope.errors.GpuscopeWarning`.

    Raises
    ------
    OSError
        See :func:`check` (checked first, and again before the rename); :class:`FileExistsError` where, without
        *overwrite*, something took the name while the content was written; whatever ``fill`` raises.
    """
    target = check(path, overwrite=overwrite, hint=hint)
    folder, name = os.path.split(target)
    try:
        old = os.stat(target)
    except FileNotFoundError:
        old = None
    tmp = os.path.join(folder, f".{name}.{secrets.token_hex(8)}.tmp")
    try:
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                         0o666 if old is None else 0o600))
    except OSError as exc:  # a full or read-only folder: said of the path asked for
        raise type(exc)(exc.errno, exc.strerror, os.fspath(path)) from None
    try:
        try:
            fill(tmp)
        except OSError as exc:  # a full disk: said of the path asked for, not of the temporary file
            if exc.errno is None or exc.filename not in (None, tmp):
                raise
            raise type(exc)(exc.errno, exc.strerror, os.fspath(path)) from None
        if old is not None:
            _take_owner_and_mode(tmp, old)
        _fsync(tmp)
        if overwrite:
            check(path, overwrite=True)  # a link or a device put there meanwhile is not replaced
            os.replace(tmp, target)
        else:
            _link_new(tmp, target, path, hint)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    try:
        _fsync(folder)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):  # a file system that cannot flush a folder
            raise
    if old is not None and old.st_nlink > 1:
        warnings.warn(f"{os.fspath(path)} had {old.st_nlink - 1} other hard link(s): they keep the old contents, "
                      "since gpuscope writes a new file and renames it over this name (so that a failed write never "
                      "leaves a damaged file).", GpuscopeWarning, stacklevel=3)
    return target


def write_bytes(path, data, *, overwrite: bool = True, hint: str = "") -> str:
    """:func:`write` of *data* (bytes or a buffer)."""

    def fill(tmp: str) -> None:
        with open(os.open(tmp, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC), "wb") as f:
            f.write(data)

    return write(path, fill, overwrite=overwrite, hint=hint)


def _link_new(tmp: str, target: str, path, hint: str) -> None:
    """Give *tmp*'s file the name *target* only where nothing is there (``os.link`` fails then), then drop *tmp*."""
    try:
        try:
            os.link(tmp, target)
        except OSError as exc:
            if isinstance(exc, FileExistsError) or exc.errno not in _NO_HARD_LINKS:
                raise
            # no hard links on this file system: the name is taken by an empty file made exclusively, then replaced
            os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))
            os.replace(tmp, target)
            return
    except FileExistsError:
        raise FileExistsError(errno.EEXIST, "it was made by something else while this one was written, and gpuscope "
                              "does not overwrite it" + (f": {hint}" if hint else ""), os.fspath(path)) from None
    os.unlink(tmp)


def _take_owner_and_mode(tmp: str, old: os.stat_result) -> None:
    """Give *tmp* the owner, group and mode of the file it replaces: the owner only as root, the group where it is
    one of this process's, the mode always."""
    try:
        os.chown(tmp, old.st_uid, old.st_gid)
    except PermissionError:  # not root: the owner stays this process's user
        try:
            os.chown(tmp, -1, old.st_gid)
        except PermissionError:  # not one of this process's groups
            pass
    os.chmod(tmp, stat.S_IMODE(old.st_mode))  # after chown, which may clear set-id bits


def _fsync(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
