"""Study campaigns without Slurm: trial jobs (slots) bound to Optuna trials when they start, the
trial cap across every path, kill -9 at the awkward moments, close-out, retries, pruning reports
and the trial wrapper running a real child process.  Real Optuna 5 with its journal file; a
recording submitter stands in for sbatch (the live tests use real Slurm)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from malletrain.campaign import slots
from malletrain.campaign.spec import load_spec
from malletrain.campaign.study import open_study
from malletrain.campaign.trial import RESULT_WAIT_S, Reporter, run_trial
from malletrain.domain.errors import InputError

SPEC = """
name: st
command: [python3, train.py]
dir: camp
sampler: random
trials: 5
max_concurrent: 2
retries: 1
seed: 7
metric: val_acc
goal: max
space:
  lr: {log_uniform: [0.001, 0.1]}
  width: [16, 32, 64]
fixed: {steps: 10}
"""


def _spec(tmp_path, text: str = SPEC, **replace):
    for k, v in replace.items():
        text = text.replace(k, v)
    p = tmp_path / "spec.yaml"
    p.write_text(text)
    spec = load_spec(str(p))
    os.makedirs(spec.dir, exist_ok=True)
    slots.freeze(spec)
    return spec


class Sbatch:
    """Records submissions; job ids from 100."""

    def __init__(self):
        self.jobs: dict[str, str] = {}       # job id -> token
        self.calls = 0

    def __call__(self, name, command, token):
        self.calls += 1
        jid = str(100 + len(self.jobs))
        self.jobs[jid] = token
        return jid

    def find(self, token):
        return next((j for j, t in self.jobs.items() if t == token), None)


def _tick(spec, sb, queued=None, study=None):
    n = iter(range(1000))
    return slots.tick(spec, study or open_study(spec), submit_one=sb, slot_command=lambda s: ["run", s],
                      new_token=lambda: f"tok{next(n)}-{os.urandom(3).hex()}",
                      queued=set(sb.jobs) if queued is None else queued, find_token=sb.find)


def _finish(spec, number, value, final=True):
    d = os.path.join(slots.trial_dir(spec.dir, number), "ckpt")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "result.json"), "w") as fh:
        json.dump({"val_acc": value, "final": final}, fh)


def _ledger(spec):
    return slots.load_ledger(spec.dir)["slots"]


def test_spec_study_fields_and_their_errors(tmp_path):
    spec = _spec(tmp_path, **{"sampler: random": "sampler: tpe\npruner: {kind: asha, min_resource: 2, "
                                                   "reduction_factor: 3}\nstep_unit: samples"})
    assert spec.study and spec.sampler == "tpe" and spec.pruner == "asha" and spec.min_resource == 2
    assert spec.step_unit == "samples" and spec.max_concurrent == 2 and spec.retries == 1
    bad = [("sampler: random", "sampler: annealing", "sampler"),
           ("sampler: random", "search: random\nsampler: tpe", "not both"),
           ("retries: 1", "retries: -1", "retries"),
           ("max_concurrent: 2", "max_concurrent: 0", "max_concurrent"),
           ("sampler: random", "sampler: random\nstep_unit: batches", "per-rank batches"),
           ("sampler: random", "sampler: random\npruner: {kind: asha, reduction_factor: 1}", "reduction_factor"),
           ("sampler: random", "sampler: nsga2", "several objectives"),
           ("sampler: random", "search: random\npruner: asha", "needs an Optuna study"),
           ("seed: 7", "seed: 7\njob: {elastic: 'yes'}", "true or false"),
           ("seed: 7", "seed: 7\njob: {elastic: true, launch: torchrun}", "one process per node"),
           ("seed: 7", "seed: 7\njob: {elastic: true, max_nodes: 5000}", "at most 4096 members")]
    for old, new, needle in bad:
        (tmp_path / "b.yaml").write_text(SPEC.replace(old, new))
        with pytest.raises(InputError, match=needle):
            load_spec(str(tmp_path / "b.yaml"))
    two = SPEC.replace("sampler: random", "sampler: nsga2").replace("metric: val_acc", "metric: [val_acc, params]") \
        .replace("goal: max", "goal: [max, min]")
    (tmp_path / "n.yaml").write_text(two)
    nsga = load_spec(str(tmp_path / "n.yaml"))
    assert nsga.metrics == ("val_acc", "params") and nsga.goals == ("max", "min")


def test_scientific_notation_in_a_spec_is_a_number(tmp_path):
    """PyYAML reads 1e-4 as a string (YAML 1.1); a researcher's ``lr: [1e-4, 1e-2]`` must be numbers."""
    spec = _spec(tmp_path, **{"lr: {log_uniform: [0.001, 0.1]}": "lr: [1e-4, 2E+2, 1.5e-2, '1e-3']"})
    assert spec.space["lr"] == [0.0001, 200.0, 0.015, "1e-3"]


def test_a_changed_spec_is_refused_for_the_same_dir(tmp_path):
    spec = _spec(tmp_path)
    (tmp_path / "spec.yaml").write_text(SPEC.replace("trials: 5", "trials: 6"))
    with pytest.raises(InputError, match="different spec"):
        slots.freeze(load_spec(str(tmp_path / "spec.yaml")))
    assert slots.thawed(spec.dir) == spec


def test_tick_keeps_max_concurrent_jobs_and_the_trial_cap(tmp_path):
    spec = _spec(tmp_path)
    sb = Sbatch()
    t = _tick(spec, sb)
    assert t.submitted == ("s000", "s001") and sb.calls == 2
    assert _tick(spec, sb).submitted == () and sb.calls == 2            # idempotent
    study = open_study(spec)
    numbers = []
    for _ in range(10):                     # start, finish and tick until the campaign is over
        live = [s for s in _ledger(spec) if s["end"] is None]
        if not live:
            break
        for s in live:
            b = slots.bind(spec, s["id"], study)
            assert slots.bind(spec, s["id"], study).number == b.number      # a requeued job: same trial
            numbers.append(b.number)
            _finish(spec, b.number, 0.5 + b.number / 100)
            assert slots.close_out(spec, s["id"], study, rc=0, stopped=False) == "done"
        _tick(spec, sb, study=study)
    views = study.trials()
    assert len(views) == 5 and all(v.state == "complete" for v in views)
    assert sorted(numbers) == list(range(5)) and sb.calls == 5
    params = [json.dumps(v.params, sort_keys=True) for v in views]
    assert len(set(params)) == 5          # every ask drew anew (one sampler per process would repeat)


def test_params_are_asked_when_the_job_starts_not_at_submit(tmp_path):
    spec = _spec(tmp_path)
    sb = Sbatch()
    _tick(spec, sb)
    study = open_study(spec)
    assert study.trials() == [] and not os.path.exists(slots.trial_dir(spec.dir, 0))
    b = slots.bind(spec, "s001", study)
    assert b.number == 0 and b.state == "running"
    with open(b.params_path) as fh:
        assert json.load(fh) == b.params and b.params["steps"] == 10


_BIND_AND_DIE = """
import os, sys
from malletrain.campaign import slots
from malletrain.campaign.study import open_study
spec = slots.thawed(sys.argv[1])
def die(*a, **k):
    os.kill(os.getpid(), 9)          # kill -9 after Optuna's ask, before the ledger names the trial
slots.save_ledger = die
slots.bind(spec, "s000", open_study(spec))
"""


def test_kill_9_between_ask_and_the_ledger_loses_nothing_and_breaks_no_cap(tmp_path):
    spec = _spec(tmp_path, **{"trials: 5": "trials: 2"})
    sb = Sbatch()
    _tick(spec, sb)
    died = subprocess.run([sys.executable, "-c", _BIND_AND_DIE, spec.dir], timeout=120)
    assert died.returncode == -signal.SIGKILL
    study = open_study(spec)
    orphan = study.trials()
    assert [v.state for v in orphan] == ["running"]             # asked, named by no job
    b = slots.bind(spec, "s000", study)                         # the job starts again
    assert b.number == 1
    views = study.trials()
    assert [v.state for v in views] == ["failed", "running"]   # the orphan never ran ...
    assert views[1].params == orphan[0].params and views[1].retry_of == 0   # ... its parameters do
    slots.bind(spec, "s001", study)
    _finish(spec, 1, 0.9)
    slots.close_out(spec, "s000", study, rc=0, stopped=False)
    assert _tick(spec, sb, study=study).submitted == ()       # 2 trial jobs: the cap
    assert sum(v.state != "failed" for v in study.trials()) == 2


_ASK_AND_DIE = """
import os, sys
from malletrain.campaign import slots, study as st
spec = slots.thawed(sys.argv[1])
real, calls = st._suggest, []
def suggest(trial, key, dom):
    calls.append(key)
    if len(calls) == 2:
        os.kill(os.getpid(), 9)      # kill -9 inside Optuna's ask: the trial has one parameter of two
    return real(trial, key, dom)
st._suggest = suggest
slots.bind(spec, "s000", st.open_study(spec))
"""


@pytest.mark.parametrize("sampler", ["grid", "random"])
def test_kill_9_inside_the_ask_loses_no_point_of_the_grid(tmp_path, sampler):
    """A trial killed half-asked keeps one parameter of two.  The grid sampler refuses a queued
    trial with some of its parameters, so the whole grid point is queued; another sampler gets
    what the trial had and draws the rest."""
    text = SPEC.replace("sampler: random", f"sampler: {sampler}").replace(
        "lr: {log_uniform: [0.001, 0.1]}", "lr: [0.01, 0.1]").replace("trials: 5", "trials: 6")
    spec = _spec(tmp_path, text)
    sb = Sbatch()
    _tick(spec, sb)
    died = subprocess.run([sys.executable, "-c", _ASK_AND_DIE, spec.dir], timeout=120)
    assert died.returncode == -signal.SIGKILL
    study = open_study(spec)
    (orphan,) = study.trials()
    assert orphan.state == "running" and len(orphan.params) == 1
    points = []
    for k in range(6):                    # every trial job of the campaign starts and finishes
        slot = _ledger(spec)[k]["id"] if k < len(_ledger(spec)) else None
        if slot is None:
            _tick(spec, sb, study=study)
            slot = _ledger(spec)[k]["id"]
        b = slots.bind(spec, slot, study)
        points.append((b.params["lr"], b.params["width"]))
        _finish(spec, b.number, 0.5)
        slots.close_out(spec, slot, study, rc=0, stopped=False)
    views = study.trials()
    assert views[0].state == "failed" and views[1].retry_of == 0
    assert points[0][0] == orphan.params["lr"]             # the half-asked trial's parameters, asked again
    if sampler == "grid":
        assert sorted(points) == sorted((lr, w) for lr in (0.01, 0.1) for w in (16, 32, 64))


_DIE_AT = """
import os, sys
from malletrain.campaign import slots, study as st
spec = slots.thawed(sys.argv[1])
slot, where = sys.argv[2], sys.argv[3]
real_suggest, real_failed, calls = st._suggest, st.Study.failed, []
def suggest(trial, key, dom):
    calls.append(key)
    if where == "ask" and len(calls) == 2:
        os.kill(os.getpid(), 9)      # inside Optuna's ask: one parameter of two
    return real_suggest(trial, key, dom)
def failed(self, number):
    if where == "retry-before-close":
        os.kill(os.getpid(), 9)
    out = real_failed(self, number)
    if where == "retry-after-close":
        os.kill(os.getpid(), 9)
    return out
st._suggest, st.Study.failed = suggest, failed
slots.bind(spec, slot, st.open_study(spec))
"""


@pytest.mark.parametrize("second", ["ask", "retry-before-close", "retry-after-close"])
def test_a_second_kill_9_inside_the_retry_loses_no_point_of_the_grid(tmp_path, second):
    """A trial killed half-asked is queued again by the next bind; that bind is killed too: in
    the queued trial's own ask (it has one parameter of two and no grid id of its own: its
    point comes from the queue), or in the retry, before or after the half-asked trial is closed.
    Every point of the grid is still trained exactly once."""
    text = SPEC.replace("sampler: random", "sampler: grid").replace(
        "lr: {log_uniform: [0.001, 0.1]}", "lr: [0.01, 0.1]").replace("trials: 5", "trials: 6")
    spec = _spec(tmp_path, text)
    sb = Sbatch()
    _tick(spec, sb)
    for slot, where in (("s000", "ask"), ("s001", second)):
        died = subprocess.run([sys.executable, "-c", _DIE_AT, spec.dir, slot, where], timeout=120)
        assert died.returncode == -signal.SIGKILL
    study = open_study(spec)
    points = []
    for k in range(6):
        slot = _ledger(spec)[k]["id"] if k < len(_ledger(spec)) else None
        if slot is None:
            _tick(spec, sb, study=study)
            slot = _ledger(spec)[k]["id"]
        b = slots.bind(spec, slot, study)
        points.append((b.params["lr"], b.params["width"]))
        _finish(spec, b.number, 0.5)
        slots.close_out(spec, slot, study, rc=0, stopped=False)
    views = study.trials()
    assert sorted(points) == sorted((lr, w) for lr in (0.01, 0.1) for w in (16, 32, 64)), views
    # the half-asked point came back from the queue, not from the grid sampler's random re-pick
    # of an exhausted grid (which may or may not hit the lost point)
    (again,) = [v for v in views if v.state == "complete" and v.retry_of is not None]
    assert again.params["lr"] == views[0].params["lr"], views
    assert not any(v.state == "waiting" for v in views)          # nothing queued twice


def test_kill_9_between_sbatch_and_the_ledger_finds_the_job_by_token(tmp_path):
    spec = _spec(tmp_path)
    sb = Sbatch()

    class Died(BaseException):
        pass

    def sbatch_then_die(name, command, token):
        sb(name, command, token)
        raise Died
    with pytest.raises(Died):
        slots.tick(spec, open_study(spec), submit_one=sbatch_then_die, slot_command=lambda s: [s],
                   new_token=lambda: os.urandom(4).hex(), queued=set(), find_token=sb.find)
    assert _ledger(spec)[0]["submitting"] and sb.calls == 1
    t = _tick(spec, sb)
    led = _ledger(spec)
    assert t.submitted == ("s001",) and sb.calls == 2           # s000 was found by its token
    assert led[0]["job"] == "100" and not led[0]["submitting"]


def test_jobs_that_left_the_queue(tmp_path):
    spec = _spec(tmp_path, **{"trials: 5": "trials: 3"})
    sb = Sbatch()
    _tick(spec, sb)
    study = open_study(spec)
    b = slots.bind(spec, "s001", study)
    t = _tick(spec, sb, queued=set(), study=study)        # both cancelled: s000 before it started
    assert dict(t.ended) == {"s000": "void", "s001": "failed"}
    assert [v.state for v in study.trials()] == ["failed"] and b.number == 0
    assert t.submitted == ("s002", "s003")          # a void slot used no trial: 3 trials still possible
    s = slots.bind(spec, "s002", study)
    _finish(spec, s.number, 0.7)                    # finished, but its job was gone before it said so
    t = _tick(spec, sb, queued={"103"}, study=study)
    assert dict(t.ended) == {"s002": "done"} and t.submitted == ()
    assert {v.number: v.state for v in study.trials()}[s.number] == "complete"


def test_failures_count_against_retries_then_the_trial_fails(tmp_path):
    spec = _spec(tmp_path)
    sb = Sbatch()
    _tick(spec, sb)
    study = open_study(spec)
    b = slots.bind(spec, "s000", study)
    assert slots.close_out(spec, "s000", study, rc=3, stopped=True) is None        # checkpointed: goes on
    assert slots.close_out(spec, "s000", study, rc=1, stopped=False) is None       # failure 1 of retries 1
    assert slots.close_out(spec, "s000", study, rc=1, stopped=False) == "failed"
    assert study.trials()[b.number].state == "failed"


def test_reporter_prunes_a_poor_trial_and_a_rereport_is_harmless(tmp_path):
    spec = _spec(tmp_path, **{"sampler: random": "sampler: random\npruner: {kind: asha, min_resource: 1, "
                                                   "reduction_factor: 3}\nstep_unit: samples",
                              "trials: 5": "trials: 6", "max_concurrent: 2": "max_concurrent: 6"})
    sb = Sbatch()
    _tick(spec, sb)
    study = open_study(spec)
    bound = [slots.bind(spec, f"s{i:03d}", study) for i in range(6)]
    for b in bound[:5]:
        rep = Reporter(spec.dir, b.number)
        assert rep.report(0.9, steps=1, samples=64, epochs=0) is False
    poor = Reporter(spec.dir, bound[5].number)
    assert poor.report(0.1, steps=1, samples=64, epochs=0) is True
    assert study.trials()[bound[5].number].state == "pruned"
    assert study.trials()[bound[5].number].last_step == 64           # the samples unit, not steps
    assert poor.report(0.1, steps=1, samples=64, epochs=0) is False   # after a requeue: harmless
    assert slots.close_out(spec, "s005", study, rc=0, stopped=False) == "pruned"


_TRAIN = textwrap.dedent("""
    import json, os, sys
    args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
    params = json.load(open(args["--params"]))
    os.makedirs(args["--ckpt"], exist_ok=True)
    assert os.environ["MALLETRAIN_TRIAL_NUMBER"].isdigit()
    mode = open(os.environ["MODE_FILE"]).read().strip()
    if mode == "fail":
        sys.exit(1)
    json.dump({"val_acc": params["lr"], "final": True}, open(os.path.join(args["--ckpt"], "result.json"), "w"))
""")


def test_the_trial_wrapper_runs_the_command_closes_out_and_ticks(tmp_path):
    spec_text = SPEC.replace("command: [python3, train.py]", f"command: [{sys.executable}, train.py]")
    (tmp_path / "train.py").write_text(_TRAIN)
    spec = _spec(tmp_path, spec_text)
    sb = Sbatch()
    _tick(spec, sb)
    mode = tmp_path / "mode"
    metrics = tmp_path / "job.jsonl"
    env = {**os.environ, "MODE_FILE": str(mode), "MALLETRAIN_METRICS": str(metrics), "MALLETRAIN_JOB": "100"}
    ticks = []

    def run(slot):
        return run_trial(spec.dir, slot, open_study=open_study, ticker=lambda s, st: ticks.append(s.name),
                         env=env)
    mode.write_text("ok")
    assert run("s000") == 0 and ticks == ["st"]
    study = open_study(spec)
    assert study.trials()[0].state == "complete"
    assert run("s000") == 0 and ticks == ["st", "st"]          # started again after it ended: exits at once
    assert json.loads(metrics.read_text().splitlines()[-1])["reason"] == "done"
    mode.write_text("fail")
    assert run("s001") == 1 and len(ticks) == 2                 # within retries: the job runs again
    assert run("s001") == 0 and len(ticks) == 3                 # then failed for good: exit 0, final record
    assert json.loads(metrics.read_text().splitlines()[-1])["reason"] == "failed"
    assert study.trials()[1].state == "failed"
    env["SLURM_PROCID"] = "1"                                   # other tasks never close out
    mode.write_text("ok")
    sb2 = Sbatch()
    sb2.jobs = dict(sb.jobs)
    _tick(spec, sb2, study=study)
    assert run("s002") == 0 and len(ticks) == 3 and study.trials()[2].state == "running"


_MEMBER = textwrap.dedent("""
    import os, sys
    mode = open(os.environ["MODE_FILE"]).read().strip()
    assert os.environ["SLURM_ARRAY_TASK_ID"].isdigit()
    sys.exit({"ok": 0, "fail": 1, "leave": 3}[mode])      # the result is written by the test (rank 0)
""")


def test_an_elastic_groups_members_each_close_out_a_trial_once(tmp_path):
    """Issue #26: every member of a trial's group runs the wrapper and closes out.  A member that
    leaves changes nothing; one that ends 0 waits for the result rank 0 writes (then the trial is
    complete, once).  A member that ends without the result is one member gone while any other
    runs; the failure counts once, when the last member of the run ends (members that ended
    together close out one after the other while Slurm still shows them running)."""
    spec_text = (SPEC.replace("command: [python3, train.py]", f"command: [{sys.executable}, member.py]")
                 + "job: {elastic: true, max_nodes: 3}\n")
    (tmp_path / "member.py").write_text(_MEMBER)
    spec = _spec(tmp_path, spec_text)
    sb = Sbatch()
    _tick(spec, sb)
    mode = tmp_path / "mode"
    ticks, naps = [], []
    shown: dict = {}                 # what Slurm shows running: task -> start

    def run(slot, task, result=None):
        env = {**os.environ, "MODE_FILE": str(mode), "SLURM_ARRAY_TASK_ID": str(task), "SLURM_PROCID": "0",
               "SLURM_ARRAY_JOB_ID": "100"}

        def sleep(s):
            naps.append(s)
            if result is not None and len(naps) == 3:          # rank 0 writes it meanwhile
                _finish(spec, slots.bind(spec, slot, open_study(spec)).number, result)
        return run_trial(spec.dir, slot, open_study=open_study, ticker=lambda s, st: ticks.append(slot),
                         env=env, sleep=sleep, peers=lambda array: None if shown is None else dict(shown))
    shown.update({0: "t0", 1: "t0", 2: "t0"})
    mode.write_text("leave")
    assert run("s000", 1) == 3 and ticks == [] and naps == []        # left: the others train on
    mode.write_text("ok")
    assert run("s000", 2, result=0.7) == 0 and ticks == ["s000"]    # waited for rank 0's result
    study = open_study(spec)
    assert study.trials()[0].state == "complete" and 0 < len(naps) <= 3
    assert run("s000", 0) == 0 and study.trials()[0].state == "complete"    # the rest: closed already
    naps.clear()
    assert run("s001", 0) == 0 and len(naps) == RESULT_WAIT_S / 0.5         # no result came ...
    assert _ledger(spec)[1]["failures"] == 0                                # ... but 1 and 2 run on
    mode.write_text("fail")
    del shown[0]
    assert run("s001", 1) == 1 and _ledger(spec)[1]["failures"] == 0       # 2 still runs
    assert run("s001", 2) == 1 and _ledger(spec)[1]["failures"] == 1       # the run's last member: once
    assert study.trials()[1].state == "running"
    shown.clear()
    shown.update({0: "t9", 1: "t9"})          # the group's next run (new starts), all members fail together
    assert run("s001", 0) == 1 and _ledger(spec)[1]["failures"] == 1       # 1 is shown running still
    assert run("s001", 1) == 0                                              # the last: retries spent
    assert _ledger(spec)[1]["failures"] == 2 and study.trials()[1].state == "failed"
    _tick(spec, sb, study=study)
    shown = None                               # Slurm unreachable: a member's end is never counted
    assert run("s002", 0) == 1 and _ledger(spec)[2]["failures"] == 0


_HOLD_LOCK = """
import os, sys, time
from malletrain.campaign import slots
with slots.locked(sys.argv[1]):
    print("held", flush=True)
    time.sleep(60)
"""


def test_a_lock_holder_killed_blocks_nobody(tmp_path):
    spec = _spec(tmp_path)
    p = subprocess.Popen([sys.executable, "-c", _HOLD_LOCK, spec.dir], stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    p.kill()
    p.wait(timeout=30)
    with slots.locked(spec.dir):        # would wait forever if the lock outlived its holder
        pass


@pytest.mark.parametrize("sampler", ["grid", "tpe", "random"])
def test_each_process_opening_the_study_asks_new_parameters(tmp_path, sampler):
    """Each trial job opens the study itself: a sampler rebuilt per process must not repeat
    (the grid visits every point once; seeded samplers do not draw the same point again)."""
    spec = _spec(tmp_path, **{"sampler: random": f"sampler: {sampler}", "trials: 5": "trials: 6",
                              "max_concurrent: 2": "max_concurrent: 6",
                              "lr: {log_uniform: [0.001, 0.1]}": "lr: [0.001, 0.01]"})
    _tick(spec, Sbatch())
    got = [slots.bind(spec, f"s{i:03d}", open_study(spec)).params for i in range(6)]
    pairs = {(p["lr"], p["width"]) for p in got}
    assert len(pairs) == 6 if sampler == "grid" else len(pairs) >= 3


_TRY_LOCK = """
import fcntl, sys
fd = open(sys.argv[1], "a")
try:
    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
except OSError:
    sys.exit(1)
"""


def test_the_queue_is_listed_under_the_lock(tmp_path):
    """Two trial jobs ending at once both tick: one waits for the other's lock, which submits a
    successor meanwhile.  A queue listed before the wait lacks that job and would judge it gone
    (void, replaced: one trial job too many; seen live).  Listed under the lock, it has it."""
    spec = _spec(tmp_path)
    sb = Sbatch()
    _tick(spec, sb)
    held = []

    def listing():
        r = subprocess.run([sys.executable, "-c", _TRY_LOCK, os.path.join(spec.dir, "campaign.lock")], timeout=60)
        held.append(r.returncode == 1)
        return set(sb.jobs)
    t = slots.tick(spec, open_study(spec), submit_one=sb, slot_command=lambda s: ["run", s],
                   new_token=lambda: os.urandom(6).hex(), queued=listing, find_token=sb.find)
    assert held == [True] and t.submitted == ()
    assert all(s["end"] is None for s in _ledger(spec))


def test_several_objectives_close_with_every_value_and_status_shows_the_pareto_front(tmp_path):
    """NSGA-II (val_acc up, parameter count down): a trial closes with both values read from its
    result; status marks the trials no other beats in both (the Pareto front), not the best by the
    first objective alone."""
    from malletrain.campaign.status import format_study_status, study_rows
    text = SPEC.replace("sampler: random", "sampler: nsga2").replace("metric: val_acc", "metric: [val_acc, params]") \
        .replace("goal: max", "goal: [max, min]")
    spec = _spec(tmp_path, text)
    results = {0: (0.90, 1000), 1: (0.95, 5000), 2: (0.85, 2000), 3: (0.95, 4000), 4: (0.80, 500)}
    sb = Sbatch()
    _tick(spec, sb)
    study = open_study(spec)
    for _ in range(10):
        live = [s for s in _ledger(spec) if s["end"] is None]
        if not live:
            break
        for s in live:
            b = slots.bind(spec, s["id"], study)
            d = os.path.join(slots.trial_dir(spec.dir, b.number), "ckpt")
            os.makedirs(d, exist_ok=True)
            acc, size = results[b.number]
            with open(os.path.join(d, "result.json"), "w") as fh:
                json.dump({"val_acc": acc, "params": size, "final": True}, fh)
            assert slots.close_out(spec, s["id"], study, rc=0, stopped=False) == "done"
        _tick(spec, sb, study=study)
    views = study.trials()
    assert sorted((v.number, tuple(v.values)) for v in views) == sorted((n, v) for n, v in results.items())
    rows = study_rows(spec, _ledger(spec), views, {})
    assert sorted(r["trial"] for r in rows if r["best"]) == [0, 3, 4]       # 1 and 2 are dominated
    summary = format_study_status(spec, rows)[-1]
    assert "Pareto front (val_acc max, params min): trial" in summary, summary
    assert sorted(int(x) for x in summary.split(": ")[1].split("   ")[0].replace("trial ", "").split(", ")) == [0, 3, 4]


def test_a_groups_queue_lines_are_its_one_job_to_the_campaign(monkeypatch):
    """An elastic trial's queue lines are its members (``7_0``, ``7_1``) and its held ones merged
    (``7_[2-3]``): to the campaign they are job 7, running on its running members' nodes, so a
    group is never judged gone while a member is queued."""
    from types import SimpleNamespace

    from malletrain.cli import user
    from malletrain.domain.config import Config
    lines = ["7_0|RUNNING|1", "7_[2-3]|PENDING|1", "7_1|RUNNING|1", "8|PENDING|2", "9_[0-3]|PENDING|1",
             "12|RUNNING|4", "13_5|RUNNING|1"]

    class Runner:
        def read(self, argv):
            fields = argv[-1].count("|") + 1
            return "\n".join("|".join(line.split("|")[:fields]) for line in lines) + "\n"
    monkeypatch.setattr(user, "_runner", lambda cfg: Runner())
    assert user._job_states(Config()) == {"7": ("running", 2), "8": ("pending", 2), "9": ("pending", 0),
                                          "12": ("running", 4), "13": ("running", 1)}
    _, _, list_queue = user._trial_submitter(SimpleNamespace(job={}, name="x"), Config(), "/m")
    assert list_queue() == {"7", "8", "9", "12", "13"}
    assert user.job_of("7_[2-3]") == user.job_of("7_2") == "7" and user.job_of("_7") == "_7"
