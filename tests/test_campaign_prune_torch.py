"""A campaign trial pruned through the runtime, with real PyTorch (2 processes, gloo): rank 0's
report gets the pruner's verdict, both processes stop at the same step boundary, exit 0 with
reason ``pruned`` and write no checkpoint for it; the study has the trial pruned."""
from __future__ import annotations

import json
import os
import sys

import pytest

from malletrain.campaign import slots
from malletrain.campaign.spec import load_spec
from malletrain.campaign.study import open_study
from malletrain.runtime.selfcheck import spawn_ranks

pytestmark = pytest.mark.torch
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "train", "digits_train.py")


def test_a_poor_trial_is_pruned_at_a_step_boundary_on_every_rank(tmp_path):
    (tmp_path / "spec.yaml").write_text(json.dumps({
        "name": "p", "command": [sys.executable, EXAMPLE], "dir": "camp", "sampler": "random",
        "trials": 4, "max_concurrent": 4, "metric": "val_acc", "goal": "max",
        "pruner": {"kind": "asha", "min_resource": 10, "reduction_factor": 3}, "step_unit": "steps",
        "space": {"lr": [0.05]}, "fixed": {"steps": 200, "eval_every": 10, "arch": "mlp", "width": 16,
                                           "depth": 1, "workers": 2, "micro_batch": 8}}))
    spec = load_spec(str(tmp_path / "spec.yaml"))
    os.makedirs(spec.dir)
    slots.freeze(spec)
    slots.tick(spec, open_study(spec), submit_one=lambda n, c, t: str(abs(hash(t)) % 10**6),
               slot_command=lambda s: [s], new_token=lambda: os.urandom(4).hex(), queued=None, find_token=None)
    study = open_study(spec)
    others = [slots.bind(spec, f"s00{i}", study) for i in range(3)]
    for b in others:            # three trials that reached 0.99 at every rung
        for step in (10, 30, 90):
            study.report(b.number, step, 0.99)
    me = slots.bind(spec, "s003", study)
    metrics = tmp_path / "m.jsonl"
    ps = spawn_ranks([sys.executable, EXAMPLE, "--params", me.params_path, "--ckpt", me.ckpt_dir,
                      "--checkpoint-every-s", "0"], 2,
                     env={"MALLETRAIN_TRIAL": spec.dir, "MALLETRAIN_TRIAL_NUMBER": str(me.number),
                          "MALLETRAIN_METRICS": str(metrics), "MALLETRAIN_JOB": "7"})
    for p in ps:
        p.wait(timeout=240)
    errs = [p.stderr.read() for p in ps]
    assert [p.returncode for p in ps] == [0, 0], errs[0][-3000:]
    recs = [json.loads(x) for x in metrics.read_text().splitlines()]
    said = [r for r in recs if r["event"] == "metric" and r["prune"]]
    assert len(said) == 1 and said[0]["step"] == 10            # the first rung, 0.99 above it
    end = [r for r in recs if r["event"] == "exit"]
    assert [r["reason"] for r in end] == ["pruned"] and end[0]["step"] == 11     # the next boundary
    assert not any(r["event"] == "checkpoint" and r["step"] == 11 for r in recs)
    assert "pruner stops this trial" in errs[0]
    view = {t.number: t for t in open_study(spec).trials()}[me.number]
    assert view.state == "pruned" and view.last_step == 10
    assert slots.close_out(spec, "s003", study, rc=0, stopped=False) == "pruned"
