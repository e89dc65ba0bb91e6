"""Random traces × random workloads × every policy, simulator invariants checked
after every cycle and preemption (no node twice, only idle nodes held, sizes
within [min, max], holder map in sync)."""
import random

import numpy as np
import pytest

from malletrain.domain.config import CoreConfig
from malletrain.replay.engine import ReplayOptions, run_replay
from malletrain.replay.traces import NodeTrace
from malletrain.replay.workload import TrueCurve, WorkloadJob


def random_trace(rng, n, span):
    k = rng.randint(50, 300)
    return NodeTrace([f"n{i}" for i in range(n)], 0.0, span + 1.0,
                     np.array([rng.random() < 0.5 for _ in range(n)]),
                     np.sort(np.array([float(rng.randint(1, span)) for _ in range(k)])),
                     np.array([rng.randrange(n) for _ in range(k)], dtype=np.int32),
                     np.array([rng.random() < 0.5 for _ in range(k)]))


def random_workload(rng, k):
    jobs = []
    for i in range(k):
        lo = rng.randint(1, 3)
        hi = rng.randint(lo, 8)
        pts = (1, 2, 4, 8)
        jobs.append(WorkloadJob(f"j{i}", rng.uniform(0, 2000), False, lo, hi, rng.uniform(1e3, 5e4),
                                rng.choice([0, 10, 60]), rng.choice([0, 5, 20]), rng.choice(["a", "b", ""]),
                                TrueCurve(pts, tuple(10 * p ** rng.uniform(0.5, 1.0) for p in pts)), 0))
    return jobs


@pytest.mark.parametrize("policy,seeds", [("malletrain", 25), ("oracle", 15), ("greedy", 15),
                                          ("static", 15), ("bftrainer", 4)])
def test_random_replays_keep_invariants(policy, seeds):
    for seed in range(seeds):
        rng = random.Random(seed)
        trace = random_trace(rng, rng.randint(2, 20), 4000)
        workload = random_workload(rng, rng.randint(1, 7))
        core = CoreConfig(policy=policy, min_dwell_s=rng.choice([0.0, 60.0]),
                          bftrainer_time_limit_s=rng.choice([0.05, 2.0]))
        res = run_replay(trace, workload, ReplayOptions(
            core=core, interval_s=rng.choice([15.0, 30.0, 120.0]), max_jobs=rng.choice([None, 2]),
            noise=0.1, seed=seed, check_invariants=True))
        s = res.summary.to_dict()
        assert 0.0 <= s["allocated_node_s"] <= s["idle_node_s"] + 1e-6
        assert s["useful_samples"] <= sum(j.work for j in workload) + 1e-6
