"""Node availability: how long each harvestable node will stay idle, learned online.

The model (no look-ahead: it knows only what it has seen):

* A *stretch* is one uninterrupted time a node spends in the harvestable pool
  (idle, or held by a malleable job) until the primary scheduler (or a drain, a
  reservation) takes it back.  :meth:`IdleHistory.update` is called with every
  snapshot's pool: a node that appears opens a stretch, one that vanishes closes
  it, and the stretch's length is recorded.  Nodes already in the pool at the
  first update open their stretch then (their age is underestimated once).
* The lengths of closed stretches and the ages of the open ones (right-censored:
  they lasted at least that long) give a Kaplan–Meier survival curve
  ``S(t) = P(L > t)`` on a fixed log-spaced grid (1 s … ~4 years).  Older
  stretches weigh less: a stretch counts half as much once ``half_life`` newer
  ones closed, so the model follows a workload that changes.
* For a node idle for ``a`` seconds, its remaining idle time ``R`` has
  ``P(R > t) = S(a + t) / S(a)``.  Over the objective's horizon ``H`` the core
  needs the share of the horizon it stays, ``fraction = E[min(R, H)] / H =
  ∫₀ᴴ S(a + t) / S(a) dt / H``, and ``leave_p = P(R < H) = 1 − S(a + H) / S(a)``
  (:class:`Stay`).  Between grid points ``S`` is linear (so the integral is
  exact on it); beyond the longest stretch seen it stays flat (a node older than
  every stretch seen is expected to stay).
* Nodes differ (a primary scheduler fills some first): each node's own recent
  stretches scale the pooled curve in time (an accelerated-failure-time model):
  node ``i`` has ``S_i(t) = S(t / f_i)`` with ``f_i`` the geometric mean of its
  newest ``NODE_MEMORY`` closed stretches over the pooled geometric mean (decayed
  like the counts), shrunk towards 1 as if ``NODE_PRIOR`` more stretches of the
  typical length had been seen.  A
  node whose stretches are twice the typical length is expected to stay twice as
  long at any age.
* Where Slurm knows more — a pending job planned on the node, a reservation —
  the node's window end ``w`` caps ``R``: the integral stops at ``w − now`` and
  ``leave_p`` is 1 when ``w − now < H``.
* Until ``min_stretches`` stretches have closed there is no prediction: nodes
  count as staying the whole horizon (the objective is then the plain one),
  except where a window end is known.

Costs (the model is consulted every cycle, so it keeps what did not change):

* an update compares the pool with the last one (one C-level tuple compare when
  nothing changed); otherwise set differences with the last pool's set (kept) find
  the nodes that came and went,
  the stretches that closed at that instant are counted in numpy with the very
  operations of a loop over them in order (sequential accumulates; a loop where the
  weights renormalise), each node's newest stretches are a row of one array shifted
  at once, and the sorted entry times (one numpy array; nodes enter at the current
  time) change once per update;
* the survival table is rebuilt only when a stretch opened or closed or an open
  stretch's age crossed a grid point (each call knows when the next crossing is
  due), O(grid · log n) then;
* the stays of all nodes are computed in numpy (age, time scale, grid interval;
  the few ages that fall within 1e-9 of a grid point are redone exactly as
  :func:`_index` would) and mapped onto one memoised :class:`Stay` per
  (interval, scale); where such a stay reads the survival curve depends on no
  curve and is kept per (interval, scale, horizon) (:func:`_span`), so a new
  table's stays cost a few multiplications each; the values a new pool needs
  per node are kept in arrays at a slot per node (one gather); when neither the table nor any node's interval
  changed the previous mapping object itself is returned, so comparing two
  outlooks is O(1).  For the same pool object with nothing opened or closed,
  that answer is returned without any of this until the first time a node's
  interval or the table can change (each answer knows when).  Nodes whose known
  window ends within the horizon are computed one by one (their stay depends on
  the exact age).
The returned mappings are shared between calls: read them, never change them.
Pure: no clock, no I/O; times come in.
"""
from __future__ import annotations

import functools
import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import repeat

import numpy as np

from malletrain.core.stays import StayMap
from malletrain.domain.model import Node, Stay

GRID_RATIO = 1.25           # consecutive grid points differ by 25%
NODE_MEMORY = 8             # a node's own stretches that set its time scale
NODE_PRIOR = 2.0            # ... shrunk towards the pooled curve as if this many typical ones were seen
GRID_MAX_S = 1.3e8          # ~4 years: longer is 'for ever'
_RENORM = 1e200             # weights are rescaled before they overflow
_NEAR_GRID = 1e-9           # a vectorised grid index this close to a grid point is redone with math.log
_FEW = 16                   # more closes at one update: their grid intervals in numpy (fewer: one by one)


def _grid() -> tuple[float, ...]:
    pts = [0.0, 1.0]
    while pts[-1] < GRID_MAX_S:
        pts.append(pts[-1] * GRID_RATIO)
    return tuple(pts)


GRID = _grid()
_GRID_UP = np.array(GRID[1:])          # the upper edge of each grid interval
# the grid point an age in interval i reaches next (none beyond the last interval _indices gives)
_GRID_NEXT = np.array(GRID[1:-1] + (math.inf,))
_LOG_RATIO = math.log(GRID_RATIO)
_GRID_ARR = np.array(GRID)
_GRID_STEP = _GRID_ARR[1:] - _GRID_ARR[:-1]      # GRID[i + 1] − GRID[i]


def _index(age_s: float) -> int:
    """The grid interval holding ``age_s``: GRID[i] <= age < GRID[i+1]."""
    if age_s < 1.0:
        return 0
    return min(len(GRID) - 2, 1 + int(math.log(age_s) / _LOG_RATIO))


def _indices(ages: np.ndarray) -> np.ndarray:
    """:func:`_index` of every age, vectorised; equal to it element by element (an age whose
    log lands within ``_NEAR_GRID`` of a grid point, where numpy's and libm's log could round
    apart, is redone with :func:`_index`)."""
    out = np.zeros(len(ages), dtype=np.int64)
    big = ages >= 1.0
    if not big.any():
        return out
    v = np.log(ages[big]) / _LOG_RATIO
    idx = 1 + np.floor(v).astype(np.int64)
    near = np.abs(v - np.rint(v)) < _NEAR_GRID
    if near.any():
        redo = ages[big][near]
        idx[near] = [_index(float(a)) for a in redo]
    np.minimum(idx, len(GRID) - 2, out=idx)
    out[big] = idx
    return out


def _at(t: float) -> tuple[int, float, float, float]:
    """Where ``S`` and ``∫S`` are read at ``t``: ``(j, 1 − w, w, t − GRID[j])`` with ``j =
    _index(t)`` and ``w`` the weight of ``GRID[j + 1]`` (the operations of
    :meth:`_StayTable._s_and_integral`); ``j = −1`` beyond the grid, with ``t − GRID[-1]``."""
    if t >= GRID[-1]:
        return -1, 0.0, 0.0, t - GRID[-1]
    j = _index(t)
    w = (t - GRID[j]) / (GRID[j + 1] - GRID[j])
    return j, 1 - w, w, t - GRID[j]


@functools.lru_cache(maxsize=1 << 16)
def _span(i: int, scale: int, horizon_s: float) -> tuple[float, tuple[int, float, float, float],
                                                          tuple[int, float, float, float]]:
    """The stay of grid interval ``i`` at time scale ``f = GRID_RATIO**scale`` over ``horizon_s``
    reads ``S`` and ``∫S`` at ``age/f`` and ``(age + H)/f`` with ``age = GRID[i]·f``: ``(f``, and
    :func:`_at` of each)``.  None of it depends on the survival curve, so it is computed once per
    (interval, scale, horizon) and every new curve's stays cost a few multiplications each
    (scales and horizons are few: the cache is bounded anyway)."""
    f = GRID_RATIO ** scale
    age = GRID[i] * f
    return f, _at(age / f), _at((age + horizon_s) / f)


def _same(a: tuple, b: tuple) -> bool:
    """``a == b`` for two tuples, at once when they are one object (a tuple's ``==`` compares
    item by item even then)."""
    return a is b or a == b


def _without(starts: np.ndarray, gone: Sequence[float]) -> np.ndarray:
    """The sorted ``starts`` less one occurrence of each of ``gone`` (each is in it, as often)."""
    out = np.sort(np.array(gone, dtype=float))
    first = np.searchsorted(starts, out, side="left")
    again = np.arange(len(out)) - np.searchsorted(out, out, side="left")   # the k-th equal value: k places on
    return np.delete(starts, first + again)


@dataclass(frozen=True)
class _Hold:
    """A stays answer and the time window over which it holds for one pool and model version."""

    nodes: object
    version: int
    horizon_s: float
    from_s: float
    until_s: float
    out: Mapping[str, Stay]


@dataclass(frozen=True)
class _Censored:
    """The open stretches per grid interval of their age at one time, and until when that holds."""

    version: int                 # IdleHistory.version it was counted at
    from_s: float
    until_s: float               # the next time an open stretch's age crosses a grid point
    counts: tuple[int, ...]      # per interval, then the count older than the grid (added to the last)
    surv: list[float]


@dataclass(frozen=True)
class _Stays:
    """The last :meth:`IdleHistory.stays` answer and what it was made of."""

    names: tuple[str, ...]
    table: _StayTable
    codes: np.ndarray
    out: Mapping[str, Stay]
    by_code: dict[int, Stay]            # the Stay object each code got
    by_value: dict[tuple[float, float], Stay]


class IdleHistory:
    def __init__(self, *, min_stretches: int = 20, half_life: int = 2000) -> None:
        self.min_stretches = min_stretches
        self.decay = 0.5 ** (1.0 / half_life)
        self.since: dict[str, float] = {}        # node -> when its open stretch began
        self._starts = np.zeros(0)                 # the open stretches' beginnings, sorted
        self._closed = [0.0] * (len(GRID) - 1)    # decayed count of closed stretches per grid interval
        self._weight = 1.0                        # weight of the next closed stretch (grows by 1/decay)
        self.closed = 0                           # stretches closed so far (undecayed count)
        self.version = 0                          # bumps with every change
        self._log_sum = 0.0                         # decayed Σ log length of closed stretches
        self._log_weight = 0.0
        # what the per-cycle calls keep between them (see the module doc, "Costs")
        self._seq: dict[str, int] = {}             # node -> order it entered ``since`` (closures go in it)
        self._entered = 0
        self._pool: tuple[str, ...] = ()           # the last update's pool
        self._present: set[str] = set()            # ... as a set: the keys of ``since``
        # per node, in arrays at the slot it got when first seen, so a new pool's values are one
        # gather (numpy) away: its open stretch's beginning (NaN: none), the log lengths of its
        # newest NODE_MEMORY closed stretches (oldest first, zeros before the first), their sum and
        # how many there are (set as a stretch of it closes)
        self._slot: dict[str, int] = {}
        self._at = np.full(64, math.nan)
        self._recent = np.zeros((64, NODE_MEMORY))
        self._sum = np.zeros(64)
        self._len = np.zeros(64)
        self._slots: tuple[tuple[str, ...], np.ndarray] | None = None
        self._censored: _Censored | None = None
        self._table: tuple[list[float] | None, float, _StayTable] | None = None
        self._scales: tuple[int, tuple[str, ...], tuple[np.ndarray, int, int, np.ndarray]] | None = None
        self._since: tuple[int, tuple[str, ...], np.ndarray, np.ndarray | None] | None = None
        self._last: _Stays | None = None
        self._names: tuple[Sequence[Node], tuple[str, ...]] | None = None
        self._windows: tuple[Sequence[Node], list[float | None], int] | None = None
        self._index: tuple[tuple[str, ...], dict[str, int]] | None = None
        self._hold: _Hold | None = None

    # -- input ------------------------------------------------------------
    def update(self, now_s: float, pool: Iterable[str]) -> None:
        """The harvestable pool at ``now_s``: open stretches for new nodes, close gone ones.

        Nodes that leave at one instant close in the order they entered (equal entry times
        give equal lengths, so the order among them does not change a sum)."""
        names = pool if isinstance(pool, tuple) else tuple(pool)
        if _same(names, self._pool):
            return
        self._pool = names
        present = set(names)
        # the last pool's set is kept (it is ``since``'s keys): two set differences, where the keys
        # view made a set of every open stretch first (about 3x the cost at 5,000 nodes)
        last = self._present
        gone = last - present
        new = present - last          # (gone and present are disjoint: the same after closing)
        self._present = present
        if gone:
            self._close_all(now_s, sorted(gone, key=self._seq.__getitem__))
        if new:         # by name: the order of a set difference depends on how the sets were built
            self._open_all(now_s, sorted(new))
        if gone or new:
            self.version += 1

    def _close_all(self, now_s: float, order: Sequence[str]) -> None:
        """Close the open stretches of ``order``'s nodes at ``now_s``, one after the other in that
        order: each adds the current weight to its length's grid interval and its weight and
        weighted log length to the sums, then the weight grows by 1/decay (:meth:`_count_closed`);
        then each node's newest stretches, their sums, and the slot arrays and the sorted
        beginnings, written once per update (C-level passes and numpy, no loop per node)."""
        since, seq = self.since, self._seq
        begun = list(map(since.pop, order))
        deque(map(seq.pop, order, repeat(None)), maxlen=0)
        if len(begun) > _FEW:
            lengths = np.maximum(now_s - np.array(begun), 0.0)     # (now − b is +0.0, never −0.0, at b = now)
            logs = list(map(math.log, np.maximum(lengths, 1.0).tolist()))
            where = _indices(lengths).tolist()
        else:
            few = [max(0.0, now_s - b) for b in begun]
            logs = [math.log(max(1.0, x)) for x in few]
            where = [_index(x) for x in few]
        self._count_closed(where, logs)
        self.closed += len(order)
        slots = list(map(self._slot.__getitem__, order))     # (every open stretch's node got one in _open_all)
        # the node's newest NODE_MEMORY log lengths, oldest first: shifted by one, the new one last;
        # summed column by column, oldest first, as ``sum`` adds a node's list (the zeros before a
        # node's first stretch add exactly nothing)
        rows = self._recent[slots]
        rows[:, :-1] = rows[:, 1:]
        rows[:, -1] = logs
        self._recent[slots] = rows
        total = rows[:, 0].copy()
        for k in range(1, NODE_MEMORY):
            total += rows[:, k]
        self._at[slots] = math.nan
        self._sum[slots] = total
        self._len[slots] = np.minimum(self._len[slots] + 1, NODE_MEMORY)
        self._starts = _without(self._starts, begun)

    def _count_closed(self, where: Sequence[int], logs: Sequence[float]) -> None:
        """Stretches closing one after the other in grid intervals ``where`` with log lengths
        ``logs``: the k-th adds the current weight ``w`` to its interval and to the log-weight sum,
        ``w·log`` to the log sum, then ``w`` grows by 1/decay (all rescaled once it passes
        ``_RENORM``).  Many at once go through numpy with the very operations of that loop, in its
        order (``divide.accumulate`` and ``add.accumulate`` are sequential; ``add.at`` adds in index
        order), so every sum is bitwise the loop's; one that would rescale runs the loop."""
        closed, w, log_sum, log_weight, decay = self._closed, self._weight, self._log_sum, self._log_weight, self.decay
        m = len(where)
        if m > _FEW:
            weights = np.divide.accumulate(np.concatenate(((w,), np.full(m - 1, decay))))
            after = float(weights[-1]) / decay
            if after <= _RENORM:
                counts = np.array(closed)
                np.add.at(counts, where, weights)
                self._closed = counts.tolist()
                self._log_sum = float(np.add.accumulate(np.concatenate(((log_sum,), weights * np.array(logs))))[-1])
                self._log_weight = float(np.add.accumulate(np.concatenate(((log_weight,), weights)))[-1])
                self._weight = after
                return
        for i, lg in zip(where, logs):
            closed[i] += w
            log_sum += w * lg
            log_weight += w
            w /= decay
            if w > _RENORM:
                closed = [c / w for c in closed]
                log_sum /= w
                log_weight /= w
                w = 1.0
        self._closed, self._weight, self._log_sum, self._log_weight = closed, w, log_sum, log_weight

    def _open_all(self, now_s: float, new: Iterable[str]) -> None:
        """Open a stretch at ``now_s`` for each of ``new``'s nodes (in that order)."""
        new = list(new)
        self.since.update(zip(new, repeat(now_s)))
        try:
            slots = list(map(self._slot.__getitem__, new))
        except KeyError:        # a node never seen: its slot is given here (it may grow the arrays)
            slots = [self._slot_of(n) for n in new]
        self._seq.update(zip(new, range(self._entered, self._entered + len(new))))
        self._entered += len(new)
        self._at[slots] = now_s
        starts, added = self._starts, np.full(len(slots), now_s)
        if len(starts) and starts[-1] > now_s:     # a clock that went back: keep it sorted
            at = int(np.searchsorted(starts, now_s, side="right"))
            self._starts = np.concatenate((starts[:at], added, starts[at:]))
        else:
            self._starts = np.concatenate((starts, added))

    def observe(self, now_s: float, nodes: Sequence[Node]) -> None:
        """:meth:`update` with the snapshot's pool (its names are kept for :meth:`stays`)."""
        self.update(now_s, self._names_of(nodes))

    # -- the survival curve -------------------------------------------------
    def survival(self, now_s: float) -> list[float] | None:
        """``S`` at every grid point (Kaplan–Meier over closed and open stretches), or None
        before ``min_stretches`` have closed.  The same list object while nothing it depends
        on changed."""
        if self.closed < self.min_stretches:
            return None
        c = self._censored
        if c is not None and c.version == self.version and c.from_s <= now_s < c.until_s:
            return c.surv
        array, until = self._count_open(now_s)
        counts = tuple(array.tolist())
        if c is not None and c.version == self.version and c.counts == counts:
            surv = c.surv
        else:
            surv = self._kaplan_meier(array)
        self._censored = _Censored(self.version, now_s, until, counts, surv)
        return surv

    def _count_open(self, now_s: float) -> tuple[np.ndarray, float]:
        """Open stretches per grid interval of their age (the last one also counts those older
        than the grid), and a time before which no age crosses a grid point.  (``searchsorted``
        on the sorted beginnings is ``bisect_right``; ``now − GRID[i]`` the same subtraction.)"""
        starts = self._starts
        k = len(GRID) - 1
        lo = np.searchsorted(starts, now_s - _GRID_UP, side="right")     # stretches at least GRID[i+1] old
        counts = np.empty(k + 1, dtype=np.int64)
        counts[0] = len(starts) - lo[0]
        counts[1:k] = lo[:-1] - lo[1:]
        counts[k] = lo[-1]
        ahead = lo < len(starts)           # the next stretch to reach age GRID[i+1], per edge
        until = float((starts[lo[ahead]] + _GRID_UP[ahead]).min()) if ahead.any() else math.inf
        # float rounding of 'now - GRID' against 'start + GRID': stay well clear of the crossing
        return counts, until - 1e-9 * (abs(now_s) + GRID[-1])

    def _kaplan_meier(self, counts: np.ndarray) -> list[float]:
        """The actuarial Kaplan–Meier curve at every grid point: per interval ``i``, ``d_i`` closed
        and ``c_i`` censored (open stretches of that age, at the current weight; those older than
        the grid in the last interval), at risk ``r_i = R − Σ_{j<i} (d_j + c_j)`` of which the
        censored count half, ``S_{i+1} = S_i · max(0, 1 − d_i / (r_i − c_i/2))`` where that is
        positive and ``d_i > 0`` (else ``S_{i+1} = S_i``).  In numpy with the very operations of the
        running loop, in its order (``accumulate`` is sequential; the totals are Python sums), so
        every value is bitwise the loop's."""
        k = len(GRID) - 1
        w = self._weight
        censored = counts[:k] * w          # int64 → float64 is exact below 2**53
        censored[k - 1] += int(counts[k]) * w
        closed = np.array(self._closed)
        start = sum(self._closed) + sum(censored.tolist())
        at_risk = np.subtract.accumulate(np.concatenate(((start,), closed + censored)))[:k]
        risk = at_risk - censored / 2.0
        step = (risk > 0) & (closed > 0)
        factor = np.where(step, np.maximum(0.0, 1.0 - closed / np.where(step, risk, 1.0)), 1.0)
        return np.multiply.accumulate(np.concatenate(((1.0,), factor))).tolist()

    def stays(self, now_s: float, nodes: Sequence[Node], horizon_s: float) -> Mapping[str, Stay]:
        """Predicted :class:`Stay` of each node (only nodes with a prediction or a known window).

        The answer may be the very mapping an earlier call returned (when nothing changed): do not
        modify it.  For the same pool object, no stretch opened or closed, no node with a
        window and ``now_s`` before the first time at which the survival curve or some node's
        age interval could change (:attr:`_hold`), it is returned at once."""
        hold = self._hold
        if (hold is not None and hold.nodes is nodes and type(nodes) is tuple and hold.version == self.version
                and hold.horizon_s == horizon_s and hold.from_s <= now_s < hold.until_s):
            return hold.out
        self._hold = None
        surv = self.survival(now_s)
        table = self._stay_table(surv, horizon_s)
        names = self._names_of(nodes)
        windows, timed = self._windows_of(nodes)
        if surv is None:
            out: dict[str, Stay] = {}
            if timed:
                for name, end in zip(names, windows):
                    if end is None or end - now_s >= horizon_s:
                        continue
                    window = max(0.0, end - now_s)
                    out[name] = table.stay(max(0.0, now_s - self.since.get(name, now_s)), window, 0)
            return out
        since, unknown = self._since_of(names)
        ages = now_s - since
        np.maximum(ages, 0.0, out=ages)
        if unknown is not None:
            ages[unknown] = 0.0             # no open stretch: age 0 (as now - now)
        scales, lo, hi, f = self._node_scales(names)
        idx = _indices(ages / f)
        codes = idx * (hi - lo + 1) + (scales - lo)
        until = self._codes_until(idx, since, f, unknown) if not timed else -math.inf
        exact: list[tuple[int, float]] = []     # (node, its window) where the window ends within H
        if timed:
            exact = [(i, max(0.0, end - now_s)) for i, end in enumerate(windows)
                     if end is not None and max(0.0, end - now_s) < horizon_s]
        last = self._last
        if (not exact and last is not None and last.table is table and _same(last.names, names)
                and np.array_equal(last.codes, codes)):
            return self._held(nodes, now_s, until, horizon_s, last.out)
        present = np.zeros(len(GRID) * (hi - lo + 1), dtype=bool)    # codes are small: a dense remap
        present[codes] = True
        uniq = np.flatnonzero(present).tolist()
        inverse = (np.cumsum(present) - 1)[codes]
        width = hi - lo + 1
        per_code = table.memoised_many([(c // width, c % width + lo) for c in uniq])
        if last is not None:
            # a stay of the same value as before is the same object: comparing this answer with
            # the last one (the cycle's memo) then stops at identity for the nodes that kept theirs
            per_code = [last.by_value.get((st.fraction, st.leave_p), st) for st in per_code]
        if not exact:
            by_code = dict(zip(uniq, per_code))
            if (last is not None and _same(last.names, names) and np.array_equal(last.codes, codes)
                    and all(last.by_code.get(c) is st for c, st in by_code.items())):
                self._last = _Stays(names, table, codes, last.out, by_code, last.by_value)
                return self._held(nodes, now_s, until, horizon_s, last.out)     # a new table, the same stays
            grouped = StayMap(names, inverse.reshape(-1), per_code, source=nodes, index=self._index_of(names))
            self._last = _Stays(names, table, codes, grouped, by_code,
                                {(st.fraction, st.leave_p): st for st in per_code})
            return self._held(nodes, now_s, until, horizon_s, grouped)
        out = dict(zip(names, map(per_code.__getitem__, inverse.tolist())))
        for i, window in exact:
            out[names[i]] = table.stay(float(ages[i]), window, int(scales[i]))
        return out

    def _codes_until(self, idx: np.ndarray, since: np.ndarray, f: np.ndarray,
                     unknown: np.ndarray | None) -> float:
        """The first time at which some node's age, in its own time, reaches the next grid point
        (its code changes; a little early, so float rounding never makes it late), or the
        survival curve's counts of open stretches could change.  (The grid is geometric and a
        time scale a power of its ratio, so the two mostly coincide; the node crossings are
        checked anyway, so that the hold does not rest on float rounding or on ages below 1 s.)"""
        c = self._censored
        if c is None or not len(idx):
            return c.until_s if c is not None else -math.inf
        edge = _GRID_NEXT[idx] * f
        cross = since + edge * (1.0 - 1e-9) - 1e-9 * np.abs(since)
        if unknown is not None:
            cross[unknown] = math.inf          # no open stretch: its age stays 0
        return min(float(cross.min()), c.until_s)

    def _held(self, nodes: Sequence[Node], now_s: float, until_s: float, horizon_s: float,
              out: Mapping[str, Stay]) -> Mapping[str, Stay]:
        """Keep ``out`` as the answer for ``[now_s, until_s)`` while the version and pool hold."""
        self._hold = _Hold(nodes, self.version, horizon_s, now_s, until_s, out) if until_s > now_s else None
        return out

    def _since_of(self, names: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray | None]:
        """When each node's open stretch began (and which have none), kept while no stretch
        opened or closed and the pool is the same."""
        hit = self._since
        if hit is not None and hit[0] == self.version and _same(hit[1], names):
            return hit[2], hit[3]
        slots = self._slots_of(names)        # (first: it may grow the arrays)
        since = self._at[slots]              # NaN where no stretch is open, as since.get gives
        missing = np.isnan(since)
        unknown = missing if missing.any() else None
        self._since = (self.version, names, since, unknown)
        return since, unknown

    def _slot_of(self, name: str) -> int:
        """The node's slot in the per-node arrays (given when first seen; the arrays double when full)."""
        k = self._slot.get(name)
        if k is None:
            k = self._slot[name] = len(self._slot)
            if k >= len(self._at):
                grow = len(self._at)
                self._at = np.concatenate((self._at, np.full(grow, math.nan)))
                self._recent = np.concatenate((self._recent, np.zeros((grow, NODE_MEMORY))))
                self._sum = np.concatenate((self._sum, np.zeros(grow)))
                self._len = np.concatenate((self._len, np.zeros(grow)))
        return k

    def _slots_of(self, names: tuple[str, ...]) -> np.ndarray:
        """Every node's slot (kept for the same names object)."""
        hit = self._slots
        if hit is not None and hit[0] is names:
            return hit[1]
        slot = self._slot
        try:
            slots = np.fromiter(map(slot.__getitem__, names), dtype=np.int64, count=len(names))
        except KeyError:        # a node never seen: give every such node its slot, then read again
            for n in names:
                self._slot_of(n)
            slots = np.fromiter(map(slot.__getitem__, names), dtype=np.int64, count=len(names))
        self._slots = (names, slots)
        return slots

    def _index_of(self, names: tuple[str, ...]) -> dict[str, int]:
        """Name → position in ``names`` (kept for the same names: the stays it answers share it)."""
        hit = self._index
        if hit is not None and hit[0] is names:
            return hit[1]
        index = dict(zip(names, range(len(names))))
        self._index = (names, index)
        return index

    def _names_of(self, nodes: Sequence[Node]) -> tuple[str, ...]:
        """The nodes' names (kept for the same sequence object: the cycle's update and stays
        read one snapshot)."""
        hit = self._names
        if hit is not None and hit[0] is nodes:
            return hit[1]
        names = tuple([n.name for n in nodes])       # (a list display is quicker than map/attrgetter here)
        self._names = (nodes, names)
        return names

    def _windows_of(self, nodes: Sequence[Node]) -> tuple[list[float | None], int]:
        """The nodes' window ends and how many are known (kept for the same pool tuple: the
        stays of one pool are asked again each time its ages or the curve move)."""
        hit = self._windows
        if hit is not None and hit[0] is nodes and type(nodes) is tuple:
            return hit[1], hit[2]
        windows = [n.window_end_s for n in nodes]
        timed = len(windows) - windows.count(None)     # nodes with a known window end
        self._windows = (nodes, windows, timed)
        return windows, timed

    def _stay_table(self, surv: list[float] | None, horizon_s: float) -> _StayTable:
        hit = self._table
        if hit is not None and hit[0] is surv and hit[1] == horizon_s:
            return hit[2]
        table = _StayTable(surv, horizon_s)
        self._table = (surv, horizon_s, table)
        return table

    def _node_scales(self, names: tuple[str, ...]) -> tuple[np.ndarray, int, int, np.ndarray]:
        """:meth:`_scale` of every node, vectorised (the same float operations, rounded half to
        even as ``round`` does), their range and each node's ``f = GRID_RATIO**scale``; kept while
        no stretch closed and the pool is the same."""
        hit = self._scales
        if hit is not None and hit[0] == self.version and _same(hit[1], names):
            return hit[2]
        n = len(names)
        if self._log_weight <= 0:       # no stretch closed yet
            scales = np.zeros(n, dtype=np.int64)
        else:
            typical = self._log_sum / self._log_weight
            slots = self._slots_of(names)
            total, count = self._sum[slots], self._len[slots]        # (0 for a node with no closed stretch)
            raw = np.rint((total - count * typical) / (count + NODE_PRIOR) / _LOG_RATIO)
            scales = np.where(count > 0, raw, 0.0).astype(np.int64)
        lo, hi = (int(scales.min()), int(scales.max())) if n else (0, 0)
        ratio = {s: GRID_RATIO ** s for s in range(lo, hi + 1)}
        f = np.array([ratio[s] for s in range(lo, hi + 1)])[scales - lo] if n else np.zeros(0)
        self._scales = (self.version, names, (scales, lo, hi, f))
        return self._scales[2]

    def _scale(self, name: str) -> int:
        """log_{GRID_RATIO} of the node's time scale ``f_i`` (0: a node like the others)."""
        own = self.recent(name)
        if not own or self._log_weight <= 0:
            return 0
        typical = self._log_sum / self._log_weight
        return round((sum(own) - len(own) * typical) / (len(own) + NODE_PRIOR) / _LOG_RATIO)

    def recent(self, name: str) -> list[float]:
        """The log lengths of the node's newest ``NODE_MEMORY`` closed stretches, oldest first."""
        k = self._slot.get(name)
        count = int(self._len[k]) if k is not None else 0
        return self._recent[k, NODE_MEMORY - count:].tolist() if count else []

    def node_scale(self, name: str) -> float:
        """The node's time scale ``f_i`` (1 for a node like the others)."""
        return GRID_RATIO ** self._scale(name)
class _StayTable:
    """``S`` on the grid with its running integral, and stays memoised per age interval."""

    def __init__(self, surv: list[float] | None, horizon_s: float) -> None:
        self.surv = surv
        self.h = horizon_s
        self.memo: dict[tuple[int, int], Stay] = {}
        self.cum = [0.0]
        if surv is not None:
            # cum[i+1] = cum[i] + (S_i + S_{i+1}) / 2 · (GRID[i+1] − GRID[i]): a sequential accumulate,
            # the same additions in the same order as a running loop
            arr = np.array(surv)
            steps = (arr[:-1] + arr[1:]) / 2.0 * _GRID_STEP
            self.cum = np.add.accumulate(np.concatenate(((0.0,), steps))).tolist()

    def s(self, t: float) -> float:
        if self.surv is None:
            return 1.0
        if t >= GRID[-1]:
            return self.surv[-1]
        i = _index(t)
        w = (t - GRID[i]) / (GRID[i + 1] - GRID[i])
        return self.surv[i] * (1 - w) + self.surv[i + 1] * w

    def integral(self, t: float) -> float:
        """∫₀ᵗ S."""
        if self.surv is None:
            return t
        if t >= GRID[-1]:
            return self.cum[-1] + self.surv[-1] * (t - GRID[-1])
        i = _index(t)
        return self.cum[i] + (self.surv[i] + self.s(t)) / 2.0 * (t - GRID[i])

    def _s_and_integral(self, t: float) -> tuple[float, float]:
        """``(S(t), ∫₀ᵗ S)``: :meth:`s` and :meth:`integral` with the grid index found once."""
        if self.surv is None:
            return 1.0, t
        return self._read(_at(t))

    def _read(self, at: tuple[int, float, float, float]) -> tuple[float, float]:
        """``(S, ∫S)`` where :func:`_at` says (a curve is set): linear between grid points, flat
        beyond the grid."""
        surv, cum = self.surv, self.cum
        assert surv is not None
        j, u, w, d = at
        if j < 0:
            return surv[-1], cum[-1] + surv[-1] * d
        st = surv[j] * u + surv[j + 1] * w
        return st, cum[j] + (surv[j] + st) / 2.0 * d

    def _conditional(self, age: float, window_s: float | None, f: float) -> Stay:
        """The stay of a node of ``age`` and time scale ``f`` (its survival is ``S(t / f)``)."""
        h = self.h
        upto = h if window_s is None else min(h, window_s)
        leave_window = 1.0 if window_s is not None and window_s < h else 0.0
        sa, ia = self._s_and_integral(age / f)
        if sa <= 0.0:             # older than anything that ended: nothing says it will end
            return Stay(upto / h, leave_window)
        s_upto, i_upto = self._s_and_integral((age + upto) / f)
        # ∫ S((age + t)/f) dt over [0, upto] = f · (I((age + upto)/f) − I(age/f))
        usable = f * (i_upto - ia) / sa
        s_h = s_upto if upto == h else self.s((age + h) / f)
        leave = max(leave_window, min(1.0, max(0.0, 1.0 - s_h / sa)))
        return Stay(min(1.0, max(0.0, usable / h)), leave)

    def memoised_many(self, pairs: Iterable[tuple[int, int]]) -> list[Stay]:
        """:meth:`memoised` of each ``(i, scale)`` (a new table's stays are all computed here, a
        few dozen per call)."""
        surv, memo, h, span, read = self.surv, self.memo, self.h, _span, self._read
        out = []
        for key in pairs:
            hit = memo.get(key)
            if hit is None:
                if surv is None:
                    f = GRID_RATIO ** key[1]
                    hit = self._conditional(GRID[key[0]] * f, None, f)
                else:
                    f, at_age, at_end = span(key[0], key[1], h)
                    sa, ia = read(at_age)
                    if sa <= 0.0:         # older than anything that ended: nothing says it will end
                        hit = Stay(h / h, 0.0)
                    else:
                        s_h, i_h = read(at_end)
                        usable = f * (i_h - ia) / sa
                        hit = Stay(min(1.0, max(0.0, usable / h)), max(0.0, min(1.0, max(0.0, 1.0 - s_h / sa))))
                memo[key] = hit
            out.append(hit)
        return out

    def memoised(self, i: int, scale: int) -> Stay:
        """The stay shared by ages in grid interval ``i`` (in the node's time) at ``scale``:
        :meth:`_conditional` of age ``GRID[i]·f`` without a window, with the grid reads of
        :func:`_span` (the same operations on the same values, so bitwise the same Stay)."""
        hit = self.memo.get((i, scale))
        return hit if hit is not None else self.memoised_many(((i, scale),))[0]

    def stay(self, age_s: float, window_s: float | None, scale: int = 0) -> Stay:
        """``scale``: the node's time scale as a power of GRID_RATIO."""
        f = GRID_RATIO ** scale
        if window_s is not None and window_s < self.h:
            return self._conditional(age_s, window_s, f)
        # ages within one grid interval (in the node's time) share a prediction
        return self.memoised(_index(age_s / f), scale)
