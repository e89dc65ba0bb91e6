"""NAS/HPO campaigns: many malleable trials from one spec (the ``campaign`` room).

A spec is a YAML file naming the trial command, the search space and the trial jobs' shape
(see :mod:`malletrain.campaign.spec` for its fields and an example).  ``submit`` is idempotent.

What lives here: :mod:`~malletrain.campaign.spec` (the spec, its checks, the classic search's
parameters), :mod:`~malletrain.campaign.ledger` (the classic ``campaign.json``: tokens and jobs,
idempotent submit), :mod:`~malletrain.campaign.slots` (a study campaign's trial jobs: bound to
their Optuna trial when they start, closed out, kept going by ``tick``, all under one lock),
:mod:`~malletrain.campaign.trial` (what a trial job runs, and the runtime's reporter),
:mod:`~malletrain.campaign.status` (progress records, results, the status tables) and
:mod:`~malletrain.campaign.study` (the one module that imports Optuna: a study in a journal file
in the campaign directory, asked and told by trial number).  The room imports ``domain`` only;
the CLI drives it, the runtime reports through :mod:`~malletrain.campaign.trial`, and the daemon
never imports it.
"""
from malletrain.campaign.ledger import load_state, plan_trials, save_state, state_path, submit_campaign, trial_command
from malletrain.campaign.spec import Spec, load_spec, sample
from malletrain.campaign.status import format_status, last_record, read_result, status_rows

__all__ = ["Spec", "format_status", "last_record", "load_spec", "load_state", "plan_trials", "read_result",
           "sample", "save_state", "state_path", "status_rows", "submit_campaign", "trial_command"]
