"""Benchmarks that only make sense in this repository (they read ``../shared/data``).

* ``jpa``    – prediction error of the JPA on the Pollux measurements from the
  3 counts it would probe;
* ``replay`` – replay wall time on a generated 15-day trace (or a given one).
"""
from __future__ import annotations

import os
import statistics
import time

from malletrain.bench import Report
from malletrain.domain.config import CoreConfig
from malletrain.domain.stats import percentile


# -- JPA accuracy on Pollux ----------------------------------------------------------
def bench_jpa(data: str | None = None) -> Report:
    from devtools.datasets import APPS, default_data_dir, pollux_curves
    from malletrain.jpa.advisor import probe_counts
    from malletrain.jpa.scaling import fit_scaling
    data = data or default_data_dir()
    near, far, floor, lines, per_app = [], [], [], [], {}
    for app in APPS:
        a_near, a_far = [], []
        for _bsz, curve in pollux_curves(data, app).items():
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
    return Report(res, lines)


# -- sizing advice on Pollux -----------------------------------------------------------
def bench_advise(data: str | None = None) -> Report:
    """``malletrain advise`` on every Pollux curve (app × local batch, counts in replicas), from
    the 3 counts the JPA would probe: the error of its predicted time to finish at the held-out
    counts, and how its deadline advice fares against the truth.  Deadlines: for each held-out
    count ``k``, the true time at ``k`` (so the true answer is the smallest count at least that
    fast); the advice is right when it names that count, safe when its count truly meets the
    deadline, and its cost is its true node-hours over the true optimum's."""
    from devtools.datasets import APPS, default_data_dir, pollux_curves
    from malletrain.jpa.advise import advise
    from malletrain.jpa.advisor import probe_counts
    data = data or default_data_dir()
    work = 1e7
    errs, right, safe, safe_p, extra, lines = [], 0, 0, 0, [], []
    none_p = 0
    cases = 0
    for app in APPS:
        a_err = []
        for _bsz, curve in pollux_curves(data, app).items():
            counts = sorted(curve)
            probes = [n for n in probe_counts(counts[0], counts[-1]) if n in curve]
            if len(probes) < 3 or len(counts) < 5:
                continue
            adv = advise({n: curve[n] for n in probes}, counts, work)
            by = {r.nodes: r for r in adv.rows}
            for n in counts:
                if n not in probes:
                    true_t = work / curve[n]
                    a_err.append(abs(by[n].finish_s - true_t) / true_t)
            for k in counts:
                if k in probes:
                    continue
                deadline = work / curve[k]
                best = min(n for n in counts if work / curve[n] <= deadline)
                got = advise({n: curve[n] for n in probes}, counts, work, deadline)
                cases += 1
                right += got.deadline == best
                safe += got.deadline is not None and work / curve[got.deadline] <= deadline * 1.0000001
                safe_p += got.deadline_safe is not None and work / curve[got.deadline_safe] <= deadline * 1.0000001
                none_p += got.deadline_safe is None
                if got.deadline is not None:
                    extra.append(got.deadline * curve[best] / (best * curve[got.deadline]) - 1.0)
        errs += a_err
        if a_err:
            lines.append(f"{app:12s} time-to-finish error at held-out counts: mean "
                         f"{100 * statistics.fmean(a_err):5.1f}%, p90 {100 * percentile(a_err, 0.9):5.1f}% "
                         f"({len(a_err)} counts)")
    res = {"work": work, "probes": "probe_counts(min, max) of each curve", "cases": cases,
           "finish_mape": 100 * statistics.fmean(errs), "finish_p90": 100 * percentile(errs, 0.9),
           "deadline_right": right / cases, "deadline_met": safe / cases, "deadline_met_pessimistic": safe_p / cases,
           "deadline_declined_pessimistic": none_p / cases,
           "node_hours_over_optimum_mean": 100 * statistics.fmean(extra)}
    lines.append(f"ALL          time-to-finish error: mean {res['finish_mape']:.1f}%, p90 {res['finish_p90']:.1f}%; "
                 f"deadline advice ({cases} deadlines): the truly smallest count {100 * res['deadline_right']:.0f}%, "
                 f"meets it {100 * res['deadline_met']:.0f}% (pessimistic pick: meets it "
                 f"{100 * res['deadline_met_pessimistic']:.0f}%, says no count is sure to "
                 f"{100 * res['deadline_declined_pessimistic']:.0f}%), node-hours over the optimum "
                 f"{res['node_hours_over_optimum_mean']:+.1f}%")
    return Report(res, lines)


# -- the fair objective ------------------------------------------------------------------
FAIR_CONFIGS = (("samples/s (raw)", {}), ("speedup", {"objective": "speedup"}),
                ("progress", {"objective": "progress"}),
                ("speedup, bound 1 h", {"objective": "speedup", "starvation_s": 3600.0}),
                ("samples/s, bound 1 h", {"starvation_s": 3600.0}))


def bench_fairness(data: str | None = None, trace_path: str | None = None, jobs: int = 80,
                   seed: int = 21, progress: bool = True) -> Report:
    """The objectives side by side on a mixed-model workload (Pollux curves: six models whose
    sample rates differ ~250x) over the Philly day, every job admitted: progress (Σ fraction of
    each job's work done), completions, completion time and wait, the longest an admitted job
    waited while others ran, Jain's index over jobs."""
    import sys
    import tempfile

    from devtools.datasets import default_data_dir, make_workload, write_workload
    from malletrain.replay.engine import ReplayOptions, run_replay
    from malletrain.replay.traces import load_trace
    from malletrain.replay.workload import load_workload
    data = data or default_data_dir()
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    trace = load_trace(trace_path or os.path.join(here, "examples", "philly-1day.csv.gz"))
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "mixed.yaml")
        write_workload(make_workload(data, jobs, 16 * 3600, seed=seed, work_node_hours=(2, 16)), path)
        workload = load_workload(path)
    rows, lines = [], []
    for name, core in FAIR_CONFIGS:
        s = run_replay(trace, workload, ReplayOptions(core=CoreConfig(policy="malletrain", **core),
                                                      noise=0.05, seed=0)).summary
        rows.append({"config": name, **s.to_dict()})
        lines.append(f"{name:22s} progress {s.progress_units:6.2f}  done {s.jobs_completed:3d}/{s.jobs}  "
                     f"JCT mean {s.jct_mean_s / 3600:5.2f} h  p95 {s.jct_p95_s / 3600:5.2f} h  "
                     f"wait p95 {s.wait_p95_s / 60:6.1f} min  longest starved {s.max_starved_s / 60:6.1f} min  "
                     f"Jain {s.jain_users:.3f}  useful {s.useful_samples:.4g}")
        if progress:
            print(lines[-1], file=sys.stderr)
    raw = rows[0]
    for r in rows[1:]:
        lines.append(f"{r['config']} vs raw: p95 JCT {100 * (r['jct_p95_s'] / raw['jct_p95_s'] - 1):+.0f}%, "
                     f"progress {100 * (r['progress_units'] / raw['progress_units'] - 1):+.1f}%")
    return Report({"trace": trace.path, "jobs": jobs, "seed": seed, "rows": rows}, lines)


# -- variability and topology ---------------------------------------------------------
def bench_variability(progress: bool = True) -> Report:
    """The shipped mixed workload (each model slowed by slow nodes and extra groups as its PAL
    class would be) over the Philly day on nodes with PAL's measured Longhorn speeds and
    cabinets (``examples/philly-nodes.csv``): placement that learns who is sensitive vs. the
    same policy without it, and how close the learned slowdown exponents come to the truth."""
    import sys
    from collections import defaultdict

    import malletrain.core.cycle as cycle_mod
    from malletrain.domain.nodes import load_node_info
    from malletrain.replay.engine import ReplayOptions, run_replay
    from malletrain.replay.traces import load_trace
    from malletrain.replay.workload import load_workload
    here = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
    trace = load_trace(os.path.join(here, "philly-1day.csv.gz"))
    workload = load_workload(os.path.join(here, "workload-mixed.yaml"))
    info = load_node_info(os.path.join(here, "philly-nodes.csv"))
    truth = {w.name: w.sensitivity for w in workload}
    rows, lines = [], []
    learned: dict[str, float] = {}
    decide = cycle_mod.decide

    def spy(snapshot, curves, config, outlook):
        learned.update(outlook.sensitive)
        return decide(snapshot, curves, config, outlook)
    for name, on in (("variability-aware", True), ("blind", False)):
        cycle_mod.decide = spy if on else decide     # type: ignore[assignment]
        try:
            s = run_replay(trace, workload, ReplayOptions(core=CoreConfig(policy="malletrain", variability=on),
                                                          noise=0.05, node_info=info)).summary
        finally:
            cycle_mod.decide = decide                  # type: ignore[assignment]
        node_h = s.allocated_node_s / 3600
        rows.append({"placement": name, **s.to_dict()})
        lines.append(f"{name:18s} done {s.jobs_completed}/{s.jobs}  JCT mean {s.jct_mean_s / 3600:5.2f} h  "
                     f"p95 {s.jct_p95_s / 3600:5.2f} h  node-hours used {node_h:7.0f}  "
                     f"useful {s.useful_samples:.4g}")
        if progress:
            print(lines[-1], file=sys.stderr)
    by: dict[float, list[float]] = defaultdict(list)
    for job, est in learned.items():
        by[truth[job]].append(est)
    acc = {str(t): {"jobs": len(v), "median": statistics.median(v)} for t, v in sorted(by.items())}
    lines.append("learned slowdown exponent (median over jobs) vs. truth: " +
                 ", ".join(f"{t} -> {a['median']:.2f} ({a['jobs']} jobs)" for t, a in acc.items()))
    return Report({"rows": rows, "learned": acc}, lines)


# -- replay speed --------------------------------------------------------------------
def bench_replay(nodes: int = 4734, days: float = 15.0, events: int = 850_000, jobs: int = 1000,
                 trace_path: str | None = None, policy: str = "malletrain",
                 max_jobs: int | None = None, data: str | None = None, quiet: bool = False) -> Report:
    import tempfile

    from devtools.datasets import default_data_dir, make_workload
    from malletrain.replay.engine import ReplayOptions, run_replay
    from malletrain.replay.traces import load_trace
    from malletrain.replay.workload import load_workload
    t0 = time.perf_counter()
    if trace_path:
        trace = load_trace(trace_path)
        label = os.path.basename(trace_path)
    else:
        from devtools.datasets import synthetic_trace
        trace = synthetic_trace(nodes, days, events, seed=1)
        label = f"synthetic {nodes} nodes x {days:g} days"
    t_load = time.perf_counter() - t0
    span = trace.end_s - trace.start_s
    doc = make_workload(data or default_data_dir(), jobs, span * 0.8, seed=2)
    with tempfile.TemporaryDirectory() as d:
        from devtools.datasets import write_workload
        path = os.path.join(d, "w.yaml")
        write_workload(doc, path)
        workload = load_workload(path)
    opts = ReplayOptions(core=CoreConfig(policy=policy), max_jobs=max_jobs,
                         noise=0.05, seed=0, quiet=quiet)
    result = run_replay(trace, workload, opts)
    s = result.summary
    res = {"trace": label, "nodes": len(trace.nodes), "events": trace.n_events, "jobs": jobs,
           "load_s": t_load, "replay_wall_s": s.wall_s, "decisions": s.decisions,
           "decisions_reused": s.decisions_reused, "trace_span_days": span / 86400,
           "decision_ms_p50": s.decision_ms_p50, "decision_ms_p95": s.decision_ms_p95,
           "useful_samples": s.useful_samples, "jobs_completed": s.jobs_completed,
           "harvested_fraction": s.harvested_fraction}
    return Report(res, [f"replay {label}: {trace.n_events:,} events, {jobs} jobs, policy "
                           f"{policy}: load {t_load:.1f} s, replay {s.wall_s:.1f} s wall, "
                           f"{s.decisions:,} decisions + {s.decisions_reused:,} unchanged cycles "
                           f"(p50 {s.decision_ms_p50:.2f} ms, p95 "
                           f"{s.decision_ms_p95:.2f} ms), {s.jobs_completed} jobs done, harvested "
                           f"{100 * s.harvested_fraction:.1f}%"])
