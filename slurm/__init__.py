"""The Slurm backend (the ``slurm`` room, installed as ``malletrain.slurm``): real Slurm behind the
core's one backend protocol.

What lives here: :mod:`~malletrain.slurm.adapter` (``SlurmBackend``: observe and apply),
:mod:`~malletrain.slurm.runner` (the one subprocess seam: argv lists, timeouts, no shell),
:mod:`~malletrain.slurm.parse` (what the Slurm commands print, per release),
:mod:`~malletrain.slurm.groups` (elastic groups: an array's 1-node members folded into one job),
:mod:`~malletrain.slurm.versions`, :mod:`~malletrain.slurm.submit` (``malletrain submit``'s
sbatch and its template) and the optional pyslurm reader.

Imports ``domain`` and ``core`` only.
"""
from malletrain.core.backend import Backend, Observation

__all__ = ["Backend", "Observation"]
