"""What the unforgeable queue read costs, on a real slurmctld with thousands of queued jobs.

Slurm prints job names and comments raw in ``squeue -o`` formats, so the daemon reads the
whole queue in a format that holds only Slurm-written fields (SECURITY.md) and each malleable
job's tag alone, once.  This benchmark fills the local cluster's queue (``scripts/local-slurm.sh``
in its own directory and port) with held jobs — most in ``batch``, a tenth tagged malleable jobs
in ``scavenger``, names and comments of realistic length — and times, at each queue size:

* ``text``: the daemon's queue read (``squeue -h -a -o`` Slurm-written fields only);
* ``text+user``: the same with ``%j|%k`` (name, comment), the unsafe format it replaced;
* ``json``: ``squeue --json`` (escapes user text; the other safe choice);
* the daemon's first cycles (tags read ``max_tag_reads`` per cycle) and its steady ``observe()``
  once every tag is known: wall time and Slurm read commands per cycle.

Run from a checkout as root: ``python -m devtools bench queue --jobs 3000,30000``
(``benchmarks/queue-read.sh``).  Submitting 30,000 jobs takes a few minutes.
"""
from __future__ import annotations

import os
import shutil
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from tqdm import tqdm

from devtools.local_slurm import LocalSlurm
from malletrain.bench import Report


@dataclass(frozen=True)
class Read:
    seconds: float      # median wall time
    nbytes: int
    lines: int


class BenchCluster(LocalSlurm):
    def __init__(self, directory: str, port: int, max_jobs: int) -> None:
        super().__init__(directory, port)
        self.max_jobs = max_jobs

    def up(self, *args: str) -> None:
        super().up("--nodes", "4", "--max-jobs", str(self.max_jobs), *args)


def _submit(cluster: BenchCluster, i: int, metrics_dir: str) -> None:
    from malletrain.slurm.parse import Tag
    name = f"trial-{i:06d}-resnet50-lr0.{i % 97:02d}-bs{64 << (i % 4)}"
    if i % 10 == 0:
        tag = Tag(f"tok{i:08d}", 1, 4, "resnet50", 30, 10, metrics_dir, name).encode()
        args = ["-p", "scavenger", f"--comment={tag}"]
    else:
        args = ["-p", "batch", f"--comment=project {i % 50}: sweep {i // 50}, see wiki/page-{i % 7}"]
    out = cluster.run("sbatch", "--hold", "-N", "1", "-o", "/dev/null", f"--job-name={name}", *args,
                      "--wrap", "true")
    if out.returncode != 0:
        raise RuntimeError(f"sbatch failed: {out.stderr}")


def fill(cluster: BenchCluster, target: int, metrics_dir: str, start: int) -> int:
    have = cluster.count()
    todo = range(start, start + max(0, target - have))
    with ThreadPoolExecutor(max_workers=6) as pool:
        for _ in tqdm(pool.map(lambda i: _submit(cluster, i, metrics_dir), todo), total=len(todo),
                      desc=f"queueing {target:,} jobs", unit="job", file=sys.stderr):
            pass
    return start + len(todo)


def timed(cluster: BenchCluster, argv: list[str], repeat: int) -> Read:
    times, out = [], ""
    for _ in range(repeat):
        t0 = time.perf_counter()
        res = cluster.run(*argv)
        times.append(time.perf_counter() - t0)
        if res.returncode != 0:
            raise RuntimeError(f"{argv}: {res.stderr}")
        out = res.stdout
    return Read(statistics.median(times), len(out.encode()), out.count("\n"))


def daemon_cycles(cluster: BenchCluster, repeat: int) -> dict[str, Any]:
    from malletrain.domain.config import DaemonConfig, SlurmConfig
    from malletrain.slurm.adapter import SlurmBackend
    from malletrain.slurm.runner import Runner
    runner = Runner(slurm_conf=cluster.conf, timeout_s=120, retries=0)
    daemon = DaemonConfig(interval_s=10, state_dir="/nonexistent", vacate_lead_s=0)
    backend = SlurmBackend(runner, SlurmConfig(slurm_conf=cluster.conf, reservations_every=0), daemon)
    first, cycles = [], 0
    while True:
        runner.stats.take()
        t0 = time.perf_counter()
        backend.observe()
        first.append(time.perf_counter() - t0)
        cycles += 1
        reads, _, _ = runner.stats.take()
        if reads <= 2:            # no tag left to read: a steady cycle
            break
    steady, reads_steady = [], []
    for _ in range(repeat):
        runner.stats.take()
        t0 = time.perf_counter()
        obs = backend.observe()
        steady.append(time.perf_counter() - t0)
        reads_steady.append(runner.stats.take()[0])
    return dict(tagged=len(obs.facts), adoption_cycles=cycles, adoption_cycle_s=statistics.median(first),
                steady_s=statistics.median(steady), steady_reads=max(reads_steady))


def run(jobs: list[int], *, directory: str, port: int, repeat: int, keep: bool) -> Report:
    cluster = BenchCluster(directory, port, max(jobs) + 10_000)
    cluster.up()
    metrics_dir = os.path.join(directory, "metrics")
    os.makedirs(metrics_dir, exist_ok=True)
    rows, nxt = [], 0
    from malletrain.slurm.parse import SQUEUE_FORMAT
    version = _version(cluster)
    try:
        cluster.run("scancel", "--quiet", "-u", "root")
        time.sleep(2)
        for n in sorted(jobs):
            nxt = fill(cluster, n, metrics_dir, nxt)
            queued = cluster.count()
            text = timed(cluster, ["squeue", "-h", "-a", "-o", SQUEUE_FORMAT], repeat)
            unsafe = timed(cluster, ["squeue", "-h", "-a", "-o", SQUEUE_FORMAT + "|%j|%k"], repeat)
            js = timed(cluster, ["squeue", "--json"], repeat)
            rows.append(dict(jobs=queued, text=text.__dict__, text_user=unsafe.__dict__, json=js.__dict__,
                             daemon=daemon_cycles(cluster, repeat)))
    finally:
        if not keep:
            cluster.run("scancel", "--quiet", "-u", "root")
            cluster.script("down")
            shutil.rmtree(directory, ignore_errors=True)
    lines = ["queue read on a real slurmctld (Slurm " + version + "), median of "
             f"{repeat}; 10% of the jobs tagged malleable in scavenger",
             f"{'jobs':>7} | {'text (daemon)':>20} | {'text + %j|%k':>20} | {'squeue --json':>20} | "
             f"{'json/text':>9} | {'adoption':>18} | {'steady observe()':>18}"]
    for r in rows:
        t, u, j, d = r["text"], r["text_user"], r["json"], r["daemon"]
        lines.append(f"{r['jobs']:>7,} | {t['seconds']*1000:7.0f} ms {t['nbytes']/1e6:6.2f} MB | "
                     f"{u['seconds']*1000:7.0f} ms {u['nbytes']/1e6:6.2f} MB | "
                     f"{j['seconds']*1000:7.0f} ms {j['nbytes']/1e6:6.2f} MB | {j['seconds']/t['seconds']:8.1f}x | "
                     f"{d['adoption_cycles']:3d} cycles {d['adoption_cycle_s']*1000:5.0f} ms | "
                     f"{d['steady_s']*1000:6.0f} ms, {d['steady_reads']} reads")
    return Report(dict(rows=rows), lines)


def _version(cluster: BenchCluster) -> str:
    out = cluster.run("sinfo", "--version").stdout.split()
    return out[-1] if out else "?"
