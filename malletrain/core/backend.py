"""The backend protocol the cycle drives, and the metrics-source protocol beside it.

``Backend.observe`` returns what the cluster looks like now (an
:class:`Observation`: Slurm facts only — nodes, malleable jobs, what their tags
say, which jobs left); ``Backend.apply`` carries out a plan's changes.
Throughput samples do not come from the backend: a :class:`MetricsSource`
reads them (the daemon tails the jobs' progress files; replay's simulated
cluster reports them) and the cycle hands them to the JPA.

Implementations: :class:`malletrain.slurm.adapter.SlurmBackend` (real Slurm)
and :class:`malletrain.replay.sim.SimCluster` (replay and unit tests).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from malletrain.domain.model import Action, Direction, PauseKind, PauseSample, Sample, Snapshot


@dataclass(frozen=True)
class SizeChange:
    """The daemon's latest change of a job's size, for measuring the pause it cost: from
    ``hold_s`` (the job was told to stop; for a start, released) to its first step on
    ``nodes`` nodes, released at ``release_s``."""

    direction: Direction
    hold_s: float
    release_s: float
    nodes: int
    start: bool = False         # from no nodes (a start, not a grow)

    @property
    def kind(self) -> PauseKind:
        if self.direction is Direction.DOWN:
            return PauseKind.SHRINK
        return PauseKind.START if self.start else PauseKind.GROW


@dataclass(frozen=True)
class JobFacts:
    """What the scheduler says about one malleable job beyond its :class:`JobState`."""

    profile: str                       # scaling-prior key from the job's tag
    user: str = ""                     # the job's owner
    progress_path: str | None = None   # where the job appends progress records, if any
    uid: int | None = None             # the owner's uid: progress files must be theirs
    max_nodes: int = 1_000_000         # the most nodes a progress record may claim
    state: str = ""                    # the scheduler's state word (COMPLETED, FAILED, …) for ended jobs
    nodes: tuple[str, ...] = ()        # where it runs (or ran last)
    change: SizeChange | None = None   # the daemon's latest change of its size
    elastic: bool = False              # an elastic group: its re-forming records are read (issue #26)
    held: bool = False                 # queued on hold (never a job the daemon released and Slurm has not started)


@dataclass(frozen=True)
class Observation:
    snapshot: Snapshot
    finished: tuple[str, ...] = ()                       # jobs that left since the last call
    facts: Mapping[str, JobFacts] = field(default_factory=dict)
    # Changes whenever anything decide() reads changes (nodes, jobs, sizes);
    # None: the backend cannot tell, decide every cycle.
    generation: int | None = None
    # Tagged jobs the scheduler reports as ended (still in its queue): the daemon's
    # safety net reads their last progress record and requeues lost work.
    ended: Mapping[str, JobFacts] = field(default_factory=dict)

    def profiles(self) -> dict[str, str]:
        return {job: f.profile for job, f in self.facts.items()}

    def elastic(self) -> frozenset[str]:
        """The jobs that re-form in place (elastic groups, issue #26)."""
        return frozenset(job for job, f in self.facts.items() if f.elastic)


class Backend(Protocol):
    def observe(self) -> Observation: ...

    def apply(self, actions: Sequence[Action]) -> None: ...


class MetricsSource(Protocol):
    """Throughput samples the observed jobs reported since the last poll, the rescale pauses
    measured since (for the rescale-cost learner), and the promise each campaign trial's study
    reported last (jobs that reported none are absent)."""

    def poll(self, observation: Observation) -> Sequence[Sample]: ...

    def pauses(self) -> Sequence[PauseSample]: ...

    def promises(self) -> Mapping[str, float]: ...
