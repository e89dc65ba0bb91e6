"""The simulated backend: a cluster driven by a trace, jobs by ground truth.

Semantics (issue #2 / DESIGN.md):
* progress uses each job's true throughput at its node count; a job makes no
  progress while paused;
* starting or growing pauses a job for ``rescale_up_s``, shrinking for
  ``rescale_down_s``;
* a node taken back by the primary scheduler shrinks its job at once, or
  stops it if it falls below ``min_nodes`` — a preemption; the job's pause
  (``rescale_down_s`` at its old rate) is counted as lost work;
* a job completes when its ``work`` is done, or ends early when a campaign's pruner stops it
  (:meth:`SimCluster.end`: its nodes free at once);
* every pause (start, grow, shrink, preemption) is measured by the job and
  reported with its kind once it is over (:meth:`SimCluster.pauses`), with the
  same relative noise as its throughput samples: the rescale-cost learner's
  input (an elastic job's move, a shrink and a grow at once, is not reported:
  the daemon does not measure a mixed change either).
* elastic jobs (issue #26; ``elastic=(grow_s, shrink_s)``): a shrink or a preemption that leaves a
  job running pauses it ``shrink_s`` (its members re-form in place); a grow pauses the survivors
  ``grow_s`` and the new nodes do no work for the joiners' ``rescale_up_s`` (they start their
  processes while the others train on), applied as the pause at the new rate that loses the same
  samples, ``grow_s + rescale_up_s * (new - old) / new``; a start from no nodes is a restart, as today.
The pauses the sim applies are the workload's (``true_up_s``/``true_down_s``);
the job's :class:`JobSpec` carries what the policy is told (the truth, or a
guess it must learn from).
The replay driver moves the clock; ``observe``/``apply`` are the backend
protocol and ``poll`` the metrics-source protocol the shared cycle uses.
"""
from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from malletrain.core.backend import JobFacts, Observation
from malletrain.domain.model import (
    DEFAULT_NODE_TYPE,
    Action,
    ActionKind,
    JobSpec,
    JobState,
    Node,
    PauseKind,
    PauseSample,
    Sample,
    Snapshot,
)


@dataclass
class SimJob:
    spec: JobSpec
    truth: Callable[[int], float]
    work: float
    done: float = 0.0
    nodes: list[str] = field(default_factory=list)
    paused_until: float = 0.0
    last_change: float | None = None
    rate: float = 0.0
    completed_at: float | None = None
    preemptions: int = 0
    rescales: int = 0
    true_up_s: float = 0.0
    true_down_s: float = 0.0
    admitted_at: float = 0.0
    first_start: float | None = None
    node_s: float = 0.0            # node-seconds it held
    starved_s: float = 0.0         # this stretch without nodes, counted while other jobs held nodes
    max_starved_s: float = 0.0
    sensitivity: float = 0.0       # true slowdown exponent on slow nodes (the workload's)
    topology_penalty: float = 0.0  # true share lost per extra topology group


@dataclass
class Counters:
    allocated_node_s: float = 0.0
    lost_samples: float = 0.0
    pause_samples: float = 0.0
    rescales: int = 0
    starts: int = 0
    stops: int = 0
    preemptions: int = 0


class SimCluster:
    """State of the simulated cluster; implements the backend protocol."""

    def __init__(self, node_names: Sequence[str], initial_busy: Iterable[bool],
                 now_s: float, *, seed: int = 0, noise: float = 0.0,
                 node_info: Mapping[str, tuple[str, float]] | None = None,
                 elastic: tuple[float, float] | None = None) -> None:
        self.now = now_s
        self.elastic = elastic          # (grow_s, shrink_s): every job rescales in place
        self.node_info = dict(node_info or {})     # node -> (topology group, slowdown)
        self.busy = {n: bool(b) for n, b in zip(node_names, initial_busy)}
        self.pool: dict[str, Node] = {n: self._node(n) for n, b in self.busy.items() if not b}
        self.holder: dict[str, str] = {}
        self.jobs: dict[str, SimJob] = {}       # admitted, not completed (FIFO order)
        self.done_jobs: dict[str, SimJob] = {}
        self.done_order: list[str] = []         # done_jobs' keys in the order they finished
        self.counters = Counters()
        self.rng = random.Random(seed)
        self.pause_rng = random.Random(seed + 7919)   # its own stream: pauses never shift the samples' noise
        self.noise = noise
        self._samples: list[Sample] = []
        self._pauses: list[tuple[float, PauseSample]] = []   # (when it is over, the measurement)
        self._finished: list[str] = []
        self.generation = 0   # bumped by every change decide() could see
        self.promise: dict[str, float] = {}   # what campaign trials report of themselves (a driver sets it)
        self._pool_nodes: tuple[Node, ...] | None = None   # tuple(pool.values()) while the pool is unchanged

    def _node(self, name: str, window_end_s: float | None = None) -> Node:
        group, slowdown = self.node_info.get(name, ("", 1.0))
        return Node(name, group=group, window_end_s=window_end_s, variability=slowdown)

    def _rate(self, job: SimJob) -> float:
        """The job's true rate on its nodes: its curve, slowed by its slowest node as far as it is
        sensitive, and by each extra topology group it spans."""
        n = len(job.nodes)
        if n == 0:
            return 0.0
        rate = job.truth(n)
        if self.node_info and (job.sensitivity or job.topology_penalty):
            info = [self.node_info.get(x, ("", 1.0)) for x in job.nodes]
            rate *= max(sd for _, sd in info) ** (-job.sensitivity)
            rate *= (1.0 - job.topology_penalty) ** (len({g for g, _ in info}) - 1)
        return rate

    # -- clock -----------------------------------------------------------
    def advance(self, t: float) -> None:
        """Run every job forward from ``self.now`` to ``t``."""
        dt = t - self.now
        if dt < 0:
            raise ValueError(f"time went backwards: {t} < {self.now}")
        running = sum(1 for job in self.jobs.values() if job.nodes)
        if running and running < len(self.jobs):      # some wait while others run
            for job in self.jobs.values():
                if not job.nodes:
                    job.starved_s += dt
                    job.max_starved_s = max(job.max_starved_s, job.starved_s)
        for job in self.jobs.values():
            if job.nodes:
                self.counters.allocated_node_s += len(job.nodes) * dt
                job.node_s += len(job.nodes) * dt
                run = t - max(self.now, job.paused_until)
                if run > 0:
                    job.done = min(job.work, job.done + job.rate * run)
        self.now = t

    def next_completion(self) -> float:
        best = math.inf
        for job in self.jobs.values():
            if job.nodes and job.rate > 0:
                t = max(self.now, job.paused_until) + (job.work - job.done) / job.rate
                best = min(best, t)
        return best

    def complete_due(self) -> list[str]:
        out = []
        for jid, job in list(self.jobs.items()):
            # Within 1 ms of work counts as done: epoch-sized clocks cannot
            # resolve smaller steps, and the loop would not advance.
            if job.work - job.done <= max(1e-9 * job.work, job.rate * 1e-3):
                self._retire(jid)
                out.append(jid)
        return out

    def end(self, jid: str) -> None:
        """The job ends on its own before its work is done (a campaign's pruner stopped it): its
        nodes are free at once, nothing is lost, it is not run again."""
        self._retire(jid)

    def _retire(self, jid: str) -> None:
        """The job leaves now (done or ended): its nodes are free, it joins ``done_jobs``."""
        job = self.jobs.pop(jid)
        job.completed_at = self.now
        self.generation += 1
        self._release(job)
        self.promise.pop(jid, None)
        self.done_jobs[jid] = job
        self.done_order.append(jid)
        self._finished.append(jid)

    # -- primary workload ------------------------------------------------
    def set_node(self, name: str, busy: bool, window_end_s: float | None = None) -> str | None:
        """Apply one trace event; returns the job id it preempted, if any."""
        self.generation += 1
        self.busy[name] = busy
        self._pool_nodes = None
        if not busy:
            self.pool[name] = self._node(name, window_end_s)
            return None
        self.pool.pop(name, None)
        jid = self.holder.pop(name, None)
        if jid is None:
            return None
        job = self.jobs[jid]
        job.nodes.remove(name)
        return jid

    def reveal(self, name: str, window_end_s: float) -> None:
        """An idle (or harvested) node's next busy time becomes known, as a planned start would."""
        if name in self.pool:
            self.generation += 1
            self._pool_nodes = None
            self.pool[name] = self._node(name, window_end_s)

    def settle_preemptions(self, hit: dict[str, int]) -> None:
        """Shrink or stop each job that lost ``hit[job]`` nodes at this instant."""
        self.generation += 1
        for jid in hit:
            job = self.jobs[jid]
            old_rate = job.rate                       # its rate before the loss
            self.counters.preemptions += 1
            job.preemptions += 1
            down = self.elastic[1] if self.elastic and job.nodes else job.true_down_s
            self.counters.lost_samples += down * old_rate
            if len(job.nodes) >= job.spec.min_nodes:
                job.paused_until = max(job.paused_until, self.now + down)
                self._pause(jid, PauseKind.PREEMPTION, down)
            else:
                self._release(job)
            job.rate = self._rate(job)
            job.last_change = self.now

    # -- jobs ---------------------------------------------------------------
    def admit(self, spec: JobSpec, truth: Callable[[int], float], work: float,
              true_pauses: tuple[float, float] | None = None, sensitivity: float = 0.0,
              topology_penalty: float = 0.0) -> None:
        """A job joins; ``true_pauses`` (up, down) default to the spec's."""
        self.generation += 1
        up, down = true_pauses if true_pauses is not None else (spec.rescale_up_s, spec.rescale_down_s)
        self.jobs[spec.job_id] = SimJob(spec, truth, work, true_up_s=up, true_down_s=down,
                                        admitted_at=self.now, last_change=self.now, sensitivity=sensitivity,
                                        topology_penalty=topology_penalty)

    def _elastic_pause(self, job: SimJob, old_rate: float, up: bool, added: int) -> float:
        """An elastic job's pause for a change from a running size (module docstring).  A move
        (as many nodes, ``added`` of them new) is a shrink and a grow whose joiners' start idles
        their share of the nodes."""
        assert self.elastic is not None
        grow_s, shrink_s = self.elastic
        if up:
            gain = max(0.0, job.rate - old_rate) / job.rate if job.rate > 0 else 0.0
            return grow_s + job.true_up_s * gain
        if added:
            return shrink_s + grow_s + job.true_up_s * added / max(1, len(job.nodes))
        return shrink_s

    def _pause(self, jid: str, kind: PauseKind, pause_s: float) -> None:
        """The job will measure this pause once it is over."""
        x = pause_s * (1.0 + self.noise * self.pause_rng.gauss(0.0, 1.0)) if self.noise and pause_s > 0 else pause_s
        self._pauses.append((self.now + pause_s, PauseSample(jid, kind, max(0.0, x), self.now + pause_s)))

    def report_samples(self) -> None:
        """Every running, unpaused job reports its current throughput."""
        for jid, job in self.jobs.items():
            if job.nodes and job.paused_until <= self.now and job.rate > 0:
                x = job.rate * (1.0 + self.noise * self.rng.gauss(0.0, 1.0)) if self.noise else job.rate
                self._samples.append(Sample(jid, len(job.nodes), max(x, 1e-9), self.now))

    def _release(self, job: SimJob) -> None:
        """Give back every node the job holds."""
        for name in job.nodes:
            self.holder.pop(name, None)
        job.nodes.clear()

    def check(self) -> None:
        """Raise AssertionError unless the holder map and job node lists agree."""
        seen: dict[str, str] = {}
        for jid, job in self.jobs.items():
            for n in job.nodes:
                assert n not in seen, f"{n} held by {seen[n]} and {jid}"
                seen[n] = jid
                assert n in self.pool and not self.busy[n], f"{jid} holds busy node {n}"
                assert job.spec.min_nodes <= len(job.nodes) <= job.spec.max_nodes, jid
        assert seen == self.holder, "holder map out of sync with job node lists"

    # -- backend and metrics-source protocols ------------------------------
    def observe(self) -> Observation:
        jobs = tuple(JobState(j.spec, tuple(j.nodes), DEFAULT_NODE_TYPE if j.nodes else None,
                              j.paused_until, j.last_change) for j in self.jobs.values())
        elastic = self.elastic is not None       # every job re-forms in place, its pauses learned per kind
        facts = {jid: JobFacts(j.spec.profile, elastic=elastic) for jid, j in self.jobs.items()}
        if self._pool_nodes is None:    # the same tuple while the pool is the same: the core's caches key on it
            self._pool_nodes = tuple(self.pool.values())
        obs = Observation(Snapshot(self.now, self._pool_nodes, jobs),
                          tuple(self._finished), facts, self.generation)
        self._finished = []
        return obs

    def poll(self, observation: Observation) -> tuple[Sample, ...]:
        """The samples :meth:`report_samples` collected since the last poll."""
        out, self._samples = tuple(self._samples), []
        return out

    def promises(self) -> dict[str, float]:
        """The promise each admitted job reported last (set by a campaign driver)."""
        return {j: p for j, p in self.promise.items() if j in self.jobs}

    def pauses(self) -> tuple[PauseSample, ...]:
        """The pauses that ended by now (a job measures its pause when it resumes)."""
        if not self._pauses:
            return ()
        ready = tuple(p for t, p in self._pauses if t <= self.now and p.job_id in self.jobs)
        self._pauses = [(t, p) for t, p in self._pauses if t > self.now and p.job_id in self.jobs]
        return ready

    def apply(self, actions: Sequence[Action]) -> None:
        """Release every node the plan takes away, then hand out new ones."""
        if actions:
            self.generation += 1
        for a in actions:
            for n in self.jobs[a.job_id].nodes:
                if n not in a.to_nodes and self.holder.get(n) == a.job_id:
                    del self.holder[n]
        for a in actions:
            job = self.jobs[a.job_id]
            old = len(job.nodes)
            for n in a.to_nodes:
                owner = self.holder.get(n)
                if n not in self.pool:
                    raise ValueError(f"apply: node {n} for {a.job_id} is busy (primary job)")
                if owner not in (None, a.job_id):
                    raise ValueError(f"apply: node {n} for {a.job_id} is still held by {owner}")
                self.holder[n] = a.job_id
            old_rate = job.rate
            job.nodes = list(a.to_nodes)
            if job.nodes:
                job.starved_s = 0.0
            job.rate = self._rate(job)
            job.last_change = self.now
            if a.kind == ActionKind.STOP:
                self.counters.stops += 1
                continue
            up = len(job.nodes) > old
            added = len(set(a.to_nodes) - set(a.from_nodes))
            pause = self._elastic_pause(job, old_rate, up, added) if self.elastic and old else \
                job.true_up_s if up else job.true_down_s
            if a.kind == ActionKind.START:
                self.counters.starts += 1
                if job.first_start is None:
                    job.first_start = self.now
            else:
                self.counters.rescales += 1
                job.rescales += 1
            self.counters.pause_samples += pause * old_rate
            job.paused_until = max(job.paused_until, self.now + pause)
            if self.elastic and old and len(job.nodes) == old:
                continue        # a move re-forms as a mixed change, which the daemon does not measure either
            self._pause(a.job_id, (PauseKind.GROW if old else PauseKind.START) if up else PauseKind.SHRINK, pause)
