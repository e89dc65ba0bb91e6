"""Job profiling advisor: learns each malleable job's throughput curve online."""
from malletrain.jpa.scaling import ScalingFit, fit_scaling
from malletrain.jpa.advisor import Advisor, Sample, probe_counts

__all__ = ["Advisor", "Sample", "ScalingFit", "fit_scaling", "probe_counts"]
