"""NAS/HPO campaigns: many malleable trials from one spec.

A spec (YAML)::

    name: digits-hpo
    kind: hpo                      # hpo | nas (a label: both sample `space`)
    command: [python, digits_train.py]   # each trial runs COMMAND --params P --ckpt D
    dir: runs/digits-hpo           # campaign state and one folder per trial
    search: random                 # random (seeded, `trials` samples) | grid (every combination)
    trials: 6
    seed: 0
    metric: val_acc                # read from <trial>/ckpt/result.json
    goal: max                      # max | min
    space:                         # a list: choose one; {uniform|log_uniform|int_uniform: [lo, hi]}
      lr: {log_uniform: [0.01, 0.3]}
      momentum: [0.0, 0.9]
    fixed: {steps: 300}            # the same for every trial
    job: {min_nodes: 1, max_nodes: 4, gpus_per_node: 0, grace_s: 30, rescale_up_s: 30,
          rescale_down_s: 20, time: null, launch: srun}

Relative paths in ``command`` and ``dir`` are relative to the spec file.
``submit`` is idempotent: ``<dir>/campaign.json`` records every trial's token
and job id as soon as it has one, so running it again submits only what is
missing and never duplicates a trial.
"""
from __future__ import annotations

import itertools
import json
import math
import os
import random
from dataclasses import dataclass, field
from typing import TypeGuard

from malletrain.domain.config import read_yaml, reject_unknown
from malletrain.domain.errors import InputError
from malletrain.domain.model import LAUNCHES, MAX_GPUS_PER_NODE, MAX_GRACE_S, MAX_JOB_NODES, MAX_PAUSE_S
from malletrain.domain.safefile import write_atomic
from malletrain.domain.text import clipped, shown
from malletrain.domain.timeutil import is_slurm_time

TOP_KEYS = ("name", "kind", "command", "dir", "search", "trials", "seed", "metric", "goal",
            "space", "fixed", "job")
JOB_KEYS = ("min_nodes", "max_nodes", "gpus_per_node", "grace_s", "rescale_up_s",
            "rescale_down_s", "time", "launch", "profile")
DISTS = ("uniform", "log_uniform", "int_uniform")
MAX_TRIALS = 10_000         # a campaign of more trials is refused before anything is sampled
MAX_BOUND = 1e15            # |lo|, |hi| of a distribution (beyond, floats lose all precision)
# the ranges `malletrain submit` accepts (the same bounds: malletrain.domain.model)
JOB_RANGES = {"min_nodes": (1, MAX_JOB_NODES), "max_nodes": (1, MAX_JOB_NODES),
              "gpus_per_node": (0, MAX_GPUS_PER_NODE), "grace_s": (0, MAX_GRACE_S),
              "rescale_up_s": (0, MAX_PAUSE_S), "rescale_down_s": (0, MAX_PAUSE_S)}


@dataclass(frozen=True)
class Spec:
    path: str
    name: str
    kind: str
    command: tuple[str, ...]
    dir: str
    search: str
    trials: int
    seed: int
    metric: str
    goal: str
    space: dict
    fixed: dict
    job: dict = field(default_factory=dict)


def load_spec(path: str) -> Spec:
    raw = read_yaml(path, what="campaign spec")
    if not isinstance(raw, dict):
        raise InputError("a campaign spec is a mapping (name, command, space, ...)", path=path)
    reject_unknown(raw, TOP_KEYS, path, within="the spec")
    base = os.path.dirname(os.path.abspath(path))

    def need(key, kind):
        if key not in raw:
            raise InputError("missing", path=path, field=key)
        if not isinstance(raw[key], kind):
            raise InputError(f"must be {kind.__name__ if isinstance(kind, type) else 'valid'}",
                             path=path, field=key)
        return raw[key]

    command = need("command", list)
    if not command or not all(isinstance(c, (str, int, float)) for c in command):
        raise InputError("must be a non-empty list of strings", path=path, field="command")
    command = [str(c) for c in command]
    command = [os.path.join(base, c) if c.endswith(".py") and not os.path.isabs(c) else c
               for c in command]
    space = need("space", dict)
    for key, dom in space.items():
        _domain(dom, path, f"space.{key}")
    fixed = raw.get("fixed") or {}
    if not isinstance(fixed, dict):
        raise InputError("must be a mapping", path=path, field="fixed")
    for key, value in fixed.items():
        _finite(value, path, f"fixed.{key}")
    job = raw.get("job") or {}
    if not isinstance(job, dict):
        raise InputError("must be a mapping", path=path, field="job")
    reject_unknown(job, JOB_KEYS, path, within="job")
    _check_job(job, path)
    search = raw.get("search", "random")
    if search not in ("random", "grid"):
        raise InputError("must be random or grid", path=path, field="search")
    if search == "grid":
        for key, dom in space.items():
            if not isinstance(dom, list):
                raise InputError("grid search needs a list of values", path=path, field=f"space.{key}")
    kind, goal = raw.get("kind", "hpo"), raw.get("goal", "max")
    if kind not in ("hpo", "nas"):
        raise InputError("must be hpo or nas", path=path, field="kind")
    if goal not in ("max", "min"):
        raise InputError("must be max or min", path=path, field="goal")
    trials = raw.get("trials", 0 if search == "grid" else None)
    if not _is_int(trials) or trials < (1 if search == "random" else 0):
        want = "random search needs trials >= 1" if search == "random" else \
            "must be an integer >= 0 (0: every combination)"
        raise InputError(f"{want}, got {clipped(trials)}", path=path, field="trials")
    if trials > MAX_TRIALS:
        raise InputError(f"at most {MAX_TRIALS} trials per campaign, got {clipped(trials)}", path=path,
                         field="trials")
    if search == "grid":      # counted, never enumerated
        combos = math.prod(len(dom) for dom in space.values())
        if min(combos, trials or combos) > MAX_TRIALS:
            count = f"{combos:,}" if combos < 10**15 else f"about 1e{math.floor(math.log10(combos))}"
            raise InputError(f"the grid has {count} combinations, more than {MAX_TRIALS} trials; "
                             "shrink the space or cap it with trials", path=path, field="space")
    seed = raw.get("seed", 0)
    if not _is_int(seed) or not 0 <= seed < 2**64:
        raise InputError(f"must be an integer in [0, 2**64), got {clipped(seed)}", path=path, field="seed")
    lo, hi = job.get("min_nodes", 1), job.get("max_nodes", 4)
    if not (isinstance(lo, int) and isinstance(hi, int) and 1 <= lo <= hi):
        raise InputError(f"need 1 <= min_nodes <= max_nodes, got {clipped(lo)} and {clipped(hi)}",
                         path=path, field="job")
    name = str(need("name", str))
    return Spec(path=os.path.abspath(path), name=name, kind=kind, command=tuple(command),
                dir=os.path.normpath(os.path.join(base, str(raw.get("dir", f"runs/{name}")))), search=search,
                trials=trials, seed=seed,
                metric=str(raw.get("metric", "val_acc")), goal=goal, space=space, fixed=fixed,
                job=job)


def _is_int(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _domain(dom, path: str, where: str) -> None:
    if isinstance(dom, list):
        if not dom:
            raise InputError("empty list of choices", path=path, field=where)
        _finite(dom, path, where)
        return
    if isinstance(dom, dict) and len(dom) == 1:
        (dist, bounds), = dom.items()
        if dist in DISTS and isinstance(bounds, list) and len(bounds) == 2 \
                and all(isinstance(b, (int, float)) and not isinstance(b, bool) and abs(b) <= MAX_BOUND
                        for b in bounds) and bounds[0] <= bounds[1] \
                and (dist != "log_uniform" or bounds[0] > 0):
            return
    raise InputError(f"expected a list of choices or one of {{{'|'.join(DISTS)}: [lo, hi]}} with finite "
                     f"|lo|, |hi| <= {MAX_BOUND:g} (log_uniform needs lo > 0), got {clipped(dom)}",
                     path=path, field=where)


def _finite(value, path: str, where: str) -> None:
    """No NaN or ±inf anywhere in a parameter value (JSON has no such numbers)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise InputError(f"not a finite number: {value!r}", path=path, field=where)
    if isinstance(value, list):
        for v in value:
            _finite(v, path, where)
    elif isinstance(value, dict):
        for v in value.values():
            _finite(v, path, where)


def _check_job(job: dict, path: str) -> None:
    """The trial jobs' values, checked as `malletrain submit` checks its flags."""
    for key, (lo, hi) in JOB_RANGES.items():
        if key not in job:
            continue
        v = job[key]
        integer = key in ("min_nodes", "max_nodes", "gpus_per_node")
        if isinstance(v, bool) or not isinstance(v, int if integer else (int, float)) or not lo <= v <= hi:
            raise InputError(f"must be {'an integer' if integer else 'a number'} in [{lo:g}, {hi:g}], "
                             f"got {clipped(v)}", path=path, field=f"job.{key}")
    if job.get("launch", "srun") not in LAUNCHES:
        raise InputError(f"must be one of {', '.join(LAUNCHES)}, got {clipped(job['launch'])}", path=path,
                         field="job.launch")
    t = job.get("time")
    if t is not None and not (isinstance(t, str) and is_slurm_time(t)):
        hint = " (YAML reads an unquoted 4:00:00 as a number: quote it)" if isinstance(t, int) else ""
        raise InputError(f"must be a Slurm time limit such as '4:00:00' or null, got {clipped(t)}{hint}",
                         path=path, field="job.time")
    if not isinstance(job.get("profile", ""), str):
        raise InputError("must be a string", path=path, field="job.profile")


def sample(spec: Spec) -> list[dict]:
    """The trials' parameters: a pure function of the spec (grid order or the seeded sampler)."""
    keys = sorted(spec.space)
    if spec.search == "grid":
        grid = itertools.product(*(spec.space[k] for k in keys))
        combos = [dict(zip(keys, vals)) for vals in itertools.islice(grid, spec.trials or None)]
    else:
        rng = random.Random(spec.seed)
        combos = [{k: _draw(rng, spec.space[k]) for k in keys} for _ in range(spec.trials)]
    return [{**spec.fixed, **c} for c in combos]


def _draw(rng: random.Random, dom):
    if isinstance(dom, list):
        return dom[rng.randrange(len(dom))]
    (dist, (lo, hi)), = dom.items()
    if dist == "uniform":
        return round(rng.uniform(lo, hi), 6)
    if dist == "log_uniform":
        return float(f"{math.exp(rng.uniform(math.log(lo), math.log(hi))):.6g}")
    return rng.randint(int(lo), int(hi))


# ---- campaign state (<dir>/campaign.json) ---------------------------------------------
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


def submit_campaign(spec: Spec, submit_one, token_of, *, queued: set[str] | None = None,
                    find_token=None, say=lambda msg: None) -> list[dict]:
    """Submit every trial that has no job, or whose job is gone without a final result.

    ``submit_one(name, command, token) -> job id``.  ``queued`` holds the ids of
    the jobs Slurm still has (None: unknown, nothing is resubmitted).  A trial's
    token is on disk before its sbatch; a trial marked ``submitting`` (a run that
    died between sbatch and saving the id) is first looked up by its token with
    ``find_token(token) -> job id | None``, so running this again never submits a
    trial twice.  A trial whose job left the queue without a final result gets a
    new token and is submitted again (``resubmits`` counts it).
    """
    st = load_state(spec)
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


# ---- status ---------------------------------------------------------------------------
def last_record(path: str, max_bytes: int = 65536) -> dict | None:
    """The last well-formed JSON line of a progress file (None when there is none)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            tail = fh.read()
    except OSError:
        return None
    for raw in reversed(tail.splitlines()):
        try:
            rec = json.loads(raw)
        except ValueError:
            continue
        if isinstance(rec, dict):
            return rec
    return None


def read_result(spec: Spec, trial: dict) -> dict | None:
    path = os.path.join(spec.dir, trial["id"], "ckpt", "result.json")
    try:
        with open(path, encoding="utf-8") as fh:
            res = json.load(fh)
    except (OSError, ValueError):
        return None
    return res if isinstance(res, dict) else None


def status_rows(spec: Spec, trials: list[dict], slurm_states: dict[str, tuple[str, int]],
                metrics_dir: str) -> list[dict]:
    rows = []
    for t in trials:
        job = t.get("job")
        rec = last_record(os.path.join(metrics_dir, f"{job}.jsonl")) if job else None
        res = read_result(spec, t)
        state, nodes = slurm_states.get(str(job), (None, 0))
        if state is None:
            state = "not submitted" if not job else ("done" if res and res.get("final") else "gone")
        value = res.get(spec.metric) if res else None
        rows.append({"id": t["id"], "job": job, "state": state, "nodes": nodes,
                     "step": rec.get("step") if rec else None,
                     "samples": rec.get("samples") if rec else None,
                     "restarts": rec.get("restart") if rec else None,
                     "metric": value if isinstance(value, (int, float)) else None,
                     "final": bool(res and res.get("final")), "params": t["params"]})
    scored = [r for r in rows if r["metric"] is not None]
    best = (max if spec.goal == "max" else min)(scored, key=lambda r: r["metric"]) if scored else None
    for r in rows:
        r["best"] = r is best
    return rows


def format_status(spec: Spec, rows: list[dict]) -> list[str]:
    total = spec.fixed.get("steps")
    lines = [f"campaign {spec.name} ({spec.kind}, {spec.search} search, {len(rows)} trials) in {spec.dir}",
             f"{'TRIAL':<5} {'JOB':>6} {'STATE':<13} {'NODES':>5} {'STEP':>10} {'RESTARTS':>8} "
             f"{spec.metric.upper():>9}  PARAMS"]
    for r in rows:
        step = "-" if r["step"] is None else (f"{r['step']}/{total}" if total else str(r["step"]))
        metric = "-" if r["metric"] is None else f"{r['metric']:.4g}" + ("" if r["final"] else "~")
        params = " ".join(f"{k}={v}" for k, v in r["params"].items() if k not in spec.fixed)
        lines.append(f"{r['id']:<5} {r['job'] or '-':>6} {r['state']:<13} {r['nodes'] or '-':>5} "
                     f"{step:>10} {r['restarts'] if r['restarts'] is not None else '-':>8} "
                     f"{metric:>9}{' *' if r['best'] else '  '} {params}")
    best = next((r for r in rows if r["best"]), None)
    done = sum(r["state"] == "done" for r in rows)
    lines.append(f"{done}/{len(rows)} done; best so far: " +
                 (f"{best['id']} {spec.metric}={best['metric']:.4g} ({'final' if best['final'] else 'interim'})"
                  if best else "none yet") + "   (~ interim value, * best)")
    return [shown(line) for line in lines]
