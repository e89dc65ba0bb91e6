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
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Mapping, Sequence
from itertools import repeat
from operator import attrgetter, neg

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


def _ranked(nodes: Sequence[Node], stays: Mapping[str, Stay]) -> list[Node]:
    """``nodes`` sorted by :func:`_ranker`'s key, the keys built with C-level passes (the same
    values: ``-fraction`` is ``neg(fraction)``; a node without a stay gets (-1.0, 0.0))."""
    names = [n.name for n in nodes]
    st = list(map(stays.get, names, repeat(_STAYS)))
    windows = [-(math.inf if n.window_end_s is None else n.window_end_s) for n in nodes]
    keys = list(zip(map(neg, map(_FRACTION, st)), map(_LEAVE, st), windows, map(_VARIABILITY, nodes), names))
    return [nodes[i] for i in sorted(range(len(nodes)), key=keys.__getitem__)]


class _FreeNodes:
    def __init__(self, nodes: Sequence[Node], stays: Mapping[str, Stay]) -> None:
        ordered = _ranked(nodes, stays)
        self.by_type: dict[str, deque] = defaultdict(deque)
        self.by_group: dict[tuple[str, str], deque] = defaultdict(deque)
        self.count: Counter = Counter()
        for n in ordered:
            self.by_type[n.node_type].append(n)
            self.by_group[(n.node_type, n.group)].append(n)
            self.count[(n.node_type, n.group)] += 1
        self.taken: set[str] = set()
        self._ordered = ordered
        self._by_speed: dict[tuple[str, str | None, int], deque] = {}   # built on first use

    def _speed_order(self, ntype: str, group: str | None, speed: int) -> deque:
        """Free nodes fastest first (``speed`` 1) or slowest first (-1), ``rank`` among equals."""
        key = (ntype, group, speed)
        if key not in self._by_speed:
            self._by_speed[key] = deque(sorted((n for n in self._ordered if n.node_type == ntype
                                                and (group is None or n.group == group)),
                                               key=lambda n: speed * n.variability))
        return self._by_speed[key]

    def _pop(self, q: deque) -> Node | None:
        while q:
            n = q.popleft()
            if n.name not in self.taken:
                return n
        return None

    def take(self, ntype: str, count: int, group: str | None, speed: int = 0) -> list[Node]:
        if group is None:
            groups = {g: c for (t, g), c in self.count.items() if t == ntype and c > 0}
            if groups:
                fits = [g for g, c in groups.items() if c >= count]
                group = max(fits or groups, key=lambda g: (groups[g], g))
        got: list[Node] = []
        if speed:
            queues = (([self._speed_order(ntype, group, speed)] if group is not None else [])
                      + [self._speed_order(ntype, None, speed)])
        else:
            queues = ([self.by_group[(ntype, group)]] if group is not None else []) + [self.by_type[ntype]]
        for q in queues:
            while len(got) < count:
                n = self._pop(q)
                if n is None:
                    break
                self.taken.add(n.name)
                self.count[(n.node_type, n.group)] -= 1
                got.append(n)
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
        own = [by_name[n] for n in job.nodes if n in by_name]
        want = targets.get(job.job_id, (None, 0))[1]
        keep = own if want >= len(own) else sorted(own, key=_rank)[:want]
        out[job.job_id] = tuple(n.name for n in keep)
        held.update(out[job.job_id])
    index: list[_FreeNodes] = []   # built on first use: most cycles take no node

    def take(job_id: str, ntype: str | None, count: int, group: str | None) -> None:
        if not index:
            index.append(_FreeNodes([n for n in nodes if n.name not in held], stays))
        free = index[0]
        s = sensitive.get(job_id)
        speed = 0 if s is None else 1 if s >= SENSITIVE else -1 if s <= INSENSITIVE else 0
        got = free.take(ntype if ntype is not None else _any_type(free), count, group, speed)
        if len(got) < count:
            raise ValueError(f"placement: job {job_id} needs {count} more nodes of type "
                             f"{ntype}, only {len(got)} free")
        out[job_id] = out[job_id] + tuple(n.name for n in got)

    if exposure or sensitive:   # jobs slowed by slow nodes, then who loses most when a node is taken back
        rank = {j.job_id: i for i, j in enumerate(jobs)}
        jobs = sorted(jobs, key=lambda j: (sensitive.get(j.job_id, 0.0) < SENSITIVE,
                                           -exposure.get(j.job_id, 0.0), rank[j.job_id]))
    for job in jobs:  # growers first: they are already running
        ntype, want = targets.get(job.job_id, (None, 0))
        have = len(out[job.job_id])
        if have and want > have:
            groups = Counter(by_name[n].group for n in out[job.job_id])
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
