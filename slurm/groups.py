"""Elastic groups (issue #26): a malleable job as a held job array of 1-node members.

Slurm cannot grow a running job and preempts whole jobs, so an elastic job is one array whose
tasks each take one node (``malletrain submit --elastic``).  Slurm then holds, starts, preempts
and requeues each node's member on its own, while the training runtime re-forms its process
group in place (:mod:`malletrain.runtime.elastic`).  The queue read (no ``-r``) shows an array's
pending tasks as one line, which is enough when they are all held (:func:`from_lines`: a steady
group); otherwise the backend reads that array once more task by task (``squeue -r -j``).
:func:`fold` turns the tasks of one array into a single record, the one the core sees: its id is
the array's, its nodes are its running members' nodes.

Member states, as the backend reads them (one line of ``squeue -r`` each):

==========================  ================================================================
member                      group
==========================  ================================================================
RUNNING on node n           n is one of the group's nodes
PENDING, released by us     launching onto the node we chose (``Book.members``)
PENDING, not released       preempted or requeued by Slurm: held again by the daemon
PENDING held                a spare member: the next grow starts it on a node
COMPLETING, REQUEUED, ...   leaving: its node is not the group's, nor harvestable yet
ended                       not listed: a member's work ended ``done``, or it failed
==========================  ================================================================

The group's own state: RUNNING if any member runs, else COMPLETING while one leaves, else
PENDING while one is launching, else held.  Pure: no I/O; imports ``slurm.parse`` and the domain only.
"""
from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import replace

from malletrain.domain.model import MAX_MEMBERS
from malletrain.slurm.parse import JobRecord, Phase, all_held, array_tasks

CHOSEN_ENDS = frozenset({"CANCELLED", "DEADLINE", "REVOKED", "SPECIAL_EXIT"})   # someone chose this end


def fold(records: Iterable[JobRecord], partition: str,
         arrays: Collection[str]) -> tuple[list[JobRecord], dict[str, tuple[JobRecord, ...]]]:
    """The queue's records with the tasks of ``arrays`` in ``partition`` (read one line a task:
    ``squeue -r``) folded into one record per array, and each array's members (by task id, at
    most :data:`MAX_MEMBERS`).  Other arrays' lines stay as they are."""
    out: list[JobRecord] = []
    tasks: dict[str, list[JobRecord]] = {}
    for r in records:
        if r.array_id in arrays and r.partition == partition and r.uid is not None:
            tasks.setdefault(r.array_id, []).append(r)
        else:
            out.append(r)
    groups: dict[str, tuple[JobRecord, ...]] = {}
    for gid, members in tasks.items():
        # one owner, one node per task, a bounded count, each task on its own line: anything else
        # is no group (its tasks stay records of their own, counted as every job is, never adopted)
        if len({m.uid for m in members}) != 1 or len(members) > MAX_MEMBERS \
                or any(m.node_count != 1 or m.task < 0 for m in members):
            out.extend(members)
            continue
        ordered = tuple(sorted(members, key=lambda m: m.task))
        groups[gid] = ordered
        out.append(group_record(gid, ordered))
    return out, groups


def from_lines(lines: Iterable[JobRecord]) -> tuple[JobRecord, ...] | None:
    """An array's members from the plain queue read (no ``-r``), when its lines say enough: a
    task that runs (or was requeued after it ran) is a line of its own; the pending tasks share
    one line, which is enough only when every reason on it is a hold (then every task on it is a
    held member) and its task list is whole.  None otherwise: a member launching onto a node or
    requeued by Slurm hides in that line, and the array is read task by task (``squeue -r``)."""
    out: list[JobRecord] = []
    for r in lines:
        if r.task >= 0:
            out.append(r)
            continue
        ids = array_tasks(r.tasks, MAX_MEMBERS) if all_held(r.reason) else None
        if ids is None:
            return None
        out.extend(replace(r, task=t, tasks="", reason="JobHeldUser") for t in ids)
    return tuple(out)


def group_record(gid: str, members: tuple[JobRecord, ...]) -> JobRecord:
    """The one record the daemon judges a group by (``members`` non-empty, one array)."""
    phases = {m.phase for m in members}
    running = [m for m in members if m.phase is Phase.RUNNING]
    if running:
        state, reason = "RUNNING", "None"
    elif Phase.MOVING in phases:
        state, reason = "COMPLETING", "None"
    elif Phase.PENDING in phases:
        state, reason = "PENDING", "None"
    elif Phase.HELD in phases:
        state, reason = "PENDING", "JobHeldUser"
    else:
        state, reason = "COMPLETED", "None"
    nodes = tuple(n for m in running for n in m.nodes)
    first = members[0]
    starts = [m.start_s for m in running if m.start_s]
    submits = [m.submit_s for m in members if m.submit_s]
    return JobRecord(gid, first.partition, state, reason, max(1, len(nodes)), nodes,
                     min(starts) if starts else None, (), min(submits) if submits else None,
                     first.user, first.uid, restarts=0, plain=True)


def ended_record(gid: str, members: tuple[JobRecord, ...]) -> JobRecord | None:
    """The record of a group none of whose members is queued any more (``members`` read with
    ``-t all``), for the safety net: a member someone ended (cancelled: :data:`CHOSEN_ENDS`)
    makes the group's end chosen too, and it is left alone; else it ended as its worst member
    did (a member that failed, not one that completed, decides); None while a member is still
    queued or none is known."""
    if not members or any(m.phase is not Phase.FINISHED for m in members):
        return None
    worst = next((m.state for m in members if m.state in CHOSEN_ENDS),
                 next((m.state for m in members if m.state != "COMPLETED"), "COMPLETED"))
    return replace(group_record(gid, members), state=worst, reason="None")


def member_on(members: Iterable[JobRecord], node: str) -> JobRecord | None:
    """The running member on ``node``, if any."""
    return next((m for m in members if m.phase is Phase.RUNNING and node in m.nodes), None)


def spare(members: Iterable[JobRecord], placed: Iterable[int]) -> list[JobRecord]:
    """Held members the daemon may start, lowest task first (none of those it placed)."""
    taken = set(placed)
    return [m for m in members if m.phase is Phase.HELD and m.task not in taken]
