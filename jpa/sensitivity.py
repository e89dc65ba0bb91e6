"""Sensitivity: how much a job slows down on slow nodes and across topology groups, learned.

Each throughput sample carries two facts about the nodes it ran on (the site's or Slurm's,
never the job's): ``slowdown``, the slowest node's factor (1 = nominal; synchronous training
waits for it), and ``groups``, how many topology groups (switches, cabinets) they span.  The
model, per job, at each node count ``n``::

    rate = base(n) · slowdown^(−s) · (1 − p)^(groups − 1)

``s`` (0: does not care, 1: runs at the slowest node's speed) and ``p`` (the share lost per
extra group) are fitted by least squares on ``log rate`` against ``log slowdown`` and
``groups − 1``, each centred within its node count (so the scaling curve itself cancels
out); ``s`` is kept only when its standard error is at most ``MAX_SE`` (runs on too alike
nodes, or too noisy, say nothing).  A job whose runs never differed in either has no estimate; one with an estimate
feeds its profile (profiles are per user unless shared), and a job without its own
estimate gets its profile's.  Bounded: the newest ``keep`` samples per job and count, at most
``MAX_COUNTS`` counts per job; only samples at the size the job holds are taken.

Pure: no clock, no I/O.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from malletrain.domain.model import Sample

MIN_SPREAD = 0.02 ** 2     # Σ (centred log slowdown)²: below, the runs' speeds did not differ enough
MAX_COUNTS = 16            # node counts whose samples a job keeps (the oldest count goes first)
MAX_SE = 0.5               # standard error of the exponent above which it is not told (left 0)


@dataclass(frozen=True)
class Sensitivity:
    slowdown: float            # the exponent s
    per_group: float           # the share p lost per extra group
    samples: int               # samples behind the estimate


class SensitivityLearner:
    MAX_JOBS = 1 << 16
    MAX_PROFILES = 8192

    def __init__(self, keep: int = 64) -> None:
        self.keep = keep
        self._obs: dict[str, dict[int, deque[tuple[float, float, float]]]] = {}
        self._profile: dict[str, str] = {}
        self._profiles: dict[str, Sensitivity] = {}
        self._fits: dict[str, tuple[int, Sensitivity | None]] = {}   # job -> (samples at the fit, fit)
        self._added: dict[str, int] = {}                              # samples since the last fit
        self.version = 0

    def register(self, job_id: str, profile: str) -> None:
        if self._profile.get(job_id) != profile:
            self._profile[job_id] = profile
            self.version += 1

    def forget(self, job_id: str) -> None:
        self._obs.pop(job_id, None)
        self._profile.pop(job_id, None)
        self._fits.pop(job_id, None)
        self._added.pop(job_id, None)
        self.version += 1

    def add(self, s: Sample) -> None:
        if not (math.isfinite(s.samples_per_s) and s.samples_per_s > 0 and math.isfinite(s.slowdown)
                and 0 < s.slowdown < 1e3 and 1 <= s.groups <= 1_000_000):
            return
        per = self._obs.setdefault(s.job_id, {})
        if s.nodes not in per and len(per) >= MAX_COUNTS:      # the oldest count's samples go
            del per[next(iter(per))]
        q = per.setdefault(s.nodes, deque(maxlen=self.keep))
        q.append((math.log(s.slowdown), float(s.groups - 1), math.log(s.samples_per_s)))
        if len(self._obs) > self.MAX_JOBS:
            old = next(iter(self._obs))
            del self._obs[old]
            self._fits.pop(old, None)
        added = self._added.get(s.job_id, 0) + 1
        self._added[s.job_id] = added
        fitted = self._fits.get(s.job_id)
        if fitted is None or added >= max(4, fitted[0] // 4):   # refit after a quarter more samples
            self._refit(s.job_id)

    def _refit(self, job_id: str) -> None:
        est = self._fit(job_id)
        self._fits[job_id] = (sum(len(q) for q in self._obs.get(job_id, {}).values()), est)
        self._added[job_id] = 0
        prof = self._profile.get(job_id, "")
        if est is not None and prof:
            self._profiles.pop(prof, None)
            self._profiles[prof] = est
            while len(self._profiles) > self.MAX_PROFILES:
                del self._profiles[next(iter(self._profiles))]
        self.version += 1

    def _fit(self, job_id: str) -> Sensitivity | None:
        sxx = sxg = sgg = sxy = sgy = syy = 0.0
        n = groups = 0
        for obs in self._obs.get(job_id, {}).values():
            if len(obs) < 2:
                continue
            groups += 1
            mx = sum(o[0] for o in obs) / len(obs)
            mg = sum(o[1] for o in obs) / len(obs)
            my = sum(o[2] for o in obs) / len(obs)
            for x, g, y in obs:
                dx, dg, dy = x - mx, g - mg, y - my
                sxx += dx * dx
                sxg += dx * dg
                sgg += dg * dg
                sxy += dx * dy
                sgy += dg * dy
                syy += dy * dy
                n += 1
        bx = bg = 0.0                  # slopes of log rate on log slowdown and on extra groups
        have_x, have_g = sxx > MIN_SPREAD, sgg > 0.5
        if have_x and have_g and (det := sxx * sgg - sxg * sxg) > 1e-6 * sxx * sgg:
            bx = (sxy * sgg - sgy * sxg) / det
            bg = (sgy * sxx - sxy * sxg) / det
        elif have_x:
            bx = sxy / sxx
        elif have_g:
            bg = sgy / sgg
        else:
            return None
        # the exponent only where the runs' speeds told it apart from the noise: its standard
        # error (residual spread over the slowdown spread) must be small
        dof = n - groups - int(have_x) - int(have_g)
        rss = max(0.0, syy - bx * sxy - bg * sgy)
        if have_x and (dof < 1 or math.sqrt(rss / dof / sxx) > MAX_SE):
            bx = 0.0
            if not have_g:
                return None
        return Sensitivity(min(2.0, max(0.0, -bx)), min(0.9, max(0.0, 1.0 - math.exp(min(bg, 0.0)))), n)

    def get(self, job_id: str) -> Sensitivity | None:
        """The job's estimate (refitted after a quarter more samples), else its profile's, else None."""
        fitted = self._fits.get(job_id)
        return (fitted[1] if fitted else None) or self._profiles.get(self._profile.get(job_id, ""))
