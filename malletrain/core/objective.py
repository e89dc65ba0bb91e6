"""The objective: what each candidate size of a job is worth over the horizon ``H``.

This is the performance model the count allocator maximises (summed over jobs),
for the ``malletrain``, ``oracle`` and ``greedy`` policies.  For a job ``j``
that holds ``c`` nodes now, a candidate size ``n`` is worth its expected
useful work over the next ``H`` seconds, in the objective's unit::

    value_j(n) = w_j · [ H · T_j(N(A))  −  p(c→n) · T_j(n)  −  d_j · T_j(n) · D(A) ]
    value_j(0) = 0

* ``T_j(n)``: predicted samples/s at ``n`` nodes (the JPA's curve, or the truth
  for ``oracle``).
* ``A``: the nodes the job would run on.  Shrinking keeps the ``n`` of its own
  nodes expected to stay longest (placement does the same); growing keeps all of
  its own and adds the ``n − c`` free nodes expected to stay longest, and beyond
  the free ones, the nodes other jobs would give up (their shortest stays
  first: that is what a shrinking job releases).  (Each growing job is valued as
  if the best free nodes were its own; placement hands them out in order of
  exposure, so when several jobs grow at once some get somewhat shorter stays
  than valued.  The next decision corrects it.)
* ``N(A) = Σ_{i∈A} fraction_i``: the job's expected node count averaged over
  the horizon, each node counting the share of the horizon it is expected to
  stay (:mod:`malletrain.core.availability`; 1 for a node without a
  prediction).  The job runs at ``T_j`` of the nodes it has left, so a node that
  leaves early costs the concave curve's marginal rate, not an average one.
  With every node staying this is ``H · T_j(n)``.
* ``p(c→n)``: the rescale pause of the change, at the new size's rate: ``up_j``
  for a start or a grow, ``down_j`` for a shrink, 0 for no change.  The pauses
  are the learned ones (:mod:`malletrain.jpa.rescale`), or the job's configured
  ones before any measurement.  An elastic group (issue #26) pays its own grow
  pause for a grow (the survivors re-form while the joiners start), not a start's.
* ``D(A) = 1 − Π_{i∈A} (1 − leave_i)``: the chance that the primary scheduler
  takes back some node of ``A`` within ``H`` (nodes taken independently), which
  pauses the job for ``d_j``: ``down_j`` for a job that checkpoints and restarts
  on the nodes left, an elastic group's learned preemption pause (its members
  re-form).  One pause, not one per node: nodes go back in bursts (a primary job
  takes several at once), and after the first the job is sized afresh.
* A job found to slow down on slow nodes (exponent ``s``, :mod:`malletrain.jpa.sensitivity`)
  runs ``T_j`` times ``slowdown^(−s)`` of the slowest node it would get (its own, or the
  fastest free ones): growing a sensitive job onto a slow node can cost more than it adds.
* ``w_j``: the unit and the weight.  ``samples``: 1 (samples/s summed over
  jobs, as in BFTrainer and MalleTrain); ``speedup``: ``m_j / T_j(m_j)`` with
  ``m_j = min_nodes``: a job's rate in node-equivalents of its smallest size (at
  most linear: ``T_j(n)`` is capped at ``T_j(m_j)·n/m_j``), so a model with a high
  sample rate does not outbid one with a low rate;
  ``progress``: ``1 / work_j`` (fraction of the job's work per second; a job
  whose work is not known counts as ``speedup``).  Times the owner's weight
  (``user_weights``, default 1).

With no predictions this is ``w·T(n)·(H − p)``: the plain expected work.
Voluntarily dropping a node costs a ``down`` pause, as losing it does, so the
model never shrinks a job only because a node might leave.  Negative values are
kept: a start whose pause outlasts the nodes' expected stay is worth less than
waiting.
"""
from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from itertools import accumulate, repeat
from operator import attrgetter, itemgetter

from malletrain.core.stays import StayMap
from malletrain.domain.config import CoreConfig
from malletrain.domain.model import STAYING, JobState, Node, RescaleCost, Stay
from malletrain.milp.problem import Option


def unit_rate(job: JobState, rate: Callable[[float], float], cfg: CoreConfig) -> Callable[[float], float]:
    """The curve the objective counts: under ``speedup`` (and ``progress`` without a known work) a
    job's rate above linear scaling from its smallest size is not counted: speedup at most ``n/m``.
    A job that reports a tiny rate at ``min_nodes`` cannot claim an enormous speedup."""
    if cfg.objective == "samples" or (cfg.objective == "progress" and job.spec.work > 0):
        return rate
    m = max(1, job.spec.min_nodes)
    per_node = rate(m) / m

    def capped(n: float) -> float:
        return min(rate(n), per_node * n)
    return capped


def unit_weight(job: JobState, rate: Callable[[float], float], cfg: CoreConfig) -> float:
    """``w_j``: the objective's unit for this job times its owner's weight."""
    w = cfg.weight(job.spec.owner) if cfg.user_weights else 1.0
    if cfg.objective == "samples":
        return w
    if cfg.objective == "progress" and job.spec.work > 0:
        return w / job.spec.work
    m = max(1, job.spec.min_nodes)
    base = rate(m)
    return w * m / base if base > 0 else 0.0


class FreeOrder:
    """Stays of the nodes a growing job could get, as prefix sums of ``fraction`` and of
    ``log(1 − leave_p)`` (whose exp is the chance that none leaves): the free nodes longest
    first, then the nodes other jobs would give up, shortest first (a shrinking job gives up
    the nodes expected to leave first).  Only the first ``limit`` are kept (no job grows by
    more).

    Only the values count, not which node has them: nodes are counted per distinct
    (fraction, leave_p) (C-level passes; the availability model gives a few dozen distinct
    stays), the distinct values sorted, and the best ``limit`` expanded from them."""

    def __init__(self, free: Iterable[Stay], held: Iterable[Stay] = (), limit: int | None = None) -> None:
        free_counts = _counts(free)
        n_free = sum(free_counts.values())
        if limit is None:
            held = list(held)
            k = n_free + len(held)
        else:
            k = limit
        best = _ranked(free_counts, min(k, n_free), longest=True)
        if len(best) < k:       # the held nodes are read only when the free ones run out
            best += _ranked(_counts(held), k - len(best), longest=False)
        self.sums = _prefix(best)

    @classmethod
    def of(cls, stays: Mapping[str, Stay], free: AbstractSet[str], held: Iterable[str] = (),
           limit: int | None = None) -> FreeOrder:
        """From node names (nodes without a stay count as staying).  From a :class:`StayMap`
        the best ``limit`` free nodes are read off its groups, longest stay first, instead of
        counting every free node."""
        if limit is None or not isinstance(stays, StayMap):
            return cls(map(stays.get, free, repeat(STAYING)), map(stays.get, held, repeat(STAYING)), limit)
        held = held if isinstance(held, AbstractSet) else set(held)
        groups = stays.groups()
        order = cls.__new__(cls)
        order.sums = _prefix(_fill(
            ((_VALUE(st), len(nodes & free)) for st, nodes in groups),
            lambda: ((_VALUE(st), len(nodes & held)) for st, nodes in reversed(groups)),
            limit, len(free - stays.keys()), lambda: len(held - stays.keys())))
        return order

    @classmethod
    def of_pool(cls, stays: StayMap, busy: Iterable[str], held: Iterable[str], limit: int) -> FreeOrder:
        """:meth:`of` for a map that :meth:`StayMap.covers` the pool: the free nodes are the
        pool less ``busy`` (every node a job holds: ``held``, the nodes of jobs that may shrink,
        and those of pinned jobs), counted per code as all the map's counts less ``busy``'s.
        The same values in the same order as :meth:`of` with ``free = pool − busy``."""
        values, ranked = stays.by_code, stays.ranked()
        free = [t - b for t, b in zip(stays.count(), stays.count(busy))]

        def held_shortest():
            counts = stays.count(held)
            return ((_VALUE(values[c]), counts[c]) for c in reversed(ranked))
        order = cls.__new__(cls)
        order.sums = _prefix(_fill(((_VALUE(values[c]), free[c]) for c in ranked), held_shortest, limit))
        return order

    def take(self, k: int) -> tuple[float, float]:
        """(Σ fraction, Σ log P(stays)) of the best ``k`` (beyond the list, nodes stay)."""
        m = min(k, len(self.sums) - 1)
        f, log_stay = self.sums[m]
        return f + (k - m), log_stay


_VALUE = attrgetter("fraction", "leave_p")
_FIRST, _SECOND = itemgetter(0), itemgetter(1)


def _fill(free: Iterable[tuple[tuple[float, float], int]],
          held: Callable[[], Iterable[tuple[tuple[float, float], int]]], limit: int,
          free_staying: int = 0, held_staying: Callable[[], int] = lambda: 0) -> list[tuple[float, float]]:
    """The best ``limit`` (fraction, leave_p) a growing job could get: ``free_staying`` free nodes
    without a stay (they stay: first), then ``free``'s (value, count) pairs, longest stay first;
    where they run out, the held nodes a shrinking job gives up, ``held()``'s pairs shortest first,
    then ``held_staying()`` held nodes without a stay.  The held side is read only when needed."""
    best = [_VALUE(STAYING)] * min(limit, free_staying)
    for value, have in free:
        if len(best) >= limit:
            break
        if have:
            best.extend(repeat(value, min(have, limit - len(best))))
    if len(best) < limit:
        rest = limit - len(best)
        shortest: list[tuple[float, float]] = []
        for value, have in held():
            if len(shortest) >= rest:
                break
            if have:
                shortest.extend(repeat(value, min(have, rest - len(shortest))))
        if len(shortest) < rest:
            shortest.extend(repeat(_VALUE(STAYING), min(held_staying(), rest - len(shortest))))
        best += shortest
    return best


def _counts(stays: Iterable[Stay]) -> Counter[tuple[float, float]]:
    """How many of ``stays`` have each (fraction, leave_p)."""
    return Counter(map(_VALUE, stays))


def _ranked(counts: dict[tuple[float, float], int], k: int, longest: bool) -> list[tuple[float, float]]:
    """The ``k`` (fraction, leave_p) expected to stay longest (``longest``) or shortest, in that
    order: what ``heapq.nlargest``/``nsmallest`` by (fraction, −leave_p) would give, equal
    values being interchangeable."""
    out: list[tuple[float, float]] = []
    if k <= 0:
        return out
    for v in _longest_first_values(counts) if longest else _longest_first_values(counts)[::-1]:
        out.extend(repeat(v, min(counts[v], k - len(out))))
        if len(out) >= k:
            break
    return out


def _longest_first_values(values: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """(fraction, leave_p) pairs by (fraction, −leave_p), largest first: two stable C-level sorts
    (leave_p ascending, then fraction descending).  Reversed, it is smallest first (for
    distinct pairs)."""
    vals = list(values)
    vals.sort(key=_SECOND)
    vals.sort(key=_FIRST, reverse=True)
    return vals


def _longest_first(stays: Iterable[Stay]) -> list[tuple[float, float]]:
    """(fraction, leave_p) of ``stays`` by (fraction, −leave_p), largest first."""
    return _longest_first_values(map(_VALUE, stays))


def _prefix(ordered: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """[(Σ fraction, Σ log(1 − leave_p)) of the first k] for k = 0 … len: the same additions, in
    the same order, as a running sum (``accumulate``), the log taken once per distinct leave_p."""
    leaves = list(map(_SECOND, ordered))
    logs = {p: math.log(max(1e-12, 1.0 - p)) for p in set(leaves)}
    return list(zip(accumulate(map(_FIRST, ordered), initial=0.0),
                    accumulate(map(logs.__getitem__, leaves), initial=0.0)))


def _own_sums(nodes: Sequence[str], stays: Mapping[str, Stay]) -> list[tuple[float, float]]:
    """:func:`_prefix` of a job's own nodes' stays, longest first (nodes without one stay); read
    off a :class:`StayMap`'s ranks where it holds every node."""
    if isinstance(stays, StayMap) and (sums := stays.prefix(nodes)) is not None:
        return sums
    return _prefix(_longest_first(map(stays.get, nodes, repeat(STAYING))))


def expected_values(job: JobState, sizes: Sequence[int], rate: Callable[[float], float],
                    cost: RescaleCost, weight: float, horizon_s: float,
                    stays: Mapping[str, Stay], free: FreeOrder | None,
                    pace: Callable[[int], float] | None = None) -> tuple[Option, ...]:
    """The job's options ``(size, value_j(size))`` (size 0 always among them); ``pace(n)``: the
    share of its curve the job keeps on the ``n`` nodes it would get (slow nodes, see
    :func:`pace_of`)."""
    if pace is not None:
        base = rate

        def rate(n: float) -> float:      # noqa: F811 - the curve at the pace of the nodes it would get
            return base(n) * pace(max(1, math.ceil(n)))
    c = job.size
    h = horizon_s
    out = [Option(0, 0.0)]
    new = tuple.__new__         # Option(size, value) without NamedTuple's Python-level __new__
    up = cost.up_s if c == 0 else cost.grow_pause_s
    if not stays:
        for n in sorted(set(sizes)):
            if n > 0:
                pause = up if n > c else cost.down_s if n < c else 0.0
                out.append(new(Option, (n, weight * rate(n) * (h - pause))))
        return tuple(out)
    own = _own_sums(job.nodes, stays) if c else [(0.0, 0.0)]
    own_f, own_log = own[c]
    sums = free.sums if free is not None else None
    last = len(sums) - 1 if sums is not None else 0
    down, taken = cost.down_s, cost.taken_pause_s
    exp, append = math.exp, out.append
    for n in sorted(set(sizes)):
        if n <= 0:
            continue
        t = rate(n)
        if n <= c:
            pause = down if n < c else 0.0
            count, log_stay = own[n]
        else:
            pause = up
            k = n - c           # FreeOrder.take(k), inline
            if sums is not None:
                m = k if k < last else last
                f, lk = sums[m]
                count, log_stay = own_f + (f + (k - m)), own_log + lk
            else:
                count, log_stay = own_f + float(k), own_log + 0.0
        work = h * (rate(count) if count < n - 1e-9 else t)
        # 1 - exp(log_stay): P(some node of A is taken back within H)
        append(new(Option, (n, weight * (work - t * (pause + taken * (1.0 - exp(log_stay)))))))
    return tuple(out)


def pace_of(job: JobState, nodes: Mapping[str, Node], free_speeds: Sequence[float],
            exponent: float) -> Callable[[int], float]:
    """For a job that slows down on slow nodes (learned ``exponent`` s), the share of its curve
    it keeps on ``n`` nodes: ``slowdown^(−s)`` of the slowest node it would run on — of its own
    nodes, and of the ``n − c`` fastest free ones (``free_speeds``, ascending variability: what
    placement gives a sensitive job)."""
    own = max((nodes[x].variability for x in job.nodes if x in nodes), default=1.0)
    c = job.size

    def pace(n: int) -> float:
        slowest = own if n <= c or c else 0.0
        if n > c and free_speeds:
            slowest = max(slowest, free_speeds[min(n - c, len(free_speeds)) - 1])
        return max(slowest, 1e-3) ** -exponent if slowest else 1.0
    return pace
