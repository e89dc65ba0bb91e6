"""The backend protocol every Slurm side effect goes through.

``observe`` returns what the cluster looks like now (a :class:`Snapshot`),
the throughput samples jobs reported since the last call, and the jobs that
finished.  ``apply`` carries out the changes of a plan.  Implementations:
:mod:`slurm.sim` (replay and unit tests); the Slurm CLI backend follows.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence

from malletrain.jpa.advisor import Sample
from malletrain.domain.model import Action, Snapshot


@dataclass(frozen=True)
class Observation:
    snapshot: Snapshot
    samples: tuple[Sample, ...] = ()
    finished: tuple[str, ...] = ()
    profiles: dict = field(default_factory=dict)   # job_id -> profile key
    # Changes whenever anything decide() reads changes (nodes, jobs, sizes);
    # None: the backend cannot tell, decide every cycle.
    generation: int | None = None


class Backend(Protocol):
    def observe(self) -> Observation: ...

    def apply(self, actions: Sequence[Action]) -> None: ...
