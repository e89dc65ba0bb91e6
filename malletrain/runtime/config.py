"""The runtime's settings (one frozen dataclass, validated on construction)."""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields

from malletrain.domain.config import reject_unknown
from malletrain.domain.errors import ConfigError
from malletrain.runtime.logical import MAPPINGS

MODES = ("consistency", "tolerance")
BACKENDS = ("auto", "gloo", "nccl")


@dataclass(frozen=True)
class RuntimeConfig:
    checkpoint_dir: str
    logical_workers: int = 4          # L: fixed whatever the process count
    micro_batch: int = 16             # samples per logical worker per step
    mode: str = "consistency"         # or "tolerance" (native all-reduce, faster, not bitwise)
    seed: int = 0
    keep: int = 3                     # checkpoint files kept
    checkpoint_every_steps: int = 0   # 0: no step-count checkpoints
    checkpoint_every_s: float = 300.0  # 0: no periodic checkpoints by time
    grace_s: float = 30.0             # Slurm GraceTime the stop must fit in
    force_after_s: float | None = None  # abandon the step this long after a signal (default grace/2)
    report_s: float = 0.5             # at most one progress record per this many seconds
    threads: int = 1                  # intra-op threads, pinned (results depend on it)
    backend: str = "auto"             # gloo on CPU, nccl when CUDA is there
    mapping: str | tuple = "contiguous"
    metrics_path: str | None = None   # $MALLETRAIN_METRICS
    collective_timeout_s: float = 300.0
    # an elastic job (:mod:`.elastic`): one process per member; members leave and join at step
    # boundaries without restarting the others
    elastic: bool = False
    pulse_s: float = 0.1              # a member's liveness counter is rewritten this often
    dead_s: float = 1.0               # a member whose counter stood still this long is gone
    join_wait_s: float = 600.0        # a joiner not admitted by then exits to be requeued
    # periodic checkpoints written by a background thread from a copy of the state (training goes
    # on meanwhile); the checkpoints of a stop and of the end stay synchronous. None: elastic jobs
    # only (their checkpoints are for durability: a change of members never reads one)
    background_checkpoints: bool | None = None
    extra: Mapping = field(default_factory=dict)   # free-form, stored in the checkpoint

    def __post_init__(self) -> None:
        problems = []
        if self.logical_workers < 1:
            problems.append(("logical_workers", "must be >= 1"))
        if self.micro_batch < 1:
            problems.append(("micro_batch", "must be >= 1"))
        if self.mode not in MODES:
            problems.append(("mode", f"must be one of {', '.join(MODES)}"))
        if self.backend not in BACKENDS:
            problems.append(("backend", f"must be one of {', '.join(BACKENDS)}"))
        if self.keep < 1:
            problems.append(("keep", "must be >= 1"))
        if self.threads < 1:
            problems.append(("threads", "must be >= 1"))
        if not self.grace_s > 0:
            problems.append(("grace_s", "must be > 0"))
        if not 0 < self.collective_timeout_s < 1e7:
            problems.append(("collective_timeout_s", "must be > 0 seconds (the rendezvous and "
                                                     "every collective wait at most this long)"))
        if not 0 < self.pulse_s < self.dead_s:
            problems.append(("pulse_s", "must be > 0 and below dead_s"))
        if not 0 < self.join_wait_s < 1e7:
            problems.append(("join_wait_s", "must be > 0 seconds"))
        if self.elastic and self.mode != "consistency":
            problems.append(("elastic", "needs mode consistency (every process keeps every "
                                        "logical worker's RNG stream, so any may leave)"))
        if self.elastic and not isinstance(self.mapping, str):
            problems.append(("mapping", "an elastic job's process count changes: use contiguous "
                                        "or round_robin, not a fixed list"))
        if isinstance(self.mapping, str) and self.mapping not in MAPPINGS:
            problems.append(("mapping", f"must be one of {', '.join(MAPPINGS)} or a list of lists"))
        if problems:
            key, msg = problems[0]
            raise ConfigError(msg, field=key)

    @property
    def deadline_s(self) -> float:
        return self.force_after_s if self.force_after_s is not None else self.grace_s / 2

    @property
    def global_batch(self) -> int:
        return self.logical_workers * self.micro_batch

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **kwargs) -> RuntimeConfig:
        """Settings from keyword arguments, with environment variables filling the ones not
        given: ``MALLETRAIN_METRICS``, ``MALLETRAIN_GRACE_S`` and ``MALLETRAIN_ELASTIC`` (the
        sbatch template exports them: ``1`` in an elastic group's member, which must run
        ``elastic``), ``MALLETRAIN_CHECKPOINT_DIR`` and ``MALLETRAIN_COLLECTIVE_TIMEOUT_S``."""
        env = os.environ if env is None else env
        reject_unknown(kwargs, sorted(f.name for f in fields(cls)), None, what="runtime setting")
        if env.get("MALLETRAIN_ELASTIC") == "1":
            if kwargs.get("elastic") is False:
                raise ConfigError("this process is a member of an elastic group (submit --elastic, or a "
                                  "campaign's job.elastic): it must run elastic, one process per node",
                                  field="elastic")
            kwargs["elastic"] = True
        if "metrics_path" not in kwargs and env.get("MALLETRAIN_METRICS"):
            kwargs["metrics_path"] = env["MALLETRAIN_METRICS"]
        for key, var in (("grace_s", "MALLETRAIN_GRACE_S"),
                         ("collective_timeout_s", "MALLETRAIN_COLLECTIVE_TIMEOUT_S")):
            if key not in kwargs and env.get(var):
                try:
                    kwargs[key] = float(env[var])
                except ValueError:
                    raise ConfigError(f"environment variable {var} is not a number", field=key) from None
        if "checkpoint_dir" not in kwargs:
            if not env.get("MALLETRAIN_CHECKPOINT_DIR"):
                raise ConfigError("no checkpoint directory: pass checkpoint_dir or set "
                                  "MALLETRAIN_CHECKPOINT_DIR", field="checkpoint_dir")
            kwargs["checkpoint_dir"] = env["MALLETRAIN_CHECKPOINT_DIR"]
        return cls(**kwargs)
