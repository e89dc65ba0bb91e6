"""Issue #26's schedule under real Slurm: an elastic group's survivors' pause per kind of change,
on each release (``python -m devtools.elastic_slurm --slurm host|24.11|26.05``).

A local cluster (``scripts/local-slurm.sh``, 4 nodes, its own directory and port) runs one job made
by ``malletrain submit --elastic`` (a held array of four 1-node members, the reference CNN of
:mod:`malletrain.runtime.reference`, consistency mode).  This program plays the daemon's part with
the commands the daemon uses, so that every change is one Slurm really makes, and runs

    shrink 4->3 (requeuehold of one member), Slurm preempts one member (a primary job on its node),
    grow back to 4 (update + release of held members), kill -9 of one member's process, grow to 4

``--cycles`` times.  It reads the runtime's ``reform`` records (the survivors' pause and its
phases) and checks, at every preemption, that the members on the other nodes kept their job and
never restarted: a one-node preemption idles one node.  Bitwise results are the elastic drill's
and the end-to-end live test's to show (``devtools.elastic_drill``, ``tests/test_slurm_live.py``).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from devtools.bench_queue import BenchCluster
from devtools.elastic_drill import _records

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PORTS = {"host": 7117, "24.11": 7147, "26.05": 7177}
MEMBERS = 4
REQUEUE_GAP_S = 2.0      # a requeued member is restarted no sooner (the daemon: a cycle later, 10 s by default)


class Group:
    """The job's members as Slurm shows them, and the commands the daemon would run."""

    def __init__(self, cluster: BenchCluster, job: str, metrics: str) -> None:
        self.c, self.job, self.metrics = cluster, job, metrics

    def sh(self, *argv: str) -> str:
        out = self.c.run(*argv)
        if out.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {out.stderr.strip()[:300]}")
        return out.stdout

    def members(self) -> dict[int, dict]:
        out = self.c.run("squeue", "-h", "-r", "-j", self.job, "-o", "%K|%A|%T|%N|%r").stdout
        res = {}
        for line in out.splitlines():
            task, jid, state, node, reason = line.split("|")
            if task.isdigit():
                res[int(task)] = dict(id=jid, state=state, node=node, reason=reason)
        return res

    def running(self) -> dict[int, str]:
        return {t: m["node"] for t, m in self.members().items() if m["state"] == "RUNNING"}

    def start(self, task: int, node: str) -> None:
        self.sh("scontrol", "update", f"JobId={self.job}_{task}", "NumNodes=1-1", f"ReqNodeList={node}",
                "StartTime=now")
        self.sh("scontrol", "release", f"{self.job}_{task}")

    def hold(self, task: int) -> None:
        self.sh("scontrol", "requeuehold", f"{self.job}_{task}")

    def hold_requeued(self) -> None:
        """Members Slurm (or their own batch script) requeued: held again, as the daemon does."""
        for t, m in self.members().items():
            if m["state"] == "PENDING" and "held" not in m["reason"].lower():
                self.c.run("scontrol", "uhold", f"{self.job}_{t}")

    def reforms(self) -> list[dict]:
        return [r for r in _records(os.path.join(self.metrics, f"{self.job}.jsonl"))
                if isinstance(r, dict) and r.get("event") == "reform"]


def wait_until(pred, timeout_s: float, what: str):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.2)
    raise RuntimeError(f"timed out after {timeout_s:.0f}s waiting for {what}")


def _sized(running: dict[int, str], n: int) -> dict[int, str] | None:
    return running if len(running) == n else None


def _kill_member(job: str, task: int) -> int:
    """SIGKILL the member's training process (not its batch shell): found by its environment."""
    want = {f"SLURM_ARRAY_JOB_ID={job}".encode(), f"SLURM_ARRAY_TASK_ID={task}".encode()}
    killed = 0
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read()
            if b"malletrain.runtime.reference" not in cmd:
                continue
            with open(f"/proc/{pid}/environ", "rb") as fh:
                env = set(fh.read().split(b"\0"))
        except OSError:
            continue
        if want <= env:
            os.kill(int(pid), signal.SIGKILL)
            killed += 1
    return killed


def run(args) -> dict:
    work = tempfile.mkdtemp(prefix="malletrain-elastic-slurm-", dir="/tmp")
    os.chmod(work, 0o755)
    cluster = BenchCluster(os.path.join(work, "cluster"), PORTS[args.slurm], 1000)
    print(f"starting a 4-node Slurm ({args.slurm}) in {work}", file=sys.stderr)
    cluster.up("--slurm", args.slurm)
    try:
        return _schedule(cluster, work, args)
    finally:
        cluster.run("scancel", "-u", "root")
        try:
            cluster.script("down")
        except RuntimeError as exc:
            print(f"warning: {exc}", file=sys.stderr)


def _schedule(cluster: BenchCluster, work: str, args) -> dict:
    release = cluster.run("sinfo", "--version").stdout.split()[-1]
    metrics, ckpt = os.path.join(work, "metrics"), os.path.join(work, "ckpt")
    env = dict(cluster.env, PYTHONPATH=ROOT, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "malletrain.runtime.reference", "--dir", ckpt, "--until", "10000000",
           "--report-s", "0", "--step-sleep-s", "0.03", "--elastic"]
    sub = subprocess.run([sys.executable, "-m", "malletrain", "submit", "--elastic", "--name", "esb",
                          "--min-nodes", "1", "--max-nodes", str(MEMBERS), "--grace-s", "10", "--launch", "batch",
                          "--metrics-dir", metrics, "--", *cmd], env=env, capture_output=True, text=True, timeout=120)
    if sub.returncode != 0:
        raise RuntimeError(sub.stderr)
    g = Group(cluster, sub.stdout.strip(), metrics)
    nodes = [f"n{i}" for i in range(1, MEMBERS + 1)]

    def settle(size: int, kind: str, since: int, timeout_s: float = 180) -> dict:
        """The first re-forming after ``since`` records that leaves ``size`` members."""
        try:
            return wait_until(lambda: next((r for r in g.reforms()[since:] if len(r.get("members") or ()) == size
                                            and (kind == "any" or r["kind"] == kind)), None), timeout_s,
                              f"a {kind} re-forming to {size} members")
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}; members {g.members()}; primary jobs on {busy()}; re-formings since: "
                               f"{[(r['kind'], r.get('members')) for r in g.reforms()[since:]]}") from None

    def steady() -> bool:
        """Every member running or queued (none ending or being requeued), the queued ones held."""
        ms = g.members()
        if len(ms) < MEMBERS or any(m["state"] not in ("RUNNING", "PENDING") for m in ms.values()):
            return False
        g.hold_requeued()
        return all(m["state"] == "RUNNING" or "held" in m["reason"].lower() for m in g.members().values())

    def grow_to_full(kind: str) -> None:
        seen = len(g.reforms())
        try:
            wait_until(steady, 120, "every member running or held")
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}: {g.members()}") from None
        wait_until(lambda: len(set(nodes) - set(g.running().values()) - busy()) >= MEMBERS - len(g.running()),
                   120, "free nodes")
        # as the daemon, which sees a requeued member one cycle later: Slurm refuses to launch a job
        # on the node it left within about a second ("Job credential revoked"; the member then ends
        # FAILED), which an immediate restart would run into
        time.sleep(REQUEUE_GAP_S)
        on = g.running()
        free = sorted(set(nodes) - set(on.values()) - busy())
        spare = sorted(t for t, m in g.members().items() if m["state"] == "PENDING")
        for task, node in zip(spare, free):
            g.start(task, node)
        print(f"  grow: started {list(zip(spare, free))} beside {on}", file=sys.stderr)
        settle(MEMBERS, "any", seen)
        events.append((kind, len(on), MEMBERS))

    def busy() -> set[str]:
        out = cluster.run("squeue", "-h", "-p", "batch", "-t", "running", "-o", "%N").stdout.split()
        return set(out)

    def one_cycle(isolation: list[bool]) -> None:
        on = g.running()
        seen = len(g.reforms())
        g.hold(max(on))                           # the daemon's shrink
        settle(MEMBERS - 1, "shrink", seen)
        events.append(("shrink", MEMBERS, MEMBERS - 1))
        on = wait_until(lambda: _sized(g.running(), MEMBERS - 1), 60, "three members running")
        before = {t: g.members()[t]["id"] for t in on}
        victim = min(on)
        seen = len(g.reforms())
        cluster.run("sbatch", "-p", "batch", "-N", "1", "-w", on[victim], "-o", "/dev/null", "--wrap", "sleep 3")
        settle(MEMBERS - 2, "shrink", seen)       # Slurm preempted that member alone
        events.append(("preemption", MEMBERS - 1, MEMBERS - 2))
        wait_until(lambda v=victim: v not in g.running(), 60, "the preempted member to leave its node")
        now = g.members()
        isolation.append(all(now[t]["state"] == "RUNNING" and now[t]["id"] == before[t]
                             for t in on if t != victim))
        grow_to_full("grow")
        on = g.running()
        seen = len(g.reforms())
        killed = max(on)
        if not _kill_member(g.job, killed):
            raise RuntimeError("no process of the member to kill")
        settle(MEMBERS - 1, "loss", seen)
        events.append(("loss", MEMBERS, MEMBERS - 1))
        wait_until(lambda k=killed: k not in g.running(), 60, "the killed member's job to leave its node")
        grow_to_full("grow")

    events: list[tuple[str, int, int]] = []
    isolation: list[bool] = []
    seen = 0
    for task, node in enumerate(nodes):          # the group forms on four nodes
        g.start(task, node)
    settle(MEMBERS, "any", seen, timeout_s=300)
    stopped, done = "", 0
    for cycle in range(args.cycles):
        print(f"cycle {cycle + 1}/{args.cycles}", file=sys.stderr)
        try:
            one_cycle(isolation)
            done += 1
        except RuntimeError as exc:        # reported with the cycles done: a harness stuck, not a pause
            lost = {t: cluster.run("scontrol", "show", "job", f"{g.job}_{t}").stdout.split("\n")[:2]
                    for t in range(MEMBERS) if t not in g.members()}
            stopped = f"cycle {cycle + 1} stopped: {exc}; members gone from the queue: {lost}"
            print(stopped, file=sys.stderr)
            break
    recs = g.reforms()
    return {"release": release, "cycles": args.cycles, "cycles_done": done,
            "stopped": stopped, "isolated_preemptions": sum(isolation),
            "preemptions": len(isolation), "events": events,
            "reforms": [{k: r.get(k) for k in ("kind", "members", "pause_s", "detect_s", "agree_s", "form_s",
                                               "transfer_s")} for r in recs]}


def report(res: dict) -> str:
    lines = [f"elastic group under Slurm {res['release']}: {res['cycles_done']} of {res['cycles']} cycles of shrink "
             f"/ Slurm preemption / grow / kill -9 / grow done, 4 nodes, the reference CNN (consistency mode)"]
    if res["stopped"]:
        lines.append(f"  {res['stopped'][:600]}")
    by: dict[str, list[dict]] = {}
    for r in res["reforms"]:
        by.setdefault(r["kind"], []).append(r)
    allp = []
    for kind in ("shrink", "grow", "loss", "change"):
        rs = by.get(kind, [])
        if not rs:
            continue
        ps = sorted(float(r["pause_s"]) for r in rs)
        allp += ps
        phases = {k: statistics.median(float(r[k]) for r in rs if r.get(k) is not None)
                  for k in ("detect_s", "agree_s", "form_s", "transfer_s") if any(r.get(k) is not None for r in rs)}
        lines.append(f"  {kind:7s} n={len(ps):3d} median {statistics.median(ps):7.3f} s  p90 "
                     f"{ps[int(0.9 * (len(ps) - 1))]:7.3f} s  max {ps[-1]:7.3f} s   phases (median): "
                     + (", ".join(f"{k[:-2]} {v:.3f} s" for k, v in phases.items()) or "-"))
    lines.append(f"  all re-formings: median {statistics.median(allp):.3f} s over {len(allp)} "
                 "(a shrink the daemon orders and one Slurm's preemption forces are both 'shrink' here)")
    lines.append(f"  one-node preemptions that left every other member running, same job, no restart: "
                 f"{res['isolated_preemptions']} of {res['preemptions']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m devtools.elastic_slurm", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--slurm", choices=sorted(PORTS), default="host", help="the Slurm release (default: the host's)")
    p.add_argument("--cycles", type=int, default=10, help="schedule repetitions (default 10)")
    p.add_argument("--json", help="write the raw figures here too")
    args = p.parse_args(argv)
    if os.geteuid() != 0:
        p.error("needs root (slurmd)")
    res = run(args)
    print(report(res))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(res, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
