"""Pick the allocator: exact knapsack DP, PuLP MILP, or greedy.

``method``:
  * ``auto``  – the exact DP when there is one node type, else the MILP;
  * ``dp``    – the DP (one node type only);
  * ``cbc`` / ``highs`` – the count MILP with that solver;
  * ``greedy`` – marginal-gain greedy.
A MILP that fails or finds nothing falls back to greedy, and the allocation
says so in ``notes`` (never a silently stale plan).
"""
from __future__ import annotations

from malletrain.domain.errors import SolverError
from malletrain.milp.count import solve_count_milp
from malletrain.milp.greedy import solve_greedy
from malletrain.milp.mck import solve_mck
from malletrain.milp.problem import Allocation, Problem

METHODS = ("auto", "dp", "cbc", "highs", "greedy")


def allocate(problem: Problem, method: str = "auto", time_limit_s: float = 5.0) -> Allocation:
    problem.validate()
    if method not in METHODS:
        raise SolverError(f"unknown allocator {method!r}; choose one of {', '.join(METHODS)}")
    if method == "greedy":
        return solve_greedy(problem)
    if method == "dp" or (method == "auto" and len(problem.capacity) == 1):
        return solve_mck(problem)
    solver = "cbc" if method == "auto" else method
    try:
        return solve_count_milp(problem, solver=solver, time_limit_s=time_limit_s)
    except Exception as exc:  # solver crash, missing binary, no incumbent
        return solve_greedy(problem, note=f"{solver} failed ({exc}); fell back to greedy")
