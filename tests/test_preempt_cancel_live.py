"""A site that cancels preempted jobs (``PreemptMode=CANCEL`` on the harvest partition): the
malleable job Slurm preempts for a primary job ends PREEMPTED (not requeued by Slurm, and its
batch script sees it ending); the daemon's safety net requeues it, same id, without counting a
failure, and it finishes exactly once (issue #22: before, PREEMPTED counted as a job still moving
and was never requeued: the work was lost)."""
from __future__ import annotations

import pytest
from live import DaemonProc, metrics_records, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.live]
CLUSTER_ARGS = ("--preempt-mode", "cancel")


def test_a_job_slurm_cancels_for_a_primary_job_is_requeued_and_finishes_once(clean, tmp_path):
    cluster = clean
    job = cluster.submit_synth(tmp_path, "cancelled-by-preemption", lo=4, hi=4, work=8000, rate=100.0,
                               checkpoint_s=1.0)
    # vacate_lead_s 0: the daemon does not give the nodes back first, Slurm preempts
    d = DaemonProc(tmp_path, cluster, vacate_lead_s=0).start()
    try:
        wait_until(lambda: any(r["event"] == "progress" for r in metrics_records(tmp_path, job)), 90,
                   "the malleable job to run and report")
        prim = cluster.sh("sbatch", "--parsable", "-p", "batch", "-N", "4", "-o", "/dev/null",
                          "--wrap", "sleep 8").strip()
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
