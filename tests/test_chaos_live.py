"""Chaos on the real local Slurm cluster: nothing is lost, nothing runs twice.

A campaign of 12 real PyTorch trials (the digits MLP, srun-launched, 1-2 nodes each) runs under
the daemon while, from a seeded random schedule:

* primary jobs preempt the harvest partition at random moments, some aimed at a trial's node in
  the first second after it started (before the training process is up);
* the daemon is killed with SIGKILL at random points three times and started again;
* slurmctld is stopped and started once;
* the campaign driver (``malletrain campaign submit``) runs every 20 s, as a user's cron would.

Every trial must end exactly once with its final result: ``campaign status`` shows 12/12 done
with the final step and a metric, and over every job a trial ever had there is exactly one
final ``done`` record.
"""
from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import time

import pytest
from live import GRACE_S, ROOT, SCRIPT, TEST_DIR, DaemonProc

from malletrain.slurm.parse import expand

pytestmark = [pytest.mark.slow, pytest.mark.live, pytest.mark.torch]

EXAMPLE = os.path.join(ROOT, "examples", "train", "digits_train.py")
STEPS = 1500
SEED = int(os.environ.get("MALLETRAIN_CHAOS_SEED", "20261125"))


def _records(path: str) -> list[dict]:
    out = []
    try:
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if isinstance(rec, dict):
                    out.append(rec)
    except FileNotFoundError:
        pass
    return out


@pytest.mark.timeout(1500)
def test_campaign_survives_preemptions_daemon_kills_and_a_slurmctld_restart(clean, tmp_path):
    cluster = clean
    rng = random.Random(SEED)
    spec = tmp_path / "chaos.yaml"
    spec.write_text(json.dumps({
        "name": "chaos", "kind": "hpo", "command": [sys.executable, EXAMPLE], "dir": "camp",
        "search": "grid", "metric": "val_acc", "goal": "max",
        "space": {"lr": [0.02, 0.05, 0.1], "depth": [1, 2], "width": [16, 32]},
        "fixed": {"arch": "mlp", "steps": STEPS, "workers": 2, "micro_batch": 8, "eval_every": 500,
                  "checkpoint_every_s": 1.0},
        "job": {"min_nodes": 1, "max_nodes": 2, "grace_s": GRACE_S, "rescale_up_s": 3,
                "rescale_down_s": 2}}))
    env = dict(cluster.env, PYTHONPATH=ROOT)
    camp = tmp_path / "camp"

    def campaign(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "malletrain", "campaign", *args, str(spec)],
                              env=env, capture_output=True, text=True, timeout=120)

    trial_jobs: dict[str, set[str]] = {}

    def note_jobs() -> None:
        try:
            st = json.loads((camp / "campaign.json").read_text())
        except (OSError, ValueError):
            return
        for t in st["trials"]:
            if t.get("job"):
                trial_jobs.setdefault(t["id"], set()).add(str(t["job"]))

    out = campaign("submit")
    assert out.returncode == 0, out.stderr
    note_jobs()
    assert len(trial_jobs) == 12

    extra = {"daemon": {"retry_backoff_s": 2, "hang_floor_s": 120}}
    d = DaemonProc(tmp_path, cluster, extra=extra).start()
    t0 = time.time()
    kills = sorted(rng.uniform(15, 150) for _ in range(3))
    ctld_at = rng.uniform(40, 120)
    events: list[tuple[float, str]] = []
    aimed, primaries, driver_failures, seen_running = 0, 0, 0, set()
    next_primary = t0 + rng.uniform(5, 12)
    next_driver = t0 + 20
    chaos_until = t0 + 170

    def all_done() -> bool:
        out = campaign("status", "--json")
        if out.returncode != 0:
            return False
        rows = json.loads(out.stdout)
        return len(rows) == 12 and all(r["state"] == "done" for r in rows)

    try:
        while True:
            now = time.time()
            if now > t0 + 1200:
                raise AssertionError(f"the campaign did not finish in 20 min; events: {events}")
            note_jobs()
            if now < chaos_until:
                if kills and now - t0 >= kills[0]:
                    kills.pop(0)
                    d.stop(signal.SIGKILL)
                    events.append((now - t0, "kill -9 daemon"))
                    time.sleep(rng.uniform(0, 3))
                    d = DaemonProc(tmp_path, cluster, extra=extra).start()
                if ctld_at and now - t0 >= ctld_at:
                    ctld_at = 0
                    subprocess.run(["bash", SCRIPT, "stop-ctld", "--dir", TEST_DIR], env=cluster.env,
                                   check=True, timeout=60)
                    events.append((now - t0, "slurmctld stopped"))
                    time.sleep(rng.uniform(3, 8))
                    subprocess.run(["bash", SCRIPT, "start-ctld", "--dir", TEST_DIR], env=cluster.env,
                                   check=True, timeout=60)
                    events.append((time.time() - t0, "slurmctld started"))
                    continue
                ours = {j for js in trial_jobs.values() for j in js}
                try:
                    running = {j: r["nodes"] for j, r in cluster.jobs().items()
                               if j in ours and r["state"] == "RUNNING"}
                except (RuntimeError, subprocess.TimeoutExpired):
                    running = {}         # slurmctld is down
                for job, nodes in running.items():       # aim at a trial in its first second
                    if job not in seen_running and aimed < 4 and rng.random() < 0.35:
                        node = expand(nodes)[0]
                        cluster.sh("sbatch", "-p", "batch", "-N", "1", "-w", node, "-o", "/dev/null",
                                   "--wrap", f"sleep {rng.uniform(2, 5):.1f}", check=False)
                        aimed += 1
                        events.append((now - t0, f"primary aimed at job {job} on {node} as it started"))
                seen_running |= set(running)
                if now >= next_primary:
                    k = rng.choice([1, 1, 2, 4])
                    cluster.sh("sbatch", "-p", "batch", "-N", str(k), "-o", "/dev/null",
                               "--wrap", f"sleep {rng.uniform(2, 8):.1f}", check=False)
                    primaries += 1
                    events.append((now - t0, f"primary on {k} node(s)"))
                    next_primary = now + rng.uniform(6, 15)
            if now >= next_driver:
                out = campaign("submit")          # fails while slurmctld is down: cron tries again
                driver_failures += out.returncode != 0
                next_driver = now + 20
                note_jobs()
                if now > chaos_until and all_done():
                    break
            assert d.alive() or d.proc.returncode in (None, -signal.SIGKILL), "the daemon died on its own"
            time.sleep(0.4)
    finally:
        d.stop()

    # ------------------------------------------------ every trial exactly once, with its result
    out = campaign("status", "--json")
    rows = json.loads(out.stdout)
    assert len(rows) == 12 and all(r["state"] == "done" for r in rows), rows
    assert all(r["step"] == STEPS and r["metric"] is not None for r in rows), rows
    metrics = camp / "metrics"
    done_per_trial = {}
    preempted_runs = 0
    for trial, jobs in trial_jobs.items():
        recs = [r for j in jobs for r in _records(str(metrics / f"{j}.jsonl"))]
        done_per_trial[trial] = sum(1 for r in recs if r.get("event") == "exit" and r.get("reason") == "done")
        preempted_runs += sum(1 for r in recs if r.get("event") == "start") - 1
        result = json.loads((camp / trial / "ckpt" / "result.json").read_text())
        assert result["final"] and result["step"] == STEPS, (trial, result)
    assert all(n == 1 for n in done_per_trial.values()), done_per_trial
    ctld_log = open(os.path.join(TEST_DIR, "log", "slurmctld.log"), errors="replace").read()
    ours = {j for js in trial_jobs.values() for j in js}
    preemptions = [j for j in re.findall(r"preempted JobId=(\d+) has been requeued", ctld_log) if j in ours]
    daemon_kills = sum(1 for _, e in events if e.startswith("kill"))
    assert daemon_kills == 3 and any(e == "slurmctld started" for _, e in events)
    assert preemptions, "no trial was preempted: the chaos did not happen"
    assert aimed >= 1, "no primary job was aimed at a trial in its first second"
    report = {"seed": SEED, "trials": len(rows), "trials_done": sum(r["state"] == "done" for r in rows),
              "trials_lost": sum(1 for n in done_per_trial.values() if n == 0),
              "campaign_driver_runs_failed": driver_failures,
              "final_results_per_trial": sorted(set(done_per_trial.values())),
              "primary_jobs": primaries + aimed, "aimed_at_starting_trials": aimed,
              "slurm_preemptions_of_trials": len(preemptions), "restarts_of_trial_runs": preempted_runs,
              "resubmitted_trials": sum(len(j) - 1 for j in trial_jobs.values()),
              "daemon_kill9": daemon_kills, "slurmctld_restarts": 1, "wall_s": round(time.time() - t0)}
    print(json.dumps(report, indent=1))
    print("\n".join(f"{t:6.1f}s {e}" for t, e in events))
    if os.environ.get("MALLETRAIN_RESULTS_DIR"):
        with open(os.path.join(os.environ["MALLETRAIN_RESULTS_DIR"], "chaos-live.json"), "w") as fh:
            json.dump({"report": report, "events": events}, fh, indent=1)
