"""A centre-sized queue: the daemon's steady cycle on a real slurmctld with ≥ 1,000 nodes and
tens of thousands of queued jobs.

The cluster (``scripts/local-slurm.sh`` in its own directory and port) has 4 emulated nodes
with a real slurmd each and ``--cloud-nodes`` more nodes declared ``State=CLOUD``: Slurm keeps
them powered down (``idle~``, no slurmd needed), lists them in every ``sinfo`` of the harvest
partition, and never starts a job there (no ResumeProgram, and every queued job here is held).
The daemon reads them every cycle and never harvests them (only exactly IDLE nodes are).

The queue is filled with held jobs of three users (root and two unprivileged users, created
like the hostile-user test's if missing) in both partitions; a tenth are tagged malleable jobs
in ``scavenger``.  At each queue size the real daemon cycle (``Daemon.cycle_once``, as
``malletrain bench slurm``) runs until every tag is read, then ``--cycles`` steady cycles, and
the benchmark reports per steady cycle:

* wall time (p50, p95) of the whole cycle: reads, parsing, ``decide()``, status and store;
* Slurm read commands and the bytes they printed;
* slurmctld's own account from ``sdiag`` (deltas over the steady cycles): RPCs it served and
  the server time they took, and that time as a share of the daemon's interval.

With ``--rest``, slurmrestd (JWT) runs beside slurmctld and, at each size, the daemon's queue read
(``squeue -o``, Slurm-written fields) is timed against ``GET /slurm/<version>/jobs`` — the read a
slurmrestd backend would make — and the JSON parse of its answer (median of 3 each).

Run from a checkout as root: ``python -m devtools bench scale`` (``benchmarks/scale.sh``).
"""
from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tqdm import tqdm

from devtools.bench_queue import BenchCluster
from malletrain.bench import Report
from malletrain.domain.stats import percentile

USERS = ("root", "mt-alice", "mt-mallory")
_RPC = re.compile(r"^\s*(\S+)\s+\(\s*\d+\)\s+count:(\d+)\s+ave_time:(\d+)\s+total_time:(\d+)")


class ScaleCluster(BenchCluster):
    def __init__(self, directory: str, port: int, *, slurm: str, cloud_nodes: int, max_jobs: int,
                 rest_port: int = 0) -> None:
        super().__init__(directory, port, max_jobs)
        self.slurm, self.cloud, self.rest_port = slurm, cloud_nodes, rest_port

    def up(self, *args: str) -> None:
        super().up("--slurm", self.slurm, "--cloud-nodes", str(self.cloud), "--rest", str(self.rest_port), *args)
        os.chmod(self.dir, 0o755)
        for p in (self.bin, os.path.dirname(self.conf)):
            os.chmod(p, 0o755)

    def count(self) -> int:
        """Jobs in the queue, an array's tasks each (elastic groups' members count as jobs)."""
        return len(self.run("squeue", "-h", "-a", "-r", "-o", "%i").stdout.split())

    def run(self, *argv: str, user: str = "root") -> subprocess.CompletedProcess:
        if user != "root":
            argv = ("runuser", "-u", user, "--", "env", f"SLURM_CONF={self.conf}",
                    f"PATH={self.env['PATH']}", *argv)
        return subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=300,
                              cwd="/tmp")


def _ensure_users() -> None:
    for name in USERS[1:]:
        try:
            pwd.getpwnam(name)
        except KeyError:
            subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", name], check=True)


def _submit(cluster: ScaleCluster, i: int, metrics_dir: str, groups: bool = False) -> None:
    from malletrain.slurm.parse import Tag
    user = USERS[i % len(USERS)]
    name = f"trial-{i:06d}-resnet50-lr0.{i % 97:02d}-bs{64 << (i % 4)}"
    if groups and i % 100 == 0:      # an elastic group (submit --elastic): a held array of 4 members
        tag = Tag(f"grp{i:08d}", 1, 4, "resnet50", 30, 10, metrics_dir, name, group=True).encode()
        args = ["-p", "scavenger", "--array=0-3", "--requeue", f"--comment={tag}"]
    elif i % 10 == 0:
        tag = Tag(f"tok{i:08d}", 1, 4, "resnet50", 30, 10, metrics_dir, name).encode()
        args = ["-p", "scavenger", f"--comment={tag}"]
    else:
        args = ["-p", "batch" if i % 3 else "scavenger", f"--comment=project {i % 50}: sweep {i // 50}"]
    out = cluster.run("sbatch", "--hold", "-N", "1", "-o", "/dev/null", f"--job-name={name}", *args,
                      "--wrap", "true", user=user)
    if out.returncode != 0:
        raise RuntimeError(f"sbatch as {user} failed: {out.stderr}")


def fill(cluster: ScaleCluster, target: int, metrics_dir: str, start: int, groups: bool = False) -> int:
    todo = range(start, start + max(0, target - cluster.count()))
    with ThreadPoolExecutor(max_workers=6) as pool:
        for _ in tqdm(pool.map(lambda i: _submit(cluster, i, metrics_dir, groups), todo), total=len(todo),
                      desc=f"queueing {target:,} jobs", unit="job", file=sys.stderr):
            pass
    return start + len(todo)


def sdiag_rpcs(cluster: ScaleCluster) -> dict[str, tuple[int, int]]:
    """RPC type → (count, total server time in µs), from ``sdiag``'s by-message-type section."""
    out, section = {}, False
    for line in cluster.run("sdiag").stdout.splitlines():
        if line.startswith("Remote Procedure Call statistics by message type"):
            section = True
            continue
        if section and line.startswith("Remote Procedure Call statistics by user"):
            break
        m = _RPC.match(line) if section else None
        if m:
            out[m.group(1)] = (int(m.group(2)), int(m.group(4)))
    return out


def _config(cluster: ScaleCluster, work: str, interval_s: float, groups: bool = False) -> str:
    path = os.path.join(work, "config.yaml")
    with open(path, "w") as fh:
        fh.write(f"core: {{horizon_s: 300}}\n"
                 f"slurm: {{slurm_conf: {cluster.conf}, bin_dir: {cluster.bin}, command_timeout_s: 120,"
                 f" retries: 0, reservations_every: 6, elastic_groups: {str(groups).lower()}}}\n"
                 f"daemon: {{interval_s: {interval_s}, state_dir: {work}/state, metrics_port: 0,"
                 f" progress_roots: [{work}]}}\n")
    return path


def measure(cluster: ScaleCluster, work: str, cycles: int, interval_s: float,
            groups: bool = False) -> dict[str, Any]:
    from malletrain.daemon.loop import Daemon
    d = Daemon(_config(cluster, work, interval_s, groups))
    try:
        adoption = 0
        while True:                   # until a cycle reads no tag: every job's tag is known
            tags0 = d.backend.events.tag_reads
            d.cycle_once()
            adoption += 1
            if d.backend.events.tag_reads == tags0 and adoption > 1:
                break
            if adoption > 2000:
                raise RuntimeError("tags still unread after 2000 cycles")
        before = sdiag_rpcs(cluster)
        rows = []
        seen: list[str] = []
        real = d.runner._exec

        def recording(argv, **kw):
            seen.append(" ".join([os.path.basename(argv[0]), *argv[1:3]]))
            return real(argv, **kw)
        d.runner._exec = recording
        for _ in range(cycles):
            seen.clear()
            b0 = d.runner.stats.total_read_bytes
            t0 = time.perf_counter()
            d.cycle_once()
            wall = time.perf_counter() - t0
            lc = d.last_cycle
            assert lc is not None
            rows.append(dict(cycle_s=wall, reads=lc.reads, writes=lc.writes,
                             read_bytes=d.runner.stats.total_read_bytes - b0, commands=list(seen)))
            time.sleep(max(0.0, interval_s - wall))
        after = sdiag_rpcs(cluster)
    finally:
        d.store.close()
    rpcs = {k: (after[k][0] - before.get(k, (0, 0))[0], after[k][1] - before.get(k, (0, 0))[1])
            for k in after if after[k][0] > before.get(k, (0, 0))[0]}
    steady = [r for r in rows if r["writes"] == 0]
    ms = [1000 * r["cycle_s"] for r in steady]
    server_us = sum(t for _, t in rpcs.values())
    return dict(adoption_cycles=adoption, steady_cycles=len(steady), groups=len(d.backend.groups),
                members=sum(len(m) for m in d.backend.groups.values()),
                cycle_ms_p50=percentile(ms, 0.5) if ms else None,
                cycle_ms_p95=percentile(ms, 0.95) if ms else None,
                reads_max=max((r["reads"] for r in steady), default=None),
                reads_mean=sum(r["reads"] for r in steady) / len(steady) if steady else None,
                commands_of_a_busiest_cycle=max(steady, key=lambda r: r["reads"])["commands"] if steady else [],
                read_mb_mean=sum(r["read_bytes"] for r in steady) / len(steady) / 1e6 if steady else None,
                ctld_rpcs_per_cycle=sum(c for c, _ in rpcs.values()) / max(1, len(rows)),
                ctld_ms_per_cycle=server_us / 1000 / max(1, len(rows)),
                ctld_share_of_interval=server_us / 1e6 / max(1, len(rows)) / interval_s,
                rpc_types={k: dict(count=c, total_ms=t / 1000) for k, (c, t) in sorted(rpcs.items())})


def rest_vs_cli(cluster: ScaleCluster, repeat: int = 3) -> dict[str, Any]:
    """The daemon's text queue read against slurmrestd's ``GET jobs`` (JWT) and its JSON parse."""
    import json
    import statistics
    import urllib.request

    from malletrain.slurm.parse import SQUEUE_FORMAT
    from malletrain.slurm.versions import parse_release
    token = cluster.run("scontrol", "token", "username=root", "lifespan=3600").stdout.strip().split("=", 1)[1]
    release = parse_release(cluster.run("sinfo", "--version").stdout)
    if not release.data_parser:
        raise RuntimeError(f"no REST API version known for Slurm {release.text} (slurm/versions.py)")
    url = f"http://127.0.0.1:{cluster.rest_port}/slurm/{release.data_parser}/jobs"
    text_s, rest_s, parse_s, text_b, rest_b = [], [], [], 0, 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = cluster.run("squeue", "-h", "-a", "-o", SQUEUE_FORMAT)
        text_s.append(time.perf_counter() - t0)
        text_b = len(out.stdout.encode())
        req = urllib.request.Request(url, headers={"X-SLURM-USER-NAME": "root", "X-SLURM-USER-TOKEN": token})
        t0 = time.perf_counter()
        with urllib.request.urlopen(req, timeout=300) as resp:
            body = resp.read()
        rest_s.append(time.perf_counter() - t0)
        rest_b = len(body)
        t0 = time.perf_counter()
        n = len(json.loads(body)["jobs"])
        parse_s.append(time.perf_counter() - t0)
    return dict(text_ms=1000 * statistics.median(text_s), text_mb=text_b / 1e6,
                rest_ms=1000 * statistics.median(rest_s), rest_mb=rest_b / 1e6,
                rest_parse_ms=1000 * statistics.median(parse_s), rest_jobs=n, rest_path=url.split("/", 3)[3])


def _occupy(cluster: ScaleCluster) -> None:
    """A primary job on the 4 real nodes for the whole benchmark: a busy centre, where the daemon
    reads everything each cycle and has nothing to change (steady cycles)."""
    out = cluster.run("sbatch", "--parsable", "-p", "batch", "-N", "4", "-w", "n[1-4]", "-o", "/dev/null",
                      "--wrap", "sleep 1000000")
    if out.returncode != 0:
        raise RuntimeError(f"sbatch failed: {out.stderr}")
    job = out.stdout.strip().split(";")[0]
    for _ in range(120):
        if cluster.run("squeue", "-h", "-j", job, "-o", "%T").stdout.strip() == "RUNNING":
            return
        time.sleep(0.5)
    raise RuntimeError("the primary job holding the 4 real nodes did not start")


def run(jobs: list[int], *, slurm: str, cloud_nodes: int, directory: str, port: int, cycles: int,
        interval_s: float, keep: bool, rest: bool = False, groups: bool = False) -> Report:
    _ensure_users()
    cluster = ScaleCluster(directory, port, slurm=slurm, cloud_nodes=cloud_nodes, max_jobs=max(jobs) + 10_000,
                           rest_port=port + 50 if rest else 0)
    cluster.up()
    work = tempfile.mkdtemp(prefix="malletrain-scale-")
    os.chmod(work, 0o755)
    rows, nxt = [], 0
    version = cluster.run("sinfo", "--version").stdout.split()[-1]
    nodes = len(cluster.run("sinfo", "-h", "-N", "-p", "scavenger", "-o", "%N").stdout.split())
    try:
        for user in USERS:
            cluster.run("scancel", "--quiet", "-u", user)
        time.sleep(2)
        _occupy(cluster)
        for n in sorted(jobs):
            nxt = fill(cluster, n, work, nxt, groups)
            queued = cluster.count()
            row = dict(jobs=queued, **measure(cluster, work, cycles, interval_s, groups))
            if rest:
                row["rest"] = rest_vs_cli(cluster)
            rows.append(row)
    finally:
        if not keep:
            for user in USERS:
                cluster.run("scancel", "--quiet", "-u", user)
            cluster.script("down")
            shutil.rmtree(directory, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    data = dict(slurm=version, nodes=nodes, cloud_nodes=cloud_nodes, interval_s=interval_s, cycles=cycles,
                users=len(USERS), elastic_groups=groups, rows=rows)
    return Report(data, lines(data))


def lines(data: dict[str, Any]) -> list[str]:
    """The table a person reads (also from a saved ``--json`` report)."""
    out = [f"centre-sized queue on a real slurmctld (Slurm {data['slurm']}): {data['nodes']} nodes in the "
           f"harvest partition (4 with slurmd, busy with a primary job; {data['cloud_nodes']} CLOUD, powered "
           f"down), held jobs of {data['users']} users in 2 partitions, 10% tagged malleable; "
           f"{data['cycles']} steady daemon cycles per size, interval {data['interval_s']:g} s",
           f"{'jobs':>7} | {'cycle p50':>9} | {'cycle p95':>9} | {'reads':>5} | {'MB read':>7} | "
           f"{'ctld RPCs':>9} | {'ctld ms':>7} | {'ctld share':>10} | adoption"]
    for r in data["rows"]:
        out.append(f"{r['jobs']:>7,} | {r['cycle_ms_p50']:6.0f} ms | {r['cycle_ms_p95']:6.0f} ms | "
                   f"{r['reads_max']:>5} | {r['read_mb_mean']:7.2f} | {r['ctld_rpcs_per_cycle']:9.1f} | "
                   f"{r['ctld_ms_per_cycle']:7.1f} | {100 * r['ctld_share_of_interval']:9.2f}% | "
                   f"{r['adoption_cycles']} cycles")
        if data.get("elastic_groups"):
            out.append(f"{'':>7}   elastic groups on: {r['groups']} groups adopted, {r['members']} members "
                       f"(held), every member counted in jobs; reads of the busiest steady cycle: "
                       f"{', '.join(r['commands_of_a_busiest_cycle'])}")
    out.append("per steady cycle; reads = the daemon's Slurm read commands (max), ctld = slurmctld's own "
               "count and time of the RPCs it served (sdiag)")
    out.append("target: steady cycle <= 1 s and <= 3 read commands at 20,000 jobs")
    rest = [r for r in data["rows"] if "rest" in r]
    if rest:
        out.append(f"queue read: the daemon's squeue text vs slurmrestd GET /{rest[0]['rest']['rest_path']} "
                   "(JWT), median of 3")
        out.append(f"{'jobs':>7} | {'squeue text':>18} | {'slurmrestd':>18} | {'+ json parse':>12} | {'ratio':>6}")
        for r in rest:
            x = r["rest"]
            out.append(f"{r['jobs']:>7,} | {x['text_ms']:6.0f} ms {x['text_mb']:5.2f} MB | {x['rest_ms']:6.0f} ms "
                       f"{x['rest_mb']:5.1f} MB | {x['rest_parse_ms']:9.0f} ms | "
                       f"{(x['rest_ms'] + x['rest_parse_ms']) / x['text_ms']:5.1f}x")
    return out
