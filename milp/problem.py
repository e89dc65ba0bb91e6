"""The count-based allocation problem.

Each job picks exactly one option (size, value) on one node type; the sizes
chosen on a type must fit its capacity.  Size 0 ("no nodes") is always an
option.  Values are whatever the caller computed; :func:`job_values` is the
DESIGN.md objective ``H·T(n) − pause(c→n)·T(c)``.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from malletrain.domain.errors import InputError


class Option(NamedTuple):
    size: int
    value: float


@dataclass(frozen=True)
class JobChoice:
    job_id: str
    options: tuple[Option, ...]       # must contain size 0
    node_types: tuple[str, ...]       # types it may run on (one if it is running)
    current_size: int = 0

    def value_of(self, size: int) -> float:
        for o in self.options:
            if o.size == size:
                return o.value
        raise KeyError(size)


@dataclass(frozen=True)
class Problem:
    jobs: tuple[JobChoice, ...]
    capacity: Mapping[str, int]

    def validate(self) -> None:
        for j in self.jobs:
            if not any(o.size == 0 for o in j.options):
                raise InputError(f"job {j.job_id}: options lack size 0")
            if any(o.size < 0 for o in j.options):
                raise InputError(f"job {j.job_id}: negative size")
            if not j.node_types:
                raise InputError(f"job {j.job_id}: no node type")


@dataclass(frozen=True)
class Allocation:
    """Chosen (node type, size) per job; size 0 jobs have type ``None``."""

    sizes: Mapping[str, tuple[str | None, int]]
    objective: float
    solver: str
    status: str                       # optimal | incumbent | fallback | kept
    notes: tuple[str, ...] = field(default=())

    def size(self, job_id: str) -> int:
        return self.sizes.get(job_id, (None, 0))[1]


def evaluate(problem: Problem, sizes: Mapping[str, tuple[str | None, int]]) -> float:
    """Objective of an assignment; raises ``ValueError`` if it is infeasible."""
    used: dict[str, int] = {}
    total = 0.0
    for j in problem.jobs:
        t, n = sizes.get(j.job_id, (None, 0))
        total += j.value_of(n)
        if n:
            if t not in j.node_types:
                raise ValueError(f"{j.job_id} on type {t} not allowed")
            used[t] = used.get(t, 0) + n
    for t, n in used.items():
        if n > problem.capacity.get(t, 0):
            raise ValueError(f"type {t}: {n} nodes > capacity {problem.capacity.get(t, 0)}")
    return total


def job_values(sizes: list[int], current: int, horizon_s: float,
               up_s: float, down_s: float,
               throughput: Callable[[int], float]) -> tuple[Option, ...]:
    """Options for one job: ``H·T(n) − pause(c→n)·T(c)``.

    Pauses are charged at the current rate T(c), as in BFTrainer; starting
    from 0 nodes therefore costs nothing in the objective (its real pause is
    still simulated in replay).
    """
    cur_rate = throughput(current) if current > 0 else 0.0
    up_cost, down_cost = up_s * cur_rate, down_s * cur_rate
    out = [Option(0, -down_cost if current > 0 else 0.0)]
    for n in sorted(set(sizes)):
        if n > 0:
            cost = up_cost if n > current else down_cost if n < current else 0.0
            out.append(Option(n, horizon_s * throughput(n) - cost))
    return tuple(out)
