"""What runs inside a study campaign's trial job: the trial wrapper and the metric reporter.

A trial job's command is ``malletrain campaign trial <dir> <slot>``; each process of the job
(one per task under ``srun``) runs :func:`run_trial`:

1. **Bind.** The slot's trial — asked from the study at the job's first start, the same one at
   every later start (:func:`malletrain.campaign.slots.bind`).
2. **Run** the spec's command with ``--params <dir>/t<n>/params.json --ckpt <dir>/t<n>/ckpt``
   and ``MALLETRAIN_TRIAL``/``MALLETRAIN_TRIAL_NUMBER`` in its environment, passing SIGTERM,
   SIGUSR2 and SIGINT on to it.  The runtime's :meth:`~malletrain.runtime.Runtime.report` finds
   the trial there (:class:`Reporter`): it records the value in the study and stops the trial
   when the pruner says so.
3. **Close out** (task 0 only): a final result completes the trial; a pruned trial stays
   pruned; a failure counts against ``retries`` (within them the job exits as the command did and
   is started again); a trial that ends queues the campaign's next trial jobs (``tick``), so the
   campaign goes on with no process of its owner's on the login node.

**Elastic groups** (``job: {elastic: true}``, issue #26).  Every member of the trial's group is a
job of its own (one array task per node) running this wrapper, and every member closes out:

* all bind the same trial (the first asks, under the lock);
* a member that leaves (exit 3, a signal) changes nothing: the others train on;
* a member that ends 0 waits up to ``RESULT_WAIT_S`` for the final result (the member that is
  rank 0 writes it as the others end): then the trial is complete, once;
* a member that ends without the result (it failed, or ended 0 and none came) is one member
  gone: the others train on.  The failure counts against ``retries`` once, when no other member
  is left running (:func:`malletrain.campaign.slots.close_out`; ``peers`` asks Slurm): a bug that
  fails every member is one failure, not one per node, and one member lost is none.

A job whose trial is already closed when it starts (it was pruned or finished just as the job was
preempted or rescaled) writes its exit record and exits 0 at once.  Exit records this module
writes carry ``reason`` ``done``, ``pruned`` or ``failed``; the daemon takes all three as final
(the job is never requeued).
"""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from malletrain.campaign import slots
from malletrain.campaign.spec import Spec
from malletrain.domain.safefile import open_append

log = logging.getLogger("malletrain.campaign")

ENV_DIR = "MALLETRAIN_TRIAL"
ENV_NUMBER = "MALLETRAIN_TRIAL_NUMBER"
EXIT_STOPPED = 3        # the runtime's "checkpointed on a signal, not finished" (the job runs again)
RESULT_WAIT_S = 30.0    # an elastic group's member that ended 0: how long it waits for rank 0's result
FORWARDED = (signal.SIGTERM, signal.SIGUSR2, signal.SIGINT)


class Reporter:
    """A trial's reports to its study, for the runtime (rank 0): :meth:`report` records a value
    at a position in the spec's ``step_unit`` and says whether the pruner stops the trial now (the
    trial is then closed as pruned at once, so a requeued job cannot run it again)."""

    def __init__(self, directory: str, number: int, open_study: Callable[[Spec], object] | None = None) -> None:
        self.spec = slots.thawed(directory)
        self.number = number
        self._open = open_study
        self._study: Any = None

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> Reporter | None:
        directory, number = env.get(ENV_DIR), env.get(ENV_NUMBER, "")
        if not directory or not number.isdigit() or len(number) > 9:
            return None
        return cls(directory, int(number))

    @property
    def unit(self) -> str:
        return self.spec.step_unit

    def _position(self, steps: int, samples: int, epochs: int) -> int:
        """Where the trial is, in the spec's ``step_unit``."""
        return int({"steps": steps, "samples": samples, "epochs": epochs}[self.spec.step_unit])

    def promise(self, *, steps: int, samples: int, epochs: int) -> float | None:
        """What the daemon may read of this trial's standing after a report that did not prune
        it: η^k once it survived k rungs of a successive-halving pruner (asha, hyperband), 1
        before its first; None for other pruners (nothing is claimed).  It only reorders its
        owner's own jobs."""
        if self.spec.pruner not in ("asha", "hyperband") or len(self.spec.metrics) > 1:
            return None
        from malletrain.campaign.status import rung
        k = rung(self.spec, self._position(steps, samples, epochs))
        return float(self.spec.reduction_factor ** (k + 1 if k is not None else 0))

    def report(self, value: float, *, steps: int, samples: int, epochs: int) -> bool:
        if len(self.spec.metrics) > 1:       # Optuna prunes single-objective studies only
            return False
        position = self._position(steps, samples, epochs)
        if self._study is None:
            if self._open is None:
                from malletrain.campaign.study import open_study
                self._open = open_study
            self._study = self._open(self.spec)
        study = self._study
        prune = bool(study.report(self.number, int(position), float(value)))
        if prune and self.spec.pruner != "none":
            study.pruned(self.number)
            return True
        return False


def reporter_verdict(reporter: Reporter, value: float, *, steps: int, samples: int,
                     epochs: int) -> tuple[bool, float | None]:
    """A training loop's report at validation, as both the runtime and the adapters make it:
    (whether the pruner stops the trial now, the promise the ``metric`` record carries: only
    when the trial goes on)."""
    where = {"steps": steps, "samples": samples, "epochs": epochs}
    prune = reporter.report(float(value), **where)
    return prune, (None if prune else reporter.promise(**where))


def exit_record(reason: str, env: Mapping[str, str] = os.environ) -> None:
    """Append an ``exit`` record to the job's progress file (when it has one): what the daemon
    reads to know that the job is over."""
    path, job = env.get("MALLETRAIN_METRICS"), env.get("MALLETRAIN_JOB")
    if not path or not job:
        return
    restart = env.get("MALLETRAIN_RESTART", "0")
    rec = {"t": round(time.time(), 3), "job": job, "step": 0, "samples": 0, "step_s": 0.0,
           "restart": int(restart) if restart.isdigit() and len(restart) < 7 else 0,
           "event": "exit", "reason": reason}
    try:
        fd = open_append(path)
    except OSError as exc:
        log.warning("cannot append the exit record to %s: %s", path, exc)
        return
    try:
        os.write(fd, (json.dumps(rec) + "\n").encode())
    finally:
        os.close(fd)


Peers = Callable[[str], "dict[int, str] | None"]    # an array's running tasks -> their starts (None: unknown)


def run_trial(directory: str, slot_id: str, *, open_study: Callable[[Spec], object],
              ticker: Callable[[Spec, object], None], env: Mapping[str, str] = os.environ,
              popen: Callable[..., subprocess.Popen] = subprocess.Popen,
              sleep: Callable[[float], None] = time.sleep, peers: Peers | None = None) -> int:
    """A trial job's process (see the module docstring); the exit status for the job.
    ``peers(array)``: the array's members Slurm shows running, task -> start (a group's)."""
    spec = slots.thawed(directory)
    study = open_study(spec)
    bound = slots.bind(spec, slot_id, study)
    member = bool(spec.job.get("elastic")) and env.get("SLURM_ARRAY_TASK_ID", "").isdigit()
    first = member or env.get("SLURM_PROCID", "0") == "0"
    if bound.state != "running":
        log.info("trial %d is already closed (%s): nothing to run", bound.number, bound.state)
        if first:
            exit_record(slots.END_OF.get(bound.state, "done"), env)
            if slots.close_out(spec, slot_id, study, rc=0, stopped=False) is not None:
                _tick(ticker, spec, study)
        return 0
    child_env = {**env, ENV_DIR: spec.dir, ENV_NUMBER: str(bound.number)}
    command = [*spec.command, "--params", bound.params_path, "--ckpt", bound.ckpt_dir]
    log.info("trial %d (%s): %s", bound.number, slot_id, " ".join(command))
    rc = _run(command, child_env, popen)
    if not first:
        return rc
    stopped = rc == EXIT_STOPPED or rc > 128
    me, running = None, None
    if member:
        if rc == 0:
            _await_final(spec, bound.number, sleep)
        task, array = env["SLURM_ARRAY_TASK_ID"], env.get("SLURM_ARRAY_JOB_ID", "")
        shown = peers(array) if peers is not None and array.isdigit() else None
        if shown is not None and int(task) in shown:      # its own run is still running (this wrapper)
            me = f"{task}@{shown[int(task)]}"
            running = frozenset(f"{t}@{s}" for t, s in shown.items())
        else:
            me = f"{task}@?"
    end = slots.close_out(spec, slot_id, study, rc=rc, stopped=stopped, member=me, running=running)
    if end is None:
        return rc
    if end == "failed":
        log.warning("trial %d failed %d time(s), more than retries (%d): closed as failed",
                    bound.number, spec.retries + 1, spec.retries)
        exit_record("failed", env)
    _tick(ticker, spec, study)
    return 0


def _await_final(spec: Spec, number: int, sleep: Callable[[float], None]) -> None:
    """An elastic group's member that ended 0 before the member that is rank 0 wrote the final
    result: wait for it (at most ``RESULT_WAIT_S``)."""
    waited = 0.0
    while not slots.read_values(spec, number)[1] and waited < RESULT_WAIT_S:
        sleep(0.5)
        waited += 0.5


def _run(command: Sequence[str], env: Mapping[str, str], popen) -> int:
    """Run ``command``, passing the stop signals on; its exit status (128 + N when signal N
    killed it)."""
    child = popen(list(command), env=dict(env))
    previous = {}

    def forward(signum, frame) -> None:
        try:
            child.send_signal(signum)
        except (ProcessLookupError, OSError):
            pass
    for sig in FORWARDED:
        previous[sig] = signal.signal(sig, forward)
    try:
        rc = child.wait()
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
    return 128 - rc if rc < 0 else rc


def _tick(ticker: Callable[[Spec, object], None], spec: Spec, study) -> None:
    """Queue the campaign's next trial jobs; a failure is logged, not raised (the trial's own
    result is already safe, and the next tick — any other trial's end, ``campaign status`` —
    does it)."""
    try:
        ticker(spec, study)
    except Exception as exc:     # noqa: BLE001 - Slurm away, a full disk: the next tick retries
        log.warning("could not queue the campaign's next trials (the next trial to end, or "
                    "`malletrain campaign status`, will): %s", exc)
