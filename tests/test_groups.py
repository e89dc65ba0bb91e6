"""Elastic groups in the Slurm backend (issue #26): a malleable job as a held array of 1-node
members, started, stopped and preempted one node at a time, against the scripted Slurm CLI
(tests/helpers.py answers as real Slurm does; the live tier runs the same on real clusters)."""
from __future__ import annotations

from helpers import GROUP_TAG, TAG, FakeSlurm, held_array, held_job

from malletrain.domain.config import DaemonConfig, SlurmConfig
from malletrain.domain.model import Action, ActionKind, ReasonCode
from malletrain.slurm.adapter import SlurmBackend
from malletrain.slurm.groups import MAX_MEMBERS, ended_record, fold, from_lines
from malletrain.slurm.parse import Phase, Tag, all_held, array_tasks, parse_squeue, parse_tag
from malletrain.slurm.runner import Runner


def _backend(fake, elastic_groups=True, **dc):
    clock = {"t": 1000.0}
    saved = {}
    b = SlurmBackend(Runner(exec_fn=fake, sleep=lambda s: None, array_tasks=elastic_groups),
                     SlurmConfig(elastic_groups=elastic_groups), DaemonConfig(interval_s=2, rescale_wait_s=1, **dc),
                     clock=lambda: clock["t"], save_book=lambda j, bk: saved.__setitem__(j, bk))
    return b, clock, saved


def _act(kind, frm, to):
    return Action("50", kind, tuple(frm), tuple(to), "why", ReasonCode.GAIN)


def _writes(fake):
    return [c for c in fake.calls if c[0] in ("scontrol", "scancel") and c[1] not in ("-o", "show")]


def _running(b, fake):
    fake.run_pending()
    (job,) = b.observe().snapshot.jobs
    return job


def test_the_group_tag_round_trips_and_a_bad_group_value_is_no_tag():
    tag = Tag("t", 1, 3, group=True)
    assert parse_tag(tag.encode()) == tag and "group=1" in tag.encode()
    assert parse_tag(Tag("t", 1, 3).encode()).group is False and "group" not in Tag("t", 1, 3).encode()
    assert parse_tag(tag.encode().replace("group=1", "group=yes")) is None


def test_squeue_r_lines_name_the_array_and_task_and_fold_into_one_record_per_array():
    text = ("50|50_2|scavenger|PENDING|JobHeldUser|1||N/A|(null)|100|u|1000\n"
            "51|50_0|scavenger|RUNNING|None|1|n1|120|(null)|100|u|1000\n"
            "52|50_1|scavenger|RUNNING|None|1|n3|110|(null)|100|u|1000\n"
            "60|60_0|batch|PENDING|Priority|1||N/A|(null)|100|v|1001\n"
            "70|70|scavenger|PENDING|JobHeldUser|2||N/A|(null)|100|u|1000\n")
    recs = parse_squeue(text)
    assert [(r.array_id, r.task, r.spec, r.plain) for r in recs] == [
        ("50", 2, "50_2", False), ("50", 0, "50_0", False), ("50", 1, "50_1", False),
        ("60", 0, "60_0", False), ("", -1, "70", True)]
    out, groups = fold(recs, "scavenger", {"50", "60"})
    assert [m.task for m in groups["50"]] == [0, 1, 2] and set(groups) == {"50"}
    g = next(r for r in out if r.job_id == "50")
    assert g.phase is Phase.RUNNING and g.nodes == ("n1", "n3") and g.start_s == 110 and g.plain
    assert {r.job_id for r in out} == {"50", "60", "70"}      # another partition's array is left as it is


def test_a_group_starts_grows_and_shrinks_one_member_per_node_and_never_restarts_the_others():
    fake = FakeSlurm()
    held_array(fake, "50", 4)
    b, clock, saved = _backend(fake)
    (job,) = b.observe().snapshot.jobs
    assert job.job_id == "50" and job.nodes == () and job.spec.max_nodes == 3     # the tag's max (4 members)
    b.apply([_act(ActionKind.START, (), ("n1", "n2"))])
    assert _writes(fake) == [["scontrol", "update", "JobId=50_0", "NumNodes=1-1", "ReqNodeList=n1", "StartTime=now"],
                             ["scontrol", "release", "50_0"],
                             ["scontrol", "update", "JobId=50_1", "NumNodes=1-1", "ReqNodeList=n2", "StartTime=now"],
                             ["scontrol", "release", "50_1"]]
    assert saved["50"].placed() == {0: "n1", 1: "n2"} and saved["50"].launching == ("n1", "n2")
    clock["t"] += 2
    (job,) = b.observe().snapshot.jobs
    assert job.nodes == ("n1", "n2")                 # released, not started yet: still the group's
    job = _running(b, fake)
    assert job.nodes == ("n1", "n2") and b.books["50"].running == ("n1", "n2")
    ids = {k: fake.jobs[k]["id"] for k in ("50_0", "50_1")}
    assert len(set(ids.values())) == 2 and "50" not in ids.values()      # each started task: a job of its own
    fake.calls.clear()
    b.apply([_act(ActionKind.GROW, ("n1", "n2"), ("n1", "n2", "n4"))])
    assert _writes(fake) == [["scontrol", "update", "JobId=50_2", "NumNodes=1-1", "ReqNodeList=n4", "StartTime=now"],
                             ["scontrol", "release", "50_2"]]          # no requeue of the running members
    job = _running(b, fake)
    assert job.nodes == ("n1", "n2", "n4")
    fake.calls.clear()
    b.apply([_act(ActionKind.SHRINK, ("n1", "n2", "n4"), ("n1", "n4"))])
    assert _writes(fake) == [["scontrol", "requeuehold", "50_1"]]    # only the member on n2
    assert fake.jobs["50_0"]["state"] == "RUNNING" and fake.jobs["50_2"]["state"] == "RUNNING"
    job = _running(b, fake)
    assert job.nodes == ("n1", "n4")
    fake.calls.clear()
    b.apply([_act(ActionKind.STOP, ("n1", "n4"), ())])
    assert sorted(c[2] for c in _writes(fake)) == ["50_0", "50_2"]
    assert b.events.starts == 1 and b.events.rescales == 2 and b.events.stops == 1
    assert all(r["reason"] == "job requeued in held state" for k, r in fake.jobs.items() if k != "50_3")


def test_a_groups_facts_say_it_re_forms_in_place_and_which_kind_each_change_of_the_daemons_was():
    """The pause learner keeps a group's kinds apart (issue #26): its facts say it is elastic, and
    its last change whether it was a start, a grow or a shrink; a plain job's say it is not."""
    from malletrain.domain.model import PauseKind
    fake = FakeSlurm()
    held_array(fake, "50", 4)
    held_job(fake, "60")
    b, clock, _ = _backend(fake)
    b.observe()
    b.apply([_act(ActionKind.START, (), ("n1",)),
             Action("60", ActionKind.START, (), ("n3",), "why", ReasonCode.GAIN)])
    clock["t"] += 2
    obs = b.observe()
    assert obs.elastic() == {"50"}
    assert obs.facts["50"].change.kind is PauseKind.START and obs.facts["60"].change.kind is PauseKind.START
    fake.run_pending()
    b.observe()
    b.apply([_act(ActionKind.GROW, ("n1",), ("n1", "n2"))])
    clock["t"] += 2
    assert b.observe().facts["50"].change.kind is PauseKind.GROW
    fake.run_pending()
    b.observe()
    b.apply([_act(ActionKind.SHRINK, ("n1", "n2"), ("n1",))])
    clock["t"] += 2
    assert b.observe().facts["50"].change.kind is PauseKind.SHRINK


def test_a_preempted_member_is_held_again_and_only_its_node_leaves_the_group():
    fake = FakeSlurm()
    held_array(fake, "50", 3)
    b, clock, _ = _backend(fake)
    b.observe()
    b.apply([_act(ActionKind.START, (), ("n1", "n2", "n3"))])
    assert _running(b, fake).nodes == ("n1", "n2", "n3")
    fake.jobs["50_1"].update(state="PENDING", reason="BeginTime", nodes=())    # Slurm requeued it alone
    fake.nodes["n2"] = "allocated"                                             # the primary job's now
    fake.calls.clear()
    clock["t"] += 2
    (job,) = b.observe().snapshot.jobs
    assert job.nodes == ("n1", "n3") and b.events.preemptions == 1
    assert fake.jobs["50_1"]["reason"] == "JobHeldUser"
    assert [c for c in _writes(fake)] == [["scontrol", "uhold", "50_1"]]
    assert fake.jobs["50_0"]["state"] == fake.jobs["50_2"]["state"] == "RUNNING"


def test_the_member_left_on_the_arrays_own_id_is_addressed_as_its_task_never_by_that_id():
    """slurmctld leaves an array's last unstarted task on the array's own job id: a write to that
    id would reach every member (a requeuehold of it requeues the whole array, seen on 22.05)."""
    fake = FakeSlurm()
    held_array(fake, "50", 3)
    b, clock, _ = _backend(fake)
    b.observe()
    b.apply([_act(ActionKind.START, (), ("n1", "n2", "n3"))])
    _running(b, fake)
    assert fake.jobs["50_2"]["id"] == "50"
    fake.calls.clear()
    b.apply([_act(ActionKind.SHRINK, ("n1", "n2", "n3"), ("n1", "n2"))])
    assert _writes(fake) == [["scontrol", "requeuehold", "50_2"]]
    assert all(c[c.index("-j") + 1] != "50" for c in fake.calls if c[0] == "squeue" and "-j" in c)   # reads too
    assert fake.jobs["50_0"]["state"] == fake.jobs["50_1"]["state"] == "RUNNING"


def test_a_member_whose_tag_changed_is_not_written_and_the_others_still_are():
    fake = FakeSlurm()
    held_array(fake, "50", 3)
    b, clock, _ = _backend(fake)
    b.observe()
    fake.jobs["50_0"]["comment"] = GROUP_TAG.replace("grp", "other")     # its owner rewrote one member
    b.apply([_act(ActionKind.START, (), ("n1", "n2"))])
    started = [c[2] for c in _writes(fake) if c[1] == "release"]
    assert started == ["50_1", "50_2"] and b.events.refused_writes == 1     # the next spare members instead


def test_only_arrays_carry_the_group_tag_and_only_group_tags_adopt_arrays():
    fake = FakeSlurm()
    held_array(fake, "50", 2, comment=TAG)             # an array with a plain job's tag
    held_job(fake, "60", comment=GROUP_TAG)            # a plain job with a group's tag
    held_array(fake, "70", 2)
    b, _, _ = _backend(fake)
    assert [j.job_id for j in b.observe().snapshot.jobs] == ["70"]


def test_a_group_whose_work_is_done_has_its_held_members_cancelled():
    fake = FakeSlurm()
    held_array(fake, "50", 3)
    b, clock, _ = _backend(fake)
    b.observe()
    b.apply([_act(ActionKind.START, (), ("n1",))])
    _running(b, fake)
    fake.end("50_0", "COMPLETED")                      # the work ended 'done' on the one running member
    b.finished_work = lambda job: job == "50"
    b.observe()
    assert b.finished_queued == {"50"}
    assert b.cancel_finished("50", "done")
    assert {r["state"] for r in fake.jobs.values()} == {"CANCELLED", "COMPLETED"}
    assert [c for c in fake.calls if c[0] == "scancel"] == [["scancel", "50_1"], ["scancel", "50_2"]]


def test_a_steady_cycle_with_a_running_group_reads_three_commands_at_most():
    fake = FakeSlurm()
    held_array(fake, "50", 4)
    b, clock, _ = _backend(fake, max_tag_reads=5)
    b.observe()
    b.apply([_act(ActionKind.START, (), ("n1", "n2"))])
    _running(b, fake)
    _running(b, fake)
    for _ in range(7):           # every 6th cycle reads reservations too
        fake.calls.clear()
        b.observe()
        assert len(fake.calls) <= 3, fake.calls
        # the plain read says it all: two members run, the other two are held on one line
        assert [c for c in fake.calls if c[0] == "squeue"] == [["squeue", "-h", "-a", "-o", fake.calls[0][-1]]]
    assert [m.phase for m in b.groups["50"]] == [Phase.RUNNING] * 2 + [Phase.HELD] * 2


def test_an_arrays_pending_tasks_are_one_line_and_read_task_by_task_only_when_that_line_hides_something():
    """squeue without -r merges an array's pending tasks into one line, even those split off with
    ids and reasons of their own (22.05: ``15_[0-1,3,5]``; a held spare and a member released onto
    a node look alike).  When every reason there is a hold, the line's task list is the held
    members; otherwise the backend reads that array again with -r -j.  20 held arrays of 1,000
    tasks in another partition cost 20 lines of one read, nothing more."""
    held = "15|15_[0-1,3,8-20:4%2]|scavenger|PENDING|JobHeldUser|1||N/A|(null)|100|u|1000\n"
    (r,) = parse_squeue(held)
    assert (r.array_id, r.task, r.tasks, r.plain) == ("15", -1, "0-1,3,8-20:4", False)
    assert [(m.task, m.phase) for m in from_lines([r])] == [(t, Phase.HELD) for t in (0, 1, 3, 8, 12, 16, 20)]
    for hidden in ("JobHeldUser,Resources", "None", "ReqNodeNotAvail, UnavailableNodes:n[1-2]"):
        (r,) = parse_squeue(held.replace("JobHeldUser", hidden))
        assert from_lines([r]) is None, hidden
        out, groups = fold([r], "scavenger", {"15"})          # never a member: a line of several tasks
        assert groups == {} and out == [r]
    for cut in ("15_[0-1,3,8...]", "15_[0,3,6,9,12,15,18,21,2"):     # SLURM_BITSTR_LEN reached; unset
        (r,) = parse_squeue(held.replace("15_[0-1,3,8-20:4%2]", cut))
        assert r.array_id == "15" and from_lines([r]) is None
    fake = FakeSlurm()
    for a in range(20):
        held_array(fake, str(100 + a), 1000, partition="batch", uid=1001, comment="x")
    held_array(fake, "50", 3)
    b, _, _ = _backend(fake)
    b.observe()
    b.apply([_act(ActionKind.START, (), ("n1",))])
    fake.calls.clear()
    (job,) = b.observe().snapshot.jobs           # released onto n1, not started: hidden in the line
    assert [m.phase for m in b.groups["50"]] == [Phase.PENDING, Phase.HELD, Phase.HELD]
    squeues = [c for c in fake.calls if c[0] == "squeue"]
    assert [c[-3] if "-j" in c else "all" for c in squeues] == ["all", "50"], squeues
    assert [len(fake(c).stdout.splitlines()) for c in squeues] == [20 + 1, 3]
    fake.run_pending()
    fake.calls.clear()
    (job,) = b.observe().snapshot.jobs           # running: the line holds only held members again
    assert job.nodes == ("n1",) and [m.task for m in b.groups["50"]] == [0, 1, 2]
    squeues = [c for c in fake.calls if c[0] == "squeue"]
    assert squeues == [["squeue", "-h", "-a", "-o", squeues[0][-1]]]
    assert len(fake(squeues[0]).stdout.splitlines()) == 20 + 2     # 20 arrays, the group's held line, its member


def test_an_array_found_no_group_is_not_read_task_by_task_again_while_it_stays():
    fake = FakeSlurm()
    held_array(fake, "50", 3, comment="just a comment")     # another user's array in the harvest partition,
    for t in range(3):                                        # waiting for nodes: its line says nothing of its tasks
        fake.jobs[f"50_{t}"]["reason"] = "Priority"
    held_array(fake, "60", 2)
    b, _, _ = _backend(fake)
    b.observe()
    assert [c[-3] for c in fake.calls if c[0] == "squeue" and "-r" in c] == ["50"]
    assert b.not_groups == {"50"}           # its tag was read: no group tag
    fake.calls.clear()
    b.observe()
    assert not any("-r" in c for c in fake.calls if c[0] == "squeue") and set(b.groups) == {"60"}
    del fake.jobs["50_0"], fake.jobs["50_1"], fake.jobs["50_2"]
    b.observe()
    assert b.not_groups == set()           # forgotten once it left the queue


def test_a_member_that_runs_without_joining_its_group_is_requeued_after_join_timeout_s():
    fake = FakeSlurm()
    held_array(fake, "50", 3)
    b, clock, _ = _backend(fake, join_timeout_s=100)
    b.observe()
    b.apply([_act(ActionKind.START, (), ("n1", "n2", "n3"))])
    fake.run_pending()
    for k in ("50_0", "50_1", "50_2"):
        fake.jobs[k]["start"] = 1000
    assert b.observe().snapshot.jobs[0].nodes == ("n1", "n2", "n3")   # nothing named yet: nothing judged
    b.joined = lambda job: (0, 1) if job == "50" else None
    clock["t"] = 1090.0
    fake.calls.clear()
    assert b.observe().snapshot.jobs[0].nodes == ("n1", "n2", "n3") and _writes(fake) == []
    clock["t"] = 1101.0
    (job,) = b.observe().snapshot.jobs
    assert _writes(fake) == [["scontrol", "requeuehold", "50_2"]] and b.events.recoveries == 1
    assert job.nodes == ("n1", "n2") and b.books["50"].placed() == {0: "n1", 1: "n2"}


def test_an_array_of_multi_node_tasks_is_no_group_and_its_tasks_stay_jobs_of_their_own():
    text = "50|50_0|scavenger|PENDING|JobHeldUser|2||N/A|(null)|100|u|1000\n"
    out, groups = fold(parse_squeue(text), "scavenger", {"50"})
    assert groups == {} and [r.spec for r in out] == ["50_0"]


def test_members_its_owner_started_beyond_the_groups_max_are_requeued_held():
    fake = FakeSlurm()
    held_array(fake, "50", 4)            # the tag allows 3
    b, clock, _ = _backend(fake)
    b.observe()
    b.apply([_act(ActionKind.START, (), ("n1", "n2"))])
    fake.run_pending()
    for k, n in (("50_2", "n3"), ("50_3", "n4")):      # its owner released two more
        fake.jobs[k].update(state="RUNNING", reason="None", nodes=(n,), id=str(int(k[-1]) + 90))
    fake.calls.clear()
    (job,) = b.observe().snapshot.jobs
    assert _writes(fake) == [["scontrol", "requeuehold", "50_3"]]      # one beyond 3, not one the daemon placed
    assert job.nodes == ("n1", "n2", "n3") and job.spec.max_nodes == 3


def test_one_cycle_checks_at_most_max_tag_reads_members_and_a_refused_member_leaves_the_group():
    fake = FakeSlurm()
    held_array(fake, "50", 60, comment=GROUP_TAG.replace("max=3", "max=60"))
    b, clock, _ = _backend(fake, max_tag_reads=10)
    b.observe()
    for r in fake.jobs.values():        # every member released by its owner, none by the daemon
        r["reason"] = "None"
    fake.calls.clear()
    b.observe()
    assert len([c for c in _writes(fake) if c[1] == "uhold"]) == 10     # the rest next cycle
    b.observe()
    assert len([c for c in fake.calls if c[:2] == ["scontrol", "uhold"]]) == 20
    fake2 = FakeSlurm()
    held_array(fake2, "70", 3)
    b2, clock2, _ = _backend(fake2)
    b2.observe()
    b2.apply([Action("70", ActionKind.START, (), ("n1", "n2"), "why", ReasonCode.GAIN)])
    fake2.run_pending()
    b2.observe()
    fake2.jobs["70_1"]["comment"] = GROUP_TAG.replace("grp", "x")     # no longer matches its group
    b2.apply([Action("70", ActionKind.SHRINK, ("n1", "n2"), ("n1",), "why", ReasonCode.GAIN)])
    assert b2.refused_members == {"70": {1}}
    (job,) = b2.observe().snapshot.jobs
    assert job.nodes == ("n1",) and job.spec.max_nodes == 2     # n2 is not the group's any more


def test_without_elastic_groups_the_queue_read_is_as_before_and_no_array_is_adopted():
    """Elastic groups are the operator's choice: off, an array's pending tasks stay one line of the
    queue read (Slurm collapses them) and no array is adopted."""
    fake = FakeSlurm()
    held_array(fake, "50", 4)
    held_job(fake, "60")
    b, _, _ = _backend(fake, elastic_groups=False)
    assert [j.job_id for j in b.observe().snapshot.jobs] == ["60"]
    assert ["squeue", "-h", "-a", "-o", fake.calls[2][-1]] in fake.calls
    assert not any("-r" in c for c in fake.calls if c[0] == "squeue")


def test_a_group_whose_members_all_ended_without_a_result_is_one_ended_job_and_requeued_whole():
    """Every member of a running group ended (a node failure, a crash): the group left the queue
    read, the ended read (-t all -r) gives one ended record that ended as its worst member did,
    and the safety net's requeue puts every member back on hold, each by ARRAY_TASK."""
    fake = FakeSlurm()
    held_array(fake, "50", 3)
    b, clock, _ = _backend(fake)
    b.observe()
    b.apply([_act(ActionKind.START, (), ("n1", "n2"))])
    assert _running(b, fake).nodes == ("n1", "n2")
    fake.end("50_0", "COMPLETED")
    fake.end("50_1", "NODE_FAIL")
    obs = b.observe()
    assert [j.job_id for j in obs.snapshot.jobs] == ["50"]      # a spare is still queued: the group lives
    assert obs.ended == {}
    fake.end("50_2", "TIMEOUT")                                # ... until its last member goes too
    fake.jobs["50_2"]["id"] = "77"
    obs = b.observe()
    assert obs.snapshot.jobs == () and set(obs.ended) == {"50"} and obs.ended["50"].state == "NODE_FAIL"
    assert any(c[:2] == ["squeue", "-h"] and "-r" in c and "all" in c for c in fake.calls)
    # a verdict that waits (its file not read to the end yet) finds the group ended the next cycle too
    assert set(b.observe().ended) == {"50"} and set(b.observe().ended) == {"50"}
    fake.calls.clear()
    assert b.requeue_held("50", "ended NODE_FAIL without a final result")
    assert sorted(c for c in _writes(fake)) == [["scontrol", "requeuehold", f"50_{t}"] for t in range(3)]
    (job,) = b.observe().snapshot.jobs
    assert job.job_id == "50" and job.nodes == () and "50" in b.books


def test_an_ended_group_record_ends_as_its_worst_member():
    done = parse_squeue("51|50_0|scavenger|COMPLETED|None|1|n1|1|(null)|100|u|1000\n"
                        "52|50_1|scavenger|FAILED|NonZeroExitCode|1|n2|1|(null)|100|u|1000\n")
    assert ended_record("50", tuple(done)).state == "FAILED"
    assert ended_record("50", tuple(done[:1])).state == "COMPLETED"
    cancelled = parse_squeue("53|50_2|scavenger|CANCELLED|None|1|n3|1|(null)|100|u|1000\n")
    assert ended_record("50", (*done, *cancelled)).state == "CANCELLED"     # someone chose the end: left alone
    queued = parse_squeue("50|50_2|scavenger|PENDING|JobHeldUser|1||N/A|(null)|100|u|1000\n")
    assert ended_record("50", (*done, *queued)) is None and ended_record("50", ()) is None


def test_a_group_that_slurm_preempts_below_its_min_nodes_is_grown_back_by_the_next_plan():
    """A group of min 2 loses one of its two members to a primary job (Slurm requeues that one
    member): the core sees it below min_nodes, and its plan never keeps it there (the plan's
    check refuses that): it grows it back onto free nodes from its held members."""
    from malletrain.core.cycle import reconcile
    from malletrain.core.decide import decide
    from malletrain.domain.config import CoreConfig
    from malletrain.domain.model import Curve, CurvePoint

    fake = FakeSlurm()
    held_array(fake, "50", 3, comment=Tag("grp", 2, 3, "p", 0.5, 0.5, "", group=True).encode())
    b, clock, _ = _backend(fake)
    b.observe()
    b.apply([_act(ActionKind.START, (), ("n1", "n2"))])
    _running(b, fake)
    taken = next(k for k, r in fake.jobs.items() if r["nodes"] == ("n2",))
    fake.jobs[taken].update(state="PENDING", reason="BeginTime", nodes=())     # preempted, requeued by Slurm
    fake.nodes["n2"] = "allocated"
    clock["t"] += 10
    obs = b.observe()
    (job,) = obs.snapshot.jobs
    assert job.nodes == ("n1",) and job.spec.min_nodes == 2 and b.events.preemptions == 1
    linear = Curve({n: CurvePoint(10.0 * n, 10.0 * n, 10.0 * n) for n in range(1, 4)}, None, "oracle")
    plan = decide(obs.snapshot, {"50": linear}, CoreConfig(policy="oracle"))
    assert len(plan.allocations["50"]) == 3 and "n2" not in plan.allocations["50"]
    b.apply(reconcile(obs.snapshot, plan))
    fake.run_pending()
    obs = b.observe()
    (job,) = obs.snapshot.jobs
    # the spare that was held starts at once: back at min; the preempted member was pending when
    # this cycle read it, so it is held again and starts with the next plan
    assert set(job.nodes) == {"n1", "n3"}
    clock["t"] += 60
    obs = b.observe()
    plan = decide(obs.snapshot, {"50": linear}, CoreConfig(policy="oracle"))
    assert len(plan.allocations["50"]) == 3, plan.reasons
    b.apply(reconcile(obs.snapshot, plan))
    fake.run_pending()
    (job,) = b.observe().snapshot.jobs
    assert set(job.nodes) == {"n1", "n3", "n4"}


def test_a_task_list_is_counted_before_it_is_listed_and_a_bad_one_is_none():
    assert array_tasks("0-4095", MAX_MEMBERS) == tuple(range(4096)) and array_tasks("0-4096", MAX_MEMBERS) is None
    assert array_tasks("0-9999999", MAX_MEMBERS) is None            # counted, never listed
    assert array_tasks("5,1-3,3", 10) == (1, 2, 3, 5) and array_tasks("0-8:4", 10) == (0, 4, 8)
    for bad in ("", "3-1", "0-9:0", "1,,2", "a", "1-", "0-3...", "1," * 40000):
        assert array_tasks(bad, 10**6) is None, bad[:20]
    assert all_held("JobHeldUser,job requeued in held state") and not all_held("JobHeldUser,Resources")


def test_group_reads_are_capped_only_for_arrays_read_task_by_task_and_a_requeue_within_the_member_checks(monkeypatch):
    """Arrays whose one pending line says it all cost no read and no cap: 500 of one user's held
    group arrays cannot keep another user's newer group from being adopted.  The safety net's
    requeue of an ended group writes at most max_tag_reads members a cycle."""
    import malletrain.slurm.adapter as adapter
    monkeypatch.setattr(adapter, "MAX_GROUP_READ", 1)
    fake = FakeSlurm()
    for gid in ("50", "60", "70"):
        held_array(fake, gid, 2)
    b, clock, _ = _backend(fake)
    b.observe()
    assert set(b.groups) == {"50", "60", "70"} and not any("-r" in c for c in fake.calls if c[0] == "squeue")
    fake2 = FakeSlurm()
    held_array(fake2, "80", 4, comment=GROUP_TAG.replace("max=3", "max=4"))
    b2, clock2, _ = _backend(fake2, max_tag_reads=2)
    b2.observe()
    b2.apply([Action("80", ActionKind.START, (), ("n1", "n2", "n3", "n4"), "why", ReasonCode.GAIN)])
    fake2.run_pending()
    b2.observe()
    for t in range(4):
        fake2.end(f"80_{t}", "NODE_FAIL")
    b2.observe()
    fake2.calls.clear()
    assert b2.requeue_held("80", "ended NODE_FAIL without a final result")
    assert len([c for c in _writes(fake2) if c[1] == "requeuehold"]) == 2      # the rest stay ended
