"""The one configuration schema.

Every section is a frozen dataclass; :func:`from_mapping` builds one from a
parsed YAML/CLI mapping and rejects unknown keys with the list of valid ones,
wrong types and out-of-range values, naming the file and key.
"""
from __future__ import annotations

import math
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, TypeVar

from malletrain.domain.errors import ConfigError, InputError, yaml_problem
from malletrain.domain.text import clipped

POLICIES = ("malletrain", "oracle", "bftrainer", "bftrainer-guess", "greedy", "static")
OBJECTIVES = ("samples", "speedup", "progress")
FORECAST_POLICIES = ("malletrain", "oracle", "greedy")   # the policies that use learned pauses and stays
MAX_SECONDS = 1e9     # ~31 years: a longer duration (horizon, timeout, interval) is a typo
ALLOCATORS = ("auto", "dp", "cbc", "highs", "greedy")


@dataclass(frozen=True)
class CoreConfig:
    """Knobs of the pure decision core (shared by daemon and replay)."""

    policy: str = "malletrain"     # which policy decides (see POLICIES)
    horizon_s: float = 600.0       # look-ahead H of the objective
    allocator: str = "auto"        # auto: exact DP for one node type, else MILP
    time_limit_s: float = 5.0      # MILP solver limit per decision
    max_candidates: int = 32       # candidate sizes per job (geometric grid beyond)
    min_dwell_s: float = 0.0       # a job keeps a new size at least this long
    bftrainer_time_limit_s: float = 10.0  # BFTrainer's per-decision solver limit
    static_size: str = "max"       # static policy: run each job at 'max' or 'min' nodes
    # probing (malletrain policy): a job with no measurement is run at a probe count first
    probe_timeout_s: float = 600.0  # a probe that yields no measurement by then is given up (then retried
                                    # after a doubling back-off); 0 = wait for ever
    probes_per_owner: int = 2      # jobs of one owner probing at once (0 = no limit); probes go round-robin
    # what the objective counts (docs: "The objective"): 'samples' (samples/s summed over jobs),
    # 'speedup' (each job's rate over its per-node rate at min_nodes: node-equivalents, unit-free),
    # 'progress' (fraction of each job's work per second; jobs without a known work count as 'speedup')
    objective: str = "samples"
    user_weights: tuple = ()       # ((user, weight), ...): a user's jobs count weight x (default 1)
    starvation_s: float = 0.0      # an admitted job waiting this long gets min_nodes before others grow (0 = off)
    # a user's nodes are re-split among that user's own jobs by the promise their campaign's study
    # reports (a trial that survived more pruning rungs first; the user's jobs compared in node-equivalents,
    # not samples/s); what other users' jobs get is unchanged
    promise: bool = True
    # forecasts (malletrain, oracle, greedy): learned rescale pauses and predicted node stays
    learn_rescale: bool = True     # charge measured rescale pauses (the job's configured ones are the prior)
    availability: bool = True      # predict each node's remaining idle time from the idle stretches seen so far
    variability: bool = True       # learn which jobs slow down on slow nodes; give them the fast ones
    stay_min_fragments: int = 20   # idle stretches seen before stays are predicted at all
    stay_half_life: int = 2000     # idle stretches: older ones count half as much per this many newer ones

    def weight(self, user: str) -> float:
        for name, w in self.user_weights:
            if name == user:
                return float(w)
        return 1.0

    def validate(self, where: str = "config") -> CoreConfig:
        _choice(self.policy, POLICIES, where, "policy")
        _choice(self.objective, OBJECTIVES, where, "objective")
        for name, w in self.user_weights:
            if not (isinstance(w, (int, float)) and 0 < w <= 1e6):
                raise ConfigError(f"weight of {name!r} must be > 0 and <= 1e6, got {w!r}",
                                  path=where, field="user_weights")
        if not 0 <= self.starvation_s <= MAX_SECONDS:
            raise ConfigError(f"must be >= 0 and <= {MAX_SECONDS:g} s", path=where, field="starvation_s")
        if self.stay_min_fragments < 1 or self.stay_half_life < 1:
            raise ConfigError("must be >= 1", path=where,
                              field="stay_min_fragments" if self.stay_min_fragments < 1 else "stay_half_life")
        _choice(self.allocator, ALLOCATORS, where, "allocator")
        _choice(self.static_size, ("max", "min"), where, "static_size")
        for name in ("horizon_s", "time_limit_s", "bftrainer_time_limit_s"):
            if not 0 < getattr(self, name) <= MAX_SECONDS:
                raise ConfigError(f"must be > 0 and <= {MAX_SECONDS:g} s, got {getattr(self, name)!r}",
                                  path=where, field=name)
        for name in ("min_dwell_s", "probe_timeout_s"):
            if not 0 <= getattr(self, name) <= MAX_SECONDS:
                raise ConfigError(f"must be >= 0 and <= {MAX_SECONDS:g} s, got {getattr(self, name)!r}",
                                  path=where, field=name)
        if self.max_candidates < 2:
            raise ConfigError("must be >= 2", path=where, field="max_candidates")
        if self.probes_per_owner < 0:
            raise ConfigError("must be >= 0", path=where, field="probes_per_owner")
        return self


def _choice(value: str, allowed: tuple[str, ...], where: str, key: str) -> None:
    if value not in allowed:
        raise ConfigError(f"{value!r} is not one of: {', '.join(allowed)}", path=where, field=key)


T = TypeVar("T")


def from_mapping(cls: type[T], data: Mapping[str, Any] | None, where: str = "config") -> T:
    """Build ``cls`` from ``data``; unknown keys and bad types are errors."""
    data = dict(data or {})
    valid = {f.name: f for f in fields(cls)}  # type: ignore[arg-type]
    reject_unknown(data, sorted(valid), where)
    kwargs = {}
    for key, value in data.items():
        default = valid[key].default
        kwargs[key] = _coerce(value, default, where, key)
    obj = cls(**kwargs)
    validate = getattr(obj, "validate", None)
    return validate(where) if validate else obj


def reject_unknown(data: Mapping, valid, where: str | None, *, what: str = "key",
                   within: str | None = None) -> None:
    """ConfigError naming every unknown key of ``data`` and listing the valid ones."""
    unknown = sorted(map(str, set(data) - set(valid)))
    if unknown:
        place = f" in {within}" if within else ""
        raise ConfigError(f"unknown {what}(s) {', '.join(unknown)}{place}; valid {what}s: "
                          f"{', '.join(valid)}", path=where)


def _coerce(value: Any, default: Any, where: str, key: str) -> Any:
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"expected true/false, got {value!r}", path=where, field=key)
        return value
    if isinstance(default, (int, float)) and not isinstance(default, bool):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"expected a number, got {value!r}", path=where, field=key)
        if abs(value) > 10**15 or not math.isfinite(value):
            raise ConfigError(f"expected a finite number (|x| <= 1e15), got {clipped(value)}", path=where, field=key)
        if isinstance(default, int) and not float(value).is_integer():
            raise ConfigError(f"expected an integer, got {value!r}", path=where, field=key)
        return type(default)(value)
    if key.endswith("_weights"):     # a mapping name -> positive number, kept as sorted pairs
        if not isinstance(value, Mapping) or not all(isinstance(k, str) and k for k in value):
            raise ConfigError(f"expected a mapping of names to numbers, got {clipped(value)}", path=where, field=key)
        if len(value) > 100_000:
            raise ConfigError("at most 100000 entries", path=where, field=key)
        for k, v in value.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ConfigError(f"weight of {clipped(k)} must be a number, got {clipped(v)}", path=where, field=key)
        return tuple(sorted((k, float(v)) for k, v in value.items()))
    if isinstance(default, tuple):
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v for v in value):
            raise ConfigError(f"expected a list of non-empty strings, got {value!r}", path=where, field=key)
        if len(value) > 1000:
            raise ConfigError("at most 1000 entries", path=where, field=key)
        return tuple(value)
    if isinstance(default, str) and not isinstance(value, str):
        raise ConfigError(f"expected a string, got {value!r}", path=where, field=key)
    return value


@dataclass(frozen=True)
class SlurmConfig:
    """How the daemon reaches Slurm (``slurm:`` section)."""

    partition: str = "scavenger"    # where malleable jobs live (preemptible)
    slurm_conf: str = ""            # SLURM_CONF for every command; '' = Slurm's default
    bin_dir: str = ""               # directory of Slurm's commands (squeue, scontrol…); '' = PATH
    command_timeout_s: float = 10.0  # per Slurm command
    retries: int = 3                # read commands: retries with jittered backoff
    backoff_s: float = 0.5          # first retry delay (doubles, ±50% jitter)
    reservations_every: int = 6     # read reservations every N cycles (0 = never)
    limits_every: int = 6           # read owners' association GrpTRES node limits every N cycles
    #                                 (0 = never): Slurm lifts them for a job an operator resizes
    node_info: str = ""             # site CSV node,group,slowdown (speeds, groups); '' = none
    topology: bool = True           # read topology.conf's switches (scontrol show topology) at start
    # adopt elastic groups (issue #26: held arrays of 1-node members, `submit --elastic`); the queue
    # read then lists every array task (squeue -r): one line per pending task of every array in
    # every partition, where it is one line per array otherwise (SECURITY.md)
    elastic_groups: bool = False

    def validate(self, where: str = "config") -> SlurmConfig:
        if not self.partition:
            raise ConfigError("must not be empty", path=where, field="partition")
        if self.node_info and not os.path.isabs(self.node_info):
            raise ConfigError("must be an absolute path (or '' for none)", path=where, field="node_info")
        if self.bin_dir and not os.path.isabs(self.bin_dir):
            raise ConfigError("must be an absolute directory (or '' for PATH)", path=where, field="bin_dir")
        for name in ("command_timeout_s", "backoff_s"):
            if not 0 < getattr(self, name) <= MAX_SECONDS:
                raise ConfigError(f"must be > 0 and <= {MAX_SECONDS:g} s", path=where, field=name)
        for name in ("retries", "reservations_every", "limits_every"):
            if getattr(self, name) < 0:
                raise ConfigError("must be >= 0", path=where, field=name)
        return self


@dataclass(frozen=True)
class DaemonConfig:
    """The service loop (``daemon:`` section)."""

    interval_s: float = 10.0         # one cycle per interval
    state_dir: str = "/var/lib/malletrain"   # sqlite state and status.json (local disk)
    metrics_host: str = "127.0.0.1"  # Prometheus endpoint; loopback only
    metrics_port: int = 9687         # 0 = no endpoint
    vacate_lead_s: float = 60.0      # give nodes back this long before a primary job's planned start (0 = off)
    start_timeout_s: float = 60.0    # a released job that has not started by then is held again
    rescale_wait_s: float = 45.0     # wait this long for a requeued job to leave COMPLETING
    max_line_bytes: int = 4096       # longer progress lines are skipped
    log_format: str = "json"         # json | text
    # --- what users control is bounded (SECURITY.md) ---
    # progress files are read only below these directories
    progress_roots: tuple = ("/home", "/scratch", "/work", "/projects", "/lustre", "/gpfs")
    shared_profiles: tuple = ()      # profile names all users share; any other profile is per user
    max_rescale_pause_s: float = 3600.0  # a tag's --rescale-up/--rescale-down is clamped to this
    max_samples_per_s: float = 1e9   # a progress rate above this is not physical: the record is skipped
    max_records_per_job: int = 1000  # progress records read per job per cycle (the rest wait)
    max_progress_bytes_per_cycle: int = 64 << 20   # progress bytes read per cycle over all jobs
    progress_read_timeout_s: float = 2.0   # one open+read of a progress file (a hung mount is skipped after)
    progress_cycle_timeout_s: float = 5.0  # all progress reading of one cycle (the rest waits its turn)
    max_tag_reads: int = 50          # new jobs whose tag is read per cycle (fair across users)
    samples_kept: int = 2000         # JPA samples kept per job (oldest age out)
    # --- the safety net (nothing lost) and fault tolerance ---
    max_failures: int = 3            # a job that ends without a result is requeued this often, then held
    retry_backoff_s: float = 10.0    # before the first requeue; doubles per failure (at most 120 s)
    hang_floor_s: float = 600.0      # a running job silent this long (and hang_factor x its step time) is hung
    hang_factor: float = 10.0
    join_timeout_s: float = 900.0    # an elastic group's member running this long outside its group is requeued held
    node_strikes: int = 3            # failures/hangs on a node within node_cooldown_s that rest it ...
    node_cooldown_s: float = 1800.0  # ... for this long (left out of harvesting, never drained)
    max_excluded_share: float = 0.25  # at most this share of the partition rests at once

    def validate(self, where: str = "config") -> DaemonConfig:
        for name in ("interval_s", "start_timeout_s", "rescale_wait_s"):
            if not getattr(self, name) > 0:
                raise ConfigError("must be > 0", path=where, field=name)
        if not self.interval_s >= 0.1:
            raise ConfigError("must be >= 0.1 s", path=where, field="interval_s")
        for name in ("max_samples_per_s", "max_records_per_job", "max_progress_bytes_per_cycle", "max_tag_reads",
                     "samples_kept", "progress_read_timeout_s", "progress_cycle_timeout_s",
                     "hang_floor_s", "hang_factor", "node_strikes", "node_cooldown_s", "join_timeout_s"):
            if not getattr(self, name) > 0:
                raise ConfigError("must be > 0", path=where, field=name)
        for name in ("max_rescale_pause_s", "max_failures", "retry_backoff_s"):
            if getattr(self, name) < 0:
                raise ConfigError("must be >= 0", path=where, field=name)
        for root in self.progress_roots:
            if not root.startswith("/") or "\0" in root:
                raise ConfigError(f"{root!r} is not an absolute path", path=where, field="progress_roots")
        if self.vacate_lead_s < 0:
            raise ConfigError("must be >= 0", path=where, field="vacate_lead_s")
        for name in ("interval_s", "start_timeout_s", "rescale_wait_s", "vacate_lead_s", "retry_backoff_s",
                     "hang_floor_s", "node_cooldown_s", "max_rescale_pause_s", "progress_read_timeout_s",
                     "join_timeout_s",
                     "progress_cycle_timeout_s"):
            if not getattr(self, name) <= MAX_SECONDS:   # the loop sleeps and waits this long
                raise ConfigError(f"must be <= {MAX_SECONDS:g} s", path=where, field=name)
        if not 0 <= self.max_excluded_share <= 1:
            raise ConfigError("must be in [0, 1]", path=where, field="max_excluded_share")
        if not 0 <= self.metrics_port <= 65535:
            raise ConfigError("must be a port number (0 = off)", path=where, field="metrics_port")
        if self.max_line_bytes < 64:
            raise ConfigError("must be >= 64", path=where, field="max_line_bytes")
        _choice(self.log_format, ("json", "text"), where, "log_format")
        return self


@dataclass(frozen=True)
class Config:
    """The whole daemon configuration file: ``core:``, ``slurm:``, ``daemon:``."""

    core: CoreConfig = CoreConfig()
    slurm: SlurmConfig = SlurmConfig()
    daemon: DaemonConfig = DaemonConfig()


SECTIONS = {"core": CoreConfig, "slurm": SlurmConfig, "daemon": DaemonConfig}


def config_from_mapping(data: Any, where: str = "config") -> Config:
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError("the top level must be a mapping with sections "
                          f"{', '.join(SECTIONS)}", path=where)
    reject_unknown(data, list(SECTIONS), where, what="section")
    parts: dict[str, Any] = {}
    for name, cls in SECTIONS.items():
        section = data.get(name)
        if section is not None and not isinstance(section, Mapping):
            raise ConfigError("must be a mapping", path=where, field=name)
        try:
            parts[name] = from_mapping(cls, section, where)
        except ConfigError as exc:   # name the section in the error
            if exc.field is None:
                raise ConfigError(f"section {name}: {exc.message}", path=where) from None
            raise ConfigError(exc.message, path=where, field=f"{name}.{exc.field}") from None
    return Config(**parts)


MAX_YAML_BYTES = 4 << 20


def read_text(path: str, *, max_bytes: int, error: type[InputError] = InputError, what: str = "file",
              regular: bool = True) -> str:
    """A UTF-8 text file read whole; every problem (unreadable, not a regular file when
    ``regular``, larger than ``max_bytes``, not UTF-8) raises ``error`` naming the file (and line)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as fh:
            if regular and not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
                raise error(f"cannot read {what}: not a regular file", path=path)
            raw = fh.read(max_bytes + 1)
    except OSError as exc:
        raise error(f"cannot read {what}: {exc.strerror}", path=path) from None
    if len(raw) > max_bytes:
        raise error(f"{what} larger than {max_bytes >> 20} MiB", path=path)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error("not UTF-8 text", path=path, line=raw[:exc.start].count(b"\n") + 1) from None


def read_yaml(path: str, *, error: type[InputError] = InputError, loader: Any = None,
              what: str = "file") -> Any:
    """A YAML file's document; every problem (unreadable, not a regular file, larger than
    ``MAX_YAML_BYTES``, not UTF-8, not YAML, nested too deeply) raises ``error`` naming the
    file and line.  ``loader`` defaults to PyYAML's SafeLoader."""
    import yaml
    text = read_text(path, max_bytes=MAX_YAML_BYTES, error=error, what=what)
    try:
        return yaml.load(text, Loader=loader or yaml.SafeLoader)  # noqa: S506 - SafeLoader or a subclass
    except yaml.YAMLError as exc:
        message, line = yaml_problem(exc)
        raise error(message, path=path, line=line) from None
    except RecursionError:
        raise error("nested too deeply", path=path) from None
    except (ValueError, OverflowError, TypeError) as exc:
        # a scalar PyYAML's constructors cannot build: a 5000-digit integer, 2021-13-45, !!int 1.5
        raise error(f"not valid YAML: {str(exc)[:120]}", path=path) from None


def load_config(path: str) -> Config:
    """Read and validate a YAML config file; every problem is a ConfigError."""
    return config_from_mapping(read_yaml(path, error=ConfigError, what="config"), path)
