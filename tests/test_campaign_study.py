"""The Optuna adapter's contract (malletrain/campaign/study.py), on real Optuna 5 with a journal
file: what the campaign code relies on, so that an Optuna upgrade that breaks it fails here."""
import json
import os
import subprocess
import sys
import time

import pytest

from malletrain.campaign.study import SAMPLERS, Study, StudySpec, journal_path
from malletrain.domain.errors import InputError

SPACE = {"lr": {"log_uniform": [1e-4, 1e-1]}, "width": {"int_uniform": [8, 64]},
         "act": ["relu", "gelu"], "drop": {"uniform": [0.0, 0.5]}}


def _spec(tmp_path, **kw):
    base = {"directory": str(tmp_path / "camp"), "name": "c", "space": SPACE, "fixed": {"steps": 9}}
    return StudySpec(**{**base, **kw})


def test_asked_parameters_follow_the_space_and_the_fixed_values(tmp_path):
    study = Study(_spec(tmp_path, sampler="random", seed=3))
    seen = [study.ask() for _ in range(12)]
    assert [a.number for a in seen] == list(range(12))
    for a in seen:
        p = a.params
        assert p["steps"] == 9 and 1e-4 <= p["lr"] <= 1e-1 and 8 <= p["width"] <= 64
        assert isinstance(p["width"], int) and p["act"] in ("relu", "gelu") and 0.0 <= p["drop"] <= 0.5
    assert len({a.params["lr"] for a in seen}) == 12            # drawn, not constant
    assert os.path.isfile(journal_path(str(tmp_path / "camp")))
    again = Study(_spec(tmp_path, directory=str(tmp_path / "other"), sampler="random", seed=3))
    assert [again.ask().params for _ in range(3)] == [a.params for a in seen[:3]]      # seeded


_ASK_AND_DIE = """
import os, sys, json
from malletrain.campaign.study import Study, StudySpec
spec = StudySpec(**json.loads(sys.argv[1]))
a = Study(spec).ask()
print(json.dumps([a.number, a.params]), flush=True)
os._exit(0)          # no tell: the process is gone, the trial stays RUNNING in the journal
"""


def _ask_in_another_process(spec: StudySpec) -> tuple[int, dict]:
    arg = json.dumps({**spec.__dict__, "directions": list(spec.directions)})
    out = subprocess.run([sys.executable, "-c", _ASK_AND_DIE, arg], capture_output=True, text=True,
                         timeout=120, check=True)
    number, params = json.loads(out.stdout.strip().splitlines()[-1])
    return number, params


def test_trials_asked_by_one_process_are_reported_and_closed_by_another(tmp_path):
    """ASHA (min_resource 1, η 3): a trial far below the others at a rung is pruned, one above is
    not; the decision is taken from the journal by trial number in a process that did not ask."""
    spec = _spec(tmp_path, sampler="random", pruner="asha", min_resource=1, reduction_factor=3)
    numbers = [_ask_in_another_process(spec)[0] for _ in range(4)]
    study = Study(spec)
    for n, value in zip(numbers[:3], (0.9, 0.8, 0.85)):
        for step in range(1, 4):
            study.report(n, step, value)
        assert study.complete(n, value)
    assert study.report(numbers[3], 1, 0.1) is True          # far worse than the rung's others
    assert study.pruned(numbers[3])
    states = {t.number: t.state for t in study.trials()}
    assert [states[n] for n in numbers] == ["complete", "complete", "complete", "pruned"]
    pruned = next(t for t in study.trials() if t.number == numbers[3])
    assert pruned.values == (0.1,) and pruned.last_step == 1      # the last reported value stands


def test_a_better_trial_is_not_pruned_and_none_never_prunes(tmp_path):
    spec = _spec(tmp_path, sampler="random", pruner="asha", min_resource=1, reduction_factor=3)
    study = Study(spec)
    for value in (0.5, 0.4, 0.45):
        n = study.ask().number
        study.report(n, 1, value)
        study.complete(n, value)
    good = study.ask().number
    assert study.report(good, 1, 0.99) is False
    plain = Study(_spec(tmp_path, directory=str(tmp_path / "plain"), pruner="none"))
    for value in (0.9, 0.8, 0.7):
        n = plain.ask().number
        plain.report(n, 1, value)
        plain.complete(n, value)
    assert plain.report(plain.ask().number, 1, 0.0) is False


def test_reports_after_a_requeue_are_harmless_and_closed_trials_are_left_alone(tmp_path):
    study = Study(_spec(tmp_path))
    n = study.ask().number
    study.report(n, 3, 0.5)
    study.report(n, 3, 0.7)                     # the same step again after a resume: first value kept
    study.report(n, 4, 0.6)
    view = next(t for t in study.trials() if t.number == n)
    assert view.last_step == 4 and view.last_value == 0.6
    assert study.complete(n, 0.61) is True
    assert study.complete(n, 0.9) is False      # closed already: nothing changes
    assert study.pruned(n) is False and study.failed(n) is False and study.retry(n) is False
    assert study.report(n, 5, 0.1) is False     # a late report of a closed trial
    view = next(t for t in study.trials() if t.number == n)
    assert view.state == "complete" and view.values == (0.61,) and view.last_step == 4
    with pytest.raises(InputError):
        study.report(n, -1, 0.5)
    with pytest.raises(InputError):
        study.complete(study.ask().number, float("nan"))


def test_a_retry_asks_the_same_parameters_again_once(tmp_path):
    study = Study(_spec(tmp_path, sampler="random"))
    first = study.ask()
    other = study.ask()
    assert study.retry(first.number) is True
    again = Study(_spec(tmp_path, sampler="random")).ask()          # any process gets the queued retry
    assert again.params == first.params and again.retry_of == first.number
    assert again.number not in (first.number, other.number)
    fresh = study.ask()
    assert fresh.retry_of is None and fresh.params != first.params
    states = {t.number: t.state for t in study.trials()}
    assert states[first.number] == "failed" and states[again.number] == "running"


def test_every_sampler_runs_and_several_objectives_need_nsga2(tmp_path):
    grid = {"a": [1, 2], "b": ["x", "y"]}
    for name in SAMPLERS:
        directions = ("maximize", "minimize") if name == "nsga2" else ("maximize",)
        space = grid if name == "grid" else {"a": {"uniform": [0.0, 1.0]}, "b": {"int_uniform": [1, 4]}}
        study = Study(_spec(tmp_path, directory=str(tmp_path / name), sampler=name, directions=directions,
                            space=space))
        asked = []
        for i in range(4):
            a = study.ask()
            asked.append((a.params["a"], a.params["b"]))
            assert study.complete(a.number, [float(i), float(-i)] if name == "nsga2" else float(i))
        assert [t.state for t in study.trials()] == ["complete"] * 4, name
        if name == "grid":          # every point of the grid once
            assert sorted(asked) == [(1, "x"), (1, "y"), (2, "x"), (2, "y")]
    with pytest.raises(InputError, match="nsga2"):
        Study(_spec(tmp_path, directory=str(tmp_path / "x"), directions=("maximize", "minimize")))
    with pytest.raises(InputError, match="sampler"):
        Study(_spec(tmp_path, directory=str(tmp_path / "y"), sampler="bayes"))
    with pytest.raises(InputError, match="grid"):
        Study(_spec(tmp_path, directory=str(tmp_path / "z"), sampler="grid"))


_HOLD_THE_LOCK = """
import sys, time
from optuna.storages.journal import JournalFileSymlinkLock
JournalFileSymlinkLock(sys.argv[1]).acquire()
print("held", flush=True)
time.sleep(600)
"""


def test_a_lock_held_by_a_process_killed_with_sigkill_is_broken_after_its_grace(tmp_path):
    """A process killed (kill -9) while it holds the journal's lock leaves the lock behind; the next
    write waits out the grace period, breaks it and goes on: nothing is lost."""
    spec = _spec(tmp_path, lock_grace_s=3)
    study = Study(spec)
    n = study.ask().number
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_THE_LOCK, journal_path(spec.directory)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        holder.kill()
        holder.wait(timeout=30)
        lock = journal_path(spec.directory) + ".lock"
        assert os.path.lexists(lock)                      # left behind by the killed holder
        t0 = time.monotonic()
        assert study.complete(n, 0.5) is True
        assert time.monotonic() - t0 >= 3.0 and not os.path.lexists(lock)
    finally:
        holder.kill()
        holder.wait(timeout=30)
    assert [t.state for t in Study(spec).trials()] == ["complete"]


def test_without_optuna_a_study_is_a_clear_error(tmp_path, monkeypatch):
    """The hpo extra missing: an InputError that says what to install (exit 2), no traceback."""
    monkeypatch.setitem(sys.modules, "optuna", None)      # import optuna -> ImportError
    with pytest.raises(InputError, match=r"malletrain\[hpo\]"):
        Study(_spec(tmp_path))
