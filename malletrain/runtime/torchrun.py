"""``malletrain submit --launch torchrun``: torchrun as a malleable job's launcher.

The batch script runs, on every node of the run (``srun --ntasks-per-node=1``)::

    PYTHON -m malletrain.runtime.torchrun --nproc-per-node K -- SCRIPT.py ARGS...
    PYTHON -m malletrain.runtime.torchrun --nproc-per-node K -- -m MODULE ARGS...

which starts ``torch.distributed.run`` (torchrun) with what a run of a malleable job needs
(:func:`torchrun_argv`, pure):

* **Rendezvous from the job, never a fixed port**: the c10d rendezvous at
  ``$MASTER_ADDR:$MASTER_PORT``, which the batch script derives from the job id and restart
  count (a run's successor, or another job on the node, does not collide); the run id is
  ``<job>.<restart>``, so no agent of an earlier run joins this one; ``--nnodes`` is this run's
  node count (a run has one size: the daemon changes the size by restarting the job).
* **No restarts of its own** (``--max-restarts 0``): Slurm and the daemon restart the job.
* **The stop signal reaches the workers in time**: the agent handles SIGUSR2 (the time-limit
  warning) as well as SIGTERM and passes it on to the workers, and waits the job's grace time
  (``MALLETRAIN_GRACE_S``), not torchrun's default 30 s, before it kills them.

Its exit status is the one the batch script acts on (:func:`exit_status`): 0 when the workers
finished; 3 ("checkpointed, not finished": the job requeues) when the agent was signalled or the
workers all exited 3 (or some did and the others died of the SIGTERM with which the agent closes
the rest); 128+N when a worker was killed by signal N (a signal other than the SIGTERM
with which the agent stops the others after one failed, if there is one); else the first status
of a worker that failed (neither 0 nor 3).  torchrun itself would exit 1 with a traceback for a signal, which the batch
script could not tell from a crash.
"""
from __future__ import annotations

import argparse
import math
import os
import re
import signal
import sys
from collections.abc import Mapping, Sequence

from malletrain.domain.errors import InputError

EXIT_STOPPED = 3
SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR2"
DEFAULT_GRACE_S = 30
_JOB = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
_HOST = re.compile(r"^[A-Za-z0-9._:-]{1,255}$")


def _env_int(env: Mapping[str, str], key: str, default: int, low: int, high: int) -> int:
    raw = env.get(key, "")
    if raw == "":
        return default
    if not raw.isdigit() or not low <= int(raw) <= high:
        raise InputError(f"environment variable {key}={raw[:40]!r}: an integer in [{low}, {high}] expected")
    return int(raw)


def torchrun_argv(env: Mapping[str, str], nproc_per_node: int, target: Sequence[str]) -> list[str]:
    """The arguments of ``torch.distributed.run`` for this run (see the module docstring);
    ``target`` is ``SCRIPT ARGS...`` or ``-m MODULE ARGS...``."""
    if not target or target[0] in ("-m", "--module") and len(target) < 2:
        raise InputError("torchrun launch: nothing to run (SCRIPT.py ARGS... or -m MODULE ARGS...)")
    addr = env.get("MASTER_ADDR", "")
    if not _HOST.match(addr):
        raise InputError(f"torchrun launch: MASTER_ADDR={addr[:60]!r} is not a host name (the batch script sets it)")
    port = _env_int(env, "MASTER_PORT", -1, 1, 65535)
    if port < 0:
        raise InputError("torchrun launch: MASTER_PORT is not set (the batch script derives it from the job)")
    job = env.get("SLURM_JOB_ID") or env.get("MALLETRAIN_JOB") or "local"
    if not _JOB.match(job):
        raise InputError(f"torchrun launch: job id {job[:60]!r} is not one")
    restart = _env_int(env, "MALLETRAIN_RESTART", _env_int(env, "SLURM_RESTART_COUNT", 0, 0, 10**6), 0, 10**6)
    nodes = _env_int(env, "SLURM_JOB_NUM_NODES", _env_int(env, "SLURM_NNODES", 1, 1, 100_000), 1, 100_000)
    try:
        grace = float(env.get("MALLETRAIN_GRACE_S", "") or DEFAULT_GRACE_S)
    except ValueError:
        grace = DEFAULT_GRACE_S
    grace_s = max(1, math.ceil(grace)) if math.isfinite(grace) and grace > 0 else DEFAULT_GRACE_S
    argv = [f"--nnodes={nodes}", f"--nproc-per-node={nproc_per_node}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={addr}:{port}", f"--rdzv-id={job}.{restart}", "--max-restarts=0",
            f"--shutdown-timeout={grace_s}", f"--signals-to-handle={SIGNALS}"]
    if target[0] in ("-m", "--module"):
        return [*argv, "--module", *target[1:]]
    return [*argv, *target]


def exit_status(error: BaseException | None) -> int:
    """What the batch script sees (module docstring) for how torchrun ended: ``None`` (it
    returned), or the exception it raised."""
    if error is None:
        return 0
    name = type(error).__name__
    if name == "SignalException":
        return EXIT_STOPPED
    failures = getattr(error, "failures", None)
    if name == "ChildFailedError" and isinstance(failures, dict) and failures:
        codes = [getattr(f, "exitcode", 1) for _, f in sorted(failures.items())]
        codes = [c if isinstance(c, int) else 1 for c in codes]
        if all(c == EXIT_STOPPED for c in codes):
            return EXIT_STOPPED
        # a rank stopped at its checkpoint and the agent's closing SIGTERM reached another one
        # while the interpreter was exiting (its handlers already reset): a stop all the same
        if EXIT_STOPPED in codes and all(c in (EXIT_STOPPED, -signal.SIGTERM) for c in codes):
            return EXIT_STOPPED
        # after one worker dies the agent stops the others with SIGTERM: the other signal is the cause
        killed = sorted((c for c in codes if c < 0), key=lambda c: c == -signal.SIGTERM)
        if killed:
            return 128 + min(-killed[0], 127)
        return next((c for c in codes if c not in (0, EXIT_STOPPED)), 1) & 0xFF or 1
    if isinstance(error, SystemExit):
        return error.code if isinstance(error.code, int) else 1
    return 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m malletrain.runtime.torchrun",
                                description="torchrun for a malleable job's run (the batch script starts it)")
    p.add_argument("--nproc-per-node", type=int, default=1, help="worker processes per node (default 1)")
    p.add_argument("target", nargs=argparse.REMAINDER, help="-- SCRIPT.py ARGS... or -- -m MODULE ARGS...")
    args = p.parse_args(argv)
    target = args.target[1:] if args.target[:1] == ["--"] else args.target
    if not 1 <= args.nproc_per_node <= 1024:
        print("malletrain torchrun: --nproc-per-node must be in [1, 1024]", file=sys.stderr)
        return 2
    try:
        run_argv = torchrun_argv(os.environ, args.nproc_per_node, target)
    except InputError as exc:
        print(f"malletrain torchrun: {exc}", file=sys.stderr)
        return 2
    from torch.distributed import run as torchrun
    error: BaseException | None = None
    try:
        torchrun.main(run_argv)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - every way torchrun ends maps to a status
        error = exc
    status = exit_status(error)
    if error is not None:
        print(f"malletrain torchrun: torchrun ended with {type(error).__name__}: {str(error)[:300]}; "
              f"exit {status}", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
