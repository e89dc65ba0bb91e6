"""The one subprocess seam every Slurm command goes through.

* argv lists only, never a shell; every call has a timeout; a bare command
  name is taken from ``bin_dir`` when one is configured (a site's
  ``/opt/slurm/24.11/bin``), else from ``PATH``;
* a sanitised environment: ``SQUEUE_*``, ``SINFO_*``, ``SBATCH_*``,
  ``SCONTROL_*``, ``SLURM_TIME_FORMAT`` … from the caller are dropped (they
  change output formats), ``LC_ALL=C``, ``SLURM_TIME_FORMAT=%s`` (epoch
  seconds) are set, and with ``array_tasks`` (elastic groups on) ``SLURM_BITSTR_LEN``
  (an array's pending tasks listed whole: :mod:`malletrain.slurm.parse`; off, a
  user's sparse pending arrays cannot lengthen every cycle's read), ``SLURM_CONF`` is passed when configured;
* read commands are retried with jittered exponential backoff; write
  commands are not (their callers decide what is safe to repeat); once the
  ``stop`` event is set (the daemon was told to stop) a failed read is not
  retried and a backoff wait ends at once, so SIGTERM during a controller
  outage stops the daemon within one command timeout, not after every retry;
* a failure raises :class:`SlurmCommandError` carrying argv, rc and stderr;
* every call is counted and timed (read/write, latency) for the cycle's
  benchmark and the Prometheus metrics; every write is logged (``command``
  field of the JSON log): the daemon's audit trail.
"""
from __future__ import annotations

import logging
import os
import random
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from malletrain.domain.errors import BackendError
from malletrain.slurm.parse import TASKS_SHOWN_MAX

log = logging.getLogger("malletrain.slurm")

_DROP_PREFIXES = ("SQUEUE_", "SINFO_", "SBATCH_", "SCONTROL_", "SRUN_", "SALLOC_", "SACCT_")
_DROP = {"SLURM_TIME_FORMAT", "SLURM_BITSTR_LEN", "SLURM_CONF", "LANG", "LANGUAGE"}


class SlurmCommandError(BackendError):
    """A Slurm command failed, timed out or could not be run."""

    def __init__(self, argv: Sequence[str], rc: int | None, stderr: str,
                 timed_out: bool = False) -> None:
        self.argv, self.rc, self.stderr, self.timed_out = list(argv), rc, stderr.strip(), timed_out
        what = "timed out" if timed_out else f"exited {rc}"
        super().__init__(f"{' '.join(self.argv)} {what}: {self.stderr or '(no stderr)'}")


UNKNOWN_JOB = "Invalid job id specified"     # slurm_load_jobs' error for an id it does not hold


def is_unknown_job(exc: SlurmCommandError) -> bool:
    """Slurm's answer that a job id is not (or no longer) known to slurmctld."""
    return exc.rc == 1 and not exc.timed_out and UNKNOWN_JOB in exc.stderr


@dataclass
class CommandStats:
    """Counters since the last :meth:`take` (one cycle) and in total."""

    reads: int = 0
    writes: int = 0
    failures: int = 0
    latencies_s: list = field(default_factory=list)   # (argv[0], seconds, kind)
    total_reads: int = 0
    total_writes: int = 0
    total_failures: int = 0
    total_read_bytes: int = 0       # what read commands printed (stdout), in all

    def take(self) -> tuple[int, int, list]:
        out = (self.reads, self.writes, self.latencies_s)
        self.reads, self.writes, self.latencies_s = 0, 0, []
        return out


def clean_env(base: Mapping[str, str], slurm_conf: str | None, *, array_tasks: bool = False) -> dict[str, str]:
    env = {k: v for k, v in base.items()
           if not k.startswith(_DROP_PREFIXES) and k not in _DROP}
    env["LC_ALL"] = "C"
    env["SLURM_TIME_FORMAT"] = "%s"
    if array_tasks:         # an array's pending tasks listed whole (parse.py): elastic groups only
        env["SLURM_BITSTR_LEN"] = str(TASKS_SHOWN_MAX)
    if slurm_conf:
        env["SLURM_CONF"] = slurm_conf
    return env


class Runner:
    """Runs Slurm commands; ``exec_fn`` is replaceable for unit tests."""

    def __init__(self, *, slurm_conf: str | None = None, bin_dir: str | None = None,
                 timeout_s: float = 10.0,
                 retries: int = 3, backoff_s: float = 0.5,
                 exec_fn: Callable[..., subprocess.CompletedProcess] | None = None,
                 sleep: Callable[[float], object] | None = None,
                 rng: random.Random | None = None, array_tasks: bool = False) -> None:
        self.env = clean_env(os.environ, slurm_conf, array_tasks=array_tasks)
        self.bin_dir = bin_dir or None
        self.timeout_s, self.retries, self.backoff_s = timeout_s, retries, backoff_s
        self._exec = exec_fn or subprocess.run
        self.stop = threading.Event()     # set by the owner when it is told to stop: no more retries
        self._sleep = sleep
        self._rng = rng or random.Random()
        self.stats = CommandStats()

    def read(self, argv: Sequence[str], timeout_s: float | None = None, *,
             unknown_job_ok: bool = False, retries: int | None = None) -> str:
        """Run a read-only command; retried on failure.  Returns stdout.

        ``unknown_job_ok``: a ``squeue -j`` of job ids.  Given a single id that slurmctld no
        longer holds (purged after MinJobAge, or never existed) squeue exits 1 with "Invalid job
        id specified" (22.05, 24.11, 26.05; a list of ids exits 0 listing those it holds): that
        answer is "no such job", an empty listing, not a failure, and is not retried.
        ``retries`` replaces the runner's own count for this read (0: a read worth one try)."""
        last: SlurmCommandError | None = None
        for attempt in range((self.retries if retries is None else retries) + 1):
            if attempt:
                if self.stop.is_set():
                    break
                delay = self.backoff_s * (2 ** (attempt - 1)) * (0.5 + self._rng.random())
                log.warning("retrying %s in %.1fs (attempt %d): %s", argv[0], delay, attempt + 1, last)
                if self._sleep is None:
                    self.stop.wait(delay)       # ends early when the daemon is told to stop
                else:
                    self._sleep(delay)
                if self.stop.is_set():
                    break
            try:
                return self._once(argv, timeout_s, "read")
            except SlurmCommandError as exc:
                if unknown_job_ok and is_unknown_job(exc):
                    return ""
                last = exc
        assert last is not None
        raise last

    def write(self, argv: Sequence[str], timeout_s: float | None = None,
              env: Mapping[str, str] | None = None) -> str:
        """Run a command that changes state; never retried here.  ``env`` replaces the
        sanitised environment (``sbatch`` runs in the submitting user's own)."""
        return self._once(argv, timeout_s, "write", env)

    def _once(self, argv: Sequence[str], timeout_s: float | None, kind: str,
              env: Mapping[str, str] | None = None) -> str:
        argv = [str(a) for a in argv]
        if self.bin_dir and "/" not in argv[0]:
            argv[0] = os.path.join(self.bin_dir, argv[0])
        if kind == "write":    # the audit trail: every change the daemon makes in Slurm
            log.info("slurm write: %s", " ".join(argv), extra={"command": argv})
        t0 = time.perf_counter()
        if kind == "read":
            self.stats.reads += 1
            self.stats.total_reads += 1
        else:
            self.stats.writes += 1
            self.stats.total_writes += 1
        try:
            proc = self._exec(argv, capture_output=True, text=True, encoding="utf-8", errors="replace",
                              env=dict(env) if env is not None else self.env,
                              timeout=timeout_s or self.timeout_s, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired as exc:
            self._failed()
            err = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
            raise SlurmCommandError(argv, None, err, timed_out=True) from None
        except OSError as exc:
            self._failed()
            raise SlurmCommandError(argv, None, str(exc)) from None
        finally:
            self.stats.latencies_s.append((os.path.basename(argv[0]), time.perf_counter() - t0, kind))
        if proc.returncode != 0:
            self._failed()
            raise SlurmCommandError(argv, proc.returncode, proc.stderr or "")
        if kind == "read":
            self.stats.total_read_bytes += len(proc.stdout)
        return proc.stdout

    def _failed(self) -> None:
        self.stats.failures += 1
        self.stats.total_failures += 1
