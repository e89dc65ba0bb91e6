"""``status.json``: what the daemon tells users and tools after every cycle.

One frozen record (:class:`DaemonStatus`), written atomically by the daemon
(:func:`write_status`) and read back by ``malletrain status``/``explain``, the
demo and the tests (:func:`read_status`).  ``schema_version`` changes whenever
a field is renamed or removed; new optional fields keep the version.
"""
from __future__ import annotations

import contextlib
import json
import os
import types
import typing
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

from malletrain.daemon.outcomes import Outcomes
from malletrain.domain.errors import InputError
from malletrain.domain.timeutil import MAX_EPOCH_S

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Measured:
    nodes: int
    samples_per_s: float
    t: float


@dataclass(frozen=True)
class Rescale:
    """The rescale pauses the decisions charge a job: learned (``up_n``/``down_n`` measurements)
    or, before any, its configured ones.  An elastic group's kinds that a restart does not have
    (issue #26): its grow and preemption pauses, and its loss pause (shown, not charged); None
    for a job that restarts on every change."""

    up_s: float
    down_s: float
    up_n: int
    down_n: int
    configured_up_s: float
    configured_down_s: float
    grow_s: float | None = None
    grow_n: int = 0
    preemption_s: float | None = None
    preemption_n: int = 0
    loss_s: float | None = None
    loss_n: int = 0


@dataclass(frozen=True)
class Change:
    """One applied action, as the store keeps it for ``explain``."""

    t: float
    cycle: int
    kind: str
    from_nodes: str
    to_nodes: str
    reason: str
    code: str = ""


@dataclass(frozen=True)
class Member:
    """One member of an elastic group (issue #26): its array task, the job id Slurm gave it, its
    malletrain phase and node (empty unless running)."""
    task: int
    job: str
    state: str
    node: str


@dataclass(frozen=True)
class JobStatus:
    job: str
    name: str
    user: str
    state: str                      # malletrain's phase (running, held, pending, …)
    slurm_state: str
    slurm_reason: str
    nodes: tuple[str, ...]
    size: int
    min_nodes: int | None
    max_nodes: int | None
    profile: str
    measured: Measured | None
    predicted: float | None
    curve_source: str | None
    curve: dict[str, float]
    probe: int | None               # the smallest count still to be measured …
    reason: str                     # the last decision's detail …
    reason_code: str                # … and its ReasonCode value
    last_action: Change | None
    history: tuple[Change, ...]
    progress_skipped: int = 0       # this job's progress lines skipped and file refusals
    rescale: Rescale | None = None  # learned vs. configured rescale pauses
    probes: tuple[int, ...] = ()    # … and all of them: a cycle probes at the largest its share reaches
    members: tuple[Member, ...] = ()  # an elastic group's members (empty for a plain job)


@dataclass(frozen=True)
class Counters:
    preemptions: int = 0
    rescales: int = 0
    starts: int = 0
    stops: int = 0
    vacates: int = 0
    failed_actions: int = 0
    progress_lines: int = 0
    progress_lines_skipped: int = 0
    slurm_reads: int = 0
    slurm_writes: int = 0
    refused_writes: int = 0          # a job no longer matched its id/owner/partition/tag
    progress_files_refused: int = 0
    recoveries: int = 0              # lost or hung jobs the safety net requeued


@dataclass(frozen=True)
class CycleStats:
    reads: int
    writes: int
    cycle_s: float
    decision_ms: float | None
    reused: bool


@dataclass(frozen=True)
class DaemonStatus:
    t: float
    cycle: int
    slurm_up: bool
    interval_s: float
    partition: str
    idle_nodes: int
    vacating: tuple[str, ...]
    counters: Counters
    last_cycle: CycleStats | None
    jobs: tuple[JobStatus, ...]
    schema_version: int = SCHEMA_VERSION
    state_writable: bool = True      # False: the store takes no writes, nothing is applied
    state_error: str = ""
    excluded_nodes: dict[str, str] = field(default_factory=dict)   # node -> until/why (safety net)
    failures: dict[str, int] = field(default_factory=dict)         # job -> failures so far
    outcomes: Outcomes | None = None    # completions, completion time, wait, fairness over users
    # what the last cycle contained ("forecasts: …", "curves: job 7: …", "decide: …") or, "cycle: …",
    # the error that stopped it; jobs set aside carry the reason code set-aside (SECURITY.md, Containment)
    errors: tuple[str, ...] = ()

    def job(self, job_id: str) -> JobStatus | None:
        return next((j for j in self.jobs if j.job == job_id), None)


def write_status(path: str, status: DaemonStatus) -> None:
    """Write ``status`` to ``path`` atomically (temp file, then rename), mode 0640: the
    daemon's group reads it (add the users who may run ``malletrain status`` to it)."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            # compact: json's C encoder (an indent takes the pure-Python one, ten times slower, and
            # the status of thousands of jobs is written every cycle); `jq .` shows it indented
            fh.write(json.dumps(_plain(status), separators=(",", ":"), ensure_ascii=False))
        os.chmod(tmp, 0o640)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _plain(value: Any) -> Any:
    """``dataclasses.asdict`` without its deep copies (the records are frozen, and the fields
    strings, numbers, tuples, dicts and records): what :func:`json.dumps` takes."""
    if is_dataclass(value) and not isinstance(value, type):
        return {f: _plain(getattr(value, f)) for f in _names(type(value))}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


_NAMES: dict[type, tuple[str, ...]] = {}


def _names(cls: type) -> tuple[str, ...]:
    names = _NAMES.get(cls)
    if names is None:
        names = _NAMES[cls] = tuple(f.name for f in fields(cls))
    return names


def read_status(path: str) -> DaemonStatus:
    """The status the daemon last wrote; :class:`InputError` when missing, malformed or newer."""
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except FileNotFoundError:
        raise InputError("no status yet: is the daemon running with this state_dir?", path=path) from None
    except (OSError, ValueError, RecursionError) as exc:   # also not UTF-8, not JSON, nested too deeply
        raise InputError(f"cannot read status: {str(exc)[:120]}", path=path) from None
    try:
        st = status_from_dict(doc)
        problem = _type_problem(st, DaemonStatus, "status")
    except (AttributeError, KeyError, TypeError, ValueError, OverflowError, IndexError, RecursionError) as exc:
        raise InputError(f"not a malletrain status file: {str(exc)[:120]}", path=path) from None
    if problem:
        raise InputError(f"not a malletrain status file: {problem}", path=path)
    return st


def status_from_dict(doc: dict[str, Any]) -> DaemonStatus:
    version = doc.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ValueError(f"schema_version {version!r}, this malletrain reads {SCHEMA_VERSION}")

    def change(d: dict | None) -> Change | None:
        return None if d is None else _build(Change, d)

    jobs = tuple(_build(JobStatus, dict(
        j, nodes=tuple(j["nodes"]), probes=tuple(j.get("probes", ())),
        measured=None if j["measured"] is None else _build(Measured, j["measured"]),
        last_action=change(j["last_action"]), history=tuple(_build(Change, h) for h in j["history"]),
        rescale=None if j.get("rescale") is None else _build(Rescale, j["rescale"]),
        members=tuple(_build(Member, m) for m in j.get("members", ()))))
        for j in doc["jobs"])
    lc = doc["last_cycle"]
    oc = doc.get("outcomes")
    return _build(DaemonStatus, dict(doc, vacating=tuple(doc["vacating"]), errors=tuple(doc.get("errors", ())),
                                     counters=_build(Counters, doc["counters"]),
                                     last_cycle=None if lc is None else _build(CycleStats, lc), jobs=jobs,
                                     outcomes=None if oc is None else _build(Outcomes, oc)))


def _build(cls: type, d: dict[str, Any]) -> Any:
    """``cls(**d)`` over the fields ``cls`` knows (a newer writer's extra fields are ignored)."""
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in d.items() if k in names})


def _type_problem(value, hint, where: str) -> str | None:
    """Where ``value`` (read from JSON) does not have the type ``hint`` of the status schema
    (None when it does); every ``t`` must be a time in years 1970..9999.  A kind of hint this
    does not know (a newer schema's) is accepted: the rendering is guarded as well."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        others = [a for a in args if a is not type(None)]
        if value is not None and len(others) == 1:      # X | None: say what is wrong inside the X
            return _type_problem(value, others[0], where)
        fits = [a for a in args if _type_problem(value, a, where) is None]
        return None if fits else f"{where} is not {' or '.join(getattr(a, '__name__', str(a)) for a in args)}"
    if origin in (tuple, list):
        if not isinstance(value, (tuple, list)):
            return f"{where} is not a list"
        return next((p for i, v in enumerate(value) if (p := _type_problem(v, args[0], f"{where}[{i}]"))), None)
    if origin is dict:
        if not isinstance(value, dict):
            return f"{where} is not a mapping"
        return next((p for k, v in value.items() if (p := _type_problem(k, args[0], f"{where} key")
                                                     or _type_problem(v, args[1], f"{where}.{k}"))), None)
    if isinstance(hint, type) and is_dataclass(hint):
        if not isinstance(value, hint):
            return f"{where} is not a {hint.__name__}"
        try:
            hints = typing.get_type_hints(hint)
        except (NameError, TypeError):
            return None
        for f in fields(hint):
            v = getattr(value, f.name)
            if f.name == "t" and not (isinstance(v, (int, float)) and 0 <= v <= MAX_EPOCH_S):
                return f"{where}.t is not a time"
            problem = _type_problem(v, hints[f.name], f"{where}.{f.name}")
            if problem:
                return problem
        return None
    if hint is type(None):
        return None if value is None else f"{where} is not null"
    if hint is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif hint is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif isinstance(hint, type) and origin is None:
        ok = isinstance(value, hint)
    else:
        return None
    return None if ok else f"{where} is not {'a number' if hint in (int, float) else hint.__name__}"
