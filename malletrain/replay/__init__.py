"""Replay: the decision core over recorded schedules (the ``replay`` room).

What lives here: :mod:`~malletrain.replay.traces` (node-event CSV, SWF and sacct logs),
:mod:`~malletrain.replay.workload` (the malleable workload file), :mod:`~malletrain.replay.sim`
(the simulated backend and metrics source), :mod:`~malletrain.replay.engine` (the event loop
around the shared cycle, and :class:`~malletrain.replay.engine.Unfolding`: a workload that asks
jobs as it runs, such as a campaign), :mod:`~malletrain.replay.nas` (NAS-Bench-201 trials: the
table and the stated model of their curves and throughput), :mod:`~malletrain.replay.summary`
and :mod:`~malletrain.replay.plots`.

Imports ``domain`` and ``core`` only (numpy; matplotlib for plots).
"""
