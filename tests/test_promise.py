"""Promise-aware allocation (#24 step 4): a campaign trial's reported promise re-splits its owner's
nodes among the owner's own jobs, and nothing else.

The core (decide), the daemon's progress reader (bounded, untrusted records, persisted offsets), the
runtime's reporter (η^k after k rungs survived) and the replay's metrics source.
"""
import json
import math
import os

import pytest

from malletrain.core.decide import decide
from malletrain.domain.config import CoreConfig
from malletrain.domain.model import Curve, CurvePoint, JobSpec, JobState, Node, Outlook, ReasonCode, Snapshot


def curve(f, counts=range(1, 17)):
    return Curve({n: CurvePoint(f(n), f(n), f(n)) for n in counts}, None, "oracle")


def job(jid, owner, held=(), hi=4):
    return JobState(JobSpec(jid, 1, hi, owner=owner), tuple(held), "gpu" if held else None, 0.0, None)


def sizes(plan):
    return {j: len(n) for j, n in plan.allocations.items()}


def by_owner(plan, jobs):
    owner = {j.job_id: j.spec.owner for j in jobs}
    out: dict[str, int] = {}
    for j, n in sizes(plan).items():
        out[owner[j]] = out.get(owner[j], 0) + n
    return out


CONCAVE = lambda n: 100.0 * n / (1 + 0.2 * (n - 1))      # noqa: E731


def _case():
    # alice's three trials and bob's job on 3 nodes, one node each: the samples objective runs
    # a1 and a2 of alice's (the fastest); her study says a3 survived 3 rungs
    rates = {"a1": 120.0, "a2": 100.0, "a3": 95.0, "b": 110.0}
    jobs = [job(j, "bob" if j == "b" else "alice", hi=1) for j in rates]
    curves = {j: curve(lambda n, r=r: r * n) for j, r in rates.items()}
    snap = Snapshot(1000.0, tuple(Node(f"n{i}") for i in range(3)), tuple(jobs))
    return jobs, curves, snap


def test_promise_reorders_only_its_owners_jobs():
    jobs, curves, snap = _case()
    cfg = CoreConfig(policy="oracle")
    plain = decide(snap, curves, cfg)
    told = decide(snap, curves, cfg, Outlook(promise={"a3": 27.0}))
    assert sizes(plain) == {"a1": 1, "a2": 1, "a3": 0, "b": 1}
    assert sizes(told) == {"a1": 1, "a2": 0, "a3": 1, "b": 1}   # the trial that survived 3 rungs runs
    assert by_owner(told, jobs) == by_owner(plain, jobs)         # alice's total and bob's share unchanged
    reasons = {a.job_id: a for a in told.actions}
    assert reasons["a3"].code is ReasonCode.PROMISE and "promising" in reasons["a3"].reason
    assert reasons["a2"].code is ReasonCode.PROMISE
    assert reasons["b"].code is not ReasonCode.PROMISE


def test_the_owners_most_promising_trial_grows_by_its_promise():
    """Alice's trial a1 is at her highest rung: each size of it is worth its promise's share more
    (w = 81 / 41 times its node-equivalents), so it grows past the size its curve alone pays
    for, on nodes her other trial gives up; her total is what the allocation gave her."""
    jobs = [job("a1", "alice", hi=4), job("a2", "alice", hi=4)]
    curves = {"a1": curve(CONCAVE), "a2": curve(CONCAVE)}
    snap = Snapshot(1000.0, tuple(Node(f"n{i}") for i in range(4)), tuple(jobs))
    cfg = CoreConfig(policy="oracle")
    plain = decide(snap, curves, cfg)
    told = decide(snap, curves, cfg, Outlook(promise={"a1": 81.0}))
    assert sizes(plain) == {"a1": 2, "a2": 2}
    assert sizes(told) == {"a1": 3, "a2": 1}
    assert by_owner(told, jobs) == by_owner(plain, jobs)
    reasons = {a.job_id: a for a in told.actions}
    assert reasons["a1"].code is ReasonCode.PROMISE and reasons["a2"].code is ReasonCode.PROMISE


@pytest.mark.parametrize("top", ["cannot grow", "in its start pause"])
def test_a_promise_below_the_owners_top_buys_a_place_not_a_size(top):
    """a1 is above the mean of Alice's six trials but below a0, her top one, which cannot grow
    (one node at most) or is held out of the re-split by its start pause: a1 keeps the size its
    curve pays for all the same.  Weighting every promising trial's sizes (tried first) grew the
    trials of the middle rungs beyond their efficient size and slowed the exploration at the
    first rungs (benchmarks/campaign.md)."""
    ids = ("a0", "a1", "a2", "a3", "a4", "a5")
    a0 = (job("a0", "alice", hi=1) if top == "cannot grow"
          else JobState(JobSpec("a0", 1, 4, owner="alice"), ("n0",), "gpu", 1030.0, 1000.0))
    jobs = [a0] + [job(j, "alice", hi=4) for j in ids[1:]]
    curves = {j: curve(CONCAVE) for j in ids}
    snap = Snapshot(1000.0, tuple(Node(f"n{i}") for i in range(10)), tuple(jobs))
    cfg = CoreConfig(policy="oracle")
    plain = decide(snap, curves, cfg)
    told = decide(snap, curves, cfg, Outlook(promise={"a0": 81.0, "a1": 27.0}))
    assert sizes(plain)["a0"] == 1 and sizes(plain)["a1"] == 2
    assert sizes(told) == sizes(plain)


def test_trials_tied_at_the_top_grow_alike():
    """Two trials at Alice's highest rung are both her most promising: each grows by the promise,
    and her trial at the first rung gives up the nodes."""
    jobs = [job("a1", "alice", hi=4), job("a2", "alice", hi=4), job("a3", "alice", hi=4)]
    curves = {j: curve(CONCAVE) for j in ("a1", "a2", "a3")}
    snap = Snapshot(1000.0, tuple(Node(f"n{i}") for i in range(7)), tuple(jobs))
    cfg = CoreConfig(policy="oracle")
    assert sizes(decide(snap, curves, cfg)) == {"a1": 2, "a2": 2, "a3": 3}
    told = decide(snap, curves, cfg, Outlook(promise={"a1": 9.0, "a2": 9.0}))
    assert sizes(told) == {"a1": 3, "a2": 3, "a3": 1}


def test_a_slow_trial_buys_its_place_with_its_promise_not_its_sample_rate():
    """Alice's trial a3 trains a heavy network at a tenth of the others' samples/s and survived
    two rungs: its promise gives it a place before her light trials.  (Weighted by its own rate,
    as before, the promise bought it nothing: the promising heavy cells of the NAS replay waited
    behind light ones.)"""
    rates = {"a1": 1000.0, "a2": 900.0, "a3": 100.0, "b": 950.0}
    jobs = [job(j, "bob" if j == "b" else "alice", hi=1) for j in rates]
    curves = {j: curve(lambda n, r=r: r * n) for j, r in rates.items()}
    snap = Snapshot(1000.0, tuple(Node(f"n{i}") for i in range(3)), tuple(jobs))
    cfg = CoreConfig(policy="oracle")
    plain = decide(snap, curves, cfg)
    told = decide(snap, curves, cfg, Outlook(promise={"a3": 9.0}))
    assert sizes(plain) == {"a1": 1, "a2": 1, "a3": 0, "b": 1}
    assert sizes(told) == {"a1": 1, "a2": 0, "a3": 1, "b": 1}
    assert by_owner(told, jobs) == by_owner(plain, jobs)


def test_an_owners_trials_are_compared_in_node_equivalents_not_samples():
    """Alice's a1 is a light network (1,000 samples/s on a node, scaling poorly), a2 a heavy one
    (100 samples/s, scaling well), a3 survived two rungs.  By samples/s a1 would take every node
    a3 leaves; in node-equivalents (each trial's rate over its rate on one node) a2 gets most of
    them: its samples are not worth less for being fewer."""
    rates = {"a1": lambda n: 1000.0 * n ** 0.3, "a2": lambda n: 100.0 * n ** 0.9, "a3": lambda n: 100.0 * n}
    jobs = [job("a1", "alice"), job("a2", "alice"), job("a3", "alice", hi=1)]
    curves = {j: curve(f) for j, f in rates.items()}
    snap = Snapshot(1000.0, tuple(Node(f"n{i}") for i in range(5)), tuple(jobs))
    cfg = CoreConfig(policy="oracle")
    told = decide(snap, curves, cfg, Outlook(promise={"a3": 9.0}))
    assert sizes(told) == {"a1": 1, "a2": 3, "a3": 1}
    reasons = {a.job_id: a for a in told.actions}
    assert reasons["a2"].code is ReasonCode.PROMISE and "node-equivalents" in reasons["a2"].reason
    # the same jobs under the speedup objective: the re-split gives what the allocation gave
    unit = CoreConfig(policy="oracle", objective="speedup")
    assert sizes(decide(snap, curves, unit, Outlook(promise={"a3": 9.0}))) == sizes(told)


def test_a_job_without_a_rate_on_its_smallest_size_keeps_its_owners_nodes_busy():
    """a1's curve gives nothing on one node (a fit can): in node-equivalents every size of it is
    worth 0, and a re-split would leave the nodes the allocation gave it idle.  The allocation
    stands instead."""
    jobs = [job("a1", "alice"), job("a2", "alice", hi=1), job("b", "bob", hi=1)]
    curves = {"a1": curve(lambda n: 0.0 if n == 1 else 100.0 * n), "a2": curve(lambda n: 50.0 * n),
              "b": curve(lambda n: 10.0 * n)}
    snap = Snapshot(1000.0, tuple(Node(f"n{i}") for i in range(5)), tuple(jobs))
    cfg = CoreConfig(policy="oracle")
    plain = decide(snap, curves, cfg)
    told = decide(snap, curves, cfg, Outlook(promise={"a2": 9.0}))
    assert sizes(plain) == {"a1": 4, "a2": 1, "b": 0}
    assert sizes(told) == sizes(plain)


def test_a_huge_promise_cannot_take_another_users_nodes():
    """Mallory claims the largest promise the reader passes for one job and the smallest for the
    other: her total is what it was, Alice's job keeps every node it had."""
    jobs = [job("m1", "mallory", hi=8), job("m2", "mallory", hi=8), job("m3", "mallory", hi=1),
            job("a", "alice", hi=8)]
    curves = {"m1": curve(CONCAVE), "m2": curve(CONCAVE), "m3": curve(CONCAVE), "a": curve(CONCAVE)}
    snap = Snapshot(1000.0, tuple(Node(f"n{i}") for i in range(9)), tuple(jobs))
    cfg = CoreConfig(policy="oracle")
    plain = decide(snap, curves, cfg)
    for claim in ({"m1": 1e3, "m2": 1e-3}, {"m3": 1e3}, {"m1": math.inf, "m2": -5.0},
                  {"m1": math.nan, "m2": 1e300}):
        told = decide(snap, curves, cfg, Outlook(promise=claim))
        assert sizes(told)["a"] == sizes(plain)["a"]
        assert by_owner(told, jobs) == by_owner(plain, jobs)


def _power(r, e):
    return lambda n: r * n ** e


def _random_case(seed):
    """Alice's three jobs and Bob's two on 6-14 nodes of mixed predicted stays, each holding
    0-3 nodes, in random order, under either forecast policy; Alice's study rates two of hers."""
    import random

    from malletrain.domain.model import Stay
    rng = random.Random(seed)
    nodes = tuple(Node(f"n{i:02d}") for i in range(rng.randint(6, 14)))
    stays = {n.name: Stay(rng.choice([0.2, 0.5, 0.9, 1.0]), rng.choice([0.0, 0.3, 0.7])) for n in nodes}
    names = [n.name for n in nodes]
    rng.shuffle(names)
    jobs, k = [], 0
    for jid, owner in (("a1", "alice"), ("a2", "alice"), ("a3", "alice"), ("b1", "bob"), ("b2", "bob")):
        h = rng.randint(0, 3)
        jobs.append(JobState(JobSpec(jid, 1, rng.randint(1, 6), owner=owner), tuple(names[k:k + h]),
                             "gpu" if h else None, 0.0, None))
        k += h
    rng.shuffle(jobs)
    curves = {j.job_id: curve(_power(rng.uniform(50, 150), rng.uniform(0.5, 1.0))) for j in jobs}
    cfg = CoreConfig(policy=rng.choice(["oracle", "malletrain"]))
    promise = {"a1": rng.choice([1.0, 3.0, 9.0, 27.0]), "a2": rng.choice([1.0, 3.0, 9.0])}
    return Snapshot(1000.0, nodes, tuple(jobs)), curves, cfg, stays, promise


def test_a_promise_moves_no_other_users_job_off_the_nodes_it_would_get():
    """Whatever Alice's trials report, each of Bob's jobs gets as many nodes as without it, and
    every one of them it would have had (its own, and those from the free pool), except nodes
    that Alice's jobs hold and keep (without the promise she would have released them to him):
    those he gets from the free nodes instead.  And no job of Alice's leaves a node it holds
    while it keeps that many.  (Placed in one pass, a promising grower of Alice's ranked before
    Bob's grower took free nodes he would have had: 13 of these 400 cases.)"""
    resplit = 0
    for seed in range(400):
        snap, curves, cfg, stays, promise = _random_case(seed)
        plain = decide(snap, curves, cfg, Outlook(stays=stays))
        told = decide(snap, curves, cfg, Outlook(stays=stays, promise=promise))
        held = {j.job_id: set(j.nodes) for j in snap.jobs}
        alices = held["a1"] | held["a2"] | held["a3"]
        for b in ("b1", "b2"):
            assert len(told.allocations[b]) == len(plain.allocations[b]), (seed, b)
            assert set(plain.allocations[b]) - alices <= set(told.allocations[b]), (seed, b)
        for a in ("a1", "a2", "a3"):
            now = set(told.allocations[a])
            assert len(held[a] & now) == min(len(held[a]), len(now)), (seed, a)
        placed = [n for nodes in told.allocations.values() for n in nodes]
        assert len(placed) == len(set(placed)) and set(placed) <= {n.name for n in snap.nodes}, seed
        resplit += sizes(told) != sizes(plain)
    assert resplit > 60          # Alice's nodes were re-split in many of these cases


def _typed_case(seed):
    """Two node types; Alice, Bob and Carol with 1-3 jobs each, holding nodes of one type and,
    as the Slurm backend reports them, no node type of their own; some asking for a probe."""
    import random

    from malletrain.domain.model import Stay
    rng = random.Random(seed)
    nodes = tuple(Node(f"n{i:02d}", rng.choice(["a100", "h100"])) for i in range(rng.randint(6, 16)))
    stays = {n.name: Stay(rng.choice([0.2, 0.5, 0.9, 1.0]), rng.choice([0.0, 0.3, 0.7])) for n in nodes}
    free = {t: [n.name for n in nodes if n.node_type == t] for t in ("a100", "h100")}
    jobs, curves = [], {}
    for i, owner in enumerate(o for o in ("alice", "bob", "carol") for _ in range(rng.randint(1, 3))):
        pool = free[rng.choice(["a100", "h100"])]
        held = tuple(pool.pop() for _ in range(min(rng.choice([0, 1, 2, 3]), len(pool))))
        jobs.append(JobState(JobSpec(f"{owner[0]}{i}", 1, rng.randint(1, 6), owner=owner), held, None, 0.0, None))
        f = _power(rng.uniform(50, 150), rng.uniform(0.3, 1.0))
        probe = rng.choice([None, None, 2, 4])
        curves[f"{owner[0]}{i}"] = Curve({n: CurvePoint(f(n), f(n), f(n)) for n in range(1, 17)}, probe, "oracle",
                                         (probe,) if probe else (), ())
    rng.shuffle(jobs)
    cfg = CoreConfig(policy=rng.choice(["oracle", "malletrain", "greedy"]))
    promise = {j.job_id: rng.choice([1e-3, 1.0, 9.0, 1e3]) for j in jobs if j.spec.owner != "bob"}
    return Snapshot(1000.0, nodes, tuple(jobs)), curves, cfg, stays, promise


def test_several_node_types_untyped_jobs_and_two_owners_resplitting():
    """On a pool of two node types, with running jobs that carry no node type (as the Slurm backend
    reports them: the core reads it off their nodes), no job gets nodes of two types and a plan is
    always made (a probe or a static size read such a job as "any type" and gave it the other
    type's nodes, or more than were free: decide raised).  When Alice and Carol both re-split,
    Bob, who does not, still gets his count and every node he would have had with no promise at
    all, but those Alice's or Carol's jobs hold and keep.  Seeds 1173, 2101 and 2684: a re-split
    that only swaps two starting jobs' node types (the same counts) must be placed apart too."""
    resplit = 0
    for seed in (*range(300), 1173, 2101, 2684):
        snap, curves, cfg, stays, promise = _typed_case(seed)
        kind = {n.name: n.node_type for n in snap.nodes}
        plain = decide(snap, curves, cfg, Outlook(stays=stays))
        told = decide(snap, curves, cfg, Outlook(stays=stays, promise=promise))
        theirs = {n for j in snap.jobs if j.spec.owner != "bob" for n in j.nodes}
        for plan in (plain, told):
            placed = [n for nodes in plan.allocations.values() for n in nodes]
            assert len(placed) == len(set(placed)), seed
            assert all(len({kind[n] for n in nodes}) <= 1 for nodes in plan.allocations.values()), seed
        for j in snap.jobs:
            if j.spec.owner == "bob":
                assert len(told.allocations[j.job_id]) == len(plain.allocations[j.job_id]), seed
                assert set(plain.allocations[j.job_id]) - theirs <= set(told.allocations[j.job_id]), seed
        resplit += sizes(told) != sizes(plain)
    assert resplit > 30


def test_equal_promises_or_promise_off_leave_the_plan_as_it_was():
    jobs, curves, snap = _case()
    cfg = CoreConfig(policy="oracle")
    plain = decide(snap, curves, cfg)
    assert decide(snap, curves, cfg, Outlook(promise={"a1": 9.0, "a2": 9.0})) == plain
    assert decide(snap, curves, CoreConfig(policy="oracle", promise=False), Outlook(promise={"a2": 27.0})) == plain


def test_a_job_alone_or_without_a_promise_counts_as_one():
    jobs, curves, snap = _case()
    cfg = CoreConfig(policy="oracle")
    plain = decide(snap, curves, cfg)
    assert decide(snap, curves, cfg, Outlook(promise={"b": 1e3})) == plain      # bob's only job
    assert decide(snap, curves, cfg, Outlook(promise={"a1": 1.0})) == plain     # a2 reports none: 1 too


# ---------------------------------------------------------------------------- the daemon reads it

def _tail_read(tmp_path, lines):
    from malletrain.daemon.progress import ProgressTail
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" if not isinstance(x, str) else x + "\n" for x in lines))
    tail = ProgressTail()
    tail.poll("7", str(path))
    return tail, str(path)


def _metric(promise, t=1.0):
    return {"t": t, "job": "7", "step": 10, "samples": 640, "event": "metric", "value": 0.5, "promise": promise}


def test_the_reader_keeps_the_last_promise_in_range_and_persists_it(tmp_path):
    from malletrain.daemon.progress import ProgressTail
    tail, path = _tail_read(tmp_path, [_metric(3.0), _metric(9.0, 2.0), _metric(1e9, 3.0), _metric("27", 4.0),
                                       _metric(True, 5.0), _metric(float("nan"), 6.0),
                                       {"t": 7.0, "event": "progress", "samples": 700, "nodes": 1, "promise": 81}])
    assert tail.files[path].promise == 9.0          # out of range, not a number, or not a metric: not read
    again = ProgressTail()
    again.load(json.loads(json.dumps(tail.dump())))
    assert again.files[path].promise == 9.0
    old = tail.dump()
    old[path] = old[path][:6]                        # a store written before promises were kept
    again = ProgressTail()
    again.load(old)
    assert again.files[path].promise is None


def test_a_replaced_file_forgets_the_promise(tmp_path):
    tail, path = _tail_read(tmp_path, [_metric(27.0)])
    assert tail.files[path].promise == 27.0
    os.unlink(path)
    with open(path, "w") as fh:
        fh.write(json.dumps({"t": 9.0, "event": "start", "samples": 0}) + "\n")
    tail.poll("7", path)
    assert tail.files[path].promise is None


def test_the_progress_source_hands_promises_of_the_jobs_it_reads(tmp_path):
    from malletrain.core.backend import JobFacts, Observation
    from malletrain.daemon.progress import ProgressSource, ProgressTail
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps(_metric(9.0)) + "\n")
    src = ProgressSource(ProgressTail(roots=(str(tmp_path),)))
    facts = JobFacts("p", user="me", progress_path=str(path), uid=os.getuid(), state="RUNNING")
    obs = Observation(Snapshot(10.0, (), (job("7", "me"),)), facts={"7": facts})
    src.poll(obs)
    assert src.promises() == {"7": 9.0}
    src.poll(Observation(Snapshot(20.0, (), ()), finished=("7",)))
    assert src.promises() == {}


# ------------------------------------------------------------------------- the runtime writes it

@pytest.mark.parametrize("pruner,epochs,want", [("asha", 1, 1.0), ("asha", 2, 3.0), ("asha", 5, 3.0),
                                                ("asha", 6, 9.0), ("asha", 54, 81.0), ("hyperband", 18, 27.0),
                                                ("median", 54, None), ("none", 54, None)])
def test_a_trial_reports_eta_to_the_rungs_it_survived(tmp_path, pruner, epochs, want):
    from malletrain.campaign import slots
    from malletrain.campaign.spec import load_spec
    from malletrain.campaign.trial import Reporter
    spec_file = tmp_path / "s.yaml"
    spec_file.write_text(f"""name: p
command: [python, train.py]
space: {{lr: [0.1, 0.2]}}
sampler: random
trials: 4
pruner: {{kind: {pruner}, min_resource: 2, reduction_factor: 3}}
step_unit: epochs
dir: {tmp_path / 'c'}
""" if pruner != "none" else f"""name: p
command: [python, train.py]
space: {{lr: [0.1, 0.2]}}
sampler: random
trials: 4
step_unit: epochs
dir: {tmp_path / 'c'}
""")
    spec = load_spec(str(spec_file))
    os.makedirs(spec.dir)
    slots.freeze(spec)
    rep = Reporter(spec.dir, 0)
    assert rep.promise(steps=0, samples=0, epochs=epochs) == want
