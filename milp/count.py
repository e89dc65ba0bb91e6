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

from typing import Any

from malletrain.domain.errors import SolverError
from malletrain.milp import lp
from malletrain.milp.problem import Allocation, Problem

SOLVERS = lp.SOLVERS
make_solver = lp.make_solver


def solve_count_milp(problem: Problem, solver: str = "cbc",
                     time_limit_s: float = 5.0) -> Allocation:
    prob = lp.new_problem("malletrain_counts")
    x: dict[tuple[int, str, int], Any] = {}
    base = 0.0
    for ji, j in enumerate(problem.jobs):
        v0 = j.value_of(0)
        base += v0
        for t in j.node_types:
            for ki, o in enumerate(j.options):
                if o.size > 0 and o.size <= problem.capacity.get(t, 0):
                    x[ji, t, ki] = lp.variable(prob, f"x_{ji}_{t}_{ki}", binary=True)
    if not x:
        return Allocation({j.job_id: (None, 0) for j in problem.jobs}, base,
                          f"milp-{solver}", "optimal")
    prob += lp.lp_sum((problem.jobs[ji].options[ki].value - problem.jobs[ji].value_of(0)) * v
                       for (ji, t, ki), v in x.items())
    for ji in range(len(problem.jobs)):
        terms = [v for (jj, _, _), v in x.items() if jj == ji]
        if len(terms) > 1:
            prob += lp.lp_sum(terms) <= 1
    for t, cap in problem.capacity.items():
        terms = [problem.jobs[ji].options[ki].size * v for (ji, tt, ki), v in x.items() if tt == t]
        if terms:
            prob += lp.lp_sum(terms) <= cap
    out = lp.solve(prob, lp.make_solver(solver, time_limit_s))
    if not out.has_solution:
        raise SolverError(f"{solver}: no solution (status {out.status})")
    sizes: dict[str, tuple[str | None, int]] = {j.job_id: (None, 0) for j in problem.jobs}
    for (ji, t, ki), v in x.items():
        if (v.value() or 0) > 0.5:
            sizes[problem.jobs[ji].job_id] = (t, problem.jobs[ji].options[ki].size)
    proven = out.proven
    obj = base + sum(problem.jobs[ji].options[ki].value - problem.jobs[ji].value_of(0)
                     for (ji, t, ki), v in x.items() if (v.value() or 0) > 0.5)
    return Allocation(sizes, obj, f"milp-{solver}", "optimal" if proven else "incumbent",
                      notes=() if proven else (f"{solver} stopped at its {time_limit_s:g} s limit; "
                                               "using its best incumbent",))
