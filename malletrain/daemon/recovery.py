"""The safety net: no malleable job is lost, hung jobs restart, bad nodes rest.

Pure bookkeeping (no I/O, no clock: ``now`` comes in); the daemon feeds it
what Slurm and the progress files said this cycle and carries out its
decisions through the backend's verified writes.

State table of a tagged job that Slurm reports as ended:

=====================================  ===========================================
Slurm state / last progress record     what happens
=====================================  ===========================================
any, and an ``exit`` record with       finished: nothing to do
``reason`` done, pruned or failed
(but FAILED after ``done``: below)
CANCELLED                              its owner (or an admin) cancelled it: left
DEADLINE                               its owner's ``--deadline`` passed: left (a
                                       requeued run would be cancelled again)
REVOKED                                a federation sibling runs it: left
SPECIAL_EXIT                           requeued held by the site's epilog on an exit
                                       code it singles out: left for its owner
COMPLETED, no progress file (none      finished as far as anyone can tell: left
named, or it never wrote one)
PREEMPTED (``PreemptMode=CANCEL``:     taken by a primary job, no fault of its own:
Slurm cancelled it for a primary job)  requeued held at once, same job id; not a
                                       failure, no strike against its nodes
anything else (FAILED, TIMEOUT,        lost work: requeued held at once, same job id,
NODE_FAIL, BOOT_FAIL, OUT_OF_MEMORY,   started again no earlier than ``retry_backoff_s``
COMPLETED without ``done``, FAILED     later (doubling per failure), up to
after ``done``: its process exited
non-zero after writing it, …)
                                       ``max_failures`` times; then held for good with
                                       the reason (``status``/``explain``)
=====================================  ===========================================

The requeue is never delayed: slurmctld forgets an ended job ``MinJobAge`` after it ended (some
sites set seconds), and a job left ended through its back-off could be purged and lost.  The
back-off delays the next start instead (``retry_at``: the backend leaves a held job out of the
decision until then).

These are all of Slurm's terminal job states (``squeue --help``: BOOT_FAIL, CANCELLED,
COMPLETED, DEADLINE, FAILED, NODE_FAIL, OUT_OF_MEMORY, PREEMPTED, REVOKED, SPECIAL_EXIT,
TIMEOUT); a state word not among them is treated as lost work, never as finished.

A running job that has reported progress since it last started and then
reports nothing for ``max(hang_floor_s, hang_factor x its step time)`` is
hung: requeued held (it counts as a failure).  Every failure or hang is a
strike against the nodes the job ran on; a node with ``node_strikes`` strikes
within ``node_cooldown_s`` is left out of harvesting for ``node_cooldown_s``
(the daemon never drains nodes: Slurm still runs primary jobs there), as long
as at most ``max_excluded_share`` of the partition rests at once: strikes come
from jobs any user controls, so one user's failing jobs cannot empty the pool.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

RETRY = "retry"
GIVE_UP = "give-up"
LEFT_ALONE = frozenset({"CANCELLED", "DEADLINE", "REVOKED", "SPECIAL_EXIT"})   # someone chose this end
PREEMPTED = "PREEMPTED"     # cancelled by Slurm for a primary job (PreemptMode=CANCEL)


@dataclass(frozen=True)
class RecoveryConfig:
    max_failures: int = 3
    retry_backoff_s: float = 10.0
    retry_backoff_max_s: float = 120.0
    hang_floor_s: float = 600.0
    hang_factor: float = 10.0
    node_strikes: int = 3
    node_cooldown_s: float = 1800.0
    max_excluded_share: float = 0.25   # at most this share of the partition rests at once


@dataclass(frozen=True)
class Ended:
    """A tagged job Slurm reports as ended, and what its progress file said."""

    state: str                      # Slurm's state word
    done: bool | None               # a final ``done`` record was read; None: no progress file
    nodes: tuple[str, ...] = ()     # where it ran last
    after_done: bool = False        # FAILED after a ``done`` record (``done`` is then False)


@dataclass(frozen=True)
class Running:
    nodes: tuple[str, ...]
    last_progress_s: float | None   # daemon clock when its file last grew
    step_s: float = 0.0             # its recent step time (from its records, bounded)


@dataclass(frozen=True)
class Decision:
    job_id: str
    kind: str                       # RETRY or GIVE_UP: both requeue the job held
    reason: str


@dataclass
class Recovery:
    config: RecoveryConfig = field(default_factory=RecoveryConfig)
    failures: dict[str, int] = field(default_factory=dict)
    retry_at: dict[str, float] = field(default_factory=dict)     # requeued; not started before
    given_up: dict[str, str] = field(default_factory=dict)
    handled: set[str] = field(default_factory=set)
    since: dict[str, tuple[tuple[str, ...], float]] = field(default_factory=dict)
    strikes: dict[str, list[float]] = field(default_factory=dict)
    excluded: dict[str, tuple[float, str]] = field(default_factory=dict)   # node -> (until, why)
    not_excluded: int = 0       # nodes with enough strikes kept in harvesting: the share was reached
    pool_size: int = 0          # nodes in the partition (this cycle)

    def step(self, now: float, ended: Mapping[str, Ended], running: Mapping[str, Running],
             present: Iterable[str], pool_size: int = 0) -> list[Decision]:
        """This cycle's requeues; updates the excluded nodes (``pool_size``: the partition's
        node count, which bounds how many may rest at once)."""
        self.pool_size = pool_size
        present = set(present)
        for table in (self.failures, self.retry_at, self.given_up, self.since):
            for job in [j for j in table if j not in present]:
                del table[job]
        self.handled &= set(ended)
        out: list[Decision] = []
        for job, e in sorted(ended.items()):
            if job in self.handled:
                continue
            self.handled.add(job)
            why = self._lost(e)
            if why is None:
                continue
            if e.state == PREEMPTED:        # the infrastructure's doing: run it again, no strike
                self.retry_at.pop(job, None)
                out.append(Decision(job, RETRY, f"{why} (Slurm cancelled it for a primary job); requeued, "
                                                "not counted as a failure"))
            else:
                out += self._failed(job, now, why, e.nodes, ended=True)
        for job, when in list(self.retry_at.items()):
            if when <= now:
                del self.retry_at[job]
        for job, r in sorted(running.items()):
            seen = self.since.get(job)
            if seen is None or seen[0] != r.nodes:
                self.since[job] = (r.nodes, now)
                continue
            started = seen[1]
            if r.last_progress_s is None or r.last_progress_s <= started:
                continue        # has not reported in this run: no yardstick
            limit = max(self.config.hang_floor_s, self.config.hang_factor * r.step_s)
            quiet = now - r.last_progress_s
            if quiet > limit:
                self.since.pop(job, None)
                why = (f"hung: no progress record for {quiet:.0f}s (limit {limit:.0f}s = "
                       f"max(hang_floor_s, {self.config.hang_factor:g} x step time {r.step_s:.2f}s))")
                out += self._failed(job, now, why, r.nodes, ended=False)
        for job in [j for j in self.since if j not in running]:
            del self.since[job]
        for node, (until, _) in list(self.excluded.items()):
            if until <= now:
                del self.excluded[node]
        return out

    @staticmethod
    def _lost(e: Ended) -> str | None:
        if e.done:
            return None
        if e.state in LEFT_ALONE:
            return None
        if e.state == "COMPLETED" and e.done is None:
            return None
        if e.after_done:
            return (f"ended {e.state} after its final 'done' record: its process exited non-zero after writing it "
                    "(the script's own last lines failed)")
        return f"ended {e.state} without a final result"

    def _failed(self, job: str, now: float, why: str, nodes: tuple[str, ...], *, ended: bool) -> list[Decision]:
        n = self.failures.get(job, 0) + 1
        self.failures[job] = n
        self._strike(nodes, now, f"job {job} {why}")
        if n > self.config.max_failures:
            reason = f"{why}; failed {n} times (max_failures {self.config.max_failures}): held for its owner"
            self.given_up[job] = reason
            self.retry_at.pop(job, None)
            return [Decision(job, GIVE_UP, reason)]
        delay = min(self.config.retry_backoff_max_s, self.config.retry_backoff_s * 2 ** (n - 1))
        reason = f"{why}; requeued (failure {n} of at most {self.config.max_failures})"
        if ended and delay > 0:
            self.retry_at[job] = now + delay
            reason += f", started again after {delay:g}s at the earliest"
        return [Decision(job, RETRY, reason)]

    def _strike(self, nodes: Iterable[str], now: float, why: str) -> None:
        window = self.config.node_cooldown_s
        for node in nodes:
            hits = [t for t in self.strikes.get(node, []) if now - t < window] + [now]
            self.strikes[node] = hits[-self.config.node_strikes:]
            if len(hits) >= self.config.node_strikes and node not in self.excluded:
                if len(self.excluded) >= self._max_excluded():
                    self.not_excluded += 1      # one user's failing jobs cannot empty the partition
                    continue
                self.excluded[node] = (now + window, f"{len(hits)} malleable-job failures or hangs "
                                                     f"within {window:.0f}s, last: {why}")
                self.strikes[node] = []

    def _max_excluded(self) -> int:
        if self.pool_size <= 0:
            return 1 << 30
        return max(1, int(self.config.max_excluded_share * self.pool_size))

    # persistence (the daemon's store keeps it)
    def dump(self) -> dict[str, Any]:
        return {"failures": self.failures, "retry_at": self.retry_at, "given_up": self.given_up,
                "handled": sorted(self.handled), "strikes": self.strikes,
                "excluded": {n: list(v) for n, v in self.excluded.items()}}

    def load(self, data: Mapping[str, Any]) -> None:
        self.failures = {str(k): int(v) for k, v in data.get("failures", {}).items()}
        self.retry_at = {str(k): float(v) for k, v in data.get("retry_at", {}).items()}
        self.given_up = {str(k): str(v) for k, v in data.get("given_up", {}).items()}
        self.handled = {str(j) for j in data.get("handled", [])}
        self.strikes = {str(k): [float(t) for t in v] for k, v in data.get("strikes", {}).items()}
        self.excluded = {str(k): (float(v[0]), str(v[1])) for k, v in data.get("excluded", {}).items()}
