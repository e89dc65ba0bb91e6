"""The safety net (malletrain.daemon.recovery) as a pure state machine, then driven by the
daemon against the scripted Slurm: lost work is requeued with the same id, bounded, hung
jobs restart, nodes where jobs keep failing rest."""
from __future__ import annotations

import json
import os

import pytest
from helpers import FakeSlurm, held_array, held_job

from malletrain.daemon.recovery import GIVE_UP, RETRY, Ended, Recovery, RecoveryConfig, Running

CFG = RecoveryConfig(max_failures=2, retry_backoff_s=10, retry_backoff_max_s=15, hang_floor_s=60,
                     hang_factor=10, node_strikes=2, node_cooldown_s=100)


def test_what_ended_without_a_result_is_requeued_at_once_started_after_backoff_then_given_up():
    """Requeued held at once (slurmctld may purge an ended job MinJobAge after it ended: a job left
    ended through its back-off could be lost); the back-off delays its next start (retry_at)."""
    r = Recovery(CFG)
    lost = {"7": Ended("FAILED", False, ("n1",))}
    (d,) = r.step(0, lost, {}, {"7"})
    assert d.kind == RETRY and "failure 1 of at most 2" in d.reason and "FAILED" in d.reason
    assert "after 10s at the earliest" in d.reason and r.retry_at == {"7": 10}
    assert r.step(5, {}, {}, {"7"}) == [] and r.retry_at == {"7": 10}     # held: not started yet
    assert r.step(10, {}, {}, {"7"}) == [] and r.retry_at == {}           # may start again
    (d,) = r.step(20, lost, {}, {"7"})
    assert d.kind == RETRY and "failure 2" in d.reason and r.retry_at == {"7": 35}   # 10 * 2, capped at 15
    r.step(36, {}, {}, {"7"})
    (d,) = r.step(40, lost, {}, {"7"})
    assert d.kind == GIVE_UP and "failed 3 times" in d.reason and r.given_up["7"] == d.reason
    assert r.step(1000, lost, {}, {"7"}) == []                 # held for good: nothing more
    r.step(1001, {}, {}, set())                                # left the queue: forgotten
    assert "7" not in r.failures and "7" not in r.given_up


def test_finished_cancelled_and_unknowable_jobs_are_left_alone():
    r = Recovery(CFG)
    ended = {"1": Ended("COMPLETED", True), "2": Ended("FAILED", True), "3": Ended("CANCELLED", False),
             "4": Ended("COMPLETED", None), "5": Ended("COMPLETED", False), "6": Ended("TIMEOUT", None)}
    r.step(0, ended, {}, set(ended))
    assert sorted(r.retry_at) == ["5", "6"]


# Every terminal state Slurm has (squeue --help), and what the safety net makes of it without a
# final 'done' record: "retry" (lost work, a failure with back-off and a strike), "now" (requeued at
# once, not a failure, no strike) or "left" (someone chose this end).
TERMINAL = {"BOOT_FAIL": "retry", "CANCELLED": "left", "COMPLETED": "retry", "DEADLINE": "left",
            "FAILED": "retry", "NODE_FAIL": "retry", "OUT_OF_MEMORY": "retry", "PREEMPTED": "now",
            "REVOKED": "left", "SPECIAL_EXIT": "left", "TIMEOUT": "retry"}


def test_every_terminal_slurm_state_has_its_verdict():
    from malletrain.slurm.parse import Phase, phase_of
    for state, verdict in TERMINAL.items():
        assert phase_of(state, "None") is Phase.FINISHED, state
        r = Recovery(CFG)
        out = r.step(0, {"7": Ended(state, False, ("n1",))}, {}, {"7"})
        if verdict == "left":
            assert out == [] and not r.retry_at and not r.failures, state
        elif verdict == "now":
            (d,) = out
            assert d.kind == RETRY and "not counted as a failure" in d.reason, state
            assert not r.failures and not r.strikes and not r.retry_at, state
        else:
            (d,) = out
            assert d.kind == RETRY and r.retry_at == {"7": 10} and r.failures == {"7": 1}, state
            assert r.strikes == {"n1": [0]}, state
        done = Recovery(CFG)               # with its final record, every one of them is finished
        assert done.step(0, {"7": Ended(state, True, ("n1",))}, {}, {"7"}) == [] and not done.retry_at
    r = Recovery(CFG)                      # a state word Slurm may add one day: lost work, not finished
    r.step(0, {"7": Ended("SOMETHING_NEW", False)}, {}, {"7"})
    assert r.retry_at == {"7": 10}


def test_a_job_preempted_again_and_again_is_never_given_up():
    """PreemptMode=CANCEL: each time a primary job takes its nodes the job is requeued again;
    preemptions never exhaust max_failures (nothing lost)."""
    r = Recovery(CFG)
    for t in range(0, 100, 10):
        (d,) = r.step(t, {"7": Ended("PREEMPTED", False, ("n1",))}, {}, {"7"})
        assert d.kind == RETRY
        r.step(t + 1, {}, {}, {"7"})       # queued again
    assert not r.given_up and not r.excluded


def test_a_job_that_stops_reporting_is_hung():
    r = Recovery(CFG)
    run = {"7": Running(("n1", "n2"), None, 0.5)}
    assert r.step(0, {}, run, {"7"}) == []                     # first seen running
    assert r.step(500, {}, run, {"7"}) == []                   # never reported: no yardstick
    run = {"7": Running(("n1", "n2"), 510.0, 0.5)}
    assert r.step(520, {}, run, {"7"}) == []
    assert r.step(569, {}, run, {"7"}) == []                   # floor 60 s > 10 x 0.5 s
    (d,) = r.step(571, {}, run, {"7"})
    assert d.kind == RETRY and d.reason.startswith("hung: no progress record for 61s")
    slow = {"8": Running(("n3",), 100.0, 30.0)}                 # 10 x 30 s step time beats the floor
    r.step(50, {}, slow, {"8"})
    assert r.step(399, {}, slow, {"8"}) == []
    assert r.step(401, {}, slow, {"8"})[0].job_id == "8"


def test_nodes_where_jobs_keep_failing_rest_and_come_back():
    r = Recovery(CFG)
    r.step(0, {"1": Ended("NODE_FAIL", False, ("n1", "n2"))}, {}, {"1", "2"})
    assert r.excluded == {}
    r.step(10, {"2": Ended("FAILED", False, ("n2",))}, {}, {"1", "2"})
    assert set(r.excluded) == {"n2"} and "2 malleable-job failures" in r.excluded["n2"][1]
    r.step(200, {}, {}, set())
    assert r.excluded == {}


def test_at_most_a_share_of_the_partition_rests():
    """Strikes come from jobs any user controls: one user's failing whole-partition jobs
    may rest at most max_excluded_share of the nodes."""
    r = Recovery(CFG)
    nodes = tuple(f"n{i}" for i in range(8))
    for t in range(3):
        r.step(t, {f"j{t}": Ended("FAILED", False, nodes)}, {}, {f"j{t}"}, pool_size=8)
    assert len(r.excluded) == 2 and r.not_excluded >= 6      # 25% of 8


def test_state_survives_a_restart():
    r = Recovery(CFG)
    r.step(0, {"7": Ended("FAILED", False, ("n1",))}, {}, {"7"})
    again = Recovery(CFG)
    again.load(json.loads(json.dumps(r.dump())))
    assert again.dump() == r.dump()
    assert again.step(0, {"7": Ended("FAILED", False, ("n1",))}, {}, {"7"}) == []   # handled, once
    assert again.retry_at == {"7": 10} and again.failures == {"7": 1}     # its back-off goes on


# ---------------------------------------------------------------- through the daemon

def _daemon(tmp_path, fake, slurm=None, **extra):
    from malletrain.daemon.loop import Daemon
    from malletrain.slurm.runner import Runner
    cfg = tmp_path / "c.yaml"
    d = {"state_dir": str(tmp_path / "state"), "metrics_port": 0, "interval_s": 2, "rescale_wait_s": 1,
         "retry_backoff_s": 0, "max_failures": 1, "progress_roots": ["/tmp"], **extra}
    cfg.write_text(json.dumps({"daemon": d, **({"slurm": slurm} if slurm else {})}))
    clock = {"t": 1000.0}
    return Daemon(str(cfg), runner=Runner(exec_fn=fake, sleep=lambda s: None, retries=0),
                  clock=lambda: clock["t"]), clock


def _writes(fake):
    return [tuple(c[1:]) for c in fake.calls if c[0] == "scontrol" and c[1] not in ("-o", "show")]


def _tagged(tmp_path, *jobs):
    """A scripted Slurm holding tagged malleable jobs of this user, with their metrics directory."""
    from malletrain.slurm.parse import Tag
    metrics = tmp_path / "m"
    metrics.mkdir()
    os.chmod(tmp_path, 0o755)
    fake = FakeSlurm()
    for j in jobs:
        held_job(fake, j, Tag(f"t{j}", 1, 4, "p", 0, 0, str(metrics)).encode(), uid=os.getuid())
    return fake, metrics


def test_daemon_requeues_lost_work_with_the_same_id_then_holds_it_for_good(tmp_path):
    from malletrain.daemon.status import read_status
    fake, metrics = _tagged(tmp_path, "7", "8")
    d, clock = _daemon(tmp_path, fake)
    try:
        d.cycle_once()
        fake.run_pending()
        clock["t"] += 2
        d.cycle_once()
        assert {j: fake.jobs[j]["state"] for j in ("7", "8")} == {"7": "RUNNING", "8": "RUNNING"}
        (metrics / "8.jsonl").write_text('{"t": 1, "event": "start", "job": "8"}\n'
                                         '{"t": 2, "event": "exit", "reason": "done", "job": "8"}\n')
        fake.end("7", "FAILED")            # crashed: no final record
        fake.end("8", "COMPLETED")          # finished: its "done" record
        fake.calls.clear()
        clock["t"] += 2
        d.cycle_once()
        assert ("requeuehold", "7") in _writes(fake) and ("requeuehold", "8") not in _writes(fake)
        assert fake.jobs["7"]["state"] == "PENDING"                 # same id, back in the queue
        for _ in range(2):
            clock["t"] += 2
            d.cycle_once()
            fake.run_pending()
        assert fake.jobs["7"]["state"] == "RUNNING"
        fake.end("7", "FAILED")              # and once more
        for _ in range(2):
            clock["t"] += 2
            d.cycle_once()
            fake.run_pending()
        st = read_status(str(tmp_path / "state" / "status.json"))
        job7 = st.job("7")
        assert job7.reason_code == "gave-up" and "max_failures 1" in job7.reason
        assert st.counters.recoveries == 2 and st.failures == {"7": 2}
        assert fake.jobs["7"]["state"] == "PENDING"
        fake.calls.clear()
        for _ in range(3):
            clock["t"] += 2
            d.cycle_once()
        assert _writes(fake) == []                                   # held for good: never started again
    finally:
        d.store.close()


def test_a_job_that_failed_after_its_done_record_runs_again_and_a_pruned_one_does_not(tmp_path, caplog):
    """The exit status comes after the last record: a run that wrote 'done' and then exited
    non-zero (the script's own lines after its training: ``sys.exit(1)``, a failed final save)
    ended FAILED and is not finished; it is requeued with the reason.  'done' with COMPLETED, and
    'pruned' (the campaign's verdict) whatever the state, stay final.  Before, any 'done' was
    final whatever Slurm said, and such a job was left as finished."""
    fake, metrics = _tagged(tmp_path, "7", "8", "9")
    d, clock = _daemon(tmp_path, fake, max_failures=3)
    try:
        d.cycle_once()
        fake.run_pending()
        clock["t"] += 2
        d.cycle_once()
        for job, reason in (("7", "done"), ("8", "done"), ("9", "pruned")):
            (metrics / f"{job}.jsonl").write_text(
                f'{{"t": 1, "event": "start", "job": "{job}"}}\n'
                f'{{"t": 2, "event": "exit", "reason": "{reason}", "job": "{job}"}}\n')
        fake.end("7", "FAILED")
        fake.end("8", "COMPLETED")
        fake.end("9", "FAILED")
        fake.calls.clear()
        clock["t"] += 2
        d.cycle_once()
        writes = _writes(fake)
        assert ("requeuehold", "7") in writes
        assert ("requeuehold", "8") not in writes and ("requeuehold", "9") not in writes
        assert d.progress.final == {"7": False, "8": True, "9": True} and d.progress.failed_after_done == {"7"}
        said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("job ")]
        assert len(said) == 1 and said[0].startswith("job 7: ended FAILED after its final 'done' record"), said
        # the next run resumes, writes 'done' and exits 0: finished, nothing more
        for _ in range(2):
            clock["t"] += 2
            d.cycle_once()
            fake.run_pending()
        assert fake.jobs["7"]["state"] == "RUNNING"
        with open(metrics / "7.jsonl", "a") as fh:
            fh.write('{"t": 5, "event": "start", "job": "7", "restart": 1}\n'
                     '{"t": 6, "event": "exit", "reason": "done", "job": "7", "restart": 1}\n')
        fake.end("7", "COMPLETED")
        fake.calls.clear()
        for _ in range(3):
            clock["t"] += 2
            d.cycle_once()
        assert _writes(fake) == [] and d.progress.failed_after_done == set()
    finally:
        d.store.close()


def test_the_final_records_reason_survives_a_daemon_restart():
    from malletrain.daemon.progress import ProgressTail, TailState
    tail = ProgressTail(roots=("/tmp",))
    tail.files["/tmp/a.jsonl"] = TailState(10, 3, None, True, final="done")
    tail.files["/tmp/b.jsonl"] = TailState(10, 4, None, True, final="pruned")
    again = ProgressTail(roots=("/tmp",))
    again.load(json.loads(json.dumps(tail.dump())))
    assert again.files["/tmp/a.jsonl"].final == "done" and again.files["/tmp/b.jsonl"].final == "pruned"
    again.load({"/tmp/c.jsonl": [10, 5, None, True, None, None, None]})      # stored before the reason was
    assert again.files["/tmp/c.jsonl"].done and again.files["/tmp/c.jsonl"].final is None


def test_a_job_queued_again_after_its_work_ended_done_is_cancelled_not_run_twice(tmp_path):
    """The daemon stops a job (requeuehold) in the very second its last step finished and wrote
    its final 'done' record: the copy queued again must not run (it would finish twice)."""
    fake, metrics = _tagged(tmp_path, "9")
    d, clock = _daemon(tmp_path, fake)
    try:
        d.cycle_once()
        fake.run_pending()
        assert fake.jobs["9"]["state"] == "RUNNING"
        (metrics / "9.jsonl").write_text('{"t": 1, "event": "start", "job": "9"}\n')
        clock["t"] += 2
        d.cycle_once()
        # requeued (as by a stop or a preemption) just as it wrote its final record
        fake._scontrol(["requeuehold", "9"])
        with open(metrics / "9.jsonl", "a") as fh:
            fh.write('{"t": 3, "event": "exit", "reason": "done", "job": "9"}\n')
        fake.calls.clear()
        for _ in range(3):
            clock["t"] += 2
            d.cycle_once()
            fake.run_pending()
        writes = _writes(fake)
        assert ("release", "9") not in writes and fake.jobs["9"]["state"] == "CANCELLED"
        assert [c for c in fake.calls if c[0] == "scancel"] == [["scancel", "9"]]
        from malletrain.daemon.status import read_status
        st = read_status(str(tmp_path / "state" / "status.json"))
        assert st.job("9") is None or st.job("9").reason_code == "finished", st.job("9")
    finally:
        d.store.close()


def test_many_jobs_leaving_at_once_are_all_read_over_several_cycles(tmp_path, monkeypatch):
    """More tagged jobs left the queue than one read takes: the rest wait, never forgotten."""
    import malletrain.slurm.adapter as adapter
    monkeypatch.setattr(adapter, "MAX_ENDED_READ", 1)
    metrics = tmp_path / "m"
    metrics.mkdir()
    os.chmod(tmp_path, 0o755)
    from malletrain.slurm.parse import Tag
    fake = FakeSlurm()
    for j in ("11", "12", "13"):      # three owners: each gets its probe at once
        held_job(fake, j, Tag(f"t{j}", 1, 1, "p", 0, 0, str(metrics)).encode(), uid=5000 + int(j))
    fake.nodes = {f"n{i}": "idle" for i in range(1, 4)}
    d, clock = _daemon(tmp_path, fake)
    try:
        for _ in range(3):
            d.cycle_once()
            fake.run_pending()
            clock["t"] += 2
        assert all(fake.jobs[j]["state"] == "RUNNING" for j in ("11", "12", "13"))
        for j in ("11", "12", "13"):
            fake.end(j, "FAILED")
        fake.nodes = {n: "idle" for n in fake.nodes}
        for _ in range(6):
            clock["t"] += 2
            d.cycle_once()
        assert sorted(c[2] for c in fake.calls if c[:2] == ["scontrol", "requeuehold"]) == ["11", "12", "13"]
    finally:
        d.store.close()


def test_a_failed_job_is_requeued_before_slurm_can_forget_it_and_started_after_its_backoff(tmp_path):
    """A site with a short MinJobAge purges an ended job within seconds: the daemon requeues it
    (held) in the cycle it sees it ended, and waits out the back-off before starting it again.
    Before, the requeue itself waited for the back-off, and a job purged meanwhile was lost."""
    fake, _ = _tagged(tmp_path, "7")
    d, clock = _daemon(tmp_path, fake, retry_backoff_s=30, max_failures=3)
    try:
        d.cycle_once()
        fake.run_pending()
        clock["t"] += 2
        d.cycle_once()
        assert fake.jobs["7"]["state"] == "RUNNING"
        fake.end("7", "FAILED")
        fake.calls.clear()
        clock["t"] += 2
        d.cycle_once()
        assert ("requeuehold", "7") in _writes(fake)
        for jid in [j for j, r in fake.jobs.items() if r["state"] in ("FAILED", "COMPLETED", "CANCELLED")]:
            fake.purge(jid)                      # MinJobAge: every ended job forgotten
        assert fake.jobs["7"]["state"] == "PENDING"
        fake.calls.clear()
        for _ in range(10):                      # 20 s < 30 s of back-off: held
            clock["t"] += 2
            d.cycle_once()
            fake.run_pending()
        assert _writes(fake) == [] and fake.jobs["7"]["state"] == "PENDING"
        for _ in range(8):                       # past it: started again, same id
            clock["t"] += 2
            d.cycle_once()
            fake.run_pending()
        assert fake.jobs["7"]["state"] == "RUNNING"
    finally:
        d.store.close()


def test_a_job_that_never_writes_progress_and_exits_0_is_finished_not_run_again(tmp_path):
    """A campaign trial that is a plain script (no malletrain runtime, so no progress file) and
    exits 0 ends COMPLETED: finished as far as anyone can tell, never requeued (it was requeued
    and run again up to max_failures times); the same job ending FAILED is lost work."""
    fake, metrics = _tagged(tmp_path, "7", "8")
    d, clock = _daemon(tmp_path, fake, max_failures=3)
    try:
        d.cycle_once()
        fake.run_pending()
        clock["t"] += 2
        d.cycle_once()
        fake.end("7", "COMPLETED")
        fake.end("8", "FAILED")
        fake.calls.clear()
        for _ in range(3):
            clock["t"] += 2
            d.cycle_once()
        assert ("requeuehold", "7") not in _writes(fake) and ("requeuehold", "8") in _writes(fake)
        assert fake.jobs["7"]["state"] == "COMPLETED"
    finally:
        d.store.close()


@pytest.mark.parametrize("reason,requeued", [("pruned", False), ("failed", False), ("signal", True)])
def test_a_campaign_trial_that_ended_pruned_or_failed_for_good_is_not_requeued(tmp_path, reason, requeued):
    """A trial the campaign's pruner stopped (or that used up the campaign's retries) exits 0 with
    that reason; the daemon takes it as final like ``done``; a ``metric`` record is read past, not
    counted as malformed.  A run that only checkpointed on a signal is requeued (the control)."""
    fake, metrics = _tagged(tmp_path, "8")
    d, clock = _daemon(tmp_path, fake)
    try:
        d.cycle_once()
        fake.run_pending()
        clock["t"] += 2
        d.cycle_once()
        (metrics / "8.jsonl").write_text('{"t": 1, "event": "start", "job": "8"}\n'
                                         '{"t": 2, "event": "metric", "job": "8", "value": 0.1, "prune": true}\n'
                                         f'{{"t": 3, "event": "exit", "reason": "{reason}", "job": "8"}}\n')
        fake.end("8", "COMPLETED")
        fake.calls.clear()
        clock["t"] += 2
        d.cycle_once()
        assert (("requeuehold", "8") in _writes(fake)) == requeued
        assert d.progress.tail.counters.bad == 0          # the metric record is not malformed
    finally:
        d.store.close()


def test_an_elastic_group_whose_members_all_ended_without_a_result_is_requeued_whole_by_the_daemon(tmp_path):
    """Through the daemon (elastic groups on): a group of two running members loses both (a node
    failure, a crash) before its last record: the group's one ended record reaches the safety
    net, which requeues both members held, each by ARRAY_TASK; the metrics count its members.
    A group whose progress file ends 'done' is left alone."""
    from prometheus_client import generate_latest

    from malletrain.slurm.parse import Tag
    metrics = tmp_path / "m"
    metrics.mkdir()
    os.chmod(tmp_path, 0o755)
    fake = FakeSlurm()
    for gid in ("50", "60"):
        held_array(fake, gid, 2, comment=Tag(f"g{gid}", 1, 2, "p", 0, 0, str(metrics), group=True).encode(),
                   uid=os.getuid())
    d, clock = _daemon(tmp_path, fake, slurm={"elastic_groups": True})
    try:
        for _ in range(3):
            d.cycle_once()
            fake.run_pending()
            clock["t"] += 2
        assert {k: r["state"] for k, r in fake.jobs.items()} == dict.fromkeys(("50_0", "50_1", "60_0", "60_1"),
                                                                             "RUNNING")
        scraped = generate_latest(d.metrics.registry).decode()
        assert 'malletrain_group_members{state="running"} 4.0' in scraped, scraped
        (metrics / "60.jsonl").write_text('{"t": 1, "event": "start", "job": "60"}\n'
                                          '{"t": 2, "event": "exit", "reason": "done", "job": "60"}\n')
        fake.end("50_0", "NODE_FAIL")
        fake.end("50_1", "FAILED")
        fake.end("60_0", "COMPLETED")
        fake.end("60_1", "COMPLETED")
        fake.calls.clear()
        for _ in range(2):
            d.cycle_once()
            clock["t"] += 2
        assert sorted(w for w in _writes(fake) if w[0] == "requeuehold") == [("requeuehold", "50_0"),
                                                                             ("requeuehold", "50_1")]
        assert fake.jobs["50_0"]["state"] == "PENDING" and fake.jobs["60_0"]["state"] == "COMPLETED"
        assert d.backend.events.recoveries == 1
    finally:
        d.store.close()
