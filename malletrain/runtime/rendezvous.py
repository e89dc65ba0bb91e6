"""An authenticated rendezvous for the training processes of one run.

c10d's TCPStore has no authentication: anyone on the cluster network can connect
to it (or listen on the predictable port first) and read, write, list and delete
keys.  So the processes prove to each other that they know a secret that only the
job's owner can read before they build the process group, and no rank ever
unpickles what a peer sends (the runtime exchanges tensors of plain numbers only).

The secret lives in a private directory (``<checkpoint dir>/.rendezvous``, mode
0700, owned by the caller, checked through an ``O_NOFOLLOW`` descriptor): rank 0
writes 32 random bytes to ``key-<id>`` (``O_CREAT|O_EXCL|O_NOFOLLOW``, 0600) with
a fresh random ``id`` for every run, and removes it once every rank has proved it
read it.  The checkpoint directory is shared by the job's nodes already (every
rank reads the checkpoint rank 0 chose), so no other channel is needed.

The handshake over the store, with ``mac(...)`` an HMAC-SHA256 keyed by the secret:

1. rank 0 publishes ``id`` and a random challenge ``c0``;
2. rank r reads ``id``, reads the secret from ``key-<id>``, publishes its own random
   challenge ``cr`` and ``mac("rank", id, world, r, c0, cr)``;
3. rank 0 checks every rank's proof, then answers each rank with
   ``mac("root", id, world, r, c0, cr)``; rank r checks the answer against the ``cr``
   it chose itself (a forged store, or a forged challenge, cannot produce it);
4. the process group's own keys go under a prefix derived from the secret, and
   once it is up every rank all-gathers ``mac("peer", id, r, c0)`` over the data
   plane and checks every row: a process that took a rank's place there without the
   secret is refused.

What is left (SECURITY.md): anyone who reaches the store first or writes garbage
into it can make the run fail (denial of service); the gloo data connections and
the store's values after the handshake are not authenticated, so an attacker who
relays between two ranks can still corrupt that run's tensors, never run code.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import re
import secrets
import stat
import time
from collections.abc import Callable
from typing import Protocol

from malletrain.domain.errors import MalletrainError

DIR_NAME = ".rendezvous"
ID = re.compile(r"^[0-9a-f]{32}$")
CHALLENGE = re.compile(r"^[0-9a-f]{32}$")
MAC = re.compile(r"^[0-9a-f]{64}$")
KEY_FILE = re.compile(r"^key-[0-9a-f]{32}$")
SECRET_BYTES = 32
STALE_KEY_S = 3600.0      # key files of runs that died mid-handshake are removed after this
NS = "malletrain/rdzv/"   # the handshake's keys in the store


class RendezvousError(MalletrainError):
    """The rendezvous could not be authenticated (a peer without the job's secret, a forged
    store, a key file that is not private): the run stops instead of training with it."""


class Store(Protocol):
    def set(self, key: str, value: str, /) -> None: ...

    def get(self, key: str) -> bytes: ...


def mac(secret: bytes, *parts: object) -> str:
    return hmac.new(secret, "\x00".join(map(str, parts)).encode(), hashlib.sha256).hexdigest()


def open_private_dir(parent: str, name: str = DIR_NAME,
                     what: str = "the rendezvous key directory") -> int:
    """A descriptor of ``<parent>/<name>``, created 0700; RendezvousError unless it is a
    directory (not a symlink) owned by this user that nobody else may enter.  An elastic job's
    store directory is checked the same way (:mod:`.elastic`)."""
    os.makedirs(parent, mode=0o700, exist_ok=True)
    path = os.path.join(parent, name)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise RendezvousError(f"{path}: cannot open {what} "
                              f"(a symlink, or not a directory?): {exc.strerror}") from None
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & 0o077:
        os.close(fd)
        raise RendezvousError(f"{path}: {what} must be yours and private "
                              f"(owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}; "
                              f"want uid {os.geteuid()}, mode 0700)")
    return fd


def write_secret(dfd: int, *, now: float | None = None) -> tuple[str, bytes]:
    """A fresh (id, secret); the secret is written to ``key-<id>`` (0600, never an existing
    file or a symlink).  Key files of earlier runs older than STALE_KEY_S are removed."""
    now = time.time() if now is None else now
    for name in os.listdir(dfd):
        if KEY_FILE.match(name):
            try:
                if now - os.stat(name, dir_fd=dfd, follow_symlinks=False).st_mtime > STALE_KEY_S:
                    os.unlink(name, dir_fd=dfd)
            except FileNotFoundError:
                pass
    ident, secret = secrets.token_hex(16), secrets.token_bytes(SECRET_BYTES)
    fd = os.open(f"key-{ident}", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600, dir_fd=dfd)
    try:
        os.write(fd, secret.hex().encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    return ident, secret


def read_secret(dfd: int, ident: str, deadline: float, *, sleep: Callable[[float], None] = time.sleep) -> bytes:
    """The secret of run ``ident``, waiting (a shared filesystem may show the file late) until
    ``deadline`` (time.monotonic()); RendezvousError unless it is a private file of this user."""
    if not ID.match(ident):
        raise RendezvousError("the store gave a malformed rendezvous id: not a run of this job")
    name = f"key-{ident}"
    while True:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dfd)
            break
        except FileNotFoundError:
            if time.monotonic() >= deadline:
                raise RendezvousError(f"no rendezvous key {name} appeared in the private key "
                                      "directory: the store is not this job's rank 0's (or the "
                                      "checkpoint directory is not shared by the job's nodes)") from None
            sleep(0.2)
        except OSError as exc:
            raise RendezvousError(f"cannot open the rendezvous key {name}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise RendezvousError(f"the rendezvous key {name} is not a private file of yours")
        raw = os.read(fd, 2 * SECRET_BYTES + 1)
    finally:
        os.close(fd)
    try:
        secret = bytes.fromhex(raw.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        secret = b""
    if len(secret) != SECRET_BYTES:
        raise RendezvousError(f"the rendezvous key {name} is malformed")
    return secret


def _get(store: Store, key: str, pattern: re.Pattern, what: str) -> str:
    try:
        raw = store.get(NS + key)
    except Exception as exc:   # noqa: BLE001 - c10d raises its own errors (timeouts, a closed store)
        raise RendezvousError(f"rendezvous: no {what} in the store ({str(exc)[:200]})") from None
    try:
        text = bytes(raw).decode("ascii")
    except UnicodeDecodeError:
        text = ""
    if not pattern.match(text):
        raise RendezvousError(f"rendezvous: the store holds a malformed {what}: forged, refusing")
    return text


class Proof:
    """What the handshake established: the run's id, secret and rank 0's challenge."""

    def __init__(self, ident: str, secret: bytes, c0: str, world: int) -> None:
        self.ident, self.secret, self.c0, self.world = ident, secret, c0, world

    @property
    def prefix(self) -> str:
        """The process group's key prefix in the store (not guessable without the secret)."""
        return f"malletrain/pg/{mac(self.secret, 'prefix', self.ident, self.c0)[:32]}/"

    def peer_token(self, rank: int) -> bytes:
        """What rank ``rank`` shows over the data plane once the group is up (32 bytes)."""
        return bytes.fromhex(mac(self.secret, "peer", self.ident, self.world, rank, self.c0))


def handshake(store: Store, rank: int, world: int, key_parent: str, timeout_s: float) -> Proof:
    """Run the handshake as ``rank`` of ``world``; the Proof, or RendezvousError."""
    deadline = time.monotonic() + timeout_s
    dfd = open_private_dir(key_parent)
    try:
        if rank == 0:
            return _root(store, world, dfd)
        return _member(store, rank, world, dfd, deadline)
    finally:
        os.close(dfd)


def _root(store: Store, world: int, dfd: int) -> Proof:
    ident, secret = write_secret(dfd)
    try:
        c0 = secrets.token_hex(16)
        store.set(NS + "id", ident)
        store.set(NS + "c/0", c0)
        answers = {}
        for r in range(1, world):
            cr = _get(store, f"c/{r}", CHALLENGE, f"challenge of rank {r}")
            pr = _get(store, f"p/{r}", MAC, f"proof of rank {r}")
            if not hmac.compare_digest(pr, mac(secret, "rank", ident, world, r, c0, cr)):
                raise RendezvousError(f"rendezvous: rank {r} did not prove it knows this run's key: "
                                      "refusing to train with it")
            answers[r] = mac(secret, "root", ident, world, r, c0, cr)
        for r, answer in answers.items():
            store.set(NS + f"a/{r}", answer)
    finally:
        try:    # every rank has read it (each proof needs it), or the run fails anyway
            os.unlink(f"key-{ident}", dir_fd=dfd)
        except FileNotFoundError:
            pass
    return Proof(ident, secret, c0, world)


def _member(store: Store, rank: int, world: int, dfd: int, deadline: float) -> Proof:
    ident = _get(store, "id", ID, "rendezvous id")
    secret = read_secret(dfd, ident, deadline)
    c0 = _get(store, "c/0", CHALLENGE, "challenge of rank 0")
    cr = secrets.token_hex(16)
    store.set(NS + f"c/{rank}", cr)
    store.set(NS + f"p/{rank}", mac(secret, "rank", ident, world, rank, c0, cr))
    answer = _get(store, f"a/{rank}", MAC, "answer of rank 0")
    if not hmac.compare_digest(answer, mac(secret, "root", ident, world, rank, c0, cr)):
        raise RendezvousError("rendezvous: the store's rank 0 did not prove it knows this run's key "
                              "(another process holds the port?): refusing to train with it")
    return Proof(ident, secret, c0, world)
