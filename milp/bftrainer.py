"""BFTrainer's per-node formulation (the ``bftrainer`` baseline policy).

Following the BFTrainer/FreeTrain MILP (one binary per job × node):

    x_jn ∈ {0,1}   job j runs on node n            Σ_j x_jn ≤ 1   ∀ n
    N_j = Σ_n x_jn,  min_j·z_j ≤ N_j ≤ max_j·z_j    (z_j: job j runs)
    throughput O_j(N_j): piecewise linear through the breakpoints
        (count, T_j(count)) — SOS2, written with segment binaries
        (λ_ji ≥ 0, Σλ = 1, λ_i ≤ y_{i-1} + y_i, Σy = 1) so CBC can solve it;
    u_j / d_j: j takes a new node / gives up one of its nodes
        x_jn ≤ u_j (n not held by j),  1 − x_jn ≤ d_j (n held by j),
        u_j + d_j ≤ 1                               (no migration)
    max Σ_j Tfwd·O_j − T_j(c_j)·(R_up_j·u_j + R_down_j·d_j)

Tfwd is a fixed look-ahead.  On a solver timeout without a proven optimum
BFTrainer keeps the current allocation: so does this.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from malletrain.milp import lp


@dataclass(frozen=True)
class NodeJob:
    job_id: str
    min_nodes: int
    max_nodes: int
    current: tuple[str, ...]
    up_s: float
    down_s: float
    throughput: Callable[[int], float]
    breakpoints: tuple[int, ...] = ()   # default: every count 0..max


@dataclass(frozen=True)
class NodeAllocation:
    nodes: Mapping[str, tuple[str, ...]]
    objective: float
    status: str      # optimal | kept
    notes: tuple[str, ...] = ()


def solve_per_node(jobs: Sequence[NodeJob], nodes: Sequence[str], tfwd_s: float,
                   solver: str = "cbc", time_limit_s: float = 10.0) -> NodeAllocation:
    free = set(nodes)
    prob = lp.new_problem("bftrainer")
    x, obj = {}, []
    per_node: dict[str, list] = {n: [] for n in nodes}
    for ji, j in enumerate(jobs):
        mx = min(j.max_nodes, len(nodes))
        bps = sorted({0, *[b for b in (j.breakpoints or range(mx + 1)) if b <= mx]})
        xs = {}
        for ni, n in enumerate(nodes):
            v = lp.variable(prob, f"x_{ji}_{ni}", binary=True)
            xs[n] = v
            per_node[n].append(v)
        x[j.job_id] = xs
        count = lp.lp_sum(xs.values())
        z = lp.variable(prob, f"z_{ji}", binary=True)
        prob += count >= j.min_nodes * z
        prob += count <= mx * z
        lam = [lp.variable(prob, f"l_{ji}_{i}", low=0) for i in range(len(bps))]
        seg = [lp.variable(prob, f"y_{ji}_{i}", binary=True) for i in range(max(1, len(bps) - 1))]
        prob += lp.lp_sum(lam) == 1
        prob += lp.lp_sum(seg) == 1
        for i in range(len(bps)):
            near = [seg[k] for k in (i - 1, i) if 0 <= k < len(seg)]
            prob += lam[i] <= lp.lp_sum(near)
        prob += count == lp.lp_sum(b * w for b, w in zip(bps, lam))
        thr = lp.lp_sum(j.throughput(b) * w for b, w in zip(bps, lam))
        u = lp.variable(prob, f"u_{ji}", binary=True)
        d = lp.variable(prob, f"d_{ji}", binary=True)
        held = set(j.current) & free
        for n, v in xs.items():
            if n in held:
                prob += 1 - v <= d
            else:
                prob += v <= u
        prob += u + d <= 1
        rate = j.throughput(len(j.current)) if j.current else 0.0
        obj.append(tfwd_s * thr - rate * (j.up_s * u + j.down_s * d))
    for vs in per_node.values():
        if len(vs) > 1:
            prob += lp.lp_sum(vs) <= 1
    prob += lp.lp_sum(obj)
    outcome = lp.solve(prob, lp.make_solver(solver, time_limit_s))
    if not outcome.proven:
        kept = {j.job_id: tuple(n for n in j.current if n in free) for j in jobs}
        kept = {k: (v if len(v) >= next(j.min_nodes for j in jobs if j.job_id == k) else ())
                for k, v in kept.items()}
        why = ("stopped at its time limit with an unproven incumbent" if outcome.has_solution
               else f"found no solution (status {outcome.status})")
        return NodeAllocation(kept, float("nan"), "kept",
                              (f"bftrainer: {solver} {why} ({time_limit_s:g} s limit); "
                               "allocation unchanged",))
    out = {jid: tuple(n for n in nodes if (xs[n].value() or 0) > 0.5) for jid, xs in x.items()}
    return NodeAllocation(out, lp.objective_value(prob), "optimal")
