"""Site policies the daemon must respect, on a cluster that has them (issue #22).

``PreemptMode=CANCEL`` on the harvest partition: the malleable job Slurm preempts for a primary
job ends PREEMPTED (not requeued by Slurm, and its batch script sees it ending); the daemon's
safety net requeues it, same id, without counting a failure, and it finishes exactly once
(before, PREEMPTED counted as a job still moving and was never requeued: the work was lost).

Association limits enforced (``limits``): an owner's ``GrpTRES`` node limit, which Slurm lifts for
a job whose node count an operator set (this test measures it), holds for the daemon's resizes.
"""
from __future__ import annotations

import os
import signal
import time

import hostlist
import pytest
from live import TEST_USERS, DaemonProc, User, honest_job, metrics_records, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.live]
CLUSTER_ARGS = ("--preempt-mode", "cancel", "--enforce-limits")
ALICE = TEST_USERS[0]


def test_a_job_slurm_cancels_for_a_primary_job_is_requeued_and_finishes_once(clean, tmp_path):
    cluster = clean
    job = cluster.submit_synth(tmp_path, "cancelled-by-preemption", lo=4, hi=4, work=8000, rate=100.0,
                               checkpoint_s=1.0)
    # vacate_lead_s 0: the daemon does not give the nodes back first, Slurm preempts
    d = DaemonProc(tmp_path, cluster, vacate_lead_s=0).start()
    try:
        wait_until(lambda: any(r["event"] == "progress" for r in metrics_records(tmp_path, job)), 90,
                   "the malleable job to run and report")
        # the daemon gives nodes back itself when it sees a primary job due on them: paused, it
        # cannot, and Slurm's preemption (CANCEL) ends the job PREEMPTED
        os.kill(d.proc.pid, signal.SIGSTOP)
        try:
            prim = cluster.sh("sbatch", "--parsable", "-p", "batch", "-N", "4", "-o", "/dev/null",
                              "--wrap", "sleep 8").strip()
            wait_until(lambda: "PREEMPTED" in cluster.sh("squeue", "-h", "-t", "all", "-j", job, "-o", "%T"),
                       60, "Slurm to cancel the malleable job for the primary job")
        finally:
            os.kill(d.proc.pid, signal.SIGCONT)
        wait_until(lambda: any("PREEMPTED" in x.get("reason", "") or "cancelled it for a primary job"
                               in x.get("reason", "") for x in d.lines() if x.get("job") == job), 120,
                   "the daemon to requeue the preempted job")
        wait_until(lambda: any(r["event"] == "exit" and r.get("reason") == "done"
                               for r in metrics_records(tmp_path, job)), 240, "the job to finish")
    finally:
        d.stop()
    requeues = [x for x in d.lines() if x.get("action") == "requeue" and x.get("job") == job]
    assert len(requeues) == 1 and "not counted as a failure" in requeues[0]["reason"], requeues
    assert "ended PREEMPTED" in requeues[0]["reason"]
    recs = metrics_records(tmp_path, job)
    assert sum(1 for r in recs if r["event"] == "exit" and r.get("reason") == "done") == 1
    assert max(r["restart"] for r in recs) >= 1                  # the same job id ran again
    assert cluster.job_times(prim)["JobState"] == "COMPLETED"
    st = d.status()
    assert st is not None and not any(j.job == job and j.reason_code == "gave-up" for j in st.jobs)


def test_an_owners_association_node_limit_holds_for_the_daemons_resizes(clean, users, user_conf, tmp_path):
    cluster = clean
    alice = User(users[ALICE], user_conf, cluster.bin)
    cluster.sh("sacctmgr", "-i", "modify", "user", ALICE, "set", "GrpTRES=node=2")
    d = None
    try:
        # alice's own 1-node job runs on n4: her limit leaves her 1 more node
        own = alice.sbatch("-p", "batch", "-N", "1", "-w", "n4", "-o", "/dev/null", "--wrap", "sleep 600")
        wait_until(lambda: cluster.jobs().get(own, {}).get("state") == "RUNNING", 30, "alice's own job to run")
        # what Slurm does alone: an operator's resize to 2 (3 nodes in all) lifts the limit
        probe = alice.sbatch("-p", "scavenger", "-N", "1", "--hold", "-o", "/dev/null", "--wrap", "sleep 60")
        cluster.as_operator("scontrol", "update", f"jobid={probe}", "NumNodes=2-2", "ReqNodeList=n[1-2]",
                     "StartTime=now")
        cluster.as_operator("scontrol", "release", probe)
        slurm_alone = wait_until(lambda: cluster.jobs().get(probe, {}).get("state") == "RUNNING" and "RUNNING",
                                 30, "the operator-resized job to start beyond its owner's limit")
        cluster.sh("scancel", probe)
        wait_until(lambda: cluster.jobs().get(probe, {}).get("state") not in ("RUNNING", "COMPLETING"), 30,
                   "the probe job to end")
        # the daemon: alice's well-scaling job would take all 3 idle nodes; it may hold 1
        job = honest_job(alice, "limited", 0.02)
        d = DaemonProc(tmp_path, cluster, extra={"daemon": {"progress_roots": ["/home"]},
                                                 "slurm": {"limits_every": 1}}).start()
        sizes = []

        def size() -> int:
            st = d.status()
            return next((j.size for j in st.jobs if j.job == job), 0) if st else 0
        wait_until(lambda: size() >= 1 and metrics_records(tmp_path, job) is not None, 90, "alice's job to run")
        for _ in range(25):                      # 25 s more: never beyond 1 (Slurm's word too)
            sizes.append(size())
            nodes = cluster.jobs().get(job, {}).get("nodes", "")
            assert len(hostlist.expand_hostlist(nodes)) <= 1 if nodes else True, nodes
            time.sleep(1)
        assert max(sizes) == 1, sizes
    finally:
        if d is not None:
            d.stop()
        cluster.sh("scancel", "-u", ALICE, check=False)
        cluster.sh("sacctmgr", "-i", "modify", "user", ALICE, "set", "GrpTRES=node=-1")
    assert slurm_alone == "RUNNING"
