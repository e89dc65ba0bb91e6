"""Where each policy's :class:`Outlook` comes from (beside :mod:`malletrain.core.curves`).

* ``malletrain`` – rescale pauses learned from the pauses jobs were measured to
  take (:mod:`malletrain.jpa.rescale`; the job's configured pauses are the
  prior) and node stays predicted from the idle stretches seen so far
  (:mod:`malletrain.core.availability`);
* ``oracle``, ``greedy`` – the true pauses where given (replay), else as
  ``malletrain``; the same predicted stays (an oracle of the curves, not of the
  future);
* ``bftrainer``, ``bftrainer-guess``, ``static`` – none: BFTrainer's objective
  charges the configured pauses and knows no stays.
All three also learn which jobs slow down on slow nodes
(:mod:`malletrain.jpa.sensitivity`, from samples annotated with their nodes' facts);
placement gives those the fastest nodes.

``learn_rescale``, ``availability`` and ``variability`` (CoreConfig) switch each part off.
A bug that one job's data triggers in its pauses or sensitivity (``failed`` given: the daemon's
contained cycle) leaves that job out, named in ``failed`` with the exception, and the others'
forecasts go on; where those jobs are one owner's, the cycle sets them aside
(:mod:`malletrain.core.cycle`, :mod:`malletrain.core.contain`), as for a curve that raises.
Without ``failed`` (replay, the benchmarks) it raises.
Each cycle's :class:`Outlook` reuses what did not change: the pauses while the learner's
version and the jobs are the same, the sensitivities likewise, the stays as the availability
model keeps them, and the Outlook object itself when all three are the same objects (so the
cycle's memo compares it in O(1)).
Pure: times come from the observations.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from collections.abc import Set as AbstractSet

from malletrain.core.availability import IdleHistory
from malletrain.domain.config import FORECAST_POLICIES, CoreConfig
from malletrain.domain.model import (
    NO_OUTLOOK,
    Direction,
    JobSpec,
    JobState,
    Outlook,
    PauseKind,
    PauseSample,
    RescaleCost,
    Sample,
    Snapshot,
)
from malletrain.jpa.rescale import RescaleLearner
from malletrain.jpa.sensitivity import SensitivityLearner

_NONE: dict = {}     # no stays, no sensitivities (shared: outlooks are read, never changed)


def _per_job(failed: dict[str, Exception] | None, job_id: str, step: Callable[..., object], *args) -> None:
    """``step(*args)`` for one job's data; where ``failed`` is given, what it raises is kept there
    under the job (its first error) instead of raised."""
    if failed is None:
        step(*args)
        return
    try:
        step(*args)
    except Exception as exc:    # noqa: BLE001 - contained where asked: the cycle sets the job aside
        failed.setdefault(job_id, exc)


def _reraised(errors: Mapping[str, Exception], failed: dict[str, Exception] | None) -> None:
    """The errors kept with a reused answer: into ``failed``, or the first raised without it."""
    if errors:
        if failed is None:
            raise next(iter(errors.values()))
        for job, exc in errors.items():
            failed.setdefault(job, exc)


class ForecastSource:
    def __init__(self, config: CoreConfig, true_costs: Mapping[str, RescaleCost] | None = None, *,
                 learner: RescaleLearner | None = None, history: IdleHistory | None = None,
                 sensitivity: SensitivityLearner | None = None) -> None:
        self.config = config
        self.true_costs = dict(true_costs or {})
        self.learner = learner or RescaleLearner()
        self.history = history or IdleHistory(min_stretches=config.stay_min_fragments,
                                              half_life=config.stay_half_life)
        self.learn_errors: list[float] = []     # relative error of learned pauses (replay, see _check)
        self.sensitivity = sensitivity or SensitivityLearner()
        self._mixed: set[str] = set()           # jobs seen on nodes of differing speed or groups
        # (what they came from, the pauses or sensitivities, the jobs whose raised)
        self._costs: tuple[tuple, dict[str, RescaleCost], dict[str, Exception]] | None = None
        self._sensitive: tuple[tuple, dict[str, float], dict[str, Exception]] | None = None
        self._outlook: Outlook = NO_OUTLOOK

    @property
    def active(self) -> bool:
        return self.config.policy in FORECAST_POLICIES

    def ingest(self, snapshot: Snapshot, profiles: Mapping[str, str], pauses: Iterable[PauseSample],
               finished: Iterable[str] = (), samples: Iterable[Sample] = (),
               elastic: AbstractSet[str] = frozenset(), failed: dict[str, Exception] | None = None) -> None:
        """One observation: the pool (idle stretches), profiles, measured pauses, jobs that left,
        throughput samples with their nodes' facts (sensitivity to slow nodes and groups), the
        jobs that re-form in place (their pauses are learned per kind).  ``failed``: one job's
        data that raises is left out and named there (module docstring); the pool's is not
        one job's, and raises."""
        if not self.active:
            return
        if self.config.availability:
            self.history.observe(snapshot.now_s, snapshot.nodes)
        if self.config.variability and samples:
            held = {j.job_id: j.size for j in snapshot.jobs}
            for s in samples:
                if held.get(s.job_id) != s.nodes:
                    continue       # not at the size it holds: its nodes' facts are not known
                if s.slowdown != 1.0 or s.groups != 1 or s.job_id in self._mixed:
                    self._mixed.add(s.job_id)      # nominal samples count once a job ran elsewhere too
                    _per_job(failed, s.job_id, self.sensitivity.add, s)
        for job, prof in profiles.items():
            _per_job(failed, job, self._register, job, prof, job in elastic)
        pauses = tuple(pauses)
        specs = {j.job_id: j.spec for j in snapshot.jobs} if pauses and self.true_costs else {}
        for p in pauses:
            _per_job(failed, p.job_id, self._learn, p, specs)
        for job in finished:
            _per_job(failed, job, self._forget, job)

    def _forget(self, job: str) -> None:
        self.learner.forget(job)
        self.sensitivity.forget(job)
        self._mixed.discard(job)

    def _register(self, job: str, profile: str, elastic: bool) -> None:
        self.learner.register(job, profile, elastic)
        self.sensitivity.register(job, profile)

    def _learn(self, p: PauseSample, specs: Mapping[str, JobSpec]) -> None:
        if self.learner.add(p) and p.job_id in specs:
            self._check(p, specs[p.job_id])

    LEARN_CHECK_AT = 3      # measurements of a job and kind after which its estimate is checked

    def _check(self, p: PauseSample, spec: JobSpec) -> None:
        """Where the truth is known (replay): how far the estimate is from it once the job has
        measured ``LEARN_CHECK_AT`` pauses of that kind (a start or shrink: the kinds whose truth
        is one number; an elastic grow's depends on the sizes)."""
        truth = self.true_costs.get(p.job_id)
        kind = p.kind if self.learner.elastic(p.job_id) else \
            PauseKind.START if p.direction is Direction.UP else PauseKind.SHRINK
        if (truth is None or kind not in (PauseKind.START, PauseKind.SHRINK)
                or len(self.learner.measured(p.job_id, kind)) != self.LEARN_CHECK_AT):
            return
        cost = self.learner.cost(p.job_id, spec.rescale_up_s, spec.rescale_down_s)
        want = truth.up_s if kind is PauseKind.START else truth.down_s
        got = cost.up_s if kind is PauseKind.START else cost.down_s
        if want > 0:
            self.learn_errors.append(abs(got - want) / want)

    def outlook(self, snapshot: Snapshot, failed: dict[str, Exception] | None = None) -> Outlook:
        """The cycle's outlook.  ``failed``: a job whose pauses or sensitivity raise is left out of
        them and named there (module docstring)."""
        if not self.active:
            return NO_OUTLOOK
        cfg = self.config
        costs = self._job_costs(snapshot, failed)
        stays = (self.history.stays(snapshot.now_s, snapshot.nodes, cfg.horizon_s)
                 if cfg.availability else _NONE)
        sensitive = self._job_sensitivity(snapshot, failed)
        last = self._outlook
        if last.costs is costs and last.stays is stays and last.sensitive is sensitive:
            return last
        self._outlook = Outlook(costs, stays, sensitive)
        return self._outlook

    def _job_costs(self, snapshot: Snapshot, failed: dict[str, Exception] | None = None) -> dict[str, RescaleCost]:
        """The pauses each job is charged (kept while the learner and the jobs are the same, with
        the jobs whose pauses raised)."""
        key = (self.learner.version,
               tuple((j.job_id, j.spec.rescale_up_s, j.spec.rescale_down_s) for j in snapshot.jobs))
        if self._costs is not None and self._costs[0] == key:
            _reraised(self._costs[2], failed)
            return self._costs[1]
        cfg = self.config
        costs: dict[str, RescaleCost] = {}
        errors: dict[str, Exception] = {}
        for j in snapshot.jobs:
            truth = self.true_costs.get(j.job_id) if cfg.policy != "malletrain" else None
            if truth is not None:
                costs[j.job_id] = truth
            elif cfg.learn_rescale:
                _per_job(errors if failed is not None else None, j.job_id, self._learned_cost, j, costs)
        self._costs = (key, costs, errors)
        _reraised(errors, failed)
        return costs

    def _learned_cost(self, j: JobState, costs: dict[str, RescaleCost]) -> None:
        costs[j.job_id] = self.learner.cost(j.job_id, j.spec.rescale_up_s, j.spec.rescale_down_s)

    def _job_sensitivity(self, snapshot: Snapshot, failed: dict[str, Exception] | None = None) -> dict[str, float]:
        """The learned slowdown exponents of the jobs that have one (kept likewise)."""
        if not self.config.variability:
            return _NONE
        key = (self.sensitivity.version, tuple(j.job_id for j in snapshot.jobs))
        if self._sensitive is not None and self._sensitive[0] == key:
            _reraised(self._sensitive[2], failed)
            return self._sensitive[1]
        sensitive: dict[str, float] = {}
        errors: dict[str, Exception] = {}
        for j in snapshot.jobs:
            _per_job(errors if failed is not None else None, j.job_id, self._learned_slowdown, j.job_id, sensitive)
        self._sensitive = (key, sensitive, errors)
        _reraised(errors, failed)
        return sensitive

    def _learned_slowdown(self, job_id: str, sensitive: dict[str, float]) -> None:
        est = self.sensitivity.get(job_id)
        if est is not None:
            sensitive[job_id] = est.slowdown
