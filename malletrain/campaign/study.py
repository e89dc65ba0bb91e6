"""The Optuna adapter: a campaign's study in a journal file, asked and told by trial number.

The only module of malletrain that imports Optuna (one major version, 5.x: the ``hpo`` extra),
and only when a study is opened.  Everything a campaign needs from Optuna goes through
:class:`Study`; its contract is pinned by ``tests/test_campaign_study.py``.

* **Storage.** The study lives in ``<campaign dir>/study.journal``: Optuna's file journal (JSON
  lines, appended under a lock file ``study.journal.lock``; no database server, nothing for a
  shared filesystem to corrupt the way it can SQLite).  Several processes — the trial jobs, a
  ``campaign status`` — open the same file; each append is flushed and fsynced.  A process killed
  while it holds the lock leaves the lock file behind; the others break it after
  ``lock_grace_s`` (Optuna logs that it did).  ``optuna-dashboard <dir>/study.journal`` shows
  the study.
* **Sampler and pruner** are not stored in the journal: every process builds them from the spec
  (:data:`SAMPLERS`, :data:`PRUNERS`), so all agree.
* **Any process, by number.** A trial is asked once (:meth:`Study.ask`: its number and
  parameters, drawn from the spec's ``space`` syntax) and is afterwards addressed by its number
  only: :meth:`Study.report` records an intermediate value at a step and says whether the pruner
  would stop the trial; :meth:`Study.complete`, :meth:`Study.pruned`, :meth:`Study.failed` close
  it.  A report of a step already reported (a trial that resumed after a requeue and validates
  again) keeps the first value; a report or a close of a trial that is already closed changes
  nothing and says so.
* **Retries.** The file journal has no heartbeats: a trial whose process died stays RUNNING in
  Optuna.  Slurm's terminal states say what happened instead; :meth:`Study.retry` queues the
  trial's parameters and closes it as failed, so the next :meth:`Study.ask` (from any process)
  gets them again, with ``retry_of`` naming the trial it repeats.
"""
from __future__ import annotations

import math
import os
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from malletrain.domain.errors import InputError

SAMPLERS = ("random", "grid", "tpe", "cmaes", "nsga2")
PRUNERS = ("none", "asha", "hyperband", "median")
JOURNAL = "study.journal"
STATES = ("running", "waiting", "complete", "pruned", "failed")


@dataclass(frozen=True)
class StudySpec:
    """What a study is made of (from the campaign spec).

    ``directions``: ``"maximize"``/``"minimize"`` per objective (several: NSGA-II).  ``space``:
    the spec's syntax — a list (choose one) or ``{uniform|log_uniform|int_uniform: [lo, hi]}``;
    ``fixed`` is merged into every trial's parameters.  ``min_resource``/``max_resource``: the
    pruner's first rung and the full budget, in the metric's step unit (samples or epochs: the
    same at any node count); ``reduction_factor``: the rungs' ratio (η)."""

    directory: str
    name: str
    space: Mapping[str, Any]
    fixed: Mapping[str, Any] = field(default_factory=dict)
    directions: tuple[str, ...] = ("maximize",)
    sampler: str = "tpe"
    pruner: str = "none"
    seed: int = 0
    min_resource: int = 1
    max_resource: int | None = None
    reduction_factor: int = 3
    lock_grace_s: int = 30
    in_memory: bool = False     # no journal: a study that lives in this process only (campaign replay)


@dataclass(frozen=True)
class Asked:
    number: int
    params: dict
    retry_of: int | None = None


@dataclass(frozen=True)
class TrialView:
    """One trial as the journal has it."""

    number: int
    state: str                          # one of STATES
    params: dict
    values: tuple[float, ...] | None    # final values (complete), or the last reported (pruned)
    last_step: int | None               # the highest step reported
    last_value: float | None            # the value reported at it
    retry_of: int | None


def journal_path(directory: str) -> str:
    return os.path.join(directory, JOURNAL)


def open_study(spec) -> Study:
    """The study of a campaign spec with a ``sampler`` (:class:`malletrain.campaign.spec.Spec`)."""
    return Study(StudySpec(
        directory=spec.dir, name=spec.name, space=spec.space, fixed=spec.fixed,
        directions=tuple("maximize" if g == "max" else "minimize" for g in spec.goals),
        sampler=spec.sampler, pruner=spec.pruner, seed=spec.seed % 2**32, min_resource=spec.min_resource,
        max_resource=spec.max_resource, reduction_factor=spec.reduction_factor))


class Study:
    """A campaign's study (see the module docstring).  Opening creates it if needed."""

    def __init__(self, spec: StudySpec) -> None:
        try:
            import optuna
            from optuna.storages import JournalStorage
            from optuna.storages.journal import JournalFileBackend, JournalFileSymlinkLock
        except ImportError:
            raise InputError("a campaign with a sampler is an Optuna study: install the hpo extra "
                             "(pip install 'malletrain[hpo]'; scripts/env.sh dev has it), or use "
                             "search: random|grid") from None

        _check(spec)
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.spec = spec
        self._optuna = optuna
        self._storage: Any
        if spec.in_memory:
            self._storage = optuna.storages.InMemoryStorage()
        else:
            os.makedirs(spec.directory, mode=0o700, exist_ok=True)
            path = journal_path(spec.directory)
            lock = JournalFileSymlinkLock(path, grace_period=spec.lock_grace_s)
            self._storage = JournalStorage(JournalFileBackend(path, lock_obj=lock))
        directions = list(spec.directions)
        self._study = optuna.create_study(
            study_name=spec.name, storage=self._storage, sampler=_sampler(spec), pruner=_pruner(spec),
            load_if_exists=True, **({"directions": directions} if len(directions) > 1
                                    else {"direction": directions[0]}))
        self._study_id = self._storage.get_study_id_from_name(spec.name)

    # -- asking ---------------------------------------------------------------------------
    def ask(self) -> Asked:
        """A new trial (or a queued retry): its number and parameters (``fixed`` included).

        The sampler is built afresh for each ask, seeded with the spec's seed and the number of
        trials asked before: processes that each open the study once and ask once would all draw
        the same "random" parameters from a sampler seeded alike."""
        asked = len(self._storage.get_all_trials(self._study_id, deepcopy=False))
        self._study.sampler = _sampler(self.spec, (self.spec.seed * 1_000_003 + asked) % 2**32)
        trial = self._study.ask()
        params: dict[str, Any] = {}
        for key in sorted(self.spec.space):
            params[key] = _suggest(trial, key, self.spec.space[key])
        retry_of = trial.user_attrs.get("retry_of")
        return Asked(trial.number, {**self.spec.fixed, **params},
                     retry_of if isinstance(retry_of, int) else None)

    # -- by number --------------------------------------------------------------------------
    def report(self, number: int, step: int, value: float) -> bool:
        """Record ``value`` at ``step`` (a step reported before keeps its first value) and say
        whether the pruner would stop the trial now.  False for a trial already closed."""
        if not (isinstance(step, int) and step >= 0 and math.isfinite(value)):
            raise InputError(f"trial {number}: a report needs a step >= 0 and a finite value, "
                             f"got step {step!r}, value {value!r}")
        trial = self._trial(number)
        if trial is None:
            return False
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)      # a repeated step: kept as it was
            try:
                trial.report(float(value), step)
                return bool(trial.should_prune())
            except self._optuna.exceptions.UpdateFinishedTrialError:
                return False

    def complete(self, number: int, values: float | Sequence[float]) -> bool:
        """Close the trial with its final value(s); False if it was closed already."""
        vals = [float(values)] if isinstance(values, (int, float)) else [float(v) for v in values]
        if len(vals) != len(self.spec.directions) or not all(math.isfinite(v) for v in vals):
            raise InputError(f"trial {number}: {len(self.spec.directions)} finite value(s) expected, got {values!r}")
        return self._tell(number, values=vals if len(vals) > 1 else vals[0])

    def pruned(self, number: int) -> bool:
        """Close the trial as pruned (its last reported value stands); False if closed already."""
        return self._tell(number, state=self._optuna.trial.TrialState.PRUNED)

    def failed(self, number: int) -> bool:
        return self._tell(number, state=self._optuna.trial.TrialState.FAIL)

    def retry(self, number: int) -> bool:
        """Queue the trial's parameters for the next :meth:`ask` and close the trial as failed.
        False (and nothing queued) if it was closed already.

        Safe to repeat after a ``kill -9`` at any point: the parameters are queued first, at
        most once per trial (the queued trial names it in ``retry_of``), and only then is the
        trial closed.  The other order loses a grid point to a kill in between: the closed trial
        counts as visited, and nothing repeats it."""
        frozen = self._storage.get_trial(self._trial_id(number))
        if frozen.state.is_finished():
            return False
        queued = any(t.user_attrs.get("retry_of") == number
                     for t in self._storage.get_all_trials(self._study_id, deepcopy=False))
        params = None if queued else self._asked_params(frozen)
        if params is not None:
            self._study.enqueue_trial(params, user_attrs={"retry_of": number})
        return self.failed(number)

    def _asked_params(self, frozen) -> dict | None:
        """The parameters a trial was given, all of them when they can be known.  A process
        killed while it was being asked leaves a trial with some parameters or none.  A queued
        trial (a retry) carries all of them from its start (Optuna's ``fixed_params``).  The grid
        sampler fixed a new trial's grid point when the trial was created (its ``grid_id``),
        and the point gives them all.  Queueing some of them would make the grid sampler refuse
        every later ask, so for the grid it is all or nothing (None: nothing queued).  Other
        samplers draw the missing ones."""
        params = dict(frozen.params)
        fixed = frozen.system_attrs.get("fixed_params")
        if isinstance(fixed, dict) and set(fixed) >= set(self.spec.space):
            return {k: fixed[k] for k in self.spec.space}
        if self.spec.sampler != "grid" or set(params) >= set(self.spec.space):
            return params
        grid = _sampler(self.spec)                  # the study's grid, in the order it was asked
        gid = frozen.system_attrs.get("grid_id")
        points, names = getattr(grid, "_all_grids", None), getattr(grid, "_param_names", None)
        if not (isinstance(gid, int) and isinstance(points, list) and isinstance(names, list)
                and 0 <= gid < len(points) and set(names) == set(self.spec.space)):
            return None
        return dict(zip(names, points[gid]))

    # -- reading ----------------------------------------------------------------------------
    def trials(self) -> list[TrialView]:
        out = []
        for t in self._study.get_trials(deepcopy=False):
            steps = t.intermediate_values
            last = max(steps) if steps else None
            retry_of = t.user_attrs.get("retry_of")
            out.append(TrialView(t.number, _STATE[t.state.name], dict(t.params),
                                 tuple(t.values) if t.values is not None else None, last,
                                 steps[last] if last is not None else None,
                                 retry_of if isinstance(retry_of, int) else None))
        return out

    # -- internals ------------------------------------------------------------------------
    def _trial_id(self, number: int) -> int:
        return self._storage.get_trial_id_from_study_id_trial_number(self._study_id, number)

    def _trial(self, number: int):
        """The live Trial handle of a RUNNING trial (None when it is closed)."""
        tid = self._trial_id(number)
        if self._storage.get_trial(tid).state.is_finished():
            return None
        return self._optuna.trial.Trial(self._study, tid)

    def _tell(self, number: int, **kwargs) -> bool:
        tid = self._trial_id(number)       # a number never asked: KeyError from the storage
        if self._storage.get_trial(tid).state.is_finished():
            return False
        try:
            self._study.tell(number, **kwargs)
        except (ValueError, self._optuna.exceptions.UpdateFinishedTrialError):
            return False        # closed by another process in between
        return True


_STATE = {"RUNNING": "running", "WAITING": "waiting", "COMPLETE": "complete", "PRUNED": "pruned",
          "FAIL": "failed"}


def _check(spec: StudySpec) -> None:
    if spec.sampler not in SAMPLERS:
        raise InputError(f"sampler must be one of {', '.join(SAMPLERS)}, got {spec.sampler!r}")
    if spec.pruner not in PRUNERS:
        raise InputError(f"pruner must be one of {', '.join(PRUNERS)}, got {spec.pruner!r}")
    if not spec.directions or any(d not in ("maximize", "minimize") for d in spec.directions):
        raise InputError(f"directions must be maximize/minimize, got {spec.directions!r}")
    if (spec.sampler == "nsga2") != (len(spec.directions) > 1):
        raise InputError("several objectives need the nsga2 sampler, and nsga2 needs several objectives")
    if spec.sampler == "grid" and not all(isinstance(d, list) for d in spec.space.values()):
        raise InputError("the grid sampler needs a list of values for every parameter")
    if spec.min_resource < 1 or spec.reduction_factor < 2 or (
            spec.max_resource is not None and spec.max_resource < spec.min_resource):
        raise InputError("need min_resource >= 1, reduction_factor >= 2 and max_resource >= min_resource")


def _sampler(spec: StudySpec, seed: int | None = None):
    from optuna import samplers
    seed = spec.seed if seed is None else seed
    if spec.sampler == "random":
        return samplers.RandomSampler(seed=seed)
    if spec.sampler == "grid":
        class Grid(samplers.GridSampler):
            """The grid without its stop of an ``optimize`` loop once every point was asked (an
            ask-and-tell study has no loop to stop: Optuna raises there); the campaign's trial
            count, at most the grid's size, ends it."""

            def after_trial(self, study, trial, state, values) -> None:
                return None
        # the spec's seed, never a per-ask one: the seed orders the grid, and a trial's stored
        # grid id means a point only under the order it was asked with
        return Grid({k: list(v) for k, v in spec.space.items()}, seed=spec.seed)
    if spec.sampler == "cmaes":
        return samplers.CmaEsSampler(seed=seed)
    if spec.sampler == "nsga2":
        return samplers.NSGAIISampler(seed=seed)
    return samplers.TPESampler(seed=seed)


def _pruner(spec: StudySpec):
    from optuna import pruners
    if spec.pruner == "asha":
        return pruners.SuccessiveHalvingPruner(min_resource=spec.min_resource,
                                               reduction_factor=spec.reduction_factor)
    if spec.pruner == "hyperband":
        return pruners.HyperbandPruner(min_resource=spec.min_resource,
                                       max_resource=spec.max_resource if spec.max_resource else "auto",
                                       reduction_factor=spec.reduction_factor)
    if spec.pruner == "median":
        return pruners.MedianPruner(n_warmup_steps=spec.min_resource)
    return pruners.NopPruner()


def _suggest(trial, key: str, dom: Any):
    """One parameter from the spec's syntax (checked by the spec: a non-empty list, or one
    distribution with finite bounds, log_uniform's above 0)."""
    if isinstance(dom, list):
        if not all(v is None or isinstance(v, (bool, int, float, str)) for v in dom):
            raise InputError(f"space.{key}: Optuna's choices are numbers, strings, booleans or null")
        return trial.suggest_categorical(key, dom)
    (dist, (lo, hi)), = dom.items()
    if dist == "int_uniform":
        return trial.suggest_int(key, int(lo), int(hi))
    return trial.suggest_float(key, float(lo), float(hi), log=dist == "log_uniform")
