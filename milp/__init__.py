"""Allocators: which size each malleable job gets (count-based), and the
BFTrainer per-node baseline.  Pure functions over :mod:`malletrain.milp.problem` types."""
from malletrain.milp.problem import Allocation, JobChoice, Option, Problem, evaluate
from malletrain.milp.solve import allocate

__all__ = ["Allocation", "JobChoice", "Option", "Problem", "allocate", "evaluate"]
