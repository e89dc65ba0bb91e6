"""NAS/HPO campaigns: many malleable trials from one spec.

A spec (YAML)::

    name: digits-hpo
    kind: hpo                      # hpo | nas (a label: both sample `space`)
    command: [python, digits_train.py]   # each trial runs COMMAND --params P --ckpt D
    dir: runs/digits-hpo           # campaign state and one folder per trial
    sampler: tpe                   # an Optuna study: random | grid | tpe | cmaes | nsga2 (below)
    trials: 6                      # the study's trial count (failed and pruned trials count)
    max_concurrent: 3              # trial jobs queued or running at once
    retries: 2                     # a trial job that fails is started again this often, then failed
    seed: 0
    metric: val_acc                # read from <trial>/ckpt/result.json; nsga2: a list, e.g.
    goal: max                      #   metric: [val_acc, params] and goal: [max, min]
    pruner: asha                   # none | asha | hyperband | median, or a mapping:
                                   #   {kind: asha, min_resource: 60, max_resource: 300,
                                   #    reduction_factor: 3}
    step_unit: steps               # what a reported step counts: steps (global: the same batch
                                   #   at any node count), samples or epochs
    space:                         # a list: choose one; {uniform|log_uniform|int_uniform: [lo, hi]}
      lr: {log_uniform: [0.01, 0.3]}
      momentum: [0.0, 0.9]
    fixed: {steps: 300}            # the same for every trial
    job: {min_nodes: 1, max_nodes: 4, gpus_per_node: 0, grace_s: 30, rescale_up_s: 30,
          rescale_down_s: 20, time: null, launch: srun, elastic: false}
                                   # elastic: every trial job is an elastic group (issue #26):
                                   #   one 1-node member per node, rescaled in place; its
                                   #   script runs the Runtime elastic (from_env does that)

Relative paths in ``command`` and ``dir`` are relative to the spec file.

**With ``sampler``** the campaign is an Optuna study (the ``hpo`` extra) in
``<dir>/study.journal`` (``optuna-dashboard <dir>/study.journal`` shows it).
``submit`` queues ``max_concurrent`` trial jobs; each asks the study for its
parameters when it starts (later trials learn from earlier ones), reports its
validation metric through the runtime (``Runtime.report``), stops at the next
step when the pruner says so, and when it ends queues the next trial job: no process of
yours stays on the login node.  ``status`` shows each trial's rung, pruned,
failed or done and the best so far (and does what an ended job could not).

**With ``search``** (random: seeded, ``trials`` samples | grid: every
combination; no Optuna) every trial's parameters are drawn at submit time and
all trials are queued at once.

``submit`` is idempotent: ``<dir>/campaign.json`` records every trial job's
token and id as soon as it has one, so running it again submits only what is
missing and never duplicates a trial.

(This module, which ``malletrain campaign --help`` quotes, reads and checks the spec and draws the
classic search's trial parameters.)
"""
from __future__ import annotations

import itertools
import math
import os
import random
import re
from dataclasses import dataclass, field
from typing import TypeGuard

from malletrain.domain.config import read_yaml, reject_unknown
from malletrain.domain.errors import InputError
from malletrain.domain.model import LAUNCHES, MAX_GPUS_PER_NODE, MAX_GRACE_S, MAX_JOB_NODES, MAX_MEMBERS, MAX_PAUSE_S
from malletrain.domain.text import clipped
from malletrain.domain.timeutil import is_slurm_time

TOP_KEYS = ("name", "kind", "command", "dir", "search", "sampler", "trials", "seed", "metric", "goal",
            "space", "fixed", "job", "pruner", "step_unit", "max_concurrent", "retries")
SAMPLERS = ("random", "grid", "tpe", "cmaes", "nsga2")     # malletrain.campaign.study builds them
PRUNERS = ("none", "asha", "hyperband", "median")
PRUNER_KEYS = ("kind", "min_resource", "max_resource", "reduction_factor")
STEP_UNITS = ("steps", "samples", "epochs")
MAX_CONCURRENT = 1000
MAX_RETRIES = 100
MAX_RESOURCE = 10**15
JOB_KEYS = ("min_nodes", "max_nodes", "gpus_per_node", "grace_s", "rescale_up_s",
            "rescale_down_s", "time", "launch", "profile", "elastic")
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
    search: str                 # the classic search (random | grid), or "study" with a sampler
    trials: int
    seed: int
    metric: str                 # the first objective (the only one but for nsga2)
    goal: str
    space: dict
    fixed: dict
    job: dict = field(default_factory=dict)
    sampler: str = ""           # "": the classic search; else an Optuna study's sampler
    metrics: tuple[str, ...] = ()
    goals: tuple[str, ...] = ()
    pruner: str = "none"
    min_resource: int = 1
    max_resource: int | None = None
    reduction_factor: int = 3
    step_unit: str = "steps"
    max_concurrent: int = 4
    retries: int = 2

    @property
    def study(self) -> bool:
        """An Optuna study (``sampler``), not the classic search."""
        return bool(self.sampler)


def _spec_loader():
    """PyYAML's SafeLoader that also reads ``1e-4`` as a number (YAML 1.2 does; PyYAML's 1.1
    rules need a dot, ``1.0e-4``, and make ``lr: [1e-4, 1e-2]`` two strings)."""
    import yaml

    class SpecLoader(yaml.SafeLoader):
        pass
    SpecLoader.add_implicit_resolver("tag:yaml.org,2002:float",
                                     re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
                                     list("-+0123456789"))
    return SpecLoader


def load_spec(path: str) -> Spec:
    raw = read_yaml(path, what="campaign spec", loader=_spec_loader())
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
    if "search" in raw and "sampler" in raw:
        raise InputError("give sampler (an Optuna study) or search (the classic one), not both", path=path,
                         field="sampler")
    sampler = raw.get("sampler", "")
    if "sampler" in raw and sampler not in SAMPLERS:
        raise InputError(f"must be one of {', '.join(SAMPLERS)}, got {clipped(sampler)}", path=path,
                         field="sampler")
    search = "study" if sampler else raw.get("search", "random")
    if search not in ("random", "grid", "study"):
        raise InputError("must be random or grid", path=path, field="search")
    if not sampler:
        for key in ("pruner", "step_unit", "max_concurrent", "retries"):
            if key in raw:
                raise InputError("needs an Optuna study: give sampler (random, grid, tpe, cmaes, nsga2) "
                                 "instead of search", path=path, field=key)
    if search == "grid" or sampler == "grid":
        for key, dom in space.items():
            if not isinstance(dom, list):
                raise InputError("grid search needs a list of values", path=path, field=f"space.{key}")
    kind = raw.get("kind", "hpo")
    if kind not in ("hpo", "nas"):
        raise InputError("must be hpo or nas", path=path, field="kind")
    metrics, goals = _objectives(raw, path, sampler)
    grid = search == "grid" or sampler == "grid"
    trials = raw.get("trials", 0 if grid else None)
    if not _is_int(trials) or trials < (0 if grid else 1):
        want = "must be an integer >= 0 (0: every combination)" if grid else \
            f"{'random search' if search == 'random' else 'a study'} needs trials >= 1"
        raise InputError(f"{want}, got {clipped(trials)}", path=path, field="trials")
    if trials > MAX_TRIALS:
        raise InputError(f"at most {MAX_TRIALS} trials per campaign, got {clipped(trials)}", path=path,
                         field="trials")
    if grid:      # counted, never enumerated
        combos = math.prod(len(dom) for dom in space.values())
        if min(combos, trials or combos) > MAX_TRIALS:
            count = f"{combos:,}" if combos < 10**15 else f"about 1e{math.floor(math.log10(combos))}"
            raise InputError(f"the grid has {count} combinations, more than {MAX_TRIALS} trials; "
                             "shrink the space or cap it with trials", path=path, field="space")
        if sampler:
            trials = min(combos, trials or combos)
    extra = _study_fields(raw, path) if sampler else {}
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
                trials=trials, seed=seed, metric=metrics[0], goal=goals[0], space=space, fixed=fixed,
                job=job, sampler=sampler, metrics=metrics, goals=goals, **extra)


def _objectives(raw: dict, path: str, sampler: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(metrics, goals): one each, or (nsga2) several of each, paired."""
    metric, goal = raw.get("metric", "val_acc"), raw.get("goal", "max")
    metrics = tuple(metric) if isinstance(metric, list) else (metric,)
    goals = tuple(goal) if isinstance(goal, list) else (goal,) * len(metrics)
    if not metrics or not all(isinstance(m, str) and m and len(m) <= 64 and m.isprintable() for m in metrics):
        raise InputError(f"must be a result field name (or, for nsga2, a list of them), got {clipped(metric)}",
                         path=path, field="metric")
    if len(goals) != len(metrics) or not all(g in ("max", "min") for g in goals):
        raise InputError(f"must be max or min (for several metrics: a list of as many), got {clipped(goal)}",
                         path=path, field="goal")
    if (len(metrics) > 1) != (sampler == "nsga2"):
        raise InputError("several objectives need sampler nsga2, and nsga2 needs several (e.g. "
                         "metric: [val_acc, params], goal: [max, min])", path=path, field="metric")
    return metrics, goals


def _study_fields(raw: dict, path: str) -> dict:
    """The study's own fields: pruner (a name or a mapping), step_unit, max_concurrent, retries."""
    out: dict = {}
    pruner = raw.get("pruner", "none")
    if isinstance(pruner, dict):
        reject_unknown(pruner, PRUNER_KEYS, path, within="pruner")
        kind = pruner.get("kind", "asha")
        for key in ("min_resource", "max_resource", "reduction_factor"):
            if key in pruner:
                v = pruner[key]
                lo = 2 if key == "reduction_factor" else 1
                if not _is_int(v) or not lo <= v <= MAX_RESOURCE:
                    raise InputError(f"must be an integer in [{lo}, {MAX_RESOURCE:g}], got {clipped(v)}",
                                     path=path, field=f"pruner.{key}")
                out[key] = v
        if out.get("max_resource") is not None and out["max_resource"] < out.get("min_resource", 1):
            raise InputError("must be at least min_resource", path=path, field="pruner.max_resource")
    else:
        kind = pruner
    if kind not in PRUNERS:
        raise InputError(f"must be one of {', '.join(PRUNERS)} (or a mapping with kind), got {clipped(kind)}",
                         path=path, field="pruner")
    out["pruner"] = kind
    unit = raw.get("step_unit", "steps")
    if unit not in STEP_UNITS:
        raise InputError(f"must be one of {', '.join(STEP_UNITS)} (never per-rank batches: a step must "
                         f"mean the same at any node count), got {clipped(unit)}", path=path, field="step_unit")
    out["step_unit"] = unit
    for key, hi, default in (("max_concurrent", MAX_CONCURRENT, 4), ("retries", MAX_RETRIES, 2)):
        v = raw.get(key, default)
        lo = 1 if key == "max_concurrent" else 0
        if not _is_int(v) or not lo <= v <= hi:
            raise InputError(f"must be an integer in [{lo}, {hi}], got {clipped(v)}", path=path, field=key)
        out[key] = v
    return out


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
    if not isinstance(job.get("elastic", False), bool):
        raise InputError(f"must be true or false, got {clipped(job['elastic'])}", path=path, field="job.elastic")
    if job.get("elastic") and job.get("launch") == "torchrun":
        raise InputError("an elastic group runs one process per node (each member re-forms the group "
                         "itself): use launch srun or batch", path=path, field="job.launch")
    if job.get("elastic") and job.get("max_nodes", 4) > MAX_MEMBERS:
        raise InputError(f"an elastic group has at most {MAX_MEMBERS} members (one per node)", path=path,
                         field="job.max_nodes")


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
