"""Turn per-job sizes into concrete nodes.

Rules, in order:
1. a continuing job keeps its nodes; a shrinking one releases the nodes
   expected to be taken back first: the shortest predicted stay
   (:class:`Stay` from the availability model, when given), else the shortest
   known idle window (unknown windows count as long);
2. growing jobs take free nodes of their type expected to stay longest,
   preferring the topology group that holds most of their nodes, then low
   variability;
3. starting jobs take a whole group when one has room (the group with the
   most free nodes), else the longest-staying nodes across groups.
Growing and starting jobs pick in order of their *exposure* (given by
``decide``: what a node taken back costs them, their rescale-down pause times
their rate in the objective's unit), highest first, FIFO among equals: the
longest stays go to the jobs that would lose most.  Jobs found *sensitive* to
slow nodes (a learned slowdown exponent >= ``SENSITIVE``,
:mod:`malletrain.jpa.sensitivity`) pick before the others and take the
fastest (lowest ``variability``) nodes first, in their group when they have one;
jobs found insensitive (at most ``INSENSITIVE``) take the slowest first.
Never assigns a node twice, never a node outside the pool, never migrates.
Free nodes are sorted once (keys built in C-level passes); per-(type, group) queues make each
take O(count).
"""
from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from itertools import filterfalse, repeat
from operator import attrgetter, neg

from malletrain.core.stays import StayMap
from malletrain.domain.model import JobState, Node, Stay

NO_STAYS: Mapping[str, Stay] = {}
NO_EXPOSURE: Mapping[str, float] = {}
SENSITIVE = 0.5      # a job whose learned slowdown exponent is at least this picks the fastest nodes
INSENSITIVE = 0.2    # ... at most this, the slowest (leaving the fast ones to those who need them)


def _ranker(stays: Mapping[str, Stay]) -> Callable[[Node], tuple]:
    """Sort key: nodes expected to stay longest first."""
    def rank(n: Node) -> tuple:
        s = stays.get(n.name)
        first = (-s.fraction, s.leave_p) if s is not None else (-1.0, 0.0)
        return (*first, -(math.inf if n.window_end_s is None else n.window_end_s), n.variability, n.name)
    return rank


_STAYS = Stay(1.0, 0.0)       # a node without a prediction ranks as one that stays
_FRACTION, _LEAVE, _VARIABILITY = attrgetter("fraction"), attrgetter("leave_p"), attrgetter("variability")
_GROUP, _NAME, _TYPE, _WINDOW = (attrgetter("group"), attrgetter("name"), attrgetter("node_type"),
                                 attrgetter("window_end_s"))


def in_pool(names: tuple[str, ...], pool: Mapping[str, object]) -> tuple[str, ...]:
    """``names`` without those not in ``pool``, in order (the same tuple when all are in it:
    C-level passes)."""
    return names if all(map(pool.__contains__, names)) else tuple(filter(pool.__contains__, names))


def _ranked(nodes: Sequence[Node], stays: Mapping[str, Stay]) -> list[Node]:
    """``nodes`` sorted by :func:`_ranker`'s key, the keys built with C-level passes (the same
    values: ``-fraction`` is ``neg(fraction)``; a node without a stay gets (-1.0, 0.0))."""
    names = list(map(_NAME, nodes))
    get = stays.plain().get if isinstance(stays, StayMap) else stays.get
    st = list(map(get, names, repeat(_STAYS)))
    ends = list(map(_WINDOW, nodes))
    if None in ends:
        ends = [math.inf if e is None else e for e in ends]
    keys = list(zip(map(neg, map(_FRACTION, st)), map(_LEAVE, st), map(neg, ends), map(_VARIABILITY, nodes), names))
    return [nodes[i] for i in sorted(range(len(nodes)), key=keys.__getitem__)]


class _Queue:
    """Free node names in the order they are handed out, read from ``at`` on (names before it
    were handed out, or skipped as taken through another queue)."""

    __slots__ = ("names", "at")

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.at = 0

    def take(self, count: int, taken: AbstractSet[str]) -> list[str]:
        """Up to ``count`` names not in ``taken``, in order (C-level passes over the names)."""
        got: list[str] = []
        names = self.names
        while len(got) < count and self.at < len(names):
            chunk = names[self.at:self.at + count - len(got)]
            self.at += len(chunk)
            got.extend(filterfalse(taken.__contains__, chunk))
        return got


class _FreeNodes:
    """The free nodes as queues of names, ranked (:func:`_ranked`): per type, per (type, group),
    and per speed order on first use; a name handed out through one queue is skipped by the others."""

    def __init__(self, nodes: Sequence[Node], stays: Mapping[str, Stay], by_name: Mapping[str, Node]) -> None:
        ordered = _ranked(nodes, stays)
        names = list(map(_NAME, ordered))
        types = list(map(_TYPE, ordered))
        per_group: dict[tuple[str, str], list[str]] = defaultdict(list)
        for key, name in zip(zip(types, map(_GROUP, ordered)), names):
            per_group[key].append(name)
        self.by_group = {key: _Queue(q) for key, q in per_group.items()}
        kinds = set(types)
        if len(kinds) == 1:
            self.by_type = {types[0]: _Queue(names)}
        else:
            per_type: dict[str, list[str]] = defaultdict(list)
            for t, name in zip(types, names):
                per_type[t].append(name)
            self.by_type = {t: _Queue(q) for t, q in per_type.items()}
        self.count: Counter = Counter({key: len(q) for key, q in per_group.items()})
        self.taken: set[str] = set()
        self._ordered = ordered
        self._by_name = by_name
        self._by_speed: dict[tuple[str, str | None, int], _Queue] = {}   # built on first use

    def _speed_order(self, ntype: str, group: str | None, speed: int) -> _Queue:
        """Free nodes fastest first (``speed`` 1) or slowest first (-1), ``rank`` among equals."""
        key = (ntype, group, speed)
        if key not in self._by_speed:
            self._by_speed[key] = _Queue([n.name for n in sorted((n for n in self._ordered if n.node_type == ntype
                                                                  and (group is None or n.group == group)),
                                                                 key=lambda n: speed * n.variability)])
        return self._by_speed[key]

    def _queue(self, ntype: str, group: str | None) -> _Queue:
        q = self.by_group.get((ntype, group)) if group is not None else self.by_type.get(ntype)
        return q if q is not None else _Queue([])

    def take(self, ntype: str, count: int, group: str | None, speed: int = 0) -> list[str]:
        if group is None:
            groups = {g: c for (t, g), c in self.count.items() if t == ntype and c > 0}
            if groups:
                fits = [g for g, c in groups.items() if c >= count]
                group = max(fits or groups, key=lambda g: (groups[g], g))
        got: list[str] = []
        if speed:
            queues = (([self._speed_order(ntype, group, speed)] if group is not None else [])
                      + [self._speed_order(ntype, None, speed)])
        else:
            queues = ([self._queue(ntype, group)] if group is not None else []) + [self._queue(ntype, None)]
        for q in queues:
            if len(got) >= count:
                break
            picked = q.take(count - len(got), self.taken)
            self.taken.update(picked)
            got += picked
        for g, k in Counter(map(_GROUP, map(self._by_name.__getitem__, got))).items():
            self.count[(ntype, g)] -= k
        return got


def place(nodes: Sequence[Node], jobs: Sequence[JobState],
          targets: Mapping[str, tuple[str | None, int]],
          stays: Mapping[str, Stay] = NO_STAYS,
          exposure: Mapping[str, float] = NO_EXPOSURE,
          sensitive: Mapping[str, float] = NO_EXPOSURE, *,
          by_name: Mapping[str, Node] | None = None) -> dict[str, tuple[str, ...]]:
    """``by_name``: ``nodes`` by name, when the caller has it (saves a pass over the pool)."""
    if by_name is None:
        by_name = {n.name: n for n in nodes}
    _rank = _ranker(stays)
    out: dict[str, tuple[str, ...]] = {}
    held: set[str] = set()
    for job in jobs:
        own = in_pool(job.nodes, by_name)
        want = targets.get(job.job_id, (None, 0))[1]
        if want < len(own):
            own = tuple(n.name for n in sorted(map(by_name.__getitem__, own), key=_rank)[:want])
        out[job.job_id] = own
        held.update(own)
    index: list[_FreeNodes] = []   # built on first use: most cycles take no node

    def take(job_id: str, ntype: str | None, count: int, group: str | None) -> None:
        if not index:
            index.append(_FreeNodes([n for n in nodes if n.name not in held], stays, by_name))
        free = index[0]
        s = sensitive.get(job_id)
        speed = 0 if s is None else 1 if s >= SENSITIVE else -1 if s <= INSENSITIVE else 0
        got = free.take(ntype if ntype is not None else _any_type(free), count, group, speed)
        if len(got) < count:
            raise ValueError(f"placement: job {job_id} needs {count} more nodes of type "
                             f"{ntype}, only {len(got)} free")
        out[job_id] = out[job_id] + tuple(got)

    if exposure or sensitive:   # jobs slowed by slow nodes, then who loses most when a node is taken back
        rank = {j.job_id: i for i, j in enumerate(jobs)}
        jobs = sorted(jobs, key=lambda j: (sensitive.get(j.job_id, 0.0) < SENSITIVE,
                                           -exposure.get(j.job_id, 0.0), rank[j.job_id]))
    for job in jobs:  # growers first: they are already running
        ntype, want = targets.get(job.job_id, (None, 0))
        have = len(out[job.job_id])
        if have and want > have:
            groups = Counter(map(_GROUP, map(by_name.__getitem__, out[job.job_id])))
            take(job.job_id, ntype or by_name[out[job.job_id][0]].node_type, want - have,
                 groups.most_common(1)[0][0])
    for job in jobs:
        ntype, want = targets.get(job.job_id, (None, 0))
        if not out[job.job_id] and want > 0:
            take(job.job_id, ntype, want, None)
    return out


def _any_type(free: _FreeNodes) -> str:
    per_type: Counter[str] = Counter()
    for (t, _), c in free.count.items():
        per_type[t] += c
    return max(per_type, key=lambda t: (per_type[t], t)) if per_type else ""
