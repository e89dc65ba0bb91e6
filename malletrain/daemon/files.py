"""Opening a file a user named, as that user could (SECURITY.md).

The daemon may run with more rights than the job's owner, so a progress
file is opened only if the owner could have read it themselves:

* the path is absolute, normalised and below one of the configured roots;
* every directory on the way is opened with ``O_NOFOLLOW`` relative to its
  parent (no symlink anywhere in the path is followed) and must be
  searchable by the owner (mode bits for the owner's uid and groups);
* the file itself must be a regular file, owned by the owner and readable by
  them, as ``lstat`` relative to its directory says *before* it is opened (a
  file that is not the owner's is never opened); it is then opened
  ``O_NOFOLLOW | O_NONBLOCK`` (a FIFO swapped in cannot block the loop) and
  must be the same file (device, inode) with the same properties.

Anything else raises :class:`Refused` with the reason; the caller logs it
and counts it for that job.
"""
from __future__ import annotations

import os
import pwd
import stat
from collections.abc import Sequence
from functools import lru_cache


class Refused(Exception):
    """The file is not one the job's owner could read (or not a plain file)."""


# Directories are walked with O_PATH: entering one needs search (x) permission only, as for
# the owner, so an unprivileged daemon reads files below 0711 homes (read on a directory
# would let it list them, which it never needs).
_DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


@lru_cache(maxsize=4096)
def groups_of(uid: int) -> frozenset[int]:
    """The uid's primary and supplementary groups (empty when the uid is unknown)."""
    try:
        pw = pwd.getpwuid(uid)
    except KeyError:
        return frozenset()
    return frozenset(os.getgrouplist(pw.pw_name, pw.pw_gid))


def _allowed(info: os.stat_result, uid: int, groups: frozenset[int], bits: tuple[int, int, int]) -> bool:
    """Could ``uid`` do what ``bits`` (owner, group, other) grant?  Root (uid 0) can."""
    if uid == 0:
        return True
    if info.st_uid == uid:
        return bool(info.st_mode & bits[0])
    if info.st_gid in groups:
        return bool(info.st_mode & bits[1])
    return bool(info.st_mode & bits[2])


def under_roots(path: str, roots: Sequence[str]) -> bool:
    if not path.startswith("/") or os.path.normpath(path) != path:
        return False
    return any(root == "/" or path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def open_as_owner(path: str, uid: int, roots: Sequence[str]) -> int:
    """A read-only descriptor of ``path``, opened as described above (the caller closes it)."""
    if "\0" in path or not under_roots(path, roots):
        raise Refused("not an absolute, normalised path below the configured progress_roots")
    groups = groups_of(uid)
    parts = path.strip("/").split("/")
    fd = os.open("/", _DIR_FLAGS)
    try:
        for i, name in enumerate(parts):
            info = os.fstat(fd)
            if not _allowed(info, uid, groups, (stat.S_IXUSR, stat.S_IXGRP, stat.S_IXOTH)):
                raise Refused(f"the owner cannot enter /{'/'.join(parts[:i])}")
            last = i == len(parts) - 1
            if last:            # look before opening: a file that is not the owner's is never opened
                try:
                    seen = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except FileNotFoundError:
                    raise
                except OSError as exc:
                    raise Refused(f"{path}: {exc.strerror}") from None
                _check_file(seen, uid)
            try:
                nxt = os.open(name, _FILE_FLAGS if last else _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                raise
            except OSError as exc:   # ELOOP: a symlink; ENOTDIR; EACCES
                raise Refused(f"/{'/'.join(parts[:i + 1])}: {exc.strerror}") from None
            os.close(fd)
            fd = nxt
        info = os.fstat(fd)
        _check_file(info, uid)
        if (info.st_dev, info.st_ino) != (seen.st_dev, seen.st_ino):
            raise Refused("replaced while being opened")
        out, fd = fd, -1
        return out
    finally:
        if fd >= 0:
            os.close(fd)


def _check_file(info: os.stat_result, uid: int) -> None:
    if not stat.S_ISREG(info.st_mode):
        raise Refused("not a regular file")
    if info.st_uid != uid:
        raise Refused(f"owned by uid {info.st_uid}, not by the job's owner (uid {uid})")
    if not info.st_mode & stat.S_IRUSR:
        raise Refused("not readable by its owner")
