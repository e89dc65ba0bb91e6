"""Greedy by marginal gain per node (the ``greedy`` policy and the fallback).

Every job starts at size 0; repeatedly the move with the best gain per added
node (from its chosen option to any larger option that still fits) is taken,
until no move gains.  Not optimal for non-concave values; always feasible.
"""
from __future__ import annotations

from malletrain.milp.problem import Allocation, Problem


def solve_greedy(problem: Problem, note: str = "") -> Allocation:
    remaining = dict(problem.capacity)
    chosen: dict[str, tuple[str | None, int]] = {j.job_id: (None, 0) for j in problem.jobs}
    while True:
        best = None  # (gain per node, -index, job, type, size)
        for idx, j in enumerate(problem.jobs):
            t_now, s_now = chosen[j.job_id]
            v_now = j.value_of(s_now)
            types = (t_now,) if t_now else j.node_types
            for t in types:
                free = remaining.get(t, 0)
                for o in j.options:
                    add = o.size - s_now
                    if add <= 0 or add > free:
                        continue
                    rate = (o.value - v_now) / add
                    if rate > 1e-12 and (best is None or (rate, -idx) > best[:2]):
                        best = (rate, -idx, j.job_id, t, o.size)
        if best is None:
            break
        _, _, jid, t, size = best
        remaining[t] -= size - chosen[jid][1]
        chosen[jid] = (t, size)
    total = sum(j.value_of(chosen[j.job_id][1]) for j in problem.jobs)
    return Allocation(sizes=chosen, objective=total, solver="greedy",
                      status="fallback" if note else "heuristic",
                      notes=(note,) if note else ())
