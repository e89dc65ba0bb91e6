"""Who is in an elastic job's process group: the agreement over the job's private store.

The processes of an elastic job (one per node: the members of its Slurm group) meet in a
key-value store that lives in the job's checkpoint directory (a ``FileStore`` under
``<checkpoint dir>/.elastic``, mode 0700): only the job's owner can read or write it, so the
rendezvous is private without a secret of its own, and it does not live on any member, so any
member may leave.  Everything here speaks only to that store (``set``, ``get``, ``check``,
``add``, ``compare_set``, as c10d's stores have them) and to the pulse files beside it; it
imports no torch, reads the clock it is given, and is tested with a dictionary store.

Keys (``g`` a *generation*: one unbroken life of the group, from its founder to its last
member; ``r`` a *round*: one membership within a generation):

==========================  ==================================================================
``gen``                     ``"<g>:<member>:<nonce>"``: the current generation and its founder,
                            claimed with ``compare_set`` (exactly one founder per generation)
``g<g>/closed``             the group stopped as a whole (its last members checkpointed)
``g<g>/secret``             the generation's key (the peers prove they know it, :mod:`.elastic`)
``g<g>/members``            JSON list: the current round's members, rank order
``g<g>/joins``              counter of join requests; ``g<g>/join/<n>`` the n-th one's member
``g<g>/offer/<k>/<c>``      rank 0's answer to the ``c`` requests after the first ``k``: which it
                            takes in (JSON ``[[n, member, ok], ...]``)
``g<g>/admit/<n>``          JSON ``{"round": r, "members": [...], "seen": k}``: join n is in
                            round r, and the group has answered the first k requests
``g<g>/r<r>/alive/<m>``     after a failed collective in round r: member m is alive at step s
``g<g>/r<r>/decided``       JSON ``{member: step}``: who goes on (the first proposal wins)
==========================  ==================================================================

Life locks: each member's process holds ``life/<member>`` locked (``flock``) for as long as it
lives; the kernel drops the lock when the process dies, ``kill -9`` included, so a free lock
means that member is gone at once.  It also keeps a member id from running twice.

Pulses: each member's process rewrites ``pulse/<member>`` (a counter) every ``pulse_s`` from a
thread of its own, whatever its training does.  A member whose counter did not move for
``dead_s`` is dead (a killed process, a lost node): a waiting joiner founds a new generation when
no member of the current one has a pulse, and a recovery round stops waiting for members
without one.

A joiner is admitted at a step boundary: rank 0 sees the join counter move, the count rides with
the step's data so every rank agrees on it, and every rank reads the same join entries.  After
a failed collective, every surviving member registers with the step it holds; once each member
of the round has registered or is dead, the first proposal of the registered set wins, and the
members not in it (late, or judged dead) leave.
"""
from __future__ import annotations

import fcntl
import json
import os
import secrets
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
    """Where a starting member stands: the founder of ``gen`` (alone, round 0), or admitted
    into round ``round`` with ``members`` (its rank is its index there)."""
    gen: int
    round: int
    members: tuple[int, ...]
    founder: bool
    joins_seen: int          # join requests the group had answered when this member entered


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
    returned and must stay open): the kernel drops it the moment the process dies, ``kill -9``
    included.  Refused while another live process holds it: a member id runs once."""
    fd = os.open(life_path(directory, member), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    for _ in range(tries):          # an observer's probe holds it for a moment
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            time.sleep(0.01)
    os.close(fd)
    raise MembershipError(f"member {member} is running already (its life lock is held)")


def gone(directory: str, member: int) -> bool:
    """Whether ``member``'s process is known to be gone: its life lock exists and is free.  A
    process that died releases it at once; a node that died may not (a network filesystem keeps
    the lock until its lease runs out), so the pulse covers that case."""
    try:
        fd = os.open(life_path(directory, member), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
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

    def dead(self, member: int, dead_s: float) -> bool:
        """``member``'s life lock is free, or its pulse did not change for ``dead_s`` since
        this watch first looked."""
        last = self._seen.get(member)
        if last is not None and self.clock() - last[1] >= dead_s:
            return True
        return self.gone(self.directory, member)

    def any_alive(self, members: Iterable[int], dead_s: float) -> bool:
        return any(not self.dead(m, dead_s) for m in members)


# ---- the store's values, read defensively (the store is the owner's, but bounded anyway) --
def _get(store: Store, key: str) -> str | None:
    if not store.check([key]):
        return None
    raw = store.get(key)
    if len(raw) > VALUE_MAX:
        raise MembershipError(f"elastic store: value of {key} is {len(raw)} bytes")
    return raw.decode("utf-8", "replace")


def _members(text: str | None, what: str) -> tuple[int, ...]:
    try:
        value = json.loads(text or "")
    except ValueError:
        raise MembershipError(f"elastic store: {what} is not JSON") from None
    if not isinstance(value, list) or not value or len(set(value)) != len(value):
        raise MembershipError(f"elastic store: {what} is not a list of distinct members")
    return tuple(check_member(m) for m in value)


def current_gen(store: Store) -> tuple[int, str]:
    """(generation, its claim string); (0, "") before the first founder."""
    text = _get(store, "gen")
    if not text:
        return 0, ""
    head = text.split(":", 1)[0]
    if not head.isdigit():
        raise MembershipError("elastic store: gen is malformed")
    return int(head), text


def claim(store: Store, member: int, gen: int, claim_text: str) -> int | None:
    """Found generation ``gen + 1`` if ``gen`` is still current; None when another won."""
    mine = f"{gen + 1}:{member}:{secrets.token_hex(8)}"
    if store.compare_set("gen", claim_text, mine).decode() != mine:
        return None
    store.set(f"g{gen + 1}/secret", secrets.token_hex(32))
    store.set(f"g{gen + 1}/members", json.dumps([member]))
    store.set(f"g{gen + 1}/joins", "0")
    return gen + 1


def enter(store: Store, member: int, watch: Watch, *, dead_s: float, wait_s: float,
          sleep: Callable[[float], None] = time.sleep) -> Entry:
    """Found a generation or be admitted into the current one (blocks; bounded by ``wait_s``).

    A generation with no live member (every pulse still for ``dead_s``, or closed) is replaced
    by a new one this member founds; a live one admits it at its next step boundary."""
    check_member(member)
    deadline = watch.clock() + wait_s
    while True:
        gen, text = current_gen(store)
        if gen == 0 or store.check([f"g{gen}/closed"]):
            won = claim(store, member, gen, text)
            if won is not None:
                return Entry(won, 0, (member,), True, 0)
            continue
        n = store.add(f"g{gen}/joins", 1)
        store.set(f"g{gen}/join/{n}", str(member))
        while True:
            admitted = _get(store, f"g{gen}/admit/{n}")
            if admitted is not None:
                return _admission(admitted, member, gen, n)
            if current_gen(store)[0] != gen or store.check([f"g{gen}/closed"]):
                break
            members = _members(_get(store, f"g{gen}/members"), "members")
            watch.observe(members)
            if not watch.any_alive(members, dead_s):
                if claim(store, member, gen, text) is not None:
                    return Entry(gen + 1, 0, (member,), True, 0)
                break
            if watch.clock() >= deadline:
                raise MembershipError(f"member {member} was not admitted into generation {gen} "
                                      f"within {wait_s:.0f}s")
            sleep(0.01)


def _admission(text: str, member: int, gen: int, n: int) -> Entry:
    try:
        value = json.loads(text)
    except ValueError:
        raise MembershipError(f"elastic store: admission {n} is not JSON") from None
    if not isinstance(value, dict):
        raise MembershipError(f"elastic store: admission {n} is not an object")
    if "refused" in value:
        raise MembershipError(f"member {member} was refused: {str(value['refused'])[:200]}")
    rnd, seen = value.get("round"), value.get("seen")
    members = _members(json.dumps(value.get("members")), f"admission {n}'s members")
    if type(rnd) is not int or rnd < 1 or member not in members or type(seen) is not int or seen < n:
        raise MembershipError(f"elastic store: admission {n} does not admit member {member}")
    return Entry(gen, rnd, members, False, seen)


# ---- the group's side --------------------------------------------------------------------
def pending_joins(store: Store, gen: int, seen: int, at_most: int = 64) -> int:
    """Join requests beyond the ``seen`` the group answered whose entries are written (rank 0
    asks at each boundary; a joiner draws its number, then writes its entry, so only a run of
    written entries counts: every rank then reads the same ones)."""
    drawn = store.add(f"g{gen}/joins", 0)
    count = 0
    while seen + count < drawn and count < at_most and store.check([f"g{gen}/join/{seen + count + 1}"]):
        count += 1
    return count


def joiners(store: Store, gen: int, seen: int, count: int) -> list[tuple[int, int]]:
    """(request number, member) of the ``count`` requests after ``seen`` (-1: unreadable)."""
    out = []
    for n in range(seen + 1, seen + count + 1):
        text = _get(store, f"g{gen}/join/{n}") or ""
        out.append((n, int(text) if text.isdigit() and int(text) < MEMBER_MAX else -1))
    return out


def offer(store: Store, gen: int, seen: int, count: int, is_gone: Callable[[int], bool]) -> None:
    """Rank 0, before the step that carries ``count`` joins: which of them the group takes in
    (a joiner whose process is gone already is refused, so the next group does not wait for
    it).  Every rank reads this one answer (:func:`offered`)."""
    answer = [[n, m, m >= 0 and not is_gone(m)] for n, m in joiners(store, gen, seen, count)]
    store.set(f"g{gen}/offer/{seen}/{count}", json.dumps(answer))


def offered(store: Store, gen: int, seen: int, count: int) -> list[tuple[int, int, bool]]:
    text = _get(store, f"g{gen}/offer/{seen}/{count}")
    try:
        value = json.loads(text or "")
    except ValueError:
        raise MembershipError(f"elastic store: the offer after request {seen} is not JSON") from None
    if not isinstance(value, list) or len(value) != count or not all(
            isinstance(e, list) and len(e) == 3 and type(e[0]) is int and type(e[1]) is int
            and type(e[2]) is bool for e in value):
        raise MembershipError(f"elastic store: the offer after request {seen} is malformed")
    return [(n, m, ok) for n, m, ok in value]


def secret(store: Store, gen: int) -> bytes:
    """The generation's key for the peers' proof over the data plane (see :mod:`.elastic`)."""
    text = _get(store, f"g{gen}/secret") or ""
    if len(text) != 64:
        raise MembershipError(f"elastic store: generation {gen} has no key")
    return bytes.fromhex(text)


def admit(store: Store, gen: int, rnd: int, members: tuple[int, ...],
          admitted: list[tuple[int, int]], refused: list[tuple[int, str]], seen: int) -> None:
    """Rank 0 of round ``rnd`` answers the join requests it took in (``seen``: how many
    requests the group has answered now; an admitted member counts on from there)."""
    store.set(f"g{gen}/members", json.dumps(list(members)))
    for n, _ in admitted:
        store.set(f"g{gen}/admit/{n}", json.dumps({"round": rnd, "members": list(members), "seen": seen}))
    for n, why in refused:
        store.set(f"g{gen}/admit/{n}", json.dumps({"refused": why}))


def close(store: Store, gen: int) -> None:
    """The group stopped as a whole: the next member to start founds a new generation."""
    store.set(f"g{gen}/closed", "1")


def decide(store: Store, gen: int, rnd: int, members: tuple[int, ...], me: int, step: int,
           watch: Watch, *, dead_s: float, wait_s: float,
           sleep: Callable[[float], None] = time.sleep) -> dict[int, int]:
    """After a failed collective of round ``rnd``: who goes on, and the step each holds.

    Registers this member, then waits until every member of the round registered or is dead;
    the first complete proposal wins (``compare_set``), so every member reads the same answer.
    A member missing from the answer leaves the group.  Bounded by ``wait_s``."""
    base = f"g{gen}/r{rnd}"
    store.set(f"{base}/alive/{me}", str(step))
    deadline = watch.clock() + wait_s
    while True:
        text = _get(store, f"{base}/decided")
        if text is not None:
            return _decided(text)
        alive = {}
        for m in members:
            got = _get(store, f"{base}/alive/{m}")
            if got is not None and got.lstrip("-").isdigit():
                alive[m] = int(got)
        watch.observe(m for m in members if m not in alive)
        if all(m in alive or watch.dead(m, dead_s) for m in members):
            store.compare_set(f"{base}/decided", "", json.dumps({str(m): s for m, s in alive.items()}))
            continue
        if watch.clock() >= deadline:
            raise MembershipError(f"round {rnd} of generation {gen}: the survivors did not agree "
                                  f"within {wait_s:.0f}s")
        sleep(0.01)


def _decided(text: str) -> dict[int, int]:
    try:
        value = json.loads(text)
    except ValueError:
        raise MembershipError("elastic store: a decision is not JSON") from None
    if not isinstance(value, dict):
        raise MembershipError("elastic store: a decision is not an object")
    out = {}
    for k, v in value.items():
        if not k.isdigit() or type(v) is not int:
            raise MembershipError("elastic store: a decision is malformed")
        out[check_member(int(k))] = v
    return out
