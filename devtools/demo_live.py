"""The live demo: a time-compressed slice of a real job log as the centre's own
(primary) jobs, malleable jobs harvesting what they leave idle, and a report.

``examples/primary-jobs.csv`` holds 8 consecutive jobs of the ALCF Theta 2022
log (SWF, from job 12000), compressed in time (submit gaps and run times ÷
``TIME_SCALE``, run times clipped to 8–40 s) and in size (128 → 1 node, 256 → 2, 512 → 3, ≥1024 → 4 nodes of the local
cluster).  The driver submits them to the ``batch`` partition at their
compressed times, samples the cluster once a second, and prints:
harvested node-seconds (malleable) vs. idle node-seconds, each primary job's
wait (start − submit) and the part of it spent waiting for a malleable job to
leave (a 1-s-resolution upper bound: seconds it was pending while enough
nodes were free of primary jobs but not of malleable ones), preemptions by Slurm, the daemon's
starts/rescales/give-backs.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import os
import subprocess
import sys
import time

from malletrain.daemon.status import read_status

TIME_SCALE = 100.0
HEADER = ["submit_s", "nodes", "runtime_s", "theta_job", "theta_nodes"]


def primary_stream_from_swf(path: str, first_job: int = 12000, count: int = 8) -> list[dict]:
    rows = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.startswith(";") or not line.strip():
                continue
            f = line.split()
            if int(f[0]) < first_job:
                continue
            run, procs = int(f[3]), int(f[4])
            if run <= 0 or procs <= 0:
                continue
            rows.append((int(f[0]), int(f[1]), run, procs))
            if len(rows) == count:
                break
    t0 = rows[0][1]
    out = []
    for jid, submit, run, procs in rows:
        nodes = 1 if procs <= 128 else 2 if procs <= 256 else 3 if procs <= 512 else 4
        out.append(dict(submit_s=round((submit - t0) / TIME_SCALE, 1), nodes=nodes,
                        runtime_s=max(8, min(40, round(run / TIME_SCALE))), theta_job=jid,
                        theta_nodes=procs))
    return out


def write_stream(rows: list[dict], path: str) -> None:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, HEADER)
        w.writeheader()
        w.writerows(rows)


def read_stream(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        return [{k: float(v) if k.endswith("_s") else int(v) for k, v in row.items()}
                for row in csv.DictReader(fh)]


def _sh(env, *argv) -> str:
    return subprocess.run(list(argv), env=env, capture_output=True, text=True, timeout=30).stdout


def run(stream_path: str, out_dir: str, max_s: float) -> dict:
    env = dict(os.environ, SLURM_TIME_FORMAT="%s")
    rows = read_stream(stream_path)
    t0 = time.time()
    submitted: dict[str, dict] = {}
    samples = []
    blocked: dict[str, int] = {}
    pending = list(rows)
    while time.time() - t0 < max_s:
        now = time.time() - t0
        while pending and pending[0]["submit_s"] <= now:
            r = pending.pop(0)
            jid = _sh(env, "sbatch", "--parsable", "-p", "batch", "-N", str(r["nodes"]),
                      "-t", str(1 + int(r["runtime_s"] // 60)), "-J", f"theta-{r['theta_job']}",
                      "-o", "/dev/null", "--wrap", f"sleep {r['runtime_s']:g}").strip()
            submitted[jid] = dict(r, submit=time.time())
            print(f"[demo] t={now:5.1f}s primary job {jid}: {r['nodes']} node(s) for "
                  f"{r['runtime_s']:g}s (Theta job {r['theta_job']}, {r['theta_nodes']} nodes)", flush=True)
        jobs = _sh(env, "squeue", "-h", "-a", "-o", "%i|%P|%T|%D")   # no user text in this read
        nodes = _sh(env, "sinfo", "-h", "-N", "-p", "batch", "-o", "%T").split()
        harvest = primary = 0
        waiting = []
        for line in jobs.splitlines():
            jid, part, state, n = line.split("|")
            if state in ("RUNNING", "COMPLETING"):
                if part == "scavenger":         # the harvest partition: malleable jobs only
                    harvest += int(n)
                else:
                    primary += int(n)
            elif state == "PENDING" and jid in submitted:
                waiting.append((int(jid), int(n)))
        free = len(nodes) - primary          # free of primary jobs
        for jid, n in sorted(waiting):       # FIFO: would it have started without harvesting?
            if n <= free:
                if n > free - harvest:
                    blocked[str(jid)] = blocked.get(str(jid), 0) + 1
                free -= n
        samples.append(dict(t=now, harvest=harvest, primary=primary, total=len(nodes)))
        done = not pending and all(
            "COMPLETED" in _sh(env, "scontrol", "-o", "show", "job", j) for j in submitted)
        if done:
            break
        time.sleep(1.0)
    waits = []
    for jid, info in submitted.items():
        kv = dict(tok.split("=", 1) for tok in _sh(env, "scontrol", "-o", "show", "job", jid).split()
                  if "=" in tok)
        start = float(kv["StartTime"]) if kv.get("StartTime", "").isdigit() else None
        waits.append(dict(job=jid, nodes=info["nodes"], submit=info["submit"], start=start,
                          wait_s=None if start is None else max(0.0, start - info["submit"]),
                          blocked_by_harvest_s=blocked.get(jid, 0)))
    return dict(samples=samples, waits=waits)


def harvested(result: dict) -> tuple[int, int]:
    """Node-seconds harvested by malleable jobs and left idle by primary jobs."""
    s = result["samples"]
    return sum(x["harvest"] for x in s), sum(x["total"] - x["primary"] for x in s)


def verdict(harvest: int, idle: int) -> str:
    """The report's one-line answer: did harvesting happen?"""
    if harvest <= 0:
        return (f"verdict: NOTHING HARVESTED: malleable jobs used none of the {idle} idle node-seconds "
                "(is the daemon running? see its log)")
    return f"verdict: harvesting worked: malleable jobs used {100 * harvest / idle:.0f}% of the idle node-seconds"


def report(result: dict, status: dict | None, ctld_log: str | None) -> str:
    s = result["samples"]
    total = sum(x["total"] for x in s)
    primary = sum(x["primary"] for x in s)
    harvest = sum(x["harvest"] for x in s)
    idle = total - primary
    preempted = 0
    if ctld_log and os.path.exists(ctld_log):
        with open(ctld_log, encoding="utf-8", errors="replace") as fh:
            preempted = sum(1 for line in fh if "has been requeued to reclaim resources" in line)
    waits = [w["wait_s"] for w in result["waits"] if w["wait_s"] is not None]
    blk = [w["blocked_by_harvest_s"] for w in result["waits"]]
    lines = ["", "=== malletrain live demo report ===",
             f"span {len(s)} s sampled, {s[0]['total'] if s else 0} nodes",
             f"node-seconds: primary {primary}, left idle by primary jobs {idle}, harvested by "
             f"malleable jobs {harvest} ({100 * harvest / idle if idle else 0:.0f}% of idle)",
             f"primary jobs: {len(result['waits'])} submitted, {len(waits)} started; wait (start - submit) "
             f"mean {sum(waits) / len(waits) if waits else 0:.1f} s, max {max(waits) if waits else 0:.0f} s",
             f"primary-job delay due to harvesting (upper bound): mean "
             f"{sum(blk) / len(blk) if blk else 0:.1f} s, max {max(blk) if blk else 0} s",
             f"preemptions by Slurm (slurmctld log): {preempted}",
             verdict(harvest, idle)]
    if status:
        c = status.counters
        lines.append(f"daemon: {status.cycle} cycles, {c.starts} starts, {c.rescales} rescales, "
                     f"{c.stops} stops, {c.vacates} give-backs to primary jobs, "
                     f"{c.progress_lines} progress lines read ({c.progress_lines_skipped} skipped), "
                     f"{c.slurm_reads} Slurm reads, {c.slurm_writes} writes")
        for j in status.jobs:
            m = j.measured
            lines.append(f"  malleable job {j.job} {j.name}: {j.state} on {j.size} node(s), "
                         f"measured {m.samples_per_s:.0f} samples/s on {m.nodes}" if m else
                         f"  malleable job {j.job} {j.name}: {j.state}")
    lines += ["", "per primary job: " + ", ".join(
        f"{w['job']}({w['nodes']}n) wait {w['wait_s']:.0f}s/harvest {w['blocked_by_harvest_s']}s"
        if w["wait_s"] is not None else f"{w['job']} not started"
        for w in result["waits"])]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m devtools.demo_live", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stream", required=True, help="primary-job CSV (examples/primary-jobs.csv)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--state-dir", help="the daemon's state_dir (for the report)")
    p.add_argument("--ctld-log", help="slurmctld log (counts preemptions)")
    p.add_argument("--max-s", type=float, default=200.0, help="stop after this many seconds")
    p.add_argument("--build-from-swf", help="(re)write --stream from a Theta SWF log and exit")
    args = p.parse_args(argv)
    if args.build_from_swf:
        write_stream(primary_stream_from_swf(args.build_from_swf), args.stream)
        return 0
    os.makedirs(args.out, exist_ok=True)
    result = run(args.stream, args.out, args.max_s)
    status = None
    if args.state_dir and os.path.exists(os.path.join(args.state_dir, "status.json")):
        status = read_status(os.path.join(args.state_dir, "status.json"))
    text = report(result, status, args.ctld_log)
    with open(os.path.join(args.out, "report.json"), "w", encoding="utf-8") as fh:
        json.dump(dict(result, status=dataclasses.asdict(status) if status else None), fh, indent=1)
    with open(os.path.join(args.out, "report.txt"), "w", encoding="utf-8") as fh:
        fh.write(text + "\n")
    print(text)
    return 0 if harvested(result)[0] > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
