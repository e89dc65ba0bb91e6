"""Issue #26's benchmark and chaos test: rescaling in place against today's restart.

``python -m devtools.elastic_drill bench`` trains the reference model (a CNN with BatchNorm and
Dropout, SGD with momentum and a step schedule: :mod:`malletrain.runtime.reference`) in
consistency mode on this host and runs the schedule

    shrink 4->3, preempt one (3->2), grow back to 4, kill -9 one (4->3), grow to 4

``--cycles`` times, twice: as an elastic job (one process per member, :mod:`.elastic`) and
under today's path (every change stops every process, which checkpoints, and starts the new
count from the checkpoint; a killed process makes the others fail, and the job starts again
from its newest periodic checkpoint).  It reports the surviving ranks' pause per kind of change
(elastic: the runtime's ``reform`` records, split into phases; restart: the gap in the progress
records around the event), and checks that both runs end bitwise on an uninterrupted run's
parameters.

``python -m devtools.elastic_drill chaos --events 1000 --seed 1`` draws seeded random events
(leave, join, kill -9, and freeze: SIGSTOP, a hung node whose process
keeps its life lock, so only its pulse tells, then SIGKILL once the group went on without it)
as fast as the group takes them, keeping 1 to 4 members, and checks
that no event hangs the job (progress within ``--hang-s`` of each event) and that the final
parameters are bitwise those of the uninterrupted run: no step lost or applied twice.

Results go to stdout and, with ``--json``, to a file (``benchmarks/results/elastic-*.txt``
hold the committed runs).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

STEP_SLEEP_S = 0.03       # a step of the reference model is a few ms; this makes it ~40 ms
GAP_STEPS = 12            # progress between two events
CYCLE = (("shrink", 1), ("preempt", 1), ("grow", 2), ("kill", 1), ("grow", 1))


def _python_env(extra: dict) -> dict:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "MALLETRAIN_METRICS")}
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(OMP_NUM_THREADS="1", **extra)
    return env


def _argv(directory: str, until: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "malletrain.runtime.reference", "--dir", directory, "--until", str(until),
            "--report-s", "0", "--step-sleep-s", str(STEP_SLEEP_S), *extra]


ENDLESS = 10**7           # the drills stop their jobs with SIGTERM; the reference then trains as far


def reference_sha(work: str, until: int) -> str:
    """The parameters' SHA-256 after ``until`` steps of one process, never interrupted."""
    out = subprocess.run([sys.executable, "-m", "malletrain.runtime.reference", "--dir",
                          os.path.join(work, f"reference-{until}"), "--until", str(until)],
                         env=_python_env({"RANK": "0", "WORLD_SIZE": "1"}), capture_output=True,
                         text=True, timeout=900, check=True).stdout
    return out.split()[1]


def _records(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    out = []
    with open(path) as fh:
        for line in fh:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


class Progress:
    """The newest step in a metrics file, and its re-forming records, read incrementally."""

    def __init__(self, path: str) -> None:
        self.path, self.pos, self.step, self.t = path, 0, -1, 0.0
        self.reforms: list[dict] = []

    def poll(self) -> int:
        if os.path.exists(self.path):
            with open(self.path) as fh:
                fh.seek(self.pos)
                chunk = fh.read()
            cut = chunk.rfind("\n") + 1
            self.pos += cut
            for line in chunk[:cut].splitlines():
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if rec.get("event") == "progress" and rec.get("step", -1) > self.step:
                    self.step, self.t = rec["step"], rec["t"]
                elif rec.get("event") == "reform":
                    self.reforms.append(rec)
        return self.step

    def wait_beyond(self, step: int, timeout_s: float, alive=lambda: True) -> int:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.poll() > step:
                return self.step
            if not alive():
                raise RuntimeError("the job ended before the step was reached")
            time.sleep(0.01)
        raise TimeoutError(f"no progress beyond step {step} within {timeout_s:.0f}s (a hang)")


@dataclass
class Elastic:
    """An elastic job of member processes on this host."""
    work: str
    until: int
    timeout_s: float = 10.0
    procs: dict = field(default_factory=dict)
    next_id: int = 0
    exits: list = field(default_factory=list)

    def __post_init__(self) -> None:
        self.dir = os.path.join(self.work, "elastic")
        self.metrics = os.path.join(self.work, "elastic-metrics.jsonl")
        self.progress = Progress(self.metrics)

    def start(self) -> int:
        m = self.next_id
        self.next_id += 1
        log = open(os.path.join(self.work, f"member-{m}.log"), "w")
        env = _python_env({"MALLETRAIN_MEMBER": str(m), "MALLETRAIN_METRICS": self.metrics,
                           "MALLETRAIN_COLLECTIVE_TIMEOUT_S": str(self.timeout_s)})
        self.procs[m] = subprocess.Popen(_argv(self.dir, self.until, "--elastic"), env=env,
                                         stdout=subprocess.PIPE, stderr=log, text=True)
        log.close()
        return m

    def running(self) -> list[int]:
        self._reap()
        return sorted(self.procs)

    def _reap(self) -> None:
        for m, p in list(self.procs.items()):
            if p.poll() is not None:
                self.exits.append((m, p.returncode, p.stdout.read()))
                p.stdout.close()
                del self.procs[m]

    def signal(self, m: int, sig: int) -> None:
        self.procs[m].send_signal(sig)

    def wait_gone(self, m: int, timeout_s: float = 60.0) -> int:
        p = self.procs[m]
        p.wait(timeout=timeout_s)
        self._reap()
        return p.returncode

    def finish(self, timeout_s: float) -> str:
        """The parameters' digest once every member exited (the job done)."""
        return self._last(timeout_s)[0]

    def stop_all(self, timeout_s: float = 120.0) -> tuple[str, int]:
        """SIGTERM to every member: the group stops as a whole (a checkpoint); the digest and
        the step it stopped at."""
        for p in self.procs.values():
            p.send_signal(signal.SIGTERM)
        return self._last(timeout_s)

    def _last(self, timeout_s: float) -> tuple[str, int]:
        deadline = time.monotonic() + timeout_s
        for p in list(self.procs.values()):
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
        self._reap()
        lines = [out.split() for _, rc, out in self.exits if rc in (0, 3) and out.startswith("sha256")]
        if not lines:
            raise RuntimeError(f"no member ended the job: exits {[(m, rc) for m, rc, _ in self.exits]}")
        last = max(lines, key=lambda parts: int(parts[3]))
        return last[1], int(last[3])

    def kill_all(self) -> None:
        for p in self.procs.values():
            p.kill()

    def reforms(self) -> list[dict]:
        self.progress.poll()
        return self.progress.reforms

    def wait_members(self, ok, what: str, timeout_s: float = 120.0) -> None:
        """Until ``ok(members)`` holds for the group's newest membership (an empty tuple before
        the first re-forming)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            recs = self.reforms()
            if ok(tuple(recs[-1]["members"]) if recs else ()):
                return
            if not self.running():
                raise RuntimeError(f"the elastic job ended while waiting until {what}")
            time.sleep(0.02)
        raise TimeoutError(f"not {what} within {timeout_s:.0f}s (a hang)")


def run_elastic(work: str, cycles: int, timeout_s: float) -> dict:
    job = Elastic(work, ENDLESS, timeout_s)
    for _ in range(4):
        job.start()
    prog = job.progress
    events = []
    try:
        prog.wait_beyond(0, 120, lambda: bool(job.running()))
        step = prog.step
        rng = random.Random(0)
        for _ in range(cycles):
            for kind, count in CYCLE:
                step = prog.wait_beyond(step + GAP_STEPS, 120, lambda: bool(job.running()))
                events.append((kind, time.time(), step))
                if kind == "grow":
                    for _ in range(count):
                        job.start()
                    # the joiners prepare (import, model) while the others train on
                    want = len(job.running())
                    job.wait_members(lambda ms, want=want: len(ms) == want, f"the group has {want} members")
                else:
                    victim = rng.choice(job.running())
                    job.signal(victim, signal.SIGKILL if kind == "kill" else signal.SIGTERM)
                    rc = job.wait_gone(victim)
                    if kind != "kill" and rc != 3:
                        raise RuntimeError(f"member {victim} left with status {rc}, not 3")
                    step = prog.wait_beyond(prog.poll(), 60, lambda: bool(job.running()))
        prog.wait_beyond(step + GAP_STEPS, 120, lambda: bool(job.running()))
        sha, last = job.stop_all()
    finally:
        job.kill_all()
    return {"sha": sha, "step": last, "events": events, "reforms": job.reforms()}


def run_restart(work: str, cycles: int, timeout_s: float, every: int) -> dict:
    """Today's path: every change stops all processes and starts the new count."""
    from malletrain.runtime.selfcheck import spawn_ranks
    directory = os.path.join(work, "restart")
    metrics = os.path.join(work, "restart-metrics.jsonl")
    prog = Progress(metrics)
    env = {"MALLETRAIN_METRICS": metrics, "MALLETRAIN_COLLECTIVE_TIMEOUT_S": str(timeout_s)}
    argv = _argv(directory, ENDLESS, "--every", str(every))
    size, procs = 4, spawn_ranks(argv, 4, env=env)
    launch = [procs]
    events = []

    def alive() -> bool:
        return launch[0][0].poll() is None

    try:
        prog.wait_beyond(0, 120, alive)
        step = prog.step
        rng = random.Random(0)
        for _ in range(cycles):
            for kind, count in CYCLE:
                step = prog.wait_beyond(step + GAP_STEPS, 120, alive)
                t_event = time.time()
                if kind == "kill":
                    procs[rng.randrange(size)].kill()
                    for p in procs:
                        p.wait(timeout=timeout_s + 60)
                else:
                    for p in procs:
                        p.send_signal(signal.SIGTERM)
                    for p in procs:
                        p.communicate(timeout=120)
                size += count if kind == "grow" else -count
                procs = launch[0] = spawn_ranks(argv, size, env=env)
                step = prog.wait_beyond(prog.poll(), 120, alive)
                events.append({"kind": kind, "t": t_event})
        prog.wait_beyond(step + GAP_STEPS, 120, alive)
        for p in procs:
            p.send_signal(signal.SIGTERM)
        out, _ = procs[0].communicate(timeout=120)
        for p in procs[1:]:
            p.communicate(timeout=60)
    finally:
        for p in procs:
            p.kill()
    for e, pause in zip(events, restart_pauses(metrics)):
        e["pause_s"] = pause
    return {"sha": out.split()[1], "step": int(out.split()[3]), "events": events}


def restart_pauses(metrics: str) -> list[float]:
    """For each launch after the first: from the last step the previous launch applied to the
    first step beyond it (steps redone from an older checkpoint count as pause)."""
    out, last = [], None
    recs = _records(metrics)
    for i, r in enumerate(recs):
        if r.get("event") == "progress":
            last = r
        elif r.get("event") == "start" and last is not None and r["t"] > recs[0]["t"]:
            nxt = next((q for q in recs[i:] if q.get("event") == "progress" and q["step"] > last["step"]), None)
            if nxt is not None:
                out.append(round(nxt["t"] - last["t"], 4))
    return out


def redone_steps(metrics: str, t: float) -> int:
    """Steps trained again after an event at wall time ``t`` (the restart resumed before them)."""
    recs = [r for r in _records(metrics) if r.get("event") == "progress"]
    before = max((r["step"] for r in recs if r["t"] <= t), default=0)
    after = min((r["step"] for r in recs if r["t"] > t), default=before + 1)
    return before - (after - 1)


def _summary(kind: str, pauses: list[float]) -> str:
    if not pauses:
        return f"{kind:8s} -"
    p90 = sorted(pauses)[max(0, math.ceil(0.9 * len(pauses)) - 1)]
    return (f"{kind:8s} n={len(pauses):3d} median {statistics.median(pauses):7.3f} s  "
            f"p90 {p90:7.3f} s  max {max(pauses):7.3f} s")


def bench(args) -> int:
    work = tempfile.mkdtemp(prefix="malletrain-elastic-")
    print(f"elastic drill: reference model, consistency mode, L=4, {args.cycles} cycles of "
          f"{' / '.join(k for k, _ in CYCLE)}, {GAP_STEPS} steps apart, collective timeout "
          f"{args.timeout_s:.0f}s (work dir {work})", flush=True)
    t0 = time.monotonic()
    el = run_elastic(work, args.cycles, args.timeout_s)
    t_el = time.monotonic() - t0
    t0 = time.monotonic()
    rs = run_restart(work, args.cycles, args.timeout_s, args.every)
    t_rs = time.monotonic() - t0
    refs = {n: reference_sha(work, n) for n in {el["step"], rs["step"]}}
    el["equal"], rs["equal"] = el["sha"] == refs[el["step"]], rs["sha"] == refs[rs["step"]]
    lines = [f"elastic : stopped at step {el['step']}, sha256 {el['sha'][:16]}, uninterrupted run "
             f"{refs[el['step']][:16]}: {'bitwise equal' if el['equal'] else 'DIFFERENT'}; {t_el:.0f} s wall",
             f"restart : stopped at step {rs['step']}, sha256 {rs['sha'][:16]}, uninterrupted run "
             f"{refs[rs['step']][:16]}: {'bitwise equal' if rs['equal'] else 'DIFFERENT'}; {t_rs:.0f} s wall",
             "", "pause of the surviving ranks per change (elastic: re-forming in place)"]
    kinds = {"shrink": [], "grow": [], "loss": [], "change": []}
    phases: dict[str, dict[str, list]] = {}
    first = el["events"][0][1] if el["events"] else 0.0
    for r in el["reforms"]:
        if r["kind"] in kinds and r["t"] >= first:       # not the group's first formation
            kinds[r["kind"]].append(r["pause_s"])
            for k, v in r.items():
                if k.endswith("_s") and k not in ("pause_s", "step_s"):
                    phases.setdefault(r["kind"], {}).setdefault(k, []).append(v)
    for kind, ps in kinds.items():
        if ps:
            lines.append("  " + _summary(kind, ps))
            lines.append("           phases (median): " + ", ".join(
                f"{k[:-2]} {statistics.median(v):.3f} s" for k, v in sorted(phases.get(kind, {}).items())))
    lines.append("  (shrink and preempt are the same in the runtime: one member got SIGTERM)")
    every = [p for ps in kinds.values() for p in ps]
    lines.append(f"  all changes: median {statistics.median(every):.3f} s over {len(every)}")
    lines += ["", "pause per change under today's restart (stop all, start the new count)"]
    by = {}
    for e in rs["events"]:
        by.setdefault(e["kind"], []).append(e["pause_s"])
    for kind, ps in by.items():
        lines.append("  " + _summary(kind, ps))
    redone = [redone_steps(os.path.join(work, "restart-metrics.jsonl"), e["t"])
              for e in rs["events"] if e["kind"] == "kill"]
    if redone:
        lines.append(f"  kill: steps redone from the periodic checkpoint (every {args.every}): "
                     f"median {statistics.median(redone):.0f}")
    allr = [e["pause_s"] for e in rs["events"]]
    lines.append(f"  all changes: median {statistics.median(allr):.3f} s over {len(allr)}")
    print("\n".join(lines))
    ok = el["equal"] and rs["equal"]
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"references": refs, "elastic": el, "restart": rs, "ok": ok}, fh, indent=1)
    return 0 if ok else 1


def chaos(args) -> int:
    work = tempfile.mkdtemp(prefix="malletrain-chaos-")
    rng = random.Random(args.seed)
    job = Elastic(work, ENDLESS, args.timeout_s)
    job.start()
    prog = job.progress
    counts = {"leave": 0, "join": 0, "kill": 0, "freeze": 0}
    t0 = time.monotonic()
    try:
        prog.wait_beyond(-1, 120, lambda: bool(job.running()))
        for i in range(args.events):
            running = job.running()
            recs = job.reforms()
            admitted = [m for m in (recs[-1]["members"] if recs else running[:1]) if m in running]
            choices = []
            if len(running) < 4:
                choices += ["join"] * 2
            if len(admitted) > 1:
                choices += ["leave", "kill", "leave", "kill", "freeze"]
            elif len(running) > len(admitted):
                choices += ["kill"]          # a joiner still preparing or waiting to be admitted
            kind = rng.choice(choices)
            before = prog.poll()
            if kind == "join":
                m = job.start()
                if rng.random() < 0.7:       # most joiners get in; the others race the next events
                    job.wait_members(lambda ms, m=m: m in ms or m not in job.running(),
                                     f"member {m} is admitted", args.hang_s)
            else:
                # SIGTERM only to members that joined (the runtime's handler is installed);
                # SIGKILL to anyone but the last member that holds the state
                pool = admitted if kind in ("leave", "freeze") else [
                    m for m in running if m not in admitted or len(admitted) > 1]
                victim = rng.choice(pool)
                if kind == "freeze":        # a hung node: the process holds its lock, its pulse stops
                    job.signal(victim, signal.SIGSTOP)
                    prog.wait_beyond(before + 2, args.hang_s, lambda: bool(job.running()))
                    job.signal(victim, signal.SIGKILL)
                else:
                    job.signal(victim, signal.SIGKILL if kind == "kill" else signal.SIGTERM)
                rc = job.wait_gone(victim)
                if kind == "leave" and rc != 3:
                    raise RuntimeError(f"event {i}: member {victim} left with status {rc}")
            counts[kind] += 1
            prog.wait_beyond(before + rng.randint(1, 3), args.hang_s, lambda: bool(job.running()))
            if (i + 1) % 50 == 0:
                print(f"  {i + 1} events ({counts}), step {prog.step}, {len(job.running())} members, "
                      f"{time.monotonic() - t0:.0f} s", flush=True)
        sha, last = job.stop_all()
    finally:
        job.kill_all()
    ref = reference_sha(work, last)
    recs = job.reforms()
    ok = sha == ref
    print(f"chaos seed {args.seed}: {args.events} events {counts}, {len(recs)} re-formings, stopped at step {last}, "
          f"{time.monotonic() - t0:.0f} s; final sha256 {sha[:16]} vs uninterrupted {ref[:16]}: "
          f"{'bitwise equal' if ok else 'DIFFERENT'}; no hang (every event was followed by progress "
          f"within {args.hang_s:.0f} s)")
    by = {}
    for r in recs:
        by.setdefault(r["kind"], []).append(r["pause_s"])
    for kind, ps in sorted(by.items()):
        print("  " + _summary(kind, ps))
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m devtools.elastic_drill", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("bench", help="the schedule, elastic vs. restart")
    b.add_argument("--cycles", type=int, default=10)
    b.add_argument("--every", type=int, default=25, help="restart mode: checkpoint every N steps")
    b.add_argument("--timeout-s", type=float, default=10.0, help="collective timeout")
    b.add_argument("--json", help="write the raw results here")
    c = sub.add_parser("chaos", help="seeded random join/leave/kill events")
    c.add_argument("--events", type=int, default=1000)
    c.add_argument("--seed", type=int, default=1)
    c.add_argument("--timeout-s", type=float, default=10.0, help="collective timeout")
    c.add_argument("--hang-s", type=float, default=60.0, help="an event without progress this long is a hang")
    args = p.parse_args(argv)
    return bench(args) if args.cmd == "bench" else chaos(args)


if __name__ == "__main__":
    sys.exit(main())
