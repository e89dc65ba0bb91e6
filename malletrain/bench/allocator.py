"""Allocator benchmarks behind ``malletrain bench allocator`` and ``bench compare``.

* ``allocator`` – latency of the malletrain decide step (p50/p95 ms) on a
  seeded instance of N nodes × J jobs, re-deciding R times as nodes come and go;
* ``compare``   – BFTrainer's per-node MILP (CBC) vs. the count-based DP and
  count MILP on the same instances: solve-time ratio and objective gap.
"""
from __future__ import annotations

import math
import random
import time

import numpy as np

from malletrain.bench import Report
from malletrain.core.decide import decide, size_grid
from malletrain.core.stays import StayMap
from malletrain.daemon.collect import collect_if_due
from malletrain.domain.config import CoreConfig
from malletrain.domain.errors import InputError
from malletrain.domain.model import (
    DEFAULT_NODE_TYPE,
    NO_OUTLOOK,
    Curve,
    CurvePoint,
    JobSpec,
    JobState,
    Node,
    Outlook,
    RescaleCost,
    Snapshot,
    Stay,
)
from malletrain.domain.stats import percentile
from malletrain.domain.text import clipped


# -- allocator latency --------------------------------------------------------
def _random_curve(rng: random.Random):
    a, b, c = rng.uniform(0.5, 5), rng.uniform(0.0, 0.05), rng.uniform(0.0, 0.02)
    scale = rng.choice([1.0, 10.0, 100.0])
    return lambda n: 0.0 if n <= 0 else scale / (a / n + b + c * math.log2(n))


def allocator_instance(nodes: int, jobs: int, seed: int):
    rng = random.Random(seed)
    pool = tuple(Node(f"n{i:05d}", group=f"g{i // 128}",
                      window_end_s=rng.choice([None, rng.uniform(600, 86400)])) for i in range(nodes))
    states, curves = [], {}
    for j in range(jobs):
        lo = rng.choice([1, 2, 4])
        hi = rng.choice([16, 32, 64, 128, 256])
        spec = JobSpec(f"j{j:04d}", lo, hi, rng.uniform(10, 120), rng.uniform(5, 30), f"p{j % 10}")
        f = _random_curve(rng)
        curves[spec.job_id] = Curve({n: CurvePoint(f(n), f(n) * 0.9, f(n) * 1.1)
                                     for n in size_grid(lo, hi, 32)}, None, "fit")
        states.append(JobState(spec))
    return pool, states, curves


def _outlook(pool, states, rng: random.Random) -> Outlook:
    """Predicted stays for every node (a seeded spread of short- and long-lived ones) and learned
    pauses for every job.  As the availability model does, nodes alike share one :class:`Stay`
    and the stays come as a :class:`StayMap` (grouped by stay)."""
    taus = (0.3, 1.0, 3.0, 30.0)                        # the node's mean remaining idle time / H
    kinds = [Stay(tau * (1.0 - math.exp(-1.0 / tau)), 1.0 - math.exp(-1.0 / tau)) for tau in taus]
    codes = np.array([taus.index(rng.choice(taus)) for _ in pool], dtype=np.int64)
    stays = StayMap(tuple(n.name for n in pool), codes, kinds)
    costs = {s.job_id: RescaleCost(s.spec.rescale_up_s * rng.uniform(0.5, 1.5),
                                   s.spec.rescale_down_s * rng.uniform(0.5, 1.5), 3, 3) for s in states}
    return Outlook(costs, stays)


def bench_allocator(nodes: int = 4734, jobs: int = 100, repeat: int = 20, seed: int = 0,
                    forecasts: bool = True, idle_collect: bool = True) -> Report:
    """``forecasts``: decide with an :class:`Outlook` (predicted stays of every node, learned
    pauses of every job), as the malletrain policy does once it has data.  ``idle_collect``:
    between two decisions (untimed) a full garbage collection runs when it is due, as the daemon
    runs one while it waits for its next cycle (:func:`malletrain.daemon.collect.collect_if_due`);
    without it, about one decision in thirty also pays Python's own full pass over the process's
    objects (about 10 ms here)."""
    pool, states, curves = allocator_instance(nodes, jobs, seed)
    cfg = CoreConfig(policy="malletrain")
    rng = random.Random(seed + 1)
    outlook = _outlook(pool, states, random.Random(seed + 2)) if forecasts else NO_OUTLOOK
    lat, objective, now = [], 0.0, 0.0
    live = list(pool)
    for _ in range(repeat):
        snap = Snapshot(now, tuple(live), tuple(states))
        t0 = time.perf_counter()
        plan = decide(snap, curves, cfg, outlook)
        lat.append((time.perf_counter() - t0) * 1000)
        objective = plan.objective
        if idle_collect:
            collect_if_due()
        # apply the plan, let time pass, and let the primary scheduler take/return 2% of nodes
        states = [JobState(s.spec, plan.allocations[s.job_id],
                           DEFAULT_NODE_TYPE if plan.allocations[s.job_id] else None,
                           0.0, now) for s in states]
        now += 30.0
        gone = set(rng.sample([n.name for n in live], max(1, len(live) // 50)))
        live_names = {n.name for n in live}
        back = [n for n in pool if n.name not in live_names][:len(gone)]
        live = [n for n in live if n.name not in gone] + back
        states = [JobState(s.spec, tuple(n for n in s.nodes if n not in gone), s.node_type, 0.0, s.last_change_s)
                  for s in states]
        states = [s if s.size >= s.spec.min_nodes or s.size == 0 else
                  JobState(s.spec, (), None, 0.0, now) for s in states]
    res = {"nodes": nodes, "jobs": jobs, "repeat": repeat, "forecasts": forecasts, "idle_collect": idle_collect,
           "decision_ms_p50": percentile(lat, 0.5), "decision_ms_p95": percentile(lat, 0.95),
           "decision_ms_max": max(lat), "objective": objective, "solver": plan.solver}
    return Report(res, [f"allocator {nodes} nodes x {jobs} jobs, {repeat} decisions, "
                        f"{'with' if forecasts else 'without'} forecasts"
                        f"{'' if idle_collect else ', no garbage collection between them'} "
                           f"({plan.solver}): p50 {res['decision_ms_p50']:.1f} ms, p95 "
                           f"{res['decision_ms_p95']:.1f} ms, max {res['decision_ms_max']:.1f} ms, "
                           f"objective {objective:.6g}"])


# -- BFTrainer per-node vs. count-based -------------------------------------------
def per_node_instance(rng: random.Random, n_jobs: int, n_nodes: int, curve=None,
                      max_choices=(4, 8, 12, 16), held_share: float = 0.5):
    """One instance in both forms: nodes + BFTrainer ``NodeJob``s, and the
    equivalent count :class:`Problem` (H = 600 s, every size in [min, max]).
    Running jobs hold the first nodes, up to ``held_share`` of them."""
    from malletrain.milp.bftrainer import NodeJob
    from malletrain.milp.problem import JobChoice, Problem, job_values
    nodes = [f"n{i:04d}" for i in range(n_nodes)]
    njobs, choices, used = [], [], 0
    for i in range(n_jobs):
        f = (curve or _random_curve)(rng)
        lo, hi = rng.choice([1, 2]), rng.choice(max_choices)
        cur = rng.choice([0, lo, hi]) if used + hi <= n_nodes * held_share else 0
        held = tuple(nodes[used:used + cur])
        used += cur
        up, down = rng.uniform(10, 120), rng.uniform(5, 30)
        njobs.append(NodeJob(f"j{i}", lo, hi, held, up, down, f))
        choices.append(JobChoice(f"j{i}", job_values(list(range(lo, hi + 1)), cur, 600.0, up, down, f),
                                 (DEFAULT_NODE_TYPE,), cur))
    return nodes, njobs, Problem(tuple(choices), {DEFAULT_NODE_TYPE: n_nodes})


MAX_COMPARE_JOBS, MAX_COMPARE_NODES = 1000, 100_000


def parse_sizes(sizes: str) -> list[tuple[int, int]]:
    """``JOBSxNODES,...`` → [(jobs, nodes)]; :class:`InputError` for anything else."""
    out = []
    for spec in sizes.split(","):
        parts = spec.strip().lower().split("x")
        if len(parts) != 2 or not all(p.strip().isdigit() and len(p.strip()) <= 9 for p in parts):
            raise InputError(f"--sizes: expected JOBSxNODES, e.g. 10x64, got {clipped(spec)}")
        n_jobs, n_nodes = int(parts[0]), int(parts[1])
        if not (1 <= n_jobs <= MAX_COMPARE_JOBS and 1 <= n_nodes <= MAX_COMPARE_NODES):
            raise InputError(f"--sizes: need 1 <= JOBS <= {MAX_COMPARE_JOBS} and 1 <= NODES <= "
                             f"{MAX_COMPARE_NODES}, got {clipped(spec)}")
        out.append((n_jobs, n_nodes))
    return out


def bench_compare(sizes: str = "10x64,20x128", repeat: int = 3, time_limit_s: float = 60.0) -> Report:
    from malletrain.milp.bftrainer import solve_per_node
    from malletrain.milp.count import solve_count_milp
    from malletrain.milp.mck import solve_mck
    from malletrain.milp.problem import evaluate
    rows, lines = [], []
    for n_jobs, n_nodes in parse_sizes(sizes):
        for rep in range(repeat):
            rng = random.Random(1000 * n_jobs + rep)
            nodes, njobs, problem = per_node_instance(rng, n_jobs, n_nodes)
            t0 = time.perf_counter()
            bf = solve_per_node(njobs, nodes, 600.0, time_limit_s=time_limit_s)
            t_bf = time.perf_counter() - t0
            t0 = time.perf_counter()
            dp = solve_mck(problem)
            t_dp = time.perf_counter() - t0
            t0 = time.perf_counter()
            cm = solve_count_milp(problem, "cbc", 60.0)
            t_cm = time.perf_counter() - t0
            bf_sizes = {j: (DEFAULT_NODE_TYPE if v else None, len(v)) for j, v in bf.nodes.items()}
            bf_obj = evaluate(problem, bf_sizes)
            gap = (dp.objective - bf_obj) / abs(dp.objective) if dp.objective else 0.0
            rows.append({"jobs": n_jobs, "nodes": n_nodes, "rep": rep, "bftrainer_s": t_bf,
                         "bftrainer_status": bf.status, "dp_s": t_dp, "count_milp_s": t_cm,
                         "speedup_dp": t_bf / t_dp, "speedup_count_milp": t_bf / t_cm,
                         "objective_dp": dp.objective, "objective_count_milp": cm.objective,
                         "objective_bftrainer": bf_obj, "gap_bftrainer_vs_dp": gap})
            lines.append(f"{n_jobs:3d} jobs x {n_nodes:4d} nodes #{rep}: BFTrainer per-node CBC "
                         f"{t_bf * 1000:9.1f} ms ({bf.status}) | count DP {t_dp * 1000:7.2f} ms "
                         f"(x{t_bf / t_dp:,.0f} faster) | count MILP CBC {t_cm * 1000:8.1f} ms "
                         f"(x{t_bf / t_cm:,.1f}) | objective gap BFTrainer vs DP {100 * gap:+.4f}% "
                         f"| DP vs count MILP {dp.objective - cm.objective:+.3g}")
    return Report({"rows": rows}, lines)
