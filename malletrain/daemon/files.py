"""Opening a file a user named, as that user could (SECURITY.md).

The daemon may run with more rights than the job's owner, so a progress
file is opened only if the owner could have read it themselves:

* the path is absolute, normalised and below one of the configured roots;
* every directory on the way is opened with ``O_NOFOLLOW`` relative to its
  parent (no symlink anywhere in the path is followed) and must be
  searchable by the owner (mode bits for the owner's uid and groups);
* only the owner (or root) can have put the file there: the configured root
  it lies below and every directory below that must be owned by the owner or
  root and not writable by group or others, unless sticky (``/tmp``: then
  only the owner of an entry can rename or remove it, and every entry on the
  path is the owner's or root's);
* the file itself must be a regular file, owned by the owner, readable by
  them and writable by nobody else (no group or other write bit; a POSIX ACL
  granting anyone write shows as the group write bit), as ``lstat``
  relative to its directory says *before* it is opened (a file that is not
  the owner's is never opened); it is then opened ``O_NOFOLLOW | O_NONBLOCK``
  (a FIFO swapped in cannot block the loop) and must be the same file
  (device, inode) with the same properties.

Anything else raises :class:`Refused` with the reason; the caller logs it
and counts it for that job.
"""
from __future__ import annotations

import os
import pwd
import queue
import stat
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import TypeVar


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
    return _root_depth(path, roots) is not None


def _root_depth(path: str, roots: Sequence[str]) -> int | None:
    """How many path components the deepest configured root ``path`` lies below has (0 for
    ``/``); None when ``path`` is not absolute and normalised below one."""
    if not path.startswith("/") or os.path.normpath(path) != path:
        return None
    depths = [len([c for c in root.split("/") if c]) for root in roots
              if root == "/" or path == root or path.startswith(root.rstrip("/") + "/")]
    return max(depths) if depths else None


_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH


def _shared_dir(info: os.stat_result, uid: int) -> str:
    """Why someone other than ``uid`` (or root) could replace what this directory holds; ''."""
    if info.st_uid not in (uid, 0):
        return f"is owned by uid {info.st_uid}, who could replace what it holds"
    if info.st_mode & _OTHERS_WRITE and not info.st_mode & stat.S_ISVTX:
        return "is writable by others than its owner (and not sticky): they could replace what it holds"
    return ""


def open_as_owner(path: str, uid: int, roots: Sequence[str]) -> int:
    """A read-only descriptor of ``path``, opened as described above (the caller closes it)."""
    depth = None if "\0" in path else _root_depth(path, roots)
    if depth is None:
        raise Refused("not an absolute, normalised path below the configured progress_roots")
    groups = groups_of(uid)
    parts = path.strip("/").split("/")
    fd = os.open("/", _DIR_FLAGS)
    try:
        for i, name in enumerate(parts):
            info = os.fstat(fd)
            if not _allowed(info, uid, groups, (stat.S_IXUSR, stat.S_IXGRP, stat.S_IXOTH)):
                raise Refused(f"the owner cannot enter /{'/'.join(parts[:i])}")
            why = _shared_dir(info, uid) if i >= depth else ""   # the root and every directory below it
            if why:
                raise Refused(f"/{'/'.join(parts[:i])} {why}")
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
    if info.st_mode & _OTHERS_WRITE:
        raise Refused("writable by others than its owner (group or other write bit): not the owner's word")


# ------------------------------------------------------------------ user-path I/O with a deadline

class TimedOut(Exception):
    """A user-path operation did not return within its deadline (a hung NFS, FUSE or autofs
    mount); it goes on in its worker thread, which is abandoned."""


class Hanging(Exception):
    """A user-path operation not started: an earlier one on the same path still hangs (or
    timed out moments ago), its owner has too many hanging, or too many hang overall."""


T = TypeVar("T")


class _Task:
    __slots__ = ("fn", "done", "finished", "abandoned", "result", "error", "key", "owner")

    def __init__(self, fn: Callable[[], object], key: str, owner: int) -> None:
        self.fn, self.key, self.owner = fn, key, owner
        self.done = threading.Event()
        self.finished = self.abandoned = False
        self.result: object = None
        self.error: BaseException | None = None


class PathWorkers:
    """Runs operations on user-named paths (``lstat``, ``open``, ``read``) in a worker thread and
    waits for each at most its deadline, so a path whose file system hangs cannot block the
    daemon's loop.

    A call that runs past its deadline raises :class:`TimedOut`; its worker is abandoned (a
    thread stuck in the kernel cannot be killed: it ends by itself if the call ever returns, its
    result thrown away) and the next call gets a fresh worker.  While an abandoned call on a
    path still hangs, and for ``retry_after_s`` (doubling per timeout, at most
    ``max_retry_after_s``) after it timed out, that path is not tried again (:class:`Hanging`):
    one stuck thread per path at most, no retry every cycle.  Stuck threads are bounded: at most
    ``max_stuck_per_owner`` per owner (one user's hanging mount cannot take the others' reads)
    and ``max_stuck`` in all; beyond, calls are not started (:class:`Hanging`) until some
    return.  So the daemon holds at most ``max_stuck + 1`` of these threads.
    """

    def __init__(self, *, max_stuck: int = 16, max_stuck_per_owner: int = 2, retry_after_s: float = 30.0,
                 max_retry_after_s: float = 480.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_stuck = max_stuck
        self.max_stuck_per_owner = max_stuck_per_owner
        self.retry_after_s = retry_after_s
        self.max_retry_after_s = max_retry_after_s
        self.clock = clock
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[_Task] | None = None     # the current worker's
        self._stuck: dict[str, int] = {}                        # path -> owner, of abandoned calls
        self._owners: Counter[int] = Counter()                   # owner -> abandoned calls
        self._later: dict[str, tuple[float, int]] = {}          # path -> (retry after, timeouts)
        self.timed_out = 0       # calls that ran past their deadline
        self.not_started = 0     # calls not started (Hanging)

    @property
    def stuck(self) -> int:
        """Abandoned calls still running (threads stuck, most likely in the kernel)."""
        with self._lock:
            return len(self._stuck)

    def call(self, key: str, owner: int, fn: Callable[[], T], timeout_s: float) -> T:
        """``fn()`` (which touches only ``key``, a path of ``owner``), run in the worker; its
        result, or its exception, or :class:`TimedOut` / :class:`Hanging`."""
        with self._lock:
            why = self._refusal(key, owner)
            if why:
                self.not_started += 1
                raise Hanging(why)
            if self._queue is None:
                self._queue = queue.SimpleQueue()
                threading.Thread(target=self._work, args=(self._queue,), name="malletrain-path-io",
                                 daemon=True).start()
            q = self._queue
        task = _Task(fn, key, owner)
        q.put(task)
        if not task.done.wait(max(0.0, timeout_s)):
            with self._lock:
                if not task.finished:
                    task.abandoned = True
                    self._queue = None              # this worker is stuck: the next call gets another
                    self._stuck[key] = owner
                    self._owners[owner] += 1
                    _, n = self._later.get(key, (0.0, 0))
                    self._later[key] = (self.clock() + min(self.max_retry_after_s, self.retry_after_s * 2 ** n),
                                        n + 1)
                    while len(self._later) > MAX_LATER:
                        del self._later[next(iter(self._later))]
                    self.timed_out += 1             # (its worker ends once the stuck call returns)
                    raise TimedOut(f"no answer within {timeout_s:.3g}s")
        if task.error is not None:
            raise task.error
        with self._lock:
            self._later.pop(key, None)              # it answered: no back-off any more
        return task.result  # type: ignore[return-value]

    def _refusal(self, key: str, owner: int) -> str:
        if key in self._stuck:
            return "an earlier read of this path still hangs"
        later = self._later.get(key)
        if later is not None and self.clock() < later[0]:
            return "it did not answer in time; tried again later"
        if self._owners[owner] >= self.max_stuck_per_owner:
            return f"{self._owners[owner]} reads of this owner's paths hang"
        if len(self._stuck) >= self.max_stuck:
            return f"{len(self._stuck)} reads of user paths hang"
        return ""

    def _work(self, q: queue.SimpleQueue[_Task]) -> None:
        while True:
            task = q.get()
            try:
                task.result = task.fn()
            except BaseException as exc:   # handed to the caller (or thrown away if it gave up)
                task.error = exc
            with self._lock:
                task.finished = True
                if task.abandoned:             # the caller gave up on it: this thread ends here
                    self._stuck.pop(task.key, None)
                    self._owners[task.owner] -= 1
                    if self._owners[task.owner] <= 0:
                        del self._owners[task.owner]
                    return
            task.done.set()


MAX_LATER = 10_000      # paths remembered as slow (the oldest forgotten first)
