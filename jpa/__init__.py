"""Job profiling advisor: learns each malleable job's throughput curve online.

Imports only the domain model (:mod:`malletrain.domain`); no I/O, no clock.
"""
from malletrain.jpa.advisor import Advisor, probe_counts
from malletrain.jpa.scaling import ScalingFit, fit_scaling

__all__ = ["Advisor", "ScalingFit", "fit_scaling", "probe_counts"]
