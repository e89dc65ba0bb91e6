"""The one cycle shared by the daemon and replay: observe → samples → decide → reconcile → apply.

This is the shell around the pure core: it talks to the backend and measures
the decision latency; ``decide`` and ``reconcile`` do no I/O.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace

from malletrain.core.backend import Backend, MetricsSource
from malletrain.core.curves import CurveSource
from malletrain.core.decide import decide, pool_index, protected, starving
from malletrain.core.forecast import ForecastSource
from malletrain.domain.config import CoreConfig
from malletrain.domain.errors import PlanError
from malletrain.domain.model import NO_OUTLOOK, Action, Outlook, Plan, Sample, Snapshot

log = logging.getLogger("malletrain.cycle")


@dataclass(frozen=True)
class CycleResult:
    plan: Plan
    actions: tuple[Action, ...]
    decision_ms: float
    reused: bool = False      # inputs unchanged: the previous plan stands
    stood: bool = False       # only the node stays moved, and decide found the previous plan stands


@dataclass
class CycleMemo:
    """The last decision's inputs, so an unchanged cycle reuses its plan.

    ``decide`` is deterministic; when the backend's generation, every curve
    object (held here, compared by identity), the outlook (compared by value)
    and the set of pinned jobs are unchanged, the plan would be the same and is
    not recomputed.  When only the outlook's node stays moved (they do as idle
    nodes age), the plan goes to ``decide`` as ``standing``: it values the jobs'
    options under the new stays and keeps the plan where that provably gives
    the same decision.
    """

    generation: int | None = None
    curves: tuple = ()
    pins: tuple = ()
    outlook: Outlook = NO_OUTLOOK
    plan: Plan | None = None


def _pins(snapshot: Snapshot, config: CoreConfig) -> tuple:
    """What of each job changes with the clock alone and changes the decision: a rescale pause,
    the min-dwell hold, and under the starvation rule whether it starves or is protected."""
    now = snapshot.now_s
    return tuple((j.job_id, j.paused_until_s > now,
                  config.min_dwell_s > 0 and j.last_change_s is not None
                  and now - j.last_change_s < config.min_dwell_s,
                  config.starvation_s > 0 and (starving(j, now, config.starvation_s)
                                               or protected(j, now, config.starvation_s))) for j in snapshot.jobs)


def _only_stays_moved(before: Outlook, now: Outlook) -> bool:
    """The two outlooks differ at most in their node stays (learned pauses, sensitivities and
    promises the same: compared as a tuple, so a mapping that is the same object stops at identity)."""
    return (before.costs, before.sensitive, before.promise) == (now.costs, now.sensitive, now.promise)


def reconcile(snapshot: Snapshot, plan: Plan) -> tuple[Action, ...]:
    """The changes to apply, after checking the plan's invariants.

    Every assigned node is in the harvestable pool and assigned once; no job
    exceeds ``max_nodes`` or runs below ``min_nodes``.
    """
    pool = pool_index(snapshot.nodes)[0]      # (kept per pool tuple: decide read the same one)
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


_PLAIN: list = [None, True]     # (the last pool tuple looked at, whether all its nodes are plain)


def _plain(nodes: tuple) -> bool:
    """No node is slow or in a topology group (kept for the same pool tuple: a backend hands the
    same one while its pool is unchanged; held here, so its identity is not reused)."""
    if _PLAIN[0] is not nodes or type(nodes) is not tuple:    # a list could change under the same identity
        _PLAIN[:] = [nodes, not any(n.variability != 1.0 or n.group for n in nodes)]
    return _PLAIN[1]


def placed(samples: tuple[Sample, ...], snapshot: Snapshot) -> tuple[Sample, ...]:
    """Samples with the facts of the nodes their job holds now (the slowest node's ``variability``,
    the topology groups spanned), where the job still runs on as many nodes as the sample says."""
    if not samples or _plain(snapshot.nodes):
        return samples
    nodes = {n.name: n for n in snapshot.nodes}
    held = {j.job_id: [nodes[x] for x in j.nodes if x in nodes] for j in snapshot.jobs if j.nodes}
    out = []
    for s in samples:
        on = held.get(s.job_id)
        if on and len(on) == s.nodes:
            s = replace(s, slowdown=max(n.variability for n in on), groups=len({n.group for n in on}))
        out.append(s)
    return tuple(out)


def run_cycle(backend: Backend, metrics: MetricsSource, source: CurveSource, config: CoreConfig,
              memo: CycleMemo | None = None, forecast: ForecastSource | None = None) -> CycleResult:
    obs = backend.observe()
    samples = placed(tuple(metrics.poll(obs)), obs.snapshot)
    source.ingest(samples, obs.profiles(), obs.finished)
    pauses = tuple(metrics.pauses())
    if forecast is not None:
        forecast.ingest(obs.snapshot, obs.profiles(), pauses, obs.finished, samples, obs.elastic())
    t0 = time.perf_counter()
    curves = source.curves(obs.snapshot)
    outlook = forecast.outlook(obs.snapshot) if forecast is not None else NO_OUTLOOK
    if config.promise and (promise := metrics.promises()):
        outlook = replace(outlook, promise=promise)
    standing = None
    if memo is not None and obs.generation is not None:
        cur = tuple(curves.items())
        if (memo.plan is not None and memo.generation == obs.generation and memo.pins == _pins(obs.snapshot, config)
                and len(cur) == len(memo.curves)
                and all(a[0] == b[0] and a[1] is b[1] for a, b in zip(cur, memo.curves))):
            if memo.outlook == outlook:
                return CycleResult(memo.plan, (), (time.perf_counter() - t0) * 1000.0, reused=True)
            if _only_stays_moved(memo.outlook, outlook):
                standing = memo.plan
    plan = decide(obs.snapshot, curves, config, outlook, standing)
    ms = (time.perf_counter() - t0) * 1000.0
    if standing is not None and plan is standing and memo is not None:
        memo.outlook = outlook
        return CycleResult(plan, (), ms, stood=True)
    for note in plan.notes:   # solver timeouts, fallbacks: say why
        log.warning("t=%.0f %s", obs.snapshot.now_s, note)
    actions = reconcile(obs.snapshot, plan)
    backend.apply(actions)
    if memo is not None and obs.generation is not None:
        if actions:   # our own changes moved the state: decide afresh next cycle
            memo.plan = None
        else:
            memo.generation, memo.curves, memo.pins, memo.outlook, memo.plan = (
                obs.generation, tuple(curves.items()), _pins(obs.snapshot, config), outlook, plan)
    return CycleResult(plan, actions, ms)
