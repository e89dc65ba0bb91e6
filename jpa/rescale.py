"""Learned rescale pauses: what starting, growing, shrinking and losing nodes really cost a job.

A :class:`~malletrain.domain.model.PauseSample` is one measured pause, from the
moment the job was told to change size (or lost a node) to its first step at the
new size (stop, checkpoint, Slurm's requeue, launch, restore: everything the job
did not train).  Pauses are kept per job and kind, and pooled per profile (jobs
of one model restart alike; profiles are per user unless an operator shares them).

Kinds (:class:`~malletrain.domain.model.PauseKind`).  A job that restarts on
every change pays one restart whatever the kind, so its pauses are kept per
direction, as two kinds: ``start`` (its starts and grows) and ``shrink`` (its
shrinks and preemptions; a loss is a crash and is not measured).  An elastic
group (issue #26) re-forms in place, so each of its five kinds is kept on its
own: a start is a restart of every member, a grow costs the survivors a
re-forming plus the joiners' start, a shrink or preemption a re-forming, a loss
the time to notice it.  Elastic and restarting jobs of one profile are pooled
apart, and a group's preemptions and losses (which its own file alone reports)
are not pooled at all.

Estimate for a job and kind: the median of its own newest ``keep``
measurements *and a prior*, which counts as one more measurement.  The prior is
the median of its profile's newest ``keep`` measurements of that kind (other
jobs of the same model) when there are some, else a guess: the job's configured
pause of that direction for a start, grow or shrink (the user's guess); the
estimated shrink for a preemption, which re-forms the same way; the estimated
preemption for a loss.  So before its own first measurement a job is charged
what its profile measured, or its guess; after one, the mean of that and the
measurement; from two on, its own measurements outvote a wrong prior.  A median
shrugs off the odd slow restart.

Pure: no clock, no I/O.
"""
from __future__ import annotations

import math
import statistics
from collections import deque

from malletrain.domain.model import MAX_PAUSE_S, PauseKind, PauseSample, RescaleCost

START, GROW, SHRINK, PREEMPTION, LOSS = PauseKind
_RESTART_KIND = {START: START, GROW: START, SHRINK: SHRINK, PREEMPTION: SHRINK, LOSS: SHRINK}
_OLD_KIND = {"up": START, "down": SHRINK}      # stores written before the kinds (directions)
# a group's pauses no change of the daemon's caused: its file alone says they happened, so they
# teach only that group, never its profile (other jobs, other users' where profiles are shared)
_UNPROMPTED = (PREEMPTION, LOSS)


def _kind(value: str) -> PauseKind:
    return _OLD_KIND.get(value) or PauseKind(value)


class RescaleLearner:
    MAX_PROFILES = 8192      # (profile, kind) pairs whose pauses are kept
    MAX_JOBS = 1 << 17       # (job, kind) pairs (finished jobs are forgotten)

    def __init__(self, *, keep: int = 15) -> None:
        self.keep = keep
        self._jobs: dict[tuple[str, PauseKind], deque[float]] = {}
        self._profiles: dict[tuple[str, PauseKind, bool], deque[float]] = {}
        self._profile: dict[str, str] = {}        # job -> its profile ('' = none)
        self._elastic: set[str] = set()           # jobs that re-form in place (issue #26)
        self.rejected = 0
        self.version = 0        # bumps with every change that can change a cost
        # cost() memo per job, valid while the job's own data, its profile's pool and the epoch
        # (bumped by what can touch any job: loads, prunes, evictions) are as they were
        self._job_stamp: dict[str, int] = {}
        self._pool_stamp: dict[tuple[str, bool], int] = {}
        self._epoch = 0
        self._memo: dict[str, tuple[tuple, RescaleCost]] = {}

    def _touch_job(self, job_id: str) -> None:
        self._job_stamp[job_id] = self._job_stamp.get(job_id, 0) + 1

    def _touch_pool(self, key: tuple[str, bool]) -> None:
        if key not in self._pool_stamp and len(self._pool_stamp) >= 2 * self.MAX_PROFILES:
            self._new_epoch()
        self._pool_stamp[key] = self._pool_stamp.get(key, 0) + 1

    def _new_epoch(self) -> None:
        """Something that can change any job's cost: every memoised cost goes."""
        self._epoch += 1
        self._memo.clear()
        self._job_stamp.clear()
        self._pool_stamp.clear()

    def register(self, job_id: str, profile: str, elastic: bool = False) -> None:
        if self._profile.get(job_id) != profile:
            self._profile[job_id] = profile
            self._touch_job(job_id)
            self.version += 1
        if elastic != (job_id in self._elastic):
            (self._elastic.add if elastic else self._elastic.discard)(job_id)
            self._touch_job(job_id)
            self.version += 1

    def elastic(self, job_id: str) -> bool:
        """Whether ``job_id`` re-forms in place (its pauses are kept per kind)."""
        return job_id in self._elastic

    def forget(self, job_id: str) -> None:
        """A finished job: its own measurements go (its profile keeps what it contributed)."""
        self._profile.pop(job_id, None)
        self._elastic.discard(job_id)
        for k in PauseKind:
            self._jobs.pop((job_id, k), None)
        self._memo.pop(job_id, None)
        self._job_stamp.pop(job_id, None)
        self.version += 1

    def _key(self, job_id: str, kind: PauseKind) -> PauseKind:
        """The kind a job's pause is kept as: its own for an elastic group, else its direction's."""
        return kind if job_id in self._elastic else _RESTART_KIND[kind]

    def add(self, sample: PauseSample) -> bool:
        """Record one measured pause; False (counted) when it is not plausible."""
        p = sample.pause_s
        if (isinstance(p, bool) or not isinstance(p, (int, float)) or not math.isfinite(p)
                or not 0.0 <= p <= MAX_PAUSE_S):
            self.rejected += 1
            return False
        kind = self._key(sample.job_id, sample.kind)
        self._push(self._jobs, (sample.job_id, kind), float(p), self.MAX_JOBS)
        self._touch_job(sample.job_id)
        prof = self._profile.get(sample.job_id, "")
        if prof and kind not in _UNPROMPTED:     # what no change of the daemon's caused stays the job's
            elastic = sample.job_id in self._elastic
            self._push(self._profiles, (prof, kind, elastic), float(p), self.MAX_PROFILES)
            self._touch_pool((prof, elastic))
        self.version += 1
        return True

    def _push(self, table: dict, key: tuple, p: float, limit: int) -> None:
        q = table.pop(key, None) or deque(maxlen=self.keep)
        q.append(p)
        table[key] = q                      # newest keys last: the oldest go first
        while len(table) > limit:
            del table[next(iter(table))]
            self._new_epoch()               # another job's or profile's pauses went

    def prune(self, jobs: set[str]) -> None:
        """Keep only these jobs' own measurements (the others ended unseen); profiles stay."""
        for key in [k for k in self._jobs if k[0] not in jobs]:
            del self._jobs[key]
        for job in [j for j in self._profile if j not in jobs]:
            del self._profile[job]
        self._elastic &= jobs
        self._new_epoch()
        self.version += 1

    # persistence (the daemon's store keeps this across restarts)
    def dump(self) -> dict:
        return {"jobs": [[j, k.value, list(q)] for (j, k), q in self._jobs.items()],
                "profiles": [[p, k.value, list(q), e] for (p, k, e), q in self._profiles.items()],
                "job_profiles": dict(self._profile), "elastic": sorted(self._elastic)}

    def load(self, data: dict) -> None:
        """What :meth:`dump` wrote (or a store from before the kinds: ``up`` and ``down`` become
        ``start`` and ``shrink``); implausible values are left out, bounds apply as in :meth:`add`."""
        for key, table, limit in (("jobs", self._jobs, self.MAX_JOBS), ("profiles", self._profiles, self.MAX_PROFILES)):
            for entry in data.get(key, []):
                try:
                    name, kind, values = entry[:3]
                    k = (str(name), _kind(kind)) if key == "jobs" else \
                        (str(name), _kind(kind), bool(entry[3]) if len(entry) > 3 else False)
                    values = list(values)
                except (TypeError, ValueError):
                    self.rejected += 1          # one bad entry (an older or damaged store): the rest load
                    continue
                for v in values:
                    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) \
                            and 0 <= v <= MAX_PAUSE_S:
                        self._push(table, k, float(v), limit)
        for job, prof in list(data.get("job_profiles", {}).items())[:self.MAX_JOBS]:
            self._profile.setdefault(str(job), str(prof))
        self._elastic.update(str(j) for j in list(data.get("elastic", []))[:self.MAX_JOBS])
        self._new_epoch()
        self.version += 1

    def measured(self, job_id: str, kind: PauseKind) -> tuple[float, ...]:
        """The job's own measurements of the pause ``kind`` is kept as (:meth:`_key`)."""
        return tuple(self._jobs.get((job_id, self._key(job_id, kind)), ()))

    def prior(self, job_id: str, kind: PauseKind, guess_s: float) -> float:
        """What the job is charged before its own measurements: its profile's median, or the guess."""
        key = (self._profile.get(job_id, ""), self._key(job_id, kind), job_id in self._elastic)
        pooled = self._profiles.get(key)
        return float(statistics.median(pooled)) if pooled else guess_s

    def _estimate(self, job_id: str, kind: PauseKind, guess_s: float) -> tuple[float, int]:
        own = self.measured(job_id, kind)
        prior = self.prior(job_id, kind, guess_s)
        return (float(statistics.median((*own, prior))) if own else prior), len(own)

    def cost(self, job_id: str, up_guess_s: float, down_guess_s: float) -> RescaleCost:
        """The pauses to charge ``job_id``: learned, with the prior as one more measurement.
        Memoised per job while what it reads is unchanged (its own pauses, its profile and the
        profile's pool, whether it is elastic, the guesses)."""
        profile, elastic = self._profile.get(job_id, ""), job_id in self._elastic
        key = (up_guess_s, down_guess_s, self._epoch, self._job_stamp.get(job_id, 0), profile, elastic,
               self._pool_stamp.get((profile, elastic), 0))
        hit = self._memo.get(job_id)
        if hit is not None and hit[0] == key:
            return hit[1]
        cost = self._cost(job_id, up_guess_s, down_guess_s)
        if len(self._memo) >= self.MAX_JOBS:
            self._memo.clear()
        self._memo[job_id] = (key, cost)
        return cost

    def _cost(self, job_id: str, up_guess_s: float, down_guess_s: float) -> RescaleCost:
        up, up_n = self._estimate(job_id, START, up_guess_s)
        down, down_n = self._estimate(job_id, SHRINK, down_guess_s)
        if job_id not in self._elastic:
            return RescaleCost(up, down, up_n, down_n)
        grow, grow_n = self._estimate(job_id, GROW, up_guess_s)
        taken, taken_n = self._estimate(job_id, PREEMPTION, down)
        loss, loss_n = self._estimate(job_id, LOSS, taken)
        return RescaleCost(up, down, up_n, down_n, grow, taken, loss, grow_n, taken_n, loss_n)
