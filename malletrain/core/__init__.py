"""The decision core, shared by the daemon and replay (the ``core`` room).

What lives here: :mod:`~malletrain.core.decide` (``decide``: snapshot, curves, outlook and config
in, a plan with a reason for every job out), :mod:`~malletrain.core.objective` (what each size of a
job is worth), :mod:`~malletrain.core.placement` (counts to nodes), :mod:`~malletrain.core.curves`
and :mod:`~malletrain.core.forecast` (the JPA's curves, learned pauses, node stays and the
campaign trials' promise, fed from samples), :mod:`~malletrain.core.availability` and
:mod:`~malletrain.core.stays` (how long idle nodes stay idle), :mod:`~malletrain.core.backend`
(the backend and metrics-source protocols), :mod:`~malletrain.core.contain` (a decision that
raises for one owner's jobs sets them aside and decides the others: the daemon's cycle) and
:mod:`~malletrain.core.cycle` (the one cycle: observe, decide, reconcile, apply).

Imports ``domain``, ``jpa`` and ``milp`` only.  Pure: no I/O, no clock, no environment (the cycle
alone reads a timer, to measure the decision, and logs); a MILP solver loads only when one is
solved.
"""
