"""``malletrain daemon``: the service loop on a login node.

Each interval: observe Slurm (idle nodes, windows, malleable jobs, progress
files) → decide → reconcile → apply, through the same :func:`run_cycle` that
replay uses.  Around it: state in sqlite (re-adopted on start), JSON logs,
a Prometheus endpoint, sd_notify, SIGHUP reload (the old config stays on
error), SIGTERM stops after the current cycle without touching any job.
A Slurm outage (commands failing or timing out) is logged once, counted and
waited out; the loop never dies of it.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from dataclasses import replace
from typing import Callable

from malletrain.domain.config import Config, load_config
from malletrain.core.cycle import CycleMemo, CycleResult, PlanError, run_cycle
from malletrain.domain.errors import BackendError, ConfigError
from malletrain.domain.model import ActionKind, Plan
from malletrain.core.curves import CurveSource
from malletrain.daemon.progress import ProgressTail
from malletrain.daemon.service import Metrics, Notifier, serve_metrics
from malletrain.daemon.store import Store
from malletrain.core.backend import Observation
from malletrain.slurm.adapter import SlurmBackend
from malletrain.slurm.parse import Phase
from malletrain.slurm.runner import Runner

log = logging.getLogger("malletrain.daemon")

DAEMON_POLICIES = ("malletrain", "static")


def check_config(cfg: Config, where: str) -> Config:
    if cfg.core.policy not in DAEMON_POLICIES:
        raise ConfigError(f"the daemon has no true curves; use one of {', '.join(DAEMON_POLICIES)}",
                          path=where, field="core.policy")
    return cfg


def make_runner(cfg: Config) -> Runner:
    s = cfg.slurm
    return Runner(slurm_conf=s.slurm_conf or None, timeout_s=s.command_timeout_s,
                  retries=s.retries, backoff_s=s.backoff_s)


class _Recording:
    """Wraps the backend: persists samples and progress offsets as they arrive."""

    def __init__(self, daemon: "Daemon") -> None:
        self.d = daemon

    def observe(self) -> Observation:
        d = self.d
        obs = d.backend.observe()
        d.store.add_samples(obs.samples)
        tails = d.tail.dump()
        if tails != d.saved_tails:     # offsets moved: persist them
            d.store.put("tails", tails)
            d.saved_tails = tails
        for s in obs.samples:
            d.measured[s.job_id] = (s.nodes, s.samples_per_s, s.t_s)
        if d.restored:
            obs = replace(obs, samples=tuple(d.restored) + obs.samples)
            d.restored = []
        d.last_obs = obs
        return obs

    def apply(self, actions) -> None:
        changes = [a for a in actions if a.kind not in (ActionKind.KEEP, ActionKind.WAIT)]
        self.d.store.add_actions(self.d.clock(), self.d.cycle, changes)
        self.d.backend.apply(actions)


class Daemon:
    def __init__(self, config_path: str, *, runner: Runner | None = None,
                 clock: Callable[[], float] = time.time, log_filter=None) -> None:
        self.config_path = config_path
        self.config = check_config(load_config(config_path), config_path)
        self.clock = clock
        self.log_filter = log_filter
        dc = self.config.daemon
        os.makedirs(dc.state_dir, exist_ok=True)
        self.store = Store(os.path.join(dc.state_dir, "state.db"))
        self.runner = runner or make_runner(self.config)
        self.tail = ProgressTail(max_line_bytes=dc.max_line_bytes)
        self.saved_tails = self.store.get("tails", {})
        self.tail.load(self.saved_tails)
        books = self.store.books()
        self.backend = SlurmBackend(self.runner, self.config.slurm, dc, tail=self.tail, clock=clock,
                                    save_book=self.store.save_book, books=books)
        self.source = CurveSource(self.config.core)
        self.restored = self.store.samples()
        self.cycle = int(self.store.get("cycle", 0))
        self.memo = CycleMemo()
        self.plan: Plan | None = None
        self.last_obs: Observation | None = None
        self.measured: dict[str, tuple] = {}
        self.reasons: dict[str, str] = {}
        self.slurm_down_since: float | None = None
        self.metrics = Metrics()
        self._describe()
        self.notifier = Notifier()
        self._wake = threading.Event()
        self._stop = False
        self._reload = False
        log.info("state %s: %d job book(s), %d JPA sample(s) restored; adopting jobs from Slurm",
                 self.store.path, len(books), len(self.restored))

    # ------------------------------------------------------------ one cycle
    def cycle_once(self) -> CycleResult | None:
        self.cycle += 1
        if self.log_filter is not None:
            self.log_filter.cycle = self.cycle
        self.store.put("cycle", self.cycle)
        t0 = time.perf_counter()
        self.runner.stats.take()
        result = None
        try:
            result = run_cycle(_Recording(self), self.source, self.config.core, self.plan, self.memo)
        except BackendError as exc:
            self.metrics.inc("malletrain_cycle_errors_total", kind="slurm")
            if self.slurm_down_since is None:
                self.slurm_down_since = self.clock()
                log.error("Slurm is unreachable, waiting for it (jobs are left as they are): %s", exc)
            else:
                log.warning("Slurm still unreachable after %.0fs: %s",
                            self.clock() - self.slurm_down_since, exc)
        except PlanError as exc:
            self.metrics.inc("malletrain_cycle_errors_total", kind="plan")
            log.error("plan rejected, nothing applied: %s", exc)
        else:
            if self.slurm_down_since is not None:
                log.info("Slurm is back after %.0fs", self.clock() - self.slurm_down_since)
                self.slurm_down_since = None
            self.plan = result.plan
            for a in result.plan.actions:
                self.reasons[a.job_id] = a.reason
        reads, writes, lat = self.runner.stats.take()
        cycle_s = time.perf_counter() - t0
        self._export(result, reads, writes, lat, cycle_s)
        self._write_status(result)
        self.notifier.watchdog()
        return result

    # ------------------------------------------------------------ loop
    def run(self) -> int:
        dc = self.config.daemon
        server = None
        if dc.metrics_port:
            server = serve_metrics(self.metrics, dc.metrics_host, dc.metrics_port)
            log.info("metrics on http://%s:%d/metrics", dc.metrics_host, dc.metrics_port)
        old = {s: signal.signal(s, self._signal) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
        self.notifier.ready(f"interval {dc.interval_s:g}s")
        log.info("started: interval %.0fs, partition %s, policy %s", dc.interval_s,
                 self.config.slurm.partition, self.config.core.policy)
        try:
            while not self._stop:
                started = time.monotonic()
                if self._reload:
                    self._do_reload()
                self.cycle_once()
                self._wake.wait(max(0.0, self.config.daemon.interval_s - (time.monotonic() - started)))
                self._wake.clear()
        finally:
            self.notifier.stopping()
            log.info("stopping after cycle %d; malleable jobs keep running as they are", self.cycle)
            for s, h in old.items():
                signal.signal(s, h)
            if server is not None:
                server.shutdown()
            self.store.close()
        return 0

    def _signal(self, signum, frame) -> None:
        if signum == signal.SIGHUP:
            self._reload = True
        else:
            self._stop = True
        self._wake.set()

    def _do_reload(self) -> None:
        self._reload = False
        try:
            new = check_config(load_config(self.config_path), self.config_path)
        except ConfigError as exc:
            log.error("reload failed, keeping the running config: %s", exc)
            self.metrics.inc("malletrain_reload_failures_total")
            return
        if (new.daemon.metrics_port, new.daemon.state_dir) != (self.config.daemon.metrics_port,
                                                               self.config.daemon.state_dir):
            log.warning("metrics_port and state_dir changes take effect at the next restart")
        self.config = new
        self.source = CurveSource(new.core, advisor=self.source.advisor)
        self.backend.slurm, self.backend.daemon = new.slurm, new.daemon
        fresh = make_runner(new)
        self.runner.env, self.runner.timeout_s = fresh.env, fresh.timeout_s
        self.runner.retries, self.runner.backoff_s = fresh.retries, fresh.backoff_s
        self.memo = CycleMemo()
        log.info("config reloaded from %s", self.config_path)

    # ------------------------------------------------------------ outputs
    def _describe(self) -> None:
        m = self.metrics
        for name, kind, text in [
            ("malletrain_idle_nodes", "gauge", "Harvestable idle nodes seen by the last cycle"),
            ("malletrain_allocated_nodes", "gauge", "Nodes malleable jobs hold"),
            ("malletrain_jobs", "gauge", "Malleable jobs by state"),
            ("malletrain_preemptions_total", "counter", "Malleable jobs requeued by Slurm"),
            ("malletrain_rescales_total", "counter", "Grow/shrink operations applied"),
            ("malletrain_starts_total", "counter", "Jobs started by the daemon"),
            ("malletrain_stops_total", "counter", "Jobs stopped by the daemon"),
            ("malletrain_vacates_total", "counter", "Proactive vacates before a primary job's start"),
            ("malletrain_decision_seconds", "summary", "decide() latency"),
            ("malletrain_cycle_seconds", "summary", "Whole cycle latency"),
            ("malletrain_slurm_command_seconds", "summary", "Slurm command latency"),
            ("malletrain_slurm_commands_last_cycle", "gauge", "Slurm commands in the last cycle"),
            ("malletrain_slurm_up", "gauge", "1 when the last cycle reached Slurm"),
            ("malletrain_cycle_errors_total", "counter", "Cycles that failed"),
            ("malletrain_progress_lines_skipped_total", "counter", "Malformed or oversized progress lines"),
        ]:
            m.describe(name, kind, text)

    def _export(self, result, reads, writes, lat, cycle_s) -> None:
        m, b = self.metrics, self.backend
        m.set("malletrain_slurm_up", 0 if self.slurm_down_since is not None else 1)
        m.set("malletrain_slurm_commands_last_cycle", reads, kind="read")
        m.set("malletrain_slurm_commands_last_cycle", writes, kind="write")
        for cmd, secs, _kind in lat:
            m.observe("malletrain_slurm_command_seconds", secs, command=cmd)
        m.observe("malletrain_cycle_seconds", cycle_s)
        if result is not None and not result.reused:
            m.observe("malletrain_decision_seconds", result.decision_ms / 1000.0)
        m.set("malletrain_idle_nodes", b.idle_nodes)
        m.set("malletrain_allocated_nodes", sum(len(r.nodes) for r in b.records.values()
                                                if r.phase is Phase.RUNNING))
        for phase in Phase:
            m.set("malletrain_jobs", sum(1 for r in b.records.values() if r.phase is phase),
                  state=phase.value)
        e = b.events
        for name, value in (("preemptions", e.preemptions), ("rescales", e.rescales),
                            ("starts", e.starts), ("stops", e.stops), ("vacates", e.vacates)):
            m.set(f"malletrain_{name}_total", value)
        c = self.tail.counters
        m.set("malletrain_progress_lines_skipped_total", c.bad + c.oversized)
        self.last_cycle = dict(reads=reads, writes=writes, cycle_s=cycle_s,
                               decision_ms=result.decision_ms if result else None,
                               reused=bool(result and result.reused))

    def _write_status(self, result: CycleResult | None) -> None:
        b = self.backend
        curves = self.source.curves(self.last_obs.snapshot) if self.last_obs else {}
        jobs = []
        for jid, r in sorted(b.records.items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else 0):
            tag = b.tags.get(jid)
            size = len(r.nodes) if r.phase is Phase.RUNNING else 0
            curve = curves.get(jid)
            meas = self.measured.get(jid)
            hist = self.store.history(jid, 5)
            jobs.append(dict(
                job=jid, name=r.name, user=r.user, state=r.phase.value, slurm_state=r.state,
                slurm_reason=r.reason, nodes=list(r.nodes) if size else [], size=size,
                min_nodes=tag.min_nodes if tag else None, max_nodes=tag.max_nodes if tag else None,
                profile=tag.profile if tag else "",
                measured=dict(nodes=meas[0], samples_per_s=meas[1], t=meas[2]) if meas else None,
                predicted=curve.mean(size) if curve and size else None,
                curve_source=curve.source if curve else None,
                curve={str(n): round(p.mean, 3) for n, p in sorted(curve.points.items())} if curve else {},
                probe=curve.probe if curve else None,
                reason=self.reasons.get(jid, ""),
                last_action=hist[-1] if hist else None,
                history=hist))
        e = b.events
        status = dict(
            t=self.clock(), cycle=self.cycle, slurm_up=self.slurm_down_since is None,
            interval_s=self.config.daemon.interval_s, partition=self.config.slurm.partition,
            idle_nodes=b.idle_nodes, vacating=sorted(b.vacating),
            counters=dict(preemptions=e.preemptions, rescales=e.rescales, starts=e.starts,
                          stops=e.stops, vacates=e.vacates, failed_actions=e.failed_actions,
                          progress_lines=self.tail.counters.lines,
                          progress_lines_skipped=self.tail.counters.bad + self.tail.counters.oversized,
                          slurm_reads=self.runner.stats.total_reads,
                          slurm_writes=self.runner.stats.total_writes),
            last_cycle=getattr(self, "last_cycle", {}), jobs=jobs)
        path = os.path.join(self.config.daemon.state_dir, "status.json")
        tmp = path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(status, fh, indent=1)
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
