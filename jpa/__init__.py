"""The job profiling advisor (the ``jpa`` room, installed as ``malletrain.jpa``): what each
malleable job's samples say about it, learned online.

What lives here: :mod:`~malletrain.jpa.advisor` (throughput samples in, a curve per job with its
probes out), :mod:`~malletrain.jpa.scaling` (the parametric scaling model and its fit),
:mod:`~malletrain.jpa.advise` (how many nodes to ask for, for ``malletrain advise``),
:mod:`~malletrain.jpa.rescale` (the rescale pauses jobs were measured to take) and
:mod:`~malletrain.jpa.sensitivity` (which jobs slow down on slow nodes).

Imports ``domain`` only (and the standard library: no numpy, no BLAS, so that a fit is the same
to the last bit on every machine; see :mod:`~malletrain.jpa.scaling`).  Pure: no I/O, no clock,
no environment; sample times come in.
"""
from malletrain.jpa.advisor import Advisor, probe_counts
from malletrain.jpa.scaling import ScalingFit, fit_scaling

__all__ = ["Advisor", "ScalingFit", "fit_scaling", "probe_counts"]
