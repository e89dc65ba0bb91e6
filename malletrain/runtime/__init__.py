"""The malleable PyTorch runtime: a training script's side of malletrain.

Public API: :class:`Runtime`, :class:`RuntimeConfig`, :func:`discover` and
:class:`CheckpointStore`.  Needs the ``train`` extra (torch); everything is
imported lazily so that the daemon never pays for torch.  ``python -m
malletrain.runtime.torchrun`` is what ``submit --launch torchrun`` runs on each node
(:mod:`malletrain.runtime.torchrun`).  ``RuntimeConfig(elastic=True)`` makes ``Runtime`` an
elastic job's member (:mod:`malletrain.runtime.elastic`): members leave and join at step
boundaries without restarting the others.

The room imports ``domain``, and ``campaign`` only for a campaign trial's reports to its
study (:class:`malletrain.campaign.trial.Reporter`, found through ``MALLETRAIN_TRIAL`` on the
first :meth:`Runtime.report`).
"""
from malletrain.runtime.checkpoint import CheckpointStore
from malletrain.runtime.config import RuntimeConfig
from malletrain.runtime.launch import DistInfo, discover

__all__ = ["Runtime", "RuntimeConfig", "CheckpointStore", "DistInfo", "discover", "state_sha256"]


def __getattr__(name):
    if name == "Runtime":
        from malletrain.runtime.trainer import Runtime
        return Runtime
    if name == "state_sha256":
        from malletrain.runtime.reference import state_sha256
        return state_sha256
    raise AttributeError(name)
