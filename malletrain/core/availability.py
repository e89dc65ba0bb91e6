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

Costs: an update is O(changes + log n) (entry times are kept sorted: nodes enter
at the current time); a prediction rebuilds the survival table once per call
(O(grid · log n)) and is then O(1) per node (ages are looked up on the grid).
Pure: no clock, no I/O; times come in.
"""
from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Iterable, Sequence

from malletrain.domain.model import Node, Stay

GRID_RATIO = 1.25           # consecutive grid points differ by 25%
NODE_MEMORY = 8             # a node's own stretches that set its time scale
NODE_PRIOR = 2.0            # ... shrunk towards the pooled curve as if this many typical ones were seen
GRID_MAX_S = 1.3e8          # ~4 years: longer is 'for ever'
_RENORM = 1e200             # weights are rescaled before they overflow


def _grid() -> tuple[float, ...]:
    pts = [0.0, 1.0]
    while pts[-1] < GRID_MAX_S:
        pts.append(pts[-1] * GRID_RATIO)
    return tuple(pts)


GRID = _grid()
_LOG_RATIO = math.log(GRID_RATIO)


def _index(age_s: float) -> int:
    """The grid interval holding ``age_s``: GRID[i] <= age < GRID[i+1]."""
    if age_s < 1.0:
        return 0
    return min(len(GRID) - 2, 1 + int(math.log(age_s) / _LOG_RATIO))


class IdleHistory:
    def __init__(self, *, min_stretches: int = 20, half_life: int = 2000) -> None:
        self.min_stretches = min_stretches
        self.decay = 0.5 ** (1.0 / half_life)
        self.since: dict[str, float] = {}        # node -> when its open stretch began
        self._starts: list[float] = []            # the open stretches' beginnings, sorted
        self._closed = [0.0] * (len(GRID) - 1)    # decayed count of closed stretches per grid interval
        self._weight = 1.0                        # weight of the next closed stretch (grows by 1/decay)
        self.closed = 0                           # stretches closed so far (undecayed count)
        self.version = 0                          # bumps with every change
        self.recent: dict[str, deque[float]] = {}  # node -> log lengths of its newest stretches
        self._log_sum = 0.0                         # decayed Σ log length of closed stretches
        self._log_weight = 0.0

    # -- input ------------------------------------------------------------
    def update(self, now_s: float, pool: Iterable[str]) -> None:
        """The harvestable pool at ``now_s``: open stretches for new nodes, close gone ones."""
        names = set(pool)
        gone = [n for n in self.since if n not in names]
        for n in gone:
            start = self.since.pop(n)
            i = bisect.bisect_left(self._starts, start)
            del self._starts[i]
            length = max(0.0, now_s - start)
            self._close(length)
            self.recent.setdefault(n, deque(maxlen=NODE_MEMORY)).append(math.log(max(1.0, length)))
        new = [n for n in names if n not in self.since]
        for n in new:
            self.since[n] = now_s
            if self._starts and self._starts[-1] > now_s:     # a clock that went back: keep it sorted
                bisect.insort(self._starts, now_s)
            else:
                self._starts.append(now_s)
        if gone or new:
            self.version += 1

    def _close(self, length_s: float) -> None:
        self._closed[_index(length_s)] += self._weight
        self._log_sum += self._weight * math.log(max(1.0, length_s))
        self._log_weight += self._weight
        self._weight /= self.decay
        self.closed += 1
        if self._weight > _RENORM:
            self._closed = [c / self._weight for c in self._closed]
            self._log_sum /= self._weight
            self._log_weight /= self._weight
            self._weight = 1.0

    # -- the survival curve -------------------------------------------------
    def survival(self, now_s: float) -> list[float] | None:
        """``S`` at every grid point (Kaplan–Meier over closed and open stretches), or None
        before ``min_stretches`` have closed."""
        if self.closed < self.min_stretches:
            return None
        k = len(GRID) - 1
        # open stretches per grid interval of their age, at the current weight
        censored = [0.0] * k
        hi = len(self._starts)
        for i in range(k):
            lo = bisect.bisect_right(self._starts, now_s - GRID[i + 1]) if i + 1 < len(GRID) else 0
            censored[i] = (hi - lo) * self._weight
            hi = lo
        censored[k - 1] += hi * self._weight
        at_risk = sum(self._closed) + sum(censored)
        surv = [1.0]
        s = 1.0
        for i in range(k):
            d = self._closed[i]
            # stretches censored inside the interval count as half at risk (actuarial estimate)
            risk = at_risk - censored[i] / 2.0
            if risk > 0 and d > 0:
                s *= max(0.0, 1.0 - d / risk)
            surv.append(s)
            at_risk -= d + censored[i]
        return surv

    def stays(self, now_s: float, nodes: Sequence[Node], horizon_s: float) -> dict[str, Stay]:
        """Predicted :class:`Stay` of each node (only nodes with a prediction or a known window)."""
        surv = self.survival(now_s)
        table = _StayTable(surv, horizon_s)
        out: dict[str, Stay] = {}
        for n in nodes:
            window = None if n.window_end_s is None else max(0.0, n.window_end_s - now_s)
            if surv is None and (window is None or window >= horizon_s):
                continue
            out[n.name] = table.stay(max(0.0, now_s - self.since.get(n.name, now_s)), window,
                                     self._scale(n.name) if surv is not None else 0)
        return out

    def _scale(self, name: str) -> int:
        """log_{GRID_RATIO} of the node's time scale ``f_i`` (0: a node like the others)."""
        own = self.recent.get(name)
        if not own or self._log_weight <= 0:
            return 0
        typical = self._log_sum / self._log_weight
        return round((sum(own) - len(own) * typical) / (len(own) + NODE_PRIOR) / _LOG_RATIO)

    def node_scale(self, name: str) -> float:
        """The node's time scale ``f_i`` (1 for a node like the others)."""
        return GRID_RATIO ** self._scale(name)


class _StayTable:
    """``S`` on the grid with its running integral, and stays memoised per age interval."""

    def __init__(self, surv: list[float] | None, horizon_s: float) -> None:
        self.surv = surv
        self.h = horizon_s
        self.memo: dict[tuple[int, int], Stay] = {}
        cum = [0.0]
        if surv is not None:
            for i in range(len(GRID) - 1):
                cum.append(cum[-1] + (surv[i] + surv[i + 1]) / 2.0 * (GRID[i + 1] - GRID[i]))
        self.cum = cum

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

    def _conditional(self, age: float, window_s: float | None, f: float) -> Stay:
        """The stay of a node of ``age`` and time scale ``f`` (its survival is ``S(t / f)``)."""
        upto = self.h if window_s is None else min(self.h, window_s)
        leave_window = 1.0 if window_s is not None and window_s < self.h else 0.0
        sa = self.s(age / f)
        if sa <= 0.0:             # older than anything that ended: nothing says it will end
            return Stay(upto / self.h, leave_window)
        # ∫ S((age + t)/f) dt over [0, upto] = f · (I((age + upto)/f) − I(age/f))
        usable = f * (self.integral((age + upto) / f) - self.integral(age / f)) / sa
        leave = max(leave_window, min(1.0, max(0.0, 1.0 - self.s((age + self.h) / f) / sa)))
        return Stay(min(1.0, max(0.0, usable / self.h)), leave)

    def stay(self, age_s: float, window_s: float | None, scale: int = 0) -> Stay:
        """``scale``: the node's time scale as a power of GRID_RATIO."""
        f = GRID_RATIO ** scale
        if window_s is not None and window_s < self.h:
            return self._conditional(age_s, window_s, f)
        i = _index(age_s / f)        # ages within one grid interval (in the node's time) share a prediction
        hit = self.memo.get((i, scale))
        if hit is None:
            hit = self._conditional(GRID[i] * f, None, f)
            self.memo[(i, scale)] = hit
        return hit
