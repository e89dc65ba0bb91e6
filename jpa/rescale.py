"""Learned rescale pauses: what starting, growing and shrinking really cost a job.

A :class:`~malletrain.domain.model.PauseSample` is one measured pause, from the
moment the job was told to change size to its first step at the new size
(stop, checkpoint, Slurm's requeue, launch, restore: everything the job did
not train).  Pauses are kept per job and direction (``up``: start or grow;
``down``: shrink), and pooled per profile (jobs of one model restart alike;
profiles are per user unless an operator shares them).

Estimate for a job and direction: the median of its own newest ``keep``
measurements *and a prior*, which counts as one more measurement.  The prior is
the median of its profile's newest ``keep`` measurements (other jobs of the
same model) when there are some, else the job's configured pause (the user's
guess).  So before its own first measurement a job is charged what its profile
measured, or its guess; after one, the mean of that and the measurement; from
two on, its own measurements outvote a wrong prior.  A median shrugs off the
odd slow restart.

Pure: no clock, no I/O.
"""
from __future__ import annotations

import math
import statistics
from collections import deque

from malletrain.domain.model import MAX_PAUSE_S, Direction, PauseSample, RescaleCost


class RescaleLearner:
    MAX_PROFILES = 8192      # (profile, direction) pairs whose pauses are kept
    MAX_JOBS = 1 << 17       # (job, direction) pairs (finished jobs are forgotten)

    def __init__(self, *, keep: int = 15) -> None:
        self.keep = keep
        self._jobs: dict[tuple[str, Direction], deque[float]] = {}
        self._profiles: dict[tuple[str, Direction], deque[float]] = {}
        self._profile: dict[str, str] = {}        # job -> its profile ('' = none)
        self.rejected = 0
        self.version = 0        # bumps with every change that can change a cost

    def register(self, job_id: str, profile: str) -> None:
        if self._profile.get(job_id) != profile:
            self._profile[job_id] = profile
            self.version += 1

    def forget(self, job_id: str) -> None:
        """A finished job: its own measurements go (its profile keeps what it contributed)."""
        self._profile.pop(job_id, None)
        for d in Direction:
            self._jobs.pop((job_id, d), None)
        self.version += 1

    def add(self, sample: PauseSample) -> bool:
        """Record one measured pause; False (counted) when it is not plausible."""
        p = sample.pause_s
        if (isinstance(p, bool) or not isinstance(p, (int, float)) or not math.isfinite(p)
                or not 0.0 <= p <= MAX_PAUSE_S):
            self.rejected += 1
            return False
        self._push(self._jobs, (sample.job_id, sample.direction), float(p), self.MAX_JOBS)
        prof = self._profile.get(sample.job_id, "")
        if prof:
            self._push(self._profiles, (prof, sample.direction), float(p), self.MAX_PROFILES)
        self.version += 1
        return True

    def _push(self, table: dict, key: tuple[str, Direction], p: float, limit: int) -> None:
        q = table.pop(key, None) or deque(maxlen=self.keep)
        q.append(p)
        table[key] = q                      # newest keys last: the oldest go first
        while len(table) > limit:
            del table[next(iter(table))]

    def prune(self, jobs: set[str]) -> None:
        """Keep only these jobs' own measurements (the others ended unseen); profiles stay."""
        for key in [k for k in self._jobs if k[0] not in jobs]:
            del self._jobs[key]
        for job in [j for j in self._profile if j not in jobs]:
            del self._profile[job]
        self.version += 1

    # persistence (the daemon's store keeps this across restarts)
    def dump(self) -> dict:
        return {"jobs": [[j, d.value, list(q)] for (j, d), q in self._jobs.items()],
                "profiles": [[p, d.value, list(q)] for (p, d), q in self._profiles.items()],
                "job_profiles": dict(self._profile)}

    def load(self, data: dict) -> None:
        """What :meth:`dump` wrote; implausible values are left out, bounds apply as in :meth:`add`."""
        for key, table, limit in (("jobs", self._jobs, self.MAX_JOBS), ("profiles", self._profiles, self.MAX_PROFILES)):
            for name, direction, values in data.get(key, []):
                for v in values:
                    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) \
                            and 0 <= v <= MAX_PAUSE_S:
                        self._push(table, (str(name), Direction(direction)), float(v), limit)
        for job, prof in list(data.get("job_profiles", {}).items())[:self.MAX_JOBS]:
            self._profile.setdefault(str(job), str(prof))
        self.version += 1

    def measured(self, job_id: str, direction: Direction) -> tuple[float, ...]:
        return tuple(self._jobs.get((job_id, direction), ()))

    def prior(self, job_id: str, direction: Direction, guess_s: float) -> float:
        """What the job is charged before its own measurements: its profile's median, or its guess."""
        pooled = self._profiles.get((self._profile.get(job_id, ""), direction))
        return float(statistics.median(pooled)) if pooled else guess_s

    def cost(self, job_id: str, up_guess_s: float, down_guess_s: float) -> RescaleCost:
        """The pauses to charge ``job_id``: learned, with the prior as one more measurement."""
        up = self.measured(job_id, Direction.UP)
        down = self.measured(job_id, Direction.DOWN)
        return RescaleCost(_estimate(up, self.prior(job_id, Direction.UP, up_guess_s)),
                           _estimate(down, self.prior(job_id, Direction.DOWN, down_guess_s)),
                           len(up), len(down))


def _estimate(measured: tuple[float, ...], prior_s: float) -> float:
    if not measured:
        return prior_s
    return float(statistics.median((*measured, prior_s)))
