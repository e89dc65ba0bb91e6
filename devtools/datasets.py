"""Build workloads and traces from the public data in ``shared/data``.

* :func:`pollux_curves` – measured throughput vs. replicas (Pollux/AdaptDL,
  Apache-2.0): samples/s = replicas · local_bsz / step_time, median over
  placements, one curve per (app, local batch).
* :func:`make_workload` – a seeded stream of malleable jobs whose ground-truth
  curves are those measurements; a node has ``GPUS_PER_NODE`` = 4 GPUs, as
  Pollux's machines did, so n nodes run 4·n replicas (only replica counts that
  are multiples of 4 are used; 1 node is extrapolated from 6 replicas).
* :func:`philly_trace` – the Philly per-minute active/total node counts
  (HeliosArtifact, MIT) turned into per-node events (most recently freed node
  is taken first).
* :func:`synthetic_trace` – a seeded Theta-like job stream on N nodes, for the
  replay-speed benchmark.
"""
from __future__ import annotations

import csv
import gzip
import os
import random
import statistics
from collections import defaultdict

import numpy as np
import yaml

from malletrain.domain.errors import InputError
from malletrain.domain.timeutil import iso, parse_time
from malletrain.replay.traces import NodeTrace, _assign_first_fit

APPS = ("bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3")
GPUS_PER_NODE = 4


def default_data_dir() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    for cand in (os.environ.get("MALLETRAIN_DATA", ""),
                 os.path.join(here, "..", "..", "shared", "data"),
                 os.path.join(here, "..", "shared", "data")):
        if cand and os.path.isdir(cand):
            return os.path.abspath(cand)
    return os.path.join(here, "examples", "data")


def pollux_curves(data_dir: str, app: str) -> dict[int, dict[int, float]]:
    """{local_bsz: {replicas: samples_per_s}} for one app."""
    path = os.path.join(data_dir, "scalability", "pollux", app, "scalability.csv")
    try:
        fh = open(path, encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot read Pollux data: {exc.strerror}", path=path) from exc
    by: dict[int, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    with fh:
        for row in csv.DictReader(fh):
            n, b = int(row["num_replicas"]), int(row["local_bsz"])
            by[b][n].append(n * b / float(row["step_time"]))
    return {b: {n: statistics.median(v) for n, v in sorted(d.items())} for b, d in sorted(by.items())}


def full_curves(data_dir: str) -> dict[str, dict[int, float]]:
    """For each app, the local batch measured at the most replica counts."""
    out = {}
    for app in APPS:
        curves = pollux_curves(data_dir, app)
        b = max(curves, key=lambda k: (len(curves[k]), -k))
        out[app] = curves[b]
    return out


# How much each model slows down on a slow node (the slowdown exponent a replay job gets with
# ``sensitive=True``), after PAL's application classes (SC'24: A compute-bound ... D
# memory-bound): the CNNs as class A, the recurrent/attention models as B, NCF as D.  An
# assumption for replay, stated here; the live daemon learns it from the jobs' own samples.
SENSITIVITY = {"imagenet": 1.0, "cifar10": 1.0, "yolov3": 1.0, "deepspeech2": 0.6, "bert": 0.6, "ncf": 0.1}
TOPOLOGY_PENALTY = 0.05   # share of the rate lost per extra topology group (replay assumption)


def make_workload(data_dir: str, n_jobs: int, span_s: float, seed: int = 0,
                  work_node_hours: tuple[float, float] = (2.0, 24.0), sensitive: bool = False) -> dict:
    """A seeded malleable workload: Poisson arrivals over ``span_s``; ``sensitive``: each job
    also slows down on slow nodes and across topology groups (:data:`SENSITIVITY`)."""
    rng = random.Random(seed)
    curves = full_curves(data_dir)
    jobs = []
    t = 0.0
    for i in range(n_jobs):
        app = APPS[rng.randrange(len(APPS))]
        reps = curves[app]
        curve = {n // GPUS_PER_NODE: x for n, x in reps.items() if n % GPUS_PER_NODE == 0}
        max_nodes = rng.choice([4, 8, 12, 16])
        min_nodes = rng.choice([1, 1, 2])
        # Work in samples: node-hours of throughput at the smallest measured count.
        lo = min(curve)
        per_node = curve[lo] / lo
        work = per_node * 3600 * rng.uniform(*work_node_hours)
        jobs.append({
            "name": f"{app}-{i:04d}", "submit": round(t, 1), "min_nodes": min_nodes,
            "max_nodes": max_nodes, "work": round(work, 1),
            "rescale_up_s": rng.choice([20, 30, 60]), "rescale_down_s": rng.choice([5, 10, 20]),
            "profile": app,
            **({"sensitivity": SENSITIVITY[app], "topology_penalty": TOPOLOGY_PENALTY} if sensitive else {}),
            "throughput": {int(n): round(x, 3) for n, x in sorted(curve.items())},
        })
        t += rng.expovariate(n_jobs / span_s)
    return {"jobs": jobs}


def write_workload(doc: dict, path: str) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("# Malleable workload; throughput = Pollux/AdaptDL measurements (Apache-2.0)\n")
        yaml.safe_dump(doc, fh, sort_keys=False, default_flow_style=None, width=200)


def philly_events(data_dir: str, start: str, hours: float, nodes: int | None = None) -> list[tuple]:
    """(time, node, state) rows from the Philly per-minute node sequence."""
    path = os.path.join(data_dir, "idle", "philly-node-sequence.csv")
    t0 = parse_time(start)
    t1 = t0 + hours * 3600
    rows = []
    with open(path, encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            t = parse_time(row["time"])
            if t0 <= t < t1:
                rows.append((t, int(row["active"]), int(row["total"])))
    if not rows:
        raise InputError(f"no Philly rows in [{start}, +{hours}h)", path=path)
    total = nodes or max(r[2] for r in rows)
    names = [f"philly{i:03d}" for i in range(total)]
    scale = total / max(r[2] for r in rows)
    busy_now = set()
    free_stack = list(reversed(names))     # most recently freed is taken first
    out = []
    for k, (t, active, _) in enumerate(rows):
        want = min(total, round(active * scale))
        while len(busy_now) < want:
            n = free_stack.pop()
            busy_now.add(n)
            if k:
                out.append((t, n, "busy"))
        while len(busy_now) > want:
            n = max(busy_now)    # deterministic choice
            busy_now.remove(n)
            free_stack.append(n)
            if k:
                out.append((t, n, "idle"))
        if k == 0:
            out += [(t, n, "busy" if n in busy_now else "idle") for n in names]
    return out


def write_events(rows: list[tuple], path: str) -> None:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wt", encoding="utf-8") as fh:
        fh.write("time,node,state\n")
        for t, n, s in rows:
            fh.write(f"{iso(t)},{n},{s}\n")


def synthetic_trace(nodes: int, days: float, target_events: int, seed: int = 0,
                    start: str = "2022-03-01T00:00:00Z") -> NodeTrace:
    """A seeded Theta-like primary workload on ``nodes`` nodes.

    An always-full FCFS queue without backfill: each job (log-uniform size
    1 … nodes/4, log-uniform run time 10 min … 18 h) starts as soon as enough
    nodes are free, so idle gaps come from head-of-line blocking as on a real
    machine.  Stops at ``target_events`` node events or after ``days``.
    """
    import heapq
    rng = np.random.default_rng(seed)
    t0 = parse_time(start)
    t_end = t0 + days * 86400
    free, t, events = nodes, t0, 0
    running: list[tuple[float, int]] = []
    starts, ends, sizes = [], [], []
    while events < target_events and t < t_end:
        size = int(np.exp(rng.uniform(0, np.log(max(2, nodes // 4)))))
        run = float(np.exp(rng.uniform(np.log(600), np.log(64800))))
        while free < size:
            end, k = heapq.heappop(running)
            t, free = max(t, end), free + k
        if t >= t_end:
            break
        heapq.heappush(running, (t + run, size))
        free -= size
        starts.append(t)
        ends.append(min(t + run, t_end))
        sizes.append(size)
        events += 2 * size
    tr = _assign_first_fit(np.array(starts), np.array(ends), np.array(sizes), nodes, 0, prefix="s")
    tr.start_s, tr.end_s = t0, t_end
    return tr


def longhorn_nodes(data_dir: str) -> list[tuple[str, float]]:
    """(cabinet, slowdown) of every TACC Longhorn node PAL measured (ResNet runs, MIT): a node's
    median iteration time over the median of all runs."""
    path = os.path.join(data_dir, "variability", "pal", "resnet-longhorn-agg.csv")
    by: dict[tuple[str, str], list[float]] = defaultdict(list)
    try:
        fh = open(path, encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot read PAL data: {exc.strerror}", path=path) from exc
    with fh:
        rows = list(csv.DictReader(fh))
    for row in rows:
        by[(row["cabinet"], row["cab-node"])].append(float(row["mean_iter_dur"]))
    med = statistics.median(float(r["mean_iter_dur"]) for r in rows)
    return [(cab, statistics.median(v) / med) for (cab, _node), v in sorted(by.items())]


def node_info_rows(data_dir: str, nodes: list[str], seed: int = 0) -> list[tuple[str, str, float]]:
    """(node, group, slowdown) for a trace's nodes: the measured Longhorn nodes dealt out in a
    seeded order, tiled as often as needed (tile k's cabinets are groups ``c002-k``...)."""
    measured = longhorn_nodes(data_dir)
    rng = random.Random(seed)
    out = []
    for k in range(0, len(nodes), len(measured)):
        deal = measured[:]
        rng.shuffle(deal)
        for name, (cab, sd) in zip(nodes[k:k + len(measured)], deal):
            out.append((name, f"{cab}-{k // len(measured)}", round(sd, 4)))
    return out
