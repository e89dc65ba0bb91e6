"""The service: ``malletrain daemon`` on the login node, as the operator account (the ``daemon`` room).

What lives here: :mod:`~malletrain.daemon.loop` (the loop around the shared cycle),
:mod:`~malletrain.daemon.progress` (the jobs' progress files: samples, pauses, promises, final
results; bounded and untrusted), :mod:`~malletrain.daemon.files` (opening a user's file as that
user could), :mod:`~malletrain.daemon.recovery` and :mod:`~malletrain.daemon.outcomes` (lost,
hung and finished jobs), :mod:`~malletrain.daemon.store` (state that survives a restart),
:mod:`~malletrain.daemon.status` (status.json), :mod:`~malletrain.daemon.service` (JSON logs, the
Prometheus endpoint), :mod:`~malletrain.daemon.logguard` (log lines no user can multiply) and
:mod:`~malletrain.daemon.collect` (the full garbage collection between cycles).

Imports ``domain``, ``core`` and ``slurm`` only; never ``campaign`` or Optuna (what a trial's
study says reaches it as a number in a progress record).
"""
