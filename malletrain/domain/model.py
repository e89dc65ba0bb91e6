"""Typed domain model shared by the decision core, the backends and replay.

All types are frozen dataclasses: a :class:`Snapshot` goes into
:func:`malletrain.core.decide`, a :class:`Plan` comes out.  Times are seconds
(``*_s``) on whatever clock the caller uses (wall clock for the daemon, the
trace's clock for replay); the core never reads a clock itself.
"""
from __future__ import annotations

import bisect
import enum
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

DEFAULT_NODE_TYPE = "gpu"

# Bounds on what users give (traces, workloads, submit flags, job tags, campaign specs): one
# place, so the commands that read the same value refuse the same things.
MAX_NODES = 1_000_000          # node counts in traces, workloads and samples
MAX_JOB_NODES = 100_000        # a malleable job's min/max nodes (beyond: not a tag)
MAX_PAUSE_S = 1e7              # a malleable job's rescale pauses (the daemon's config clamps lower)
MAX_GPUS_PER_NODE = 1024
MAX_GRACE_S = 1e7              # a job's preemption grace time
LAUNCHES = ("srun", "batch", "torchrun")   # how a malleable job's batch script runs its command
MAX_MEMBERS = 4096             # an elastic group's members (array tasks) anyone looks at (issue #26)


def _zero_rate(n: float) -> float:
    return 0.0


def interpolate(counts: Sequence[int], values: Sequence[float], n: float) -> float:
    """Throughput at ``n`` nodes from sorted ``counts``: linear between listed
    counts, proportional below the smallest, flat above the largest."""
    if n <= 0 or not counts:
        return 0.0
    if n <= counts[0]:
        return values[0] * n / counts[0]
    if n >= counts[-1]:
        return values[-1]
    i = bisect.bisect_left(counts, n)
    if counts[i] == n:
        return values[i]
    w = (n - counts[i - 1]) / (counts[i] - counts[i - 1])
    return values[i - 1] * (1 - w) + values[i] * w


class ReasonCode(enum.Enum):
    """Why a job got its size this cycle: the countable part of a reason.

    Every :class:`Action` carries one code and a human-readable detail (the
    numbers behind it); ``explain`` prints both, metrics count by code.
    """

    RESCALE_PAUSE = "rescale-pause"      # keep: a rescale is still in progress
    MIN_DWELL = "min-dwell"              # keep: changed less than min_dwell_s ago
    MEASURING = "measuring"              # keep: the JPA is measuring this count
    PROBE = "probe"                      # start/resize to a count the JPA has not measured
    PROBE_WAIT = "probe-wait"            # wait: too few free nodes for the probe
    BEST_AS_IS = "best-as-is"            # keep: no change beats the current size
    GAIN = "gain"                        # start/grow: predicted gain outweighs the pause
    YIELD = "yield"                      # stop/shrink: the nodes are worth more elsewhere or gone
    OUTBID = "outbid"                    # wait: the idle nodes are worth more to other jobs
    TOO_FEW_NODES = "too-few-nodes"      # wait: fewer free nodes than min_nodes
    STATIC_SIZE = "static-size"          # static policy: fixed size
    FIFO = "fifo"                        # static policy: waits behind the head of the queue
    SOLVER = "solver"                    # the per-node MILP decided (bftrainer)
    LOST = "lost"                        # requeue: ended without a final result (the safety net)
    HUNG = "hung"                        # requeue: stopped reporting progress
    GAVE_UP = "gave-up"                  # held for good: failed more than max_failures times
    FINISHED = "finished"                # cancel: its work ended 'done' as it was being stopped or preempted
    STARVING = "starving"                # start at min_nodes: it waited starvation_s while others ran
    PROMISE = "promise"                  # its owner's nodes, re-split among the owner's jobs by their promise
    SET_ASIDE = "set-aside"              # keep as is: deciding it raised (a bug its data triggers; core.contain)


class ActionKind(enum.Enum):
    """What the plan does to one malleable job this cycle."""

    START = "start"    # held/pending job gets its first nodes
    GROW = "grow"      # keeps every node it has and takes more
    SHRINK = "shrink"  # keeps a subset of its nodes
    STOP = "stop"      # gives every node back (job stays queued, not cancelled)
    KEEP = "keep"      # same nodes as before
    WAIT = "wait"      # no nodes before, none now
    REQUEUE = "requeue"  # the daemon's safety net requeued it held (never planned by decide)
    CANCEL = "cancel"    # queued again after its work ended 'done': the requeued copy is cancelled


@dataclass(frozen=True)
class Node:
    """One harvestable node: idle, or held by a malleable job."""

    name: str
    node_type: str = DEFAULT_NODE_TYPE
    group: str = ""                     # topology group (switch, rack)
    window_end_s: float | None = None   # predicted end of the idle window; None = unknown
    variability: float = 1.0            # relative slowdown, 1.0 = nominal


@dataclass(frozen=True)
class JobSpec:
    """What the user asked for: the static description of a malleable job."""

    job_id: str
    min_nodes: int
    max_nodes: int
    rescale_up_s: float = 0.0
    rescale_down_s: float = 0.0
    profile: str = ""
    submit_s: float = 0.0
    name: str = ""
    owner: str = ""        # who owns it (the Slurm user); '' = a job of its own (replay)
    work: float = 0.0      # samples to finish (the 'progress' objective's unit); 0 = not known


@dataclass(frozen=True)
class JobState:
    """A malleable job as observed this cycle."""

    spec: JobSpec
    nodes: tuple[str, ...] = ()        # nodes it holds now (empty = not running)
    node_type: str | None = None       # type of the nodes it holds
    paused_until_s: float = 0.0        # end of a rescale pause in progress
    last_change_s: float | None = None  # when its node set last changed

    @property
    def job_id(self) -> str:
        return self.spec.job_id

    @property
    def size(self) -> int:
        return len(self.nodes)


@dataclass(frozen=True)
class Snapshot:
    """Everything ``decide`` may know about the cluster at ``now_s``.

    ``nodes`` is the harvestable pool: idle nodes plus the nodes malleable
    jobs hold now.  Jobs are listed in admission (FIFO) order.
    """

    now_s: float
    nodes: tuple[Node, ...]
    jobs: tuple[JobState, ...]


class Direction(enum.Enum):
    """Which way a rescale went: ``up`` starts or grows a job, ``down`` shrinks it."""

    UP = "up"
    DOWN = "down"


class PauseKind(enum.Enum):
    """What a measured pause came from (issue #26).  ``start``, ``grow`` and ``shrink`` are
    changes the daemon made; ``preemption`` is a node taken from a running job by someone else
    (Slurm, for a primary job, mostly): its member was signalled and left at a step boundary;
    ``loss`` is a member that vanished unannounced (``kill -9``, a dead node), found by a timeout.

    A job that restarts on every change pays one restart whatever the kind: its starts and grows
    are one pause (``up``), its shrinks and preemptions another (``down``).  Only an elastic group,
    which re-forms in place, pays each kind its own price (:mod:`malletrain.jpa.rescale`)."""

    START = "start"
    GROW = "grow"
    SHRINK = "shrink"
    PREEMPTION = "preemption"
    LOSS = "loss"

    @property
    def direction(self) -> Direction:
        return Direction.UP if self in (PauseKind.START, PauseKind.GROW) else Direction.DOWN


@dataclass(frozen=True)
class PauseSample:
    """One measured pause: from the moment a job was told to change size (or lost a node) to
    its first step at the new size (a restart included, where the job restarts)."""

    job_id: str
    kind: PauseKind
    pause_s: float
    t_s: float

    @property
    def direction(self) -> Direction:
        return self.kind.direction


@dataclass(frozen=True)
class RescaleCost:
    """The pauses ``decide`` charges a job: learned once measured, the configured (user's) guess
    before; ``up_n``/``down_n`` measurements behind each.

    ``up_s`` is a start's pause and ``down_s`` a shrink's.  A job that restarts on every change
    pays them for a grow and for a node taken back too.  An elastic group (issue #26) has its
    own ``grow_s`` and ``preemption_s`` (None: as the restart), and its ``loss_s`` (a member lost
    unannounced), which is shown but not charged: the core forecasts no failures."""

    up_s: float
    down_s: float
    up_n: int = 0
    down_n: int = 0
    grow_s: float | None = None
    preemption_s: float | None = None
    loss_s: float | None = None
    grow_n: int = 0
    preemption_n: int = 0
    loss_n: int = 0

    @property
    def grow_pause_s(self) -> float:
        """What growing a running job costs."""
        return self.up_s if self.grow_s is None else self.grow_s

    @property
    def taken_pause_s(self) -> float:
        """What a node taken back (a preemption that leaves the job running) costs."""
        return self.down_s if self.preemption_s is None else self.preemption_s

    @property
    def source(self) -> str:
        counts = (self.up_n, self.down_n, self.grow_n, self.preemption_n, self.loss_n)
        if not any(counts):
            return "configured"
        if self.grow_s is None:
            return f"learned ({self.up_n} up, {self.down_n} down)"
        return (f"learned in place ({self.up_n} start, {self.grow_n} grow, {self.down_n} shrink, "
                f"{self.preemption_n} preemption, {self.loss_n} loss)")


@dataclass(frozen=True)
class Stay:
    """A harvestable node's predicted idle time over the objective's horizon H."""

    fraction: float      # E[min(remaining idle time, H)] / H: the share of the horizon it stays
    leave_p: float       # P(taken back within H)


STAYING = Stay(1.0, 0.0)


@dataclass(frozen=True)
class Outlook:
    """Predictions the shell hands ``decide`` beside the snapshot (pure values, no models):
    learned rescale costs per job, predicted stays per node, and the promise campaign trials
    report.  A job or node missing here falls back to its spec's pauses or to 'stays the whole
    horizon' (and a job without a promise counts 1)."""

    costs: Mapping[str, RescaleCost] = field(default_factory=dict)
    stays: Mapping[str, Stay] = field(default_factory=dict)
    # jobs found sensitive to slow nodes / to spanning topology groups (placement favours them)
    sensitive: Mapping[str, float] = field(default_factory=dict)
    # what a campaign trial's own study says of it (its job's ``metric`` records, bounded): 1 = no
    # evidence, η^k = it survived k halvings; it only re-splits its owner's nodes among the owner's jobs
    promise: Mapping[str, float] = field(default_factory=dict)


NO_OUTLOOK = Outlook()
MIN_PROMISE, MAX_PROMISE = 1e-3, 1e3    # a job's reported promise: the daemon reads none outside, decide clamps


@dataclass(frozen=True)
class Sample:
    """One throughput measurement a job reported: the JPA's input."""

    job_id: str
    nodes: int
    samples_per_s: float
    t_s: float
    slowdown: float = 1.0     # the slowest of its nodes (Node.variability): a site/Slurm fact, not the job's
    groups: int = 1           # topology groups its nodes span


@dataclass(frozen=True)
class CurvePoint:
    mean: float
    low: float
    high: float


@dataclass(frozen=True)
class Curve:
    """Predicted throughput (samples/s) per candidate node count.

    ``probe`` is set while the JPA still needs a measurement: the count the
    job should run at next when nodes are scarce.  ``probes`` (ascending, ``probe``
    among them) are all the counts a measurement is wanted at and ``measured`` the
    counts measured already: where nodes are plentiful the decision probes at the
    largest wanted count the job's share reaches (``core.decide``).  ``source`` says
    where the numbers came from (``fit``, ``profile-prior``, ``oracle``…) and is
    quoted in reasons.
    """

    points: Mapping[int, CurvePoint]
    probe: int | None = None
    source: str = "fit"
    probes: tuple[int, ...] = ()
    measured: tuple[int, ...] = ()

    @property
    def wanted(self) -> tuple[int, ...]:
        """The counts a probe may be run at (``probes``, or just ``probe``)."""
        if self.probes:
            return self.probes
        return (self.probe,) if self.probe is not None else ()

    def mean(self, n: float) -> float:
        """Throughput at ``n`` nodes (a fractional count interpolates: an expected node count)."""
        return self.rate(n)

    @functools.cached_property
    def rate(self) -> Callable[[float], float]:
        """:meth:`mean` as one function made once per curve (the objective calls it a few dozen
        times per job and decision): a listed count is looked up (a float ``3.0`` finds the key
        ``3``: hash and == agree), any other is :func:`interpolate`'s arithmetic, inlined."""
        keys = sorted(self.points)
        values = [self.points[k].mean for k in keys]
        listed = dict(zip(keys, values))
        if not keys:
            return _zero_rate
        first_n, first_v, last_n, last_v = keys[0], values[0], keys[-1], values[-1]
        get, find = listed.get, bisect.bisect_left

        def rate(n: float) -> float:
            if n <= 0:
                return 0.0
            v = get(n)  # type: ignore[call-overload]
            if v is not None:
                return v
            if n <= first_n:
                return first_v * n / first_n
            if n >= last_n:
                return last_v
            i = find(keys, n)
            w = (n - keys[i - 1]) / (keys[i] - keys[i - 1])
            return values[i - 1] * (1 - w) + values[i] * w
        return rate


@dataclass(frozen=True)
class Action:
    """One job's change this cycle, with the reason: a code and the detail an operator reads."""

    job_id: str
    kind: ActionKind
    from_nodes: tuple[str, ...]
    to_nodes: tuple[str, ...]
    reason: str
    code: ReasonCode


@dataclass(frozen=True)
class Plan:
    """The output of ``decide``: where every admitted job runs, and why."""

    now_s: float
    allocations: Mapping[str, tuple[str, ...]]
    actions: tuple[Action, ...]
    objective: float = 0.0
    solver: str = ""
    notes: tuple[str, ...] = field(default=())

    def changes(self) -> tuple[Action, ...]:
        return tuple(a for a in self.actions
                     if a.kind not in (ActionKind.KEEP, ActionKind.WAIT))
