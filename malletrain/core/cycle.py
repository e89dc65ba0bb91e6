"""The one cycle shared by the daemon and replay: observe → samples → decide → reconcile → apply.

This is the shell around the pure core: it talks to the backend and measures
the decision latency; ``decide`` and ``reconcile`` do no I/O.  The daemon runs it
``contain``-ed (:mod:`malletrain.core.contain`): a job whose curve raises, one owner's jobs whose
own forecasts (learned pauses, sensitivity) raise, and the jobs of the owners whose jobs make
``decide`` raise are set aside (for at most ``probe_timeout_s`` with their nodes, counted in the
memo) and the others are decided; the JPA's ingest, the promises, or forecasts that raise
otherwise (the pool's availability model, several owners' jobs) leave the cycle going without
them.  Each distinct error is logged with its traceback and returned in
the :class:`CycleResult`.  Replay never contains: a bug fails the run.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TypeVar

from malletrain.core.backend import Backend, MetricsSource
from malletrain.core.contain import decide_contained
from malletrain.core.curves import CurveSource
from malletrain.core.decide import decide, owner_of, plan_violation, protected, starving
from malletrain.core.forecast import ForecastSource
from malletrain.domain.config import CoreConfig
from malletrain.domain.errors import PlanError
from malletrain.domain.model import NO_OUTLOOK, Action, Outlook, Plan, Sample, Snapshot
from malletrain.domain.text import error_line

log = logging.getLogger("malletrain.cycle")


@dataclass(frozen=True)
class CycleResult:
    plan: Plan
    actions: tuple[Action, ...]
    decision_ms: float
    reused: bool = False      # inputs unchanged: the previous plan stands
    stood: bool = False       # only the node stays moved, and decide found the previous plan stands
    # a contained cycle (the daemon's): jobs set aside (job -> why), and the errors it contained,
    # one line each, "KIND: text" with KIND one of jpa, forecasts, promises, curves, decide
    set_aside: Mapping[str, str] = field(default_factory=dict)
    errors: tuple[str, ...] = ()


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
    aside_since: dict[str, float] = field(default_factory=dict)   # contained cycles: job -> set aside since


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
    """The changes to apply, after checking the plan's invariants (:func:`plan_violation`: every
    assigned node is in the harvestable pool and assigned once; no job exceeds ``max_nodes`` or
    runs below ``min_nodes``)."""
    why = plan_violation(snapshot, plan)
    if why is not None:
        raise PlanError(why)
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


T = TypeVar("T")
MAX_ERRORS = 10     # error lines a cycle reports (the rest are counted in one more line)


def _guarded(contain: bool, failed: list[tuple[str, Exception]], kind: str, fallback: T,
             step: Callable[..., T], *args) -> T:
    """``step(*args)``; in a contained cycle an exception is kept in ``failed`` with its ``kind``
    and ``fallback`` returned instead (no closure per call: replay runs this every cycle)."""
    if not contain:
        return step(*args)
    try:
        return step(*args)
    except Exception as exc:    # noqa: BLE001 - contained: logged with its traceback by the cycle
        failed.append((kind, exc))
        return fallback


def _report(now_s: float, failed: Sequence[tuple[str, Exception]]) -> tuple[str, ...]:
    """Log each contained error once with its traceback; the cycle's lines ``KIND: text``, at most
    ``MAX_ERRORS`` of them."""
    seen: set = set()
    lines = []
    for kind, exc in failed:
        key = (kind, type(exc), str(exc))
        if key in seen:
            continue
        seen.add(key)
        log.error("t=%.0f contained an error in %s (the others are decided): %s", now_s, kind, error_line(exc),
                  exc_info=exc)
        lines.append(f"{kind}: {error_line(exc)}")
    if len(lines) > MAX_ERRORS:
        lines[MAX_ERRORS:] = [f"... and {len(lines) - MAX_ERRORS} more"]
    return tuple(lines)


def _off_for_everyone(snapshot: Snapshot, unforecast: dict[str, Exception],
                      failed: list[tuple[str, Exception]]) -> bool:
    """Jobs whose own forecasts raised are set aside only where they are one owner's and the rest
    of the forecasts worked (else ``unforecast`` is emptied).  Errors in several owners' jobs come
    from data they share (a profile's pooled pauses or sensitivities): then, as when the pool's
    model raises, the cycle goes on without forecasts for everyone (the error kept in ``failed``;
    True: the outlook is to be dropped)."""
    several = len({owner_of(j) for j in snapshot.jobs if j.job_id in unforecast}) > 1
    if several:
        failed.append(("forecasts", next(iter(unforecast.values()))))
    if several or any(kind == "forecasts" for kind, _ in failed):
        unforecast.clear()
    return several


def run_cycle(backend: Backend, metrics: MetricsSource, source: CurveSource, config: CoreConfig,
              memo: CycleMemo | None = None, forecast: ForecastSource | None = None,
              contain: bool = False) -> CycleResult:
    """One cycle.  ``contain`` (the daemon): what the JPA's ingest, the forecasts, the promises, a
    job's curve or ``decide`` raise is contained (module docstring) instead of raised."""
    obs = backend.observe()
    now = obs.snapshot.now_s
    failed: list[tuple[str, Exception]] = []
    raw = tuple(metrics.poll(obs))
    samples = _guarded(contain, failed, "jpa", raw, placed, raw, obs.snapshot)
    _guarded(contain, failed, "jpa", None, source.ingest, samples, obs.profiles(), obs.finished)
    pauses = tuple(metrics.pauses())
    unforecast: dict[str, Exception] | None = {} if contain else None     # jobs whose own forecasts raised
    if forecast is not None:
        _guarded(contain, failed, "forecasts", None, forecast.ingest,
                 obs.snapshot, obs.profiles(), pauses, obs.finished, samples, obs.elastic(), unforecast)
    t0 = time.perf_counter()
    broken: dict[str, Exception] | None = {} if contain else None
    curves = source.curves(obs.snapshot, broken)
    outlook = NO_OUTLOOK
    if forecast is not None and not any(kind == "forecasts" for kind, _ in failed):
        outlook = _guarded(contain, failed, "forecasts", NO_OUTLOOK, forecast.outlook, obs.snapshot, unforecast)
    if unforecast and _off_for_everyone(obs.snapshot, unforecast, failed):
        outlook = NO_OUTLOOK        # (a forecast step that raised already left it so)
    no_promise: Mapping[str, float] = {}
    if config.promise and (promise := _guarded(contain, failed, "promises", no_promise, metrics.promises)):
        outlook = replace(outlook, promise=promise)
    standing = None
    if memo is not None and obs.generation is not None and not broken and not unforecast and not failed:
        cur = tuple(curves.items())
        if (memo.plan is not None and memo.generation == obs.generation and memo.pins == _pins(obs.snapshot, config)
                and len(cur) == len(memo.curves)
                and all(a[0] == b[0] and a[1] is b[1] for a, b in zip(cur, memo.curves))):
            if memo.outlook == outlook:
                return CycleResult(memo.plan, (), (time.perf_counter() - t0) * 1000.0, reused=True)
            if _only_stays_moved(memo.outlook, outlook):
                standing = memo.plan
    set_aside: Mapping[str, str] = {}
    if contain:
        aside_since = memo.aside_since if memo is not None else {}
        expired = frozenset(j for j, t in aside_since.items() if now - t >= config.probe_timeout_s)
        got = decide_contained(obs.snapshot, curves, config, outlook, standing, broken, expired, unforecast)
        plan, set_aside = got.plan, got.set_aside
        failed.extend((f"curves: job {j}", e) for j, e in sorted((broken or {}).items()))
        failed.extend((f"forecasts: job {j}", e) for j, e in sorted((unforecast or {}).items()))
        failed.extend(("decide", e) for e in got.errors)
        if memo is not None:        # since when each job has been set aside
            memo.aside_since = {j: aside_since.get(j, now) for j in set_aside}
    else:
        plan = decide(obs.snapshot, curves, config, outlook, standing)
    ms = (time.perf_counter() - t0) * 1000.0
    if standing is not None and plan is standing and memo is not None:
        memo.outlook = outlook
        return CycleResult(plan, (), ms, stood=True)
    lines = _report(now, failed) if failed else ()
    for note in plan.notes:   # solver timeouts, fallbacks, jobs set aside: say why
        log.warning("t=%.0f %s", now, note)
    actions = reconcile(obs.snapshot, plan)
    backend.apply(actions)
    if memo is not None and obs.generation is not None:
        if actions or failed:   # our own changes moved the state, or an error: decide afresh next cycle
            memo.plan = None
        else:
            memo.generation, memo.curves, memo.pins, memo.outlook, memo.plan = (
                obs.generation, tuple(curves.items()), _pins(obs.snapshot, config), outlook, plan)
    return CycleResult(plan, actions, ms, set_aside=set_aside, errors=lines)
