"""Where each policy's curves come from.

* ``malletrain`` – the JPA, fed only by the samples jobs report;
* ``oracle``, ``bftrainer``, ``greedy`` – the true curves (given to them);
* ``static`` – needs none.
Curves are cached per job and rebuilt only when the job's data changed.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping

from malletrain.core.decide import size_grid
from malletrain.domain.config import CoreConfig
from malletrain.domain.model import Curve, CurvePoint, JobState, Sample, Snapshot
from malletrain.jpa.advisor import Advisor

TruthFn = Callable[[int], float]


class CurveSource:
    def __init__(self, config: CoreConfig, truths: Mapping[str, TruthFn] | None = None,
                 advisor: Advisor | None = None) -> None:
        self.config = config
        self.truths = dict(truths or {})
        self.advisor = advisor or Advisor()
        self._cache: dict[str, tuple[object, Curve]] = {}

    def ingest(self, samples: tuple[Sample, ...], profiles: Mapping[str, str],
               finished: tuple[str, ...] = ()) -> None:
        for job, prof in profiles.items():
            self.advisor.register(job, prof)
        self.advisor.add_many(samples)
        for job in finished:
            self._cache.pop(job, None)

    def curves(self, snapshot: Snapshot) -> dict[str, Curve]:
        policy = self.config.policy
        if policy == "static":
            return {}
        out = {}
        for job in snapshot.jobs:
            out[job.job_id] = (self._learned(job) if policy == "malletrain"
                               else self._oracle(job))
        return out

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

    def _oracle(self, job: JobState) -> Curve:
        hit = self._cache.get(job.job_id)
        if hit is None:
            truth = self.truths.get(job.job_id)
            if truth is None:
                raise KeyError(f"no true curve for job {job.job_id} (policy {self.config.policy})")
            pts = {n: CurvePoint(truth(n), truth(n), truth(n)) for n in self._grid(job)}
            hit = (None, Curve(pts, None, "oracle"))
            self._cache[job.job_id] = hit
        return hit[1]
