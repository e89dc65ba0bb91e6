"""``decide``: snapshot + curves + config → Plan.

Pure: no I/O, no clock, no environment, no global randomness.  Steps:

1. *Pinned* jobs keep their nodes: a job in a rescale pause, one whose size
   changed less than ``min_dwell_s`` ago, and (malletrain policy) one still
   measuring its probe count.
2. *Probes* (malletrain policy): a job whose curve asks for a probe gets that
   count first while capacity lasts — the JPA needs ≤3 measured counts —
   round-robin over owners (FIFO within one), at most ``probes_per_owner`` of
   one owner's jobs at once, and an owner's probes together (those measuring
   included) within its max-min fair part of the nodes once it probes at all.
   (A probe that yields nothing is withdrawn by the curve source after
   ``probe_timeout_s``, see :mod:`malletrain.core.curves`.)
3. *Starving* jobs (``starvation_s`` > 0): an admitted job that has waited
   ``starvation_s`` without nodes gets ``min_nodes`` before the others are
   sized (longest wait first, while capacity lasts), and a job whose size
   changed less than ``starvation_s`` ago is not stopped to make room for others
   (only the primary scheduler takes its nodes).
4. The rest is allocated by the policy's allocator on the remaining capacity
   (count-based: DP/MILP/greedy, valued by :mod:`malletrain.core.objective` with
   the :class:`Outlook`'s learned pauses and node stays; ``bftrainer``: its
   per-node MILP; ``static``: fixed size, FIFO).
   With ``promise`` on, an owner whose jobs report different promises (campaign trials: how
   many pruning rungs each survived) has the nodes the allocator gave its jobs re-split among
   them, valued in node-equivalents, the more promising jobs first and the most promising
   grown by their promise (:func:`_by_promise`); no other owner's count changes, nor (but
   for nodes the owner's jobs keep) its nodes (:func:`_place_apart`).
5. Counts become nodes (:mod:`malletrain.core.placement`: longest predicted
   stays to growing jobs) and every job gets an :class:`Action` with a reason: a
   :class:`ReasonCode` and the detail.
"""
from __future__ import annotations

import functools
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import replace
from itertools import chain

from malletrain.core.objective import FreeOrder, expected_values, pace_of, unit_rate, unit_weight
from malletrain.core.placement import in_pool, place
from malletrain.core.stays import StayMap
from malletrain.domain.config import FORECAST_POLICIES, CoreConfig
from malletrain.domain.model import (
    DEFAULT_NODE_TYPE,
    MAX_PROMISE,
    MIN_PROMISE,
    NO_OUTLOOK,
    Action,
    ActionKind,
    Curve,
    JobState,
    Node,
    Outlook,
    Plan,
    ReasonCode,
    RescaleCost,
    Snapshot,
)
from malletrain.milp.bftrainer import NodeJob, solve_per_node
from malletrain.milp.problem import JobChoice, Option, Problem
from malletrain.milp.solve import allocate


@functools.lru_cache(maxsize=4096)
def size_grid(min_nodes: int, max_nodes: int, max_candidates: int = 32) -> tuple[int, ...]:
    """Candidate sizes: every count in range, or a geometric grid if too many."""
    lo, hi = max(1, min_nodes), max(min_nodes, max_nodes)
    if hi - lo + 1 <= max_candidates:
        return tuple(range(lo, hi + 1))
    ratio = (hi / lo) ** (1.0 / (max_candidates - 1))
    grid = {lo, hi}
    for i in range(1, max_candidates - 1):
        grid.add(min(hi, max(lo, round(lo * ratio ** i))))
    return tuple(sorted(grid))


def _capacity(nodes: Sequence[Node]) -> Counter:
    return Counter(n.node_type for n in nodes)


_POOL: list = [None, None, None]   # the last pool looked at (held, so its identity is not reused)


def pool_index(nodes: Sequence[Node]) -> tuple[dict[str, Node], Counter]:
    """The pool by name and its node count per type, kept for the same ``nodes`` object (a
    backend hands the same tuple while its pool is unchanged; a cycle without a change of the
    pool then pays no pass over it; :func:`malletrain.core.cycle.reconcile` checks the plan against
    the same index).  Both are read, never changed: callers copy the counter."""
    if _POOL[0] is not nodes or type(nodes) is not tuple:     # a list could change under the same identity
        _POOL[:] = [nodes, {n.name: n for n in nodes}, _capacity(nodes)]
    return _POOL[1], _POOL[2]


def plan_violation(snapshot: Snapshot, plan: Plan) -> str | None:
    """What is wrong with ``plan`` for ``snapshot`` (None: nothing): a job the snapshot does not
    hold, a job outside [``min_nodes``, ``max_nodes``], a node outside the harvestable pool or
    assigned twice.  (The cycle's ``reconcile`` applies no plan that has one.)"""
    pool = pool_index(snapshot.nodes)[0]      # (kept per pool tuple: decide read the same one)
    specs = {j.job_id: j.spec for j in snapshot.jobs}
    seen: set[str] = set()
    for job_id, nodes in plan.allocations.items():
        spec = specs.get(job_id)
        if spec is None:
            return f"plan names unknown job {job_id}"
        if nodes and not (spec.min_nodes <= len(nodes) <= spec.max_nodes):
            return f"job {job_id}: {len(nodes)} nodes outside [{spec.min_nodes}, {spec.max_nodes}]"
        for n in nodes:
            if n not in pool:
                return f"job {job_id}: node {n} is not harvestable"
            if n in seen:
                return f"node {n} assigned twice"
            seen.add(n)
    return None


Reason = tuple[ReasonCode, str]


def _pinned_reason(job: JobState, curve: Curve | None, now_s: float, cfg: CoreConfig) -> Reason | None:
    if not job.nodes:
        return None
    if job.paused_until_s > now_s:
        return (ReasonCode.RESCALE_PAUSE,
                f"keep {job.size}: rescale in progress until t={job.paused_until_s:.0f}s")
    if (cfg.min_dwell_s > 0 and job.last_change_s is not None
            and now_s - job.last_change_s < cfg.min_dwell_s):
        # the times, not "changed 38s ago": a plan reused or standing in a later cycle stays true
        return (ReasonCode.MIN_DWELL, f"keep {job.size}: changed at t={job.last_change_s:.0f}s, held until "
                                      f"t={job.last_change_s + cfg.min_dwell_s:.0f}s (min_dwell_s {cfg.min_dwell_s:g})")
    if cfg.policy == "malletrain" and curve is not None and job.size in curve.wanted:
        return ReasonCode.MEASURING, f"keep {job.size}: JPA is measuring throughput at {job.size} nodes"
    return None


def decide(snapshot: Snapshot, curves: Mapping[str, Curve], config: CoreConfig,
           outlook: Outlook = NO_OUTLOOK, standing: Plan | None = None) -> Plan:
    """The plan for ``snapshot`` (module docstring).

    ``standing``: a plan that changed nothing, made for this very state (the same jobs on the
    same nodes, pins, curves, learned pauses, sensitivities and promises) under other node
    stays; the cycle hands it over when only the stays moved.  It is returned as it is when the
    new stays provably give the same decision (:func:`_stands`), which saves the allocation and
    the placement; its ``objective`` is then the one it was made with."""
    now = snapshot.now_s
    if config.policy not in FORECAST_POLICIES:
        outlook = NO_OUTLOOK
    pool, types = pool_index(snapshot.nodes)
    cap = types.copy()
    targets: dict[str, tuple[str | None, int]] = {}
    reasons: dict[str, Reason] = {}
    notes: list[str] = []
    live = list(snapshot.jobs)
    # Jobs whose nodes left the pool already lost them (the backend shrank them).  A running
    # job's node type is its nodes' (the Slurm backend leaves it to the pool: a probe or a static
    # size read as "any type" gave a job nodes of two types, or more of a type than were free).
    held_now = {j.job_id: in_pool(j.nodes, pool) for j in live}
    jobs = [JobState(j.spec, held_now[j.job_id], j.node_type or _type_of(j, pool), j.paused_until_s,
                     j.last_change_s) for j in live]

    def pin(j: JobState, r: Reason) -> None:
        targets[j.job_id] = (j.node_type, j.size)
        reasons[j.job_id] = r
        cap[targets[j.job_id][0]] -= j.size

    measuring: list[tuple[JobState, Reason]] = []
    for j in jobs:
        r = _pinned_reason(j, curves.get(j.job_id), now, config)
        if r and j.size >= j.spec.min_nodes:
            if r[0] is ReasonCode.MEASURING:
                measuring.append((j, r))
            else:
                pin(j, r)
    # a job measuring at a wanted count is kept there only within its owner's probes_per_owner
    # (jobs in a rescale pause at a wanted count count first: they cannot be moved)
    limit = config.probes_per_owner
    at_probe = Counter(owner_of(j) for j in jobs if j.job_id in targets
                       and (c := curves.get(j.job_id)) is not None and j.size in c.wanted)
    for j, r in measuring:
        if not limit or at_probe[owner_of(j)] < limit:
            at_probe[owner_of(j)] += 1
            pin(j, r)
    free_jobs = [j for j in jobs if j.job_id not in targets]

    if config.policy == "malletrain":
        granted = _grant_probes(jobs, free_jobs, curves, cap, at_probe, limit, targets, reasons)
        free_jobs = [j for j in free_jobs if j.job_id not in granted]

    if config.starvation_s > 0 and config.policy != "static":
        free_jobs = _feed_starving(free_jobs, cap, now, config, targets, reasons)

    objective, solver = 0.0, config.policy
    chosen: dict[str, tuple[str, ...]] = {}     # concrete nodes picked by a per-node policy
    resplit: frozenset[str] = frozenset()       # owners whose nodes a promise re-split
    before: dict[str, tuple[str | None, int]] = {}
    if config.policy == "static":
        _static(free_jobs, cap, config, targets, reasons)
    elif config.policy.startswith("bftrainer"):
        chosen, objective, bf_notes = _bftrainer(snapshot, jobs, free_jobs, curves, config, targets)
        solver = "bftrainer-cbc"
        notes.extend(bf_notes)
        for j in free_jobs:
            n = len(chosen.get(j.job_id, ()))
            reasons[j.job_id] = ((ReasonCode.SOLVER, "wait: BFTrainer's MILP gave it no nodes")
                                 if n == 0 and j.size == 0
                                 else _reason(j, n, curves.get(j.job_id), config, frozenset(),
                                              _cost(j, outlook)))
    else:
        equivalents: dict[str, tuple[Option, ...]] = {}
        compared = _differing_owners(free_jobs, outlook.promise) if config.promise else frozenset()
        problem = _problem(free_jobs, curves, cap, config, pool, outlook, snapshot, targets, compared, equivalents)
        method = "greedy" if config.policy == "greedy" else config.allocator
        if standing is not None and not compared and _stands(problem, method, standing, live):
            return standing
        alloc = allocate(problem, method=method, time_limit_s=config.time_limit_s)
        objective, solver = alloc.objective, alloc.solver
        notes.extend(alloc.notes)
        sizes = dict(alloc.sizes)
        promoted: dict[str, Reason] = {}
        if compared:
            before = {j.job_id: sizes.get(j.job_id, (None, 0)) for j in free_jobs}
            promoted = _by_promise(problem, compared, equivalents, sizes, outlook.promise, free_jobs, method,
                                   config, notes, _top_promises(jobs, outlook.promise))
            # an owner whose jobs' sizes or node types the re-split changed (a swap of types at
            # the same counts records no reason)
            resplit = frozenset(owner_of(j) for j in free_jobs if sizes.get(j.job_id, (None, 0)) != before[j.job_id])
        could_run = frozenset(ch.job_id for ch in problem.jobs if any(o.size for o in ch.options))
        for j in free_jobs:
            t, n = sizes.get(j.job_id, (None, 0))
            targets[j.job_id] = (t, n)
            reasons[j.job_id] = (promoted.get(j.job_id)
                                 or _reason(j, n, curves.get(j.job_id), config, could_run, _cost(j, outlook)))

    if resplit:
        alloc_nodes = _place_apart(snapshot.nodes, jobs, targets, before, resplit, curves, outlook, config, pool)
    else:
        exposure = _exposure(jobs, targets, curves, outlook, config) if outlook.stays else {}
        alloc_nodes = place(snapshot.nodes, jobs, targets, outlook.stays, exposure, outlook.sensitive, by_name=pool)
    alloc_nodes.update(chosen)
    actions = _actions(live, alloc_nodes, reasons)
    return Plan(now, alloc_nodes, actions, objective, solver, tuple(notes))


def _grant_probes(jobs: Sequence[JobState], free_jobs: Sequence[JobState], curves: Mapping[str, Curve],
                  cap: Counter, probing: Counter, limit: int, targets: dict[str, tuple[str | None, int]],
                  reasons: dict[str, Reason]) -> set[str]:
    """Step 2 of the module docstring: probes for the ``free_jobs`` whose curve asks for one,
    written into ``targets``/``reasons`` and taken from ``cap``; returns the jobs it settled (a
    probe or a wait).  ``probing`` counts, per owner, the pinned jobs at a wanted count.

    An owner's probes together (the pinned ones at a wanted count included) stay within its
    max-min fair part of the nodes (:func:`_owner_parts`) once it probes at all: its first probe
    may take the smallest wanted count whatever its part, a further one past its part only nodes
    that no other owner's unsettled job could use."""
    granted: set[str] = set()
    held: Counter = Counter()
    for j in jobs:
        held[owner_of(j)] += j.size
    shares = _fair_shares(free_jobs, dict(cap))
    probed = [j for j in jobs if j.job_id in targets and j.size
              and (c := curves.get(j.job_id)) is not None and j.size in c.wanted]
    probe_nodes: Counter = Counter()
    for j in probed:
        probe_nodes[owner_of(j), targets[j.job_id][0]] += j.size
    parts = _owner_parts([*free_jobs, *probed], cap + Counter(
        {t: n for (_, t), n in probe_nodes.items() if t is not None}))

    # what the unsettled jobs could still take, per (owner, node type or None for any type)
    claims: Counter = Counter()
    for j in free_jobs:
        claims[owner_of(j), j.node_type] += max(1, j.spec.max_nodes)
    claimed: Counter = Counter()
    for (_, t), n in claims.items():
        claimed[t] += n

    def others_claim(o: str, t: str) -> int:
        return claimed[None] + claimed[t] - claims[o, None] - claims[o, t]

    def settle(j: JobState) -> None:
        granted.add(j.job_id)
        n = max(1, j.spec.max_nodes)
        claims[owner_of(j), j.node_type] -= n
        claimed[j.node_type] -= n

    def wait(j: JobState, c: Curve, why: str) -> None:
        if not c.points:        # with points it is sized by the allocator on its partial fit
            targets[j.job_id] = (None, 0)
            reasons[j.job_id] = (ReasonCode.PROBE_WAIT, "wait: " + why)
            settle(j)

    def consider(j: JobState, c: Curve, past_parts: bool) -> bool:
        """Settles ``j``'s probe; False where it is past its owner's part in the first pass."""
        t = j.node_type or _best_type(cap)
        p = _probe_size(c, shares(t)[j.job_id]) if t is not None else c.probe
        if p is None:
            return True
        o = owner_of(j)
        over = probing[o] > 0 and t is not None and probe_nodes[o, t] + p > parts(t)[o] + 1e-9
        if limit and probing[o] >= limit:
            wait(j, c, f"its owner has {limit} jobs probing already (probes_per_owner)")
        elif over and not past_parts:
            return False
        elif t is not None and over and cap[t] - others_claim(o, t) < p:
            wait(j, c, f"its owner's probes hold {probe_nodes[o, t]} nodes of its fair part "
                       f"{parts(t)[o]:g} already")
        elif t is not None and cap[t] >= p:
            targets[j.job_id] = (t, p)
            cap[t] -= p
            probing[o] += 1
            probe_nodes[o, t] += p
            reasons[j.job_id] = (ReasonCode.PROBE, f"probe at {p} nodes: the JPA has no "
                                                   f"measurement there yet ({c.source})")
            settle(j)
        else:
            wait(j, c, f"probe needs {p} nodes, {max(cap.values(), default=0)} free")
        return True

    asking = [(j, c) for j in _round_robin(free_jobs, held)
              if (c := curves.get(j.job_id)) is not None and c.probe is not None]
    deferred = [(j, c) for j, c in asking if not consider(j, c, past_parts=False)]
    for j, c in deferred:
        consider(j, c, past_parts=True)
    return granted


def _asked(jobs: Sequence[JobState]) -> dict[str, int]:
    """What each owner asks for: the sum of its jobs' ``max_nodes``."""
    asked: dict[str, int] = {}
    for j in jobs:
        asked[owner_of(j)] = asked.get(owner_of(j), 0) + max(1, j.spec.max_nodes)
    return asked


def _max_min(asked: Mapping[str, int], n: float) -> dict[str, float]:
    """``n`` nodes split max-min fairly: owners asking least first get what they ask, up to an
    equal part of what is left (water-filling)."""
    left, given = n, {}
    order = sorted(asked, key=lambda o: (asked[o], o))
    for i, o in enumerate(order):
        given[o] = min(float(asked[o]), left / (len(order) - i))
        left -= given[o]
    return given


def _owner_parts(jobs: Sequence[JobState], cap: Mapping[str, int]) -> Callable[[str], dict[str, float]]:
    """Per node type, each owner's max-min fair part of ``cap`` among the owners of ``jobs``: the
    most nodes that owner's probes may hold together once it probes at all."""
    asked = _asked(jobs)
    return functools.cache(lambda t: _max_min(asked, float(cap.get(t, 0))))


def _fair_shares(jobs: Sequence[JobState], cap: Mapping[str, int]) -> Callable[[str], dict[str, float]]:
    """Per node type, each job's share of the nodes a probe may take: the nodes split in
    proportion to ``max_nodes``, each owner's part capped at its max-min fair part (an owner asks
    for the sum of its jobs' ``max_nodes``; no owner gets more than an equal part of the nodes
    unless others ask for less).  One user's large ``max_nodes`` or many jobs cannot widen its
    probes beyond that part.  (Max-min alone, handing small jobs all they ask, measured 1.8%
    fewer useful samples on the Philly day: probes come before the allocator.)"""
    asked = _asked(jobs)

    @functools.cache
    def per_type(t: str) -> dict[str, float]:
        given = _max_min(asked, float(cap.get(t, 0)))
        total = sum(asked.values())
        return {j.job_id: min(given[owner_of(j)], float(cap.get(t, 0)) * asked[owner_of(j)] / total)
                * max(1, j.spec.max_nodes) / asked[owner_of(j)] for j in jobs}
    return per_type


def _probe_size(curve: Curve, share: float) -> int | None:
    """Where a job that wants a measurement probes: the largest wanted count within its
    ``share`` of the nodes (:func:`_fair_shares`), so a job alone on many free nodes measures
    near its top instead of idling them at its bottom; ``curve.probe`` (the smallest) where the
    share reaches no wanted count.  None (no probe: the allocator sizes it on its partial fit)
    where the job has measured a count at least as large as the one it would probe, within its
    share: it runs where it knows."""
    fits = [n for n in curve.wanted if n <= share + 1e-9]
    if not fits:
        return curve.probe
    p = max(fits)
    if any(p < m <= share + 1e-9 for m in curve.measured):
        return None
    return p


def owner_of(job: JobState) -> str:
    """Whose job it is; a job without an owner (replay) is a party of its own."""
    return job.spec.owner or "\0" + job.job_id


def _round_robin(jobs: Sequence[JobState], held: Counter) -> list[JobState]:
    """Jobs interleaved over owners (each owner's in FIFO order), owners holding fewer nodes
    first: probes are granted this way, so one user's many jobs cannot keep another user's
    first job waiting."""
    queues: dict[str, list[JobState]] = {}
    for j in jobs:
        queues.setdefault(owner_of(j), []).append(j)
    queues = dict(sorted(queues.items(), key=lambda kv: held[kv[0]]))    # stable: FIFO among equals
    out: list[JobState] = []
    depth = 0
    while len(out) < len(jobs):
        out.extend(q[depth] for q in queues.values() if depth < len(q))
        depth += 1
    return out


def _type_of(job: JobState, pool: Mapping[str, Node]) -> str | None:
    for n in job.nodes:
        if n in pool:
            return pool[n].node_type
    return None


def _best_type(cap: Counter) -> str | None:
    return max(cap, key=lambda t: (cap[t], t)) if cap else None


def _cost(job: JobState, outlook: Outlook) -> RescaleCost:
    return outlook.costs.get(job.job_id) or RescaleCost(job.spec.rescale_up_s, job.spec.rescale_down_s)


def _waited(job: JobState, now_s: float) -> float:
    """How long a job without nodes has waited: since it last lost its nodes, or since it was
    admitted (``last_change_s``), or submitted."""
    since = job.last_change_s if job.last_change_s is not None else job.spec.submit_s
    return now_s - since


def starving(job: JobState, now_s: float, starvation_s: float) -> bool:
    """Under the starvation rule: a job without nodes that waited ``starvation_s`` (it is fed
    ``min_nodes`` before the others are sized)."""
    return not job.nodes and _waited(job, now_s) >= starvation_s


def protected(job: JobState, now_s: float, starvation_s: float) -> bool:
    """Under the starvation rule: a job with nodes whose size changed less than ``starvation_s``
    ago (it is not stopped to make room for others)."""
    return bool(job.nodes) and job.last_change_s is not None and now_s - job.last_change_s < starvation_s


def _feed_starving(jobs: Sequence[JobState], cap: Counter, now_s: float, cfg: CoreConfig,
                   targets: dict, reasons: dict) -> list[JobState]:
    """Give ``min_nodes`` to each job without nodes that waited ``starvation_s``, owners taking
    turns (longest wait first within one), while some node type has the room; the others go on
    to the allocator."""
    due = sorted((j for j in jobs if starving(j, now_s, cfg.starvation_s)),
                 key=lambda j: (-_waited(j, now_s), j.job_id))
    due = _round_robin(due, Counter())      # owners take turns: one user's many jobs cannot take every grant
    fed: set[str] = set()
    for j in due:
        t = _best_type(cap)
        if t is None or cap[t] < j.spec.min_nodes:
            continue
        targets[j.job_id] = (t, j.spec.min_nodes)
        cap[t] -= j.spec.min_nodes
        reasons[j.job_id] = (ReasonCode.STARVING, f"start on {j.spec.min_nodes} (min_nodes): waited "
                                                  f"{_waited(j, now_s):.0f}s >= starvation_s {cfg.starvation_s:g}")
        fed.add(j.job_id)
    return [j for j in jobs if j.job_id not in fed]


def _problem(jobs: Sequence[JobState], curves: Mapping[str, Curve], cap: Counter,
             cfg: CoreConfig, pool: Mapping[str, Node], outlook: Outlook, snapshot: Snapshot,
             targets: Mapping[str, tuple[str | None, int]], compared: AbstractSet[str],
             equivalents: dict[str, tuple[Option, ...]]) -> Problem:
    """The allocation problem of ``jobs`` (their options valued by the objective).  The jobs of
    the owners in ``compared`` are also valued in node-equivalents (the ``speedup`` objective),
    into ``equivalents`` (filled here): what :func:`_by_promise` re-splits their owner's nodes by."""
    choices = []
    as_speedup = replace(cfg, objective="speedup") if compared and cfg.objective != "speedup" else cfg
    types = tuple(sorted(t for t in cap if cap[t] > 0)) or tuple(sorted(cap)) or (DEFAULT_NODE_TYPE,)
    stays = outlook.stays
    free = None
    if stays:   # the nodes a growing job could get: free ones first, then those of jobs that may shrink
        taken = set(chain.from_iterable(j.nodes for j in snapshot.jobs if j.job_id in targets))
        held = set(chain.from_iterable(j.nodes for j in jobs))
        grow = max((j.spec.max_nodes - j.size for j in jobs), default=0)
        if isinstance(stays, StayMap) and (stays.covers(snapshot.nodes) or stays.keys() == pool.keys()):
            free = FreeOrder.of_pool(stays, taken | held, held, limit=grow)
        else:
            free = FreeOrder.of(stays, pool.keys() - taken - held, held, limit=grow)
    protect = cfg.starvation_s
    speeds: list[float] | None = None
    for j in jobs:
        curve = curves.get(j.job_id)
        spec = j.spec
        mytypes = (j.node_type,) if j.nodes else types
        limit = max(cap.get(t, 0) for t in mytypes) if mytypes else 0
        sizes = [n for n in size_grid(spec.min_nodes, spec.max_nodes, cfg.max_candidates)
                 if n <= limit]
        if j.size and j.size not in sizes and spec.min_nodes <= j.size <= spec.max_nodes:
            sizes.append(j.size)
        rate = unit_rate(j, curve.rate, cfg) if curve is not None else _no_rate
        pace = None
        s = outlook.sensitive.get(j.job_id, 0.0)
        if s > 0:
            if speeds is None:      # the free nodes' slowdowns, fastest first (once per decision)
                taken = {n for x in snapshot.jobs if x.job_id in targets for n in x.nodes}
                busy = taken | {n for x in jobs for n in x.nodes}
                speeds = sorted(node.variability for name, node in pool.items() if name not in busy)
            pace = pace_of(j, pool, speeds, s)
        cost = _cost(j, outlook)
        opts = expected_values(j, sizes, rate, cost, unit_weight(j, rate, cfg), cfg.horizon_s, stays, free, pace)
        if owner_of(j) in compared:
            if as_speedup is not cfg:
                rate = unit_rate(j, curve.rate, as_speedup) if curve is not None else _no_rate
                equivalents[j.job_id] = expected_values(j, sizes, rate, cost,
                                                        unit_weight(j, rate, as_speedup), cfg.horizon_s,
                                                        stays, free, pace)
            else:
                equivalents[j.job_id] = opts
        choices.append(JobChoice(j.job_id, opts, tuple(t for t in mytypes if t), j.size))
    kept = {j.job_id for j in jobs if protect > 0 and protected(j, snapshot.now_s, protect)}
    # changed less than starvation_s ago: not stopped to make room for others
    return Problem(_protect(choices, kept), {t: max(0, c) for t, c in cap.items()} or {DEFAULT_NODE_TYPE: 0})


STANDING_MARGIN = 1e-9     # of Σ max|value|: far beyond what float rounding of the DP's sums can cross


def _stands(problem: Problem, method: str, standing: Plan, jobs: Sequence[JobState]) -> bool:
    """Whether the allocator would give every job of ``problem`` its current size again, so that
    ``standing`` (a plan that kept every job as it is, for this state) is the decision.

    It holds when the exact knapsack DP allocates (one node type), ``standing`` came from it with
    no note, kept every job on its nodes (no reason reads the clock: a ``min-dwell`` reason names
    the times, not how long ago), and each job's current size is worth more than every other of its options by more than
    ``STANDING_MARGIN`` of the sum of the largest |value| of every job.  Then every job at its
    current size is the only optimum of the knapsack (any other choice gives up at least that
    margin, and the current sizes fit: the jobs hold those nodes), the DP finds it whatever its
    tie-breaking (the rounding of its sums is ~1e-13 of that sum at most), and targets equal to
    the current sizes place every job on its own nodes with the same actions and reasons (the
    reasons read the curves, the pauses and the capacity, not the stays)."""
    if (standing.solver != "mck-dp" or standing.notes
            or not (method == "dp" or (method == "auto" and len(problem.capacity) == 1))):
        return False
    kept = {a.job_id: a for a in standing.actions}
    if len(kept) != len(jobs):
        return False
    for j in jobs:
        a = kept.get(j.job_id)
        if a is None or a.kind not in (ActionKind.KEEP, ActionKind.WAIT) or a.from_nodes != j.nodes:
            return False
    total = 1.0
    for ch in problem.jobs:
        total += max(abs(o.value) for o in ch.options)
    margin = STANDING_MARGIN * total
    for ch in problem.jobs:
        now, other = None, -math.inf
        for o in ch.options:
            if o.size == ch.current_size:
                now = o.value
            elif o.value > other:
                other = o.value
        if now is None or not now - other > margin:
            return False
    return True


def _protect(choices: Sequence[JobChoice], protected: AbstractSet[str]) -> tuple[JobChoice, ...]:
    """Stopping a ``protected`` job costs more than every job's values together (its size 0 is
    worth −(2·Σ max|value| + 1)): the allocator keeps it running whatever else it gains."""
    if not protected:
        return tuple(choices)
    penalty = 2.0 * sum(max((abs(o.value) for o in ch.options if o.size), default=0.0) for ch in choices) + 1.0
    return tuple(JobChoice(ch.job_id, tuple(Option(0, -penalty) if o.size == 0 else o for o in ch.options),
                           ch.node_types, ch.current_size) if ch.job_id in protected else ch
                 for ch in choices)


def _promise_of(job_id: str, promise: Mapping[str, float]) -> float:
    """A job's promise as the re-split counts it: in [MIN_PROMISE, MAX_PROMISE], 1 when it
    reports none (NaN, ±inf and negatives land in range)."""
    return min(MAX_PROMISE, max(MIN_PROMISE, promise.get(job_id, 1.0)))


def _differing_owners(jobs: Sequence[JobState], promise: Mapping[str, float]) -> frozenset[str]:
    """The owners among ``jobs`` whose jobs' promises differ: whose nodes :func:`_by_promise`
    re-splits (so only their jobs are valued in node-equivalents too)."""
    if not promise:
        return frozenset()
    seen: dict[str, set[float]] = {}
    for j in jobs:
        seen.setdefault(owner_of(j), set()).add(_promise_of(j.job_id, promise))
    return frozenset(owner for owner, ps in seen.items() if len(ps) > 1)


def _top_promises(jobs: Sequence[JobState], promise: Mapping[str, float]) -> dict[str, float]:
    """Each owner's highest promise among all its jobs, those a pin keeps out of the re-split
    included (a trial in its start pause is still its owner's most promising)."""
    top: dict[str, float] = {}
    for j in jobs:
        o = owner_of(j)
        top[o] = max(top.get(o, MIN_PROMISE), _promise_of(j.job_id, promise))
    return top


def _by_promise(problem: Problem, compared: AbstractSet[str], equivalents: Mapping[str, tuple[Option, ...]],
                sizes: dict[str, tuple[str | None, int]], promise: Mapping[str, float],
                jobs: Sequence[JobState], method: str, cfg: CoreConfig, notes: list[str],
                top: Mapping[str, float]) -> dict[str, Reason]:
    """Re-split each owner's nodes among that owner's jobs by their promise (changes ``sizes``).

    The allocation above is left as it is for every owner whose jobs all report the same promise
    (1 when they report none).  For an owner whose jobs differ (``compared``, from
    :func:`_differing_owners`), the nodes the allocation gave that
    owner's jobs (per node type) are allocated again among those jobs alone: each job valued in
    node-equivalents (``equivalents``: the ``speedup`` objective, whatever the configured one),
    and a job more promising than the owner's mean first (:func:`_promised`: a place, and for
    the owner's most promising jobs a size; ``top``: each owner's highest promise among all its
    jobs, from :func:`_top_promises`).  What other owners' jobs get is the allocation's,
    whatever an owner reports: a promise can only reorder its own jobs.

    Why a place for most and a size only for the top: weighting every size by the promise (tried
    first) grew the promoted trials of every rung beyond their efficient size and slowed the
    exploration at the first rungs by about a third; on the NAS-Bench-201 campaign replay of the
    Philly day it reached the target later than plain ASHA.  A place alone left the trials at the
    last rungs, the campaign's likely results, on the few nodes their curve paid for (a Theta
    winner trained on 2 of 128 idle nodes where 4 would have finished it 9 h sooner).  Growing
    only the owner's most promising jobs by their promise (stop 66) reached the target 1.06×
    sooner on the Philly day and 1.02× on the Theta week, means of 20 seeds each
    (``malletrain bench campaign``; benchmarks/campaign.md).

    Why node-equivalents and not samples/s: a campaign's trials train different networks, whose
    samples/s differ up to 6× between light and heavy ones, and the good ones are heavy.  Valued
    by samples/s, the light trials of a rung ran before equally promising heavy ones.  In
    node-equivalents (``m·T(n)/T(m)``: the rate on ``n`` nodes in units of the rate on the
    smallest size ``m``, at most ``n``) the first nodes of trials of the same smallest size are
    worth the same, so equally promising trials are ordered by how well they scale.  On the
    campaign replay of the Philly day this reached the target 1.6× sooner than the re-split in
    samples/s did (benchmarks/campaign.md).  The promise's place is bought in
    the owner's unit (the most any of the owner's jobs gains by running at all).  Why not the
    job's own: scaled by its own rate, a heavy trial's promise bought less than a light trial's
    rate (seed 6's eventual winner then waited 2.6 h at its second rung).

    If the re-split would leave some of the owner's nodes idle (a job without a rate on its
    smallest size is worth nothing in node-equivalents), the allocation stands."""
    owners = {j.job_id: owner_of(j) for j in jobs}
    groups: dict[str, list[JobChoice]] = {}
    for ch in problem.jobs:
        groups.setdefault(owners[ch.job_id], []).append(ch)
    reasons: dict[str, Reason] = {}
    for owner, choices in groups.items():
        if owner not in compared:
            continue
        ps = [_promise_of(ch.job_id, promise) for ch in choices]
        cap: Counter = Counter()
        for ch in choices:
            t, n = sizes.get(ch.job_id, (None, 0))
            if t is not None and n:
                cap[t] += n
        if not cap:
            continue
        # a job the allocation must not stop (protected: its size 0 is worth less than nothing)
        protected = {ch.job_id for ch in choices if any(o.size == 0 and o.value < 0 for o in ch.options)}
        same = [JobChoice(ch.job_id, equivalents[ch.job_id], ch.node_types, ch.current_size) for ch in choices]
        mean = sum(ps) / len(ps)
        unit = max((_first_value(ch) for ch in same), default=0.0)
        scaled = [_promised(ch, p / mean, unit, grows=p >= top[owner]) for ch, p in zip(same, ps)]
        sub = allocate(Problem(_protect(scaled, protected), {t: cap.get(t, 0) for t in problem.capacity}),
                       method=method, time_limit_s=cfg.time_limit_s)
        notes.extend(sub.notes)
        total = sum(cap.values())
        if sum(sub.sizes.get(ch.job_id, (None, 0))[1] for ch in choices) < total:
            continue    # a job without a rate on its smallest size is worth 0 in node-equivalents: keep them busy
        for ch, p in zip(choices, ps):
            old, new = sizes.get(ch.job_id, (None, 0)), sub.sizes.get(ch.job_id, (None, 0))
            sizes[ch.job_id] = new
            if new[1] != old[1]:
                reasons[ch.job_id] = (ReasonCode.PROMISE,
                                      f"{_verb(ch.current_size, new[1])}: its owner's {total} nodes go to the "
                                      f"owner's most promising jobs first, compared in node-equivalents "
                                      f"(promise {p:.3g}; mean of the owner's {len(ps)} jobs {mean:.3g}); "
                                      f"{old[1]} without")
    return reasons


def _first_value(ch: JobChoice) -> float:
    """What running at all (the smallest size) is worth to a job (0 when nothing is)."""
    first = min((o for o in ch.options if o.size), key=lambda o: o.size, default=None)
    return max(first.value, 0.0) if first is not None else 0.0


def _promised(ch: JobChoice, w: float, unit: float, *, grows: bool) -> JobChoice:
    """A job's options when its promise is ``w`` times its owner's mean: a job above the mean
    gets ``(w − 1)·unit`` added to every size (``unit``: the most any of the owner's jobs gains by
    running at all), so it gets a place before the owner's less promising jobs, whatever their
    sample rates; a job at or below the mean keeps its values.  Only the owner's most promising
    jobs (``grows``: at the owner's highest promise, ties included) also value each size at ``w``
    times what it is worth, so that their growth outweighs the others' by their promise; the
    others grow no further than their curve pays for."""
    bonus = max(w - 1.0, 0.0) * unit
    if bonus <= 0.0:
        return ch
    scale = w if grows else 1.0
    return JobChoice(ch.job_id, tuple(Option(o.size, o.value * scale + bonus) if o.size else o for o in ch.options),
                     ch.node_types, ch.current_size)


def _verb(c: int, n: int) -> str:
    if c == n:
        return f"keep {n}" if n else "wait"
    if c == 0:
        return f"start on {n}"
    if n == 0:
        return f"stop ({c}→0)"
    return f"{'grow' if n > c else 'shrink'} {c}→{n}"


def _place_apart(nodes: Sequence[Node], jobs: Sequence[JobState], targets: Mapping[str, tuple[str | None, int]],
                 before: Mapping[str, tuple[str | None, int]], resplit: AbstractSet[str],
                 curves: Mapping[str, Curve], outlook: Outlook, cfg: CoreConfig,
                 pool: Mapping[str, Node]) -> dict[str, tuple[str, ...]]:
    """The placement when a promise re-split the nodes of the owners in ``resplit``
    (:func:`_by_promise`), so that a promise moves no other owner's job onto other nodes than it
    would have had without one, except nodes the promising owner's own jobs hold and keep.

    1. Every job is placed with the re-split owners' jobs at their sizes ``before`` the re-split:
       the placement had no one reported a promise.
    2. The re-split owners' jobs keep their best own nodes up to their new sizes (as
       :func:`~malletrain.core.placement.place` keeps them), so that none of them is moved off
       a node it keeps at a size it keeps.
    3. Every other owner's job keeps its nodes from 1 but those, and takes as many free nodes
       instead (in 1 it could have been given a node that the re-split owner's job would have
       released without the promise).
    4. The re-split owners' jobs take the rest of their new sizes from what is left.

    In one pass (before 2026-12-04) a promising grower could be ranked before another user's
    grower and take the free nodes that job would have had.  The re-split keeps each owner's
    count per node type, so every step finds enough nodes.  Not separated: the owners in
    ``resplit`` take their rest in one pass (4), so which free nodes one's growing jobs get can
    depend on another re-splitting owner's promises (never the counts)."""
    base = dict(targets)
    base.update((j.job_id, before[j.job_id]) for j in jobs if j.job_id in before and owner_of(j) in resplit)
    stays, sensitive = outlook.stays, outlook.sensitive
    exposure = _exposure(jobs, base, curves, outlook, cfg) if stays else {}
    first = place(nodes, jobs, base, stays, exposure, sensitive, by_name=pool)
    mine = [j for j in jobs if owner_of(j) in resplit]
    theirs = [j for j in jobs if owner_of(j) not in resplit]
    keep = {}
    for j in mine:
        t, n = targets.get(j.job_id, (None, 0))
        keep[j.job_id] = (t, min(j.size, n))
    kept = set(chain.from_iterable(place(nodes, mine, keep, stays, by_name=pool).values()))
    lost = [JobState(j.spec, tuple(n for n in first[j.job_id] if n not in kept), j.node_type,
                     j.paused_until_s, j.last_change_s) for j in theirs]
    if any(len(x.nodes) < len(first[x.job_id]) for x in lost):      # step 3
        rest = [n for n in nodes if n.name not in kept]
        first.update(place(rest, lost, base, stays, exposure, sensitive, by_name={n.name: n for n in rest}))
    others = set(chain.from_iterable(first[j.job_id] for j in theirs))
    rest = [n for n in nodes if n.name not in others]
    exposure = _exposure(mine, targets, curves, outlook, cfg) if stays else {}
    second = place(rest, mine, targets, stays, exposure, sensitive, by_name={n.name: n for n in rest})
    return {j.job_id: second.get(j.job_id, first[j.job_id]) for j in jobs}


def _exposure(jobs: Sequence[JobState], targets: Mapping[str, tuple[str | None, int]],
              curves: Mapping[str, Curve], outlook: Outlook, cfg: CoreConfig) -> dict[str, float]:
    """What a node taken back costs each job at its target size: its pause for it (a restart's
    down pause, or an elastic group's preemption pause) at that rate."""
    out = {}
    for j in jobs:
        n = targets.get(j.job_id, (None, 0))[1]
        curve = curves.get(j.job_id)
        if n > j.size and curve is not None:
            rate = unit_rate(j, curve.rate, cfg)
            out[j.job_id] = _cost(j, outlook).taken_pause_s * rate(n) * unit_weight(j, rate, cfg)
    return out


def _no_rate(n: float) -> float:
    return 0.0


def _reason(job: JobState, n: int, curve: Curve | None, cfg: CoreConfig, could_run: AbstractSet[str],
            cost: RescaleCost) -> Reason:
    """Why ``job`` goes to ``n`` nodes; ``could_run``: the jobs the allocator had a size above 0 for."""
    c = job.size
    src = curve.source if curve is not None else "no curve"
    rate = curve.rate if curve is not None else _no_rate
    if n == c:
        if n == 0:
            if job.job_id not in could_run:
                return ReasonCode.TOO_FEW_NODES, f"wait: fewer free nodes than min_nodes={job.spec.min_nodes}"
            return ReasonCode.OUTBID, "wait: the idle nodes are worth more to other jobs"
        return (ReasonCode.BEST_AS_IS,
                f"keep {n}: no change beats the current size ({rate(n):.1f} samples/s, {src})")
    pauses = (f"{cost.up_s:g}s up / {cost.down_s:g}s down pause, {cost.source}" if cost.grow_s is None else
              f"{cost.up_s:g}s start / {cost.grow_pause_s:g}s grow / {cost.down_s:g}s shrink pause, {cost.source}")
    if c == 0:
        return ReasonCode.GAIN, f"start on {n}: predicted {rate(n):.1f} samples/s ({src}; {pauses})"
    if n == 0:
        return (ReasonCode.YIELD, f"stop ({c}→0): its nodes yield more elsewhere over the "
                f"{cfg.horizon_s:g}s horizon, or fewer than min_nodes={job.spec.min_nodes} remain")
    if n > c:
        return (ReasonCode.GAIN, f"grow {c}→{n}: +{rate(n) - rate(c):.1f} samples/s over "
                f"{cfg.horizon_s:g}s outweighs the {cost.grow_pause_s:g}s pause ({src}; {cost.source})")
    return (ReasonCode.YIELD, f"shrink {c}→{n}: loses {rate(c) - rate(n):.1f} samples/s but the "
            f"nodes yield more elsewhere or are gone ({src}; {pauses})")


def _static(jobs: Sequence[JobState], cap: Counter, cfg: CoreConfig,
            targets: dict, reasons: dict) -> None:
    blocked = False
    for j in jobs:
        size = j.spec.max_nodes if cfg.static_size == "max" else j.spec.min_nodes
        if j.nodes and j.size >= size:
            t = j.node_type or _best_type(cap)
            targets[j.job_id] = (t, size)
            cap[t] -= size
            reasons[j.job_id] = (ReasonCode.STATIC_SIZE, f"keep {size}: static size")
    for j in jobs:
        if j.job_id in targets:
            continue
        size = j.spec.max_nodes if cfg.static_size == "max" else j.spec.min_nodes
        t = _best_type(cap)
        if not blocked and t is not None and cap[t] >= size:
            targets[j.job_id] = (t, size)
            cap[t] -= size
            reasons[j.job_id] = (ReasonCode.STATIC_SIZE,
                                 f"start on {size}: static size, FIFO" if not j.nodes else
                                 f"restart on {size}: static size")
        else:
            blocked = True  # strict FIFO: later jobs wait behind the head
            targets[j.job_id] = (None, 0)
            reasons[j.job_id] = ((ReasonCode.STATIC_SIZE, f"stop: below its static size {size}")
                                 if j.nodes else (ReasonCode.FIFO, f"wait: FIFO, needs {size} free nodes"))


def _bftrainer(snapshot: Snapshot, jobs: Sequence[JobState], free_jobs: Sequence[JobState],
               curves: Mapping[str, Curve], cfg: CoreConfig,
               targets: Mapping[str, tuple[str | None, int]]
               ) -> tuple[dict[str, tuple[str, ...]], float, tuple[str, ...]]:
    """BFTrainer's per-node MILP over the nodes pinned jobs do not hold."""
    pinned = {n for j in jobs if j.job_id in targets for n in j.nodes}
    nodes = [n.name for n in snapshot.nodes if n.name not in pinned]
    njobs = []
    for j in free_jobs:
        curve = curves.get(j.job_id)
        rate = curve.rate if curve is not None else (lambda k: 0.0)
        bps = size_grid(j.spec.min_nodes, j.spec.max_nodes, cfg.max_candidates)
        njobs.append(NodeJob(j.job_id, j.spec.min_nodes, j.spec.max_nodes, j.nodes,
                             j.spec.rescale_up_s, j.spec.rescale_down_s, rate, bps))
    if not (njobs and nodes):
        return {}, 0.0, ()
    res = solve_per_node(njobs, nodes, cfg.horizon_s, time_limit_s=cfg.bftrainer_time_limit_s)
    return dict(res.nodes), res.objective, res.notes


def _actions(jobs: Sequence[JobState], alloc: Mapping[str, tuple[str, ...]],
             reasons: Mapping[str, Reason]) -> tuple[Action, ...]:
    acts = []
    for j in jobs:
        new = alloc.get(j.job_id, ())
        old = j.nodes
        if not old and not new:
            kind = ActionKind.WAIT
        elif not old:
            kind = ActionKind.START
        elif not new:
            kind = ActionKind.STOP
        elif new == old or set(new) == set(old):
            kind = ActionKind.KEEP
        elif set(old) <= set(new):
            kind = ActionKind.GROW
        elif set(new) <= set(old):
            kind = ActionKind.SHRINK
        else:  # old nodes vanished from the pool and new ones were added
            kind = ActionKind.GROW if len(new) > len(old) else ActionKind.SHRINK
        code, detail = reasons.get(j.job_id, (ReasonCode.SOLVER, ""))
        acts.append(Action(j.job_id, kind, old, tuple(new), detail, code))
    return tuple(acts)
