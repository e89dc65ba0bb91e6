"""A synthetic malleable job for the live demo and the Slurm tests.

It behaves like a training job towards Slurm and the daemon — restores its
checkpoint, runs steps whose duration follows a scaling law of the node count
it got, appends progress records to ``$MALLETRAIN_METRICS``, checkpoints and
exits on SIGTERM/SIGUSR2 (so preemption and rescale lose at most one step) —
but computes nothing.  The PyTorch runtime is the real thing; this stands in
for it where the test is about scheduling, not about training.

Throughput on n nodes: ``rate · n / (1 + alpha · (n − 1))`` samples/s.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m devtools.synthjob", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", type=float, required=True, help="samples to finish")
    p.add_argument("--rate", type=float, default=100.0, help="samples/s on one node")
    p.add_argument("--alpha", type=float, default=0.1, help="scaling loss per extra node")
    p.add_argument("--batch", type=int, default=64, help="samples per step")
    p.add_argument("--startup-s", type=float, default=1.0, help="restore cost before the first step")
    p.add_argument("--checkpoint", required=True, help="checkpoint file (JSON)")
    p.add_argument("--checkpoint-s", type=float, default=0.0, help="time a checkpoint takes to write")
    p.add_argument("--report-s", type=float, default=0.5, help="at most one progress record per this many s")
    # faults, for the fault-tolerance tests (first run only: SLURM_RESTART_COUNT 0)
    p.add_argument("--hang-after-s", type=float, default=None,
                   help="first run only: stop reporting after this long, keep running (a hung job)")
    p.add_argument("--fail-on", default=None,
                   help="exit 1 at once, without a result, whenever running on this node (SLURMD_NODENAME)")
    args = p.parse_args(argv)

    stop = {"sig": None, "t": 0.0}

    def on_signal(signum, frame):
        stop["sig"], stop["t"] = signum, time.time()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGUSR2, on_signal)

    nodes = int(os.environ.get("SLURM_JOB_NUM_NODES", "1"))
    restart = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
    job = os.environ.get("SLURM_JOB_ID", "local")
    metrics = os.environ.get("MALLETRAIN_METRICS")
    done = 0.0
    try:
        with open(args.checkpoint, encoding="utf-8") as fh:
            done = float(json.load(fh)["samples"])
    except (OSError, ValueError, KeyError):
        pass

    def record(event: str, step_s: float = 0.0, **extra) -> None:
        if not metrics:
            return
        rec = dict(t=time.time(), job=job, step=int(done // args.batch), samples=done,
                   step_s=step_s, world=nodes, nodes=nodes, node=socket.gethostname(),
                   event=event, restart=restart, **extra)
        try:
            with open(metrics, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(rec) + "\n")
        except OSError:
            pass   # never block or kill training over the metrics file

    def checkpoint() -> None:
        time.sleep(args.checkpoint_s)
        tmp = args.checkpoint + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump({"samples": done}, fh)
        os.replace(tmp, args.checkpoint)

    if args.fail_on and os.environ.get("SLURMD_NODENAME") == args.fail_on:
        print(f"synthjob {job}: failing on {args.fail_on} (a broken node)", flush=True)
        return 1
    record("start")
    t_start = time.time()
    print(f"synthjob {job}: restart {restart}, {nodes} node(s), resuming at {done:.0f}/{args.work:.0f}",
          flush=True)
    time.sleep(args.startup_s)
    rate = args.rate * nodes / (1 + args.alpha * (nodes - 1))
    step_s = args.batch / rate
    last_report = 0.0
    while done < args.work and stop["sig"] is None:
        if args.hang_after_s is not None and restart == 0 and time.time() - t_start > args.hang_after_s:
            time.sleep(0.2)       # hung: alive, silent, no progress (a signal still stops it)
            continue
        time.sleep(step_s)
        done = min(args.work, done + args.batch)
        now = time.time()
        if now - last_report >= args.report_s:
            record("progress", step_s)
            last_report = now
    checkpoint()
    record("checkpoint")
    if stop["sig"] is not None:
        print(f"synthjob {job}: signal {stop['sig']} -> checkpoint at {done:.0f} and exit in "
              f"{time.time() - stop['t']:.2f}s", flush=True)
        record("exit", reason="stopped")
        return 3    # stopped before the end: the sbatch template requeues the job
    record("exit", reason="done")
    print(f"synthjob {job}: finished {done:.0f} samples", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
