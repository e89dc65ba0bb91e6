"""``malletrain selfcheck consistency``: is training independent of the process count?

Each configuration trains the bundled reference model (``malletrain.runtime.reference``)
for ``steps`` steps in a fresh checkpoint directory, launching real processes
(torch.distributed over gloo on 127.0.0.1, one intra-op thread each):

* ``P=p``: p processes from step 0 to the end;
* ``rescale a>b>c``: the steps split into equal segments, each run by a new
  set of processes of the given size resuming from the last checkpoint (what
  a rescale by the daemon does);
* ``kill9``: like rescale, but the processes of one segment are killed with
  SIGKILL after a checkpoint and that segment resumes from it.

It prints one line per configuration with the SHA-256 of all parameters and
buffers after the last step, then ``consistent: yes|no``.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from malletrain.domain.errors import InputError, MalletrainError


@dataclass(frozen=True)
class Plan:
    label: str
    procs: tuple[int, ...]            # processes per segment
    kill_segment: int | None = None   # SIGKILL this segment once, after a checkpoint
    mapping: str = "contiguous"


@dataclass
class Outcome:
    plan: Plan
    sha256: str
    seconds: float
    launches: int
    directory: str
    notes: list[str] = field(default_factory=list)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def boundaries(steps: int, segments: int) -> list[int]:
    """End step of each of ``segments`` near-equal segments of ``steps``."""
    if not 1 <= segments <= steps:
        raise ValueError(f"cannot split {steps} steps into {segments} segments")
    return [round(steps * (i + 1) / segments) for i in range(segments)]


def spawn_ranks(argv: list[str], procs: int, *, env: dict | None = None,
                stdout=subprocess.PIPE) -> list[subprocess.Popen]:
    """``procs`` copies of ``argv`` as ranks 0..procs-1 of one torchrun-style launch on
    127.0.0.1 (a fresh port, one intra-op thread each).  ``MALLETRAIN_METRICS`` is not
    inherited: only ``env`` can set it."""
    port = free_port()
    base = {k: v for k, v in os.environ.items() if k != "MALLETRAIN_METRICS"}
    return [subprocess.Popen(argv, env={**base, "RANK": str(rank), "WORLD_SIZE": str(procs),
                                        "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1",
                                        "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1",
                                        **(env or {})},
                             stdout=stdout, stderr=subprocess.PIPE, text=True)
            for rank in range(procs)]


def torchrun_local(target: list[str], procs: int, *, env: dict | None = None) -> subprocess.Popen:
    """``python -m malletrain.runtime.torchrun --nproc-per-node procs -- TARGET`` on this host:
    the wrapper ``submit --launch torchrun`` runs on each node, here with a fresh loopback
    rendezvous.  This process's environment less its launcher variables, plus ``env``; output
    piped (text); a session of its own, so that a signal sent to it reaches it alone."""
    base = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    base.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), **(env or {}))
    return subprocess.Popen([sys.executable, "-m", "malletrain.runtime.torchrun", "--nproc-per-node", str(procs),
                             "--", *target], env=base, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


class Launcher:
    def __init__(self, *, workers: int, mode: str, micro_batch: int = 8, seed: int = 0,
                 timeout_s: float = 300.0, python: str = sys.executable) -> None:
        self.workers, self.mode, self.micro_batch, self.seed = workers, mode, micro_batch, seed
        self.timeout_s, self.python = timeout_s, python

    def start(self, procs: int, directory: str, until: int, *, mapping: str = "contiguous",
              extra: list[str] | None = None, env: dict | None = None) -> list[subprocess.Popen]:
        argv = [self.python, "-m", "malletrain.runtime.reference", "--dir", directory,
                "--until", str(until), "--workers", str(self.workers), "--mode", self.mode,
                "--micro-batch", str(self.micro_batch), "--seed", str(self.seed),
                "--mapping", mapping, *(extra or [])]
        return spawn_ranks(argv, procs, env=env)

    def wait(self, procs: list[subprocess.Popen]) -> str:
        """Rank 0's stdout once every process exited 0; MalletrainError otherwise."""
        deadline = time.monotonic() + self.timeout_s
        outs = []
        for p in procs:
            try:
                o, e = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                raise MalletrainError(f"reference training timed out after {self.timeout_s:.0f}s") from None
            if p.returncode != 0:
                for q in procs:
                    q.kill()
                raise MalletrainError(f"reference worker exited {p.returncode}:\n{e[-2000:]}")
            outs.append(o)
        return outs[0]

    def run(self, plan: Plan, steps: int, directory: str) -> Outcome:
        t0 = time.monotonic()
        ends = boundaries(steps, len(plan.procs))
        launches, notes, line = 0, [], ""
        for seg, (p, end) in enumerate(zip(plan.procs, ends)):
            if seg == plan.kill_segment:
                notes.append(self._kill_once(p, directory, end, plan.mapping))
                launches += 1
            line = self.wait(self.start(p, directory, end, mapping=plan.mapping))
            launches += 1
        parts = line.split()
        if len(parts) < 4 or parts[0] != "sha256" or int(parts[3]) != steps:
            raise MalletrainError(f"unexpected reference output: {line!r}")
        return Outcome(plan, parts[1], time.monotonic() - t0, launches, directory, notes)

    def _kill_once(self, procs: int, directory: str, until: int, mapping: str) -> str:
        """Start the segment with a checkpoint every 2 steps; SIGKILL it after one lands."""
        from malletrain.runtime.checkpoint import CheckpointStore
        store = CheckpointStore(directory)
        before = max(store.steps(), default=0)
        ps = self.start(procs, directory, until, mapping=mapping,
                        extra=["--every", "2", "--step-sleep-s", "0.05"])
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            newest = max(store.steps(), default=0)
            if newest > before or any(p.poll() is not None for p in ps):
                break
            time.sleep(0.02)
        for p in ps:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
        for p in ps:
            p.communicate()
        return f"SIGKILL {procs} process(es) after checkpoint step {max(store.steps(), default=0)}"


def parse_list(text: str, what: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise InputError(f"{what}: expected comma-separated integers, got {text!r}") from None
    if not vals or any(v < 1 for v in vals):
        raise InputError(f"{what}: expected positive integers, got {text!r}")
    return vals


def plans(procs: tuple[int, ...], rescale: tuple[int, ...] | None, kill9: bool,
          mapping: str) -> list[Plan]:
    out = [Plan(f"P={p}", (p,), mapping=mapping) for p in procs]
    if rescale:
        out.append(Plan("rescale " + ">".join(map(str, rescale)), rescale, mapping=mapping))
        if kill9:
            out.append(Plan("rescale " + ">".join(map(str, rescale)) + " + kill -9",
                            rescale, kill_segment=len(rescale) // 2, mapping=mapping))
    elif kill9:
        out.append(Plan(f"P={procs[-1]} + kill -9", (procs[-1],), kill_segment=0, mapping=mapping))
    return out


def max_param_deviation(dir_a: str, dir_b: str) -> float:
    """Largest absolute difference between the final model tensors of two runs."""
    from malletrain.runtime.checkpoint import CheckpointStore
    a, b = (CheckpointStore(d).restore(quarantine=False) for d in (dir_a, dir_b))
    if a is None or b is None:
        raise MalletrainError(f"no checkpoint to compare in {dir_a if a is None else dir_b}")
    worst = 0.0
    for k, ta in a.state["model"].items():
        if ta.is_floating_point():
            worst = max(worst, float((ta - b.state["model"][k]).abs().max()))
    return worst


def consistency(*, procs: str = "1,2,3,4", rescale: str | None = None, workers: int = 4,
                steps: int = 24, kill9: bool = False, mode: str = "consistency",
                mapping: str = "contiguous", micro_batch: int = 8, seed: int = 0,
                json_path: str | None = None, keep: bool = False) -> int:
    """``malletrain selfcheck consistency``; the exit status (1: not consistent)."""
    proc_list = parse_list(procs, "--procs")
    rescale_list = parse_list(rescale, "--rescale") if rescale else None
    for p in proc_list + (rescale_list or ()):
        if p > workers:
            raise InputError(f"{p} processes > {workers} logical workers (need 1 <= P <= L)")
    if rescale_list and len(rescale_list) > steps:
        raise InputError(f"--rescale has {len(rescale_list)} segments but only {steps} steps")
    launcher = Launcher(workers=workers, mode=mode, micro_batch=micro_batch,
                        seed=seed)
    work = tempfile.mkdtemp(prefix="malletrain-selfcheck-")
    results: list[Outcome] = []
    print(f"selfcheck consistency: mode {mode}, L={workers} logical workers, "
          f"{steps} steps, reference CNN on CPU/gloo, mapping {mapping}")
    try:
        for i, plan in enumerate(plans(proc_list, rescale_list, kill9, mapping)):
            d = os.path.join(work, f"c{i}")
            res = launcher.run(plan, steps, d)
            results.append(res)
            note = f"  [{'; '.join(res.notes)}]" if res.notes else ""
            print(f"{plan.label:<28} sha256 {res.sha256}  ({res.seconds:.1f}s){note}", flush=True)
        consistent = len({r.sha256 for r in results}) == 1
        dev = max(max_param_deviation(results[0].directory, r.directory) for r in results)
        print(f"consistent: {'yes' if consistent else 'no'}"
              + ("" if consistent else f" (max parameter deviation {dev:.3g})"))
        if json_path:
            with open(json_path, "w", encoding="utf-8") as fh:
                json.dump({"mode": mode, "workers": workers, "steps": steps,
                           "consistent": consistent, "max_deviation": dev,
                           "runs": [{"label": r.plan.label, "sha256": r.sha256,
                                     "seconds": round(r.seconds, 2), "notes": r.notes}
                                    for r in results]}, fh, indent=1)
    finally:
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
        else:
            print(f"runs kept in {work}")
    if mode == "tolerance":
        return 0
    return 0 if consistent else 1
