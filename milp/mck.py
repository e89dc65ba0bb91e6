"""Exact fast path: the single-node-type problem is a multiple-choice knapsack.

Dynamic programme over capacity ``C`` (``dp[c]`` = best value using at most
``c`` nodes), one job at a time, vectorised with NumPy over ``c``:
O(J · K · C) for J jobs with K options each.  ``C`` is capped at the sum of
the largest option sizes, so a lightly loaded instance stays small.  Ties go
to the earlier option, and options are tried current-size first, so an
indifferent job keeps its size.
"""
from __future__ import annotations

import numpy as np

from milp.problem import Allocation, Problem


def solve_mck(problem: Problem) -> Allocation:
    if len(problem.capacity) != 1:
        raise ValueError("the knapsack path needs exactly one node type")
    (ntype, cap), = problem.capacity.items()
    jobs = problem.jobs
    cap = max(0, min(int(cap), sum(max(o.size for o in j.options) for j in jobs)))
    dp = np.zeros(cap + 1)
    choices = []
    base = 0.0
    for j in jobs:
        v0 = j.value_of(0)
        base += v0
        opts = sorted((o for o in j.options if o.size > 0 and o.size <= cap),
                      key=lambda o: (o.size != j.current_size, o.size))
        new = dp.copy()
        pick = np.full(cap + 1, -1, dtype=np.int32)
        for k, o in enumerate(opts):
            s, gain = o.size, o.value - v0
            cand = dp[:cap + 1 - s] + gain
            better = cand > new[s:]
            if better.any():
                new[s:] = np.where(better, cand, new[s:])
                pick[s:][better] = k
        choices.append((opts, pick))
        dp = new
    sizes: dict[str, tuple[str | None, int]] = {}
    c = cap
    for j, (opts, pick) in zip(reversed(jobs), reversed(choices)):
        k = int(pick[c])
        if k >= 0:
            sizes[j.job_id] = (ntype, opts[k].size)
            c -= opts[k].size
        else:
            sizes[j.job_id] = (None, 0)
    return Allocation(sizes=sizes, objective=float(dp[cap] + base),
                      solver="mck-dp", status="optimal")
