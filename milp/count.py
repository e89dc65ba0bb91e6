"""The count-based MILP in PuLP (any number of node types).

    max  Σ_j Σ_t Σ_k v_jk · x_jtk
    s.t. Σ_t Σ_k x_jtk ≤ 1                       (one option per job; none = size 0)
         Σ_j Σ_k s_jk · x_jtk ≤ cap_t   ∀ t       (capacity of each node type)
         x_jtk ∈ {0,1}, only for types job j may use (a running job: its own type)

Values are shifted by v_j(0) so that "no option" means size 0.  The solver
always gets a time limit; the caller learns whether it proved optimality,
stopped with an incumbent, or found nothing.
"""
from __future__ import annotations

import pulp

from malletrain.domain.errors import SolverError
from malletrain.milp.problem import Allocation, Problem

SOLVERS = ("cbc", "highs")


def make_solver(name: str, time_limit_s: float, threads: int = 1):
    if name == "cbc":
        return pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit_s, threads=threads)
    if name == "highs":
        return pulp.HiGHS(msg=False, timeLimit=time_limit_s, threads=threads)
    raise SolverError(f"unknown solver {name!r}; choose one of {', '.join(SOLVERS)}")


def solve_count_milp(problem: Problem, solver: str = "cbc",
                     time_limit_s: float = 5.0) -> Allocation:
    prob = pulp.LpProblem("malletrain_counts", pulp.LpMaximize)
    x: dict[tuple[int, str, int], pulp.LpVariable] = {}
    base = 0.0
    for ji, j in enumerate(problem.jobs):
        v0 = j.value_of(0)
        base += v0
        for t in j.node_types:
            for ki, o in enumerate(j.options):
                if o.size > 0 and o.size <= problem.capacity.get(t, 0):
                    x[ji, t, ki] = pulp.LpVariable(f"x_{ji}_{t}_{ki}", cat="Binary")
    if not x:
        return Allocation({j.job_id: (None, 0) for j in problem.jobs}, base,
                          f"milp-{solver}", "optimal")
    prob += pulp.lpSum((problem.jobs[ji].options[ki].value - problem.jobs[ji].value_of(0)) * v
                       for (ji, t, ki), v in x.items())
    for ji in range(len(problem.jobs)):
        terms = [v for (jj, _, _), v in x.items() if jj == ji]
        if len(terms) > 1:
            prob += pulp.lpSum(terms) <= 1
    for t, cap in problem.capacity.items():
        terms = [problem.jobs[ji].options[ki].size * v for (ji, tt, ki), v in x.items() if tt == t]
        if terms:
            prob += pulp.lpSum(terms) <= cap
    prob.solve(make_solver(solver, time_limit_s))
    status = pulp.LpStatus.get(prob.status, str(prob.status))
    sol_status = getattr(prob, "sol_status", None)
    has_solution = status == "Optimal" or sol_status in (pulp.LpSolutionIntegerFeasible,
                                                         pulp.LpSolutionOptimal)
    if not has_solution:
        raise SolverError(f"{solver}: no solution (status {status})")
    sizes: dict[str, tuple[str | None, int]] = {j.job_id: (None, 0) for j in problem.jobs}
    for (ji, t, ki), v in x.items():
        if (v.value() or 0) > 0.5:
            sizes[problem.jobs[ji].job_id] = (t, problem.jobs[ji].options[ki].size)
    proven = status == "Optimal" and sol_status in (None, pulp.LpSolutionOptimal)
    obj = base + sum(problem.jobs[ji].options[ki].value - problem.jobs[ji].value_of(0)
                     for (ji, t, ki), v in x.items() if (v.value() or 0) > 0.5)
    return Allocation(sizes, obj, f"milp-{solver}", "optimal" if proven else "incumbent",
                      notes=() if proven else (f"{solver} stopped at its {time_limit_s:g} s limit; "
                                               "using its best incumbent",))
