"""``python -m devtools bench runtime``: what malleability costs a training job.

Runs the digits example (``examples/train/digits_train.py``) as real processes
over torch.distributed and reads the progress records it writes:

* **step time**, consistency vs. tolerance mode at P processes: wall time per
  step between the 20th and the last progress record, the two modes
  alternated (A B A B ...) so that machine noise hits both;
* **checkpoint write** time (``write_s`` of the checkpoint records: gathering
  the RNG states, serialising, fsync, rename);
* **signal to exit**: SIGTERM to every process mid-run until the exit record;
* **start to first step**: launch of the processes (interpreter and torch
  import included) until the first progress record, and ``restore_s``.
"""
from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from malletrain.domain.errors import MalletrainError
from malletrain.runtime.selfcheck import spawn_ranks

EXAMPLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                       "examples", "train", "digits_train.py")


def _launch(procs: int, ckpt: str, metrics: str, args: list[str]):
    return spawn_ranks([sys.executable, EXAMPLE, "--ckpt", ckpt, *args], procs,
                       env={"MALLETRAIN_METRICS": metrics, "MALLETRAIN_GRACE_S": "30"},
                       stdout=subprocess.DEVNULL)


def _wait(ps, timeout_s: float = 600, ok: tuple[int, ...] = (0,)) -> None:
    for p in ps:
        _, err = p.communicate(timeout=timeout_s)
        if p.returncode not in ok:
            raise MalletrainError(f"example exited {p.returncode}:\n{err[-1500:]}")


def _records(path: str) -> list[dict]:
    with open(path, encoding="utf-8") as fh:
        return [json.loads(x) for x in fh if x.strip()]


def step_time(procs: int, mode: str, steps: int, work: str, tag: str, extra: list[str],
              ckpt: str | None = None) -> dict:
    ckpt = ckpt or os.path.join(work, f"{tag}-ck")
    metrics = os.path.join(work, f"{tag}.jsonl")
    t0 = time.time()
    _wait(_launch(procs, ckpt, metrics, ["--mode", mode, "--steps", str(steps), "--eval-every",
                                         str(10 * steps), "--checkpoint-every-s", "0", *extra]))
    recs = _records(metrics)
    prog = [r for r in recs if r["event"] == "progress"]
    if not prog:
        raise MalletrainError(f"no progress records in {metrics}")
    a, b = prog[min(len(prog) // 4, 20)], prog[-1]
    if b["step"] == a["step"]:
        a = prog[0]
    ckpts = [r["write_s"] for r in recs if r["event"] == "checkpoint"]
    start = next(r for r in recs if r["event"] == "start")
    return {"step_s": (b["t"] - a["t"]) / (b["step"] - a["step"]) if b["step"] > a["step"] else None,
            "first_step_s": prog[0]["t"] - t0, "restore_s": start.get("restore_s"),
            "checkpoint_write_s": ckpts[-1] if ckpts else None,
            "checkpoint_bytes": next((r["bytes"] for r in recs if r["event"] == "checkpoint"), None)}


def signal_to_exit(procs: int, work: str, extra: list[str]) -> dict:
    ckpt, metrics = os.path.join(work, "sig-ck"), os.path.join(work, "sig.jsonl")
    ps = _launch(procs, ckpt, metrics, ["--steps", "1000000", "--checkpoint-every-s", "0", *extra])
    deadline = time.time() + 120
    while time.time() < deadline:
        if os.path.exists(metrics) and any(r["event"] == "progress" and r["step"] >= 50
                                           for r in _records(metrics)):
            break
        time.sleep(0.1)
    t0 = time.time()
    for p in ps:
        p.send_signal(signal.SIGTERM)
    _wait(ps, 60, ok=(3,))          # EXIT_STOPPED
    wall = time.time() - t0
    ex = [r for r in _records(metrics) if r["event"] == "exit"][-1]
    ck = [r for r in _records(metrics) if r["event"] == "checkpoint"][-1]
    return {"signal_to_exit_s": ex["signal_to_exit_s"], "signal_to_process_end_s": wall,
            "checkpoint_write_s": ck["write_s"], "stopped_at_step": ex["step"]}


def run(args) -> int:
    work = tempfile.mkdtemp(prefix="malletrain-bench-runtime-")
    extra = ["--arch", args.arch, "--micro-batch", str(args.micro_batch)]
    rows = {"consistency": [], "tolerance": []}
    print(f"bench runtime: digits {args.arch}, P={args.procs}, L=4 x {args.micro_batch} samples, {args.steps} steps, "
          f"{args.repeats} rounds (A/B alternated), CPU/gloo, 1 thread per process", flush=True)
    for i in range(args.repeats):
        for mode in ("consistency", "tolerance") if i % 2 == 0 else ("tolerance", "consistency"):
            r = step_time(args.procs, mode, args.steps, work, f"{mode}{i}", extra)
            rows[mode].append(r)
            print(f"  round {i + 1} {mode:<12} {1000 * r['step_s']:.2f} ms/step", flush=True)
    med = {m: statistics.median(r["step_s"] for r in v) for m, v in rows.items()}
    overhead = med["consistency"] / med["tolerance"] - 1
    sig = signal_to_exit(args.procs, work, extra)
    cons = rows["consistency"]
    out = {
        "procs": args.procs, "arch": args.arch, "micro_batch": args.micro_batch, "steps": args.steps,
        "repeats": args.repeats,
        "step_ms": {m: round(1000 * v, 3) for m, v in med.items()},
        "consistency_overhead": round(overhead, 4),
        "checkpoint_write_ms": round(1000 * statistics.median(r["checkpoint_write_s"] for r in cons), 2),
        "checkpoint_bytes": cons[0]["checkpoint_bytes"],
        "restore_ms_fresh": round(1000 * statistics.median(r["restore_s"] for r in cons), 2),
        "start_to_first_step_s": round(statistics.median(r["first_step_s"] for r in cons), 3),
        "signal_to_exit_s": sig["signal_to_exit_s"],
        "signal_to_process_end_s": round(sig["signal_to_process_end_s"], 3),
    }
    resume = step_time(args.procs, "consistency", sig["stopped_at_step"] + 30, work, "resume", extra,
                       ckpt=os.path.join(work, "sig-ck"))
    out["restore_ms_resume"] = round(1000 * resume["restore_s"], 2)
    out["resume_to_first_step_s"] = round(resume["first_step_s"], 3)
    print(f"step time       consistency {out['step_ms']['consistency']:.2f} ms, tolerance "
          f"{out['step_ms']['tolerance']:.2f} ms: overhead {100 * overhead:+.1f}% (target <= 10%)")
    print(f"checkpoint      write {out['checkpoint_write_ms']:.1f} ms ({out['checkpoint_bytes'] / 1e3:.0f} kB)")
    print(f"stop            signal -> exit record {out['signal_to_exit_s']:.3f} s, "
          f"-> processes gone {out['signal_to_process_end_s']:.2f} s")
    print(f"start           launch -> first step {out['start_to_first_step_s']:.2f} s (fresh), "
          f"{out['resume_to_first_step_s']:.2f} s (resume; restore {out['restore_ms_resume']:.1f} ms)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(out, fh, indent=1)
    return 0
