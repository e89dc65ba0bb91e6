"""Where each policy's curves come from.

* ``malletrain`` – the JPA, fed only by the samples jobs report;
* ``oracle``, ``bftrainer``, ``greedy`` – the true curves (given to them);
* ``bftrainer-guess`` – what a user writes down without profiling: linear
  scaling from the one figure they measured, the job's throughput at its
  smallest size ``m`` (``min_nodes``): ``T(n) = T_true(m) · n / m``;
* ``static`` – needs none.
Curves are cached per job and rebuilt only when the job's data changed.

Probes that yield nothing (malletrain policy).  A job whose curve asks for a
probe is run at one of the counts it wants measured (``Curve.wanted``) and kept
there while the JPA measures.  A job that sits at a wanted count for
``probe_timeout_s`` (counted from the end of
its rescale pause, a pause counting for at most one more ``probe_timeout_s``)
without a measurement there — it never reports, its progress file is refused,
it hangs in start-up — gets no probe for a back-off
that doubles with each miss (``probe_timeout_s`` × 2^(misses-1), at most 16×):
its curve then has ``probe=None`` and ``source="probe-timeout"``, so it is
neither pinned nor preferred, and competes with what it has measured (nothing
yet: no claim on nodes others want).  The miss count resets only when the JPA
measures something (its probe or measured counts change), not when the job is
probed at another wanted count: a job that never reports backs off ever longer.
Time comes from the snapshot: the source stays pure.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from malletrain.core.decide import size_grid
from malletrain.domain.config import CoreConfig
from malletrain.domain.model import Curve, CurvePoint, JobState, Sample, Snapshot
from malletrain.jpa.advisor import Advisor

TruthFn = Callable[[int], float]
MAX_PROBE_BACKOFF = 16     # x probe_timeout_s


@dataclass(frozen=True)
class ProbeWatch:
    """One job's unanswered probes: at which count, how often, when to try again."""

    key: tuple          # the JPA's state it watches: (probe, measured counts); a measurement resets it
    misses: int = 0
    retry_at_s: float = 0.0


class CurveSource:
    def __init__(self, config: CoreConfig, truths: Mapping[str, TruthFn] | None = None,
                 advisor: Advisor | None = None) -> None:
        self.config = config
        self.truths = dict(truths or {})
        self.advisor = advisor or Advisor()
        self._cache: dict[str, tuple[object, Curve]] = {}
        self._probes: dict[str, ProbeWatch] = {}
        self._quiet: dict[str, tuple[Curve, Curve]] = {}   # curve -> the same without its probe

    def ingest(self, samples: tuple[Sample, ...], profiles: Mapping[str, str],
               finished: tuple[str, ...] = ()) -> None:
        for job, prof in profiles.items():
            self.advisor.register(job, prof)
        self.advisor.add_many(samples)
        for job in finished:
            self.advisor.forget(job)
            self._cache.pop(job, None)
            self._probes.pop(job, None)
            self._quiet.pop(job, None)

    def curves(self, snapshot: Snapshot, failed: dict[str, Exception] | None = None) -> dict[str, Curve]:
        """Every job's curve.  ``failed`` given (the daemon's contained cycle, :mod:`malletrain.core.contain`):
        a job whose curve raises is left out and named there with the exception, instead of the
        call raising (a bug a job's samples trigger then stops no other job's decision)."""
        policy = self.config.policy
        if policy == "static":
            return {}
        out = {}
        for job in snapshot.jobs:
            try:
                out[job.job_id] = (self._watched(job, self._learned(job), snapshot.now_s) if policy == "malletrain"
                                   else self._guessed(job) if policy == "bftrainer-guess" else self._oracle(job))
            except Exception as exc:    # noqa: BLE001 - contained where asked, re-raised otherwise
                if failed is None:
                    raise
                failed[job.job_id] = exc
        return out

    def probe_misses(self, job_id: str) -> int:
        w = self._probes.get(job_id)
        return w.misses if w else 0

    def _watched(self, job: JobState, curve: Curve, now_s: float) -> Curve:
        """``curve``, or the same without its probe while an unanswered probe backs off."""
        timeout = self.config.probe_timeout_s
        if curve.probe is None or timeout <= 0:
            self._probes.pop(job.job_id, None)
            return curve
        w = self._probes.get(job.job_id)
        key = (curve.probe, curve.measured)
        if w is None or w.key != key:
            w = ProbeWatch(key)
        if now_s < w.retry_at_s:
            self._probes[job.job_id] = w
            return self._without_probe(job.job_id, curve)
        if job.nodes and job.size in curve.wanted:
            # from the launch, plus its rescale pause but at most one more timeout: a tag's long
            # pause cannot stretch a probe that never answers
            start = job.last_change_s if job.last_change_s is not None else now_s
            since = start + min(max(0.0, job.paused_until_s - start), timeout)
            if now_s - since >= timeout:
                misses = w.misses + 1
                backoff = timeout * min(MAX_PROBE_BACKOFF, 2 ** (misses - 1))
                self._probes[job.job_id] = ProbeWatch(key, misses, now_s + backoff)
                return self._without_probe(job.job_id, curve)
        self._probes[job.job_id] = w
        return curve

    def _without_probe(self, job_id: str, curve: Curve) -> Curve:
        hit = self._quiet.get(job_id)       # one object per curve: the cycle memo compares identity
        if hit is None or hit[0] is not curve:
            hit = (curve, replace(curve, probe=None, probes=(), source="probe-timeout"))
            self._quiet[job_id] = hit
        return hit[1]

    def _grid(self, job: JobState) -> tuple[int, ...]:
        return size_grid(job.spec.min_nodes, job.spec.max_nodes, self.config.max_candidates)

    def _learned(self, job: JobState) -> Curve:
        key = self.advisor.version(job.job_id)
        hit = self._cache.get(job.job_id)
        if hit is None or hit[0] != key:
            curve = self.advisor.curve(job.job_id, job.spec.min_nodes, job.spec.max_nodes,
                                       self._grid(job), job.spec.profile)
            hit = (key, curve)
            self._cache[job.job_id] = hit
        return hit[1]

    def _truth(self, job: JobState) -> TruthFn:
        truth = self.truths.get(job.job_id)
        if truth is None:
            raise KeyError(f"no true curve for job {job.job_id} (policy {self.config.policy})")
        return truth

    def _oracle(self, job: JobState) -> Curve:
        hit = self._cache.get(job.job_id)
        if hit is None:
            truth = self._truth(job)
            pts = {n: CurvePoint(truth(n), truth(n), truth(n)) for n in self._grid(job)}
            hit = (None, Curve(pts, None, "oracle"))
            self._cache[job.job_id] = hit
        return hit[1]

    def _guessed(self, job: JobState) -> Curve:
        hit = self._cache.get(job.job_id)
        if hit is None:
            m = max(1, job.spec.min_nodes)
            per_node = self._truth(job)(m) / m
            pts = {n: CurvePoint(per_node * n, per_node * n, per_node * n) for n in self._grid(job)}
            hit = (None, Curve(pts, None, "linear-guess"))
            self._cache[job.job_id] = hit
        return hit[1]
