"""SlurmBackend observe/apply logic against a scripted fake of the Slurm CLI
(the live tests cover the real thing; these pin down the state table)."""
from __future__ import annotations

from helpers import TAG, FakeSlurm

from malletrain.domain.config import DaemonConfig, SlurmConfig
from malletrain.domain.model import Action, ActionKind, ReasonCode
from malletrain.slurm.adapter import Book, SlurmBackend
from malletrain.slurm.parse import Tag
from malletrain.slurm.runner import Runner


def _backend(fake, **dc):
    clock = {"t": 1000.0}
    saved = {}
    b = SlurmBackend(Runner(exec_fn=fake, sleep=lambda s: None),
                     SlurmConfig(), DaemonConfig(interval_s=2, rescale_wait_s=1, **dc),
                     clock=lambda: clock["t"], save_book=lambda j, bk: saved.__setitem__(j, bk))
    return b, clock, saved


def _held(fake, jid):
    fake.jobs[jid] = dict(partition="scavenger", state="PENDING", reason="JobHeldUser", nodes=(), comment=TAG)


def test_start_grow_shrink_stop_keep_the_id_and_write_the_book_ahead():
    fake = FakeSlurm()
    _held(fake, "7")
    b, clock, saved = _backend(fake)
    obs = b.observe()
    assert [n.name for n in obs.snapshot.nodes] == ["n1", "n2", "n3", "n4"]
    (job,) = obs.snapshot.jobs
    assert job.nodes == () and job.spec.max_nodes == 4
    b.apply([Action("7", ActionKind.START, (), ("n1", "n2"), "why", ReasonCode.GAIN)])
    assert ["scontrol", "update", "jobid=7", "NumNodes=2-2", "ReqNodeList=n[1-2]", "StartTime=now"] in fake.calls
    assert saved["7"].launching == ("n1", "n2") and saved["7"].paused_until_s == 1002.0
    # released but not yet started: the job keeps its nodes in the snapshot
    clock["t"] += 2
    (job,) = b.observe().snapshot.jobs
    assert job.nodes == ("n1", "n2")
    fake.run_pending()
    (job,) = b.observe().snapshot.jobs
    assert job.nodes == ("n1", "n2") and b.books["7"].running == ("n1", "n2")
    fake.calls.clear()
    b.apply([Action("7", ActionKind.GROW, ("n1", "n2"), ("n1", "n2", "n3"), "why", ReasonCode.GAIN)])
    verbs = [c[1] for c in fake.calls if c[0] == "scontrol"]
    assert verbs == ["requeuehold", "update", "release"]
    fake.run_pending()
    b.apply([Action("7", ActionKind.STOP, ("n1", "n2", "n3"), (), "why", ReasonCode.GAIN)])
    assert fake.jobs["7"]["reason"] == "job requeued in held state"
    assert list(fake.jobs) == ["7"]
    assert b.events.starts == 1 and b.events.rescales == 1 and b.events.stops == 1


def test_preempted_job_is_held_and_counted():
    fake = FakeSlurm()
    fake.jobs["8"] = dict(partition="scavenger", state="RUNNING", reason="None", nodes=("n1",), comment=TAG)
    fake.nodes["n1"] = "allocated"
    b, clock, _ = _backend(fake)
    b.observe()
    fake.jobs["8"].update(state="PENDING", reason="BeginTime", nodes=())   # Slurm requeued it
    fake.nodes["n1"] = "idle"
    obs = b.observe()
    assert obs.snapshot.jobs == () and fake.jobs["8"]["reason"] == "JobHeldUser"
    assert b.events.preemptions == 1


def test_nodes_due_to_a_primary_job_leave_the_pool():
    fake = FakeSlurm()
    fake.jobs["9"] = dict(partition="scavenger", state="RUNNING", reason="None", nodes=("n3", "n4"), comment=TAG)
    fake.nodes.update(n3="allocated", n4="allocated")
    fake.jobs["10"] = dict(partition="batch", state="PENDING", reason="Resources", nodes=(),
                           start=1030, sched=("n2", "n3"), comment="(null)")
    b, clock, _ = _backend(fake, vacate_lead_s=60)
    obs = b.observe()
    assert sorted(n.name for n in obs.snapshot.nodes) == ["n1", "n4"]   # n2, n3 are due in 30 s
    assert b.events.vacates == 1
    b2, _, _ = _backend(fake, vacate_lead_s=0)       # reactive only: 30 s > one interval
    assert sorted(n.name for n in b2.observe().snapshot.nodes) == ["n1", "n2", "n3", "n4"]


def test_finished_and_foreign_jobs():
    fake = FakeSlurm()
    _held(fake, "11")
    fake.jobs["12"] = dict(partition="scavenger", state="PENDING", reason="JobHeldUser", nodes=(),
                           comment="not ours")
    b, _, saved = _backend(fake)
    assert [j.job_id for j in b.observe().snapshot.jobs] == ["11"]
    b.books["11"] = Book(last_change_s=1.0)
    del fake.jobs["11"]
    obs = b.observe()
    assert obs.finished == ("11",) and "11" not in b.books and saved["11"] is None


# ---------------------------------------------------------------- trust (SECURITY.md)

def _writes(fake):
    return [c for c in fake.calls if c[0] == "scontrol" and c[1] not in ("-o", "show")]


def test_forged_comment_cannot_steer_writes_onto_another_users_job():
    """Bob's comment holds a newline and a well-formed record naming Alice's job 7 and a
    pending primary job: neither the queue read nor the tag read can be forged by it."""
    fake = FakeSlurm()
    _held(fake, "7")
    fake.jobs["7"]["uid"] = 1001
    forged = ("x\n7|scavenger|RUNNING|None|1|n1|100|(null)|100|alice|1001\n"
              "9|batch|PENDING|Resources|1||1|n2|100|carol|1003\n" + TAG.replace("tok", "evil"))
    fake.jobs["12"] = dict(partition="scavenger", state="PENDING", reason="JobHeldUser", nodes=(),
                           comment=forged, uid=1002)
    fake.jobs["9"] = dict(partition="batch", state="PENDING", reason="Resources", nodes=(), comment="",
                          uid=1003)
    b, _, _ = _backend(fake)
    obs = b.observe()
    assert [j.job_id for j in obs.snapshot.jobs] == ["7"]          # 12's comment is not a tag
    assert obs.facts["7"].uid == 1001 and obs.facts["7"].profile == "u/p"
    assert b.tag_records["12"].comment == forged                  # read whole, as one comment
    b.apply([Action("12", ActionKind.START, (), ("n1",), "why", ReasonCode.GAIN),
             Action("9", ActionKind.STOP, ("n2",), (), "why", ReasonCode.GAIN)])
    assert _writes(fake) == [] and b.events.refused_writes == 2


def test_every_write_re_checks_owner_partition_and_tag():
    fake = FakeSlurm()
    _held(fake, "7")
    b, _, _ = _backend(fake)
    b.observe()
    fake.jobs["7"]["comment"] = TAG.replace("max=4", "max=2")     # the owner edits the tag
    b.apply([Action("7", ActionKind.START, (), ("n1", "n2", "n3"), "why", ReasonCode.GAIN)])
    assert _writes(fake) == [] and b.events.refused_writes == 1
    (job,) = b.observe().snapshot.jobs                              # decided again from the new tag
    assert job.spec.max_nodes == 2
    fake.jobs["7"]["partition"] = "batch"                          # moved out of the partition
    b.apply([Action("7", ActionKind.START, (), ("n1",), "why", ReasonCode.GAIN)])
    assert _writes(fake) == [] and b.events.refused_writes == 2
    fake.jobs["7"]["partition"] = "scavenger"
    b.observe()
    b.apply([Action("7", ActionKind.START, (), ("n1",), "why", ReasonCode.GAIN)])
    assert [c[1] for c in _writes(fake)] == ["update", "release"]
    # each write was preceded by its own re-read of the job
    reads = [c for c in fake.calls if c[0] == "squeue" and c[-1] == "%i|%U|%P|%k"]
    assert len(reads) >= 2 + 2


def test_tag_reads_are_bounded_and_fair_across_users():
    fake = FakeSlurm()
    for i in range(100, 160):                                     # a flood from one user
        _held(fake, str(i))
        fake.jobs[str(i)]["uid"] = 2000
    _held(fake, "500")                                            # one honest job, submitted later
    fake.jobs["500"]["uid"] = 1001
    b, _, _ = _backend(fake, max_tag_reads=5)
    obs = b.observe()
    assert "500" in {j.job_id for j in obs.snapshot.jobs}        # served in the first cycle
    assert b.events.tag_reads == 5
    for _ in range(12):
        obs = b.observe()
    assert len(obs.snapshot.jobs) == 61 and b.events.tag_reads == 61   # each tag read once


def test_user_numbers_are_clamped_and_profiles_are_per_user():
    fake = FakeSlurm()
    fake.jobs["7"] = dict(partition="scavenger", state="PENDING", reason="JobHeldUser", nodes=(),
                          comment=Tag("a", 1, 90000, "resnet", 9e6, 5.0, "").encode(), uid=1001)
    fake.jobs["8"] = dict(partition="scavenger", state="PENDING", reason="JobHeldUser", nodes=(),
                          comment=Tag("b", 1, 2, "shared-bert", 1.0, 1.0, "").encode(), uid=1002)
    b, _, _ = _backend(fake, max_rescale_pause_s=600, shared_profiles=("shared-bert",))
    obs = b.observe()
    a, c = obs.snapshot.jobs
    assert a.spec.max_nodes == 4 and a.spec.rescale_up_s == 600 and a.spec.rescale_down_s == 5
    assert obs.facts["7"].profile == "u/resnet" and obs.facts["8"].profile == "shared-bert"


def test_the_release_is_read_once_and_retried_only_while_unknown():
    import subprocess
    fake = FakeSlurm()
    b, clock, _ = _backend(fake)
    tries = []

    def flaky(argv, **kw):          # the first `sinfo --version` fails (Slurm's config unreadable)
        if argv[:2] == ["sinfo", "--version"]:
            tries.append(argv)
            if len(tries) == 1:
                return subprocess.CompletedProcess(argv, 1, "", "sinfo: fatal: no configuration source")
        return fake(argv, **kw)
    b.runner._exec = flaky
    b.runner.retries = 0
    for _ in range(4):
        b.observe()
        clock["t"] += 2
    assert b.release is not None and b.release.text == "22.05.8"
    assert len(tries) == 2          # failed in cycle 1, read in cycle 2, never again


def test_nodes_carry_their_switch_and_the_site_files_speed(tmp_path):
    site = tmp_path / "nodes.csv"
    site.write_text("node,group,slowdown\nn2,,1.15\nn4,rack9,0.97\n")
    fake = FakeSlurm()
    b = SlurmBackend(Runner(exec_fn=fake, sleep=lambda s: None), SlurmConfig(node_info=str(site)),
                     DaemonConfig(interval_s=2), clock=lambda: 1000.0)
    nodes = {n.name: n for n in b.observe().snapshot.nodes}
    assert (nodes["n1"].group, nodes["n1"].variability) == ("s1", 1.0)
    assert (nodes["n2"].group, nodes["n2"].variability) == ("s1", 1.15)   # switch from Slurm, speed from the file
    assert (nodes["n4"].group, nodes["n4"].variability) == ("rack9", 0.97)  # the site file's group wins
    b.observe()
    assert sum(1 for c in fake.calls if c[:3] == ["scontrol", "show", "topology"]) == 1   # read once
    off = SlurmBackend(Runner(exec_fn=fake, sleep=lambda s: None), SlurmConfig(topology=False),
                       DaemonConfig(interval_s=2), clock=lambda: 1000.0)
    assert {n.group for n in off.observe().snapshot.nodes} == {""}


def _running(fake, jid, nodes, uid=1000):
    fake.jobs[jid] = dict(partition="scavenger", state="RUNNING", reason="None", nodes=tuple(nodes),
                          comment=TAG, uid=uid)
    for n in nodes:
        fake.nodes[n] = "allocated"


def test_no_job_is_released_onto_nodes_whose_stop_was_refused_or_failed():
    """Job 7 holds n1-n2; the plan stops it and starts another user's job 8 there.  When the
    stop is refused (7's owner changed its tag) or fails (7 was submitted --no-requeue: Slurm
    answers "Requested operation is presently disabled", checked on 22.05, 24.11 and 26.05), 8 is
    not released onto 7's nodes: it stays held, and the next cycle plans from what Slurm did.
    A launch onto nodes that were idle goes ahead in the same plan."""
    plan = [Action("7", ActionKind.STOP, ("n1", "n2"), (), "why", ReasonCode.GAIN),
            Action("8", ActionKind.START, (), ("n1", "n2"), "why", ReasonCode.GAIN),
            Action("9", ActionKind.START, (), ("n3",), "why", ReasonCode.GAIN)]
    for spoil in ("tag", "no-requeue"):
        fake = FakeSlurm()
        _running(fake, "7", ("n1", "n2"))
        _held(fake, "8")
        fake.jobs["8"]["uid"] = 1001
        _held(fake, "9")
        b, _, _ = _backend(fake)
        b.observe()
        if spoil == "tag":
            fake.jobs["7"]["comment"] = TAG.replace("max=4", "max=3")
        else:
            fake.jobs["7"]["requeue"] = False
        fake.calls.clear()
        b.apply(plan)
        writes = [(c[1], c[2] if c[1] != "update" else c[2].split("=")[1]) for c in _writes(fake)]
        assert ("release", "8") not in writes and ("update", "8") not in writes, (spoil, writes)
        assert ("release", "9") in writes, (spoil, writes)       # its node was idle
        assert b.events.deferred_launches == 1
        assert b.books["8"].launching == ()
        assert fake.jobs["7"]["state"] == "RUNNING" and fake.jobs["8"]["reason"] == "JobHeldUser"
        (refused,) = [a for a in [("refused", b.events.refused_writes), ("failed", b.events.failed_actions)]
                      if a[1]]
        assert refused[0] == ("refused" if spoil == "tag" else "failed")


def test_owner_association_node_limits_hold_for_the_daemons_resizes():
    """Slurm lifts an association's GrpTRES node limit for a job whose size an operator set
    (measured on 22.05, 24.11 and 26.05: such a job starts beyond its owner's limit), so the
    daemon keeps it: a job's max_nodes leaves room for its owner's other running jobs, and a plan
    that would still take an owner beyond it (two of their jobs growing at once) loses the
    launches that do."""
    from malletrain.slurm.parse import parse_node_limits
    assert parse_node_limits("alice|node=3,cpu=8\nalice|node=2\nbob|\nmallory|cpu=node=9\neve|x", ["alice", "bob",
                             "mallory"]) == {"alice": 2}
    fake = FakeSlurm()
    fake.assoc = {"u": "cpu=64,node=3"}
    _held(fake, "7")
    _held(fake, "8")
    fake.jobs["9"] = dict(partition="batch", state="RUNNING", reason="None", nodes=("n4",), comment="")
    fake.nodes["n4"] = "allocated"       # the owner's own primary job holds one node
    b, _, _ = _backend(fake)
    obs = b.observe()                 # a new owner's limit is read before their first decision
    assert b.node_limits == {"u": 3} and b.nodes_used == {"u": 1}
    assert {j.job_id: j.spec.max_nodes for j in obs.snapshot.jobs} == {"7": 2, "8": 2}
    b.apply([Action("7", ActionKind.START, (), ("n1", "n2"), "why", ReasonCode.GAIN),
             Action("8", ActionKind.START, (), ("n3",), "why", ReasonCode.GAIN)])
    started = {c[2].split("=")[1] for c in _writes(fake) if c[1] == "update"}
    assert started == {"7"} and b.events.deferred_launches == 1         # 1 + 2 = 3; a third node is not
    (j7,) = [j for j in b.observe().snapshot.jobs if j.job_id == "7"]   # released, not yet running:
    assert j7.nodes == ("n1", "n2") and j7.spec.max_nodes >= 2          # never capped below its nodes
    fake.assoc = {}
    b2, _, _ = _backend(fake)
    b2.observe()
    assert b2.node_limits == {} and b2.within_limits([Action("8", ActionKind.START, (), ("n3",), "w",
                                                             ReasonCode.GAIN)])


def test_a_steady_cycle_makes_at_most_three_reads_with_limits_and_reservations_read():
    """The queue, the partition's nodes, and at most one periodic read (reservations, or the
    owners' node limits: never both in one cycle)."""
    fake = FakeSlurm()
    fake.assoc = {"u": "node=3"}
    _held(fake, "7")
    b, _, _ = _backend(fake)
    b.observe()
    kinds = set()
    for _ in range(13):
        fake.calls.clear()
        b.observe()
        assert len(fake.calls) <= 3, fake.calls
        kinds |= {c[0] for c in fake.calls}
    assert {"sacctmgr", "scontrol"} <= kinds          # both periodic reads happened


def test_a_limit_learned_after_a_launch_never_caps_a_job_below_its_nodes():
    """A job released onto 2 nodes before its owner's limit (2, one node held elsewhere) was
    known: the cap leaves it the nodes it is launching onto (a cap below them made every plan
    invalid: 'plan rejected, nothing applied' for every user), and nothing more is launched."""
    fake = FakeSlurm()
    _held(fake, "7")
    _held(fake, "8")
    fake.jobs["9"] = dict(partition="batch", state="RUNNING", reason="None", nodes=("n4",), comment="")
    fake.nodes["n4"] = "allocated"
    b, clock, _ = _backend(fake)
    b.observe()
    b.apply([Action("7", ActionKind.START, (), ("n1", "n2"), "why", ReasonCode.GAIN)])
    fake.assoc = {"u": "node=2"}
    b._read_node_limits(["u"])
    clock["t"] += 2
    jobs = {j.job_id: j for j in b.observe().snapshot.jobs}     # 7 released, not yet running
    assert jobs["7"].nodes == ("n1", "n2") and jobs["7"].spec.max_nodes == 2
    assert "8" not in jobs                                       # no room left for its min_nodes
