"""Turn per-job sizes into concrete nodes.

Rules, in order:
1. a continuing job keeps its nodes; a shrinking one releases the nodes with
   the shortest predicted idle window first (unknown windows count as long);
2. growing jobs (FIFO order) take free nodes of their type with the longest
   window, preferring the topology group that holds most of their nodes,
   then low variability;
3. starting jobs take a whole group when one has room (the group with the
   most free nodes), else the longest-window nodes across groups.
Never assigns a node twice, never a node outside the pool, never migrates.
"""
from __future__ import annotations

import math
from collections import Counter
from typing import Mapping, Sequence

from malletrain.model import JobState, Node


def _window(node: Node) -> float:
    return math.inf if node.window_end_s is None else node.window_end_s


def place(nodes: Sequence[Node], jobs: Sequence[JobState],
          targets: Mapping[str, tuple[str | None, int]]) -> dict[str, tuple[str, ...]]:
    by_name = {n.name: n for n in nodes}
    out: dict[str, tuple[str, ...]] = {}
    held: set[str] = set()
    for job in jobs:
        own = [by_name[n] for n in job.nodes if n in by_name]
        want = targets.get(job.job_id, (None, 0))[1]
        keep = sorted(own, key=lambda n: (-_window(n), n.variability, n.name))[:want]
        out[job.job_id] = tuple(n.name for n in keep)
        held.update(out[job.job_id])
    free = [n for n in nodes if n.name not in held]

    def take(job_id: str, ntype: str | None, count: int, prefer_group: str | None) -> None:
        nonlocal free
        pool = [n for n in free if ntype is None or n.node_type == ntype]
        if prefer_group is None and pool:
            groups = Counter(n.group for n in pool)
            fits = [g for g, c in groups.items() if c >= count]
            prefer_group = (max(fits, key=lambda g: (groups[g], g)) if fits
                            else max(groups, key=lambda g: (groups[g], g)))
        pool.sort(key=lambda n: (n.group != prefer_group, -_window(n), n.variability, n.name))
        got = pool[:count]
        if len(got) < count:
            raise ValueError(f"placement: job {job_id} needs {count} more nodes of type "
                             f"{ntype}, only {len(got)} free")
        names = {n.name for n in got}
        free = [n for n in free if n.name not in names]
        out[job_id] = out[job_id] + tuple(n.name for n in got)

    for job in jobs:  # growers first: they are already running
        ntype, want = targets.get(job.job_id, (None, 0))
        have = len(out[job.job_id])
        if have and want > have:
            groups = Counter(by_name[n].group for n in out[job.job_id])
            take(job.job_id, ntype or job.node_type, want - have, groups.most_common(1)[0][0])
    for job in jobs:
        ntype, want = targets.get(job.job_id, (None, 0))
        if not out[job.job_id] and want > 0:
            take(job.job_id, ntype, want, None)
    return out
