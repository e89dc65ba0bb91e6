"""Unit tests of the Slurm side that need no cluster: parsing (22.05 and 23.11+
shapes), the subprocess seam, progress tailing, config, submission script."""
from __future__ import annotations

import json
import os
import subprocess

import pytest

from malletrain.daemon.progress import ProgressTail
from malletrain.daemon.service import DaemonMetrics, JsonFormatter, Notifier
from malletrain.domain.config import config_from_mapping, load_config
from malletrain.domain.errors import BackendError, ConfigError, InputError
from malletrain.slurm import parse
from malletrain.slurm.runner import Runner, SlurmCommandError, clean_env
from malletrain.slurm.submit import build_submission

FIX = os.path.join(os.path.dirname(__file__), "fixtures", "slurm")
GOLDEN = os.path.join(os.path.dirname(__file__), "golden")


def _load(name):
    with open(os.path.join(FIX, name)) as fh:
        return fh.read() if name.endswith(".txt") else json.load(fh)


RELEASES = ("22.05", "24.11", "26.05")    # fixtures captured from each real slurmctld


@pytest.mark.parametrize("version", RELEASES)
def test_json_shapes_normalise_to_the_same_records(version):
    jobs = {j.job_id: j for j in parse.jobs_from_json(_load(f"squeue-{version}.json"))}
    text = {j.job_id: j for j in parse.parse_squeue(_load(f"squeue-{version}.txt"))}
    held, running, pending = jobs["7"], jobs["8"], jobs["9"]
    assert held.phase is parse.Phase.HELD and parse.parse_tag(held.comment).max_nodes == 4
    assert running.phase is parse.Phase.RUNNING and running.nodes == ("n1", "n2", "n3")
    assert running.node_count == 3 and running.start_s == text["8"].start_s
    assert pending.phase is parse.Phase.PENDING and pending.start_s == text["9"].start_s > running.start_s
    nodes = {n.name: n for n in parse.nodes_from_json(_load(f"sinfo-{version}.json"))}
    assert sorted(nodes) == ["n1", "n2", "n3", "n4"]
    assert not nodes["n4"].harvestable and "PLANNED" in nodes["n4"].states
    assert not nodes["n1"].harvestable and "ALLOCATED" in nodes["n1"].states
    assert nodes["n1"].gres == "gpu:4"
    assert parse.release(_load(f"squeue-{version}.json")).startswith(version)
    # only 26.05 gives each run of a job its own id (versions.py)
    assert bool(held.run_id) is (version == "26.05")


@pytest.mark.parametrize("version", RELEASES)
def test_text_formats_agree_with_json(version):
    text = {j.job_id: j for j in parse.parse_squeue(_load(f"squeue-{version}.txt"))}
    js = {j.job_id: j for j in parse.jobs_from_json(_load(f"squeue-{version}.json"))}
    for jid in ("7", "8", "9"):
        a, b = text[jid], js[jid]
        assert (a.phase, a.nodes, a.node_count, a.partition, a.uid) == (
            b.phase, b.nodes, b.node_count, b.partition, b.uid)
    assert text["9"].start_s == js["9"].start_s and text["9"].sched_nodes == ("n1", "n2", "n3", "n4")
    nodes = {n.name: n for n in parse.parse_sinfo(_load(f"sinfo-{version}.txt"))}
    assert nodes["n4"].states == {"PLANNED"} and not nodes["n4"].harvestable
    rec = parse.parse_tag_record("7", _load(f"squeue-tag-{version}.txt"))
    assert (rec.uid, rec.partition) == (0, "scavenger") and parse.parse_tag(rec.comment).metrics_dir == "/tmp/m"


def test_the_daemon_text_reads_print_the_same_on_every_release():
    """What versions.py says: the -o formats did not change (values aside)."""
    def shape(text):
        return [[f if not f.isdigit() else "#" for f in line.split("|")] for line in text.splitlines()]
    for kind in ("squeue", "squeue-tag", "sinfo"):
        shapes = {v: shape(_load(f"{kind}-{v}.txt")) for v in RELEASES}
        assert shapes["24.11"] == shapes["22.05"] == shapes["26.05"], (kind, shapes)


@pytest.mark.parametrize("text,want", [
    ("slurm 22.05.8\n", (22, 5, 8, False, False)), ("slurm 24.11.5\n", (24, 11, 5, True, False)),
    ("slurm 26.05.5\n", (26, 5, 5, True, True)), ("slurm-wlm 23.02.7\n", (23, 2, 7, True, False))])
def test_release_and_what_differs(text, want):
    from malletrain.slurm.versions import parse_release
    r = parse_release(text)
    assert (r.major, r.minor, r.micro, r.json_numbers_wrapped, r.run_ids) == want
    assert r.tested
    assert r.notes().startswith(f"Slurm {r.text}")


@pytest.mark.parametrize("version", RELEASES)
def test_the_api_version_of_each_release_is_what_its_json_says(version):
    from malletrain.slurm.versions import parse_release
    data = _load(f"squeue-{version}.json")
    r = parse_release("slurm " + parse.release(data))
    plugin = data["meta"]["plugin"]
    assert r.data_parser and (plugin.get("data_parser") or plugin["type"]).endswith(r.data_parser)


def test_release_outside_the_tested_range_is_said_and_garbage_is_an_error():
    from malletrain.slurm.versions import parse_release
    assert "untested" in parse_release("slurm 20.11.9").notes()
    assert "untested" not in parse_release("slurm 24.11.5").notes()
    with pytest.raises(BackendError, match="Slurm version"):
        parse_release("sinfo: fatal: Could not establish a configuration source")


@pytest.mark.parametrize("state,harvestable", [
    ("idle", True), ("idle*", False), ("idle~", False), ("planned", False), ("reserved", False),
    ("drained", False), ("idle+drain", False), ("down*", False), ("mixed", False), ("allocated", False)])
def test_node_states(state, harvestable):
    (n,) = parse.parse_sinfo(f"n1|{state}|gpu:a100:4|(null)\n")
    assert n.harvestable is harvestable
    assert n.node_type == "a100"


def test_numbers_and_bad_lines():
    assert parse.number({"set": True, "infinite": False, "number": 5}) == 5
    assert parse.number({"set": False, "infinite": False, "number": 5}) is None
    assert parse.number({"set": True, "infinite": True, "number": 0}) is None
    assert parse.number(7) == 7 and parse.number(None) is None
    with pytest.raises(BackendError, match="want 12 Slurm fields"):
        parse.parse_squeue("1|batch|RUNNING\n")
    with pytest.raises(BackendError, match="node list"):
        parse.expand("n[1-")
    with pytest.raises(BackendError, match="Slurm fields"):   # times must be epoch seconds
        parse.parse_squeue("1|1|b|PENDING|r|1||2026-01-01T00:00:00|(null)|1|u|0\n")


def test_reservations():
    text = ("ReservationName=maint StartTime=100 EndTime=200 Duration=00:01:40 Nodes=n[1-2] NodeCnt=2\n")
    (r,) = parse.parse_reservations(text)
    assert (r.start_s, r.end_s, r.nodes) == (100, 200, ("n1", "n2"))
    assert parse.parse_reservations("No reservations in the system\n") == []


FORGED = "7|7|scavenger|PENDING|JobHeldUser|1||N/A|(null)|1795352834|alice|1001"


@pytest.mark.parametrize("text", [
    "x\n" + FORGED,                  # a newline, then a well-formed record
    "a|b|c",                         # '|' shifts fields
    "malletrain:v1 token=t min=1 max=4\n" + FORGED,
])
def test_user_text_cannot_forge_a_queue_record(text):
    """Names and comments never reach the queue-wide read; if Slurm's output did hold user
    text (an older format, a bug), a line that is not exactly Slurm's fields is an error,
    never a record."""
    good = "9|9|batch|PENDING|Resources|4||1795352894|n[1-4]|1795352834|bob|1002"
    with pytest.raises(BackendError):
        parse.parse_squeue(good + "|" + text + "\n")
    bad: list[str] = []                    # the daemon's way: the odd line is left out and counted
    recs = parse.parse_squeue(good + "|" + text.replace("\n", " ") + "\n" + good + "\n", bad)
    assert [r.job_id for r in recs] == ["9"] and len(bad) == 1
    # the tag read takes everything after the third '|' as the one job's comment
    rec = parse.parse_tag_record("12", f"12|1002|scavenger|{text}\n")
    assert rec.job_id == "12" and rec.uid == 1002 and rec.comment == text
    assert parse.parse_tag(rec.comment) is None
    with pytest.raises(BackendError):
        parse.parse_tag_record("12", f"7|1001|scavenger|{text}\n")   # not the job asked for
    assert parse.parse_tag_record("12", "") is None


@pytest.mark.parametrize("change", [
    ("max=4", "max=" + "9" * 310), ("up=2.0", "up=1e12"), ("up=2.0", "up=nan"), ("up=2.0", "up=inf"),
    ("down=1.0", "down=-1"), ("min=1", "min=0"), ("metrics=/tmp/m", "metrics=rel/dir"),
    ("metrics=/tmp/m", "metrics=/tmp/../etc"), ("metrics=/tmp/m", "metrics=/tmp/m%00x"),
    ("metrics=/tmp/m", "metrics=/tmp/m%0Ax"), ("profile=p", "profile=a%2Fb"), ("profile=p", "profile=%1B%5B31m"),
    ("token=tok", "token=" + "t" * 65), ("profile=p", "profile=p x=" + "y" * 5000)])
def test_hostile_tags_are_not_tags(change):
    good = parse.Tag("tok", 1, 4, "p", 2.0, 1.0, "/tmp/m").encode()
    assert parse.parse_tag(good) is not None
    assert parse.parse_tag(good.replace(*change)) is None


def test_tag_roundtrip_and_garbage():
    tag = parse.Tag("t0k", 2, 8, "resnet", 30.0, 20.0, "/home/a b/m")
    assert parse.parse_tag(tag.encode()) == tag
    assert parse.parse_tag("") is None
    assert parse.parse_tag("malletrain:v1 token=x min=3 max=2") is None
    assert parse.parse_tag("malletrain:v1 min=oops") is None


# ---------------------------------------------------------------- runner

class FakeExec:
    def __init__(self, script):
        self.script, self.calls = list(script), []

    def __call__(self, argv, **kw):
        self.calls.append((argv, kw))
        step = self.script.pop(0)
        if isinstance(step, BaseException):
            raise step
        rc, out, err = step
        return subprocess.CompletedProcess(argv, rc, out, err)


def test_runner_env_is_sanitised():
    env = clean_env({"SQUEUE_FORMAT": "%i", "SINFO_SORT": "x", "SBATCH_PARTITION": "p", "PATH": "/bin",
                     "SLURM_TIME_FORMAT": "relative", "LANG": "de_DE", "SLURM_BITSTR_LEN": "8"}, "/etc/s.conf")
    assert env == {"PATH": "/bin", "LC_ALL": "C", "SLURM_TIME_FORMAT": "%s", "SLURM_CONF": "/etc/s.conf"}
    assert clean_env({}, None, array_tasks=True)["SLURM_BITSTR_LEN"] == "65536"      # elastic groups on


def test_runner_retries_reads_with_backoff_then_raises():
    sleeps = []
    fake = FakeExec([(1, "", "slurm_load_jobs error: Unable to contact slurm controller"),
                     subprocess.TimeoutExpired(["squeue"], 1.0), (0, "ok\n", "")])
    r = Runner(exec_fn=fake, sleep=sleeps.append, retries=3, backoff_s=0.5)
    assert r.read(["squeue", "-h"]) == "ok\n"
    assert len(sleeps) == 2 and 0.25 <= sleeps[0] <= 0.75 and 0.5 <= sleeps[1] <= 1.5
    assert all(kw["timeout"] == r.timeout_s and "shell" not in kw for _, kw in fake.calls)
    fake = FakeExec([subprocess.TimeoutExpired(["sinfo"], 1.0)] * 2)
    r = Runner(exec_fn=fake, sleep=lambda s: None, retries=1)
    with pytest.raises(SlurmCommandError) as err:
        r.read(["sinfo"])
    assert err.value.timed_out and err.value.argv == ["sinfo"] and "timed out" in str(err.value)


def test_runner_stops_retrying_once_told_to_stop():
    """SIGTERM during a controller outage: the read in flight fails and is not retried, and a
    backoff wait in progress ends at once (the default sleep waits on the stop event)."""
    import threading
    import time
    down = (1, "", "Unable to contact slurm controller")
    sleeps = []
    fake = FakeExec([down] * 4)
    r = Runner(exec_fn=fake, sleep=sleeps.append, retries=3)
    r.stop.set()
    with pytest.raises(SlurmCommandError):
        r.read(["squeue"])
    assert len(fake.calls) == 1 and sleeps == []
    fake = FakeExec([down] * 2)
    r = Runner(exec_fn=fake, retries=1, backoff_s=3600.0)      # an hour's backoff, cut short
    threading.Timer(0.2, r.stop.set).start()
    t0 = time.monotonic()
    with pytest.raises(SlurmCommandError):
        r.read(["squeue"])
    assert len(fake.calls) == 1 and time.monotonic() - t0 < 60


def test_runner_never_retries_writes():
    fake = FakeExec([(1, "", "Invalid job id specified")])
    r = Runner(exec_fn=fake, sleep=lambda s: None, retries=3)
    with pytest.raises(SlurmCommandError) as err:
        r.write(["scontrol", "release", "99"])
    assert err.value.rc == 1 and "Invalid job id" in err.value.stderr and len(fake.calls) == 1
    assert r.stats.total_writes == 1 and r.stats.total_failures == 1


# ---------------------------------------------------------------- progress files

def _rec(t, samples, nodes=2, restart=0, event="progress"):
    return json.dumps(dict(t=t, job="5", step=int(samples), samples=samples, step_s=0.1, world=nodes,
                           nodes=nodes, node="n1", event=event, restart=restart)) + "\n"


def test_progress_tail_incremental_and_garbage(tmp_path):
    path = tmp_path / "5.jsonl"
    tail = ProgressTail(max_line_bytes=300)
    path.write_text(_rec(0, 0, event="start") + _rec(1, 100) + _rec(2, 300) + "{not json\n"
                    + "x" * 1000 + "\n" + json.dumps({"t": "nan?", "samples": 1}) + "\n"
                    + json.dumps({"t": 3, "samples": -5, "nodes": 2}) + "\n" + _rec(3, 500)[:20])
    s = tail.poll("5", str(path))
    assert [(x.nodes, x.samples_per_s) for x in s] == [(2, 200.0)]
    assert tail.counters.bad == 3 and tail.counters.oversized == 1
    with open(path, "a") as fh:            # the half-written line is completed later
        fh.write(_rec(3, 500)[20:] + _rec(4, 600, nodes=4) + _rec(5, 1000, nodes=4))
    s = tail.poll("5", str(path))
    assert [(x.nodes, x.samples_per_s) for x in s] == [(2, 200.0), (4, 400.0)]
    saved = tail.dump()
    again = ProgressTail()
    again.load(saved)
    assert again.poll("5", str(path)) == []          # a restarted daemon does not re-read
    path.write_text(_rec(10, 0, restart=1, event="start"))   # truncated/rotated: read from 0
    assert again.poll("5", str(path)) == [] and again.files[str(path)].offset > 0
    assert tail.poll("5", str(tmp_path / "missing.jsonl")) == []


# ---------------------------------------------------------------- config

def test_config_unknown_keys_list_valid_ones(tmp_path):
    with pytest.raises(ConfigError, match="valid keys: .*interval_s.*vacate_lead_s"):
        config_from_mapping({"daemon": {"interval": 5}}, "c.yaml")
    with pytest.raises(ConfigError, match="valid sections: core, slurm, daemon"):
        config_from_mapping({"deamon": {}}, "c.yaml")
    with pytest.raises(ConfigError, match="core.policy"):
        config_from_mapping({"core": {"policy": "magic"}}, "c.yaml")
    p = tmp_path / "c.yaml"
    p.write_text("daemon:\n  interval_s: [1\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(str(p))
    p.write_text("daemon:\n  interval_s: 2\nslurm:\n  partition: harvest\n")
    cfg = load_config(str(p))
    assert cfg.daemon.interval_s == 2 and cfg.slurm.partition == "harvest"


# ---------------------------------------------------------------- submission

def test_submission_matches_golden():
    argv, script = build_submission(
        ["python", "train.py", "--lr", "0.1 0.2"], name="lr", min_nodes=1, max_nodes=4,
        gpus_per_node=4, profile="resnet", time_limit="1:00:00", rescale_up_s=30,
        rescale_down_s=20, metrics_dir="/home/u/.malletrain/metrics", partition="scavenger",
        token="0123456789abcdef", script_path="/home/u/.malletrain/metrics/job-0123456789abcdef.sbatch")
    with open(os.path.join(GOLDEN, "submit.argv.json")) as fh:
        assert argv == json.load(fh)
    with open(os.path.join(GOLDEN, "submit.sbatch")) as fh:
        assert script == fh.read()


def test_an_elastic_submission_is_a_held_array_of_one_node_members_with_one_process_each():
    argv, script = build_submission(
        ["python", "train.py"], name="cnn", min_nodes=2, max_nodes=4, gpus_per_node=4, profile="cnn",
        time_limit=None, rescale_up_s=1, rescale_down_s=1, metrics_dir="/home/u/m", partition="scavenger",
        token="0123456789abcdef", script_path="/home/u/m/job-0123456789abcdef.sbatch", elastic=True)
    with open(os.path.join(GOLDEN, "submit-elastic.argv.json")) as fh:
        assert argv == json.load(fh)
    assert "--array=0-3" in argv and "--nodes=1" in argv and parse.parse_tag(argv[-3][len("--comment="):]).group
    assert "srun --ntasks-per-node=1 python train.py" in script      # one process per member, 4 GPUs or not
    with pytest.raises(InputError, match="torchrun"):
        build_submission(["python", "t.py"], name="x", min_nodes=1, max_nodes=2, gpus_per_node=0, profile="x",
                         time_limit=None, rescale_up_s=1, rescale_down_s=1, metrics_dir="/m", partition="p",
                         token="t", script_path="/m/s", launch="torchrun", elastic=True)


# ---------------------------------------------------------------- service bits

def test_json_logs_metrics_and_notify(tmp_path):
    import logging
    import socket
    rec = logging.LogRecord("malletrain.slurm", logging.INFO, __file__, 1, "job %s grew", ("5",), None)
    rec.cycle, rec.job, rec.reason = 7, "5", "probe"
    out = json.loads(JsonFormatter().format(rec))
    assert out["msg"] == "job 5 grew" and out["cycle"] == 7 and out["job"] == "5" and out["reason"] == "probe"
    m = DaemonMetrics()
    m.advance("starts", 2)
    m.advance("starts", 2)      # cumulative: no change
    m.advance("starts", 5)
    m.command_seconds.labels(command="squeue").observe(0.5)
    m.decisions.labels(code="gain").inc()
    text = m.render()
    assert "# TYPE malletrain_starts_total counter" in text and "malletrain_starts_total 5.0" in text
    assert 'malletrain_slurm_command_seconds_count{command="squeue"} 1.0' in text
    assert 'malletrain_decisions_total{code="gain"} 1.0' in text
    sock_path = str(tmp_path / "notify")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    srv.bind(sock_path)
    n = Notifier({"NOTIFY_SOCKET": sock_path, "WATCHDOG_USEC": "3000000"})
    n.ready("hi")
    n.watchdog()
    n.status("two\nlines")
    n.stopping()
    got = [srv.recv(100).decode() for _ in range(4)]
    assert got == ["READY=1\nSTATUS=hi", "WATCHDOG=1", "STATUS=two lines", "STOPPING=1"]
    assert Notifier({}).send("READY=1") is False


@pytest.mark.live
def test_systemd_unit_verifies(tmp_path):
    """The shipped unit passes `systemd-analyze verify` (binary path pointed at this venv);
    a host tool, so it runs with the live tier (Debian 12 has it; missing, it fails)."""
    import shutil
    import sys
    tool = shutil.which("systemd-analyze")
    assert tool is not None, "systemd-analyze is not installed"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    text = open(os.path.join(root, "scripts", "malletrain.service")).read()
    assert "Type=notify" in text and "ExecReload=" in text and "NoNewPrivileges=yes" in text
    exe = os.path.join(os.path.dirname(sys.executable), "malletrain")
    unit = tmp_path / "malletrain.service"
    unit.write_text(text.replace("/opt/malletrain/.venv/bin/malletrain", exe))
    out = subprocess.run([tool, "verify", str(unit)], capture_output=True, text=True)
    problems = [x for x in (out.stdout + out.stderr).splitlines() if "malletrain.service" in x]
    assert out.returncode == 0 and not problems, out.stdout + out.stderr


def test_submission_quotes_hostile_values_in_one_pass():
    d = "/home/u/{{launch}}/100%/it's"
    argv, script = build_submission(
        ["python", "t.py"], name="n\x1b[31m", min_nodes=1, max_nodes=2, gpus_per_node=0, profile="p",
        time_limit=None, rescale_up_s=1, rescale_down_s=1, metrics_dir=d, partition="scavenger",
        token="t1", script_path=d + "/job.sbatch")
    assert "--output=/home/u/{{launch}}/100%%/it's/%x-%j.out" in argv
    assert "export MALLETRAIN_METRICS='/home/u/{{launch}}/100%/it'\"'\"'s'/" in script
    assert script.count("python t.py") == 1                # the {{launch}} in the path stayed text
    tag = parse.parse_tag(next(a for a in argv if a.startswith("--comment="))[len("--comment="):])
    assert tag.metrics_dir == d and tag.name == ""       # a name with escapes is not copied into the tag


@pytest.mark.parametrize("kw,match", [
    (dict(max_nodes=10**310), "max nodes"), (dict(rescale_up_s=1e12), "rescale-up"),
    (dict(rescale_up_s=float("nan")), "rescale-up"), (dict(profile="a/b"), "profile"),
    (dict(metrics_dir="/a/../b"), "metrics dir")])
def test_submission_rejects_what_the_daemon_would_not_accept(kw, match):
    spec = dict(name="x", min_nodes=1, max_nodes=2, gpus_per_node=0, profile="p", time_limit=None,
                rescale_up_s=1, rescale_down_s=1, metrics_dir="/m", partition="s", token="t", script_path="/m/s")
    spec.update(kw)
    with pytest.raises(InputError, match=match):
        build_submission(["true"], **spec)


def test_arrays_het_jobs_and_long_reasons_as_slurm_prints_them():
    """Seen on Slurm 22.05: a pending array prints its id cut to 31 characters
    (``4_[1,4,9,16,25,36,49,64,81,100,``) or with a step (``1_[1-25:2]``); a reason lists
    down nodes.  None stops the read; arrays and het jobs are never plain (never adopted)."""
    reason = "ReqNodeNotAvail, UnavailableNodes:" + ",".join(f"node{i:04d}" for i in range(0, 600, 7))
    text = ("4|4_[1,4,9,16,25,36,49,64,81,100,|scavenger|PENDING|JobHeldUser|1||N/A|(null)|1|u|7\n"
            "1|1_[1-25:2]|scavenger|PENDING|JobHeldUser|1||N/A|(null)|1|u|7\n"
            "13|12+1|scavenger|PENDING|None|1||N/A|(null)|1|u|7\n"
            f"2|2|batch|PENDING|{reason}|1||N/A|(null)|1|u|7\n")
    recs = {r.job_id: r for r in parse.parse_squeue(text)}
    assert {j: r.plain for j, r in recs.items()} == {"4": False, "1": False, "13": False, "2": True}
    assert recs["2"].reason == reason


def test_topology_leaf_switches_group_the_nodes():
    from malletrain.slurm.parse import parse_topology
    text = ("SwitchName=s1 Level=0 LinkSpeed=1 Nodes=n[1-2]\nSwitchName=s2 Level=0 LinkSpeed=1 Nodes=n3,n4\n"
            "SwitchName=top Level=1 LinkSpeed=1 Switches=s[1-2]\nSwitchName=bad Level=0 Nodes=n[5-\n")
    assert parse_topology(text) == {"n1": "s1", "n2": "s1", "n3": "s2", "n4": "s2"}
    assert parse_topology("") == {} and parse_topology("No topology information available\n") == {}


@pytest.mark.parametrize("elastic", [True, False])
def test_the_batch_script_addresses_a_member_as_its_array_task_and_a_plain_job_as_itself(tmp_path, elastic):
    """Issue #26: the member left on the array's own job id (slurmctld keeps the last unstarted
    task there) must requeue only itself after a stop: ``scontrol requeue ARRAY_TASK``; the array's
    id would requeue every member.  A plain job submitted from inside an array task inherits that
    task's SLURM_ARRAY_* variables: it is still its own job, not elastic."""
    import stat
    import subprocess
    fake = tmp_path / "bin"
    fake.mkdir()
    calls = tmp_path / "calls"
    for name, body in (("squeue", 'echo "squeue $*" >> "$CALLS"; echo RUNNING'),
                       ("scontrol", 'echo "scontrol $*" >> "$CALLS"')):
        (fake / name).write_text(f"#!/bin/sh\n{body}\n")
        (fake / name).chmod(stat.S_IRWXU)
    seen = tmp_path / "seen"
    command = ["sh", "-c", f'echo "$MALLETRAIN_JOB $MALLETRAIN_ELASTIC $MALLETRAIN_METRICS" > {seen}; exit 137']
    _, script = build_submission(command, name="x", min_nodes=1, max_nodes=4, gpus_per_node=0, profile="x",
                                 time_limit=None, rescale_up_s=1, rescale_down_s=1, metrics_dir=str(tmp_path / "m"),
                                 partition="p", token="t", script_path="/m/s", launch="batch", elastic=elastic)
    env = {"PATH": f"{fake}:/usr/bin:/bin", "CALLS": str(calls), "SLURM_JOB_ID": "7", "SLURM_ARRAY_JOB_ID": "7",
           "SLURM_ARRAY_TASK_ID": "3", "SLURM_JOB_NUM_NODES": "1", "SLURM_JOB_NODELIST": "n1"}
    if not elastic:       # a plain job 12, submitted from inside task 3 of array 7
        env["SLURM_JOB_ID"] = "12"
    out = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr          # stopped by a signal: it requeued itself
    job, flag, metrics = seen.read_text().split()
    said = calls.read_text().splitlines()
    if elastic:
        assert (job, flag) == ("7", "1") and metrics.endswith("/m/7.jsonl")
        assert said == ["squeue -h -t all -j 7_3 -o %T", "scontrol requeue 7_3"]
    else:
        assert (job, flag) == ("12", "0") and metrics.endswith("/m/12.jsonl")
        assert said == ["squeue -h -t all -j 12 -o %T", "scontrol requeue 12"]
