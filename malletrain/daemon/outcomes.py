"""What happened to the malleable jobs, for ``status``: completions, completion time, wait,
and how evenly the harvested nodes went to users.

Per job the ledger notes when Slurm says it was submitted and the first cycle it was seen
running; a job is *completed* when Slurm reports it ended and its last run ended with its
final ``done`` record (what the safety net also reads; also a job the daemon cancelled because
its work had ended).  Its completion time is then
``end − submit`` and its wait ``first start − submit`` (both at cycle granularity).  Every
cycle each user is credited the node-seconds their running jobs held since the last cycle;
Jain's index over users' node-seconds (divided by their ``user_weights``) says how evenly
the harvest went (1: evenly).  Bounded: the newest ``MAX_OUTCOMES`` completions, at most
``MAX_USERS`` users (the least served are dropped first), jobs forgotten when they leave.
"""
from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from malletrain.core.backend import Observation
from malletrain.domain.stats import jain, percentile

MAX_OUTCOMES = 1000
MAX_USERS = 100_000
MAX_JOBS = 1 << 17      # jobs whose first start is remembered (forgotten when they leave)


@dataclass(frozen=True)
class Outcomes:
    """The ``outcomes`` block of ``status.json``."""

    completed: int                  # since the store was created
    jct_mean_s: float               # over the newest MAX_OUTCOMES completions
    jct_p95_s: float
    wait_mean_s: float
    wait_p95_s: float
    users: int
    jain_users: float


class Ledger:
    def __init__(self, weight: Callable[[str], float] = lambda user: 1.0) -> None:
        self.weight = weight
        self.submit: dict[str, float] = {}
        self.started: dict[str, float] = {}
        self.node_s: dict[str, float] = {}         # user -> node-seconds held
        self.done: list[tuple[float, float]] = []  # (completion time, wait) of completed jobs
        self.completed = 0
        self._last_t: float | None = None
        self._counted: set[str] = set()
        self._held: dict[str, int] = {}            # user -> nodes held at the last cycle

    def observe(self, obs: Observation, final: Mapping[str, bool | None]) -> None:
        now = obs.snapshot.now_s
        dt = 0.0 if self._last_t is None else max(0.0, now - self._last_t)
        self._last_t = now
        for user, size in self._held.items():       # what each user held since the last cycle
            self.node_s[user] = self.node_s.get(user, 0.0) + size * dt
        self._held = {}
        for j in obs.snapshot.jobs:
            self.submit.setdefault(j.job_id, j.spec.submit_s)
            if j.nodes:
                self.started.setdefault(j.job_id, now)
                if len(self.started) > MAX_JOBS:
                    del self.started[next(iter(self.started))]
                user = obs.facts[j.job_id].user if j.job_id in obs.facts else j.spec.owner
                self._held[user] = self._held.get(user, 0) + j.size
        for job in obs.ended:     # its last run ended with its final 'done' record (whatever Slurm says)
            if job in self._counted or final.get(job) is not True:
                continue
            self._counted.add(job)
            submit = self.submit.get(job)
            if submit:
                self.done.append((now - submit, self.started.get(job, now) - submit))
                del self.done[:-MAX_OUTCOMES]
            self.completed += 1
        for job in obs.finished:
            self.submit.pop(job, None)
            self.started.pop(job, None)
            self._counted.discard(job)
        if len(self.node_s) > MAX_USERS:
            for user in sorted(self.node_s, key=self.node_s.__getitem__)[:len(self.node_s) - MAX_USERS]:
                del self.node_s[user]

    def outcomes(self) -> Outcomes:
        jct = [d for d, _ in self.done]
        wait = [w for _, w in self.done]
        shares = [s / self.weight(u) for u, s in self.node_s.items()]
        return Outcomes(self.completed, statistics.fmean(jct) if jct else 0.0, percentile(jct, 0.95),
                        statistics.fmean(wait) if wait else 0.0, percentile(wait, 0.95),
                        len(shares), jain(shares))

    # persistence (the store keeps it across restarts)
    def dump(self) -> dict:
        return {"node_s": {u: round(s, 1) for u, s in self.node_s.items()}, "done": [list(d) for d in self.done],
                "completed": self.completed, "started": dict(self.started)}

    def load(self, data: dict) -> None:
        self.node_s = {str(u): float(s) for u, s in list(data.get("node_s", {}).items())[:MAX_USERS]}
        self.done = [(float(a), float(b)) for a, b in data.get("done", [])][-MAX_OUTCOMES:]
        self.completed = int(data.get("completed", 0))
        self.started = {str(j): float(t) for j, t in list(data.get("started", {}).items())[:MAX_JOBS]}
