"""Benchmarks behind ``malletrain bench``; each prints its measured figures.

* ``allocator`` – latency of the malletrain decide step (p50/p95 ms) on a
  seeded instance of N nodes × J jobs, re-deciding R times as nodes come and go;
* ``compare``   – BFTrainer's per-node MILP (CBC) vs. the count-based DP and
  count MILP on the same instances: solve-time ratio and objective gap;
* ``jpa``       – prediction error of the JPA on the Pollux measurements from
  the 3 counts it would probe;
* ``replay``    – replay wall time on a generated 15-day trace (or a given one);
* ``quality``   – every policy on one trace and workload, side by side.
"""
from __future__ import annotations

import json
import math
import os
import random
import statistics
import sys
import time

from malletrain.domain.config import CoreConfig
from malletrain.core.decide import decide, size_grid
from malletrain.domain.model import Curve, CurvePoint, JobSpec, JobState, Node, Snapshot
from malletrain.replay.engine import percentile


def _emit(result: dict, as_json: bool, lines: list[str]) -> None:
    if as_json:
        print(json.dumps(result, indent=2, sort_keys=True))
    else:
        for line in lines:
            print(line)


def run(args) -> int:
    if args.bench_command == "runtime":
        from devtools.bench_runtime import run as run_runtime
        return run_runtime(args)
    if args.bench_command == "slurm":
        from malletrain.bench.slurm import bench_slurm
        return bench_slurm(args)
    return {"allocator": bench_allocator, "compare": bench_compare, "jpa": bench_jpa,
            "replay": bench_replay, "quality": bench_quality}[args.bench_command](args)


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


def bench_allocator(args) -> int:
    pool, states, curves = allocator_instance(args.nodes, args.jobs, args.seed)
    cfg = CoreConfig(policy="malletrain")
    rng = random.Random(args.seed + 1)
    lat, objective, now = [], 0.0, 0.0
    live = list(pool)
    for _ in range(args.repeat):
        snap = Snapshot(now, tuple(live), tuple(states))
        t0 = time.perf_counter()
        plan = decide(snap, curves, cfg)
        lat.append((time.perf_counter() - t0) * 1000)
        objective = plan.objective
        # apply the plan, let time pass, and let the primary scheduler take/return 2% of nodes
        states = [JobState(s.spec, plan.allocations[s.job_id], "gpu" if plan.allocations[s.job_id] else None,
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
    res = {"nodes": args.nodes, "jobs": args.jobs, "repeat": args.repeat,
           "decision_ms_p50": percentile(lat, 0.5), "decision_ms_p95": percentile(lat, 0.95),
           "decision_ms_max": max(lat), "objective": objective, "solver": plan.solver}
    _emit(res, args.json, [f"allocator {args.nodes} nodes x {args.jobs} jobs, {args.repeat} decisions "
                           f"({plan.solver}): p50 {res['decision_ms_p50']:.1f} ms, p95 "
                           f"{res['decision_ms_p95']:.1f} ms, max {res['decision_ms_max']:.1f} ms, "
                           f"objective {objective:.6g}"])
    return 0


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
                                 ("gpu",), cur))
    return nodes, njobs, Problem(tuple(choices), {"gpu": n_nodes})


def bench_compare(args) -> int:
    from malletrain.milp.bftrainer import solve_per_node
    from malletrain.milp.count import solve_count_milp
    from malletrain.milp.mck import solve_mck
    from malletrain.milp.problem import evaluate
    rows, lines = [], []
    for spec in args.sizes.split(","):
        n_jobs, n_nodes = (int(x) for x in spec.lower().split("x"))
        for rep in range(args.repeat):
            rng = random.Random(1000 * n_jobs + rep)
            nodes, njobs, problem = per_node_instance(rng, n_jobs, n_nodes)
            t0 = time.perf_counter(); bf = solve_per_node(njobs, nodes, 600.0, time_limit_s=args.time_limit)
            t_bf = time.perf_counter() - t0
            t0 = time.perf_counter(); dp = solve_mck(problem); t_dp = time.perf_counter() - t0
            t0 = time.perf_counter(); cm = solve_count_milp(problem, "cbc", 60.0); t_cm = time.perf_counter() - t0
            bf_sizes = {j: ("gpu" if v else None, len(v)) for j, v in bf.nodes.items()}
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
    _emit({"rows": rows}, args.json, lines)
    return 0


# -- JPA accuracy on Pollux ----------------------------------------------------------
def bench_jpa(args) -> int:
    from malletrain.jpa.advisor import probe_counts
    from malletrain.jpa.scaling import fit_scaling
    from devtools.datasets import APPS, default_data_dir, pollux_curves
    data = args.data or default_data_dir()
    near, far, floor, lines, per_app = [], [], [], [], {}
    for app in APPS:
        a_near, a_far = [], []
        for bsz, curve in pollux_curves(data, app).items():
            counts = sorted(curve)
            probes = [n for n in probe_counts(counts[0], counts[-1]) if n in curve]
            if len(probes) < 3 or len(counts) < 5:
                continue
            fit = fit_scaling(probes, [curve[n] for n in probes])
            for i, n in enumerate(counts):
                if n in probes:
                    continue
                err = abs(fit.throughput(n) - curve[n]) / curve[n]
                (a_near if n <= 2 * max(probes) else a_far).append(err)
                if 0 < i < len(counts) - 1:   # roughness: distance from the neighbours' chord
                    lo, hi = counts[i - 1], counts[i + 1]
                    w = (n - lo) / (hi - lo)
                    floor.append(abs(curve[lo] * (1 - w) + curve[hi] * w - curve[n]) / curve[n])
        near += a_near
        far += a_far
        per_app[app] = {"mape_near": 100 * statistics.fmean(a_near) if a_near else None,
                        "mape_far": 100 * statistics.fmean(a_far) if a_far else None,
                        "points_near": len(a_near), "points_far": len(a_far)}
        lines.append(f"{app:12s} MAPE <=2x probed: {per_app[app]['mape_near'] or 0:5.1f}%  "
                     f"beyond: {per_app[app]['mape_far'] or 0:5.1f}%  ({len(a_near)}/{len(a_far)} points)")
    insample = []   # the best this model can do: fitted on every point of a curve
    for app in APPS:
        for curve in pollux_curves(data, app).values():
            if len(curve) >= 5:
                f = fit_scaling(list(curve), list(curve.values()))
                insample += [abs(f.throughput(n) - x) / x for n, x in curve.items()]
    res = {"probes": "probe_counts(min, max) = 6,12,24 replicas", "per_app": per_app,
           "insample_floor_mape": 100 * statistics.fmean(insample),
           "mape_near": 100 * statistics.fmean(near), "mape_far": 100 * statistics.fmean(far),
           "p90_near": 100 * percentile(near, 0.9), "noise_floor_mape": 100 * statistics.fmean(floor)}
    lines.append(f"ALL          MAPE <=2x probed: {res['mape_near']:5.1f}% (p90 {res['p90_near']:.1f}%)  "
                 f"beyond: {res['mape_far']:5.1f}%   data roughness (point vs. neighbours' chord): "
                 f"{res['noise_floor_mape']:.1f}%; model fitted on all points (in-sample floor): "
                 f"{res['insample_floor_mape']:.1f}%")
    _emit(res, args.json, lines)
    return 0


# -- replay speed --------------------------------------------------------------------
def bench_replay(args) -> int:
    from devtools.datasets import default_data_dir, make_workload
    from malletrain.replay.engine import ReplayOptions, run_replay
    from malletrain.replay.traces import load_trace
    from malletrain.replay.workload import load_workload
    import tempfile
    t0 = time.perf_counter()
    if args.trace:
        trace = load_trace(args.trace)
        label = os.path.basename(args.trace)
    else:
        from devtools.datasets import synthetic_trace
        trace = synthetic_trace(args.nodes, args.days, args.events, seed=1)
        label = f"synthetic {args.nodes} nodes x {args.days:g} days"
    t_load = time.perf_counter() - t0
    span = trace.end_s - trace.start_s
    doc = make_workload(args.data or default_data_dir(), args.jobs, span * 0.8, seed=2)
    with tempfile.TemporaryDirectory() as d:
        from devtools.datasets import write_workload
        path = os.path.join(d, "w.yaml")
        write_workload(doc, path)
        workload = load_workload(path)
    opts = ReplayOptions(core=CoreConfig(policy=args.policy), max_jobs=args.max_jobs,
                         noise=0.05, seed=0, quiet=args.json)
    result = run_replay(trace, workload, opts)
    s = result.summary
    res = {"trace": label, "nodes": len(trace.nodes), "events": trace.n_events, "jobs": args.jobs,
           "load_s": t_load, "replay_wall_s": s["wall_s"], "decisions": s["decisions"],
           "decisions_reused": s["decisions_reused"], "trace_span_days": span / 86400,
           "decision_ms_p50": s["decision_ms_p50"], "decision_ms_p95": s["decision_ms_p95"],
           "useful_samples": s["useful_samples"], "jobs_completed": s["jobs_completed"],
           "harvested_fraction": s["harvested_fraction"]}
    _emit(res, args.json, [f"replay {label}: {trace.n_events:,} events, {args.jobs} jobs, policy "
                           f"{args.policy}: load {t_load:.1f} s, replay {s['wall_s']:.1f} s wall, "
                           f"{s['decisions']:,} decisions + {s['decisions_reused']:,} unchanged cycles (p50 {s['decision_ms_p50']:.2f} ms, p95 "
                           f"{s['decision_ms_p95']:.2f} ms), {s['jobs_completed']} jobs done, harvested "
                           f"{100 * s['harvested_fraction']:.1f}%"])
    return 0


# -- quality ---------------------------------------------------------------------------
def bench_quality(args) -> int:
    from malletrain.replay.engine import ReplayOptions, run_replay
    from malletrain.replay.traces import load_trace
    from malletrain.replay.workload import load_workload
    trace = load_trace(args.trace, nodes=args.nodes, start=args.start, end=args.end)
    workload = load_workload(args.workload)
    rows, lines = [], []
    for policy in [p.strip() for p in args.policies.split(",") if p.strip()]:
        opts = ReplayOptions(core=CoreConfig(policy=policy), interval_s=args.interval,
                             max_jobs=args.max_jobs, noise=args.noise, seed=0, quiet=True)
        s = run_replay(trace, workload, opts).summary
        rows.append(s)
        lines.append(f"{policy:10s} useful {s['useful_samples']:12.5g}  harvested "
                     f"{100 * s['harvested_fraction']:5.1f}%  done {s['jobs_completed']:3d}/{s['jobs']}  "
                     f"lost {s['lost_samples']:10.4g}  rescales {s['rescales']:5d}  preempt "
                     f"{s['preemptions']:4d}  decide p95 {s['decision_ms_p95']:8.1f} ms  wall {s['wall_s']:7.1f} s")
        print(lines[-1], file=sys.stderr) if not args.json else None
    base = {r["policy"]: r["useful_samples"] for r in rows}
    if "malletrain" in base:
        for k, v in base.items():
            if k != "malletrain" and v:
                lines.append(f"malletrain / {k}: {base['malletrain'] / v:.3f}")
    _emit({"trace": args.trace, "rows": rows}, args.json, lines)
    return 0
