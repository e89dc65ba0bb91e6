"""A plan that stands under moved node stays (issue #23): the cycle hands ``decide`` the last plan
when only the stays moved, and ``decide`` keeps it only where a fresh decision gives the same."""
import math
import random
from dataclasses import replace

import pytest
from helpers import plan_record
from test_stress import random_trace, random_workload

import malletrain.core.cycle as cycle_mod
import malletrain.core.decide as decide_mod
from malletrain.core.decide import decide
from malletrain.domain.config import CoreConfig
from malletrain.domain.model import (
    DEFAULT_NODE_TYPE,
    Curve,
    CurvePoint,
    JobSpec,
    JobState,
    Node,
    Outlook,
    Snapshot,
    Stay,
)
from malletrain.replay.engine import ReplayOptions, run_replay


def _replay_plans(trace, workload, opts, monkeypatch, stands: bool):
    """Every cycle's (allocations, actions), the summary, the timeline, the progress and how many
    plans stood, with or without plans standing."""
    seen, stood = [], [0]
    real = cycle_mod.run_cycle

    def recorded(*args, **kwargs):
        res = real(*args, **kwargs)
        seen.append(plan_record(res.plan))
        stood[0] += res.stood
        return res
    with monkeypatch.context() as m:
        m.setattr("malletrain.replay.engine.run_cycle", recorded)
        if not stands:
            m.setattr(decide_mod, "_stands", lambda *a: False)
        r = run_replay(trace, workload, opts)
    s = r.summary.to_dict()
    for k in ("wall_s", "decision_ms_p50", "decision_ms_p95", "decision_ms_mean"):
        s.pop(k)
    return seen, s, r.timeline, sorted(r.progress.items()), stood[0]


@pytest.mark.parametrize("policy", ["malletrain", "oracle"])
def test_plans_that_stand_give_every_decision_a_fresh_one_gives(policy, monkeypatch):
    stood = 0
    for seed in range(6):
        rng = random.Random(300 + seed)
        trace = random_trace(rng, rng.randint(8, 24), 30000)     # enough closed stretches to predict stays
        # jobs that run long enough for their nodes to age across the availability model's grid
        workload = [replace(j, work=j.work * 100) for j in random_workload(rng, rng.randint(1, 6))]
        opts = ReplayOptions(core=CoreConfig(policy=policy, min_dwell_s=rng.choice([0.0, 90.0])),
                             interval_s=30.0, noise=0.05, seed=seed, check_invariants=True)
        a = _replay_plans(trace, workload, opts, monkeypatch, stands=True)
        b = _replay_plans(trace, workload, opts, monkeypatch, stands=False)
        assert b[4] == 0
        assert a[:4] == b[:4]
        stood += a[4]
    assert stood > 0      # plans did stand


def _instance(rng, n_nodes=40, n_jobs=4):
    nodes = tuple(Node(f"n{i:03d}") for i in range(n_nodes))
    jobs, curves, used = [], {}, 0
    for j in range(n_jobs):
        hi = rng.choice([4, 8, 12])
        spec = JobSpec(f"j{j}", 1, hi, rng.uniform(10, 60), rng.uniform(5, 20), f"p{j}")
        a = rng.uniform(0.5, 3)
        rate = [10 * n / (1 + a * 0.05 * n) for n in range(hi + 1)]
        curves[spec.job_id] = Curve({n: CurvePoint(rate[n], 0.9 * rate[n], 1.1 * rate[n]) for n in range(1, hi + 1)},
                                    None, "fit")
        size = rng.randint(0, hi) if used + hi <= n_nodes else 0
        jobs.append(JobState(spec, nodes_of(nodes, used, size), DEFAULT_NODE_TYPE if size else None))
        used += size
    return nodes, jobs, curves


def nodes_of(nodes, start, size):
    return tuple(n.name for n in nodes[start:start + size])


KINDS = [Stay(f, p) for f, p in ((0.05, 1.0), (0.2, 0.9), (0.5, 0.6), (0.9, 0.1), (0.97, 0.03), (1.0, 0.0))]


def _stays(rng, nodes):
    """Every node one of a few stays (as the availability model gives), from a random few kinds."""
    kinds = rng.sample(KINDS, rng.randint(1, 3))
    return {n.name: rng.choice(kinds) for n in nodes}


def _stable(nodes, jobs, curves, cfg, outlook):
    """Apply decisions until one changes nothing: that plan and the jobs it kept."""
    for _ in range(10):
        plan = decide(Snapshot(0.0, nodes, tuple(jobs)), curves, cfg, outlook)
        if not plan.changes():
            return plan, jobs
        jobs = [JobState(j.spec, plan.allocations[j.job_id], DEFAULT_NODE_TYPE if plan.allocations[j.job_id] else None)
                for j in jobs]
    return None, jobs


@pytest.mark.parametrize("seed", range(4))
def test_decide_keeps_a_standing_plan_only_when_a_fresh_decision_gives_it(seed):
    rng = random.Random(seed)
    cfg = CoreConfig(policy="malletrain")
    kept = fresh = 0
    for _ in range(60):
        nodes, jobs, curves = _instance(rng)
        plan, jobs = _stable(nodes, jobs, curves, cfg, Outlook(stays=_stays(rng, nodes)))
        if plan is None:
            continue
        moved = Outlook(stays=_stays(rng, nodes))
        snap = Snapshot(0.0, nodes, tuple(jobs))
        got = decide(snap, curves, cfg, moved, standing=plan)
        want = decide(snap, curves, cfg, moved)
        assert got.allocations == want.allocations and got.actions == want.actions
        if got is plan:
            kept += 1
        else:
            fresh += 1
    assert kept and fresh        # both ways were taken


def test_a_standing_plan_is_not_kept_when_a_job_now_gains_by_growing():
    nodes = tuple(Node(f"n{i}") for i in range(8))
    spec = JobSpec("j", 1, 8, 20.0, 10.0, "p")
    curve = Curve({n: CurvePoint(10.0 * n, 9.0 * n, 11.0 * n) for n in range(1, 9)}, None, "fit")
    job = JobState(spec, ("n0", "n1"), DEFAULT_NODE_TYPE)
    cfg = CoreConfig(policy="malletrain")
    # its own nodes stay, the free ones leave at once: growing does not pay
    soon = {n.name: Stay(1.0, 0.0) if n.name in job.nodes else Stay(0.01, 1.0) for n in nodes}
    plan = decide(Snapshot(0.0, nodes, (job,)), {"j": curve}, cfg, Outlook(stays=soon))
    assert not plan.changes()
    late = dict(soon, **{f"n{i}": Stay(1.0, 0.0) for i in range(2, 8)})   # the free nodes now stay
    got = decide(Snapshot(0.0, nodes, (job,)), {"j": curve}, cfg, Outlook(stays=late), standing=plan)
    assert got is not plan and len(got.allocations["j"]) > 2


def test_a_standing_plan_needs_the_exact_dp_no_notes_and_the_jobs_as_it_kept_them():
    rng = random.Random(7)
    for _ in range(200):
        nodes, jobs, curves = _instance(rng)
        cfg = CoreConfig(policy="malletrain")
        plan, jobs = _stable(nodes, jobs, curves, cfg, Outlook(stays=_stays(rng, nodes)))
        if plan is None:
            continue
        snap = Snapshot(0.0, nodes, tuple(jobs))
        if decide(snap, curves, cfg, Outlook(stays=_stays(random.Random(1), nodes)), standing=plan) is plan:
            break
    else:
        pytest.fail("no plan stood")
    moved = Outlook(stays=_stays(random.Random(1), nodes))
    assert decide(snap, curves, cfg, moved, standing=plan) is plan
    for other in (replace(plan, notes=("cbc timed out",)), replace(plan, solver="greedy")):
        assert decide(snap, curves, cfg, moved, standing=other) is not other
    assert decide(snap, curves, replace(cfg, policy="greedy"), moved, standing=plan) is not plan
    # a job that is not where the plan kept it (another state): decided afresh
    busy = next(j for j in jobs if j.nodes)
    moved_job = [JobState(j.spec, j.nodes[:-1], j.node_type) if j is busy else j for j in jobs]
    if busy.size - 1 >= busy.spec.min_nodes:
        assert decide(Snapshot(0.0, nodes, tuple(moved_job)), curves, cfg, moved, standing=plan) is not plan
    assert decide(Snapshot(0.0, nodes, tuple(jobs[:-1])), curves, cfg, moved, standing=plan) is not plan


def test_the_margin_is_far_above_the_rounding_of_a_sum_of_values():
    # 1,000 jobs' values summed in any order differ by far less than the margin of their total
    rng = random.Random(3)
    values = [rng.uniform(-1e7, 1e7) for _ in range(1000)]
    total = 1.0 + sum(abs(v) for v in values)
    sums = {math.fsum(values)} | {sum(rng.sample(values, len(values))) for _ in range(50)}
    assert max(sums) - min(sums) < decide_mod.STANDING_MARGIN * total * 1e-3
