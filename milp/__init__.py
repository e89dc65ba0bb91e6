"""The allocators (the ``milp`` room, installed as ``malletrain.milp``): which size, on which
node type, each malleable job gets.

What lives here: :mod:`~malletrain.milp.problem` (the count-based problem and its values),
:mod:`~malletrain.milp.solve` (picks the allocator), :mod:`~malletrain.milp.mck` (the exact
dynamic programme for one node type), :mod:`~malletrain.milp.count` (the count MILP for several
types), :mod:`~malletrain.milp.greedy` (the greedy policy and fallback),
:mod:`~malletrain.milp.bftrainer` (BFTrainer's per-node MILP, the baseline) and
:mod:`~malletrain.milp.lp` (the one module that touches PuLP).

Imports ``domain`` only (numpy; PuLP inside :mod:`~malletrain.milp.lp`'s functions, so a solver
loads only when a MILP is solved).  Pure functions: no I/O beyond the solver's, no clock.
"""
from malletrain.milp.problem import Allocation, JobChoice, Option, Problem, evaluate
from malletrain.milp.solve import allocate

__all__ = ["Allocation", "JobChoice", "Option", "Problem", "allocate", "evaluate"]
