"""NAS/HPO campaigns: many malleable trials from one spec (the ``campaign`` room).

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

What lives here: :mod:`~malletrain.campaign.spec` (the spec, its checks, the classic search's
parameters), :mod:`~malletrain.campaign.ledger` (``campaign.json``: tokens and jobs, idempotent
submit), :mod:`~malletrain.campaign.status` (progress records, results, the status table) and
:mod:`~malletrain.campaign.study` (the one module that imports Optuna: a study in a journal file
in the campaign directory, asked and told by trial number).  The room imports ``domain`` only;
the CLI drives it, and the daemon never imports it.
"""
from malletrain.campaign.ledger import load_state, plan_trials, save_state, state_path, submit_campaign, trial_command
from malletrain.campaign.spec import Spec, load_spec, sample
from malletrain.campaign.status import format_status, last_record, read_result, status_rows

__all__ = ["Spec", "format_status", "last_record", "load_spec", "load_state", "plan_trials", "read_result",
           "sample", "save_state", "state_path", "status_rows", "submit_campaign", "trial_command"]
