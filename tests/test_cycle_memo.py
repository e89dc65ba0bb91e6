"""Reusing the plan of an unchanged cycle must not change any result."""
import random

import pytest
from helpers import plan_record
from test_stress import random_trace, random_workload

import malletrain.replay.engine as replay_mod
from malletrain.domain.config import CoreConfig
from malletrain.replay.engine import ReplayOptions, run_replay

TIMINGS = ("wall_s", "decision_ms_p50", "decision_ms_p95", "decision_ms_mean", "decisions", "decisions_reused")


def _recorded(into: list):
    real = replay_mod.run_cycle

    def run_cycle(*args, **kwargs):
        res = real(*args, **kwargs)
        into.append(plan_record(res.plan))
        return res
    return run_cycle


class NoMemo(replay_mod.CycleMemo):     # a memo that never matches
    def __setattr__(self, k, v):
        object.__setattr__(self, k, None if k == "plan" else v)


def _replayed(trace, workload, opts, monkeypatch, memo: bool):
    """The replay's summary less its timings, every cycle's plan, and how many plans were reused."""
    plans: list = []
    with monkeypatch.context() as m:
        if not memo:
            m.setattr(replay_mod, "CycleMemo", NoMemo)
        m.setattr(replay_mod, "run_cycle", _recorded(plans))
        s = run_replay(trace, workload, opts).summary.to_dict()
    reused = s["decisions_reused"]
    for k in TIMINGS:
        s.pop(k)
    return s, plans, reused


@pytest.mark.parametrize("policy", ["malletrain", "oracle", "static"])
def test_memo_gives_identical_results(policy, monkeypatch):
    reused = 0
    for seed in range(8):
        rng = random.Random(100 + seed)
        trace = random_trace(rng, rng.randint(2, 16), 6000)
        workload = random_workload(rng, rng.randint(1, 6))
        opts = ReplayOptions(core=CoreConfig(policy=policy, min_dwell_s=rng.choice([0.0, 90.0])),
                             interval_s=30.0, noise=0.05, seed=seed, check_invariants=True)
        with_memo, plans_memo, n = _replayed(trace, workload, opts, monkeypatch, memo=True)
        without, plans_fresh, _ = _replayed(trace, workload, opts, monkeypatch, memo=False)
        reused += n
        assert with_memo == without
        # every cycle's plan, reasons included: a reused plan says what a fresh one would (what
        # `malletrain why` shows), e.g. no "changed 38s ago" from the cycle it was made in
        assert plans_memo == plans_fresh
    assert reused > 0   # the memo was exercised


@pytest.mark.parametrize("policy", ["malletrain", "oracle"])
def test_memo_gives_identical_results_with_the_starvation_rule(policy, monkeypatch):
    # whether a job starves (waited starvation_s without nodes) or is protected (changed less than
    # starvation_s ago) changes with the clock alone: a plan reused across that moment is stale
    reused = 0
    for seed in range(8):
        rng = random.Random(200 + seed)
        trace = random_trace(rng, rng.randint(2, 12), 6000)
        workload = random_workload(rng, rng.randint(2, 6))
        opts = ReplayOptions(core=CoreConfig(policy=policy, starvation_s=rng.choice([60.0, 300.0, 900.0])),
                             interval_s=30.0, noise=0.05, seed=seed, check_invariants=True)
        with_memo, plans_memo, n = _replayed(trace, workload, opts, monkeypatch, memo=True)
        without, plans_fresh, _ = _replayed(trace, workload, opts, monkeypatch, memo=False)
        reused += n
        assert (with_memo, plans_memo) == (without, plans_fresh)
    assert reused > 0
