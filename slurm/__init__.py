"""Backends behind one protocol: the simulator now, the Slurm CLI next."""
from slurm.backend import Backend, Observation

__all__ = ["Backend", "Observation"]
