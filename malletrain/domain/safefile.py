"""Writing files under names others may predict, in directories others may share.

A teammate who can write a directory can plant a symlink (or a FIFO, or a hard link)
under the name a writer is about to open, and so redirect the write to any file the
writer may change.  These helpers never follow a symlink at the last component
(``O_NOFOLLOW``), create new files with ``O_EXCL`` (under a random name when the name
is a temporary one), check what they opened with ``fstat``, and set the mode they
want whatever the umask.
"""
from __future__ import annotations

import os
import secrets
import stat

_W = os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafeFile(OSError):
    """The name is taken by something the caller must not write: not a regular file of its
    own with one link (a symlink, FIFO, device, another user's file, a hard link)."""


def create_exclusive(path: str, mode: int) -> int:
    """A new file at ``path`` (``O_EXCL``: never an existing file or symlink), mode ``mode``."""
    fd = os.open(path, _W | os.O_CREAT | os.O_EXCL, mode)
    os.fchmod(fd, mode)
    return fd


def write_atomic(path: str, data: bytes, mode: int = 0o600) -> None:
    """Replace ``path`` with ``data``: written to a new file of random name beside it
    (``O_EXCL``, ``mode``), fsynced, then renamed over ``path`` (a rename replaces a
    symlink there, it does not follow it)."""
    directory, base = os.path.split(path)
    tmp = os.path.join(directory, f".{base}.tmp.{secrets.token_hex(8)}")
    fd = create_exclusive(tmp, mode)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def open_append(path: str, mode: int = 0o644) -> int:
    """A descriptor appending to ``path``: created ``O_EXCL`` when absent, else opened without
    following a symlink and only if it is a regular file of the caller's with one link;
    set to ``mode`` either way (so a umask of 002 does not leave it group-writable)."""
    try:
        fd = os.open(path, _W | os.O_APPEND | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        fd = _open_existing(path)
    os.fchmod(fd, mode)
    return fd


def _open_existing(path: str) -> int:
    try:   # O_NONBLOCK: a FIFO planted there must not block the open
        fd = os.open(path, _W | os.O_APPEND | os.O_NONBLOCK)
    except OSError as exc:
        raise UnsafeFile(exc.errno, f"not opened (a symlink or FIFO?): {exc.strerror}", path) from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_nlink != 1:
        os.close(fd)
        raise UnsafeFile(0, "not a regular file of yours with one link: not written", path)
    return fd


def writable_by_others(info: os.stat_result) -> bool:
    """True when someone other than the owner may create or replace names in a directory."""
    return bool(info.st_mode & (stat.S_IWGRP | stat.S_IWOTH))
