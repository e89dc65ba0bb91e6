"""Campaign specs, sampling, idempotent submission and status (no Slurm: a recording submitter)."""
from __future__ import annotations

import json
import os

import pytest

from malletrain import campaign
from malletrain.domain.errors import InputError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples", "train")


def _spec(tmp_path, text: str):
    p = tmp_path / "spec.yaml"
    p.write_text(text)
    return campaign.load_spec(str(p))


BASE = """
name: t
command: [python3, train.py]
dir: out
search: random
trials: 5
seed: 3
space:
  lr: {log_uniform: [0.001, 0.1]}
  width: [16, 32]
  depth: {int_uniform: [1, 3]}
fixed: {steps: 10}
"""


@pytest.mark.parametrize("name", ["optuna-digits.yaml", "nas-nsga2-digits.yaml", "demo-optuna.yaml"])
def test_shipped_study_examples_load_and_ask(name, tmp_path):
    import dataclasses

    from malletrain.campaign.study import open_study
    spec = campaign.load_spec(os.path.join(EXAMPLES, name))
    assert spec.study and spec.command[-1] == os.path.join(EXAMPLES, "digits_train.py")
    spec = dataclasses.replace(spec, dir=str(tmp_path / "c"))
    asked = open_study(spec).ask()
    assert asked.params["steps"] == 300 and set(spec.space) <= set(asked.params)


@pytest.mark.parametrize("name", ["hpo-digits.yaml", "nas-digits.yaml"])
def test_shipped_examples_load(name):
    spec = campaign.load_spec(os.path.join(EXAMPLES, name))
    trials = campaign.sample(spec)
    assert trials and all(t["steps"] == 300 for t in trials)
    assert spec.command[-1] == os.path.join(EXAMPLES, "digits_train.py")
    if spec.kind == "nas":
        assert len(trials) == 12 and {t["arch"] for t in trials} == {"cnn", "mlp"}


def test_random_search_is_seeded_and_within_bounds(tmp_path):
    spec = _spec(tmp_path, BASE)
    a, b = campaign.sample(spec), campaign.sample(spec)
    assert a == b and len(a) == 5
    assert all(0.001 <= t["lr"] <= 0.1 and t["width"] in (16, 32) and 1 <= t["depth"] <= 3 for t in a)
    assert campaign.sample(_spec(tmp_path, BASE.replace("seed: 3", "seed: 4"))) != a
    assert spec.command[1] == str(tmp_path / "train.py") and spec.dir == str(tmp_path / "out")


def test_grid_search_enumerates_every_combination(tmp_path):
    spec = _spec(tmp_path, "name: g\ncommand: [x]\nsearch: grid\nspace: {a: [1, 2], b: [x, y, z]}\n")
    got = campaign.sample(spec)
    assert len(got) == 6 and {(t["a"], t["b"]) for t in got} == {(a, b) for a in (1, 2) for b in "xyz"}


@pytest.mark.parametrize("text, match", [
    (BASE + "budget: 3\n", r"unknown key\(s\) budget in the spec; valid keys: name, kind"),
    (BASE + "job: {nodes: 2}\n", r"unknown key\(s\) nodes in job; valid keys: min_nodes"),
    (BASE.replace("{log_uniform: [0.001, 0.1]}", "{log_uniform: [0, 0.1]}"), "space.lr"),
    (BASE.replace("[16, 32]", "[]"), "empty list"),
    (BASE.replace("search: random", "search: grid"), "grid search needs a list"),
    (BASE.replace("trials: 5", "trials: 0"), "trials >= 1"),
    (BASE + "job: {min_nodes: 3, max_nodes: 2}\n", "min_nodes <= max_nodes"),
    ("name: x\nspace: {a: [1]}\n", "field 'command': missing"),
    ("- just\n- a list\n", "a campaign spec is a mapping"),
    ("name: [unclosed\n", "not valid YAML"),
])
def test_bad_specs_are_clear_errors(tmp_path, text, match):
    with pytest.raises(InputError, match=match):
        _spec(tmp_path, text)


def test_submit_is_idempotent_and_survives_a_failure_midway(tmp_path):
    spec = _spec(tmp_path, BASE)
    calls = []

    def flaky(name, command, token):
        calls.append((name, token))
        if len(calls) == 3:
            raise RuntimeError("sbatch timed out")
        return str(100 + len(calls))

    tokens = iter(f"tok{i}" for i in range(100))
    with pytest.raises(RuntimeError):
        campaign.submit_campaign(spec, flaky, lambda i: next(tokens))
    st = campaign.load_state(spec)
    assert [t["job"] for t in st["trials"]] == ["101", "102", None, None, None]
    failed_token = st["trials"][2]["token"]
    trials = campaign.submit_campaign(spec, flaky, lambda i: next(tokens))
    assert [t["job"] for t in trials] == ["101", "102", "104", "105", "106"]
    assert calls[3] == ("t-t002", failed_token), "a retried trial keeps its token (no duplicate job)"
    assert len(campaign.submit_campaign(spec, flaky, lambda i: next(tokens))) == 5 and len(calls) == 6
    params = json.loads((tmp_path / "out" / "t003" / "params.json").read_text())
    assert params == trials[3]["params"]
    cmd = campaign.trial_command(spec, trials[0])
    assert cmd[-4:] == ["--params", str(tmp_path / "out" / "t000" / "params.json"),
                        "--ckpt", str(tmp_path / "out" / "t000" / "ckpt")]


def test_a_trial_whose_job_is_gone_without_a_result_is_resubmitted_once(tmp_path):
    spec = _spec(tmp_path, BASE)
    jobs = iter(str(j) for j in range(200, 300))
    calls = []

    def sbatch(name, command, token):
        calls.append((name, token))
        return next(jobs)

    tokens = iter(f"tok{i}" for i in range(100))
    trials = campaign.submit_campaign(spec, sbatch, lambda i: next(tokens))
    assert [t["job"] for t in trials] == ["200", "201", "202", "203", "204"]
    d = tmp_path / "out" / "t000" / "ckpt"
    d.mkdir(parents=True)
    (d / "result.json").write_text(json.dumps({"val_acc": 0.9, "final": True}))
    # 200 finished (final result), 201 gone without one, 202 still queued; 203/204 gone too
    queued = {"202"}
    trials = campaign.submit_campaign(spec, sbatch, lambda i: next(tokens), queued=queued)
    assert [t["job"] for t in trials] == ["200", "205", "202", "206", "207"]
    assert [t.get("resubmits", 0) for t in trials] == [0, 1, 0, 1, 1]
    assert trials[1]["token"] not in {c[1] for c in calls[:5]}       # a fresh token
    again = campaign.submit_campaign(spec, sbatch, lambda i: next(tokens), queued={"202", "205", "206", "207"})
    assert [t["job"] for t in again] == ["200", "205", "202", "206", "207"] and len(calls) == 8
    assert campaign.submit_campaign(spec, sbatch, lambda i: next(tokens), queued=None)[1]["job"] == "205"


def test_a_submit_that_died_after_sbatch_finds_its_job_by_token(tmp_path):
    spec = _spec(tmp_path, BASE)
    seen = {}

    def dies_after_sbatch(name, command, token):
        seen[token] = "300"
        raise KeyboardInterrupt      # the process is gone before the id is saved

    with pytest.raises(KeyboardInterrupt):
        campaign.submit_campaign(spec, dies_after_sbatch, lambda i: f"k{i}")
    calls = []
    trials = campaign.submit_campaign(spec, lambda n, c, t: calls.append(t) or "301", lambda i: f"k{i}",
                                      find_token=seen.get)
    assert trials[0]["job"] == "300" and "k0" not in calls and len(calls) == 4


def test_changed_spec_with_the_same_dir_is_refused(tmp_path):
    spec = _spec(tmp_path, BASE)
    campaign.submit_campaign(spec, lambda n, c, t: "1", lambda i: f"k{i}")
    changed = _spec(tmp_path, BASE.replace("seed: 3", "seed: 9"))
    with pytest.raises(InputError, match="use a new dir"):
        campaign.submit_campaign(changed, lambda n, c, t: "1", lambda i: f"k{i}")


def test_status_rows_progress_and_best(tmp_path):
    spec = _spec(tmp_path, BASE)
    trials = campaign.submit_campaign(spec, lambda n, c, t: str(10 + int(n[-1])), lambda i: f"k{i}")
    metrics = tmp_path / "m"
    metrics.mkdir()
    (metrics / "10.jsonl").write_text('{"event":"start","step":0}\n{"event":"progress","step":7,'
                                      '"samples":448,"restart":1}\ngarbage\n')
    for tid, acc, final in (("t000", 0.91, True), ("t001", 0.95, False), ("t002", 0.5, True)):
        d = tmp_path / "out" / tid / "ckpt"
        d.mkdir(parents=True)
        (d / "result.json").write_text(json.dumps({"val_acc": acc, "final": final, "step": 10}))
    (tmp_path / "out" / "t003" / "ckpt").mkdir(parents=True)
    (tmp_path / "out" / "t003" / "ckpt" / "result.json").write_text("{not json")
    rows = campaign.status_rows(spec, trials, {"11": ("running", 2)}, str(metrics))
    by = {r["id"]: r for r in rows}
    assert by["t000"]["state"] == "done" and by["t000"]["step"] == 7 and by["t000"]["restarts"] == 1
    assert by["t001"]["state"] == "running" and by["t001"]["nodes"] == 2
    assert by["t003"]["metric"] is None and by["t004"]["state"] == "gone"
    assert [r["id"] for r in rows if r["best"]] == ["t001"]
    text = "\n".join(campaign.format_status(spec, rows))
    assert "best so far: t001 val_acc=0.95 (interim)" in text and "2/5 done" in text


def test_the_queue_is_listed_after_the_ledger_is_read(tmp_path):
    """Two classic submits at once: the second one's queue listing must be taken after it read
    the ledger (and, in the CLI, under the campaign's lock), or the jobs the first one queued in
    between look gone and every trial is submitted again."""
    spec = _spec(tmp_path, BASE)
    queue: set[str] = set()

    def sbatch(name, command, token):
        jid = str(300 + len(queue))
        queue.add(jid)
        return jid
    tokens = iter(f"tok{i}" for i in range(100))
    stale = set(queue)          # a listing taken before the other submit ran: empty
    campaign.submit_campaign(spec, sbatch, lambda i: next(tokens))          # the other submit
    trials = campaign.submit_campaign(spec, sbatch, lambda i: next(tokens), queued=lambda: set(queue))
    assert len(queue) == 5 and [t.get("resubmits", 0) for t in trials] == [0] * 5
    # the negative control: the listing taken before judges all five gone and doubles them
    trials = campaign.submit_campaign(spec, sbatch, lambda i: next(tokens), queued=stale)
    assert len(queue) == 10 and [t.get("resubmits", 0) for t in trials] == [1] * 5


def test_the_classic_submit_command_lists_the_queue_under_the_campaign_lock(tmp_path, monkeypatch):
    import subprocess
    import sys

    from test_campaign_slots import _TRY_LOCK

    import malletrain.cli.user as user
    from malletrain.cli.main import main
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(BASE.replace("dir: out", f"dir: {tmp_path / 'out'}"))
    held, jobs = [], []

    def listing():
        r = subprocess.run([sys.executable, "-c", _TRY_LOCK, str(tmp_path / "out" / "campaign.lock")], timeout=60)
        held.append(r.returncode == 1)
        return set(jobs)

    def submitter(spec, cfg, metrics_dir):
        return (lambda name, command, token: jobs.append(str(400 + len(jobs))) or jobs[-1]), (lambda tok: None), listing
    monkeypatch.setattr(user, "_trial_submitter", submitter)
    assert main(["campaign", "submit", str(spec_path)]) == 0
    assert held == [True] and len(jobs) == 5
    assert main(["campaign", "submit", str(spec_path)]) == 0 and held == [True, True] and len(jobs) == 5


def test_study_campaign_status_says_what_it_queued(tmp_path, monkeypatch, capsys):
    """``campaign status`` reconciles as a trial's end does (a trial job gone from the queue
    without a result is queued again); it now says so instead of submitting silently."""
    pytest.importorskip("optuna")
    import malletrain.cli.user as user
    from malletrain.cli.main import main
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(f"""
name: st
command: [python3, train.py]
dir: {tmp_path / 'camp'}
sampler: random
trials: 4
max_concurrent: 2
seed: 7
metric: val_acc
goal: max
space:
  lr: {{log_uniform: [0.001, 0.1]}}
""")
    jobs, queue = [], set()

    def submitter(spec, cfg, metrics_dir):
        def submit_one(name, command, token):
            jobs.append(str(500 + len(jobs)))
            queue.add(jobs[-1])
            return jobs[-1]
        return submit_one, (lambda tok: None), (lambda: set(queue))
    monkeypatch.setattr(user, "_trial_submitter", submitter)
    monkeypatch.setattr(user, "_job_states", lambda cfg: {})
    assert main(["campaign", "submit", str(spec_path)]) == 0 and len(jobs) == 2
    capsys.readouterr()
    assert main(["campaign", "status", str(spec_path)]) == 0 and len(jobs) == 2
    assert "queued now" not in capsys.readouterr().err          # nothing missing: nothing said
    queue.discard(jobs[0])                                       # gone without a result
    assert main(["campaign", "status", str(spec_path)]) == 0 and len(jobs) == 3
    assert "1 trial job(s) the campaign was missing queued now" in capsys.readouterr().err
