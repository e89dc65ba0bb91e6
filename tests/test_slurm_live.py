"""Against a real Slurm cluster: slurmctld + 4 slurmd started by scripts/local-slurm.sh.

These need root (slurmd) and Debian's Slurm packages, which the script installs;
CI runs them through the README's test command.  Nothing here is faked: the
jobs are sbatch jobs running the synthetic malleable job, the daemon is the
``malletrain daemon`` process.
"""
from __future__ import annotations

import dataclasses
import json
import os
import pwd
import signal
import subprocess
import sys
import time

import pytest
from helpers import torchrun, worker_pids
from live import GRACE_S, OPERATOR, VERSIONS, DaemonProc, metrics_records, wait_until

from malletrain.domain.config import DaemonConfig, SlurmConfig
from malletrain.domain.model import Action, ActionKind, ReasonCode
from malletrain.slurm.adapter import SlurmBackend
from malletrain.slurm.parse import parse_tag
from malletrain.slurm.runner import Runner, SlurmCommandError
from malletrain.slurm.submit import find_token, submit

pytestmark = [pytest.mark.slow, pytest.mark.live]

# The scenarios every Slurm release runs (the host's 22.05, 24.11 and 26.05 from cached
# Debian roots): the backend contract, grow/shrink keeping the job id, preemption within
# GraceTime with proactive vacate, re-adoption after kill -9, a slurmctld outage.  The rest
# (reactive give-back's start delay, PyTorch trials, campaigns, reload, submit retries) run on
# the host's.
MATRIX = pytest.mark.parametrize("cluster", VERSIONS, indirect=True)


def keep_figures(name: str, data: dict, tmp_path) -> None:
    """Write measured figures to the test's tmp dir, and to $MALLETRAIN_RESULTS_DIR when
    set (benchmarks/slurm.sh sets it); tests never write into the source tree."""
    print(json.dumps(data, indent=1))
    for d in (str(tmp_path), os.environ.get("MALLETRAIN_RESULTS_DIR")):
        if d:
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, name), "w") as fh:
                json.dump(data, fh, indent=1)


def _ours(cluster) -> dict[str, dict]:
    return {j: r for j, r in cluster.jobs().items() if parse_tag(cluster.comment(j)) is not None}


def _running_nodes(cluster) -> dict[str, str]:
    return {j: r["nodes"] for j, r in _ours(cluster).items() if r["state"] == "RUNNING"}


# ---------------------------------------------------------------- backend contract

def _cli_backend(cluster, tmp):
    runner = cluster.runner(timeout_s=10)
    return SlurmBackend(runner, SlurmConfig(), DaemonConfig(state_dir=str(tmp), rescale_wait_s=30))


def _pyslurm_backend(cluster, tmp):
    from malletrain.slurm.pyslurm_backend import PyslurmBackend, available
    ok, why = available(Runner(slurm_conf=cluster.conf))
    if not ok:
        pytest.skip(f"pyslurm backend not testable here: {why}")
    return PyslurmBackend(cluster.conf, SlurmConfig(), DaemonConfig(state_dir=str(tmp)))


@MATRIX
def test_backend_contract(clean, tmp_path):
    """observe sees idle nodes and held jobs; START/GROW/SHRINK/STOP keep the job id."""
    _contract(clean, tmp_path, _cli_backend(clean, tmp_path))


def test_pyslurm_backend_contract(clean, tmp_path):
    _contract(clean, tmp_path, _pyslurm_backend(clean, tmp_path))


def _contract(cluster, tmp_path, backend):
    job = cluster.submit_synth(tmp_path, "contract")
    obs = backend.observe()
    assert sorted(n.name for n in obs.snapshot.nodes) == ["n1", "n2", "n3", "n4"]
    (st,) = [j for j in obs.snapshot.jobs if j.job_id == job]
    assert st.nodes == () and (st.spec.min_nodes, st.spec.max_nodes) == (1, 4)

    def act(kind, frm, to):
        backend.apply([Action(job, kind, tuple(frm), tuple(to), "test", ReasonCode.GAIN)])

    def started(nodes, restart):   # the job's process is up (not only Slurm's record)
        return any(r["event"] == "start" and r["nodes"] == nodes and r["restart"] == restart
                   for r in metrics_records(tmp_path, job))

    act(ActionKind.START, (), ("n2",))
    wait_until(lambda: _running_nodes(cluster).get(job) == "n2", 30, "start on n2")
    wait_until(lambda: started(1, 0), 30, "the job's process on 1 node")
    backend.observe()
    act(ActionKind.GROW, ("n2",), ("n2", "n3", "n4"))
    wait_until(lambda: _running_nodes(cluster).get(job) == "n[2-4]", 40, "grow to n[2-4]")
    wait_until(lambda: started(3, 1), 30, "the job's process on 3 nodes")
    backend.observe()
    act(ActionKind.SHRINK, ("n2", "n3", "n4"), ("n3",))
    wait_until(lambda: _running_nodes(cluster).get(job) == "n3", 40, "shrink to n3")
    # wait for the process too: a stop before it starts leaves no restart-2 record
    wait_until(lambda: started(1, 2), 30, "the job's process on 1 node after the shrink")
    backend.observe()
    act(ActionKind.STOP, ("n3",), ())
    wait_until(lambda: _ours(cluster)[job]["state"] == "PENDING", 40, "stop (held)")
    assert list(_ours(cluster)) == [job]
    assert cluster.job_times(job)["Restarts"] == "3"
    recs = metrics_records(tmp_path, job)
    assert {r["nodes"] for r in recs} >= {1, 3} and max(r["restart"] for r in recs) == 2


def test_command_timeout_is_a_clear_error(cluster):
    r = cluster.runner(timeout_s=0.001, retries=0)
    with pytest.raises(SlurmCommandError, match="timed out") as err:
        r.read(["squeue", "-h"])
    assert err.value.argv == [os.path.join(cluster.bin, "squeue"), "-h"]


def test_submit_is_idempotent_when_sbatch_times_out_after_submitting(clean, tmp_path):
    """sbatch succeeded but its reply was lost: the retry finds the token, no duplicate."""
    calls = []

    def lossy(argv, **kw):
        calls.append(os.path.basename(argv[0]))
        out = subprocess.run(argv, **kw)
        if calls[-1] == "sbatch" and calls.count("sbatch") == 1:
            raise subprocess.TimeoutExpired(argv, kw["timeout"])
        return out

    runner = clean.runner(exec_fn=lossy)
    script = tmp_path / "j.sh"
    script.write_text("#!/bin/bash\nsleep 100\n")
    tag = "malletrain:v1 token=idem42 min=1 max=2 profile=p up=0 down=0 metrics="
    argv = ["sbatch", "--parsable", "-p", "scavenger", "-N", "1", "--hold", "--requeue",
            f"--comment={tag}", "-o", "/dev/null", str(script)]
    job = submit(runner, argv, "idem42", "scavenger")
    assert calls.count("sbatch") == 1
    assert [j for j in clean.jobs() if "idem42" in clean.comment(j)] == [job]
    assert find_token(runner, "idem42", "scavenger") == job


# ---------------------------------------------------------------- daemon behaviour

@MATRIX
def test_jobs_grow_and_shrink_as_nodes_come_and_go(clean, tmp_path):
    cluster = clean
    a = cluster.submit_synth(tmp_path, "a", alpha=0.05)
    b = cluster.submit_synth(tmp_path, "b", alpha=0.3)
    d = DaemonProc(tmp_path, cluster).start()
    try:
        assert d.uid() == pwd.getpwnam(OPERATOR).pw_uid != 0   # the service account, never root
        # Both start and report; then the daemon holds all 4 nodes.  How it splits them is
        # the policy's call from what it measured (both at 2 nodes, or all 4 to the job that
        # scales better while the other waits held): the test asserts what holds either way.
        def harvesting():
            st = d.status()
            reported = [len(metrics_records(tmp_path, j)) for j in (a, b)]
            return (st and st.idle_nodes == 0 and sum(j.size for j in st.jobs) == 4
                    and all(reported) and sum(reported) > 20)
        wait_until(harvesting, 90, "both jobs to report and the daemon to hold all 4 nodes")
        # garbage in a running job's progress file is skipped and counted, never fatal
        busy = max(d.status().jobs, key=lambda j: j.size).job
        with open(tmp_path / "metrics" / f"{busy}.jsonl", "a") as fh:
            fh.write('{"t": "soon", "samples": 1}\nnot json at all\n' + "x" * 10000 + "\n")
        wait_until(lambda: d.status().counters.progress_lines_skipped >= 3, 30,
                   "the daemon to skip the garbage lines")
        # a primary job takes half the machine: malleable jobs must make room
        prim = cluster.sh("sbatch", "--parsable", "-p", "batch", "-N", "2", "-o", "/dev/null",
                          "--wrap", "sleep 25").strip()
        wait_until(lambda: cluster.jobs().get(prim, {}).get("state") == "RUNNING", 60,
                   "the primary job to start")
        wait_until(lambda: cluster.jobs().get(prim, {}).get("state") not in ("RUNNING", "COMPLETING"),
                   60, "the primary job to end")
        # ...and when it is gone they take the nodes back
        def all_nodes_harvested():
            st = d.status()
            return st and st.idle_nodes == 0 and sum(j.size for j in st.jobs) == 4
        wait_until(all_nodes_harvested, 90, "malleable jobs to hold all 4 nodes again")
        # the pauses its changes really cost are measured and shown beside the configured ones
        learned = {j.job: j.rescale for j in d.status().jobs}
        assert all(r is not None for r in learned.values()) and any(r.up_n >= 1 for r in learned.values()), learned
        assert all(0 < r.up_s < 120 for r in learned.values() if r.up_n), learned
        keep_figures(f"learned-pauses-{cluster.release}.json",
                     {j: dataclasses.asdict(r) for j, r in learned.items()}, tmp_path)
        ours = _ours(cluster)
        assert sorted(ours) == sorted([a, b]), "job ids must survive rescales"
        sizes = {j: {r["nodes"] for r in metrics_records(tmp_path, j) if r["event"] == "progress"}
                 for j in (a, b)}
        restarts = {j: max(r["restart"] for r in metrics_records(tmp_path, j)) for j in (a, b)}
        assert any(len(s) >= 2 for s in sizes.values()), sizes
        assert max(restarts.values()) >= 1, restarts
        # steady state: a cycle with no change costs at most 3 read commands
        wait_until(lambda: (d.status().last_cycle is not None and d.status().last_cycle.writes == 0), 30,
                   "a steady cycle")
        steady = []
        for _ in range(6):
            lc = d.status().last_cycle
            if lc is not None and lc.writes == 0:
                steady.append(lc.reads)
            time.sleep(2.1)
        assert steady and max(steady) <= 3, steady
        text = subprocess.run([os.sys.executable, "-m", "malletrain", "status", "--state-dir",
                               str(d.state_dir)], capture_output=True, text=True, env=cluster.env)
        assert text.returncode == 0 and "LAST ACTION" in text.stdout
        listed = {line.split()[0] for line in text.stdout.splitlines()[2:]}
        assert listed == {a, b}, text.stdout
        why = subprocess.run([os.sys.executable, "-m", "malletrain", "explain", a, "--state-dir",
                              str(d.state_dir)], capture_output=True, text=True, env=cluster.env)
        assert why.returncode == 0 and "why:" in why.stdout and "recent changes" in why.stdout
        assert "rescale pauses: up" in why.stdout and ("learned from" in why.stdout or learned[a].up_n == 0)
        # the backend read the release once and said what differs (slurm/versions.py)
        said = [x for x in d.lines() if "slurm_release" in x]
        assert [x["slurm_release"] for x in said] == [cluster.release], said
    finally:
        assert d.stop() == 0
    assert sorted(_ours(cluster)) == sorted([a, b]), "SIGTERM must not cancel jobs"
    assert any("stopping after cycle" in x.get("msg", "") for x in d.lines())


def _primary_delay(cluster, tmp_path, vacate_lead_s: float) -> dict:
    """A primary job B (4 nodes) waits for primary A (2 nodes); a malleable job
    holds the other 2.  Delay = B's start - A's end."""
    cluster.clean()
    a = cluster.sh("sbatch", "--parsable", "-p", "batch", "-N", "2", "-w", "n[1-2]", "-t", "1",
                   "-o", "/dev/null", "--wrap", "sleep 35").strip()
    wait_until(lambda: cluster.jobs()[a]["state"] == "RUNNING", 30, "primary job A to start")
    m = cluster.submit_synth(tmp_path, f"m{int(vacate_lead_s)}", lo=1, hi=2, checkpoint_s=3.0)
    d = DaemonProc(tmp_path, cluster, vacate_lead_s=vacate_lead_s,
                   name=f"daemon-vacate{int(vacate_lead_s)}").start()
    try:
        wait_until(lambda: _running_nodes(cluster).get(m) == "n[3-4]", 60, "malleable job on n[3-4]")
        b = cluster.sh("sbatch", "--parsable", "-p", "batch", "-N", "4", "-t", "1", "-o", "/dev/null",
                       "--wrap", "sleep 5").strip()
        wait_until(lambda: cluster.job_times(b)["JobState"] in ("RUNNING", "COMPLETED"), 120,
                   "primary job B to start")
        ta, tb = cluster.job_times(a), cluster.job_times(b)
        delay = float(tb["StartTime"]) - float(ta["EndTime"])
        mt = cluster.job_times(m)
    finally:
        d.stop()
    gave_back = [x["t"] for x in d.lines() if "back to a primary job" in x.get("msg", "")]
    return dict(vacate_lead_s=vacate_lead_s, delay_s=delay, a_end=float(ta["EndTime"]),
                b_start=float(tb["StartTime"]), malleable_restarts=mt["Restarts"],
                gave_back_s=gave_back[0] if gave_back else None)


@MATRIX
def test_primary_job_start_delay_with_and_without_proactive_vacate(clean, tmp_path):
    """Primary job B waits for A while a malleable job holds B's other nodes. Proactive vacate
    gives them back before A ends, on every release. The comparison with reactive give-back
    (40 s more of primary jobs) runs on the host's release only: what the daemon does there is
    a shrink for a primary job, which every release runs in the grow/shrink test."""
    interval = 2.0
    with_ = _primary_delay(clean, tmp_path, 60.0)
    assert with_["gave_back_s"] is not None and with_["gave_back_s"] < with_["a_end"] - 10
    assert with_["delay_s"] <= interval + 10
    if clean.version != "host":
        return
    without = _primary_delay(clean, tmp_path, 0.0)
    report = {"slurm": clean.release, "grace_s": GRACE_S, "interval_s": interval,
              "without_vacate": without, "with_vacate": with_}
    keep_figures("slurm-primary-delay.json", report, tmp_path)
    # reactive: nodes go back once B is due; proactive: before A has even ended
    assert without["gave_back_s"] is None or without["gave_back_s"] >= without["a_end"] - 1
    assert without["delay_s"] <= GRACE_S + interval + 10
    assert with_["delay_s"] < without["delay_s"]


@MATRIX
def test_kill9_mid_cycle_then_restart_loses_and_duplicates_nothing(clean, tmp_path):
    cluster = clean
    jobs = [cluster.submit_synth(tmp_path, f"k{i}", checkpoint_s=2.0) for i in range(3)]
    d = DaemonProc(tmp_path, cluster).start()

    def mid_cycle():   # the daemon logged a change and is requeueing/waiting for it
        return any(x.get("logger") == "malletrain.slurm" and x.get("action") in ("grow", "shrink", "stop")
                   for x in d.lines())
    wait_until(mid_cycle, 120, "a rescale in progress")
    d.proc.send_signal(signal.SIGKILL)
    d.proc.wait(10)
    assert d.proc.returncode == -signal.SIGKILL
    after_kill = _ours(cluster)
    assert sorted(after_kill) == sorted(jobs)

    d2 = DaemonProc(tmp_path, cluster, name="daemon2").start()
    try:
        assert any("restored" in x.get("msg", "") for x in
                   wait_until(lambda: d2.lines() or None, 30, "restart log"))
        def settled():
            ours = _ours(cluster)
            st = d2.status()
            return (st and st.cycle > 3 and st.idle_nodes == 0 and
                    sum(len(r["nodes"].split(",")) for r in ours.values() if r["state"] == "RUNNING") > 0 and
                    all(r["state"] in ("RUNNING", "PENDING") for r in ours.values()))
        wait_until(settled, 120, "the restarted daemon to re-adopt and run the jobs")
        ours = _ours(cluster)
        assert sorted(ours) == sorted(jobs), "no job lost, none duplicated"
        # none orphaned: every running job is one the daemon knows and plans for
        st = d2.status()
        known = {j.job: j for j in st.jobs}
        assert set(known) == set(jobs)
        for j, r in ours.items():
            if r["state"] == "RUNNING":
                assert known[j].state == "running" and known[j].size > 0
            else:   # held jobs wait for nodes only when none are idle
                assert st.idle_nodes == 0
    finally:
        d2.stop()


@MATRIX
def test_slurmctld_outage_is_waited_out(clean, tmp_path):
    cluster = clean
    job = cluster.submit_synth(tmp_path, "outage", hi=2)
    d = DaemonProc(tmp_path, cluster).start()
    try:
        wait_until(lambda: job in _running_nodes(cluster), 60, "job running")
        cluster.script("stop-ctld")
        t0 = time.time()
        while time.time() - t0 < 30:        # cycles of 2 s, each read failing (5 s timeout, 1 retry)
            assert d.alive(), "the daemon must survive the outage"
            time.sleep(2)
        cluster.script("start-ctld")
        wait_until(lambda: any("Slurm is back" in x.get("msg", "") for x in d.lines()), 90,
                   "the daemon to log that Slurm is back")
        c0 = d.status().cycle
        wait_until(lambda: d.status().cycle >= c0 + 2 and d.status().slurm_up, 30,
                   "cycles after the outage")
        msgs = [x.get("msg", "") for x in d.lines()]
        assert any("Slurm is unreachable" in m for m in msgs)
        assert list(_ours(cluster)) == [job]
    finally:
        assert d.stop() == 0


@MATRIX
def test_members_of_a_held_array_start_stop_and_are_preempted_one_node_at_a_time(clean, tmp_path):
    """What issue #26's groups stand on, on every release: a malleable job as a held job array
    of 1-node members. As the operator: a member starts on a chosen node (update ReqNodeList and
    StartTime=now, release; each task becomes a job of its own) while the others stay held; one
    member is held back (requeuehold) and the others run on untouched; a primary job that needs
    one member's node preempts that member alone; the held member starts again on another node
    with its own job id kept."""
    c = clean
    op = c.as_operator

    def members() -> dict[str, dict]:
        out = c.sh("squeue", "-h", "-r", "-j", base, "-o", "%K|%A|%T|%r|%N")
        rows = [line.split("|") for line in out.splitlines()]
        return {k: dict(id=a, state=t, reason=r, node=n) for k, a, t, r, n in rows}

    def start(task: str, node: str) -> None:
        op(f"{c.bin}/scontrol", "update", f"JobId={base}_{task}", f"ReqNodeList={node}", "StartTime=now")
        op(f"{c.bin}/scontrol", "release", f"{base}_{task}")

    base = c.sh("sbatch", "--parsable", "-p", "scavenger", "-N", "1", "--requeue", "--hold", "--array=0-3",
                "-o", "/dev/null", "--wrap", "sleep 600").strip()
    assert {m["state"] for m in members().values()} == {"PENDING"}
    # a task updated alone becomes a job record of its own, yet squeue without -r still shows it
    # on the array's one line of pending tasks, with the others: the backend reads groups with -r -j
    op(f"{c.bin}/scontrol", "update", f"JobId={base}_3", "ReqNodeList=n4")
    assert len({m["id"] for m in members().values()}) == 2
    merged = c.sh("squeue", "-h", "-j", base, "-o", "%i").split()
    assert merged == [f"{base}_[0-3]"], merged
    for task, node in (("0", "n1"), ("1", "n2"), ("2", "n3")):
        start(task, node)
    wait_until(lambda: [members()[k]["state"] for k in "0123"] == ["RUNNING"] * 3 + ["PENDING"], 60,
               "three members running, one held")
    first = members()
    assert [first[k]["node"] for k in "012"] == ["n1", "n2", "n3"], first
    assert len({first[k]["id"] for k in "0123"}) == 4                   # a job id for each member
    op(f"{c.bin}/scontrol", "requeuehold", first["1"]["id"])            # shrink: one member held back
    wait_until(lambda: members()["1"]["state"] == "PENDING", 60, "member 1 held")
    prim = c.sh("sbatch", "--parsable", "-p", "batch", "-N", "1", "-w", "n3", "-o", "/dev/null",
                "--wrap", "sleep 2").strip()
    wait_until(lambda: c.jobs().get(prim, {}).get("state") in ("RUNNING", None), 90,
               "the primary job to take n3")
    after = members()
    assert after["2"]["state"] in ("PENDING", "REQUEUED", "COMPLETING"), after   # preempted alone
    assert after["0"]["state"] == "RUNNING" and after["0"]["node"] == "n1", after
    assert c.job_times(first["0"]["id"])["Restarts"] == "0"
    start("1", "n4")                                                    # grow: the held member again
    wait_until(lambda: members()["1"]["state"] == "RUNNING", 60, "member 1 running on n4")
    again = members()
    assert again["1"]["node"] == "n4" and again["1"]["id"] == first["1"]["id"], again
    assert c.job_times(first["1"]["id"])["Restarts"] == "1"
    assert again["0"]["state"] == "RUNNING" and again["3"]["state"] == "PENDING", again


@MATRIX
def test_ended_members_of_an_array_are_requeued_held_one_by_one_with_their_ids(clean):
    """What the safety net does to an elastic group whose members all ended without a result,
    on every release: each ended member, named by ARRAY_TASK, is requeued held by the operator,
    keeps its job id and is pending again (the daemon starts it when it has nodes)."""
    c = clean
    op = c.as_operator
    base = c.sh("sbatch", "--parsable", "-p", "scavenger", "-N", "1", "--requeue", "--hold", "--array=0-1",
                "-o", "/dev/null", "--wrap", "exit 1").strip()

    def members() -> dict[str, tuple[str, str, str]]:
        out = c.sh("squeue", "-h", "-r", "-t", "all", "-j", base, "-o", "%K|%A|%T|%r")
        return {k: (a, t, r) for k, a, t, r in (line.split("|") for line in out.splitlines())}
    for task, node in (("0", "n1"), ("1", "n2")):
        op(f"{c.bin}/scontrol", "update", f"JobId={base}_{task}", f"ReqNodeList={node}", "StartTime=now")
        op(f"{c.bin}/scontrol", "release", f"{base}_{task}")
    wait_until(lambda: [m[1] for m in members().values()] == ["FAILED"] * 2, 60, "both members to fail")
    ended = members()
    for task in ("0", "1"):
        op(f"{c.bin}/scontrol", "requeuehold", f"{base}_{task}")
    wait_until(lambda: {m[1] for m in members().values()} == {"PENDING"}, 30, "both members queued again")
    again = members()
    assert {k: m[0] for k, m in again.items()} == {k: m[0] for k, m in ended.items()}, (ended, again)
    assert all("held" in m[2] for m in again.values()), again


@MATRIX
def test_replay_reads_this_clusters_own_sacct_history(clean, tmp_path):
    """Primary jobs of known sizes run; slurmdbd's record of them (``sacct``, the export the
    README names, in Slurm's default time format) is replayed: the idle node-seconds replay
    finds are those the accounting records leave, and the malleable job harvests them.  Before
    them, an array of 1-node tasks ran in the harvest partition as an elastic group's members do
    (one held back): with ``--harvest-partition`` the replay leaves it out and counts its
    members as one job (issue #26)."""
    cluster = clean
    t0 = time.time()
    group = cluster.sh("sbatch", "--parsable", "-p", "scavenger", "-N", "1", "--hold", "--array=0-2",
                       "-o", "/dev/null", "--wrap", "sleep 2").strip().split(";")[0]
    cluster.sh("scontrol", "release", f"{group}_0", f"{group}_1")
    wait_until(lambda: cluster.sh("squeue", "-h", "-r", "-j", group, "-o", "%i|%T").split() == [f"{group}_2|PENDING"],
               90, "two members to run and end, the third still held")

    def primary(nodes: int, seconds: int, *extra: str) -> str:
        return cluster.sh("sbatch", "--parsable", "-p", "batch", "-N", str(nodes), "-o", "/dev/null", *extra,
                          "--wrap", f"sleep {seconds}").strip().split(";")[0]
    a, b = primary(2, 6), primary(1, 3)
    c = primary(4, 4, f"--dependency=afterany:{a}:{b}")
    ids = (a, b, c)
    wait_until(lambda: not set(ids) & set(cluster.jobs()), 90, "the primary jobs to end")
    env = {k: v for k, v in cluster.env.items() if k != "SLURM_TIME_FORMAT"}    # as a centre's sacct prints

    def export() -> str:
        out = subprocess.run(["sacct", "--allusers", "--allocations", "--parsable2", "-S",
                              time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t0 - 60)),
                              "-j", ",".join((*ids, group)), "--format", "JobID,Start,End,NodeList,State,Partition"],
                             env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout
    text = wait_until(lambda: (t := export()).count("COMPLETED") == 5 and t, 60,
                      "slurmdbd to record the three jobs and the two members")
    cluster.sh("scancel", group, check=False)
    trace = tmp_path / "history.sacct"
    trace.write_text(text)
    every = [line.split("|") for line in text.splitlines()[1:]]
    members = [r for r in every if r[5] == "scavenger"]
    assert sorted(r[0] for r in members if r[4] == "COMPLETED") == [f"{group}_0", f"{group}_1"], text
    rows = [r for r in every if r[5] != "scavenger"]
    assert [r[4] for r in rows] == ["COMPLETED"] * 3 and not rows[0][1].isdigit()    # ISO times
    from malletrain.domain.timeutil import parse_time
    span = [(parse_time(r[1]), parse_time(r[2]), r[3]) for r in rows]
    nodes_of = {"n[1-2]": 2, "n1": 1, "n2": 1, "n3": 1, "n4": 1, "n[1-4]": 4, "n[3-4]": 2}
    busy = sum((e - s) * nodes_of[nl] for s, e, nl in span)
    first, last = min(s for s, _, _ in span), max(e for _, e, _ in span)
    assert 4 * (last - first) - busy > 0, f"the jobs left no idle node-second: {span}"
    workload = tmp_path / "workload.yaml"
    workload.write_text("jobs:\n- {name: trial, submit: 0, min_nodes: 1, max_nodes: 4, work: 1000000000,"
                        " rescale_up_s: 0, rescale_down_s: 0, throughput: {1: 100, 2: 190, 4: 360}}\n")
    out = subprocess.run([sys.executable, "-m", "malletrain", "replay", "--trace", str(trace), "--workload",
                          str(workload), "--out", str(tmp_path / "replay"), "--interval", "1", "--no-plots",
                          "--harvest-partition", "scavenger"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "left out 1 job(s) of the harvest partition(s) scavenger (2 of their allocations" in out.stderr
    summary = json.loads((tmp_path / "replay" / "summary.json").read_text())
    # the replayed window runs from the first primary start to one second past the last end
    assert summary["trace_span_s"] == pytest.approx(last - first + 1.0)
    assert summary["nodes"] == 4 and summary["idle_node_s"] == pytest.approx(4 * summary["trace_span_s"] - busy)
    assert summary["allocated_node_s"] > 0 and summary["useful_samples"] > 0


def test_daemon_reloads_config_and_rejects_bad_config(clean, tmp_path):
    import socket
    sock_path = str(tmp_path / "notify.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    srv.bind(sock_path)
    os.chmod(sock_path, 0o666)          # the daemon runs as the operator account
    srv.settimeout(30)
    d = DaemonProc(tmp_path, clean, env={"NOTIFY_SOCKET": sock_path, "WATCHDOG_USEC": "6000000"}).start()
    try:
        assert srv.recv(200).decode().startswith("READY=1")
        first = [srv.recv(200).decode() for _ in range(2)]     # each cycle: its status line, the watchdog
        assert first[0].startswith("STATUS=cycle 1 (every 2s): ") and first[1] == "WATCHDOG=1", first
        wait_until(lambda: d.status(), 30, "first cycle")
        good = d.config.read_text()
        d.config.write_text(good.replace("interval_s: 2.0", "interval_s: 2.0\n  bogus_key: 1"))
        d.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: any("reload failed" in x.get("msg", "") for x in d.lines()), 30, "reload error")
        assert any("valid keys" in x.get("msg", "") for x in d.lines())
        d.config.write_text(good.replace("interval_s: 2.0", "interval_s: 1.0"))
        d.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: any("config reloaded" in x.get("msg", "") for x in d.lines()), 30, "reload")
        assert d.alive()
    finally:
        assert d.stop() == 0
    msgs = []
    srv.settimeout(2)
    try:
        while True:
            msgs.append(srv.recv(200).decode())
    except TimeoutError:
        pass
    assert msgs[-1] == "STOPPING=1" and any(m.startswith("STATUS=cycle ") for m in msgs)
    bad = tmp_path / "bad.yaml"
    bad.write_text("daemon:\n  intervall_s: 3\n")
    out = subprocess.run([os.sys.executable, "-m", "malletrain", "daemon", "--config", str(bad)],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "valid keys" in out.stderr and "interval_s" in out.stderr


# ---------------------------------------------------------------- PyTorch trial end to end

EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                       "examples", "train", "digits_train.py")


def test_pytorch_trial_is_preempted_and_resumes_on_other_sizes_to_the_same_parameters(clean, tmp_path,
                                                                                       launch="srun"):
    """The digits example under `malletrain submit` (srun, one process per node, gloo): the daemon
    sizes it, a primary job preempts it, it resumes on other node counts and ends with exactly
    the parameters of an uninterrupted single-process run.  (Under ``launch="torchrun"`` one worker
    is also killed, kill -9, and the job requeues itself and resumes: run once by hand, 2026-11-27,
    passed; the DDP adapter's live test below covers the torchrun launch in the suite.)"""
    import sys

    import torch

    from malletrain.runtime.checkpoint import CheckpointStore
    cluster = clean
    steps = 1200
    train = ["--steps", str(steps), "--checkpoint-every-s", "5", "--eval-every", "100000"]
    cmd = [sys.executable, EXAMPLE, "--ckpt", str(tmp_path / "ckpt"), *train]
    out = subprocess.run(
        [sys.executable, "-m", "malletrain", "submit", "--name", "digits", "--min-nodes", "1",
         "--max-nodes", "4", "--grace-s", str(GRACE_S), "--rescale-up", "5", "--rescale-down", "3",
         "--launch", launch, "--metrics-dir", str(tmp_path / "metrics"), "--", *cmd],
        env=dict(cluster.env, PYTHONPATH=os.path.dirname(EXAMPLE) + "/../.."), capture_output=True,
        text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    job = out.stdout.strip()
    # the uninterrupted reference run, meanwhile, outside Slurm
    ref = subprocess.Popen([sys.executable, EXAMPLE, "--ckpt", str(tmp_path / "ref"), *train],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    d = DaemonProc(tmp_path, cluster).start()
    try:
        def progressed():
            return any(r["event"] == "progress" and r["step"] >= 150
                       for r in metrics_records(tmp_path, job))
        wait_until(progressed, 180, "the trial to train 150 steps")
        # alone on 4 idle nodes it runs on all 4; a primary job taking half of them makes it
        # resume on the other two (another world size), one taking all four preempts it outright
        half = cluster.sh("sbatch", "--parsable", "-p", "batch", "-N", "2", "-o", "/dev/null",
                          "--wrap", "sleep 300").strip()

        def resumed_smaller():
            starts = [r["world"] for r in metrics_records(tmp_path, job) if r["event"] == "start"]
            return len(starts) >= 2 and starts[-1] < max(starts)
        wait_until(resumed_smaller, 180, "the trial to resume on fewer nodes beside a primary job")
        if launch == "torchrun":        # kill -9 of one worker: torchrun's launch exits 137, the job requeues
            runs = len([r for r in metrics_records(tmp_path, job) if r["event"] == "start"])
            wait_until(lambda: _kill_a_worker(f"--ckpt {tmp_path / 'ckpt'}"), 60, "a training worker to kill")
            wait_until(lambda: len([r for r in metrics_records(tmp_path, job) if r["event"] == "start"]) > runs,
                       180, "the trial to start again after the kill")
        cluster.sh("scancel", half)
        prim = cluster.sh("sbatch", "--parsable", "-p", "batch", "-N", "4", "-o", "/dev/null",
                          "--wrap", "sleep 5").strip()
        wait_until(lambda: cluster.jobs().get(prim, {}).get("state") == "RUNNING", 90,
                   "the primary job to get all 4 nodes")
        result = tmp_path / "ckpt" / "result.json"

        def finished():
            try:
                return json.loads(result.read_text()).get("final")
            except (OSError, ValueError):
                return False
        wait_until(finished, 400, "the trial to finish")
    finally:
        d.stop()
        ref_out, ref_err = ref.communicate(timeout=300)
    recs = metrics_records(tmp_path, job)
    worlds = {r["world"] for r in recs if r["event"] == "start"}
    stops = [r for r in recs if r["event"] == "exit" and r.get("reason") in ("signal", "forced")]
    assert len(worlds) >= 2, f"ran only on {worlds} process(es)"
    assert stops and all(r["signal_to_exit_s"] is None or r["signal_to_exit_s"] < GRACE_S
                         for r in stops), stops
    assert max(r["restart"] for r in recs) >= 1
    assert ref.returncode == 0, ref_err[-2000:]
    got = CheckpointStore(str(tmp_path / "ckpt")).restore(quarantine=False)
    want = CheckpointStore(str(tmp_path / "ref")).restore(quarantine=False)
    assert got.step == want.step == steps
    assert got.state["model"].keys() == want.state["model"].keys()
    assert all(torch.equal(got.state["model"][k], want.state["model"][k]) for k in want.state["model"])
    if launch == "torchrun":        # the job's output: the workers ran under torchrun; the kill was seen as one
        log_text = (tmp_path / "metrics" / f"digits-{job}.out").read_text(errors="replace")
        assert "(torchrun, gloo)" in log_text and "exit 137" in log_text, log_text[-3000:]
    summary = {"job": job, "launch": launch, "worlds": sorted(worlds), "restarts": max(r["restart"] for r in recs),
               "stops": [{k: r.get(k) for k in ("step", "world", "reason", "signal", "signal_to_exit_s")}
                         for r in stops],
               "starts": [{k: r.get(k) for k in ("step", "world", "restart", "restore_s")}
                          for r in recs if r["event"] == "start"],
               "checkpoints": [r.get("write_s") for r in recs if r["event"] == "checkpoint"],
               "bitwise_equal_to_uninterrupted": True}
    keep_figures("pytorch-trial-live.json" if launch == "srun" else "pytorch-trial-torchrun-live.json",
                 summary, tmp_path)


@MATRIX
def test_an_elastic_group_loses_one_member_to_a_preemption_and_grows_back_without_restarting_the_others(
        clean, tmp_path):
    """Issue #26 end to end on each release: ``malletrain submit --elastic`` (a held array of
    1-node members, the reference CNN with ``RuntimeConfig(elastic=True)``), the daemon as the
    operator account. It starts three members that form one group; a primary job that needs one
    member's node stops that member alone (the daemon gives the node back ahead of Slurm's
    preemption, or Slurm preempts that member: either way the other two keep their job ids,
    never restart, and re-form in place); the daemon holds the preempted member and starts a spare one on the
    free node, which joins the running group. The job ends with the parameters of an uninterrupted
    single-process run, bitwise, and the daemon cancels the members still held after 'done'."""
    from devtools.elastic_drill import reference_sha
    cluster = clean
    until = 1000
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ckpt = tmp_path / "ckpt"
    cmd = [sys.executable, "-m", "malletrain.runtime.reference", "--dir", str(ckpt), "--until", str(until),
           "--report-s", "0", "--step-sleep-s", "0.03", "--elastic"]
    out = subprocess.run(
        [sys.executable, "-m", "malletrain", "submit", "--elastic", "--name", "elastic", "--min-nodes", "3",
         "--max-nodes", "3", "--grace-s", str(GRACE_S), "--rescale-up", "0.5", "--rescale-down", "0.5",
         "--launch", "batch", "--metrics-dir", str(tmp_path / "metrics"), "--", *cmd],
        env=dict(cluster.env, PYTHONPATH=root, OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    job = out.stdout.strip()
    want = reference_sha(str(tmp_path), until)        # meanwhile nothing runs: the members are held

    def members() -> dict[str, dict]:
        text = cluster.sh("squeue", "-h", "-r", "-j", job, "-o", "%K|%A|%T|%N", check=False)
        return {k: dict(id=a, state=t, node=n) for k, a, t, n in (ln.split("|") for ln in text.splitlines())}

    def reforms() -> list[dict]:
        return [r for r in metrics_records(tmp_path, job) if r["event"] == "reform"]

    d = DaemonProc(tmp_path, cluster, extra={"slurm": {"elastic_groups": True}}).start()
    try:
        wait_until(lambda: any(len(r["members"]) == 3 for r in reforms()), 180, "three members in one group")
        first = {k: m for k, m in members().items() if m["state"] == "RUNNING"}
        assert len(first) == 3, first
        from malletrain.daemon.status import read_status

        def shown_running() -> int:       # what `malletrain status` shows of the group
            job_st = read_status(str(d.state_dir / "status.json")).job(job)
            return sum(m.state == "running" for m in job_st.members) if job_st else 0
        wait_until(lambda: shown_running() == 3, 30, "the status to show three running members")
        victim = max(first)
        stay = sorted(set(first) - {victim})
        seen = len(reforms())
        prim = cluster.sh("sbatch", "--parsable", "-p", "batch", "-N", "1", "-w", first[victim]["node"],
                          "-o", "/dev/null", "--wrap", "sleep 15").strip()
        wait_until(lambda: any(len(r["members"]) == 2 for r in reforms()[seen:]), 120,
                   "the other two members to go on as a group")
        wait_until(lambda: cluster.jobs().get(prim, {}).get("state") == "RUNNING", 60, "the primary job to run")
        now = members()
        for k in stay:       # never stopped: same job, still running, no restart
            assert now[k]["state"] == "RUNNING" and now[k]["id"] == first[k]["id"], now
            assert cluster.job_times(f"{job}_{k}")["Restarts"] == "0"
        wait_until(lambda: any(r["kind"] == "grow" and len(r["members"]) == 3 for r in reforms()[seen:]), 120,
                   "a spare member to join the running group on the free node")
        wait_until(lambda: not members(), 300, "the job to finish and its held members to be cancelled")
    finally:
        d.stop()
    outs = [p.read_text(errors="replace") for p in (tmp_path / "metrics").glob(f"elastic-{job}_*.out")]
    shas = {ln.split()[1] for text in outs for ln in text.splitlines() if ln.startswith("sha256 ")}
    assert shas == {want}, (shas, want)
    recs = reforms()
    for k in stay:
        assert cluster.job_times(f"{job}_{k}")["Restarts"] == "0"
    name = "elastic-group-live" + ("" if cluster.version == "host" else f"-{cluster.version}")
    keep_figures(f"{name}.json", {
        "job": job, "release": cluster.release,
        "reforms": [{x: r.get(x) for x in ("kind", "members", "step", "pause_s")} for r in recs],
        "bitwise_equal_to_uninterrupted": True}, tmp_path)


TRAIN_EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "train")


@dataclasses.dataclass(frozen=True)
class Adapted:
    """One framework's malleable example for the live test: its arguments (``d``: where the run
    writes), optimizer steps an epoch, epochs, the pgrep pattern of its workers, its model and its
    validation accuracy per epoch from what rank 0 printed."""

    script: str
    steps_per_epoch: int
    epochs: int

    def args(self, d) -> list[str]:
        if self.script.startswith("hf/"):
            return ["--epochs", str(self.epochs), "--out", str(d / "model"), "--out-dir", str(d / "run")]
        return ["--epochs", str(self.epochs), "--out", str(d / "model.pt"), "--ckpt", str(d / "ckpt")]

    def marker(self, d) -> str:
        return f"--out-dir {d / 'run'}" if self.script.startswith("hf/") else f"--ckpt {d / 'ckpt'}"

    def model(self, d) -> dict:
        if self.script.startswith("hf/"):
            from safetensors.torch import load_file
            return load_file(str(d / "model" / "model.safetensors"))
        import torch
        return torch.load(d / "model.pt")

    def accuracy(self, text: str) -> dict[int, float]:
        """Epoch (from 0) -> validation accuracy, the last value printed for each."""
        out = {}
        for line in text.splitlines():
            if line.startswith("epoch ") and " val_acc " in line:
                out[int(line.split()[1])] = float(line.split()[-1])
            elif "'eval_accuracy'" in line:
                rec = {k.strip(" '{}"): v.strip(" '{}") for k, v in (kv.split(":", 1) for kv in line.split(", "))}
                out[round(float(rec["epoch"])) - 1] = float(rec["eval_accuracy"])
        return out


ADAPTED = {          # 500 steps for the MLP examples: each scenario is over by about step 200
    "ddp": Adapted("ddp/train_malleable.py", 5, 100),
    "lightning": Adapted("lightning/train_malleable.py", 5, 100),
    "accelerate": Adapted("accelerate/train_malleable.py", 5, 100),
    # 220 steps: Adam and gradient clipping grow the rounding of another world size quickly in
    # this tiny BERT (uninterrupted runs on 1 and 4 workers: 3e-4 apart after 165 steps, 0.17
    # after 330 at a 3x higher learning rate), so the live run is kept short
    "hf": Adapted("hf/train_malleable.py", 11, 20),
}


@pytest.mark.parametrize("framework", list(ADAPTED))
def test_adapted_script_under_torchrun_is_resized_killed_and_preempted_and_finishes(clean, tmp_path, framework):
    """A training script in a framework's own idiom (a plain DDP loop, a Lightning Trainer, a
    hand-written Accelerate loop, a Hugging Face Trainer) made malleable with its adapter, under
    `submit --launch torchrun`: the daemon sizes it on idle nodes, a primary job halves them (it
    resumes on fewer workers), one worker is killed (kill -9: the launch exits 137 and the job
    requeues itself), a primary job takes all nodes (preemption), and it finishes every step
    exactly once with the model of an uninterrupted run: to float rounding, since DDP sums in
    another order at another world size (stated tolerance: validation accuracy within 0.01,
    every parameter within 0.05; measured in these runs: DDP 4e-4, Lightning 2e-4, Accelerate
    5e-4, HF 6e-4)."""
    import sys

    ex = ADAPTED[framework]
    cluster = clean
    script = os.path.join(TRAIN_EXAMPLES, ex.script)
    steps = ex.steps_per_epoch * ex.epochs
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    (tmp_path / "ref").mkdir()
    out = subprocess.run(
        [sys.executable, "-m", "malletrain", "submit", "--name", framework, "--min-nodes", "1", "--max-nodes", "4",
         "--grace-s", str(GRACE_S), "--rescale-up", "5", "--rescale-down", "3", "--launch", "torchrun",
         "--metrics-dir", str(tmp_path / "metrics"), "--", sys.executable, script, *ex.args(tmp_path)],
        env=dict(cluster.env, PYTHONPATH=root, OMP_NUM_THREADS="1"), capture_output=True, text=True, timeout=60)
    # (one thread a process: the local cluster's 4 nodes share this machine's cores, and torchrun
    # with one worker a node leaves the thread count to the framework; Accelerate then takes 2,
    # and 4 such processes on 2 cores ran the HF job at 2.5 s a step)
    assert out.returncode == 0, out.stderr
    job = out.stdout.strip()
    ref = torchrun([script, *ex.args(tmp_path / "ref")], 1, env={"PYTHONPATH": root, "OMP_NUM_THREADS": "1"})
    starts = lambda: [r for r in metrics_records(tmp_path, job) if r["event"] == "start"]     # noqa: E731
    d = DaemonProc(tmp_path, cluster).start()
    try:
        first = min(100, steps // 3)
        wait_until(lambda: any(r["event"] == "progress" and r["step"] >= first for r in metrics_records(tmp_path, job)),
                   240, f"the {framework} job to train {first} steps")
        half = cluster.sh("sbatch", "--parsable", "-p", "batch", "-N", "2", "-o", "/dev/null",
                          "--wrap", "sleep 300").strip()
        wait_until(lambda: len(starts()) >= 2 and starts()[-1]["world"] < max(r["world"] for r in starts()), 180,
                   f"the {framework} job to resume on fewer workers beside a primary job")
        runs = len(starts())
        wait_until(lambda: any(r["event"] == "progress" and r["step"] > starts()[-1]["step"]
                               for r in metrics_records(tmp_path, job)), 120, "the smaller run to train")
        wait_until(lambda: _kill_a_worker(ex.marker(tmp_path)), 60, f"a {framework} worker to kill")
        wait_until(lambda: len(starts()) > runs, 180, f"the {framework} job to start again after the kill")
        wait_until(lambda: any(r["event"] == "progress" and r["step"] > starts()[-1]["step"] + 5
                               for r in metrics_records(tmp_path, job)), 120, "the restarted run to train")
        # a primary job for all 4 nodes, queued while the half one runs; when that one ends, Slurm
        # preempts the running job for it
        prim = cluster.sh("sbatch", "--parsable", "-p", "batch", "-N", "4", "-o", "/dev/null",
                          "--wrap", "sleep 5").strip()
        cluster.sh("scancel", half)
        wait_until(lambda: cluster.jobs().get(prim, {}).get("state") == "RUNNING", 90,
                   "the primary job to get all 4 nodes")
        wait_until(lambda: any(r["event"] == "exit" and r.get("reason") == "done"
                               for r in metrics_records(tmp_path, job)), 400, f"the {framework} job to finish")
        # the exit record is written when training ends; the script's own code after that (the
        # HF example's save_model) runs before the job leaves the queue
        wait_until(lambda: job not in cluster.jobs(), 120, f"the {framework} job to leave the queue")
    finally:
        d.stop()
        ref_out, ref_err = ref.communicate(timeout=300)
    assert ref.returncode == 0, ref_err[-2000:]
    # COMPLETED, or CANCELLED by the daemon for one reason only: the preemption for the 4-node
    # primary job hit the run just as it wrote its final 'done' record, Slurm queued it again, and
    # the daemon cancelled that copy (running it would finish the work twice; CI saw this once)
    end = cluster.job_times(job)["JobState"]
    cancels = [r for r in d.lines() if r.get("job") == job and r.get("action") == "cancel"]
    assert end == "COMPLETED" or (end == "CANCELLED" and cancels and all("finish it twice" in r["reason"]
                                                                         for r in cancels)), (end, cancels)
    recs = metrics_records(tmp_path, job)
    worlds = [r["world"] for r in recs if r["event"] == "start"]
    stops = [r for r in recs if r["event"] == "exit" and r.get("reason") == "signal"]
    done = [r for r in recs if r["event"] == "exit" and r.get("reason") == "done"]
    assert len(set(worlds)) >= 2 and len(worlds) >= 4, worlds
    assert len(stops) >= 2 and all(r["signal_to_exit_s"] is not None and r["signal_to_exit_s"] < GRACE_S for r in stops)
    assert len(done) == 1 and done[0]["step"] == steps
    # every run resumed at the step of a checkpoint, and no step was trained twice in one run
    ckpts = {0} | {r["step"] for r in recs if r["event"] == "checkpoint"}
    assert all(r["step"] in ckpts for r in recs if r["event"] == "start"), recs
    log_text = (tmp_path / "metrics" / f"{framework}-{job}.out").read_text(errors="replace")
    assert "exit 137" in log_text, log_text[-3000:]
    got, want = ex.model(tmp_path), ex.model(tmp_path / "ref")
    drift = max((got[k] - want[k]).abs().max().item() for k in want)
    acc = ex.accuracy(ref_out)[ex.epochs - 1]
    mine = ex.accuracy(log_text).get(ex.epochs - 1)
    assert mine is not None and abs(mine - acc) <= 0.01 and drift < 0.05, (mine, acc, drift)
    keep_figures(f"{framework}-torchrun-live.json", {
        "job": job, "worlds": worlds, "drift": drift, "val_acc": mine, "ref_val_acc": acc,
        "stops": [{k: r.get(k) for k in ("step", "world", "signal_to_exit_s")} for r in stops],
        "starts": [{k: r.get(k) for k in ("step", "world", "restart", "restore_s")}
                   for r in recs if r["event"] == "start"]}, tmp_path)


def _kill_a_worker(marker: str) -> bool:
    """SIGKILL one training process of the run whose command line holds ``marker`` (not
    torchrun's agent)."""
    pids = worker_pids(marker)
    if pids:
        os.kill(pids[0], signal.SIGKILL)
    return bool(pids)


def test_campaign_trials_run_under_the_daemon_and_status_shows_the_best(clean, tmp_path):
    import sys
    spec = tmp_path / "spec.yaml"
    spec.write_text(json.dumps({
        "name": "mini", "kind": "hpo", "command": [sys.executable, EXAMPLE], "dir": "camp",
        "search": "grid", "metric": "val_acc", "goal": "max",
        "space": {"lr": [0.002, 0.1]}, "fixed": {"steps": 120, "eval_every": 40},
        "job": {"min_nodes": 1, "max_nodes": 2, "grace_s": GRACE_S, "rescale_up_s": 5,
                "rescale_down_s": 3}}))
    env = dict(clean.env, PYTHONPATH=os.path.dirname(os.path.dirname(EXAMPLE)) + "/..")

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "malletrain", "campaign", *args, str(spec)],
                              env=env, capture_output=True, text=True, timeout=60)
    sub = cli("submit")
    assert sub.returncode == 0, sub.stderr
    again = cli("submit")          # idempotent: nothing new
    assert again.returncode == 0 and ": job " not in again.stderr
    jobs = [t["job"] for t in json.loads((tmp_path / "camp" / "campaign.json").read_text())["trials"]]
    assert len(jobs) == 2 and len(set(jobs)) == 2
    d = DaemonProc(tmp_path, clean).start()
    try:
        def both_done():
            rows = json.loads(cli("status", "--json").stdout)
            return all(r["state"] == "done" for r in rows) and rows
        rows = wait_until(both_done, 300, "both trials to finish")
    finally:
        d.stop()
    assert all(r["step"] == 120 and r["metric"] is not None for r in rows)
    best = max(rows, key=lambda r: r["metric"])
    assert [r["id"] for r in rows if r["best"]] == [best["id"]]
    text = cli("status").stdout
    assert "2/2 done; best so far: " + best["id"] in text, text


def test_study_campaign_goes_on_unattended_and_prunes(clean, tmp_path):
    """An Optuna campaign (grid over 4 learning rates, ASHA, at most 2 trial jobs at once) is
    submitted once; the trial jobs ask their parameters when they start and queue their
    successors when they end: no other command of the user's runs until all 4 trials are closed.
    Every trial is one job for its whole life; the two near-zero learning rates lose to the
    others at a rung and are pruned when a better one reported there first (reported, not
    asserted: which pair runs first is the grid sampler's seeded order).

    The trial jobs are elastic groups (issue #26, ``job.elastic``): each a held array of 1-node
    members, every member running the trial wrapper and the unchanged example script, which runs
    elastic from its environment; the trial is closed out once whichever member ends first.  (The
    NSGA-II test below runs a study campaign's trials as plain jobs.)"""
    import sys
    spec = tmp_path / "spec.yaml"
    spec.write_text(json.dumps({
        "name": "opt", "kind": "hpo", "command": [sys.executable, EXAMPLE], "dir": "camp",
        "sampler": "grid", "trials": 4, "max_concurrent": 2, "retries": 1, "metric": "val_acc", "goal": "max",
        "pruner": {"kind": "asha", "min_resource": 20, "reduction_factor": 3}, "step_unit": "steps",
        "space": {"lr": [0.1, 0.08, 0.00001, 0.00002]},
        "fixed": {"steps": 100, "eval_every": 20, "arch": "mlp", "width": 32, "depth": 1},
        "job": {"min_nodes": 1, "max_nodes": 2, "grace_s": GRACE_S, "rescale_up_s": 5, "rescale_down_s": 3,
                "elastic": True, "launch": "batch"}}))
    env = dict(clean.env, PYTHONPATH=os.path.dirname(os.path.dirname(EXAMPLE)) + "/..", OMP_NUM_THREADS="1")

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "malletrain", "campaign", *args, str(spec)],
                              env=env, capture_output=True, text=True, timeout=120)
    sub = cli("submit")
    assert sub.returncode == 0, sub.stderr
    camp = tmp_path / "camp"
    ledger = lambda: json.loads((camp / "campaign.json").read_text())["slots"]      # noqa: E731
    assert [s["id"] for s in ledger()] == ["s000", "s001"] and all(s["job"] for s in ledger())
    for s in ledger():                           # each trial job: a held array of two 1-node members
        tasks = clean.sh("squeue", "-h", "-r", "-j", s["job"], "-o", "%K|%T|%D").split()
        assert sorted(tasks) == ["0|PENDING|1", "1|PENDING|1"], tasks
    from malletrain.campaign.slots import thawed
    from malletrain.campaign.study import open_study
    study = open_study(thawed(str(camp)))
    assert study.trials() == []                  # nothing asked before a job starts
    d = DaemonProc(tmp_path, clean, extra={"slurm": {"elastic_groups": True}}).start()
    try:
        def closed():
            views = study.trials()
            return len(views) == 4 and all(v.state != "running" for v in views) and views
        views = wait_until(closed, 420, "the campaign's 4 trials to close, with no user command")
        # the daemon cancels a group's held members once its work is done (recovery; a member never
        # cancels the others): so while it still runs
        wait_until(lambda: not clean.sh("squeue", "-h", "-r", "-o", "%i", check=False).split(), 60,
                   "every trial's held members to be cancelled after its end")
    finally:
        d.stop()
    slots_ = ledger()
    assert len(slots_) == 4 and sorted(s["trial"] for s in slots_) == [0, 1, 2, 3]
    assert len({s["job"] for s in slots_}) == 4 and all(s["end"] in ("done", "pruned") for s in slots_)
    states = {v.number: v.state for v in views}
    assert set(states.values()) <= {"complete", "pruned"} and "complete" in states.values()
    by_lr = {v.params["lr"]: v for v in views}
    best = max((v for v in views if v.state == "complete"), key=lambda v: v.values[0])
    assert best.params["lr"] in (0.1, 0.08)
    promised = []
    for s in slots_:        # one trial per job for its whole life; a pruned job exited 0, not requeued
        recs = metrics_records(tmp_path / "camp", s["job"])
        ends = [r["reason"] for r in recs if r["event"] == "exit"]
        assert ends and ends[-1] in ("done", "pruned"), (s, ends)
        # what the daemon reads of the trial's standing: η^k after k rungs (20, 60 steps); the last
        # step's report goes to no pruner and claims nothing
        promised += [(r["step"], r.get("promise")) for r in recs if r["event"] == "metric" and not r["prune"]]
    want = {20: 3.0, 40: 3.0, 60: 9.0, 80: 9.0, 100: None}
    assert promised and all(p == want[step] for step, p in promised), promised
    st = cli("status")
    assert st.returncode == 0 and "Optuna grid" in st.stdout, st.stderr
    assert f"best so far: trial {best.number}" in st.stdout, st.stdout
    keep_figures("study-campaign-live.json", {
        "elastic_groups": True,
        "reforms": {s["job"]: [(r["kind"], len(r.get("members") or [])) for r in metrics_records(camp, s["job"])
                               if r["event"] == "reform"] for s in slots_},
        "trials": {str(v.number): {"lr": v.params["lr"], "state": v.state, "last_step": v.last_step,
                                   "value": v.values[0] if v.values else v.last_value} for v in views},
        "pruned": sorted(v.number for v in views if v.state == "pruned"),
        "low_lr_pruned": sum(by_lr[lr].state == "pruned" for lr in (0.00001, 0.00002))}, tmp_path)


def test_nas_example_with_nsga2_closes_trials_with_both_objectives(clean, tmp_path):
    """The shipped NSGA-II NAS example (val_acc up, parameter count down), smaller: 4 trials, 2 at
    once, 100 steps.  Each trial closes with both values from the real training script's result,
    and status marks the Pareto front (the trials no other beats in both)."""
    import sys

    import yaml

    from malletrain.campaign.status import pareto_front
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "examples", "train", "nas-nsga2-digits.yaml")) as fh:
        doc = yaml.safe_load(fh)
    assert doc["sampler"] == "nsga2" and doc["metric"] == ["val_acc", "params"]
    doc.update({"command": [sys.executable, EXAMPLE], "dir": "camp", "trials": 4, "max_concurrent": 2})
    doc["fixed"]["steps"] = 100
    doc["job"]["grace_s"] = GRACE_S
    spec = tmp_path / "spec.yaml"
    spec.write_text(json.dumps(doc))
    env = dict(clean.env, PYTHONPATH=root)

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "malletrain", "campaign", *args, str(spec)],
                              env=env, capture_output=True, text=True, timeout=120)
    sub = cli("submit")
    assert sub.returncode == 0, sub.stderr
    d = DaemonProc(tmp_path, clean).start()
    try:
        def closed():
            rows = json.loads(cli("status", "--json").stdout)
            return sum(r["state"] in ("done", "failed") for r in rows) == 4 and rows
        rows = wait_until(closed, 420, "the 4 trials to close")
    finally:
        d.stop()
    assert all(r["state"] == "done" and len(r["values"]) == 2 for r in rows), rows
    assert all(0.0 <= r["values"][0] <= 1.0 and r["values"][1] > 0 for r in rows), rows
    front = {r["trial"] for r in pareto_front(rows, ("max", "min"))}
    assert front and {r["trial"] for r in rows if r["best"]} == front
    text = cli("status").stdout
    assert "4 done, 0 pruned, 0 failed of 4; Pareto front (val_acc max, params min): " in text, text


def test_trial_preempted_by_slurm_alone_is_requeued_not_completed(clean, tmp_path):
    """No daemon: Slurm preempts the trial for a primary job (GraceTime); the trial
    checkpoints and exits within the grace time, and the template requeues it (Slurm
    alone would record it COMPLETED); Slurm runs it again and it finishes exactly."""
    import sys

    import torch

    from malletrain.runtime.checkpoint import CheckpointStore
    cluster = clean
    steps = 900
    train = ["--steps", str(steps), "--checkpoint-every-s", "0", "--eval-every", "100000"]
    out = subprocess.run(
        [sys.executable, "-m", "malletrain", "submit", "--name", "alone", "--min-nodes", "1",
         "--max-nodes", "4", "--grace-s", str(GRACE_S), "--metrics-dir", str(tmp_path / "metrics"),
         "--", sys.executable, EXAMPLE, "--ckpt", str(tmp_path / "ckpt"), *train],
        env=dict(cluster.env, PYTHONPATH=os.path.dirname(EXAMPLE) + "/../.."), capture_output=True,
        text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    job = out.stdout.strip()
    cluster.sh("scontrol", "update", f"jobid={job}", "NumNodes=2-2", "StartTime=now")
    cluster.sh("scontrol", "release", job)
    wait_until(lambda: any(r["event"] == "progress" and r["step"] >= 100
                           for r in metrics_records(tmp_path, job)), 120, "the trial to train")
    prim = cluster.sh("sbatch", "--parsable", "-p", "batch", "-N", "4", "-o", "/dev/null",
                      "--wrap", "sleep 3").strip()
    wait_until(lambda: cluster.jobs().get(prim, {}).get("state") == "RUNNING", 90,
               "the primary job to preempt the trial")
    assert cluster.jobs().get(job, {}).get("state") == "PENDING", cluster.jobs().get(job)
    # Slurm makes a requeued job eligible 2 minutes later (SLURM-NOTES); the daemon lifts that
    # with StartTime=now when it starts a job, and so does this test, which is about the requeue
    wait_until(lambda: cluster.jobs().get(prim, {}).get("state") is None, 60, "the primary job to end")
    cluster.sh("scontrol", "update", f"jobid={job}", "StartTime=now")
    result = tmp_path / "ckpt" / "result.json"
    wait_until(lambda: result.exists() and json.loads(result.read_text()).get("final"), 300,
               "Slurm to rerun the trial to the end")
    recs = metrics_records(tmp_path, job)
    stop = [r for r in recs if r["event"] == "exit" and r.get("reason") == "signal"]
    assert stop and stop[0]["signal_to_exit_s"] < GRACE_S
    assert [r["restart"] for r in recs if r["event"] == "start"] == [0, 1]
    ref = subprocess.run([sys.executable, EXAMPLE, "--ckpt", str(tmp_path / "ref"), *train],
                         capture_output=True, text=True, timeout=300)
    assert ref.returncode == 0, ref.stderr[-2000:]
    got = CheckpointStore(str(tmp_path / "ckpt")).restore(quarantine=False).state["model"]
    want = CheckpointStore(str(tmp_path / "ref")).restore(quarantine=False).state["model"]
    assert all(torch.equal(got[k], want[k]) for k in want)


# ---------------------------------------------------------------- answers the fake backend relies on

@MATRIX
def test_the_fake_answers_as_this_slurm_does_for_purged_jobs_and_refused_requeues(clean, tmp_path):
    """tests/helpers.FakeSlurm answers as the real slurmctld does (exit code, stdout, the error
    text the daemon matches) where the unit tests of issue #22 rely on it: ``squeue -j`` of one
    id slurmctld no longer holds (purged after MinJobAge; a never-used id is the same to it), of
    several such ids, and ``scontrol requeuehold`` of a running job submitted ``--no-requeue``.
    And the real backend, restarted with a book for a purged job, keeps cycling."""
    from helpers import FakeSlurm

    from malletrain.slurm.adapter import Book
    from malletrain.slurm.runner import UNKNOWN_JOB
    fake = FakeSlurm()
    for argv in (["squeue", "-h", "-j", "9999999", "-t", "all", "-o", "%i|%T|%r"],
                 ["squeue", "-h", "-j", "9999999", "-o", "%i|%T|%r"],
                 ["squeue", "-h", "-j", "9999998,9999999", "-t", "all", "-o", "%i|%T|%r"]):
        real = subprocess.run(argv, env=clean.env, capture_output=True, text=True, timeout=30)
        said = fake(list(argv))
        assert (real.returncode, real.stdout) == (said.returncode, said.stdout), argv
        assert (UNKNOWN_JOB in real.stderr) == (UNKNOWN_JOB in said.stderr), (argv, real.stderr)
    job = clean.sh("sbatch", "--parsable", "-p", "scavenger", "-N", "1", "--no-requeue", "-o", "/dev/null",
                   "--wrap", "sleep 120").strip()
    wait_until(lambda: clean.jobs().get(job, {}).get("state") == "RUNNING", 30, "the --no-requeue job to run")
    real = subprocess.run(["scontrol", "requeuehold", job], env=clean.env, capture_output=True, text=True,
                          timeout=30)
    fake.jobs[job] = dict(partition="scavenger", state="RUNNING", reason="None", nodes=("n1",), comment="",
                          requeue=False)
    said = fake(["scontrol", "requeuehold", job])
    assert (real.returncode, real.stdout, real.stderr.strip()) == (said.returncode, said.stdout, said.stderr.strip())
    backend = _cli_backend(clean, tmp_path)
    backend.books["9999999"] = Book(running=("n1",))        # known to the daemon's store only
    for _ in range(2):
        backend.observe()                                    # raised "Invalid job id" before
    assert "9999999" not in backend.books
