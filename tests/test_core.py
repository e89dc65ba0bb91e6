import pytest

from malletrain.core.cycle import reconcile
from malletrain.core.decide import decide, size_grid
from malletrain.domain.config import CoreConfig, from_mapping
from malletrain.domain.errors import ConfigError, PlanError
from malletrain.domain.model import ActionKind, Curve, CurvePoint, JobSpec, JobState, Node, Plan, Snapshot


def curve(f, counts=range(1, 17), probe=None):
    return Curve({n: CurvePoint(f(n), f(n), f(n)) for n in counts}, probe, "oracle")


def snap(n_nodes, jobs, now=1000.0):
    return Snapshot(now, tuple(Node(f"n{i}") for i in range(n_nodes)), tuple(jobs))


def js(jid, lo=1, hi=8, held=(), up=0.0, down=0.0, paused=0.0, changed=None):
    return JobState(JobSpec(jid, lo, hi, up, down), tuple(held), "gpu" if held else None,
                    paused, changed)


LINEAR = lambda n: 10.0 * n


def test_decide_is_deterministic_and_gives_reasons():
    s = snap(10, [js("a"), js("b", hi=4)])
    curves = {"a": curve(LINEAR), "b": curve(lambda n: 30.0 * n)}
    cfg = CoreConfig(policy="oracle")
    p1, p2 = decide(s, curves, cfg), decide(s, curves, cfg)
    assert p1 == p2
    assert len(p1.allocations["b"]) == 4 and len(p1.allocations["a"]) == 6
    assert all(a.reason for a in p1.actions)
    assert {a.kind for a in p1.actions} == {ActionKind.START}


def test_pause_pins_a_job():
    s = snap(8, [js("a", held=["n0", "n1"], paused=2000.0), js("b")])
    p = decide(s, {"a": curve(LINEAR), "b": curve(LINEAR)}, CoreConfig(policy="oracle"))
    assert p.allocations["a"] == ("n0", "n1")
    assert "rescale in progress" in next(a.reason for a in p.actions if a.job_id == "a")


def test_min_dwell_hysteresis():
    s = snap(8, [js("a", held=["n0"], changed=990.0)])
    cfg = CoreConfig(policy="oracle", min_dwell_s=60)
    assert decide(s, {"a": curve(LINEAR)}, cfg).allocations["a"] == ("n0",)
    cfg0 = CoreConfig(policy="oracle")
    assert len(decide(s, {"a": curve(LINEAR)}, cfg0).allocations["a"]) == 8


def test_rescale_cost_prevents_flapping():
    # Growing from 4 to 5 gains 10 samples/s for 600 s = 6000; the pause costs 700 s x 40.
    s = snap(5, [js("a", held=["n0", "n1", "n2", "n3"], up=700.0)])
    p = decide(s, {"a": curve(LINEAR)}, CoreConfig(policy="oracle"))
    assert len(p.allocations["a"]) == 4 and p.changes() == ()


def test_probing_comes_first_for_the_malletrain_policy():
    s = snap(6, [js("a", hi=16), js("b", hi=16)])
    curves = {"a": curve(LINEAR), "b": Curve({}, probe=1, source="no-data")}
    p = decide(s, curves, CoreConfig(policy="malletrain"))
    assert len(p.allocations["b"]) == 1 and len(p.allocations["a"]) == 5
    assert "probe at 1" in next(a.reason for a in p.actions if a.job_id == "b")


def test_static_is_fifo_at_fixed_size():
    s = snap(10, [js("a", hi=6), js("b", hi=6), js("c", hi=2)])
    p = decide(s, {}, CoreConfig(policy="static"))
    assert len(p.allocations["a"]) == 6
    assert p.allocations["b"] == () and p.allocations["c"] == ()   # strict FIFO


def test_bftrainer_policy_gives_a_feasible_plan():
    s = snap(6, [js("a", hi=4, held=["n0"]), js("b", hi=4)])
    p = decide(s, {"a": curve(LINEAR), "b": curve(lambda n: 5.0 * n)}, CoreConfig(policy="bftrainer"))
    reconcile(s, p)
    assert "n0" in p.allocations["a"]
    assert len(p.allocations["a"]) + len(p.allocations["b"]) <= 6


def test_lost_nodes_are_not_replanned():
    # n9 left the pool (taken by the primary scheduler): it must not appear in the plan.
    s = Snapshot(0.0, tuple(Node(f"n{i}") for i in range(3)), (js("a", held=["n0", "n9"]),))
    p = decide(s, {"a": curve(LINEAR)}, CoreConfig(policy="oracle"))
    assert "n9" not in p.allocations["a"]


def test_size_grid():
    assert size_grid(1, 8) == tuple(range(1, 9))
    g = size_grid(1, 4096, 32)
    assert g[0] == 1 and g[-1] == 4096 and len(g) <= 32 and list(g) == sorted(set(g))


def test_reconcile_rejects_bad_plans():
    s = snap(3, [js("a", hi=2), js("b", hi=2)])
    bad = [
        Plan(0, {"a": ("n0", "n1", "n2"), "b": ()}, ()),   # above max
        Plan(0, {"a": ("n0",), "b": ("n0",)}, ()),          # twice
        Plan(0, {"a": ("zz",), "b": ()}, ()),                # not harvestable
        Plan(0, {"x": ("n0",)}, ()),                         # unknown job
    ]
    for plan in bad:
        with pytest.raises(PlanError):
            reconcile(s, plan)


def test_config_unknown_keys_list_the_valid_ones():
    with pytest.raises(ConfigError) as e:
        from_mapping(CoreConfig, {"horizon_s": 10, "horizn": 5}, "daemon.yaml")
    msg = str(e.value)
    assert "horizn" in msg and "horizon_s" in msg and "daemon.yaml" in msg


@pytest.mark.parametrize("data", [{"policy": "magic"}, {"horizon_s": -1}, {"horizon_s": "x"},
                                  {"max_candidates": 1.5}, {"min_dwell_s": -3}])
def test_config_bad_values(data):
    with pytest.raises(ConfigError):
        from_mapping(CoreConfig, data)


def test_config_good_values():
    cfg = from_mapping(CoreConfig, {"policy": "oracle", "horizon_s": 300, "max_candidates": 8})
    assert cfg.horizon_s == 300.0 and cfg.max_candidates == 8


def test_every_action_carries_a_reason_code_and_detail():
    from malletrain.domain.model import ReasonCode
    nodes = tuple(Node(f"n{i}") for i in range(6))
    jobs = (JobState(JobSpec("a", 1, 4)), JobState(JobSpec("b", 2, 4)), JobState(JobSpec("c", 5, 6)))
    curves = {j.job_id: Curve({n: CurvePoint(10.0 * n, 9.0 * n, 11.0 * n) for n in range(1, 7)})
              for j in jobs}
    plan = decide(Snapshot(0.0, nodes, jobs), curves, CoreConfig(policy="oracle"))
    codes = {a.job_id: a.code for a in plan.actions}
    assert all(isinstance(c, ReasonCode) for c in codes.values())
    assert all(a.reason for a in plan.actions)
    assert codes["a"] is ReasonCode.GAIN and codes["b"] is ReasonCode.GAIN
    assert codes["c"] in (ReasonCode.OUTBID, ReasonCode.TOO_FEW_NODES)
