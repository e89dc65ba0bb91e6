"""A study campaign's trial jobs ("slots"), bound to Optuna trials when they start, and the
reconciliation that keeps the campaign going (``tick``).  Everything here runs under the
campaign's lock.

A study campaign (a spec with ``sampler``) keeps, in ``<dir>/campaign.json``, one record per
trial job — a *slot*::

    {"id": "s003", "token": "…", "job": "417", "submitting": false, "trial": 5,
     "failures": 0, "end": null}

* A slot is made (its token on disk) before its ``sbatch``; ``submitting`` is set around the call,
  so a run killed in between finds the job by its token (``find_token``) instead of submitting
  it again.
* A slot's job asks the study for its trial when it first starts (:func:`bind`); ``trial`` is the
  Optuna trial number, kept for the job's whole life: a requeued, rescaled or preempted job gets
  the same trial and parameters back.  The trial's files live in ``<dir>/t<number>/``.
* ``end``: ``done``, ``pruned``, ``failed`` (the trial is closed in the study) or ``void`` (the
  job left Slurm before it asked for a trial: it consumed none).

The trial cap: at most ``trials`` slots that are not ``void`` ever exist, and a slot binds at most
one trial, so the study never gets more than ``trials`` trials from a campaign, whatever was
killed where.  A bind killed between Optuna's ask and the ledger's write leaves a RUNNING trial
no slot names; as every bind holds the lock, the next bind finds such a trial and closes it as
failed (it never ran).

``campaign.lock`` is a POSIX record lock (``lockf``, also honoured over NFS): the kernel drops it
with its holder, so a process killed while it holds it blocks nobody.
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import math
import os
from collections.abc import Callable, Iterator
from typing import Any

from malletrain.campaign.spec import Spec
from malletrain.domain.errors import InputError
from malletrain.domain.safefile import write_atomic

LEDGER = "campaign.json"
FROZEN = "spec.json"
LOCK = "campaign.lock"
ENDS = ("done", "pruned", "failed", "void")
END_OF = {"complete": "done", "pruned": "pruned", "failed": "failed"}   # a closed trial's state -> its slot's end


# ---- files -------------------------------------------------------------------------------------
def ledger_path(directory: str) -> str:
    return os.path.join(directory, LEDGER)


def trial_dir(directory: str, number: int) -> str:
    return os.path.join(directory, f"t{number:03d}")


@contextlib.contextmanager
def locked(directory: str) -> Iterator[None]:
    """The campaign's lock (see the module docstring)."""
    fd = os.open(os.path.join(directory, LOCK), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)        # releases the lock


def freeze(spec: Spec) -> None:
    """Keep the spec the campaign was started with in ``<dir>/spec.json`` (every trial job reads
    it, so all build the same sampler and pruner); a later ``submit`` of a spec that differs is
    refused."""
    path = os.path.join(spec.dir, FROZEN)
    mine = _record(spec)
    try:
        with open(path, encoding="utf-8") as fh:
            old = json.load(fh)
    except FileNotFoundError:
        write_atomic(path, json.dumps(mine, indent=1).encode(), 0o600)
        return
    except (OSError, ValueError, RecursionError) as exc:
        raise InputError(f"cannot read the campaign's spec: {str(exc)[:200]}", path=path) from None
    keep = {k: v for k, v in old.items() if k != "path"} if isinstance(old, dict) else None
    if keep != {k: v for k, v in mine.items() if k != "path"}:
        raise InputError("the campaign in this dir was started from a different spec; use a new dir "
                         "for a changed campaign", path=spec.path)


def thawed(directory: str) -> Spec:
    """The spec a campaign was started with (what its trial jobs run by)."""
    path = os.path.join(directory, FROZEN)
    try:
        with open(path, encoding="utf-8") as fh:
            raw = json.load(fh)
        fields = {f.name for f in dataclasses.fields(Spec)}
        if not isinstance(raw, dict) or set(raw) != fields:
            raise ValueError("not a campaign spec record")
        for key in ("command", "metrics", "goals"):
            raw[key] = tuple(raw[key])
        return Spec(**raw)
    except (OSError, ValueError, TypeError, RecursionError) as exc:
        raise InputError(f"cannot read the campaign's spec: {str(exc)[:200]}", path=path) from None


def _record(spec: Spec) -> dict:
    return json.loads(json.dumps(dataclasses.asdict(spec)))


def load_ledger(directory: str) -> dict:
    path = ledger_path(directory)
    try:
        with open(path, encoding="utf-8") as fh:
            led = json.load(fh)
    except FileNotFoundError:
        return {"format": 2, "slots": []}
    except (OSError, ValueError, RecursionError) as exc:
        raise InputError(f"cannot read campaign state: {str(exc)[:200]}", path=path) from None
    slots = led.get("slots") if isinstance(led, dict) and led.get("format") == 2 else None
    if not isinstance(slots, list) or not all(_slot_ok(s) for s in slots):
        raise InputError("not a study campaign's state file (expected {\"format\": 2, \"slots\": [...]}); "
                         "move it away to start afresh", path=path)
    return led


def _slot_ok(s: Any) -> bool:
    return (isinstance(s, dict) and isinstance(s.get("id"), str) and isinstance(s.get("token"), str)
            and (s.get("job") is None or isinstance(s.get("job"), str))
            and (s.get("trial") is None or type(s.get("trial")) is int)
            and type(s.get("failures", 0)) is int and s.get("end") in (None, *ENDS)
            and isinstance(s.get("failing", []), list))


def save_ledger(directory: str, led: dict) -> None:
    write_atomic(ledger_path(directory), json.dumps(led, indent=1).encode(), 0o600)


def _slot(directory: str, led: dict, slot_id: str) -> dict:
    for s in led["slots"]:
        if s["id"] == slot_id:
            return s
    raise InputError(f"no trial job {slot_id!r} in this campaign", path=ledger_path(directory))


# ---- a trial job starts: its trial -------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Bound:
    number: int
    params: dict
    state: str              # the trial's state in the study: running, or closed (complete, pruned, failed)
    params_path: str
    ckpt_dir: str


def bind(spec: Spec, slot_id: str, study) -> Bound:
    """The slot's trial: the one it was given, or (first start) a new one asked now."""
    with locked(spec.dir):
        led = load_ledger(spec.dir)
        slot = _slot(spec.dir, led, slot_id)
        views = {t.number: t for t in study.trials()}
        if slot["trial"] is None:
            if slot["end"] is not None:
                raise InputError(f"trial job {slot_id} ended ({slot['end']}) before it started")
            bound = {s["trial"] for s in led["slots"] if s["trial"] is not None}
            for n, t in views.items():       # asked by a bind that died before it wrote the ledger:
                if t.state == "running" and n not in bound:     # it never ran; its parameters are
                    study.retry(n)                                # asked again (a grid point is not lost)
            asked = study.ask()
            d = trial_dir(spec.dir, asked.number)
            os.makedirs(d, mode=0o700, exist_ok=True)
            write_atomic(os.path.join(d, "params.json"), json.dumps(asked.params).encode(), 0o600)
            slot["trial"] = asked.number
            save_ledger(spec.dir, led)
            number, params, state = asked.number, asked.params, "running"
        else:
            number = slot["trial"]
            view = views.get(number)
            if view is None:
                raise InputError(f"trial {number} of {slot_id} is not in the study", path=ledger_path(spec.dir))
            params, state = {**spec.fixed, **view.params}, view.state
        d = trial_dir(spec.dir, number)
        return Bound(number, params, state, os.path.join(d, "params.json"), os.path.join(d, "ckpt"))


# ---- a trial job ended ---------------------------------------------------------------------------
def read_values(spec: Spec, number: int) -> tuple[list[float] | None, bool]:
    """(the objectives from ``t<n>/ckpt/result.json``, whether it is final)."""
    path = os.path.join(trial_dir(spec.dir, number), "ckpt", "result.json")
    try:
        with open(path, encoding="utf-8") as fh:
            res = json.loads(fh.read(1 << 20))
    except (OSError, ValueError, RecursionError):
        return None, False
    if not isinstance(res, dict):
        return None, False
    vals: list[float] = []
    for m in spec.metrics:
        v = res.get(m)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v):
            return None, bool(res.get("final"))
        vals.append(float(v))
    return vals, bool(res.get("final"))


MAX_FAILING = 64        # members of a group a slot remembers as ended without the trial's result


def close_out(spec: Spec, slot_id: str, study, *, rc: int, stopped: bool, member: str | None = None,
              running: frozenset[str] | None = None) -> str | None:
    """After the trial's command exited ``rc`` (``stopped``: it checkpointed on a signal, the
    job runs again): the slot's end (``done``, ``pruned``, ``failed``), or None while the trial
    goes on (stopped, or a failure within ``retries``: the job is started again).

    An elastic group's ``member`` (its task and the start of its run, ``TASK@START``) that ended
    without the trial's result is one member gone, not yet the trial's failure: the others train
    on.  It is remembered; the failure counts against ``retries`` once, when no other member of
    the group is ``running`` (its members now on nodes, each ``TASK@START``) but those remembered
    (members that ended together, as a bug ends them all, close out one after the other while
    Slurm still shows them running).  ``running`` None: Slurm could not be asked, nothing is
    counted (the daemon's safety net still bounds the group's runs)."""
    with locked(spec.dir):
        led = load_ledger(spec.dir)
        slot = _slot(spec.dir, led, slot_id)
        if slot["end"] is not None or slot["trial"] is None:
            return slot["end"]
        number = slot["trial"]
        state = {t.number: t.state for t in study.trials()}.get(number)
        end = END_OF.get(state or "")
        if end is None and not stopped:
            values, final = read_values(spec, number)
            if rc == 0 and final and values is not None:
                study.complete(number, values)
                end = "done"
            elif member is not None and not _group_failed(slot, member, running):
                pass            # one member gone: the group trains on (or its last member counts it)
            else:
                slot["failures"] = slot.get("failures", 0) + 1
                if slot["failures"] > spec.retries:
                    study.failed(number)
                    end = "failed"
        if end is not None:
            slot["end"] = end
        save_ledger(spec.dir, led)
        return end


def _group_failed(slot: dict, member: str, running: frozenset[str] | None) -> bool:
    """Whether ``member``'s end without a result ends its group's run (see :func:`close_out`)."""
    failing = [m for m in slot.get("failing", []) if isinstance(m, str) and m != member][-(MAX_FAILING - 1):]
    failing.append(member)
    if running is not None and not (running - {member} - set(failing)):
        slot["failing"] = []
        return True
    slot["failing"] = failing
    return False


# ---- keeping the campaign going ------------------------------------------------------------------
Submit = Callable[[str, list[str], str], str]           # (name, command, token) -> job id


@dataclasses.dataclass(frozen=True)
class Ticked:
    submitted: tuple[str, ...]      # slot ids submitted now
    ended: tuple[tuple[str, str], ...]   # (slot id, end) decided now
    slots: int
    live: int


def tick(spec: Spec, study, *, submit_one: Submit, slot_command: Callable[[str], list[str]],
         new_token: Callable[[], str], queued: set[str] | Callable[[], set[str] | None] | None,
         find_token: Callable[[str], str | None] | None, say: Callable[[str], None] = lambda m: None) -> Ticked:
    """Close out what ended, then queue trial jobs up to ``max_concurrent`` live ones and
    ``trials`` in all.  ``queued``: the ids of the jobs Slurm still has (None: unknown; then no
    job is judged gone), or how to list them: then they are listed under the lock, after the
    ledger is read.  A listing taken before the lock misses the jobs another process submitted
    while this one waited, and would judge them gone.  Idempotent; safe to run from any
    process at any time."""
    submitted: list[str] = []
    ended: list[tuple[str, str]] = []
    with locked(spec.dir):
        led = load_ledger(spec.dir)
        if callable(queued):
            queued = queued()
        slots = led["slots"]
        states = {t.number: t.state for t in study.trials()}
        for s in slots:
            if s["end"] is not None:
                continue
            if s.get("submitting") and find_token is not None:
                found = find_token(s["token"])
                s.update(job=found, submitting=False)
                save_ledger(spec.dir, led)
            end = END_OF.get(states.get(s["trial"], "")) if s["trial"] is not None else None
            if end is None and s["job"] and queued is not None and s["job"] not in queued:
                if s["trial"] is None:
                    end = "void"
                    say(f"trial job {s['id']} (job {s['job']}) left the queue before it started: replaced")
                else:
                    values, final = read_values(spec, s["trial"])
                    if final and values is not None:
                        study.complete(s["trial"], values)
                        end = "done"
                    else:
                        study.failed(s["trial"])
                        end = "failed"
                        say(f"trial {s['trial']} (job {s['job']}) left the queue without a final result "
                            "(cancelled?): failed")
            if end is not None:
                s["end"] = end
                ended.append((s["id"], end))
                save_ledger(spec.dir, led)
        live = [s for s in slots if s["end"] is None]
        counted = sum(s["end"] != "void" for s in slots)
        while len(live) < spec.max_concurrent and counted < spec.trials:
            s = {"id": f"s{len(slots):03d}", "token": new_token(), "job": None, "submitting": False,
                 "trial": None, "failures": 0, "end": None}
            slots.append(s)
            live.append(s)
            counted += 1
        save_ledger(spec.dir, led)      # new slots' tokens are on disk before any sbatch
        for s in live:
            if s["job"] is not None:
                continue
            s["submitting"] = True
            save_ledger(spec.dir, led)
            s["job"] = str(submit_one(f"{spec.name}-{s['id']}", slot_command(s["id"]), s["token"]))
            s["submitting"] = False
            save_ledger(spec.dir, led)
            submitted.append(s["id"])
        return Ticked(tuple(submitted), tuple(ended), len(slots), len(live))
