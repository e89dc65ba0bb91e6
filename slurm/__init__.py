"""Backends behind one protocol: the simulator now, the Slurm CLI next."""
from malletrain.core.backend import Backend, Observation

__all__ = ["Backend", "Observation"]
