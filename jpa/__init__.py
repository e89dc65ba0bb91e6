"""Job profiling advisor: learns each malleable job's throughput curve online."""
from jpa.model import ScalingFit, fit_scaling
from jpa.advisor import Advisor, Sample, probe_counts

__all__ = ["Advisor", "Sample", "ScalingFit", "fit_scaling", "probe_counts"]
