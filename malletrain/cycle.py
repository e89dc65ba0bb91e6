"""The one cycle shared by the daemon and replay: observe → decide → reconcile → apply.

This is the shell around the pure core: it talks to the backend and measures
the decision latency; ``decide`` and ``reconcile`` do no I/O.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

from malletrain.config import CoreConfig
from malletrain.core import decide
from malletrain.errors import MalletrainError
from malletrain.model import Action, Plan, Snapshot
from malletrain.policy import CurveSource
from slurm.backend import Backend


class PlanError(MalletrainError):
    """A plan violates an invariant; it is never applied."""


@dataclass(frozen=True)
class CycleResult:
    plan: Plan
    actions: tuple[Action, ...]
    decision_ms: float


def reconcile(snapshot: Snapshot, plan: Plan) -> tuple[Action, ...]:
    """The changes to apply, after checking the plan's invariants.

    Every assigned node is in the harvestable pool and assigned once; no job
    exceeds ``max_nodes`` or runs below ``min_nodes``.
    """
    pool = {n.name for n in snapshot.nodes}
    specs = {j.job_id: j.spec for j in snapshot.jobs}
    seen: set[str] = set()
    for job_id, nodes in plan.allocations.items():
        spec = specs.get(job_id)
        if spec is None:
            raise PlanError(f"plan names unknown job {job_id}")
        if nodes and not (spec.min_nodes <= len(nodes) <= spec.max_nodes):
            raise PlanError(f"job {job_id}: {len(nodes)} nodes outside "
                            f"[{spec.min_nodes}, {spec.max_nodes}]")
        for n in nodes:
            if n not in pool:
                raise PlanError(f"job {job_id}: node {n} is not harvestable")
            if n in seen:
                raise PlanError(f"node {n} assigned twice")
            seen.add(n)
    return plan.changes()


def run_cycle(backend: Backend, source: CurveSource, config: CoreConfig,
              previous: Plan | None = None) -> CycleResult:
    obs = backend.observe()
    source.ingest(obs.samples, obs.profiles, obs.finished)
    t0 = time.perf_counter()
    curves = source.curves(obs.snapshot)
    plan = decide(obs.snapshot, curves, config, previous)
    ms = (time.perf_counter() - t0) * 1000.0
    actions = reconcile(obs.snapshot, plan)
    backend.apply(actions)
    return CycleResult(plan, actions, ms)


def apply_order(actions: Sequence[Action]) -> list[Action]:
    """Release before acquire: stops and shrinks first, then grows and starts."""
    rank = {"stop": 0, "shrink": 1, "grow": 2, "start": 3}
    return sorted(actions, key=lambda a: rank.get(a.kind.value, 4))
