"""Containment: a decision that raises for one owner's jobs does not stop the others'.

``decide`` and the curve source are pure and deterministic, so an exception they raise is a bug
that their inputs trigger, and those inputs are mostly what users submitted and reported.  Until
2026-12-04 one such bug (a running job's probe on a pool of two node types) made ``decide`` raise
in every cycle: the daemon exited, and systemd restarted it into the same exception, for every
user, for as long as that one job's probe was wanted.  The daemon asks for a contained decision
(:func:`decide_contained`); replay and the benchmarks never do, so that a bug fails them.  A
decision that gives a plan breaking the plan's invariants (:func:`~malletrain.core.decide.plan_violation`)
counts as one that raised.

1. ``decide`` as usual (jobs whose curve, or whose own forecasts, could not be computed are set
   aside from the start);
2. if it raises, the owners whose jobs make it raise are searched by halving: a group of owners
   whose jobs, decided alone (on the pool less the nodes every other job holds), raise is split
   in two and each half decided alone, down to single owners, who are *set aside* with the error
   their own jobs raised.  A group that raises while neither half does (a bug two or a few owners'
   jobs trigger only together) is narrowed from each side in turn: one half's owners are halved
   while one half of them still raises together with the whole other half (where neither does,
   each is narrowed with the other added), then the other half's likewise against what was left
   of the first.  The owners left on both sides (two, for a bug of two owners' jobs) are set
   aside, each told only the kind of error (its text may quote the other owner's job: the log
   has it).  At most ``MAX_TRIES`` decisions (one owner among thousands costs about 2·log₂ of
   them, a pair about twice that; a bug the pool alone triggers, one decision);
3. the others are decided together, on the pool less the nodes the set-aside jobs hold;
4. a set-aside job keeps the nodes of the pool it holds, at most its ``max_nodes`` of them, and
   gets none more (reason ``set-aside``); one left with fewer than its ``min_nodes``, or set
   aside for longer than the caller lets it keep them (``expired``: the cycle's
   ``probe_timeout_s``, as a probe that never answers), stops: its checkpoint is taken and it is
   queued again, as for any stop;
5. where no owner is singled out (every one raises, none does nor any two together, the search
   ran out, or the others raise together too), every job is left as it is (step 4 for each).

No plan gives a job a node a set-aside job keeps, and a set-aside job never gets a node more:
what a user gains by triggering a bug is keeping, for a while, nodes it already held.  The
answer carries each distinct exception: the shell logs each with its traceback and counts it
(nothing here hides a bug; it keeps serving the users who did not trigger it).  Costs nothing
while ``decide`` does not raise.

Pure: catches exceptions, no I/O, no clock.  Imports the core's ``decide`` and the domain model.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from itertools import chain

from malletrain.core.decide import decide, owner_of, plan_violation
from malletrain.domain.config import CoreConfig
from malletrain.domain.errors import PlanError
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

MAX_TRIES = 64          # decisions the search for the owners at fault may take in one cycle
MAX_REASONS_NOTED = 3   # distinct reasons a set-aside note quotes (the others are counted)


@dataclass(frozen=True)
class Contained:
    """A contained decision: the plan, what was set aside and why, and every distinct exception
    ``decide`` raised (the one over every job first; the curves' are the caller's)."""

    plan: Plan
    errors: tuple[Exception, ...] = ()
    set_aside: Mapping[str, str] = field(default_factory=dict)   # job -> why (empty: none)
    held: bool = False          # no owner singled out: every job left as it is


def decide_contained(snapshot: Snapshot, curves: Mapping[str, Curve], config: CoreConfig,
                     outlook: Outlook = NO_OUTLOOK, standing: Plan | None = None,
                     broken: Mapping[str, Exception] | None = None,
                     expired: AbstractSet[str] = frozenset(),
                     unforecast: Mapping[str, Exception] | None = None) -> Contained:
    """:func:`~malletrain.core.decide.decide`, contained (module docstring).  ``broken``: jobs
    whose curve raised (job -> the exception), set aside from the start, as are the jobs whose
    own forecasts raised (``unforecast``); ``expired``: set-aside jobs that have kept their nodes
    long enough (they stop if set aside again)."""
    aside = {j: f"its curve could not be computed ({error_line(exc)})" for j, exc in (broken or {}).items()}
    for jid, exc in (unforecast or {}).items():
        aside.setdefault(jid, f"its forecasts (learned pauses, sensitivity) could not be computed "
                            f"({error_line(exc)})")
    first = _attempt(snapshot, aside, curves, config, outlook, standing if not aside else None)
    if isinstance(first, Plan):
        return Contained(_kept(snapshot, aside, expired, first) if aside else first, (), aside)
    errors: tuple[Exception, ...] = (first,)
    owners: dict[str, list[JobState]] = {}
    for j in snapshot.jobs:
        if j.job_id not in aside:
            owners.setdefault(owner_of(j), []).append(j)
    search = _Search(snapshot, owners, curves, config, outlook)
    culprits = search.run(first)
    errors = _distinct((*errors, *culprits.values()))
    if culprits and len(culprits) < len(owners):
        for o, exc in culprits.items():
            why = (f"deciding its owner's jobs together with another owner's raised {_kind(exc)}"
                   if o in search.together else f"deciding its owner's jobs raised {error_line(exc)}")
            aside.update((j.job_id, why) for j in owners[o])
        second = _attempt(snapshot, aside, curves, config, outlook, None)
        if isinstance(second, Plan):
            return Contained(_kept(snapshot, aside, expired, second), errors, aside)
        errors = _distinct((*errors, second))
        why = f"the decision raised {_kind(second)}, also without the owners it raised for"
    elif search.pool_raises:
        why = f"the decision raised {error_line(first)}, even without any job: the pool alone triggers it"
    elif search.ran_out:
        why = f"the decision raised {_kind(first)}; the owners at fault were not found in {MAX_TRIES} tries"
    elif culprits:
        why = (f"the decision raised {_kind(first)} for every owner's jobs"
               + (", alone or together with another's" if search.together else ""))
    else:
        why = f"the decision raised {_kind(first)} and no owner's jobs alone, nor a few owners' together, did"
    everyone = {j.job_id: aside.get(j.job_id, why) for j in snapshot.jobs}
    return Contained(_kept(snapshot, everyone, expired), errors, everyone, held=True)


def _kind(exc: Exception) -> str:
    """An error as every user whose jobs it holds is told it: its kind only (its text may quote
    another owner's job; the service's log has it)."""
    return f"{type(exc).__name__} (the service's log has it)"


def _distinct(errors) -> tuple[Exception, ...]:
    """The exceptions, each kind and text once, in order."""
    seen, out = set(), []
    for e in errors:
        key = (type(e), str(e))
        if key not in seen:
            seen.add(key)
            out.append(e)
    return tuple(out)


def _attempt(snapshot: Snapshot, aside: Mapping[str, str], curves: Mapping[str, Curve], config: CoreConfig,
             outlook: Outlook, standing: Plan | None) -> Plan | Exception:
    """The decision over every job not set aside, on the pool less what the set-aside jobs hold,
    or what it raised (a plan that breaks the plan's invariants counts as a :class:`PlanError`)."""
    sub = _without(snapshot, aside)
    try:
        plan = decide(sub, curves, config, outlook, standing)
    except Exception as exc:     # noqa: BLE001 - a bug the inputs trigger: contained, reported by the caller
        return exc
    why = plan_violation(sub, plan)
    return plan if why is None else PlanError(why)


class _Search:
    """Which owners' jobs make the decision raise, by halving (module docstring, step 2)."""

    def __init__(self, snapshot: Snapshot, owners: Mapping[str, Sequence[JobState]], curves: Mapping[str, Curve],
                 config: CoreConfig, outlook: Outlook) -> None:
        self.snapshot, self.owners, self.curves, self.config, self.outlook = snapshot, owners, curves, config, outlook
        held = set(chain.from_iterable(j.nodes for j in snapshot.jobs))
        self.free = tuple(n for n in snapshot.nodes if n.name not in held)   # the pool less every held node
        self.by_name = {n.name: n for n in snapshot.nodes}
        self.tries = 0
        self.ran_out = False
        self.pool_raises = False
        self.together: set[str] = set()    # owners found only together with another's (step 2)

    def run(self, error: Exception) -> dict[str, Exception]:
        """The owners at fault, each with what its own jobs raised ({} when none is singled out)."""
        found: dict[str, Exception] = {}
        if isinstance(self._alone(()), Exception):      # the pool alone makes it raise: no one is at fault
            self.pool_raises = True
            return found
        self._halve(list(self.owners), error, found, checked=False)
        return {} if self.ran_out else found

    def _halve(self, group: list[str], error: Exception, found: dict[str, Exception], checked: bool = True) -> None:
        """Search ``group``, whose jobs raise (``checked``: decided alone; the first group raised in
        the whole decision, which may differ: a standing plan, the other jobs)."""
        if len(group) == 1:
            found[group[0]] = error
            return
        mid = len(group) // 2
        raised = False
        for half in (group[:mid], group[mid:]):
            got = self._alone(half)
            if self.ran_out:
                return
            if isinstance(got, Exception):
                raised = True
                self._halve(half, got, found)
        if not raised:
            if not checked:     # raises decided alone too? (else no part of it can be narrowed down to)
                got = self._alone(group)
                if not isinstance(got, Exception):
                    return
                error = got
            self._together(group[:mid], group[mid:], error, found)

    def _together(self, left: list[str], right: list[str], error: Exception, found: dict[str, Exception]) -> None:
        """``left`` and ``right`` raise together and neither alone: narrow ``right`` against all of
        ``left``, then ``left`` against what is left of ``right``; their owners are the culprits."""
        right, error = self._narrow(right, left, error)
        left, error = self._narrow(left, right, error)
        if self.ran_out:
            return
        for o in (*left, *right):
            found[o] = error
            self.together.add(o)

    def _narrow(self, side: list[str], other: list[str], error: Exception) -> tuple[list[str], Exception]:
        """The owners of ``side`` that still raise together with ``other``: the half that does, when
        one does; when neither does (the bug needs owners of both), each half narrowed with the
        other half (what is left of it) added to ``other``."""
        if len(side) <= 1 or self.ran_out:
            return side, error
        mid = len(side) // 2
        first, second = side[:mid], side[mid:]
        for half in (first, second):
            got = self._alone(other + half)
            if isinstance(got, Exception):
                return self._narrow(half, other, got)
        first, error = self._narrow(first, other + second, error)
        second, error = self._narrow(second, other + first, error)
        return first + second, error

    def _alone(self, group: Sequence[str]) -> Plan | Exception | None:
        """The jobs of ``group`` decided alone, on the free pool and their own nodes (None once the
        tries are used up)."""
        if self.tries >= MAX_TRIES:
            self.ran_out = True
            return None
        self.tries += 1
        jobs = tuple(chain.from_iterable(self.owners[o] for o in group))
        own = dict.fromkeys(n for j in jobs for n in j.nodes if n in self.by_name)
        sub = Snapshot(self.snapshot.now_s, self.free + tuple(self.by_name[n] for n in own), jobs)
        return _attempt(sub, {}, self.curves, self.config, self.outlook, None)


def _without(snapshot: Snapshot, aside: Mapping[str, str]) -> Snapshot:
    """The snapshot less the ``aside`` jobs and every node they hold (the same object when none)."""
    if not aside:
        return snapshot
    held = set(chain.from_iterable(j.nodes for j in snapshot.jobs if j.job_id in aside))
    return Snapshot(snapshot.now_s, tuple(n for n in snapshot.nodes if n.name not in held),
                    tuple(j for j in snapshot.jobs if j.job_id not in aside))


def _kept(snapshot: Snapshot, aside: Mapping[str, str], expired: AbstractSet[str], plan: Plan | None = None) -> Plan:
    """``plan`` (None: an empty one) with every ``aside`` job keeping the nodes of the pool it holds
    (each node once, none the plan gives another job, at most its ``max_nodes``; stopping where
    fewer than its ``min_nodes`` are left or it is ``expired``), actions in the snapshot's order."""
    pool = {n.name for n in snapshot.nodes}
    allocations = dict(plan.allocations) if plan is not None else {}
    claimed = set(chain.from_iterable(allocations.values()))
    decided = {a.job_id: a for a in plan.actions} if plan is not None else {}
    actions: list[Action] = []
    stopped = 0
    for j in snapshot.jobs:
        if j.job_id not in aside:
            if j.job_id in decided:
                actions.append(decided[j.job_id])
            continue
        mine = tuple(n for n in dict.fromkeys(j.nodes) if n in pool and n not in claimed)[:max(0, j.spec.max_nodes)]
        kept = () if j.job_id in expired or len(mine) < max(1, j.spec.min_nodes) else mine
        claimed.update(kept)
        allocations[j.job_id] = kept
        if not j.nodes:
            kind, verb = ActionKind.WAIT, "wait"
        elif not kept:
            stopped += 1
            kind, verb = ActionKind.STOP, ("stop: it kept its nodes while set aside for long enough"
                                           if j.job_id in expired else
                                           f"stop: fewer than min_nodes={j.spec.min_nodes} of its nodes are left")
        elif len(kept) == len(j.nodes):
            kind, verb = ActionKind.KEEP, f"keep {len(kept)}"
        else:
            kind, verb = ActionKind.SHRINK, f"keep {len(kept)} of its nodes"
        actions.append(Action(j.job_id, kind, j.nodes, kept, f"{verb}: set aside, {aside[j.job_id]}",
                              ReasonCode.SET_ASIDE))
    owners = {owner_of(j) for j in snapshot.jobs if j.job_id in aside}
    whys = sorted(set(aside.values()))
    more = f" (and {len(whys) - MAX_REASONS_NOTED} more)" if len(whys) > MAX_REASONS_NOTED else ""
    note = (f"set aside {len(aside)} job(s) of {len(owners)} owner(s), kept as they are"
            + (f" but {stopped} stopped" if stopped else "") + ": " + "; ".join(whys[:MAX_REASONS_NOTED]) + more)
    return Plan(snapshot.now_s, allocations, tuple(actions), plan.objective if plan is not None else 0.0,
                plan.solver if plan is not None else "contained", (*(plan.notes if plan is not None else ()), note))
