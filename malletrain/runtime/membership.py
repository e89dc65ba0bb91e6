"""Who is in an elastic job's process group: the agreement over the job's private store.

The processes of an elastic job (one per node: the members of its Slurm group) meet in a
key-value store that lives in the job's checkpoint directory (a ``FileStore`` under
``<checkpoint dir>/.elastic``, mode 0700): only the job's owner can read or write it, so the
rendezvous is private without a secret of its own, and it does not live on any member, so any
member may leave.  Everything here speaks only to that store (``set``, ``get``, ``check``,
``add``, ``compare_set``, as c10d's stores have them) and to the life and pulse files beside it;
it imports no torch, reads the clock it is given, and is tested with a dictionary store.

A *generation* is one unbroken life of the group, from its founder to its last member; its keys
live under a namespace ``ns = g<g>.<nonce>`` the founder writes before it claims the generation,
so a member never sees a generation half set up.  A *round* is one membership within it.

==============================  ==============================================================
``gen``                         ``"<g>:<founder>:<nonce>"``, claimed with ``compare_set``:
                                exactly one founder per generation
``<ns>/secret``                 the generation's key (the peers prove they know it, :mod:`.elastic`)
``<ns>/members``                JSON list: the newest round's members, rank order (for joiners)
``<ns>/closed``                 the group stopped as a whole (its last members checkpointed)
``<ns>/joins``                  counter of join requests; ``<ns>/join/<n>`` the n-th one's member
                                (``-1``: voided, its joiner died before writing it)
``<ns>/offer/<k>/<c>``          rank 0's answer to the ``c`` requests after the first ``k``
``<ns>/r<r>/next``              the transition out of round ``r``: JSON ``{"round", "members",
                                "seen", "admitted", "refused"}``; the first proposal wins
                                (``compare_set``), whoever proposes it, so every member of round
                                ``r`` ends up in the same round ``r+1`` with the same members
``<ns>/r<r>/alive/<m>``         after a failed collective in round ``r``: member ``m`` is alive
``<ns>/admit/<n>``              JSON ``{"round", "members", "seen"}``: join ``n`` is in that round
==============================  ==============================================================

Life locks: each member's process holds ``life/<member>`` locked (``flock``) while it lives and
writes its host name in it; the kernel drops the lock when the process dies, ``kill -9``
included.  A free lock counts only when written on this host (a network filesystem may keep
locks node-local or hold them until a lease runs out); it also keeps a member id from running
twice.  Pulses: each member rewrites ``pulse/<member>`` (a counter) every ``pulse_s`` from a
thread of its own.  A member whose counter did not move for ``dead_s`` is dead.

A planned change (leave, join) happens at a step boundary all ranks agree on; a failed
collective leads to :func:`decide`: every surviving member registers, and once each member of
the round registered or is dead, the registered set is proposed as the transition.  Either way
the transition is the first proposal for that round, so a rank that finished a step its peers
did not (or that wakes from a freeze) adopts what the others agreed.
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import secrets
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from malletrain.domain.errors import MalletrainError

MEMBER_MAX = 1 << 20
VALUE_MAX = 1 << 20      # bytes of one store value this module reads


class MembershipError(MalletrainError):
    """The group could not be joined or agreed within its bound: the caller falls back to
    checkpoint-and-requeue."""


class Store(Protocol):
    def set(self, key: str, value: str) -> None: ...
    def get(self, key: str) -> bytes: ...
    def check(self, keys: list[str]) -> bool: ...
    def add(self, key: str, amount: int) -> int: ...
    def compare_set(self, key: str, expected: str, desired: str) -> bytes: ...


@dataclass(frozen=True)
class Entry:
    """Where a starting member stands: the founder of generation ``gen`` (alone, round 0), or
    admitted into round ``round`` with ``members`` (its rank is its index there)."""
    gen: int
    ns: str                  # the generation's key namespace
    round: int
    members: tuple[int, ...]
    founder: bool
    joins_seen: int          # join requests the group had answered when this member entered


@dataclass(frozen=True)
class Transition:
    """The agreed way out of round ``round - 1``."""
    round: int
    members: tuple[int, ...]
    seen: int                                  # join requests answered after it
    admitted: tuple[tuple[int, int], ...]      # (request, member)
    refused: tuple[tuple[int, str], ...]       # (request, why)

    def to_json(self) -> str:
        return json.dumps({"round": self.round, "members": list(self.members), "seen": self.seen,
                           "admitted": [list(a) for a in self.admitted],
                           "refused": [list(r) for r in self.refused]})


_DIGITS = re.compile(r"^[0-9]{1,9}$")
_NONCE = re.compile(r"^[0-9a-f]{16}$")


def ascii_int(text: str | None) -> int | None:
    """A non-negative decimal integer, ASCII only; None for anything else."""
    return int(text) if text is not None and _DIGITS.match(text) else None


def check_member(member: int) -> int:
    if type(member) is not int or not 0 <= member < MEMBER_MAX:
        raise MembershipError(f"member id {member!r} is not an integer in [0, {MEMBER_MAX})")
    return member


# ---- pulses ------------------------------------------------------------------------------
def pulse_path(directory: str, member: int) -> str:
    return os.path.join(directory, "pulse", str(check_member(member)))


def write_pulse(directory: str, member: int, count: int) -> None:
    """Member ``member`` is alive: its counter becomes ``count`` (written whole, then renamed)."""
    path = pulse_path(directory, member)
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, str(count).encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


def read_pulse(directory: str, member: int) -> int | None:
    try:
        fd = os.open(pulse_path(directory, member), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        raw = os.read(fd, 32)
    finally:
        os.close(fd)
    return int(raw) if raw.isdigit() else None


def life_path(directory: str, member: int) -> str:
    return os.path.join(directory, "life", str(check_member(member)))


def hold_life(directory: str, member: int, tries: int = 20) -> int:
    """Take member ``member``'s life lock for as long as this process lives (the descriptor is
    returned and must stay open) and write this host's name in it.  Refused while another live
    process holds it: a member id runs once."""
    fd = os.open(life_path(directory, member), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    for _ in range(tries):          # an observer's probe holds it for a moment
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            time.sleep(0.01)
    else:
        os.close(fd)
        raise MembershipError(f"member {member} is running already (its life lock is held)")
    os.ftruncate(fd, 0)
    os.pwrite(fd, socket.gethostname().encode()[:255], 0)
    return fd


def gone(directory: str, member: int) -> bool:
    """Whether ``member``'s process is known to be gone: its life lock, written on this host,
    is free.  Anything else (another host's lock, no lock file, a filesystem without ``flock``)
    is not known: the pulse decides then."""
    try:
        fd = os.open(life_path(directory, member), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        if os.pread(fd, 256, 0) != socket.gethostname().encode()[:255]:
            return False
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:                 # held (BlockingIOError), or no locks on this filesystem
        return False
    finally:
        os.close(fd)                # closing releases a lock this probe took
    return True


class Watch:
    """Which members are gone, as one observer sees them: a free life lock (the process died),
    or a pulse that did not move for ``dead_s`` (no clocks compared across nodes: only whether
    a counter changed between two reads of this process)."""

    def __init__(self, directory: str, clock: Callable[[], float] = time.monotonic,
                 read: Callable[[str, int], int | None] = read_pulse,
                 gone: Callable[[str, int], bool] = gone) -> None:
        self.directory, self.clock, self.read, self.gone = directory, clock, read, gone
        self._seen: dict[int, tuple[int | None, float]] = {}

    def observe(self, members: Iterable[int]) -> None:
        now = self.clock()
        for m in members:
            value = self.read(self.directory, m)
            last = self._seen.get(m)
            if last is None or last[0] != value:
                self._seen[m] = (value, now)

    def stalled(self, member: int, still_s: float) -> bool:
        """``member``'s pulse did not change for ``still_s`` since this watch first looked."""
        last = self._seen.get(member)
        return last is not None and self.clock() - last[1] >= still_s

    def dead(self, member: int, dead_s: float) -> bool:
        """``member``'s life lock (on this host) is free, or its pulse stood still ``dead_s``."""
        return self.stalled(member, dead_s) or self.gone(self.directory, member)


# ---- the store's values, read defensively (the store is the owner's, but bounded anyway) --
def _get(store: Store, key: str) -> str | None:
    if not store.check([key]):
        return None
    raw = store.get(key)
    if len(raw) > VALUE_MAX:
        raise MembershipError(f"elastic store: value of {key} is {len(raw)} bytes")
    return raw.decode("utf-8", "replace")


def _json(text: str | None, what: str):
    try:
        return json.loads(text or "")
    except ValueError:
        raise MembershipError(f"elastic store: {what} is not JSON") from None


def _member_list(value, what: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not value or not all(type(m) is int for m in value) \
            or len(set(value)) != len(value):
        raise MembershipError(f"elastic store: {what} is not a list of distinct members")
    return tuple(check_member(m) for m in value)


def current_gen(store: Store) -> tuple[int, str, str]:
    """(generation, its namespace, its claim string); (0, "", "") before the first founder."""
    text = _get(store, "gen")
    if not text:
        return 0, "", ""
    parts = text.split(":")
    gen = ascii_int(parts[0]) if len(parts) == 3 else None
    if gen is None or not _NONCE.match(parts[2]):
        raise MembershipError("elastic store: gen is malformed")
    return gen, f"g{gen}.{parts[2]}", text


def claim(store: Store, member: int, gen: int, claim_text: str) -> tuple[int, str] | None:
    """Found generation ``gen + 1`` if ``gen`` is still current: its keys are written first,
    under a namespace of its own, then the claim; None when another founder won."""
    nonce = secrets.token_hex(8)
    ns = f"g{gen + 1}.{nonce}"
    store.set(f"{ns}/secret", secrets.token_hex(32))
    store.set(f"{ns}/members", json.dumps([member]))
    mine = f"{gen + 1}:{member}:{nonce}"
    if store.compare_set("gen", claim_text, mine).decode("utf-8", "replace") != mine:
        return None
    return gen + 1, ns


def enter(store: Store, member: int, watch: Watch, *, dead_s: float, takeover_s: float,
          wait_s: float, sleep: Callable[[float], None] = time.sleep) -> Entry:
    """Found a generation or be admitted into the current one (blocks; bounded by ``wait_s``).

    A generation that is closed, or whose members' pulses all stood still for ``takeover_s``
    (far longer than ``dead_s``: a wrong takeover would leave two groups training), is replaced
    by a new one this member founds; a live one admits it at its next step boundary."""
    check_member(member)
    deadline = watch.clock() + wait_s
    while True:
        gen, ns, text = current_gen(store)
        if gen == 0 or store.check([f"{ns}/closed"]):
            won = claim(store, member, gen, text)
            if won is not None:
                return Entry(won[0], won[1], 0, (member,), True, 0)
            continue
        n = store.add(f"{ns}/joins", 1)
        if store.compare_set(f"{ns}/join/{n}", "", str(member)).decode("utf-8", "replace") != str(member):
            continue                 # the group voided this number meanwhile: draw another
        while True:
            admitted = _get(store, f"{ns}/admit/{n}")
            if admitted is not None:
                return _admission(admitted, member, gen, ns, n)
            if current_gen(store)[1] != ns or store.check([f"{ns}/closed"]):
                break
            members = _member_list(_json(_get(store, f"{ns}/members"), "members"), "members")
            watch.observe(members)
            if all(watch.stalled(m, takeover_s) for m in members):
                won = claim(store, member, gen, text)
                if won is not None:
                    return Entry(won[0], won[1], 0, (member,), True, 0)
                break
            if watch.clock() >= deadline:
                raise MembershipError(f"member {member} was not admitted into generation {gen} "
                                      f"within {wait_s:.0f}s")
            sleep(0.01)


def _admission(text: str, member: int, gen: int, ns: str, n: int) -> Entry:
    value = _json(text, f"admission {n}")
    if not isinstance(value, dict):
        raise MembershipError(f"elastic store: admission {n} is not an object")
    if "refused" in value:
        raise MembershipError(f"member {member} was refused: {str(value['refused'])[:200]}")
    rnd, seen = value.get("round"), value.get("seen")
    members = _member_list(value.get("members"), f"admission {n}'s members")
    if type(rnd) is not int or rnd < 1 or member not in members or type(seen) is not int or seen < n:
        raise MembershipError(f"elastic store: admission {n} does not admit member {member}")
    return Entry(gen, ns, rnd, members, False, seen)


# ---- the group's side --------------------------------------------------------------------
def pending_joins(store: Store, ns: str, seen: int, at_most: int = 64) -> int:
    """Join requests beyond the ``seen`` the group answered whose entries are written (rank 0
    asks at each boundary; only a run of written entries counts, so every rank reads the same
    ones).  Reads only: nothing is appended to the store per step."""
    count = 0
    while count < at_most and store.check([f"{ns}/join/{seen + count + 1}"]):
        count += 1
    return count


def void_gap(store: Store, ns: str, seen: int) -> bool:
    """Whether request ``seen + 1`` was drawn but never written (its joiner died between the
    two); rank 0 calls it when that has lasted ``dead_s``, and voids it so later requests are
    not held up.  A joiner that loses the race draws another number."""
    if store.add(f"{ns}/joins", 0) <= seen or store.check([f"{ns}/join/{seen + 1}"]):
        return False
    store.compare_set(f"{ns}/join/{seen + 1}", "", "-1")
    return True


def joiners(store: Store, ns: str, seen: int, count: int) -> list[tuple[int, int]]:
    """(request number, member) of the ``count`` requests after ``seen`` (-1: void, unreadable)."""
    out = []
    for n in range(seen + 1, seen + count + 1):
        m = ascii_int(_get(store, f"{ns}/join/{n}"))
        out.append((n, m if m is not None and m < MEMBER_MAX else -1))
    return out


def offer(store: Store, ns: str, seen: int, count: int, is_gone: Callable[[int], bool]) -> None:
    """Rank 0, before the step that carries ``count`` joins: which of them the group takes in
    (a joiner whose process is gone already is refused, so the next group does not wait for
    it).  Every rank reads this one answer (:func:`offered`)."""
    answer = [[n, m, m >= 0 and not is_gone(m)] for n, m in joiners(store, ns, seen, count)]
    store.compare_set(f"{ns}/offer/{seen}/{count}", "", json.dumps(answer))


def offered(store: Store, ns: str, seen: int, count: int) -> list[tuple[int, int, bool]]:
    value = _json(_get(store, f"{ns}/offer/{seen}/{count}"), f"the offer after request {seen}")
    if not isinstance(value, list) or len(value) != count or not all(
            isinstance(e, list) and len(e) == 3 and type(e[0]) is int and type(e[1]) is int
            and type(e[2]) is bool for e in value):
        raise MembershipError(f"elastic store: the offer after request {seen} is malformed")
    return [(n, m, ok) for n, m, ok in value]


def secret(store: Store, ns: str) -> bytes:
    """The generation's key for the peers' proof over the data plane (see :mod:`.elastic`)."""
    text = _get(store, f"{ns}/secret") or ""
    if not re.match(r"^[0-9a-f]{64}$", text):
        raise MembershipError("elastic store: the generation has no key")
    return bytes.fromhex(text)


def transition(store: Store, ns: str, rnd: int, proposal: Transition) -> Transition:
    """The agreed way out of round ``rnd``: ``proposal`` if it is the first, else the first."""
    got = store.compare_set(f"{ns}/r{rnd}/next", "", proposal.to_json())
    return _transition(got.decode("utf-8", "replace"), rnd)


def agreed(store: Store, ns: str, rnd: int) -> Transition | None:
    text = _get(store, f"{ns}/r{rnd}/next")
    return None if text is None else _transition(text, rnd)


def _transition(text: str, rnd: int) -> Transition:
    v = _json(text, f"the transition out of round {rnd}")
    ok = (isinstance(v, dict) and v.get("round") == rnd + 1 and type(v.get("seen")) is int
          and v["seen"] >= 0 and isinstance(v.get("admitted"), list) and isinstance(v.get("refused"), list)
          and all(isinstance(a, list) and len(a) == 2 and all(type(x) is int for x in a) for a in v["admitted"])
          and all(isinstance(r, list) and len(r) == 2 and type(r[0]) is int and isinstance(r[1], str)
                  for r in v["refused"]))
    if not ok:
        raise MembershipError(f"elastic store: the transition out of round {rnd} is malformed")
    return Transition(rnd + 1, _member_list(v.get("members"), "a transition's members"), v["seen"],
                      tuple((a[0], a[1]) for a in v["admitted"]),
                      tuple((r[0], r[1][:200]) for r in v["refused"]))


def announce(store: Store, ns: str, t: Transition) -> None:
    """The new round's rank 0 tells the joiners (idempotent: the transition is agreed)."""
    store.set(f"{ns}/members", json.dumps(list(t.members)))
    for n, _ in t.admitted:
        store.set(f"{ns}/admit/{n}", json.dumps({"round": t.round, "members": list(t.members), "seen": t.seen}))
    for n, why in t.refused:
        store.set(f"{ns}/admit/{n}", json.dumps({"refused": why}))


def close(store: Store, ns: str) -> None:
    """The group stopped as a whole: the next member to start founds a new generation."""
    store.set(f"{ns}/closed", "1")


def decide(store: Store, ns: str, rnd: int, members: tuple[int, ...], me: int, seen: int,
           watch: Watch, *, dead_s: float, wait_s: float,
           sleep: Callable[[float], None] = time.sleep) -> Transition:
    """After a failed collective of round ``rnd``: the way out of it.

    Registers this member, then waits until every member of the round registered or is dead,
    and proposes the registered ones; if a transition out of ``rnd`` is agreed already (a
    planned change some ranks reached, another member's proposal), that one.  A member missing
    from the answer leaves the group.  Bounded by ``wait_s``."""
    base = f"{ns}/r{rnd}"
    store.set(f"{base}/alive/{me}", "1")
    deadline = watch.clock() + wait_s
    while True:
        done = agreed(store, ns, rnd)
        if done is not None:
            return done
        alive = [m for m in members if store.check([f"{base}/alive/{m}"])]
        watch.observe(m for m in members if m not in alive)
        if all(m in alive or watch.dead(m, dead_s) for m in members):
            return transition(store, ns, rnd, Transition(rnd + 1, tuple(alive), seen, (), ()))
        if watch.clock() >= deadline:
            raise MembershipError(f"round {rnd}: the survivors did not agree within {wait_s:.0f}s")
        sleep(0.01)
