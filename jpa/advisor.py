"""The advisor: samples in, predicted curves (with probes) out.

It keeps per-job throughput samples, cleans them, fits :mod:`jpa.model` and
answers :meth:`Advisor.curve`.  Pure: no I/O, no clock (sample times come in).

Cleaning rules
  * non-finite, non-positive or absurd samples are rejected at ``add`` and
    counted in ``rejected``;
  * warm-up: the first ``warmup_samples`` samples of every contiguous run at
    one node count are dropped (the first steps after a (re)start are slow);
  * outliers: per count, samples further than ``outlier_mad`` scaled median
    absolute deviations from the median are dropped.

Prior sharing: jobs with the same ``profile`` key (HPO trials of one model)
share a *shape*.  A job with fewer than 3 measured counts whose profile has a
fitted shape uses that shape, scaled to its own measurements; it needs no
more probing.  A job with no measurement and no profile shape is probed.
"""
from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable, Sequence

from jpa.model import ScalingFit, fit_scaling
from malletrain.model import Curve, CurvePoint

MAX_SAMPLES_PER_JOB = 2000  # older samples are thinned beyond this


@dataclass(frozen=True)
class Sample:
    job_id: str
    nodes: int
    samples_per_s: float
    t_s: float


def probe_counts(min_nodes: int, max_nodes: int, k: int = 3) -> tuple[int, ...]:
    """The node counts worth probing before a job has data (at most ``k``).

    Geometric: min, 2·min, 4·min, clipped to ``max_nodes``; a short range
    is covered by its ends and middle instead.
    """
    lo, hi = max(1, min_nodes), max(1, max_nodes)
    if hi <= lo:
        return (lo,)
    counts = [lo * (2 ** i) for i in range(k) if lo * (2 ** i) <= hi]
    if len(counts) < min(k, hi - lo + 1):
        counts = sorted({lo, round(math.sqrt(lo * hi)), hi})
    return tuple(counts[:k])


class Advisor:
    """Online throughput profiler for all malleable jobs."""

    def __init__(self, *, warmup_samples: int = 1, min_samples: int = 2,
                 outlier_mad: float = 4.0, max_probes: int = 3) -> None:
        self.warmup_samples = warmup_samples
        self.min_samples = min_samples
        self.outlier_mad = outlier_mad
        self.max_probes = max_probes
        self._samples: dict[str, list[Sample]] = defaultdict(list)
        self._profile: dict[str, str] = {}
        self._fits: dict[str, ScalingFit | None] = {}
        self._shapes: dict[str, ScalingFit | None] = {}
        self.rejected = 0

    # -- input -----------------------------------------------------------
    def register(self, job_id: str, profile: str) -> None:
        if self._profile.get(job_id) != profile:
            self._profile[job_id] = profile
            self._shapes.pop(profile, None)

    def forget(self, job_id: str) -> None:
        """Drop a finished job's own state; its data stays in its profile's shape."""
        self._fits.pop(job_id, None)

    def add(self, sample: Sample) -> bool:
        """Record one sample; returns False (and counts it) when rejected."""
        x = sample.samples_per_s
        if (not isinstance(sample.nodes, int) or sample.nodes <= 0
                or not isinstance(x, (int, float)) or not math.isfinite(x) or x <= 0
                or not math.isfinite(sample.t_s)):
            self.rejected += 1
            return False
        buf = self._samples[sample.job_id]
        buf.append(sample)
        if len(buf) > MAX_SAMPLES_PER_JOB:
            del buf[1:len(buf) // 2:2]  # thin the older half, keep the newest
        self._fits.pop(sample.job_id, None)
        self._shapes.pop(self._profile.get(sample.job_id, ""), None)
        return True

    def add_many(self, samples: Iterable[Sample]) -> int:
        return sum(1 for s in samples if self.add(s))

    # -- cleaning and fitting -------------------------------------------
    def clean(self, job_id: str) -> dict[int, list[float]]:
        """Per node count, the samples that survive warm-up and outlier rules."""
        runs: dict[int, list[float]] = defaultdict(list)
        prev_nodes, in_run = None, 0
        for s in sorted(self._samples.get(job_id, ()), key=lambda s: s.t_s):
            in_run = in_run + 1 if s.nodes == prev_nodes else 1
            prev_nodes = s.nodes
            if in_run > self.warmup_samples:
                runs[s.nodes].append(s.samples_per_s)
        out: dict[int, list[float]] = {}
        for n, xs in runs.items():
            med = statistics.median(xs)
            mad = statistics.median(abs(x - med) for x in xs) * 1.4826
            keep = [x for x in xs if mad == 0 or abs(x - med) <= self.outlier_mad * mad]
            if len(keep) >= self.min_samples:
                out[n] = keep
        return out

    def measured(self, job_id: str) -> dict[int, float]:
        """Per measured node count, the median clean throughput."""
        return {n: statistics.median(xs) for n, xs in self.clean(job_id).items()}

    def own_fit(self, job_id: str) -> ScalingFit | None:
        if job_id not in self._fits:
            m = self.measured(job_id)
            self._fits[job_id] = (fit_scaling(list(m), list(m.values()), terms=len(m))
                                  if m else None)
        return self._fits[job_id]

    def shape(self, profile: str) -> ScalingFit | None:
        """The profile's shared shape: pooled over its jobs with ≥3 counts."""
        if not profile:
            return None
        if profile not in self._shapes:
            members = [j for j, p in self._profile.items() if p == profile]
            full = [(j, self.measured(j)) for j in members]
            full = [(j, m) for j, m in full if len(m) >= 3]
            shape = None
            if full:
                ref = max(full, key=lambda jm: len(jm[1]))
                ref_fit = fit_scaling(list(ref[1]), list(ref[1].values()))
                counts, xs = [], []
                for _, m in full:   # normalise each job onto the reference scale
                    k = statistics.median(ref_fit.time_per_sample(n) * x for n, x in m.items())
                    counts += list(m)
                    xs += [x / k for x in m.values()]
                shape = fit_scaling(counts, xs)
            self._shapes[profile] = shape
        return self._shapes[profile]

    # -- output ----------------------------------------------------------
    def curve(self, job_id: str, min_nodes: int, max_nodes: int,
              counts: Sequence[int], profile: str = "") -> Curve:
        """Predicted throughput at ``counts`` plus the next probe, if any.

        Band: ``mean·(1 ± 2σ)`` with ``σ = max(rel_rmse, 2%) · (1 + d)``,
        ``d`` = log2 distance to the nearest measured count (extrapolation
        widens the band).
        """
        self.register(job_id, profile or self._profile.get(job_id, ""))
        measured = self.measured(job_id)
        probe = None
        fit = None
        source = "fit"
        shape = self.shape(self._profile.get(job_id, ""))
        if len(measured) >= 3:
            fit = self.own_fit(job_id)
        elif shape is not None and measured:
            k = statistics.median(x * shape.time_per_sample(n) for n, x in measured.items())
            fit, source = shape.rescaled(1.0 / k) if k > 0 else shape, "profile-prior"
        else:
            wanted = [n for n in probe_counts(min_nodes, max_nodes, self.max_probes)
                      if n not in measured]
            probe = wanted[0] if wanted else None
            if measured:
                fit, source = self.own_fit(job_id), "partial-fit"
            elif shape is not None:
                fit, source = shape, "profile-prior"
                probe = probe_counts(min_nodes, max_nodes, 1)[0]
        if fit is None:
            return Curve(points={}, probe=probe, source="no-data")
        base = measured or {n: 0.0 for n in fit.counts}
        sigma0 = max(fit.rel_rmse, 0.02)
        points = {}
        for n in counts:
            if n <= 0:
                continue
            mean = fit.throughput(n)
            d = min(abs(math.log2(n / m)) for m in base) if base else 3.0
            s = sigma0 * (1.0 + d)
            points[n] = CurvePoint(mean, max(0.0, mean * (1 - 2 * s)), mean * (1 + 2 * s))
        return Curve(points=points, probe=probe, source=source)
