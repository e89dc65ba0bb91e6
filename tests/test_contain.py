"""Containment (SECURITY.md, "Containment"; ``malletrain.core.contain``): a bug that one owner's jobs
trigger in the decision, the curves or the forecasts sets that owner's jobs aside (kept as they are)
and the others are decided; the daemon never stops over it and says what it contained.

The bugs are injected where a job's own data reaches the real code (``decide``'s pause lookup, the
JPA's curve, the availability model), so the real decision runs around them.
"""
import pytest

import malletrain.core.decide as decide_mod
from malletrain.core.backend import Observation
from malletrain.core.contain import decide_contained
from malletrain.core.curves import CurveSource
from malletrain.core.cycle import CycleMemo, reconcile, run_cycle
from malletrain.core.decide import decide
from malletrain.core.forecast import ForecastSource
from malletrain.domain.config import CoreConfig
from malletrain.domain.model import (
    ActionKind,
    Curve,
    CurvePoint,
    JobSpec,
    JobState,
    Node,
    ReasonCode,
    Snapshot,
)

CFG = CoreConfig(policy="oracle")


def curve(rate=100.0, counts=range(1, 9)):
    return Curve({n: CurvePoint(rate * n, rate * n, rate * n) for n in counts}, None, "oracle")


def job(jid, owner, held=(), lo=1, hi=4):
    return JobState(JobSpec(jid, lo, hi, owner=owner), tuple(held), "gpu" if held else None, 0.0, None)


def nodes(n):
    return tuple(Node(f"n{i}") for i in range(n))


def _raising_for(monkeypatch, bad):
    """``decide`` raises as it looks at any job that ``bad(job)`` picks (its first step, whatever
    the policy: as a bug that job's data triggers)."""
    real = decide_mod._pinned_reason

    def pinned_reason(j, *a, **k):
        if bad(j):
            raise ValueError(f"injected bug for job {j.job_id}")
        return real(j, *a, **k)
    monkeypatch.setattr(decide_mod, "_pinned_reason", pinned_reason)


def _case():
    # mallory holds n0-n1 and waits with a second job; alice holds n2 and waits with another; 8 nodes
    jobs = (job("m1", "mallory", ("n0", "n1")), job("a1", "alice", ("n2",)), job("m2", "mallory"),
            job("a2", "alice"))
    return Snapshot(100.0, nodes(8), jobs), {j.job_id: curve() for j in jobs}


def test_without_an_error_the_contained_decision_is_decide_itself():
    snap, curves = _case()
    got = decide_contained(snap, curves, CFG)
    assert got.plan == decide(snap, curves, CFG)
    assert got.error is None and not got.set_aside and not got.held
    standing = decide(snap, curves, CFG)
    assert decide_contained(snap, curves, CFG, standing=standing).plan == decide(snap, curves, CFG, standing=standing)


def test_one_owners_bug_sets_aside_only_that_owners_jobs(monkeypatch):
    snap, curves = _case()
    _raising_for(monkeypatch, lambda j: j.spec.owner == "mallory")
    with pytest.raises(ValueError):
        decide(snap, curves, CFG)               # uncontained, as replay runs it: the bug fails the run
    got = decide_contained(snap, curves, CFG)
    assert isinstance(got.error, ValueError) and not got.held
    assert set(got.set_aside) == {"m1", "m2"}
    acts = {a.job_id: a for a in got.plan.actions}
    assert [a.job_id for a in got.plan.actions] == ["m1", "a1", "m2", "a2"]    # the snapshot's order
    # mallory's jobs keep what they hold and get nothing more
    assert got.plan.allocations["m1"] == ("n0", "n1") and acts["m1"].kind is ActionKind.KEEP
    assert got.plan.allocations["m2"] == () and acts["m2"].kind is ActionKind.WAIT
    assert {acts["m1"].code, acts["m2"].code} == {ReasonCode.SET_ASIDE}
    assert "injected bug" in acts["m1"].reason and "set aside" in acts["m1"].reason
    # alice's are decided as decide decides them on the pool without mallory's jobs and nodes
    alone = decide(Snapshot(100.0, tuple(n for n in snap.nodes if n.name not in ("n0", "n1")),
                            (snap.jobs[1], snap.jobs[3])), curves, CFG)
    assert {j: got.plan.allocations[j] for j in ("a1", "a2")} == dict(alone.allocations)
    assert sum(len(got.plan.allocations[j]) for j in ("a1", "a2")) == 6     # alice is served: all 6 free nodes
    assert not set(got.plan.allocations["a1"] + got.plan.allocations["a2"]) & {"n0", "n1"}
    assert any("set aside 2 job(s) of 1 owner(s)" in n for n in got.plan.notes)
    reconcile(snap, got.plan)                   # a plan the cycle applies


def test_a_bug_every_owner_triggers_leaves_every_job_as_it_is(monkeypatch):
    snap, curves = _case()
    _raising_for(monkeypatch, lambda j: True)
    got = decide_contained(snap, curves, CFG)
    assert got.held and set(got.set_aside) == {"m1", "a1", "m2", "a2"}
    assert got.plan.changes() == ()
    assert got.plan.allocations == {"m1": ("n0", "n1"), "a1": ("n2",), "m2": (), "a2": ()}
    assert "for every owner's jobs" in got.set_aside["a1"]


def test_a_bug_only_two_owners_trigger_together_leaves_every_job_as_it_is(monkeypatch):
    snap, curves = _case()
    real = decide_mod._problem

    def problem(jobs, *a, **k):
        if len({j.spec.owner for j in jobs}) > 1:
            raise RuntimeError("injected: only together")
        return real(jobs, *a, **k)
    monkeypatch.setattr(decide_mod, "_problem", problem)
    got = decide_contained(snap, curves, CFG)
    assert got.held and got.plan.changes() == ()
    assert "no one owner's jobs alone did" in got.set_aside["m1"]


def test_a_set_aside_job_left_below_min_nodes_stops_and_the_plan_passes_reconcile(monkeypatch):
    # mallory's job held n0-n2 with min_nodes 3; n2 left the pool (a primary job took it)
    jobs = (job("m1", "mallory", ("n0", "n1", "n2"), lo=3), job("m2", "mallory", ("n4", "n5"), lo=1),
            job("a1", "alice"))
    pool = tuple(n for n in nodes(6) if n.name != "n2")
    snap = Snapshot(50.0, pool, jobs)
    curves = {j.job_id: curve() for j in jobs}
    _raising_for(monkeypatch, lambda j: j.spec.owner == "mallory")
    got = decide_contained(snap, curves, CFG)
    acts = {a.job_id: a for a in got.plan.actions}
    assert acts["m1"].kind is ActionKind.STOP and got.plan.allocations["m1"] == ()
    assert acts["m2"].kind is ActionKind.KEEP and got.plan.allocations["m2"] == ("n4", "n5")
    # alice gets the one node no set-aside job held (m1's go back to the pool once it stopped)
    assert got.plan.allocations["a1"] == ("n3",)
    reconcile(snap, got.plan)


def test_a_job_whose_curve_raises_is_set_aside_and_named(monkeypatch):
    cfg = CoreConfig(policy="malletrain")
    src = CurveSource(cfg)
    jobs = (job("7", "mallory", ("n0",)), job("8", "alice"))
    snap = Snapshot(10.0, nodes(4), jobs)
    real = src.advisor.curve

    def learned(job_id, *a, **k):
        if job_id == "7":
            raise ZeroDivisionError("injected: a fit on her samples")
        return real(job_id, *a, **k)
    monkeypatch.setattr(src.advisor, "curve", learned)
    with pytest.raises(ZeroDivisionError):
        src.curves(snap)                              # uncontained: raised, as before
    failed: dict = {}
    got = src.curves(snap, failed)
    assert set(got) == {"8"} and failed == {"7": "ZeroDivisionError: injected: a fit on her samples"}
    plan = decide_contained(snap, got, cfg, broken=failed).plan
    acts = {a.job_id: a for a in plan.actions}
    assert acts["7"].code is ReasonCode.SET_ASIDE and plan.allocations["7"] == ("n0",)
    assert "its curve could not be computed" in acts["7"].reason
    assert acts["8"].code is not ReasonCode.SET_ASIDE and "n0" not in plan.allocations["8"]


class _Backend:
    def __init__(self, snap):
        self.snap, self.applied, self.generation = snap, [], 1

    def observe(self):
        return Observation(self.snap, generation=self.generation)

    def apply(self, actions):
        self.applied.append(tuple(actions))


class _Metrics:
    def poll(self, obs):
        return ()

    def pauses(self):
        return ()

    def promises(self):
        return {}


def test_a_cycle_whose_forecasts_raise_decides_without_them(monkeypatch):
    cfg = CoreConfig(policy="oracle")
    snap, _ = _case()
    truths = {j.job_id: (lambda n: 100.0 * n) for j in snap.jobs}
    forecast = ForecastSource(cfg)

    def broken(*a, **k):
        raise IndexError("injected: the availability model")
    monkeypatch.setattr(forecast.history, "observe", broken)
    with pytest.raises(IndexError):              # replay: uncontained
        run_cycle(_Backend(snap), _Metrics(), CurveSource(cfg, truths), cfg, CycleMemo(), forecast)
    backend, memo = _Backend(snap), CycleMemo()
    res = run_cycle(backend, _Metrics(), CurveSource(cfg, truths), cfg, memo, forecast, contain=True)
    assert res.errors == ("forecasts: IndexError: injected: the availability model",)
    assert res.plan == decide(snap, CurveSource(cfg, truths).curves(snap), cfg)     # no outlook
    assert memo.plan is None                      # decided afresh (and reported) next cycle
    again = run_cycle(backend, _Metrics(), CurveSource(cfg, truths), cfg, memo, forecast, contain=True)
    assert not again.reused and again.errors == res.errors


def test_a_contained_cycle_without_errors_is_the_plain_cycle():
    cfg = CoreConfig(policy="oracle")
    snap, _ = _case()
    truths = {j.job_id: (lambda n: 100.0 * n) for j in snap.jobs}
    plain = run_cycle(_Backend(snap), _Metrics(), CurveSource(cfg, truths), cfg, CycleMemo(), ForecastSource(cfg))
    contained = run_cycle(_Backend(snap), _Metrics(), CurveSource(cfg, truths), cfg, CycleMemo(),
                          ForecastSource(cfg), contain=True)
    assert contained.plan == plain.plan and contained.actions == plain.actions
    assert contained.errors == () and not contained.set_aside


def test_the_daemon_serves_alice_while_mallorys_jobs_make_decide_raise(tmp_path, monkeypatch, caplog):
    """End to end through the daemon's cycle on the fake Slurm: the bug's owner is set aside, the
    other user's job starts, the daemon says what it contained (status, metrics, log), and
    ``cycle_once`` never raises; an error outside the decision is contained too."""
    from helpers import FakeSlurm, held_job
    from test_daemon_units import _daemon

    import malletrain.core.cycle as cycle_mod
    from malletrain.daemon.status import read_status
    fake = FakeSlurm()
    held_job(fake, "7", uid=1001, user="mallory")
    held_job(fake, "8", uid=1000, user="alice")
    _raising_for(monkeypatch, lambda j: j.spec.owner == "1001")       # an owner is a uid
    d, _ = _daemon(tmp_path, fake)
    said: list = []
    monkeypatch.setattr(d.notifier, "status", said.append)
    try:
        d.cycle_once()
        released = [c[2] for c in fake.calls if c[:2] == ["scontrol", "release"]]
        assert released == ["8"]                          # alice's job starts; mallory's waits
        st = read_status(str(tmp_path / "state" / "status.json"))
        assert st.errors and st.errors[0].startswith("decide: ValueError: injected bug for job 7")
        assert st.job("7").reason_code == "set-aside" and st.job("8").reason_code != "set-aside"
        assert d.metrics.cycle_errors.labels(kind="decide")._value.get() == 1
        assert "1 error(s) contained in the last cycle" in said[-1]
        logged = [r for r in caplog.records if "decide raised" in r.getMessage()]
        assert logged and logged[0].exc_info is not None       # the traceback, for whoever fixes the bug

        def broken(*a, **k):
            raise KeyError("injected: outside the decision")
        monkeypatch.setattr(cycle_mod, "placed", broken)
        assert d.cycle_once() is None                      # contained: no plan, nothing applied
        st = read_status(str(tmp_path / "state" / "status.json"))
        assert st.errors == ("cycle: KeyError: 'injected: outside the decision'",)
        assert d.metrics.cycle_errors.labels(kind="internal")._value.get() == 1
        monkeypatch.undo()
        d.cycle_once()                                     # the bug gone: no error left in the status
        assert read_status(str(tmp_path / "state" / "status.json")).errors == ()
    finally:
        d.store.close()
