"""What an adapter costs, per framework (issue #25): ``python -m devtools bench adapters``.

For each adapter (``examples/train/<framework>``: the plain script and the same script made
malleable; ``--frameworks``), under the ``--launch torchrun`` wrapper on this machine (CPU, gloo,
no Slurm):

* **step-time overhead**: the plain and the malleable script train the same epochs on the same
  workers, alternately, ``--repeat`` times each; the ratio of the median wall times of their
  training loops (from the first to the last epoch's line; startup is not in it) per sample: an
  epoch of the plain script trains all 1,400 samples, one of the malleable script those of its
  whole global batches (1,280 for DDP, Lightning and Accelerate, 5 x 256; 1,320 for the Hugging
  Face Trainer, 11 x 120).  The plain Lightning, Accelerate and Trainer scripts accumulate to
  the same global batch; the plain DDP loop has no accumulation (a step per 64 samples a process);
* **signal → exit**: SIGTERM to the launch while the malleable script trains, until every worker
  has checkpointed the step boundary and exited (the ``exit`` record's ``signal_to_exit_s``, and
  the launch's own exit, seen from outside);
* **launch → first step**: from starting the launch on another worker count (a rescale: the run
  restores the checkpoint just written) to its ``start`` record and to its first ``progress``
  record;
* **checkpoint write/read**: the ``checkpoint`` record's ``write_s`` and the ``start`` record's
  ``restore_s``.

Only ratios from one run compare on a shared machine; the absolute times are this machine's.
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
from collections.abc import Callable
from dataclasses import dataclass

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples", "train")
# framework -> (its name in the report, what the plain script needs to run on `procs` workers)
PLAIN_SAMPLES = 1400            # trained per epoch by each plain script (module docstring)


@dataclass(frozen=True)
class Framework:
    name: str
    plain_args: Callable[[int], list[str]]      # what the plain script needs to run on `procs` workers
    epoch_line: Callable[[str], bool]           # a line the scripts print once an epoch
    samples: int                                # trained per epoch by the malleable script
    epochs: int                                 # per timed run, unless --epochs says otherwise


FRAMEWORKS = {
    # the plain DDP loop has no accumulation: a step of 64 samples a process
    "ddp": Framework("DDP", lambda procs: [], lambda line: line.startswith("epoch "), 1280, 300),
    # the plain Lightning, Accelerate and HF scripts accumulate to the malleable ones' global batch
    "lightning": Framework("Lightning",
                           lambda procs: ["--devices", str(procs), "--accumulate", str(max(1, 4 // procs))],
                           lambda line: line.startswith("epoch "), 1280, 300),
    "accelerate": Framework("Accelerate", lambda procs: ["--grad-accum", str(max(1, 4 // procs))],
                            lambda line: line.startswith("epoch "), 1280, 300),
    "hf": Framework("Hugging Face Trainer", lambda procs: ["--grad-accum", str(max(1, 12 // procs))],
                    lambda line: "'eval_accuracy'" in line, 1320, 30),
}


def _launch(framework: str, script: str, procs: int, args: list[str],
            metrics: str | None = None) -> subprocess.Popen:
    from malletrain.runtime.selfcheck import torchrun_local
    env = {"MALLETRAIN_GRACE_S": "30", "PYTHONPATH": ROOT, **({"MALLETRAIN_METRICS": metrics} if metrics else {})}
    return torchrun_local([os.path.join(EXAMPLES, framework, script), *args], procs, env=env)


def _loop_s(p: subprocess.Popen, epoch_line: Callable[[str], bool]) -> float:
    """Seconds from the first to the last epoch line the script printed (its training loop)."""
    times = []
    assert p.stdout is not None
    for line in p.stdout:
        if epoch_line(line):
            times.append(time.perf_counter())
    _, err = p.communicate(timeout=600)
    if p.returncode != 0 or len(times) < 2:
        raise RuntimeError(f"training run failed ({p.returncode}): {err[-2000:]}")
    return (times[-1] - times[0]) / (len(times) - 1)       # per epoch


def _records(path: str) -> list[dict]:
    try:
        with open(path) as fh:
            return [json.loads(x) for x in fh]
    except FileNotFoundError:
        return []


def _wait(path: str, pred, timeout_s: float = 120.0) -> dict:
    deadline = time.perf_counter() + timeout_s
    while time.perf_counter() < deadline:
        for r in _records(path):
            if pred(r):
                return r
        time.sleep(0.02)
    raise RuntimeError(f"timed out waiting in {path}")


def bench(framework: str, procs: int = 2, epochs: int | None = None, repeat: int = 3) -> dict:
    plain, mine = [], []
    fw = FRAMEWORKS[framework]
    epochs = epochs or fw.epochs
    with tempfile.TemporaryDirectory() as d:
        for i in range(repeat):
            plain.append(_loop_s(_launch(framework, "train_plain.py", procs,
                                         ["--epochs", str(epochs), *_where(framework, d, f"p{i}", plain=True),
                                          *fw.plain_args(procs)]), fw.epoch_line))
            mine.append(_loop_s(_launch(framework, "train_malleable.py", procs,
                                        ["--epochs", str(epochs), *_where(framework, d, f"m{i}")]), fw.epoch_line))
        # stop, rescale, resume
        metrics = f"{d}/m.jsonl"
        args = ["--epochs", "100000", *_where(framework, d, "stop")]
        p = _launch(framework, "train_malleable.py", procs, args, metrics)
        _wait(metrics, lambda r: r.get("event") == "progress" and r.get("step", 0) >= 200)
        t0 = time.perf_counter()
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=120)
        outside_s = time.perf_counter() - t0
        stop = [r for r in _records(metrics) if r.get("event") == "exit"][-1]
        write = [r for r in _records(metrics) if r.get("event") == "checkpoint"][-1]
        n = len(_records(metrics))
        t1 = time.perf_counter()
        p = _launch(framework, "train_malleable.py", procs + 1, args, metrics)
        start = _wait(metrics, lambda r: r.get("event") == "start" and r.get("world") == procs + 1)
        t_start = time.perf_counter() - t1
        _wait(metrics, lambda r: r.get("event") == "progress" and r.get("world") == procs + 1)
        t_first = time.perf_counter() - t1
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=120)
        assert len(_records(metrics)) > n
    return {"framework": framework, "procs": procs, "epochs": epochs, "repeat": repeat,
            "plain_epoch_s": statistics.median(plain), "malleable_epoch_s": statistics.median(mine),
            "samples_per_epoch": fw.samples,
            "overhead": (statistics.median(mine) / fw.samples) / (statistics.median(plain) / PLAIN_SAMPLES),
            "signal_to_exit_s": stop.get("signal_to_exit_s"), "signal_to_launch_exit_s": round(outside_s, 3),
            "checkpoint_write_s": write.get("write_s"), "checkpoint_bytes": write.get("bytes"),
            "restore_s": start.get("restore_s"), "launch_to_start_s": round(t_start, 3),
            "launch_to_first_step_s": round(t_first, 3)}


def _where(framework: str, d: str, name: str, *, plain: bool = False) -> list[str]:
    """The arguments that put a run's model (and checkpoints) under ``d``."""
    if framework == "hf":
        return ["--out", f"{d}/{name}", "--out-dir", f"{d}/{name}-run"]
    return ["--out", f"{d}/{name}.pt"] + ([] if plain else ["--ckpt", f"{d}/{name}-ckpt"])


def report(fig: dict) -> list[str]:
    return [
        f"{FRAMEWORKS[fig['framework']].name} adapter, {fig['procs']} workers (CPU, gloo), "
        f"examples/train/{fig['framework']}, "
        f"{fig['epochs']} epochs x {fig['repeat']}:",
        f"  step-time overhead: {fig['overhead']:.3f}x per sample "
        f"(median epoch {fig['malleable_epoch_s'] * 1e3:.1f} ms for {fig['samples_per_epoch']} samples "
        f"with the adapter vs. {fig['plain_epoch_s'] * 1e3:.1f} ms for {PLAIN_SAMPLES} plain)",
        f"  signal -> exit: {fig['signal_to_exit_s']} s (exit record); the launch exited "
        f"{fig['signal_to_launch_exit_s']} s after SIGTERM, seen from outside",
        f"  checkpoint write {fig['checkpoint_write_s']} s ({fig['checkpoint_bytes']} bytes), "
        f"read {fig['restore_s']} s",
        f"  launch on {fig['procs'] + 1} workers (a rescale) -> start record {fig['launch_to_start_s']} s, "
        f"-> first step {fig['launch_to_first_step_s']} s"]


def main(argv: list[str] | None = None) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="python -m devtools bench adapters", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--epochs", type=int, default=None, help="epochs per timed run (default: 300; 30 for hf)")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--frameworks", default=",".join(FRAMEWORKS),
                   help=f"which adapters, comma-separated (default: {','.join(FRAMEWORKS)})")
    p.add_argument("--json", help="also write the figures to this file")
    args = p.parse_args(argv)
    chosen = [f.strip() for f in args.frameworks.split(",") if f.strip()]
    unknown = [f for f in chosen if f not in FRAMEWORKS]
    if unknown or not chosen:
        print(f"bench adapters: unknown framework(s) {', '.join(unknown) or '(none)'}; "
              f"choose from {', '.join(FRAMEWORKS)}", file=sys.stderr)
        return 2
    figs = {}
    for framework in chosen:
        figs[framework] = fig = bench(framework, args.procs, args.epochs, args.repeat)
        for line in report(fig):
            print(line, flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(figs, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
