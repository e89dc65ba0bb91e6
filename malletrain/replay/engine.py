"""Replay: run the decision core over a recorded primary workload.

Decisions happen at every node event (events at one instant are batched),
job arrival and completion, and at least every ``interval_s``; each one is
the shared :func:`malletrain.core.cycle.run_cycle` against :class:`malletrain.replay.sim.SimCluster`.
Results go to ``OUT/summary.json``, ``OUT/timeline.csv`` and PNG plots,
written to a temporary directory first and moved into place at the end, so a
failed run leaves nothing half-written.
"""
from __future__ import annotations

import csv
import heapq
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from malletrain.core.curves import CurveSource
from malletrain.core.cycle import CycleMemo, run_cycle
from malletrain.core.forecast import ForecastSource
from malletrain.domain.config import MAX_SECONDS, CoreConfig
from malletrain.domain.errors import InputError
from malletrain.domain.model import JobSpec, RescaleCost
from malletrain.domain.stats import jain, percentile
from malletrain.replay.sim import SimCluster
from malletrain.replay.summary import ReplaySummary, write_summary
from malletrain.replay.traces import NodeTrace
from malletrain.replay.workload import WorkloadJob

GUESSING_POLICIES = ("malletrain", "bftrainer-guess")   # told a guess of the pauses, not the workload's


@dataclass(frozen=True)
class ReplayOptions:
    core: CoreConfig = field(default_factory=CoreConfig)
    interval_s: float = 30.0
    max_jobs: int | None = None
    seed: int = 0
    noise: float = 0.0
    quiet: bool = True
    check_invariants: bool = False   # verify simulator state after every cycle (tests)
    # what the learning policies are told of every job's (up, down) pauses; None: the workload's
    rescale_guess: tuple[float, float] | None = (30.0, 10.0)
    # hand each idle node its true next busy time (a look-ahead no real scheduler has: off)
    window_oracle: bool = False
    # hand each idle node its true next busy time this many seconds before it comes, as Slurm's
    # planned start of a pending job on it would (a scenario for what live planning buys; None: off)
    planned_lead_s: float | None = None
    # node -> (topology group, slowdown): the site's per-node facts (nodes.py; none: all alike)
    node_info: Mapping[str, tuple[str, float]] | None = None
    # every job rescales in place (issue #26): (grow_s, shrink_s) survivors' pauses (sim.py); None: restarts
    elastic: tuple[float, float] | None = None


class Unfolding(Protocol):
    """A workload that unfolds as the replay runs (a campaign: each trial is asked when a slot
    frees, a pruner ends trials early).  :meth:`step` is called at every instant the replay
    stops at, after completions and node events and before admissions: it may end jobs
    (``sim.end``), set their promise (``sim.promise``) and returns the jobs submitted now.
    :meth:`next_s` is the next instant it needs to look (a trial reaching a rung), ``over``
    ends the replay."""

    over: bool

    def step(self, sim: SimCluster, t: float) -> Sequence[WorkloadJob]: ...

    def next_s(self, sim: SimCluster) -> float: ...


@dataclass
class ReplayResult:
    summary: ReplaySummary
    timeline: list[tuple]
    progress: dict[str, list[tuple[float, float]]]
    jobs: list[dict]


def node_order(trace: NodeTrace) -> np.ndarray:
    """Event indices grouped by node, time order kept within each node."""
    return np.argsort(trace.node_idx, kind="stable")


def idle_levels(trace: NodeTrace, order: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The number of idle nodes over the trace window, as a step function: ``(times, levels)``,
    ``levels[i]`` nodes idle from ``times[i]`` to ``times[i + 1]`` (``len(times) == len(levels) + 1``;
    vectorised).

    An event counts only when it flips its node's state; ``order`` is :func:`node_order` if the
    caller has it already.
    """
    n0 = int((~trace.initial_busy).sum())
    if trace.n_events == 0:
        return np.array([trace.start_s, trace.end_s]), np.array([float(n0)])
    order = node_order(trace) if order is None else order
    idx_sorted = trace.node_idx[order]
    busy_sorted = trace.busy[order]
    first = np.ones(len(order), dtype=bool)
    first[1:] = idx_sorted[1:] != idx_sorted[:-1]
    prev = np.empty_like(busy_sorted)       # the node's state before each event
    prev[1:] = busy_sorted[:-1]
    prev[first] = trace.initial_busy[idx_sorted[first]]
    delta = np.zeros(trace.n_events)
    delta[order] = np.where(busy_sorted, -1.0, 1.0) * (busy_sorted != prev)
    levels = np.concatenate([[n0], n0 + np.cumsum(delta)])
    times = np.concatenate([[trace.start_s], trace.times, [trace.end_s]])
    return times, levels


def idle_node_seconds(trace: NodeTrace, order: np.ndarray | None = None) -> float:
    """∫ number of idle nodes dt over the trace window (:func:`idle_levels`)."""
    times, levels = idle_levels(trace, order)
    return float(np.sum(levels * np.diff(times)))


def _window_ends(trace: NodeTrace, order: np.ndarray) -> np.ndarray:
    """For each event, when that node's next event happens (inf if none)."""
    idx_sorted = trace.node_idx[order]
    nxt_sorted = np.full(len(order), np.inf)
    nxt_sorted[:-1] = np.where(idx_sorted[1:] == idx_sorted[:-1], trace.times[order][1:], np.inf)
    nxt = np.empty(trace.n_events)
    nxt[order] = nxt_sorted
    return nxt


class _Progress:
    def __init__(self, total: float, quiet: bool) -> None:
        self.bar = None
        if not quiet:
            from tqdm import tqdm
            self.bar = tqdm(total=round(total), unit="trace-s", unit_scale=True, file=sys.stderr,
                            desc="replay", mininterval=0.5, leave=True)
        self.done = 0.0

    def update(self, done: float, decisions: int) -> None:
        if self.bar is not None and done - self.done >= 1:
            self.bar.update(round(done) - round(self.done))
            self.done = done
            self.bar.set_postfix(decisions=decisions, refresh=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


MAX_TICKS = 10**8   # decision ticks a replay may need (trace span / interval): beyond, it would not end


def check_options(trace: NodeTrace, opts: ReplayOptions) -> None:
    """:class:`InputError` when ``opts`` cannot give a replay that ends (the CLI checks its flags
    first; this guards every caller)."""
    interval = opts.interval_s
    if not (isinstance(interval, (int, float)) and 0 < interval <= MAX_SECONDS):
        raise InputError(f"must be > 0 and <= {MAX_SECONDS:g} s, got {interval!r}", field="interval")
    ticks = (trace.end_s - trace.start_s) / interval
    if not ticks <= MAX_TICKS:
        raise InputError(f"the trace spans {trace.end_s - trace.start_s:.6g} s: deciding at least every "
                         f"{interval:g} s would take {ticks:.3g} decisions (at most {MAX_TICKS:.0e}); "
                         "use a larger --interval or a narrower --start/--end", path=trace.path,
                         field="interval")
    if not (isinstance(opts.noise, (int, float)) and 0 <= opts.noise <= 1):
        raise InputError(f"must be in [0, 1], got {opts.noise!r}", field="noise")
    lead = opts.planned_lead_s
    if lead is not None and not (isinstance(lead, (int, float)) and 0 <= lead <= MAX_SECONDS):
        raise InputError(f"must be >= 0 and <= {MAX_SECONDS:g} s, got {lead!r}", field="planned_lead")
    if opts.max_jobs is not None and opts.max_jobs < 1:
        raise InputError(f"must be >= 1, got {opts.max_jobs!r}", field="max_jobs")


def run_replay(trace: NodeTrace, workload: list[WorkloadJob], opts: ReplayOptions,
               unfolding: Unfolding | None = None) -> ReplayResult:
    check_options(trace, opts)
    wall0 = time.perf_counter()
    core = opts.core
    specs: dict[str, JobSpec] = {}
    truths: dict = {}
    works: dict[str, float] = {}
    pauses: dict[str, tuple[float, float]] = {}
    extra: dict[str, tuple[float, float]] = {}
    arrivals: list[JobSpec] = []
    guess = opts.rescale_guess if core.policy in GUESSING_POLICIES else None

    def register(w: WorkloadJob, t: float) -> JobSpec:
        up, down = guess if guess is not None else (w.rescale_up_s, w.rescale_down_s)
        spec = JobSpec(w.name, w.min_nodes, w.max_nodes, up, down,
                       w.profile, max(t, trace.start_s), w.name, w.user, w.work)
        specs[w.name], truths[w.name], works[w.name] = spec, w.truth, w.work
        pauses[w.name] = (w.rescale_up_s, w.rescale_down_s)
        extra[w.name] = (w.sensitivity, w.topology_penalty)
        return spec

    for w in workload:
        t = w.submit if w.submit_is_absolute else trace.start_s + w.submit
        spec = register(w, t)
        if t < trace.end_s:
            arrivals.append(spec)
    arrivals.sort(key=lambda s: (s.submit_s, s.job_id))
    sim = SimCluster(trace.nodes, trace.initial_busy, trace.start_s, seed=opts.seed, noise=opts.noise,
                     node_info=opts.node_info, elastic=opts.elastic)
    source = CurveSource(core, truths)
    forecast = ForecastSource(core, {j: RescaleCost(*p) for j, p in pauses.items()})
    order = node_order(trace)
    times, idxs, busy = trace.times, trace.node_idx, trace.busy
    names = trace.nodes
    windows = _window_ends(trace, order) if opts.window_oracle or opts.planned_lead_s is not None else None
    lead = math.inf if opts.window_oracle else (opts.planned_lead_s or 0.0)
    reveals: list[tuple[float, str, float]] = []    # (when, node, its window end): a heap

    def node_event(i: int) -> str | None:
        """Apply trace event ``i``; an idle node learns its window end now if it is ``lead`` or
        less away, else once it is (the job it preempted, if any)."""
        name, is_busy = names[idxs[i]], bool(busy[i])
        end = None
        if windows is not None and not is_busy:
            end = float(windows[i])
            if end - times[i] > lead:
                if math.isfinite(end):
                    heapq.heappush(reveals, (end - lead, name, end))
                end = None
        return sim.set_node(name, is_busy, end)

    n_ev, ev = len(times), 0
    a_i = 0
    waiting: list[JobSpec] = []
    decision_ms: list[float] = []
    timeline: list[tuple] = []
    progress: dict[str, list[tuple[float, float]]] = {}
    recorded = [0]      # finished jobs whose final progress is in ``progress``
    memo = CycleMemo()
    reused = 0
    notes: list[str] = []
    interval = opts.interval_s
    next_tick = trace.start_s
    row_every = max(interval, (trace.end_s - trace.start_s) / 20000.0)
    next_row = trace.start_s
    bar = _Progress(trace.end_s - trace.start_s, opts.quiet)
    t = trace.start_s
    try:
        while True:
            unfolds = unfolding is not None and not unfolding.over
            active = bool(sim.jobs) or bool(waiting) or unfolds
            if not active and a_i >= len(arrivals):
                break  # nothing left to schedule; idle_node_s is computed from the trace
            t_ev = times[ev] if ev < n_ev else math.inf
            t_arr = arrivals[a_i].submit_s if a_i < len(arrivals) else math.inf
            t_tick = next_tick if active else math.inf
            t_next = min(t_ev, t_arr, sim.next_completion(), t_tick)
            if unfolding is not None and unfolds:
                t_next = min(t_next, max(t, unfolding.next_s(sim)))
            if t_next >= trace.end_s:
                sim.advance(trace.end_s)
                break
            if not active and t_next > t:   # fast-forward the primary workload
                while ev < n_ev and times[ev] < t_arr:
                    node_event(ev)
                    ev += 1
                next_tick = t_arr
                sim.advance(t_arr)
                t = t_arr
                continue
            sim.advance(t_next)
            t = t_next
            sim.complete_due()
            hit: dict[str, int] = {}
            while ev < n_ev and times[ev] == t:
                jid = node_event(ev)
                if jid is not None:
                    hit[jid] = hit.get(jid, 0) + 1
                ev += 1
            if hit:
                sim.settle_preemptions(hit)
                if opts.check_invariants:
                    sim.check()
            while a_i < len(arrivals) and arrivals[a_i].submit_s <= t:
                waiting.append(arrivals[a_i])
                a_i += 1
            if unfolding is not None and unfolds:
                waiting.extend(register(w, t) for w in unfolding.step(sim, t))
                if unfolding.over:
                    break
            while waiting and (opts.max_jobs is None or len(sim.jobs) < opts.max_jobs):
                spec = waiting.pop(0)
                sim.admit(spec, truths[spec.job_id], works[spec.job_id], pauses[spec.job_id],
                          *extra[spec.job_id])
            while reveals and reveals[0][0] <= t:
                _, name, end = heapq.heappop(reveals)
                if end > t:          # still the idle stretch it was planned for
                    sim.reveal(name, end)
            if t >= next_tick:
                sim.report_samples()
                next_tick = trace.start_s + (math.floor((t - trace.start_s) / interval) + 1) * interval
            if sim.jobs:
                res = run_cycle(sim, sim, source, core, memo, forecast)
                if res.reused:
                    reused += 1
                else:
                    decision_ms.append(res.decision_ms)
                    notes.extend(res.plan.notes)
                if opts.check_invariants:
                    sim.check()
            if t >= next_row:
                _record(sim, t, timeline, progress, recorded)
                next_row = t + row_every
            bar.update(t - trace.start_s, len(decision_ms))
        _record(sim, sim.now, timeline, progress, recorded)
    finally:
        bar.close()
    return _result(trace, order, sim, source, opts, decision_ms, reused, notes, timeline, progress,
                   specs, works, time.perf_counter() - wall0, forecast, guess)


def _record(sim: SimCluster, t: float, timeline: list, progress: dict, final: list[int]) -> None:
    """One timeline row, and each job's progress where it moved.  A finished job's progress no
    longer moves: it is read once after it finished (``final[0]``: how many of ``sim.done_jobs``,
    in the order they finished, have been), not at every row."""
    alloc = sum(len(j.nodes) for j in sim.jobs.values())
    running = sum(1 for j in sim.jobs.values() if j.nodes)
    thr = sum(j.rate for j in sim.jobs.values() if j.nodes and j.paused_until <= t)
    timeline.append((t, len(sim.pool), alloc, running, thr))
    done = sim.done_jobs
    fresh = [(jid, done[jid]) for jid in sim.done_order[final[0]:]]
    final[0] = len(sim.done_order)
    for jid, j in list(sim.jobs.items()) + fresh:
        series = progress.setdefault(jid, [])
        frac = j.done / j.work
        if not series or series[-1][1] != frac:
            series.append((t, frac))


def _result(trace, order, sim, source, opts, decision_ms, reused, notes, timeline, progress, specs, works,
            wall_s, forecast, guess) -> ReplayResult:
    c = sim.counters
    idle = idle_node_seconds(trace, order)
    jobs = []
    jct: list[float] = []
    wait: list[float] = []
    node_s: dict[str, float] = {}
    never, starved = 0, 0.0
    core = opts.core
    for jid, spec in specs.items():
        j = sim.done_jobs.get(jid) or sim.jobs.get(jid)
        jobs.append({"job": jid, "user": spec.owner, "done": j.done if j else 0.0, "work": works[jid],
                     "submit_s": spec.submit_s - trace.start_s,
                     "first_start_s": (j.first_start - trace.start_s) if j and j.first_start is not None else None,
                     "completed_at_s": (j.completed_at - trace.start_s) if j and j.completed_at else None,
                     "preemptions": j.preemptions if j else 0, "rescales": j.rescales if j else 0,
                     "node_s": j.node_s if j else 0.0, "max_starved_s": j.max_starved_s if j else 0.0})
        if j is None:
            continue
        user = spec.owner or "\0" + jid
        node_s[user] = node_s.get(user, 0.0) + j.node_s / core.weight(spec.owner)
        starved = max(starved, j.max_starved_s)
        if j.completed_at is not None:
            jct.append(j.completed_at - spec.submit_s)
        if j.first_start is not None:
            wait.append(j.first_start - spec.submit_s)
        else:
            never += 1
    useful = sum(x["done"] for x in jobs)
    errors = forecast.learn_errors
    summary = ReplaySummary(
        policy=opts.core.policy,
        trace_span_s=trace.end_s - trace.start_s,
        nodes=len(trace.nodes),
        events=trace.n_events,
        idle_node_s=idle,
        allocated_node_s=c.allocated_node_s,
        harvested_fraction=c.allocated_node_s / idle if idle > 0 else 0.0,
        useful_samples=useful,
        lost_samples=c.lost_samples,
        rescale_pause_samples=c.pause_samples,
        jobs=len(specs),
        jobs_completed=len(sim.done_jobs),
        rescales=c.rescales,
        starts=c.starts,
        stops=c.stops,
        preemptions=c.preemptions,
        decisions=len(decision_ms),
        decisions_reused=reused,
        decision_ms_p50=percentile(decision_ms, 0.50),
        decision_ms_p95=percentile(decision_ms, 0.95),
        decision_ms_mean=statistics.fmean(decision_ms) if decision_ms else 0.0,
        jpa_rejected_samples=source.advisor.rejected,
        solver_notes=len(notes),
        solver_notes_first=tuple(notes[:5]),
        interval_s=opts.interval_s,
        horizon_s=opts.core.horizon_s,
        seed=opts.seed,
        noise=opts.noise,
        max_jobs=opts.max_jobs,
        wall_s=wall_s,
        objective=core.objective,
        progress_units=sum(x["done"] / x["work"] for x in jobs if x["work"] > 0),
        jct_mean_s=statistics.fmean(jct) if jct else 0.0,
        jct_p95_s=percentile(jct, 0.95),
        wait_mean_s=statistics.fmean(wait) if wait else 0.0,
        wait_p95_s=percentile(wait, 0.95),
        never_started=never,
        max_starved_s=starved,
        jain_users=jain(list(node_s.values())),
        users=len(node_s),
        rescale_learned=len(errors),
        rescale_error_p50=percentile(errors, 0.5),
        rescale_error_max=max(errors, default=0.0),
        rescale_guess=tuple(guess) if guess is not None else None,
        window_oracle=opts.window_oracle,
        planned_lead_s=opts.planned_lead_s,
    )
    return ReplayResult(summary, timeline, progress, jobs)


def check_out_dir(out_dir: str) -> None:
    """:class:`InputError` when ``out_dir`` obviously cannot be written (checked before a long
    replay: an existing non-directory, or a parent that is a file or not writable)."""
    path = os.path.abspath(out_dir)
    if os.path.lexists(path) and not os.path.isdir(path):
        raise InputError("cannot write outputs: exists and is not a directory", path=out_dir)
    parent = os.path.dirname(path)
    while not os.path.lexists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise InputError(f"cannot write outputs: {parent} is not a directory", path=out_dir)
    for d in (parent, path) if os.path.isdir(path) else (parent,):
        if not os.access(d, os.W_OK | os.X_OK):
            raise InputError(f"cannot write outputs: {d} is not writable", path=out_dir)


def write_outputs(result: ReplayResult, out_dir: str, plots: bool = True) -> None:
    """Write everything to a temp dir beside ``out_dir``, then move it in.  A failure leaves
    ``out_dir`` as it was and raises :class:`InputError` naming it."""
    check_out_dir(out_dir)
    try:
        _write_outputs(result, out_dir, plots)
    except OSError as exc:
        raise InputError(f"cannot write outputs: {exc.strerror or exc}", path=out_dir) from None


def _write_outputs(result: ReplayResult, out_dir: str, plots: bool) -> None:
    parent = os.path.dirname(os.path.abspath(out_dir)) or "."
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".replay-", dir=parent)
    try:
        with open(os.path.join(tmp, "summary.json"), "w") as fh:
            write_summary(fh, result.summary)
        with open(os.path.join(tmp, "timeline.csv"), "w") as fh:
            fh.write("time_s,idle_nodes,allocated_nodes,running_jobs,throughput_samples_per_s\n")
            t0 = result.timeline[0][0] if result.timeline else 0.0
            for t, idle, alloc, run, thr in result.timeline:
                fh.write(f"{t - t0:.1f},{idle},{alloc},{run},{thr:.3f}\n")
        with open(os.path.join(tmp, "jobs.csv"), "w", newline="") as fh:
            out = csv.writer(fh, lineterminator="\n")
            out.writerow(("job", "user", "done_samples", "work_samples", "submit_s", "first_start_s",
                          "completed_at_s", "preemptions", "rescales", "node_s", "max_starved_s"))

            def at(x: float | None) -> str:
                return "" if x is None else f"{x:.1f}"
            for j in result.jobs:
                out.writerow((j["job"], j["user"], f"{j['done']:.1f}", f"{j['work']:.1f}", at(j["submit_s"]),
                              at(j["first_start_s"]), at(j["completed_at_s"]), j["preemptions"],
                              j["rescales"], f"{j['node_s']:.1f}", f"{j['max_starved_s']:.1f}"))
        if plots:
            from malletrain.replay.plots import plot_nodes, plot_progress
            plot_nodes(result, os.path.join(tmp, "nodes.png"))
            plot_progress(result, os.path.join(tmp, "progress.png"))
        if os.path.isdir(out_dir):
            for name in os.listdir(tmp):
                os.replace(os.path.join(tmp, name), os.path.join(out_dir, name))
            os.rmdir(tmp)
        else:
            os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
