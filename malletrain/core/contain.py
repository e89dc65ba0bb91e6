"""Containment: a decision that raises for one owner's jobs does not stop the others'.

``decide`` and the curve source are pure and deterministic, so an exception they raise is a bug
that their inputs trigger, and those inputs are mostly what users submitted and reported.  Until
2026-12-04 one such bug (a running job's probe on a pool of two node types) made ``decide`` raise
in every cycle: the daemon exited, and systemd restarted it into the same exception, for every
user, for as long as that one job's probe was wanted.  The daemon asks for a contained decision
(:func:`decide_contained`); replay and the benchmarks never do, so that a bug fails them.

1. ``decide`` as usual (jobs whose curve could not be computed are set aside from the start);
2. if it raises, each owner's jobs are decided alone, on the pool less the nodes the other
   owners' jobs hold; an owner whose jobs raise alone is *set aside*;
3. the others are decided together, on the pool less the nodes the set-aside jobs hold;
4. a set-aside job keeps the nodes of the pool it holds and gets none more (reason
   ``set-aside``); one left with fewer than its ``min_nodes`` stops (its checkpoint is taken
   and it is queued again, as for any stop);
5. where no owner can be singled out (none raises alone, or every one does, or the others raise
   together too), every job is left as it is.

Each step's decision is made on a pool without the set-aside jobs' nodes, so nothing the plan
gives another job is a node a set-aside job holds.  The answer says what was contained: the
shell logs the exception with its traceback and counts it (nothing here hides a bug; it keeps
serving the users who did not trigger it).  Costs nothing while ``decide`` does not raise; while
it does, one decision per owner and one more.

Pure: catches exceptions, no I/O, no clock.  Imports the core's ``decide`` and the domain model.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain

from malletrain.core.decide import decide, owner_of
from malletrain.domain.config import CoreConfig
from malletrain.domain.model import (
    NO_OUTLOOK,
    Action,
    ActionKind,
    Curve,
    JobState,
    Outlook,
    Plan,
    ReasonCode,
    Snapshot,
)
from malletrain.domain.text import error_line


@dataclass(frozen=True)
class Contained:
    """A contained decision: the plan, and what was set aside and why."""

    plan: Plan
    error: Exception | None = None           # what ``decide`` raised over all jobs (None: nothing)
    set_aside: Mapping[str, str] = field(default_factory=dict)   # job -> why (empty: none)
    held: bool = False                        # no owner singled out: every job left as it is


def decide_contained(snapshot: Snapshot, curves: Mapping[str, Curve], config: CoreConfig,
                     outlook: Outlook = NO_OUTLOOK, standing: Plan | None = None,
                     broken: Mapping[str, str] | None = None) -> Contained:
    """:func:`~malletrain.core.decide.decide`, contained (module docstring).  ``broken``: jobs
    whose inputs could not be computed (job -> why), set aside from the start."""
    aside = {j: f"its curve could not be computed ({why})" for j, why in (broken or {}).items()}
    first = _attempt(snapshot, aside, curves, config, outlook, standing if not aside else None)
    if isinstance(first, Plan):
        return Contained(first if not aside else _merged(snapshot, first, aside), set_aside=aside)
    error = first
    owners: dict[str, list[JobState]] = {}
    for j in snapshot.jobs:
        if j.job_id not in aside:
            owners.setdefault(owner_of(j), []).append(j)
    raising = [o for o, jobs in owners.items() if isinstance(_alone(snapshot, jobs, curves, config, outlook),
                                                              Exception)]
    if raising and len(raising) < len(owners):
        why = f"deciding its owner's jobs raised {error_line(error)}"
        for o in raising:
            aside.update((j.job_id, why) for j in owners[o])
        second = _attempt(snapshot, aside, curves, config, outlook, None)
        if isinstance(second, Plan):
            return Contained(_merged(snapshot, second, aside), error, aside)
    why = f"the decision raised {error_line(error)} and no one owner's jobs alone did"
    if raising:
        why = (f"the decision raised {error_line(error)} for every owner's jobs" if len(raising) == len(owners)
               else f"the decision raised {error_line(error)}, also without the jobs of the owners it "
                    f"raised for alone")
    everyone = {j.job_id: aside.get(j.job_id, why) for j in snapshot.jobs}
    return Contained(_kept(snapshot, everyone, solver="contained"), error, everyone, held=True)


def _attempt(snapshot: Snapshot, aside: Mapping[str, str], curves: Mapping[str, Curve], config: CoreConfig,
             outlook: Outlook, standing: Plan | None) -> Plan | Exception:
    """The decision over every job not set aside, on the pool less what the set-aside jobs hold,
    or what it raised."""
    try:
        return decide(_without(snapshot, aside), curves, config, outlook, standing)
    except Exception as exc:     # noqa: BLE001 - a bug the inputs trigger: contained, reported by the caller
        return exc


def _alone(snapshot: Snapshot, jobs: Sequence[JobState], curves: Mapping[str, Curve], config: CoreConfig,
           outlook: Outlook) -> Plan | Exception:
    """One owner's jobs decided alone, on the pool less the nodes every other job holds."""
    mine = {j.job_id for j in jobs}
    others = {j.job_id: "" for j in snapshot.jobs if j.job_id not in mine}
    return _attempt(snapshot, others, curves, config, outlook, None)


def _without(snapshot: Snapshot, aside: Mapping[str, str]) -> Snapshot:
    """The snapshot less the ``aside`` jobs and every node they hold (the same object when none)."""
    if not aside:
        return snapshot
    held = set(chain.from_iterable(j.nodes for j in snapshot.jobs if j.job_id in aside))
    return Snapshot(snapshot.now_s, tuple(n for n in snapshot.nodes if n.name not in held),
                    tuple(j for j in snapshot.jobs if j.job_id not in aside))


def _kept(snapshot: Snapshot, aside: Mapping[str, str], plan: Plan | None = None,
          solver: str = "") -> Plan:
    """``plan`` (None: an empty one) with every ``aside`` job keeping the nodes of the pool it holds
    (stopping where fewer than its ``min_nodes`` are left), actions in the snapshot's job order."""
    pool = {n.name for n in snapshot.nodes}
    allocations = dict(plan.allocations) if plan is not None else {}
    decided = {a.job_id: a for a in plan.actions} if plan is not None else {}
    actions: list[Action] = []
    for j in snapshot.jobs:
        if j.job_id not in aside:
            if j.job_id in decided:
                actions.append(decided[j.job_id])
            continue
        kept = tuple(n for n in j.nodes if n in pool)
        if len(kept) < max(1, j.spec.min_nodes):
            kept = ()
        allocations[j.job_id] = kept
        if not j.nodes:
            kind, verb = ActionKind.WAIT, "wait"
        elif not kept:
            kind, verb = ActionKind.STOP, f"stop: fewer than min_nodes={j.spec.min_nodes} of its nodes are left"
        elif len(kept) == len(j.nodes):
            kind, verb = ActionKind.KEEP, f"keep {len(kept)}"
        else:
            kind, verb = ActionKind.SHRINK, f"keep the {len(kept)} of its nodes left"
        actions.append(Action(j.job_id, kind, j.nodes, kept, f"{verb}: set aside, {aside[j.job_id]}",
                              ReasonCode.SET_ASIDE))
    owners = {owner_of(j) for j in snapshot.jobs if j.job_id in aside}
    note = (f"set aside {len(aside)} job(s) of {len(owners)} owner(s), kept as they are: "
            + "; ".join(sorted({why for why in aside.values()})))
    notes = (*plan.notes, note) if plan is not None else (note,)
    return Plan(snapshot.now_s, allocations, tuple(actions), plan.objective if plan is not None else 0.0,
                solver or (plan.solver if plan is not None else ""), notes)


def _merged(snapshot: Snapshot, plan: Plan, aside: Mapping[str, str]) -> Plan:
    return _kept(snapshot, aside, plan)
