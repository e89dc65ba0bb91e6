"""Every adapter reports to a campaign's Optuna study as the runtime does: inside a trial job
(``MALLETRAIN_TRIAL``, ``MALLETRAIN_TRIAL_NUMBER``), a report at validation is an intermediate
value of that trial in the study, at the position of the spec's step unit, and a ``metric``
record with the trial's promise; a pruned trial's verdict is the adapter's to agree on."""
from __future__ import annotations

import importlib
import json
import os

import pytest

from malletrain.campaign import slots
from malletrain.campaign.spec import load_spec
from malletrain.campaign.study import open_study
from malletrain.campaign.trial import ENV_DIR, ENV_NUMBER

pytestmark = pytest.mark.torch

SPEC = """
name: ad
command: [python3, train.py]
dir: camp
sampler: random
trials: 4
max_concurrent: 2
seed: 1
metric: val_acc
goal: max
step_unit: samples
pruner: {kind: asha, min_resource: 512, reduction_factor: 3}
space:
  lr: {log_uniform: [0.001, 0.1]}
"""

ADAPTERS = {"ddp": {}, "lightning": {}, "accelerate": {}, "hf": {"micro_batch": 8}}


@pytest.mark.parametrize("name", list(ADAPTERS))
def test_an_adapter_reports_to_its_campaign_trial(tmp_path, monkeypatch, name):
    (tmp_path / "spec.yaml").write_text(SPEC)
    spec = load_spec(str(tmp_path / "spec.yaml"))
    os.makedirs(spec.dir, exist_ok=True)
    slots.freeze(spec)
    number = open_study(spec).ask().number
    monkeypatch.setenv(ENV_DIR, spec.dir)
    monkeypatch.setenv(ENV_NUMBER, str(number))
    metrics = tmp_path / "m.jsonl"
    mod = importlib.import_module(f"malletrain.adapters.{name}")
    mt = mod.Malleable(str(tmp_path / "ck"), global_batch=256, env={"MALLETRAIN_METRICS": str(metrics)},
                       **ADAPTERS[name])
    try:
        mt.global_step = 3                  # 768 samples: past the first rung (512)
        assert mt.report(0.75) is False
    finally:
        mt.metrics.close()
        mt.stop.uninstall()
    (trial,) = [t for t in open_study(spec).trials() if t.number == number]
    assert trial.state == "running" and (trial.last_step, trial.last_value) == (768, 0.75)
    rec = [json.loads(line) for line in metrics.read_text().splitlines()][-1]
    assert rec["event"] == "metric" and rec["value"] == 0.75 and rec["samples"] == 768
    assert rec["promise"] == 3.0 and rec["prune"] is False       # it survived the first rung: η^1
