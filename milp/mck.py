"""Exact fast path: the single-node-type problem is a multiple-choice knapsack.

Dynamic programme over capacity ``C`` (``dp_j[c]`` = best value of the first
j jobs using at most ``c`` nodes), one job at a time, vectorised with NumPy
over ``c``: O(J · K · C) for J jobs with K options each.  What keeps it small:

* ``C`` is capped at the sum of the largest option sizes, and an option whose
  value does not beat a smaller option's is dropped (exact: ``dp`` never
  decreases in ``c``);
* jobs go smallest first, so after k jobs the table is flat beyond the sum of
  their largest sizes (``reach``) and each job updates only that prefix; and
  job j's table is read only from ``C`` minus the largest sizes of the jobs
  after it (``low``), so it is computed only from there;
* each job's options are applied together, a few NumPy calls per job rather
  than two per option (numpy's fixed cost per call dominated at ~2,400 options
  per decision): the tables carry a front of −∞ as wide as the largest size, so
  ``dp_j[c − s]`` for every option ``s`` is one row of a strided window over the
  table; the rows are gathered into a (K, width) block, the gains added and the
  block's column maxima taken.  The same IEEE additions as option by option,
  and a maximum is exact, so every table is bitwise the same.  A block is at
  most ``BLOCK_ELEMENTS`` numbers; more options go in several blocks.

The choices are recovered by walking back through the stored ``dp_j`` arrays
and finding an option whose value reproduces ``dp_j[c]`` exactly (the same IEEE
additions are redone), trying the job's current size first so that an
indifferent job keeps its size, then no nodes, then the smallest size.
"""
from __future__ import annotations

import numpy as np

from malletrain.milp.problem import Allocation, JobChoice, Problem

BLOCK_ELEMENTS = 1 << 21       # numbers in one job's block of options (16 MiB of float64)


def _gains(job: JobChoice, cap: int) -> tuple[float, list[int], list[float]]:
    """(value of size 0, sizes, gains over size 0): the options worth more than every smaller one."""
    v0 = job.value_of(0)
    sizes, gains, best = [], [], 0.0
    for s, v in sorted(job.options):
        if 0 < s <= cap and v - v0 > best:
            best = v - v0
            sizes.append(s)
            gains.append(best)
    return v0, sizes, gains


def _apply(table: np.ndarray, new: np.ndarray, pad: int, low: int, top: int,
           sizes: list[int], gains: list[float], block: int) -> None:
    """``new[c] = max(new[c], max_s table[c − s] + gain_s)`` for ``low <= c <= top`` (indices
    without the −∞ front of ``pad``)."""
    start = max(low, sizes[0])
    width = top + 1 - start
    if width <= 0:
        return
    # row r of the window is table[r : r + width], i.e. dp[r − pad … ]; dp[c − s] for c = start…
    window = np.ndarray((table.size - width + 1, width), np.float64, table, 0, (8, 8))
    out = new[pad + start:pad + top + 1]
    step = max(1, block // width)
    for i in range(0, len(sizes), step):
        rows = window[pad + start - np.array(sizes[i:i + step])]
        rows += np.array(gains[i:i + step])[:, None]
        np.maximum(out, rows.max(axis=0), out=out)


def solve_mck(problem: Problem, block: int = BLOCK_ELEMENTS) -> Allocation:
    if len(problem.capacity) != 1:
        raise ValueError("the knapsack path needs exactly one node type")
    (ntype, cap), = problem.capacity.items()
    jobs = sorted(((max(o.size for o in j.options), j) for j in problem.jobs), key=lambda mj: mj[0])
    after = sum(m for m, _ in jobs)
    cap = max(0, min(int(cap), after))
    pad = jobs[-1][0] if jobs else 0
    first = np.full(pad + cap + 1, -np.inf)
    first[pad:] = 0.0
    tables, chosen_from, base, reach = [first], [], 0.0, 0
    for largest, j in jobs:
        after -= largest
        v0, sizes, gains = _gains(j, cap)
        base += v0
        chosen_from.append(dict(zip(sizes, gains)))
        table = tables[-1]
        new = table.copy()
        if sizes:
            reach = min(cap, reach + sizes[-1])
            # read from cap - after on; past reach the table is flat, so reach is the last needed
            _apply(table, new, pad, min(reach, max(0, cap - after)), reach, sizes, gains, block)
        new[pad + reach + 1:] = new[pad + reach]
        tables.append(new)
    allocated: dict[str, tuple[str | None, int]] = {}
    c = cap
    for idx in range(len(jobs) - 1, -1, -1):
        j, gain = jobs[idx][1], chosen_from[idx]
        prev, target = tables[idx][pad:], tables[idx + 1][pad + c]
        cur, pick = j.current_size, 0
        if 0 < cur <= c and cur in gain and prev[c - cur] + gain[cur] == target:
            pick = cur
        elif prev[c] != target:
            pick = next((s for s, g in gain.items() if s <= c and prev[c - s] + g == target), 0)
        allocated[j.job_id] = (ntype, pick) if pick else (None, 0)
        c -= pick
    return Allocation(sizes=allocated, objective=float(tables[-1][pad + cap] + base),
                      solver="mck-dp", status="optimal")
