import csv
import json
import os

import pytest
from helpers import T0, job, write_events, write_workload

from malletrain.cli.main import main
from malletrain.replay.engine import idle_node_seconds
from malletrain.replay.traces import load_trace


def replay(tmp_path, rows, jobs, *extra, name="out"):
    tr, wl, out = tmp_path / "t.csv", tmp_path / "w.yaml", tmp_path / name
    write_events(tr, rows)
    write_workload(wl, jobs)
    code = main(["replay", "--trace", str(tr), "--workload", str(wl), "--out", str(out),
                 "--quiet", *extra])
    return code, out


def load(out):
    with open(out / "summary.json") as fh:
        s = json.load(fh)
    with open(out / "jobs.csv") as fh:
        js = list(csv.DictReader(fh))
    return s, js


FOUR_IDLE = [(0, f"n{i}", "idle") for i in range(4)] + [(1000, "n0", "idle")]


def test_job_completes_at_work_over_rate_plus_pause(tmp_path):
    code, out = replay(tmp_path, FOUR_IDLE, [job(work=1000.0, up=5, thr={1: 10.0, 4: 40.0})],
                       "--policy", "oracle")
    assert code == 0
    s, js = load(out)
    # 4 nodes at 40 samples/s after a 5 s start pause: 5 + 1000/40 = 30 s
    assert float(js[0]["completed_at_s"]) == pytest.approx(30.0, abs=1e-6)
    assert s["jobs_completed"] == 1 and s["useful_samples"] == pytest.approx(1000.0)
    assert s["allocated_node_s"] == pytest.approx(4 * 30.0, rel=1e-9)
    assert s["idle_node_s"] == pytest.approx(4 * 1001.0)
    for f in ("policy", "trace_span_s", "idle_node_s", "allocated_node_s", "useful_samples",
              "lost_samples", "jobs_completed", "rescales", "preemptions", "decisions",
              "decision_ms_p50", "decision_ms_p95", "wall_s"):
        assert f in s
    assert (out / "timeline.csv").stat().st_size > 0
    assert (out / "nodes.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "progress.png").read_bytes()[:4] == b"\x89PNG"


def test_preemption_shrinks_at_once_and_counts_lost_work(tmp_path):
    rows = [(0, "n0", "idle"), (0, "n1", "idle"), (10, "n1", "busy"), (500, "n0", "idle")]
    code, out = replay(tmp_path, rows, [job(work=1e9, lo=1, hi=2, up=0, down=4,
                                              thr={1: 10.0, 2: 20.0})], "--policy", "oracle")
    s, _ = load(out)
    assert code == 0 and s["preemptions"] == 1
    assert s["lost_samples"] == pytest.approx(4 * 20.0)       # pause at the old rate
    # 10 s at 20/s, 4 s paused, then 1 node at 10/s until the end (501 s)
    assert s["useful_samples"] == pytest.approx(200 + 10 * (501 - 14), rel=1e-9)


def test_preemption_below_min_stops_the_job(tmp_path):
    rows = [(0, "n0", "idle"), (0, "n1", "idle"), (10, "n1", "busy"), (100, "n0", "idle")]
    code, out = replay(tmp_path, rows, [job(work=1e9, lo=2, hi=2, down=3, thr={2: 20.0})],
                       "--policy", "oracle")
    s, _ = load(out)
    assert s["preemptions"] == 1 and s["useful_samples"] == pytest.approx(200.0)


def test_same_inputs_same_summary(tmp_path):
    rows = [(0, f"n{i}", "idle" if i % 3 else "busy") for i in range(12)]
    rows += [(t, f"n{t % 12}", "busy" if t % 2 else "idle") for t in range(30, 3000, 37)]
    jobs = [job(name=f"j{i}", submit=i * 60, lo=1, hi=6, work=5e4, up=10, down=5,
                profile="p" if i % 2 else "q", thr={1: 10.0, 2: 19.0, 4: 30.0, 8: 35.0})
            for i in range(6)]
    args = ("--policy", "malletrain", "--noise", "0.1", "--seed", "3")
    _, o1 = replay(tmp_path, rows, jobs, *args, name="a")
    _, o2 = replay(tmp_path, rows, jobs, *args, name="b")
    s1, s2 = load(o1)[0], load(o2)[0]
    for s in (s1, s2):
        for k in ("wall_s", "decision_ms_p50", "decision_ms_p95", "decision_ms_mean"):
            s.pop(k)
    assert s1 == s2
    assert s1["decisions"] > 50 and s1["useful_samples"] > 0
    assert (o1 / "timeline.csv").read_text() == (o2 / "timeline.csv").read_text()
    _, o3 = replay(tmp_path, rows, jobs, "--policy", "malletrain", "--noise", "0.1", "--seed", "4",
                   name="c")
    assert load(o3)[0]["useful_samples"] != s1["useful_samples"]


@pytest.mark.parametrize("policy", ["malletrain", "oracle", "bftrainer", "greedy", "static"])
def test_every_policy_runs(tmp_path, policy):
    rows = [(0, f"n{i}", "idle") for i in range(6)] + [(300, "n0", "busy"), (600, "n0", "idle")]
    jobs = [job(name=f"j{i}", submit=i * 30, hi=4, work=2e4, thr={1: 10, 2: 18, 4: 30})
            for i in range(3)]
    code, out = replay(tmp_path, rows, jobs, "--policy", policy, "--interval", "60")
    s, _ = load(out)
    assert code == 0 and s["policy"] == policy and s["useful_samples"] > 0


def test_max_jobs_limits_admission(tmp_path):
    jobs = [job(name=f"j{i}", hi=1, work=100.0, thr={1: 10.0}) for i in range(3)]
    _, out = replay(tmp_path, FOUR_IDLE, jobs, "--policy", "oracle", "--max-jobs", "1")
    _, js = load(out)
    done = sorted(float(j["completed_at_s"]) for j in js)
    assert done == pytest.approx([10.0, 20.0, 30.0])


# -- trace formats -----------------------------------------------------------
SCHEDULE = [  # (start, end, nodes) of primary jobs on n1..n4
    (100, 400, ["n1", "n2"]),
    (200, 900, ["n3"]),
    (500, 700, ["n1", "n2", "n4"]),
]


def test_three_formats_give_the_same_idle_node_seconds(tmp_path):
    from malletrain.domain.timeutil import iso
    # events
    ev = [(0, n, "idle") for n in ("n1", "n2", "n3", "n4")]
    for a, b, ns in SCHEDULE:
        ev += [(a, n, "busy") for n in ns] + [(b, n, "idle") for n in ns]
    ev.sort(key=lambda r: r[0])
    write_events(tmp_path / "t.csv.gz", ev, gz=True)
    # sacct
    with open(tmp_path / "t.sacct", "w") as fh:
        fh.write("JobID|Start|End|NodeList|State\n")
        fh.write(f"0|{iso(T0)[:-1]}|{iso(T0 + 1)[:-1]}|n[1-4]|COMPLETED\n")
        for i, (a, b, ns) in enumerate(SCHEDULE, 1):
            from hostlist import collect_hostlist
            fh.write(f"{i}|{iso(T0 + a)[:-1]}|{iso(T0 + b)[:-1]}|{collect_hostlist(ns)}|COMPLETED\n")
            fh.write(f"{i}.batch|{iso(T0 + a)[:-1]}|{iso(T0 + b)[:-1]}|{ns[0]}|COMPLETED\n")
        fh.write("99|Unknown|Unknown|None assigned|PENDING\n")
    a = load_trace(str(tmp_path / "t.csv.gz"), start=T0 + 1, end=T0 + 1000)
    b = load_trace(str(tmp_path / "t.sacct"), start=T0 + 1, end=T0 + 1000)
    assert b.skipped_jobs == 1
    busy_s = sum((e - s) * len(ns) for s, e, ns in SCHEDULE)
    assert idle_node_seconds(a) == pytest.approx(4 * 999 - busy_s)
    assert idle_node_seconds(b) == pytest.approx(idle_node_seconds(a))
    # SWF: sizes only; first-fit gives nodes, so the total is what must match
    with open(tmp_path / "t.swf", "w") as fh:
        fh.write("; MaxNodes: 4\n")
        for i, (s, e, ns) in enumerate(SCHEDULE, 1):
            fh.write(f"{i} {s} 0 {e - s} {len(ns)} -1 -1 {len(ns)} -1 -1 1 -1 -1 -1 -1 -1 -1 -1\n")
    c = load_trace(str(tmp_path / "t.swf"), start=1, end=1000)
    assert len(c.nodes) == 4
    assert idle_node_seconds(c) == pytest.approx(4 * 999 - busy_s)


def test_swf_procs_per_node_and_nodes_option(tmp_path):
    p = tmp_path / "t.swf"
    p.write_text("1 0 0 100 8 -1 -1 8 -1 -1 1 -1 -1 -1 -1 -1 -1 -1\n"
                 "2 0 10 100 4 -1 -1 4 -1 -1 1 -1 -1 -1 -1 -1 -1 -1\n")
    t = load_trace(str(p), procs_per_node=4)
    assert len(t.nodes) == 3 and t.n_events == 6
    t2 = load_trace(str(p), procs_per_node=4, nodes=1)
    assert len(t2.nodes) == 1 and t2.n_events == 2


def test_shipped_example_replays(tmp_path):
    from conftest import EXAMPLES
    out = tmp_path / "ex"
    code = main(["replay", "--trace", os.path.join(EXAMPLES, "philly-1day.csv.gz"),
                 "--workload", os.path.join(EXAMPLES, "workload-pollux.yaml"),
                 "--policy", "malletrain", "--out", str(out), "--quiet", "--noise", "0.05",
                 "--end", "2017-10-10T03:00:00Z"])
    s, _ = load(out)
    assert code == 0 and s["harvested_fraction"] > 0.05 and s["useful_samples"] > 0


def test_an_elastic_jobs_preemption_costs_its_shrink_pause_not_the_restart_pause(tmp_path):
    """Issue #26: an elastic job's members re-form in place, so losing a node pauses it for the
    measured shrink pause (here 0.5 s) instead of the workload's rescale_down_s (4 s)."""
    rows = [(0, "n0", "idle"), (0, "n1", "idle"), (10, "n1", "busy"), (500, "n0", "idle")]
    code, out = replay(tmp_path, rows, [job(work=1e9, lo=1, hi=2, up=0, down=4, thr={1: 10.0, 2: 20.0})],
                       "--policy", "oracle", "--elastic", "0.25,0.5")
    s, _ = load(out)
    assert code == 0 and s["preemptions"] == 1
    assert s["lost_samples"] == pytest.approx(0.5 * 20.0)
    assert s["useful_samples"] == pytest.approx(200 + 10 * (501 - 10.5), rel=1e-9)


def test_an_elastic_grow_pauses_the_survivors_while_the_joiners_start_and_a_start_is_a_restart():
    """The sim's elastic grow loses what the real one does: GROW s at the old size, then the old
    rate while the joiners start (rescale_up_s), as a pause at the new rate of that many samples."""
    from malletrain.domain.model import Action, ActionKind, JobSpec, ReasonCode
    from malletrain.replay.sim import SimCluster

    def run(elastic):
        sim = SimCluster(["a", "b", "c"], [False] * 3, 0.0, elastic=elastic)
        sim.admit(JobSpec("j", 1, 3, 30.0, 10.0, "p", 0.0, "j"), lambda n: 10.0 * n, 1e9)
        sim.apply([Action("j", ActionKind.START, (), ("a", "b"), "", ReasonCode.GAIN)])
        sim.advance(100.0)
        sim.apply([Action("j", ActionKind.GROW, ("a", "b"), ("a", "b", "c"), "", ReasonCode.GAIN)])
        sim.advance(200.0)
        return sim.jobs["j"].done

    # the start from no nodes pays rescale_up_s (30 s) either way
    assert run(None) == pytest.approx(20 * 70 + 30 * (100 - 30))
    # elastic: 0.05 s for everyone, then 30 s at 20/s while the third member starts, then 30/s
    assert run((0.05, 0.04)) == pytest.approx(20 * 70 + 20 * 30 + 30 * (100 - 30.05))


def test_the_sim_reports_each_pause_with_its_kind_and_an_elastic_replay_learns_them_apart():
    """Issue #26: the sim's jobs measure a start, a grow, a shrink and a preemption as such (a
    move of an elastic job, a mixed change, is not reported, as the daemon does not measure one).
    Its elastic jobs are flagged as such, so the learner keeps each kind apart: the grow it learns
    is the grow's cost, not a mix with the restarts of its starts."""
    from malletrain.core.forecast import ForecastSource
    from malletrain.domain.config import CoreConfig
    from malletrain.domain.model import Action, ActionKind, JobSpec, PauseKind, ReasonCode
    from malletrain.replay.sim import SimCluster

    def run(elastic):
        sim = SimCluster(["a", "b", "c", "d"], [False] * 4, 0.0, elastic=elastic)
        sim.admit(JobSpec("j", 1, 4, 30.0, 10.0, "", 0.0, "j"), lambda n: 10.0 * n, 1e9)   # no profile
        kinds, fc = [], ForecastSource(CoreConfig(policy="malletrain", availability=False))
        steps = [(ActionKind.START, (), ("a", "b")), (ActionKind.GROW, ("a", "b"), ("a", "b", "c")),
                 (ActionKind.SHRINK, ("a", "b", "c"), ("a", "b")), (ActionKind.SHRINK, ("a", "b"), ("a", "d"))]
        for t, (kind, old, new) in enumerate(steps):
            sim.apply([Action("j", kind, old, new, "", ReasonCode.GAIN)])
            sim.advance(100.0 * (t + 1))
            obs = sim.observe()
            pauses = sim.pauses()
            kinds += [p.kind for p in pauses]
            fc.ingest(obs.snapshot, obs.profiles(), pauses, elastic=obs.elastic())
        sim.settle_preemptions({"j": 1})
        sim.jobs["j"].nodes = ["a"]
        sim.advance(500.0)
        obs = sim.observe()
        pauses = sim.pauses()
        kinds += [p.kind for p in pauses]
        fc.ingest(obs.snapshot, obs.profiles(), pauses, elastic=obs.elastic())
        return kinds, fc.learner.cost("j", 30.0, 10.0)

    kinds, cost = run((0.05, 0.04))
    assert kinds == [PauseKind.START, PauseKind.GROW, PauseKind.SHRINK, PauseKind.PREEMPTION]
    assert cost.up_s == 30.0 and cost.grow_s == pytest.approx((30.0 + 0.05 + 30.0 / 3) / 2)
    assert cost.down_s == pytest.approx((10.0 + 0.04) / 2) and cost.preemption_n == 1
    assert cost.preemption_s == pytest.approx((cost.down_s + 0.04) / 2)     # the shrink's estimate its prior
    kinds, cost = run(None)           # restarts: the same kinds measured, learned as up and down
    assert kinds == [PauseKind.START, PauseKind.GROW, PauseKind.SHRINK, PauseKind.SHRINK, PauseKind.PREEMPTION]
    assert cost.grow_s is None and (cost.up_n, cost.down_n) == (2, 3)


def test_a_sacct_export_leaves_out_the_harvest_partitions_jobs_and_folds_a_groups_members(tmp_path, capsys):
    """Issue #26: a site's sacct history holds malletrain's own jobs too.  They ran on nodes the
    primary scheduler had left idle, so with --harvest-partition they are not busy time; an
    elastic group's members (one array task per node, and its held ones merged in one pending
    line) count as the one job they are, and a node only malletrain ran on is in the trace, idle."""
    from malletrain.cli.main import main
    from malletrain.domain.timeutil import iso

    def at(t):
        return iso(T0 + t)[:-1]
    rows = ["JobID|Start|End|NodeList|State|Partition",
            f"0|{at(0)}|{at(1)}|n[1-4]|COMPLETED|batch",
            f"1|{at(100)}|{at(400)}|n[1-2]|COMPLETED|batch",
            f"1.batch|{at(100)}|{at(400)}|n1|COMPLETED|",
            f"7_0|{at(200)}|{at(600)}|n3|REQUEUED|scavenger",       # a group's members, one node each
            f"7_1|{at(200)}|{at(900)}|n4|COMPLETED|scavenger",
            f"7_2|{at(300)}|{at(900)}|n5|COMPLETED|scavenger",      # a node only the harvest used
            "7_[3-5]|Unknown|Unknown|None assigned|PENDING|scavenger",
            f"8|{at(500)}|{at(700)}|n3|COMPLETED|scavenger,batch",  # a plain malleable job (several partitions)
            f"10+0|{at(950)}|{at(960)}|n2|COMPLETED|scavenger",     # a heterogeneous job's two parts: one job
            f"10+1|{at(950)}|{at(960)}|n5|COMPLETED|scavenger",
            f"9|{at(950)}|{at(990)}|n1|COMPLETED|batch"]
    (tmp_path / "t.sacct").write_text("\n".join(rows) + "\n")
    whole = load_trace(str(tmp_path / "t.sacct"), start=T0 + 1, end=T0 + 1000)
    primary = load_trace(str(tmp_path / "t.sacct"), start=T0 + 1, end=T0 + 1000, harvest_partitions=("scavenger",))
    assert primary.harvest_jobs == 3 and primary.harvest_members == 3 and whole.harvest_jobs == 0
    assert sorted(primary.nodes) == sorted(whole.nodes) == ["n1", "n2", "n3", "n4", "n5"]
    busy_primary = 300 * 2 + 40
    assert idle_node_seconds(primary) == pytest.approx(5 * 999 - busy_primary)
    assert idle_node_seconds(whole) == pytest.approx(5 * 999 - busy_primary - (400 + 700 + 600 + 200 - 100 + 20))
    out = tmp_path / "out"
    wl = tmp_path / "w.yaml"
    wl.write_text("jobs:\n- {name: a, submit: 0, min_nodes: 1, max_nodes: 2, work: 1000000,\n"
                  "   throughput: {1: 10, 2: 18}}\n")
    code = main(["replay", "--trace", str(tmp_path / "t.sacct"), "--workload", str(wl), "--out", str(out),
                 "--harvest-partition", "scavenger", "--no-plots"])
    assert code == 0
    assert "left out 3 job(s) of the harvest partition(s) scavenger (3 of their allocations" in capsys.readouterr().err
