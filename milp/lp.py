"""The one module that touches PuLP: solver choice, variables, outcome.

PuLP is imported only inside these functions, so importing the allocators
(and running the exact DP) never loads it; the first MILP solve does.
Works with PuLP 2.8–4.x: PuLP 4 (Python ≥ 3.12) reports a solve as an
``LpSolveStats`` and ships no CBC binary (CBC then comes from the ``cbcbox``
wheel or a ``cbc`` on PATH, e.g. Debian's ``coinor-cbc``); earlier releases
report through ``prob.status``/``prob.sol_status`` and bundle CBC.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from typing import Any

from malletrain.domain.errors import SolverError

SOLVERS = ("cbc", "highs")


@dataclass(frozen=True)
class Outcome:
    has_solution: bool   # a feasible solution came back
    proven: bool         # … and the solver proved it optimal
    status: str          # the solver's word for why it stopped


def pulp() -> Any:
    import pulp as module  # noqa: PLC0415 - loaded on the first MILP solve only
    return module


def make_solver(name: str, time_limit_s: float, threads: int = 1) -> Any:
    p = pulp()
    if name == "cbc":
        # CBC is given no thread count unless it is more than one: with ``-threads 1`` the CBC
        # that PuLP 3.3 bundles stalls for exactly 10 s in about one run of six on this machine
        # (optimal answer, no CPU used; measured on the binary alone: 10/60 runs with it, 0/40
        # without it, 0/40 with ``-threads 2``). Without the option CBC runs on one thread.
        cbc_threads = threads if threads > 1 else None
        bundled = getattr(p, "PULP_CBC_CMD", None)      # PuLP < 4 ships CBC
        if bundled is not None and bundled().available():
            return bundled(msg=False, timeLimit=time_limit_s, threads=cbc_threads)
        solver = p.COIN_CMD(msg=False, timeLimit=time_limit_s, threads=cbc_threads,
                            path=shutil.which("cbc"))
        if not solver.available():
            raise SolverError("CBC is not available: install Debian's coinor-cbc (or the cbcbox "
                              "wheel), or use the HiGHS allocator")
        return solver
    if name == "highs":
        return p.HiGHS(msg=False, timeLimit=time_limit_s, threads=threads)
    raise SolverError(f"unknown solver {name!r}; choose one of {', '.join(SOLVERS)}")


def new_problem(name: str) -> Any:
    p = pulp()
    return p.LpProblem(name, p.LpMaximize)


def variable(prob: Any, name: str, *, binary: bool = False, low: float | None = None) -> Any:
    cat = "Binary" if binary else "Continuous"
    if hasattr(prob, "add_variable"):              # PuLP ≥ 3.3
        return prob.add_variable(name, lowBound=low, cat=cat)
    return pulp().LpVariable(name, lowBound=low, cat=cat)


def lp_sum(terms: Any) -> Any:
    return pulp().lpSum(terms)


def solve(prob: Any, solver: Any) -> Outcome:
    p = pulp()
    ret = prob.solve(solver)
    if hasattr(ret, "has_solution"):               # PuLP 4: LpSolveStats
        return Outcome(bool(ret.has_solution), ret.status == p.LpSolveStatus.Optimal,
                       getattr(ret.status, "name", str(ret.status)))
    status = p.LpStatus.get(prob.status, str(prob.status))
    sol = getattr(prob, "sol_status", None)
    has = status == "Optimal" or sol in (p.LpSolutionIntegerFeasible, p.LpSolutionOptimal)
    return Outcome(has, status == "Optimal" and sol in (None, p.LpSolutionOptimal), status)


def objective_value(prob: Any) -> float:
    return float(pulp().value(prob.objective) or 0.0)
