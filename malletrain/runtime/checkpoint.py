"""Checkpoint files: atomic, checksummed, the last K kept, corrupt ones skipped.

File layout (``ckpt-<step:09d>.pt`` in the job's checkpoint directory)::

    b"MLTCKPT1"            8-byte magic
    sha256(payload) hex    64 bytes
    payload                torch.save() of the state dict

A write goes to ``<name>.tmp.<pid>.<random>`` (created ``O_EXCL|O_NOFOLLOW``, mode
0600: checkpoints are private by default, and a new checkpoint directory is 0700), is
fsynced, then renamed over the final name, so a reader sees either the old set of
files or the new one.  Files are read without following a symlink, regular files only.  On
restore the newest file that has the magic, the right checksum and loads
wins; a newer file that fails is renamed ``*.corrupt`` (so it no longer
counts against K) and a warning names it.  Loading uses
``torch.load(weights_only=True)``: tensors, numbers, strings and containers
only, so a file planted in the checkpoint directory cannot run code on
unpickling.  Stale temporary files of dead writers (older than
``STALE_TMP_S``) and all but the newest ``KEEP_CORRUPT`` quarantined files
are pruned after every save.
"""
from __future__ import annotations

import hashlib
import io
import logging
import os
import re
import secrets
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from malletrain.domain.safefile import create_exclusive

log = logging.getLogger("malletrain.runtime")

MAGIC = b"MLTCKPT1"
NAME = re.compile(r"^ckpt-(\d{9})\.pt$")
TMP = re.compile(r"^ckpt-\d{9}\.pt\.tmp\.(\d+)(?:\.[0-9a-f]{12})?$")
CORRUPT = re.compile(r"^ckpt-\d{9}\.pt\.corrupt$")
STALE_TMP_S = 600.0
KEEP_CORRUPT = 2


@dataclass(frozen=True)
class Saved:
    path: str
    step: int
    bytes: int
    write_s: float


@dataclass(frozen=True)
class Restored:
    path: str
    step: int
    state: dict
    skipped: tuple[str, ...]   # newer files that were corrupt or partial
    read_s: float


class CheckpointStore:
    def __init__(self, directory: str, keep: int = 3, mode: int = 0o600) -> None:
        if keep < 1:
            raise ValueError("keep must be >= 1")
        self.directory, self.keep, self.mode = directory, keep, mode

    def path(self, step: int) -> str:
        return os.path.join(self.directory, f"ckpt-{step:09d}.pt")

    def steps(self) -> list[int]:
        """Steps of the checkpoint files present, newest first."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        return sorted((int(m.group(1)) for m in map(NAME.match, names) if m), reverse=True)

    def save(self, step: int, state: dict) -> Saved:
        import torch
        t0 = time.perf_counter()
        buf = io.BytesIO()
        torch.save(state, buf)
        payload = buf.getbuffer()
        digest = hashlib.sha256(payload).hexdigest().encode()
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        final = self.path(step)
        # a name nobody can plant a symlink under in advance, created O_EXCL|O_NOFOLLOW, 0600
        tmp = f"{final}.tmp.{os.getpid()}.{secrets.token_hex(6)}"
        with os.fdopen(create_exclusive(tmp, self.mode), "wb") as fh:
            fh.write(MAGIC)
            fh.write(digest)
            fh.write(payload)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
        _fsync_dir(self.directory)
        self._prune()
        return Saved(final, step, len(payload) + 72, time.perf_counter() - t0)

    def _prune(self) -> None:
        for step in self.steps()[self.keep:]:
            _unlink(self.path(step))
        now = time.time()
        corrupt = []
        for name in os.listdir(self.directory):
            path = os.path.join(self.directory, name)
            m = TMP.match(name)
            if m and int(m.group(1)) != os.getpid():
                try:
                    if now - os.lstat(path).st_mtime > STALE_TMP_S:
                        _unlink(path)
                except FileNotFoundError:
                    pass
            elif CORRUPT.match(name):
                corrupt.append(name)
        for name in sorted(corrupt, reverse=True)[KEEP_CORRUPT:]:
            _unlink(os.path.join(self.directory, name))

    @staticmethod
    def read(path: str) -> dict:
        """The state in one file; ValueError when it is partial or corrupt."""
        import torch
        # never through a symlink, never a FIFO or device planted under a checkpoint's name
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as fh:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ValueError("not a regular file")
            blob = fh.read()
        if len(blob) < 72 or blob[:8] != MAGIC:
            raise ValueError("no checkpoint header (partial or foreign file)")
        digest, payload = blob[8:72], memoryview(blob)[72:]
        if hashlib.sha256(payload).hexdigest().encode() != digest:
            raise ValueError("checksum mismatch (corrupt or truncated)")
        try:
            state = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
        except Exception as exc:   # noqa: BLE001 - any unpickling failure means unusable
            raise ValueError(f"cannot unpickle: {exc}") from None
        if not isinstance(state, dict):
            raise ValueError("payload is not a state dict")
        return state

    def restore_step(self, step: int) -> Restored:
        """Exactly the checkpoint of ``step`` (the one another rank chose); ValueError if unusable."""
        t0 = time.perf_counter()
        path = self.path(step)
        try:
            state = self.read(path)
        except OSError as exc:
            raise ValueError(f"checkpoint {path} chosen by rank 0 is unreadable here: {exc}") from None
        return Restored(path, step, state, (), time.perf_counter() - t0)

    def restore(self, *, quarantine: bool = True) -> Restored | None:
        """The newest valid checkpoint, or None when there is none."""
        t0 = time.perf_counter()
        skipped = []
        for step in self.steps():
            path = self.path(step)
            try:
                state = self.read(path)
            except (OSError, ValueError) as exc:
                log.warning("checkpoint %s is unusable (%s); falling back to the previous one",
                            path, exc)
                skipped.append(path)
                if quarantine:
                    try:
                        os.replace(path, path + ".corrupt")
                    except OSError:
                        pass
                continue
            return Restored(path, step, state, tuple(skipped), time.perf_counter() - t0)
        if skipped:
            log.warning("no valid checkpoint left in %s; starting from scratch", self.directory)
        return None


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def snapshot(value):
    """A copy of a state dict that training can no longer change: every tensor cloned to the
    CPU, every dict, list and tuple rebuilt (numbers and strings are immutable)."""
    import torch
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: snapshot(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(snapshot(v) for v in value)
    return value


class BackgroundSave:
    """One checkpoint written by a thread from a :func:`snapshot`; :meth:`wait` joins it and says
    whether it was written (its error is logged by the thread)."""

    def __init__(self, store: CheckpointStore, step: int, state: dict,
                 done: Callable[[Saved], None] = lambda saved: None) -> None:
        self.store, self.step, self.state, self._done = store, step, state, done
        self.saved: Saved | None = None
        self._thread = threading.Thread(target=self._run, name=f"checkpoint-{step}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self.saved = self.store.save(self.step, self.state)
        except Exception:       # noqa: BLE001 -- the caller writes it again, synchronously
            log.exception("background checkpoint of step %d failed", self.step)
            return
        self._done(self.saved)

    def running(self) -> bool:
        return self._thread.is_alive()

    def wait(self) -> bool:
        self._thread.join()
        return self.saved is not None
