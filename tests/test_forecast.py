"""Issue #12's predictors and objective terms: learned rescale pauses, node availability (no
look-ahead), the expected-work objective, the fair objective and the starvation bound."""
import math
import random
import statistics

import numpy as np
import pytest

from malletrain.core.availability import IdleHistory
from malletrain.core.decide import decide
from malletrain.core.objective import FreeOrder, expected_values, unit_weight
from malletrain.domain.config import CoreConfig, from_mapping
from malletrain.domain.errors import ConfigError
from malletrain.domain.model import (
    STAYING,
    Curve,
    CurvePoint,
    JobSpec,
    JobState,
    Node,
    PauseKind,
    PauseSample,
    RescaleCost,
    Snapshot,
    Stay,
)
from malletrain.jpa.rescale import RescaleLearner


def curve(f, counts=range(1, 17)):
    return Curve({n: CurvePoint(f(n), f(n), f(n)) for n in counts}, None, "oracle")


# ---------------------------------------------------------------- learned rescale pauses
def test_a_wrong_guess_gives_way_to_measurements():
    lr = RescaleLearner()
    lr.register("j", "")
    assert lr.cost("j", 90.0, 30.0) == RescaleCost(90.0, 30.0, 0, 0)          # the guess, before data
    assert lr.cost("j", 90.0, 30.0).source == "configured"
    truth = 20.0
    rng = random.Random(1)
    for k in range(3):
        lr.add(PauseSample("j", PauseKind.START, truth * (1 + 0.05 * rng.gauss(0, 1)), float(k)))
        est = lr.cost("j", 90.0, 30.0).up_s
        if k == 0:
            assert est == pytest.approx((90.0 + lr.measured("j", PauseKind.START)[0]) / 2)
    assert abs(est - truth) / truth < 0.2          # within 20% after three, from a guess 4.5x off
    assert lr.cost("j", 90.0, 30.0).down_s == 30.0   # the other direction still has only the guess
    assert "3 up" in lr.cost("j", 90.0, 30.0).source


def test_a_profile_teaches_its_next_job_and_bounds_hold():
    lr = RescaleLearner()
    lr.register("a", "bert")
    lr.register("b", "bert")
    lr.register("c", "other")
    for k in range(3):
        assert lr.add(PauseSample("a", PauseKind.SHRINK, 12.0, float(k)))
    assert lr.cost("b", 60.0, 60.0).down_s == 12.0           # b has no data: its profile's median
    assert lr.cost("c", 60.0, 60.0).down_s == 60.0           # another profile: its own guess
    for bad in (-1.0, math.nan, math.inf, 1e12, True):
        assert not lr.add(PauseSample("a", PauseKind.GROW, bad, 9.0))
    assert lr.rejected == 5 and lr.measured("a", PauseKind.START) == ()
    lr.forget("a")                                           # its profile remembers
    assert lr.measured("a", PauseKind.SHRINK) == () and lr.cost("b", 60.0, 60.0).down_s == 12.0
    again = RescaleLearner()
    again.load(lr.dump())
    assert again.cost("b", 60.0, 60.0) == lr.cost("b", 60.0, 60.0)


def test_a_restarting_job_pays_one_pause_per_direction_whatever_the_kind():
    """A job that restarts on every change: its grows teach its starts, its preemptions its
    shrinks (one restart each), so its costs are the two they always were."""
    lr = RescaleLearner()
    lr.register("j", "")
    for k, (kind, p) in enumerate([(PauseKind.START, 10.0), (PauseKind.GROW, 12.0), (PauseKind.GROW, 14.0),
                                   (PauseKind.SHRINK, 4.0), (PauseKind.PREEMPTION, 6.0), (PauseKind.LOSS, 8.0)]):
        lr.add(PauseSample("j", kind, p, float(k)))
    cost = lr.cost("j", 90.0, 30.0)
    assert cost == RescaleCost(statistics.median([10.0, 12.0, 14.0, 90.0]), statistics.median([4.0, 6.0, 8.0, 30.0]),
                               3, 3)
    assert cost.grow_pause_s == cost.up_s and cost.taken_pause_s == cost.down_s
    assert lr.measured("j", PauseKind.GROW) == (10.0, 12.0, 14.0)


def test_an_elastic_group_learns_each_kind_with_the_priors_chained():
    """Issue #26: a group re-forms in place, so a grow is not a start and a node taken back is
    not a restart.  Before its own measurements: the configured up for a start and a grow, the
    configured down for a shrink, the shrink's estimate for a preemption, the preemption's for a
    loss.  Its profile teaches only other elastic jobs of that profile."""
    lr = RescaleLearner()
    lr.register("g", "bert", elastic=True)
    lr.register("plain", "bert")
    lr.register("g2", "bert", elastic=True)
    assert lr.elastic("g") and not lr.elastic("plain")
    first = lr.cost("g", 30.0, 10.0)
    assert (first.up_s, first.grow_pause_s, first.down_s, first.taken_pause_s, first.loss_s) == (30, 30, 10, 10, 10)
    for k in range(3):
        lr.add(PauseSample("g", PauseKind.GROW, 0.2, float(k)))
        lr.add(PauseSample("g", PauseKind.SHRINK, 0.05, float(k)))
        lr.add(PauseSample("g", PauseKind.LOSS, 2.0, float(k)))
    lr.add(PauseSample("g", PauseKind.START, 6.0, 9.0))
    cost = lr.cost("g", 30.0, 10.0)
    assert cost.up_s == 6.0 and cost.grow_pause_s == 0.2 and cost.down_s == 0.05   # (its profile holds its start)
    assert cost.taken_pause_s == 0.05 and cost.preemption_n == 0        # as the shrink, until measured
    assert cost.loss_s == 2.0 and cost.loss_n == 3
    assert "3 grow" in cost.source and "1 start" in cost.source
    lr.add(PauseSample("g", PauseKind.PREEMPTION, 0.5, 10.0))
    assert lr.cost("g", 30.0, 10.0).taken_pause_s == statistics.median([0.5, 0.05])   # and the shrink's
    assert lr.cost("g2", 30.0, 10.0).grow_pause_s == 0.2         # its profile's elastic grows
    plain = lr.cost("plain", 30.0, 10.0)
    assert plain == RescaleCost(30.0, 10.0)       # the groups' pauses are not a restart's
    again = RescaleLearner()
    again.load(lr.dump())
    assert again.cost("g", 30.0, 10.0) == lr.cost("g", 30.0, 10.0)
    assert again.cost("g2", 30.0, 10.0) == lr.cost("g2", 30.0, 10.0)


def test_a_store_from_before_the_kinds_loads_its_directions_as_start_and_shrink():
    old = {"jobs": [["j", "up", [5.0, 7.0]], ["x", "sideways", [1.0]], 7, ["j", "down", [2.0]]],
           "profiles": [["bert", "down", [3.0]], ["bert"]], "job_profiles": {"j": "bert", "k": "bert"}}
    lr = RescaleLearner()
    lr.load(old)               # the bad entries are left out one by one: the rest loads
    assert lr.measured("j", PauseKind.START) == (5.0, 7.0) and lr.measured("j", PauseKind.PREEMPTION) == (2.0,)
    assert lr.cost("k", 60.0, 60.0).down_s == 3.0 and lr.rejected == 3


def test_a_groups_preemptions_and_losses_teach_only_that_group():
    """What no change of the daemon's caused, only the group's own file reports: it never becomes
    its profile's (other jobs', other users' where an operator shares profiles) prior."""
    lr = RescaleLearner()
    lr.register("g", "bert", elastic=True)
    lr.register("h", "bert", elastic=True)
    for k in range(5):
        lr.add(PauseSample("g", PauseKind.PREEMPTION, 0.0, float(k)))
        lr.add(PauseSample("g", PauseKind.LOSS, 0.0, float(k)))
        lr.add(PauseSample("g", PauseKind.SHRINK, 1.0, float(k)))
    g, h = lr.cost("g", 30.0, 10.0), lr.cost("h", 30.0, 10.0)
    assert g.taken_pause_s == 0.0 and g.loss_s == 0.0
    assert h.down_s == 1.0 and h.taken_pause_s == 1.0 and h.loss_s == 1.0     # the shrink's, not g's claims


# ---------------------------------------------------------------- node availability
def _history(lengths, half_life=10_000):
    h = IdleHistory(min_stretches=5, half_life=half_life)
    t = 0.0
    for i, length in enumerate(lengths):      # one node at a time: idle for `length`, then taken
        h.update(t, [f"x{i}"])
        t += length
        h.update(t, [])
    return h, t


def test_no_prediction_before_enough_stretches_and_known_windows_still_count():
    h = IdleHistory(min_stretches=20)
    h.update(0.0, ["a", "b"])
    h.update(10.0, ["a"])
    nodes = [Node("a"), Node("c", window_end_s=310.0)]
    h.update(10.0, ["a", "c"])
    stays = h.stays(10.0, nodes, 600.0)
    assert "a" not in stays                          # no prediction: it counts as staying
    assert stays["c"] == Stay(0.5, 1.0)              # taken at 310 s: stays half of the 600 s horizon


def test_young_nodes_are_expected_to_leave_old_ones_to_stay():
    h = IdleHistory(min_stretches=5, half_life=10_000)
    t = 0.0
    for i in range(50):      # "old" idle all along; one other node at a time idle for 100 s, then taken
        h.update(t, ["old", f"x{i}"])
        t += 100.0
        h.update(t, ["old"])
    t += 1e6                                         # "old" now idle far longer than any stretch seen
    h.update(t, ["young", "old"])
    stays = h.stays(t + 50.0, [Node("young"), Node("old")], 600.0)
    assert stays["young"].leave_p > 0.95 and stays["young"].fraction < 0.2
    assert stays["old"].leave_p == 0.0 and stays["old"].fraction == pytest.approx(1.0, abs=1e-9)


def test_a_node_with_long_stretches_is_expected_to_stay_longer():
    h = IdleHistory(min_stretches=5)
    t = 0.0
    for _ in range(12):          # 'fast' is taken after 60 s each time, 'slow' after 900 s
        h.update(t, ["fast", "slow"])
        h.update(t + 60.0, ["slow"])
        h.update(t + 900.0, [])
        t += 1000.0
    h.update(t, ["fast", "slow"])
    stays = h.stays(t + 30.0, [Node("fast"), Node("slow")], 600.0)
    assert stays["slow"].fraction > stays["fast"].fraction + 0.1
    assert stays["slow"].leave_p < stays["fast"].leave_p - 0.4
    assert h.node_scale("slow") > 2.0 > 1.0 > h.node_scale("fast")


def test_stretch_memory_is_bounded_and_counts_are_decayed():
    h, t = _history([10.0] * 200 + [1000.0] * 200, half_life=50)
    h.update(t, ["n"])
    s = h.stays(t + 10.0, [Node("n")], 600.0)["n"]
    assert s.fraction > 0.9          # the recent long stretches outweigh the old short ones
    assert len(h._starts) == len(h.since) == 1


# ---------------------------------------------------------------- the objective
def _job(jid="a", held=(), lo=1, hi=16, owner="", work=0.0, changed=None, submit=0.0):
    return JobState(JobSpec(jid, lo, hi, 0.0, 0.0, "", submit, jid, owner, work), tuple(held),
                    "gpu" if held else None, 0.0, changed)


def test_without_predictions_the_value_is_the_plain_expected_work():
    rate = lambda n: 10.0 * n ** 0.8    # noqa: E731
    opts = dict(expected_values(_job(held=("n0", "n1")), [1, 2, 4], rate, RescaleCost(30.0, 5.0), 1.0,
                                600.0, {}, None))
    assert opts == {0: 0.0, 1: pytest.approx(rate(1) * 595.0), 2: pytest.approx(rate(2) * 600.0),
                    4: pytest.approx(rate(4) * 570.0)}


def test_an_elastic_group_pays_its_grow_for_a_grow_a_start_for_a_start_and_its_preemption_for_a_node_taken():
    """Issue #26: a group that re-forms in place is valued with its own pauses: its grow (not a
    start's restart) when it grows, its preemption pause (not a shrink's) for the chance that a
    node of its set is taken back.  A job that restarts pays the same with the kinds unset."""
    rate = lambda n: 10.0 * n ** 0.8    # noqa: E731
    elastic = RescaleCost(30.0, 5.0, grow_s=0.5, preemption_s=0.2, loss_s=2.0)
    held = _job(held=("n0", "n1"))
    v = dict(expected_values(held, [1, 2, 4], rate, elastic, 1.0, 600.0, {}, None))
    assert v[4] == pytest.approx(rate(4) * 599.5) and v[1] == pytest.approx(rate(1) * 595.0)
    idle = dict(expected_values(_job(), [2], rate, elastic, 1.0, 600.0, {}, None))
    assert idle[2] == pytest.approx(rate(2) * 570.0)            # a start is a restart of every member
    risky = Stay(1.0, 0.5)                                      # stays, but may be taken back (50%)
    stays = {"n0": risky, "n1": STAYING}
    with_kinds = dict(expected_values(held, [2], rate, elastic, 1.0, 600.0, stays, FreeOrder([])))
    restart = dict(expected_values(held, [2], rate, RescaleCost(30.0, 5.0), 1.0, 600.0, stays, FreeOrder([])))
    assert with_kinds[2] == pytest.approx(rate(2) * (600.0 - 0.2 * 0.5))
    assert restart[2] == pytest.approx(rate(2) * (600.0 - 5.0 * 0.5))


def test_a_node_about_to_leave_is_not_worth_a_grow_and_never_a_shrink():
    rate = lambda n: 100.0 * n ** 0.7   # noqa: E731
    cost = RescaleCost(30.0, 10.0)
    gone = Stay(0.05, 1.0)                         # leaves within the first 30 s of the horizon
    stays = {"n0": STAYING, "n1": STAYING, "n2": gone, "f": gone}
    held = _job(held=("n0", "n1", "n2"))
    v = dict(expected_values(held, [2, 3, 4], rate, cost, 1.0, 600.0, stays, FreeOrder([gone])))
    assert v[3] > v[2]          # dropping the leaving node costs the same pause as losing it: keep
    assert v[4] < v[3]          # growing onto another leaving node is not worth its pause
    fresh = dict(expected_values(held, [3, 4], rate, cost, 1.0, 600.0, stays, FreeOrder([STAYING])))
    assert fresh[4] > fresh[3]  # onto a node that stays it is


def test_units_make_a_slow_model_as_worth_a_node_as_a_fast_one():
    cfg = CoreConfig(policy="oracle", objective="speedup", user_weights=(("alice", 2.0),))
    fast, slow = (lambda n: 10_000.0 * n), (lambda n: 40.0 * n)
    assert unit_weight(_job(lo=2), fast, cfg) * fast(4) == pytest.approx(4.0)
    assert unit_weight(_job(lo=2, owner="alice"), slow, cfg) * slow(4) == pytest.approx(8.0)
    prog = CoreConfig(objective="progress")
    assert unit_weight(_job(work=1e6), fast, prog) == pytest.approx(1e-6)
    assert unit_weight(_job(), fast, prog) == pytest.approx(1 / 10_000.0)   # no work known: speedup
    s = Snapshot(0.0, tuple(Node(f"n{i}") for i in range(8)),
                 (_job("fast", hi=8), _job("slow", hi=8)))
    curves = {"fast": curve(lambda n: 10_000.0 * n ** 0.9), "slow": curve(lambda n: 40.0 * n)}
    raw = decide(s, curves, CoreConfig(policy="oracle"))
    fair = decide(s, curves, CoreConfig(policy="oracle", objective="speedup"))
    assert len(raw.allocations["slow"]) == 0 and len(raw.allocations["fast"]) == 8
    assert len(fair.allocations["slow"]) > len(fair.allocations["fast"]) > 0


def test_config_rejects_bad_objective_and_weights():
    assert from_mapping(CoreConfig, {"user_weights": {"bob": 3}}).weight("bob") == 3.0
    for bad in ({"objective": "joy"}, {"user_weights": {"bob": -1}}, {"user_weights": ["bob"]},
                {"user_weights": {"bob": math.nan}}, {"starvation_s": -5}):
        with pytest.raises(ConfigError):
            from_mapping(CoreConfig, bad)


def test_a_job_waiting_starvation_s_gets_min_nodes_before_others_grow():
    hog = _job("hog", held=tuple(f"n{i}" for i in range(6)), hi=8, changed=0.0)
    late = _job("late", lo=2, hi=8, submit=0.0)
    s = Snapshot(1000.0, tuple(Node(f"n{i}") for i in range(8)), (hog, late))
    curves = {"hog": curve(lambda n: 10_000.0 * n), "late": curve(lambda n: 1.0 * n)}
    plain = decide(s, curves, CoreConfig(policy="oracle"))
    assert plain.allocations["late"] == () and len(plain.allocations["hog"]) == 8
    bound = decide(s, curves, CoreConfig(policy="oracle", starvation_s=900))
    assert len(bound.allocations["late"]) == 2 and len(bound.allocations["hog"]) == 6
    late_act = next(a for a in bound.actions if a.job_id == "late")
    assert late_act.code.value == "starving" and "waited 1000s" in late_act.reason
    # not yet due: waits; and a job started less than starvation_s ago is not stopped for others
    early = decide(Snapshot(500.0, s.nodes, (hog, late)), curves, CoreConfig(policy="oracle", starvation_s=900))
    assert early.allocations["late"] == ()
    fed = _job("late", lo=2, hi=8, held=("n6", "n7"), changed=1000.0)
    again = decide(Snapshot(1030.0, s.nodes, (hog, fed)), curves, CoreConfig(policy="oracle", starvation_s=900))
    assert len(again.allocations["late"]) >= 2


# ---------------------------------------------------------------- replay: no look-ahead
def _trace(storm):
    """8 nodes, the same events until t=2940; after, either quiet or every node taken at 2965."""
    from malletrain.replay.traces import NodeTrace
    rng = random.Random(5)
    ev = []
    for t in range(60, 3000, 60):
        ev.append((float(t), rng.randrange(8), rng.random() < 0.5))
    if storm:
        ev += [(2965.0, i, True) for i in range(8)]
    ev.sort(key=lambda e: e[0])
    return NodeTrace([f"n{i}" for i in range(8)], 0.0, 6000.0, np.zeros(8, dtype=bool),
                     np.array([e[0] for e in ev]), np.array([e[1] for e in ev], dtype=np.int32),
                     np.array([e[2] for e in ev], dtype=bool))


def _decisions_before(trace, t_cut, **opts):
    from malletrain.replay import sim as sim_mod
    from malletrain.replay.engine import ReplayOptions, run_replay
    from malletrain.replay.workload import TrueCurve, WorkloadJob
    seen = []
    orig = sim_mod.SimCluster.apply

    def apply(self, actions):
        if self.now < t_cut:
            seen.extend((self.now, a.job_id, a.kind.value, a.to_nodes) for a in actions)
        return orig(self, actions)
    wl = [WorkloadJob(f"j{i}", 10.0 * i, False, 1, 6, 1e9, 30.0, 10.0, "p",
                      TrueCurve((1, 2, 4, 8), (10.0, 19.0, 35.0, 60.0)), 0) for i in range(3)]
    sim_mod.SimCluster.apply = apply
    try:
        run_replay(trace, wl, ReplayOptions(core=CoreConfig(policy="malletrain", stay_min_fragments=3),
                                            interval_s=30.0, noise=0.05, **opts))
    finally:
        sim_mod.SimCluster.apply = orig
    return seen


def test_replay_decisions_do_not_depend_on_the_future():
    a, b = _trace(False), _trace(True)
    assert a.n_events != b.n_events                       # the futures differ
    assert _decisions_before(a, 2960.0) == _decisions_before(b, 2960.0)
    # the negative control: handing nodes their true next busy time is a leak the test sees
    assert _decisions_before(a, 2960.0, window_oracle=True) != _decisions_before(b, 2960.0, window_oracle=True)


def test_planned_lead_reveals_each_window_end_that_long_before_and_no_earlier():
    """``planned_lead_s`` models Slurm's planned starts: an idle node's next busy time is seen from
    ``lead`` seconds before it (at the first decision from then), never earlier; decisions before
    any reveal of the storm are those of the run without it."""
    from malletrain.replay import sim as sim_mod
    lead = 300.0
    trace = _trace(True)
    seen = []           # (decision time, node, window end it was told)
    orig = sim_mod.SimCluster.observe

    def observe(self):
        obs = orig(self)
        seen.extend((self.now, n.name, n.window_end_s) for n in obs.snapshot.nodes)
        return obs
    sim_mod.SimCluster.observe = observe
    try:
        _decisions_before(trace, 0.0, planned_lead_s=lead)
    finally:
        sim_mod.SimCluster.observe = orig
    told = [(t, n, w) for t, n, w in seen if w is not None]
    assert told and all(0 < w - t <= lead for t, _, w in told)
    # every stretch that ended in the storm was told its end within one interval of the lead
    storm = {n for t, n, w in told if w == 2965.0}
    idle_then = {n for t, n, w in seen if 2940.0 <= t < 2965.0}
    assert storm == idle_then and storm
    assert all(min(t for t, m, w in told if m == n and w == 2965.0) <= 2965.0 - lead + 30.0 for n in storm)
    assert not any(w is not None for t, _, w in seen if t < 2965.0 - lead - 60.0 and w == 2965.0)
    a, b = _trace(False), _trace(True)
    assert (_decisions_before(a, 2965.0 - lead, planned_lead_s=lead)
            == _decisions_before(b, 2965.0 - lead, planned_lead_s=lead))


def test_replay_learns_the_workloads_pauses_from_a_guess():
    from malletrain.replay.engine import ReplayOptions, run_replay
    from malletrain.replay.workload import TrueCurve, WorkloadJob
    wl = [WorkloadJob(f"j{i}", 0.0, False, 1, 8, 1e9, 45.0, 8.0, "", TrueCurve((1, 8), (10.0, 70.0)), 0)
          for i in range(2)]
    res = run_replay(_trace(False), wl, ReplayOptions(core=CoreConfig(policy="malletrain"), noise=0.05,
                                                   rescale_guess=(5.0, 60.0)))
    s = res.summary
    assert s.rescale_guess == (5.0, 60.0) and s.rescale_learned >= 2
    assert s.rescale_error_max < 0.2


# ---------------------------------------------------------------- variability and topology
def test_sensitivity_is_learned_from_runs_on_nodes_of_different_speed():
    from malletrain.domain.model import Sample
    from malletrain.jpa.sensitivity import SensitivityLearner
    learner = SensitivityLearner()
    learner.register("cnn", "resnet")
    learner.register("rec", "ncf")
    learner.register("next", "resnet")
    rng = random.Random(4)
    for k in range(60):
        n = rng.choice([2, 4])
        slow = rng.choice([1.0, 1.05, 1.12, 1.18])
        groups = rng.choice([1, 2])
        base = 100.0 * n ** 0.9 * (1 + 0.01 * rng.gauss(0, 1))
        learner.add(Sample("cnn", n, base * slow ** -1.0 * 0.9 ** (groups - 1), float(k), slow, groups))
        learner.add(Sample("rec", n, base * slow ** -0.1, float(k), slow, 1))
    cnn, rec = learner.get("cnn"), learner.get("rec")
    assert abs(cnn.slowdown - 1.0) < 0.2 and abs(cnn.per_group - 0.1) < 0.03
    assert rec.slowdown < 0.3 and rec.per_group == 0.0
    assert learner.get("next") == cnn                 # no data of its own: its profile's
    assert learner.get("unknown") is None
    only_nominal = SensitivityLearner()
    for k in range(20):
        only_nominal.add(Sample("x", 2, 100.0 + k, float(k)))
    assert only_nominal.get("x") is None              # its runs never differed: no estimate


def test_sensitive_jobs_get_the_fast_nodes_and_insensitive_ones_the_slow():
    from malletrain.core.placement import place
    nodes = [Node(f"n{i}", group="g", variability=v) for i, v in enumerate([1.2, 1.0, 1.1, 0.95])]
    jobs = [_job("cnn"), _job("rec")]
    out = place(nodes, jobs, {"cnn": ("gpu", 2), "rec": ("gpu", 2)}, sensitive={"cnn": 1.0, "rec": 0.05})
    assert sorted(out["cnn"]) == ["n1", "n3"] and sorted(out["rec"]) == ["n0", "n2"]
    plain = place(nodes, jobs, {"cnn": ("gpu", 2), "rec": ("gpu", 2)})
    assert plain != out


def test_replay_jobs_run_at_their_slowest_nodes_pace():
    from malletrain.domain.model import Action, ActionKind, ReasonCode
    from malletrain.replay.sim import SimCluster
    sim = SimCluster(["a", "b", "c"], [False] * 3, 0.0,
                     node_info={"a": ("g1", 1.0), "b": ("g1", 1.25), "c": ("g2", 1.0)})
    assert sim.pool["b"] == Node("b", group="g1", variability=1.25)
    spec = JobSpec("j", 1, 3)
    sim.admit(spec, lambda n: 100.0 * n, 1e9, sensitivity=1.0, topology_penalty=0.2)
    sim.apply([Action("j", ActionKind.START, (), ("a", "b"), "", ReasonCode.GAIN)])
    assert sim.jobs["j"].rate == pytest.approx(200.0 / 1.25)
    sim.apply([Action("j", ActionKind.SHRINK, ("a", "b"), ("a",), "", ReasonCode.YIELD)])
    sim.apply([Action("j", ActionKind.GROW, ("a",), ("a", "c"), "", ReasonCode.GAIN)])
    assert sim.jobs["j"].rate == pytest.approx(200.0 * 0.8)         # two groups


def test_node_info_files_are_checked():
    import tempfile

    from malletrain.domain.errors import InputError
    from malletrain.domain.nodes import load_node_info
    with tempfile.TemporaryDirectory() as d:
        path = f"{d}/n.csv"
        head = "node,group,slowdown\n"
        for text, where in (("node,slowdown\n", "line 1"), (head + "n1,g,fast\n", "slowdown"),
                            (head + "n1,g,0\n", "slowdown"), (head + ",g,1\n", "node"),
                            (head + "n1,g,1\nn1,g,1\n", "twice"), (head + "n1,1\n", "fields")):
            with open(path, "w") as fh:
                fh.write(text)
            with pytest.raises(InputError, match=where):
                load_node_info(path)
        with open(path, "w") as fh:
            fh.write("node,group,slowdown\nn1,rack1,1.1\nn2,,0.9\n")
        assert load_node_info(path) == {"n1": ("rack1", 1.1), "n2": ("", 0.9)}


def test_a_job_cannot_claim_an_enormous_speedup():
    cfg = CoreConfig(policy="oracle", objective="speedup")
    liar = _job("liar", lo=1, hi=8)
    honest = _job("honest", lo=1, hi=8)
    s = Snapshot(0.0, tuple(Node(f"n{i}") for i in range(8)), (liar, honest))
    curves = {"liar": Curve({1: CurvePoint(1e-9, 1e-9, 1e-9), 8: CurvePoint(1e9, 1e9, 1e9)}, None, "fit"),
              "honest": curve(lambda n: 100.0 * n ** 0.95)}
    plan = decide(s, curves, cfg)
    assert plan.objective <= 8 * 600.0 + 1e-6          # node-equivalents over the horizon, at most linear
    assert plan.allocations["honest"]                   # its claim counts as linear scaling, no more


def test_starvation_grants_take_turns_over_owners():
    jobs = [_job(f"m{i}", lo=2, owner="mallory", submit=0.0) for i in range(3)] + [_job("a", lo=2, owner="alice",
                                                                                     submit=500.0)]
    s = Snapshot(2000.0, tuple(Node(f"n{i}") for i in range(4)), tuple(jobs))
    curves = {j.job_id: curve(lambda n: 10.0 * n) for j in jobs}
    plan = decide(s, curves, CoreConfig(policy="oracle", starvation_s=900))
    fed = {a.job_id for a in plan.actions if a.code.value == "starving"}
    assert fed == {"m0", "a"}                           # mallory's oldest, then alice's: not mallory's two
