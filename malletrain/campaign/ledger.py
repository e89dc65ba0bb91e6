"""The campaign's ledger, ``<dir>/campaign.json``: every trial's token and job, written before and
after each sbatch so that submitting again never duplicates a trial."""
from __future__ import annotations

import json
import os
from collections.abc import Callable

from malletrain.campaign.spec import Spec, sample
from malletrain.campaign.status import read_result
from malletrain.domain.errors import InputError
from malletrain.domain.safefile import write_atomic


def state_path(spec: Spec) -> str:
    return os.path.join(spec.dir, "campaign.json")


def load_state(spec: Spec) -> dict:
    try:
        with open(state_path(spec), encoding="utf-8") as fh:
            st = json.load(fh)
    except FileNotFoundError:
        return {"name": spec.name, "trials": []}
    except (OSError, ValueError, RecursionError) as exc:   # also not UTF-8, not JSON, nested too deeply
        raise InputError(f"cannot read campaign state: {str(exc)[:200]}", path=state_path(spec)) from None
    trials = st.get("trials") if isinstance(st, dict) else None
    if not isinstance(trials, list) or not all(
            isinstance(t, dict) and isinstance(t.get("id"), str) and isinstance(t.get("params"), dict)
            and isinstance(t.get("token"), str) and (t.get("job") is None or isinstance(t.get("job"), (str, int)))
            for t in trials):
        raise InputError("not a campaign state file (expected {\"trials\": [{\"id\", \"params\", \"token\", "
                         "\"job\"}, ...]}); move it away to start afresh", path=state_path(spec))
    return st


def save_state(spec: Spec, st: dict) -> None:
    """Replace ``campaign.json`` atomically: a new private file of random name (``O_EXCL``,
    never through a symlink a teammate planted), renamed over it."""
    os.makedirs(spec.dir, exist_ok=True)
    write_atomic(state_path(spec), json.dumps(st, indent=1).encode(), 0o600)


def plan_trials(spec: Spec, st: dict, token_of) -> list[dict]:
    """Trial records, reusing the recorded ones; ``token_of(i)`` makes new tokens."""
    params = sample(spec)
    have = {t["id"]: t for t in st.get("trials", [])}
    out = []
    for i, p in enumerate(params):
        tid = f"t{i:03d}"
        old = have.get(tid)
        if old is not None and old["params"] != p:
            raise InputError(f"trial {tid} was submitted with {old['params']} but the spec now "
                             f"gives {p}; use a new dir for a changed campaign", path=spec.path)
        out.append(old or {"id": tid, "params": p, "token": token_of(i), "job": None})
    return out


def trial_command(spec: Spec, trial: dict) -> list[str]:
    d = os.path.join(spec.dir, trial["id"])
    return [*spec.command, "--params", os.path.join(d, "params.json"), "--ckpt", os.path.join(d, "ckpt")]


def submit_campaign(spec: Spec, submit_one, token_of, *,
                    queued: set[str] | Callable[[], set[str] | None] | None = None,
                    find_token=None, say=lambda msg: None) -> list[dict]:
    """Submit every trial that has no job, or whose job is gone without a final result.

    ``submit_one(name, command, token) -> job id``.  ``queued`` holds the ids of
    the jobs Slurm still has (None: unknown, nothing is resubmitted), or lists them when called:
    after the state is read, so that a job another submit queued before is among them (the
    caller holds the campaign's lock).  A trial's
    token is on disk before its sbatch; a trial marked ``submitting`` (a run that
    died between sbatch and saving the id) is first looked up by its token with
    ``find_token(token) -> job id | None``, so running this again never submits a
    trial twice.  A trial whose job left the queue without a final result gets a
    new token and is submitted again (``resubmits`` counts it).
    """
    st = load_state(spec)
    if callable(queued):
        queued = queued()
    trials = plan_trials(spec, st, token_of)
    st.update(name=spec.name, kind=spec.kind, trials=trials)
    save_state(spec, st)      # tokens are on disk before any sbatch: a retry finds the job
    for i, t in enumerate(trials):
        if t["job"] and queued is not None and str(t["job"]) not in queued and not _final(spec, t):
            say(f"{spec.name}-{t['id']}: job {t['job']} left the queue without a final result; resubmitting")
            t.update(job=None, token=token_of(i), resubmits=t.get("resubmits", 0) + 1, submitting=False)
            save_state(spec, st)
        if t["job"]:
            continue
        if t.get("submitting") and find_token is not None:
            found = find_token(t["token"])
            if found:
                t.update(job=found, submitting=False)
                save_state(spec, st)
                continue
        d = os.path.join(spec.dir, t["id"])
        os.makedirs(d, mode=0o700, exist_ok=True)
        write_atomic(os.path.join(d, "params.json"), json.dumps(t["params"]).encode(), 0o600)
        t["submitting"] = True
        save_state(spec, st)
        t["job"] = submit_one(f"{spec.name}-{t['id']}", trial_command(spec, t), t["token"])
        t["submitting"] = False
        save_state(spec, st)
    return trials


def _final(spec: Spec, trial: dict) -> bool:
    res = read_result(spec, trial)
    return bool(res and res.get("final"))
