"""Exact fast path: the single-node-type problem is a multiple-choice knapsack.

Dynamic programme over capacity ``C`` (``dp_j[c]`` = best value of the first
j jobs using at most ``c`` nodes), one job at a time, vectorised with NumPy
over ``c``: O(J · K · C) for J jobs with K options each, two array operations
per option.  ``C`` is capped at the sum of the largest option sizes, and an
option whose value does not beat a smaller option's is dropped (exact).  The
choices are recovered by walking back through the stored ``dp_j`` arrays and
finding an option whose value reproduces ``dp_j[c]`` exactly (the same IEEE
additions are redone), trying the job's current size first so that an
indifferent job keeps its size.
"""
from __future__ import annotations

import numpy as np

from malletrain.milp.problem import Allocation, Problem


def solve_mck(problem: Problem) -> Allocation:
    if len(problem.capacity) != 1:
        raise ValueError("the knapsack path needs exactly one node type")
    (ntype, cap), = problem.capacity.items()
    # Small jobs first: after k jobs the table is flat beyond the sum of their
    # largest sizes, so each job only updates that prefix (exact).
    jobs = sorted(problem.jobs, key=lambda j: max(o.size for o in j.options))
    cap = max(0, min(int(cap), sum(max(o.size for o in j.options) for j in jobs)))
    base = 0.0
    tables = [np.zeros(cap + 1)]
    gains_per_job = []
    reach = 0
    for j in jobs:
        v0 = j.value_of(0)
        base += v0
        # An option no better than a smaller one can never be needed: drop it.
        gains, best = [], 0.0
        for o in sorted(j.options):
            if 0 < o.size <= cap and o.value - v0 > best:
                best = o.value - v0
                gains.append((o.size, best))
        gains_per_job.append(gains)
        dp = tables[-1]
        new = dp.copy()
        reach = min(cap, reach + (gains[-1][0] if gains else 0))
        for s, g in gains:
            np.maximum(new[s:reach + 1], dp[:reach + 1 - s] + g, out=new[s:reach + 1])
        new[reach + 1:] = new[reach]
        tables.append(new)
    sizes: dict[str, tuple[str | None, int]] = {}
    c = cap
    for idx in range(len(jobs) - 1, -1, -1):
        j, gains = jobs[idx], gains_per_job[idx]
        prev, cur = tables[idx], tables[idx + 1]
        target = cur[c]
        order = sorted(gains, key=lambda sg: (sg[0] != j.current_size, sg[0]))
        chosen = 0
        if not (j.current_size > 0 and any(s == j.current_size and s <= c and prev[c - s] + g == target
                                           for s, g in gains)) and prev[c] == target:
            chosen = 0
        else:
            for s, g in order:
                if s <= c and prev[c - s] + g == target:
                    chosen = s
                    break
        sizes[j.job_id] = (ntype, chosen) if chosen else (None, 0)
        c -= chosen
    return Allocation(sizes=sizes, objective=float(tables[-1][cap] + base),
                      solver="mck-dp", status="optimal")
