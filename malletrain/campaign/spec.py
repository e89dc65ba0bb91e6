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

(This module, which ``malletrain campaign --help`` quotes, reads and checks the spec and draws the
classic search's trial parameters.)
"""
from __future__ import annotations

import itertools
import math
import os
import random
from dataclasses import dataclass, field
from typing import TypeGuard

from malletrain.domain.config import read_yaml, reject_unknown
from malletrain.domain.errors import InputError
from malletrain.domain.model import LAUNCHES, MAX_GPUS_PER_NODE, MAX_GRACE_S, MAX_JOB_NODES, MAX_PAUSE_S
from malletrain.domain.text import clipped
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
