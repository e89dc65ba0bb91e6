"""Fault tolerance on the real local Slurm cluster (the daemon's safety net, as DLRover does
for elastic jobs): a hung job is detected from its progress records and requeued, same id,
and finishes; a node where malleable jobs keep failing is left out of harvesting, shown in
``status`` and the metrics, and the job finishes elsewhere."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request

import pytest
from live import ROOT, DaemonProc, metrics_records, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.live]


def _cli(cluster, *args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "malletrain", *args], env=dict(cluster.env, PYTHONPATH=ROOT),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_a_hung_job_is_requeued_with_its_id_and_finishes(clean, tmp_path):
    cluster = clean
    # the first run stops reporting after 4 s and keeps running; the limit is
    # max(hang_floor_s 6, 10 x its step time 0.64 s) = 6.4 s of silence
    job = cluster.submit_synth(tmp_path, "hangs", lo=1, hi=1, work=2500, faults=["--hang-after-s", "4"])
    d = DaemonProc(tmp_path, cluster, extra={"daemon": {"hang_floor_s": 6, "hang_factor": 10}}).start()
    try:
        wait_until(lambda: any(r["event"] == "exit" and r.get("reason") == "done"
                               for r in metrics_records(tmp_path, job)), 180, "the job to finish after its hang")
        explain = _cli(cluster, "explain", job, "--state-dir", str(d.state_dir))
    finally:
        d.stop()
    hung = [x for x in d.lines() if x.get("action") == "requeue" and x.get("job") == job]
    assert len(hung) == 1 and hung[0]["reason"].startswith("hung: no progress record for"), hung
    recs = metrics_records(tmp_path, job)
    assert [r["restart"] for r in recs if r["event"] == "start"] == [0, 1]       # same job id, run again
    assert sum(1 for r in recs if r["event"] == "exit" and r.get("reason") == "done") == 1
    assert int(cluster.job_times(job)["Restarts"]) >= 1
    assert "hung: no progress record" in explain, explain


def test_a_node_where_jobs_keep_failing_is_left_out_and_shown(clean, tmp_path):
    cluster = clean
    # only n3 is harvestable at first: the primary job holds the other three
    prim = cluster.sh("sbatch", "--parsable", "-p", "batch", "-N", "3", "-w", "n1,n2,n4", "-o", "/dev/null",
                      "--wrap", "sleep 600").strip()
    wait_until(lambda: cluster.jobs().get(prim, {}).get("state") == "RUNNING", 60, "the primary job to run")
    job = cluster.submit_synth(tmp_path, "flaky-node", lo=1, hi=1, work=600, faults=["--fail-on", "n3"])
    port = 17000 + os.getpid() % 2000
    d = DaemonProc(tmp_path, cluster, extra={"daemon": {
        "node_strikes": 2, "node_cooldown_s": 900, "retry_backoff_s": 1, "max_failures": 5,
        "metrics_port": port}}).start()
    try:
        st = wait_until(lambda: (s := d.status()) and "n3" in s.excluded_nodes and s, 120,
                        "n3 to be left out of harvesting")
        assert "failures or hangs" in st.excluded_nodes["n3"]
        shown = _cli(cluster, "status", "--state-dir", str(d.state_dir))
        assert "node n3 left out of harvesting" in shown, shown
        body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        assert "malletrain_excluded_nodes 1.0" in body
        excluded_at = st.t          # the status that first showed n3 left out
        cluster.sh("scancel", prim)
        wait_until(lambda: any(r["event"] == "exit" and r.get("reason") == "done"
                               for r in metrics_records(tmp_path, job)), 120, "the job to finish on a good node")
    finally:
        d.stop()
    log = d.lines()
    failures = [x for x in log if x.get("action") == "requeue" and x.get("job") == job]
    assert len(failures) == 2 and all("ended FAILED without a final result" in x["reason"] for x in failures)
    later = [x["command"] for x in log if x.get("command") and x["t"] > excluded_at
             and any(str(a).startswith("ReqNodeList=") for a in x["command"])]
    assert later and not any("n3" in a for cmd in later for a in cmd), later
    done = [r for r in metrics_records(tmp_path, job) if r["event"] == "exit"]
    assert done[-1]["reason"] == "done" and done[-1]["node"] != "n3"
    print(json.dumps({"excluded": st.excluded_nodes, "failures": len(failures)}, indent=1))
