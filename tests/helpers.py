"""Small builders shared by the tests."""
from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import time

from malletrain.domain.timeutil import iso
from malletrain.slurm.parse import Tag

T0 = 1_600_000_000


def write_events(path, rows, gz=False):
    opener = gzip.open if gz else open
    with opener(path, "wt") as fh:
        fh.write("time,node,state\n")
        for t, n, s in rows:
            fh.write(f"{iso(T0 + t)},{n},{s}\n")


def write_workload(path, jobs):
    import yaml
    with open(path, "w") as fh:
        yaml.safe_dump({"jobs": jobs}, fh, sort_keys=False)


def job(name="a", submit=0, lo=1, hi=4, work=1000.0, up=0, down=0, profile="p", thr=None):
    return {"name": name, "submit": submit, "min_nodes": lo, "max_nodes": hi, "work": work,
            "rescale_up_s": up, "rescale_down_s": down, "profile": profile,
            "throughput": thr or {1: 10.0, 2: 20.0, 4: 40.0}}


# ---------------------------------------------------------------- a scripted Slurm CLI

TAG = Tag("tok", 1, 4, "p", 2.0, 1.0, "").encode()
GROUP_TAG = Tag("grp", 1, 3, "p", 0.5, 0.5, "", group=True).encode()
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL"}


class FakeSlurm:
    """Answers squeue/sinfo/scontrol from a tiny in-memory cluster."""

    def __init__(self):
        self.jobs = {}      # id -> dict(partition, state, reason, nodes, start, sched, comment)
        self.nodes = {f"n{i}": "idle" for i in range(1, 5)}
        self.calls = []
        self.assoc = {}     # user -> GrpTRES text (sacctmgr), e.g. "node=2"
        self.next_id = 1000  # ids of array tasks split off their array's record

    def key(self, spec):
        """The record a job id names: a plain job's id, an array task's ``A_T``, or the own id a
        started task got (arrays: :func:`held_array`)."""
        if spec in self.jobs:
            return spec
        return next((k for k, r in self.jobs.items() if r.get("id") == spec), spec)

    def __call__(self, argv, **kw):
        self.calls.append(argv)
        cmd = argv[0]
        # like Slurm: without '-t all', squeue lists pending, running and completing jobs only
        everything = "-t" in argv and argv[argv.index("-t") + 1] == "all"
        listed = {j: r for j, r in self.jobs.items() if everything or r["state"] not in ENDED}
        if cmd == "squeue" and "-j" in argv:     # an array's id names all of its tasks
            ids = [k for x in argv[argv.index("-j") + 1].split(",")
                   for k in ([k for k, r in self.jobs.items() if r.get("array") == x] or [self.key(x)])]
            if len(ids) == 1 and ids[0] not in self.jobs:   # like slurmctld: one id it no longer holds
                return subprocess.CompletedProcess(argv, 1, "", "slurm_load_jobs error: Invalid job id specified\n")
            listed = {j: listed[j] for j in ids if j in listed}
        if cmd == "squeue" and "-r" not in argv:    # like Slurm: an array's pending tasks show as one line
            listed = _collapsed(listed, (kw.get("env") or {}).get("SLURM_BITSTR_LEN"))
        if cmd == "squeue" and argv[-1] == "%i|%U|%P|%k":
            out = "".join(f"{j}|{r.get('uid', 1000)}|{r['partition']}|{r['comment']}\n" for j, r in listed.items())
        elif cmd == "squeue" and argv[-1] == "%i|%T|%r":
            out = "".join(f"{j}|{r['state']}|{r['reason']}\n" for j, r in listed.items())
        elif cmd == "squeue":
            out = "".join(
                f"{r.get('id', j)}|{r.get('shown', j)}|{r['partition']}|{r['state']}|{r['reason']}|"
                f"{max(1, len(r['nodes']))}|"
                f"{','.join(r['nodes'])}|{r.get('start', 'N/A')}|{','.join(r.get('sched', [])) or '(null)'}|"
                f"100|{r.get('user', 'u')}|{r.get('uid', 1000)}\n" for j, r in listed.items())
        elif cmd == "sinfo" and "--version" in argv:
            out = "slurm 22.05.8\n"
        elif cmd == "sinfo":
            out = "".join(f"{n}|{s}|gpu:4|(null)\n" for n, s in self.nodes.items())
        elif cmd == "scontrol" and argv[1] == "-o":
            out = "No reservations in the system\n"
        elif cmd == "scontrol" and argv[1:3] == ["show", "topology"]:   # topology.conf: two leaf switches
            out = ("SwitchName=s1 Level=0 LinkSpeed=1 Nodes=n[1-2]\nSwitchName=s2 Level=0 LinkSpeed=1 "
                   "Nodes=n[3-4]\nSwitchName=top Level=1 LinkSpeed=1 Switches=s[1-2]\n")
        elif cmd == "scontrol":
            out = self._scontrol(argv[1:])
            if isinstance(out, subprocess.CompletedProcess):
                return subprocess.CompletedProcess(argv, out.returncode, out.stdout, out.stderr)
        elif cmd == "sacctmgr":          # show assoc where users=... format=User,GrpTRES
            assert argv[1:5] == ["-nP", "show", "assoc", "where"], argv     # as the real one takes them
            users = next(a for a in argv if a.startswith("users="))[len("users="):].split(",")
            out = "".join(f"{u}|{self.assoc.get(u, '')}\n" for u in users if u in self.assoc or u == "root")
        elif cmd == "scancel":      # a job, or every task of an array
            tasks = [k for k, r in self.jobs.items() if r.get("array") == argv[1]]
            for k in [k for k in tasks if self.jobs[k]["state"] not in ENDED] if tasks else [self.key(argv[1])]:
                self.end(k, "CANCELLED")
                self.jobs[k]["reason"] = "None"
            out = ""
        else:
            raise AssertionError(argv)
        return subprocess.CompletedProcess(argv, 0, out, "")

    def _scontrol(self, args):
        verb, rest = args[0], args[1:]
        if rest and "=" not in rest[0]:
            rest = [self.key(rest[0]), *rest[1:]]
        if verb == "requeuehold":
            j = self.jobs[rest[0]]
            if j.get("requeue") is False:    # sbatch --no-requeue (Requeue=0): 22.05, 24.11, 26.05 alike
                return subprocess.CompletedProcess(
                    [], 1, "", f"Requested operation is presently disabled for job {rest[0]}\n")
            for n in j["nodes"]:
                self.nodes[n] = "idle"
            j.update(state="PENDING", reason="job requeued in held state", nodes=())
        elif verb in ("hold", "uhold"):   # like Slurm: a running job keeps running
            # an operator's or admin's `hold` is an admin hold its owner cannot release; `uhold`
            # is a user hold (22.05, 24.11, 26.05: tests/test_slurm_live.py)
            if self.jobs[rest[0]]["state"] == "PENDING":
                self.jobs[rest[0]].update(reason="JobHeldUser" if verb == "uhold" else "JobHeldAdmin")
        elif verb == "update":
            kv = {k.lower(): v for k, v in (a.split("=", 1) for a in rest)}
            key = self.key(kv["jobid"])
            self._split(key)
            self.jobs[key]["req"] = kv["reqnodelist"]
        elif verb == "release":
            self._split(rest[0])
            self.jobs[rest[0]].update(reason="None")
        return ""

    def _split(self, key):
        """Like slurmctld: an array task that is updated or released alone becomes a job record of
        its own, with a new id, unless it is the array's last task on the shared record."""
        r = self.jobs[key]
        if r.get("array") and r.get("id") == r["array"]:
            shared = [k for k, x in self.jobs.items() if x.get("array") == r["array"] and x.get("id") == r["array"]]
            if len(shared) > 1:
                self.next_id += 1
                r["id"] = str(self.next_id)

    def end(self, jid, state):
        """The job ends (``FAILED``, ``COMPLETED``…): like Slurm, its nodes are idle again."""
        j = self.jobs[jid]
        for n in j["nodes"]:
            self.nodes[n] = "idle"
        j.update(state=state, nodes=())

    def purge(self, jid):
        """slurmctld forgets the job (MinJobAge after it ended, or while the daemon was down)."""
        self.end(jid, "COMPLETED")
        del self.jobs[jid]

    def run_pending(self):   # Slurm starts released jobs on their requested nodes
        import hostlist
        for j in self.jobs.values():
            if j["state"] == "PENDING" and j["reason"] == "None" and j.get("req"):
                j.update(state="RUNNING", nodes=tuple(hostlist.expand_hostlist(j["req"])), ran=True)
                for n in j["nodes"]:
                    self.nodes[n] = "allocated"


def _collapsed(listed, bitstr_len=None):
    """squeue without -r (22.05, 24.11, 26.05): an array's pending tasks that never ran as one
    line (``7_[0-2,4]``), those split off its record with ids and reasons of their own too; the
    line has the array's record's id and every reason of the tasks (``JobHeldUser,Resources``).
    A task requeued after it ran is a line of its own (22.05 and 24.11; 26.05 merges it too).
    The task list is cut to SLURM_BITSTR_LEN - 1 characters ending in "..." when longer (0:
    whole); without it, the shown id is cut to 31 characters with no mark."""
    out, pending = {}, {}
    for k, r in listed.items():
        if r.get("array") and r["state"] == "PENDING" and not r.get("ran"):
            pending.setdefault(r["array"], []).append((k, r))
        else:
            out[k] = r
    for array, rows in pending.items():
        if len(rows) == 1:
            out[rows[0][0]] = rows[0][1]
            continue
        rows.sort(key=lambda kr: int(kr[0].split("_")[1]))
        own = next((r for _, r in rows if r.get("id") == array), rows[0][1])
        reasons = ",".join(dict.fromkeys(r["reason"] for _, r in rows))
        tasks = _ranges(int(k.split("_")[1]) for k, _ in rows)
        if bitstr_len is None:
            shown = f"{array}_[{tasks}]"[:31]
        else:
            cut = int(bitstr_len)
            shown = f"{array}_[{tasks[:cut - 4] + '...' if cut and len(tasks) > cut - 1 else tasks}]"
        out[rows[0][0]] = dict(own, reason=reasons, shown=shown)
    return out


def _ranges(ids):
    """``0, 1, 2, 4`` -> ``0-2,4``, as Slurm prints a set of task ids."""
    spans: list[list[int]] = []
    for t in ids:
        if spans and t == spans[-1][1] + 1:
            spans[-1][1] = t
        else:
            spans.append([t, t])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def held_array(fake, gid, tasks, comment=None, uid=1000, partition="scavenger"):
    """``sbatch --array=0-(tasks-1) --hold``: tasks ``GID_T`` that share the array's job id until
    one is updated or released (it then gets an id of its own, as in slurmctld)."""
    for t in range(tasks):
        fake.jobs[f"{gid}_{t}"] = dict(partition=partition, state="PENDING", reason="JobHeldUser", nodes=(),
                                       comment=GROUP_TAG if comment is None else comment, uid=uid, array=gid,
                                       id=gid, shown=f"{gid}_{t}")


def held_job(fake, jid, comment=TAG, uid=1000, user="u"):
    fake.jobs[jid] = dict(partition="scavenger", state="PENDING", reason="JobHeldUser", nodes=(),
                          comment=comment, uid=uid, user=user)


def progress_records(path):
    """The JSON-line progress records a run wrote (none yet: [])."""
    if not os.path.exists(path):
        return []
    with open(path) as fh:
        return [json.loads(x) for x in fh]


def wait_step(metrics, step, timeout_s=60):
    """Until a record of ``metrics`` is at ``step`` or later."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if any(r.get("step", 0) >= step for r in progress_records(metrics)):
            return
        time.sleep(0.05)
    raise AssertionError(f"no progress to step {step} in {metrics}")


def finished(p, timeout=300):
    """(status, stdout, stderr) of a launched run once it ended.  Past ``timeout`` the run and
    every process below it (the wrapper, torchrun's agent and the workers) are killed, so that a
    hung run does not keep processes for the rest of the tests, and TimeoutExpired is raised."""
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(p)
        raise
    return p.returncode, out, err


GLOO_EXIT_ABORT = "terminate called without an active exception"


def plain_run_ended(rc: int, err: str) -> bool:
    """Whether a finished run of an unadapted ``train_plain.py`` ended as such a script does:
    exit 0, or the gloo abort at interpreter exit that every adapter's exit hook prevents (a rank
    aborts after its script's last line, torchrun fails the run: 134; README, "A clean exit";
    ``devtools.gloo_exit`` counts it: about 1 plain run in 18).  The negative controls compare
    what such a run saved, so the saved file is what they check next; an abort before the save
    fails them there."""
    return rc == 0 or (rc == 134 and GLOO_EXIT_ABORT in err)


def kill_tree(p) -> None:
    """SIGKILL ``p`` and every process below it (torchrun's workers run in sessions of their
    own, so a process group is not enough), then reap ``p``."""
    for pid in [*descendants(p.pid), p.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    p.communicate()


def descendants(root: int) -> list[int]:
    """The pids below ``root`` in the process tree (from /proc)."""
    parent = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as fh:
                    parent[int(name)] = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    out, todo = [], [root]
    while todo:
        above = todo.pop()
        kids = [pid for pid, pp in parent.items() if pp == above]
        out += kids
        todo += kids
    return out


def worker_pids(marker: str) -> list[int]:
    """The training processes whose command line holds ``marker`` (not torchrun's agent, the
    ``malletrain.runtime.torchrun`` wrapper, nor pgrep)."""
    pids = subprocess.run(["pgrep", "-f", "--", marker], capture_output=True, text=True).stdout.split()
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                argv = fh.read().split(b"\0")
        except OSError:
            continue
        if b"malletrain.runtime.torchrun" in argv or b"pgrep" in argv[0]:
            continue
        out.append(int(pid))
    return out


_LAUNCHED: list = []


def torchrun(target: list[str], procs: int, *, env: dict | None = None):
    """``selfcheck.torchrun_local``, remembered: after each test, ``reap_launched`` (an autouse
    fixture of conftest.py) kills what a failed assertion left running, so that an orphaned
    training run does not slow every test after it."""
    from malletrain.runtime.selfcheck import torchrun_local
    p = torchrun_local(target, procs, env=env)
    _LAUNCHED.append(p)
    return p


def reap_launched() -> None:
    while _LAUNCHED:
        p = _LAUNCHED.pop()
        if p.poll() is None:
            kill_tree(p)


def launch_example(directory, script, procs, tmp, name, epochs, *, extra=(), metrics=None, freeze_at=None):
    """An example training script (``<directory>/<script>``) under the torchrun wrapper on this
    host: ``epochs`` epochs, its model to ``<tmp>/<name>.pt``; with ``freeze_at``, its last rank
    freezes after that optimizer step (tests/fixtures/at_step.py, :func:`kill_frozen_worker`)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {"MALLETRAIN_GRACE_S": "10", "PYTHONPATH": root, **({"MALLETRAIN_METRICS": metrics} if metrics else {})}
    return torchrun([*at_step(env, freeze_at=freeze_at), os.path.join(directory, script), "--epochs", str(epochs),
                     "--out", str(tmp / f"{name}.pt"), *extra], procs, env=env)


def at_step(env: dict, *, freeze_at=None, stop_at=None) -> list[str]:
    """The argv prefix (and, into ``env``, the settings) that runs a training script under
    tests/fixtures/at_step.py: its last rank frozen after optimizer step ``freeze_at``, a stop at
    step ``stop_at``; nothing when neither is given."""
    if freeze_at is None and stop_at is None:
        return []
    for var, step in (("MALLETRAIN_TEST_FREEZE_AT", freeze_at), ("MALLETRAIN_TEST_STOP_AT", stop_at)):
        if step is not None:
            env[var] = str(step)
    return [os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "at_step.py")]


def frozen_worker(marker: str, timeout_s: float = 120) -> int:
    """The pid of the worker (command line holding ``marker``) that froze itself under
    tests/fixtures/at_step.py, once it has."""
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        for pid in worker_pids(marker):
            try:
                with open(f"/proc/{pid}/stat") as fh:
                    state = fh.read().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if state == "T":
                return pid
        time.sleep(0.05)
    raise AssertionError(f"no worker of {marker!r} froze in {timeout_s} s")


def kill_frozen_worker(marker: str, timeout_s: float = 120) -> int:
    """SIGKILL the worker that froze itself (:func:`frozen_worker`), once it has: a kill -9 at a
    known step instead of a race between the test's polling and the run's last steps (a loaded CI
    machine once let a run finish between the two).  Returns its pid."""
    pid = frozen_worker(marker, timeout_s)
    os.kill(pid, signal.SIGKILL)
    return pid


def wait_pending(pid: int, sig: int, timeout_s: float = 60) -> None:
    """Until ``sig`` is pending for the process ``pid`` (a stopped process keeps it pending until
    it is continued): the signal has been delivered, not yet handled."""
    bit = 1 << (sig - 1)
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        with open(f"/proc/{pid}/status") as fh:
            masks = [int(line.split()[1], 16) for line in fh if line.startswith(("SigPnd:", "ShdPnd:"))]
        if any(m & bit for m in masks):
            return
        time.sleep(0.02)
    raise AssertionError(f"signal {sig} never reached process {pid} in {timeout_s} s")


def sigterm_at_frozen_step(p, marker: str, metrics: str, step: int) -> dict:
    """SIGTERM the launcher ``p`` while its last rank is frozen after ``step`` (started with
    ``freeze_at=step``; the worker found by ``marker``), and continue that rank once the signal is
    pending for it: no rank can step on before the signal is there, so the run stops at ``step``
    or the next whatever the machine's load.  Checks the stop (exit 3, a SIGTERM, within 10 s, at
    ``step`` or ``step + 1``) and returns its ``exit`` record."""
    frozen = frozen_worker(marker)
    p.send_signal(signal.SIGTERM)
    wait_pending(frozen, signal.SIGTERM)
    os.kill(frozen, signal.SIGCONT)
    rc, _, err = finished(p)
    assert rc == 3, err[-3000:]
    stop = [r for r in progress_records(metrics) if r["event"] == "exit"][-1]
    assert stop["reason"] == "signal" and stop["signal"] == "SIGTERM" and stop["signal_to_exit_s"] < 10
    assert stop["step"] in (step, step + 1), "the stop should come at the frozen step or the next"
    return stop


def param_diff(a, b):
    """The largest difference of a parameter between two saved state dicts."""
    import torch
    x, y = torch.load(a), torch.load(b)
    return max((x[k] - y[k]).abs().max().item() for k in x)



def plan_record(plan) -> tuple:
    """A plan as replay tests compare it: its allocations and every action with its reason."""
    return (sorted(plan.allocations.items()),
            [(a.job_id, a.kind, a.from_nodes, a.to_nodes, a.code, a.reason) for a in plan.actions])
