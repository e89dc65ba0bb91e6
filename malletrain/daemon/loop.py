"""``malletrain daemon``: the service loop on a login node.

Each interval: observe Slurm (idle nodes, windows, malleable jobs) → read the
jobs' progress files (the metrics source) → decide → reconcile → apply,
through the same :func:`run_cycle` that replay uses.  Around it: state in
sqlite (re-adopted on start; the JPA is seeded from the stored samples), JSON
logs, a Prometheus endpoint, sd_notify, SIGHUP reload (the old config stays
on error), SIGTERM stops after the current cycle without touching any job (a Slurm read
that fails then is not retried, so an outage does not hold the stop up).
A Slurm outage (commands failing or timing out) is logged once, counted and
waited out; the loop never dies of it.  Neither does a store that cannot be
written (a full disk, a broken file): the daemon then applies nothing (it
never acts without its write-ahead record), keeps observing and deciding,
says why in its log, ``status.json`` and ``malletrain_state_writable``, and
resumes by itself once a write succeeds again.  Nor does a bug: the cycle runs contained
(:mod:`malletrain.core.contain`: the jobs whose data make the decision raise are set aside, the
others decided), and any other error of a cycle is logged with its traceback, counted
(``malletrain_cycle_errors_total{kind="internal"}``) and shown in ``status.json``; the next
cycle runs.
Between cycles, while it waits, the loop runs Python's full garbage collection when the
collector is about to want one (:func:`~malletrain.daemon.collect.collect_if_due`), so that
the pass does not land inside a decision.
"""
from __future__ import annotations

import logging
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence

from malletrain.core.backend import Backend, Observation
from malletrain.core.curves import CurveSource
from malletrain.core.cycle import CycleMemo, CycleResult, run_cycle
from malletrain.core.forecast import ForecastSource
from malletrain.daemon.collect import collect_if_due
from malletrain.daemon.files import PathWorkers
from malletrain.daemon.outcomes import Ledger
from malletrain.daemon.progress import ProgressSource, ProgressTail
from malletrain.daemon.recovery import GIVE_UP, Ended, Recovery, RecoveryConfig, Running
from malletrain.daemon.service import DaemonMetrics, Notifier, serve_metrics, status_line
from malletrain.daemon.status import (
    Counters,
    CycleStats,
    DaemonStatus,
    JobStatus,
    Measured,
    Member,
    Rescale,
    write_status,
)
from malletrain.daemon.store import Store
from malletrain.domain.config import FORECAST_POLICIES, Config, load_config
from malletrain.domain.errors import BackendError, ConfigError, PlanError, StateError
from malletrain.domain.model import Action, ActionKind, Plan, ReasonCode
from malletrain.domain.nodes import load_node_info
from malletrain.domain.text import error_line
from malletrain.slurm.adapter import Book, SlurmBackend
from malletrain.slurm.parse import Phase
from malletrain.slurm.runner import Runner

log = logging.getLogger("malletrain.daemon")

DAEMON_POLICIES = ("malletrain", "static")
MAX_JOB_ID = 128        # characters of a stored job id: a longer one is not what the daemon wrote


def _stored_time(job: object, t: object) -> bool:
    """A stored set-aside entry the daemon could have written: a job id and a finite time (an
    integer too large for a float is not one: ``math.isfinite`` would raise on it)."""
    if not isinstance(job, str) or len(job) > MAX_JOB_ID:
        return False
    if type(t) is int:
        return abs(t) < 2 ** 53
    return type(t) is float and math.isfinite(t)


def check_config(cfg: Config, where: str) -> Config:
    if cfg.core.policy not in DAEMON_POLICIES:
        raise ConfigError(f"the daemon has no true curves; use one of {', '.join(DAEMON_POLICIES)}",
                          path=where, field="core.policy")
    return cfg


def _recovery_config(dc) -> RecoveryConfig:
    return RecoveryConfig(max_failures=dc.max_failures, retry_backoff_s=dc.retry_backoff_s,
                          hang_floor_s=dc.hang_floor_s, hang_factor=dc.hang_factor,
                          node_strikes=dc.node_strikes, node_cooldown_s=dc.node_cooldown_s,
                          max_excluded_share=dc.max_excluded_share)


def make_runner(cfg: Config) -> Runner:
    s = cfg.slurm
    return Runner(slurm_conf=s.slurm_conf or None, bin_dir=s.bin_dir or None, timeout_s=s.command_timeout_s,
                  retries=s.retries, backoff_s=s.backoff_s, array_tasks=s.elastic_groups)


class _Journal:
    """The backend, with every change written to the store before it is applied (for ``explain``)."""

    def __init__(self, backend: Backend, store: Store, clock: Callable[[], float]) -> None:
        self.backend, self.store, self.clock = backend, store, clock
        self.cycle = 0
        self.last: Observation | None = None
        self.observed = -1            # the cycle whose observation ``last`` is
        self.read_only = False        # the store takes no writes: apply nothing

    def observe(self) -> Observation:
        self.last = self.backend.observe()
        self.observed = self.cycle
        return self.last

    def apply(self, actions: Sequence[Action]) -> None:
        changes = [a for a in actions if a.kind not in (ActionKind.KEEP, ActionKind.WAIT)]
        if self.read_only:
            if changes:
                log.warning("not applying %d change(s): the state store takes no writes", len(changes))
            return
        self.store.add_actions(self.clock(), self.cycle, changes)
        self.backend.apply(actions)


class Daemon:
    def __init__(self, config_path: str, *, runner: Runner | None = None,
                 clock: Callable[[], float] = time.time, log_filter=None) -> None:
        self.config_path = config_path
        self.config = check_config(load_config(config_path), config_path)
        self.clock = clock
        self.log_filter = log_filter
        dc = self.config.daemon
        os.makedirs(dc.state_dir, mode=0o750, exist_ok=True)
        self.store = Store(os.path.join(dc.state_dir, "state.db"), samples_kept=dc.samples_kept)
        self.runner = runner or make_runner(self.config)
        self.tail = ProgressTail(max_line_bytes=dc.max_line_bytes, max_records=dc.max_records_per_job,
                                 max_samples_per_s=dc.max_samples_per_s, roots=dc.progress_roots,
                                 io=PathWorkers(), read_timeout_s=dc.progress_read_timeout_s)
        self.tail.load(self.store.get("tails", {}))
        self.progress = ProgressSource(self.tail, self.store, max_bytes_per_cycle=dc.max_progress_bytes_per_cycle,
                                       max_pause_s=dc.max_rescale_pause_s,
                                       cycle_timeout_s=dc.progress_cycle_timeout_s)
        books = self.store.books()
        self.backend = SlurmBackend(self.runner, self.config.slurm, dc, clock=clock,
                                    save_book=self._save_book, books=books)
        self.journal = _Journal(self.backend, self.store, clock)
        self.recovery = Recovery(_recovery_config(dc))
        try:
            self.recovery.load(self.store.get("recovery", {}))
        except (TypeError, ValueError, AttributeError, IndexError) as exc:
            log.warning("stored safety-net state unreadable, starting it afresh: %s", exc)
        self.backend.excluded, self.backend.given_up = self.recovery.excluded, self.recovery.given_up
        self.backend.not_before = self.recovery.retry_at          # requeued jobs in back-off
        self._recovery_saved = self.recovery.dump()
        self.backend.finished_work = self.progress.finished
        self.backend.joined = self.progress.members
        self.source = CurveSource(self.config.core)
        self.forecast = ForecastSource(self.config.core)
        try:
            self.forecast.learner.load(self.store.get("rescale", {}))
        except (TypeError, ValueError, AttributeError, KeyError) as exc:
            log.warning("stored rescale pauses unreadable, learning them afresh: %s", exc)
        self._rescale_saved = self.forecast.learner.version
        self.ledger = Ledger(self.config.core.weight)
        self._pruned = False
        self._samples_pruned = False     # samples of jobs gone while the daemon was down: dropped once
        self._outcomes_saved: dict = {}
        try:
            self.ledger.load(self.store.get("outcomes", {}))
        except (TypeError, ValueError, AttributeError) as exc:
            log.warning("stored job outcomes unreadable, counting afresh: %s", exc)
        try:
            self.source.advisor.load_retired(self.store.get("retired", {}))
        except (TypeError, ValueError, AttributeError) as exc:
            log.warning("stored profile summaries unreadable, starting them afresh: %s", exc)
        self._retired_saved = self.source.advisor.retired()
        restored = self.source.advisor.add_many(self.store.samples())   # what was learned survives
        self.cycle = int(self.store.get("cycle", 0))
        aside, clean = self._load_aside()
        self.memo = CycleMemo(aside_since=aside)
        self._aside_saved: dict[str, float] | None = dict(aside) if clean else None   # None: written at the first cycle
        self.plan: Plan | None = None
        self.last_errors: tuple[str, ...] = ()   # what the last cycle contained (or the cycle's own error)
        self.reasons: dict[str, Action] = {}
        self.last_cycle: CycleStats | None = None
        self.slurm_down_since: float | None = None
        self.store_down_since: float | None = None
        self.store_error = ""
        self.metrics = DaemonMetrics()
        self.notifier = Notifier()
        self._wake = threading.Event()
        self._stop = False
        self._reload = False
        log.info("state %s: %d job book(s), %d JPA sample(s) restored; adopting jobs from Slurm",
                 self.store.path, len(books), restored)

    # ------------------------------------------------------------ one cycle
    def cycle_once(self) -> CycleResult | None:
        self.cycle += 1
        if self.log_filter is not None:
            self.log_filter.cycle = self.cycle
        try:
            self.store.put("cycle", self.cycle)
        except StateError as exc:
            self._state_failed(exc)
        else:
            if self.store_down_since is not None:
                log.info("the state store takes writes again after %.0fs; applying plans again",
                         self.clock() - self.store_down_since)
                self.store_down_since, self.store_error = None, ""
        self.journal.read_only = self.store_down_since is not None
        t0 = time.perf_counter()
        self.runner.stats.take()
        result = None
        self.last_errors = ()
        try:
            self.journal.cycle = self.cycle
            result = run_cycle(self.journal, self.progress, self.source, self.config.core, self.memo,
                               self.forecast, contain=True)
        except BackendError as exc:
            self.metrics.cycle_errors.labels(kind="slurm").inc()
            if self.slurm_down_since is None:
                self.slurm_down_since = self.clock()
                log.error("Slurm is unreachable, waiting for it (jobs are left as they are): %s", exc)
            else:
                log.warning("Slurm still unreachable after %.0fs: %s",
                            self.clock() - self.slurm_down_since, exc)
        except PlanError as exc:
            self.metrics.cycle_errors.labels(kind="plan").inc()
            log.error("plan rejected, nothing applied: %s", exc)
            self.last_errors = (f"plan: {error_line(exc)}",)
            self._net_after_error()
        except StateError as exc:
            self._state_failed(exc)
        except Exception as exc:   # noqa: BLE001 - a bug: never a reason to stop serving (SECURITY.md, Containment)
            self._internal(exc, "the cycle raised, nothing applied (jobs are left as they are)")
            self.memo = self._fresh_memo()
            self._net_after_error()
        else:
            self.last_errors = result.errors
            for kind in sorted({e.split(":", 1)[0] for e in result.errors if not e.startswith("...")}):
                self.metrics.cycle_errors.labels(kind=kind).inc()
            self._guarded(self._after_cycle, result)
        self._guarded(self._save_aside)
        reads, writes, lat = self.runner.stats.take()
        cycle_s = time.perf_counter() - t0
        self._guarded(self._export, result, reads, writes, lat, cycle_s)
        self._guarded(self._write_status, result)
        self._guarded(self._notify_status, cycle_s)
        self.notifier.watchdog()
        return result

    def _after_cycle(self, result: CycleResult) -> None:
        """The bookkeeping after a cycle that decided: the safety net, what left, what was learned."""
        if self.slurm_down_since is not None:
            log.info("Slurm is back after %.0fs", self.clock() - self.slurm_down_since)
            self.slurm_down_since = None
        self._safety_net()
        self._forget_finished()
        self._save_rescale()
        self._count_outcomes()
        self.plan = result.plan
        for a in result.plan.actions:
            self.reasons[a.job_id] = a
        for a in result.actions:
            self.metrics.decisions.labels(code=a.code.value).inc()
            if a.kind in (ActionKind.START, ActionKind.GROW):
                self.progress.wake(a.job_id)

    def _internal(self, exc: Exception, what: str) -> None:
        """A bug outside what the cycle contains: logged with its traceback, counted, in the status."""
        self.metrics.cycle_errors.labels(kind="internal").inc()
        self.last_errors = (*self.last_errors, f"internal: {error_line(exc)}")
        log.error("%s: %s", what, error_line(exc), exc_info=exc)

    def _guarded(self, step: Callable, *args) -> None:
        try:
            step(*args)
        except Exception as exc:   # noqa: BLE001 - a bug: the next cycle still runs (SECURITY.md, Containment)
            self._internal(exc, f"{step.__name__} raised")

    def _fresh_memo(self) -> CycleMemo:
        """A memo that decides afresh, keeping since when each job has been set aside: a cycle that
        raised or a reload must not restart the ``probe_timeout_s`` a set-aside job may keep its
        nodes for (a user who could make every other cycle raise would keep them for ever)."""
        return CycleMemo(aside_since=dict(self.memo.aside_since))

    def _load_aside(self) -> tuple[dict[str, float], bool]:
        """Since when each job has been set aside, as the last service process left it: a restart
        must not restart a set-aside job's ``probe_timeout_s`` either.  The daemon's own file, read
        defensively all the same: an entry that is not a job id and a finite time is dropped (with
        a warning), and a time after now (a clock set back) counts from now.  Also whether the map
        is the stored one as it is: what was dropped or moved is written back at the first cycle,
        so a second restart cannot count a moved time from its own start again."""
        try:
            raw = self.store.get("aside", {})
        except StateError as exc:
            log.warning("stored set-aside times unreadable, counting afresh: %s", exc)
            return {}, False
        if not isinstance(raw, dict):
            log.warning("stored set-aside times unreadable (not a map), counting afresh")
            return {}, False
        now = self.clock()
        kept = {j: min(float(t), now) for j, t in raw.items() if _stored_time(j, t)}
        if len(kept) < len(raw):
            log.warning("stored set-aside times: %d of %d entries unreadable, dropped", len(raw) - len(kept), len(raw))
        return kept, kept == raw

    def _save_aside(self) -> None:
        """Since when each job has been set aside survives a restart (written when it changed)."""
        since = self.memo.aside_since
        if since != self._aside_saved and not self.journal.read_only:
            try:
                self.store.put("aside", since)
            except StateError as exc:
                self._state_failed(exc)
                return
            self._aside_saved = dict(since)

    def _net_after_error(self) -> None:
        """The safety net on this cycle's observation, when one was taken: a cycle that decided
        nothing still requeues the jobs that were lost."""
        if self.journal.observed == self.cycle:
            self._guarded(self._safety_net)

    def _notify_status(self, cycle_s: float) -> None:
        running = [r for r in self.backend.records.values() if r.phase is Phase.RUNNING]
        self.notifier.status(status_line(
            self.cycle, self.config.daemon.interval_s, self.backend.idle_nodes, len(running),
            sum(len(r.nodes) for r in running), cycle_s * 1000.0,
            slurm_up=self.slurm_down_since is None, state_writable=self.store_down_since is None,
            errors=len(self.last_errors)))

    def _safety_net(self) -> None:
        """Requeue what ended without a result or hung (never while the store is read-only)."""
        obs = self.journal.last
        if obs is None or self.journal.read_only:
            return
        now = obs.snapshot.now_s
        # an ended job whose file is not read to its end yet waits (its verdict needs the last record)
        unread = {j for j in obs.ended if j not in self.progress.final}
        ended = {j: Ended(f.state, self.progress.final.get(j), f.nodes, j in self.progress.failed_after_done)
                 for j, f in obs.ended.items() if j not in unread}
        running = {j: Running(tuple(r.nodes), self.progress.last_progress.get(j), self.progress.step_s(j))
                   for j, r in self.backend.records.items()
                   if r.phase is Phase.RUNNING and j not in self.recovery.given_up}
        try:
            held_back = self.recovery.not_excluded
            for d in self.recovery.step(now, ended, running, self.backend.present, self.backend.partition_nodes):
                code = (ReasonCode.GAVE_UP if d.kind == GIVE_UP else
                        ReasonCode.HUNG if d.reason.startswith("hung") else ReasonCode.LOST)
                nodes = obs.facts[d.job_id].nodes if d.job_id in obs.facts else ()
                self.store.add_actions(self.clock(), self.cycle,
                                       [Action(d.job_id, ActionKind.REQUEUE, nodes, (), d.reason, code)])
                if self.backend.requeue_held(d.job_id, d.reason):
                    self.metrics.decisions.labels(code=code.value).inc()
            if self.recovery.not_excluded > held_back:
                log.warning("%d node(s) reached node_strikes but stay in harvesting: max_excluded_share "
                            "(%g) of the partition already rests", self.recovery.not_excluded - held_back,
                            self.recovery.config.max_excluded_share)
            for job in sorted(self.backend.finished_queued):
                why = ("its last run ended with its final 'done' record as it was being stopped or "
                       "preempted; the copy queued again is cancelled (running it would finish it twice)")
                self.store.add_actions(self.clock(), self.cycle, [Action(job, ActionKind.CANCEL, (), (), why,
                                                                        ReasonCode.FINISHED)])
                if self.backend.cancel_finished(job, why):
                    self.metrics.decisions.labels(code=ReasonCode.FINISHED.value).inc()
            # keep reading the ended jobs whose requeue waits out its back-off, no others
            self.backend.ended_watch &= unread
            state = self.recovery.dump()
            if state != self._recovery_saved:
                self.store.put("recovery", state)
                self._recovery_saved = state
        except BackendError as exc:
            log.warning("safety net: Slurm unreachable, retrying next cycle: %s", exc)
        except StateError as exc:      # no write-ahead record: stop acting, keep cycling
            self._state_failed(exc)

    def _forget_finished(self) -> None:
        """Jobs that left: their samples leave the store; what the advisor keeps of them (the
        profile summaries) is stored instead.  At the first cycle, so do jobs that left while
        the daemon was down (Slurm purged them: they never show as leaving)."""
        obs = self.journal.last
        if obs is None or self.journal.read_only:
            return
        gone = set(obs.finished)
        try:
            if not self._samples_pruned:
                stale = self.store.sample_jobs() - set(obs.facts) - set(obs.ended) - gone
                self._samples_pruned = True
                if stale:
                    self.source.ingest((), {}, tuple(sorted(stale)))
                    gone |= stale
            if not gone:
                return
            self.store.forget_samples(sorted(gone))
            retired = self.source.advisor.retired()
            if retired != self._retired_saved:
                self.store.put("retired", retired)
                self._retired_saved = retired
        except StateError as exc:
            self._state_failed(exc)

    def _count_outcomes(self) -> None:
        obs = self.journal.last
        if obs is None:
            return
        if not self._pruned:      # what was stored of jobs that ended while the daemon was down goes
            self._pruned = True
            self.forecast.learner.prune(set(obs.facts) | set(obs.ended))
        self.ledger.observe(obs, self.progress.final)
        dump = self.ledger.dump()
        if dump != self._outcomes_saved:
            try:
                self.store.put("outcomes", dump)
            except StateError as exc:
                self._state_failed(exc)
                return
            self._outcomes_saved = dump

    def _save_rescale(self) -> None:
        """The learned rescale pauses survive a restart (written when they changed)."""
        learner = self.forecast.learner
        if learner.version != self._rescale_saved:
            try:
                self.store.put("rescale", learner.dump())
            except StateError as exc:
                self._state_failed(exc)
                return
            self._rescale_saved = learner.version

    def _save_book(self, job: str, book: Book | None) -> None:
        """The backend's book of a job, written ahead; while the store is read-only nothing is
        applied, so a failing bookkeeping write of the observation is not an error of its own."""
        try:
            self.store.save_book(job, book)
        except StateError:
            if not self.journal.read_only:
                raise

    def _state_failed(self, exc: StateError) -> None:
        self.metrics.cycle_errors.labels(kind="state").inc()
        self.journal.read_only = True
        if self.store_down_since is None:
            self.store_down_since = self.clock()
            log.error("the state store takes no writes; applying nothing until it does "
                      "(jobs are left as they are): %s", exc)
        self.store_error = str(exc)

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
                try:
                    self.cycle_once()
                except Exception as exc:   # noqa: BLE001 - a bug outside the cycle's own containment:
                    self._internal(exc, f"cycle {self.cycle} raised")      # the next cycle still runs
                    self.notifier.watchdog()
                collect_if_due()
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
            self.runner.stop.set()      # a Slurm read that fails now is not retried
        self._wake.set()

    def _do_reload(self) -> None:
        self._reload = False
        try:
            new = check_config(load_config(self.config_path), self.config_path)
        except Exception as exc:   # ConfigError, or anything a broken file finds: never stop the daemon
            log.error("reload failed, keeping the running config: %s", exc)
            self.metrics.reload_failures.inc()
            return
        site = self.backend.site
        if new.slurm.node_info != self.config.slurm.node_info or new.slurm.node_info:
            try:      # the site file is read again (it may have changed); a bad one fails the reload
                site = load_node_info(new.slurm.node_info, ConfigError) if new.slurm.node_info else {}
            except ConfigError as exc:
                log.error("reload failed, keeping the running config: %s", exc)
                self.metrics.reload_failures.inc()
                return
        if (new.daemon.metrics_port, new.daemon.state_dir) != (self.config.daemon.metrics_port,
                                                               self.config.daemon.state_dir):
            log.warning("metrics_port and state_dir changes take effect at the next restart")
        if (new.core.stay_min_fragments, new.core.stay_half_life) != (self.config.core.stay_min_fragments,
                                                                      self.config.core.stay_half_life):
            log.warning("stay_min_fragments and stay_half_life changes take effect at the next restart")
        if new.slurm.topology != self.config.slurm.topology:
            self.backend.switches = None if new.slurm.topology else {}   # read again (or dropped)
        self.backend.site = site
        self.config = new
        self.source = CurveSource(new.core, advisor=self.source.advisor)
        self.forecast = ForecastSource(new.core, learner=self.forecast.learner, history=self.forecast.history,
                                       sensitivity=self.forecast.sensitivity)
        self.ledger.weight = new.core.weight
        self.recovery.config = _recovery_config(new.daemon)
        self.backend.slurm, self.backend.daemon = new.slurm, new.daemon
        fresh = make_runner(new)
        self.runner.env, self.runner.timeout_s = fresh.env, fresh.timeout_s
        self.runner.retries, self.runner.backoff_s = fresh.retries, fresh.backoff_s
        self.memo = self._fresh_memo()
        log.info("config reloaded from %s", self.config_path)

    # ------------------------------------------------------------ outputs
    def _export(self, result: CycleResult | None, reads: int, writes: int,
                lat: list[tuple[str, float, str]], cycle_s: float) -> None:
        m, b = self.metrics, self.backend
        m.slurm_up.set(0 if self.slurm_down_since is not None else 1)
        m.state_writable.set(0 if self.store_down_since is not None else 1)
        m.excluded_nodes.set(len(self.recovery.excluded))
        m.commands_last_cycle.labels(kind="read").set(reads)
        m.commands_last_cycle.labels(kind="write").set(writes)
        for cmd, secs, _kind in lat:
            m.command_seconds.labels(command=cmd).observe(secs)
        m.cycle_seconds.observe(cycle_s)
        if result is not None and not result.reused:
            m.decision_seconds.observe(result.decision_ms / 1000.0)
        m.idle_nodes.set(b.idle_nodes)
        m.allocated_nodes.set(sum(len(r.nodes) for r in b.records.values() if r.phase is Phase.RUNNING))
        members = [x for gid in b.records for x in b.groups.get(gid, ())]
        for phase in Phase:
            m.jobs.labels(state=phase.value).set(sum(1 for r in b.records.values() if r.phase is phase))
            m.members.labels(state=phase.value).set(sum(1 for x in members if x.phase is phase))
        e = b.events
        for name, value in (("preemptions", e.preemptions), ("rescales", e.rescales),
                            ("starts", e.starts), ("stops", e.stops), ("vacates", e.vacates),
                            ("refused_writes", e.refused_writes), ("tag_reads", e.tag_reads),
                            ("progress_files_refused", self.tail.counters.refused),
                            ("recoveries", e.recoveries)):
            m.advance(name, value)
        c = self.tail.counters
        m.advance("progress_lines_skipped", c.bad + c.oversized)
        self.last_cycle = CycleStats(reads, writes, cycle_s, result.decision_ms if result else None,
                                     bool(result and result.reused))

    def status(self) -> DaemonStatus:
        """What ``status.json`` says after this cycle."""
        b = self.backend
        last = self.journal.last
        curves = self.source.curves(last.snapshot, {}) if last else {}     # (a curve that raises: none)
        jobs = []
        for jid, r in sorted(b.records.items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else 0):
            tag = b.tags.get(jid)
            size = len(r.nodes) if r.phase is Phase.RUNNING else 0
            curve = curves.get(jid)
            meas = self.progress.latest.get(jid)
            try:
                hist = self.store.history(jid, 5)
            except StateError:       # the status still says what is known (and why the store failed)
                hist = []
            why = self.reasons.get(jid)
            gave_up = self.recovery.given_up.get(jid)
            rescale = None
            if tag is not None:     # what the decisions charge: learned only where they learn
                core = self.config.core
                try:
                    cost = (self.forecast.learner.cost(jid, tag.rescale_up_s, tag.rescale_down_s)
                            if core.learn_rescale and core.policy in FORECAST_POLICIES else None)
                except Exception:   # noqa: BLE001 - the cycle contained (and reported) the learner's bug
                    cost = None
                rescale = (Rescale(cost.up_s, cost.down_s, cost.up_n, cost.down_n, tag.rescale_up_s,
                                   tag.rescale_down_s, cost.grow_s, cost.grow_n, cost.preemption_s,
                                   cost.preemption_n, cost.loss_s, cost.loss_n) if cost is not None else
                           Rescale(tag.rescale_up_s, tag.rescale_down_s, 0, 0, tag.rescale_up_s, tag.rescale_down_s))
            jobs.append(JobStatus(
                job=jid, name=tag.name if tag else r.name, user=r.user, state=r.phase.value, slurm_state=r.state,
                slurm_reason=r.reason, nodes=tuple(r.nodes) if size else (), size=size,
                min_nodes=tag.min_nodes if tag else None, max_nodes=tag.max_nodes if tag else None,
                profile=(last.facts[jid].profile if last and jid in last.facts else tag.profile if tag else ""),
                measured=Measured(meas.nodes, meas.samples_per_s, meas.t_s) if meas else None,
                predicted=curve.mean(size) if curve and size else None,
                curve_source=curve.source if curve else None,
                curve={str(n): round(p.mean, 3) for n, p in sorted(curve.points.items())} if curve else {},
                probe=curve.probe if curve else None, probes=curve.wanted if curve else (),
                reason=gave_up or (why.reason if why else ""),
                reason_code=ReasonCode.GAVE_UP.value if gave_up else (why.code.value if why else ""),
                last_action=hist[-1] if hist else None, history=tuple(hist),
                progress_skipped=self.tail.counters.by_job.get(jid, 0), rescale=rescale,
                members=tuple(Member(m.task, m.job_id, m.phase.value, m.nodes[0] if m.nodes else "")
                              for m in b.groups.get(jid, ()))))
        e, tc = b.events, self.tail.counters
        return DaemonStatus(
            t=self.clock(), cycle=self.cycle, slurm_up=self.slurm_down_since is None,
            interval_s=self.config.daemon.interval_s, partition=self.config.slurm.partition,
            idle_nodes=b.idle_nodes, vacating=tuple(sorted(b.vacating)),
            counters=Counters(preemptions=e.preemptions, rescales=e.rescales, starts=e.starts,
                              stops=e.stops, vacates=e.vacates, failed_actions=e.failed_actions,
                              progress_lines=tc.lines, progress_lines_skipped=tc.bad + tc.oversized,
                              slurm_reads=self.runner.stats.total_reads,
                              slurm_writes=self.runner.stats.total_writes,
                              refused_writes=e.refused_writes, progress_files_refused=tc.refused,
                              recoveries=e.recoveries),
            last_cycle=self.last_cycle, jobs=tuple(jobs),
            state_writable=self.store_down_since is None, state_error=self.store_error,
            excluded_nodes={n: f"until {until:.0f}: {why}"
                            for n, (until, why) in sorted(self.recovery.excluded.items())},
            failures=dict(self.recovery.failures), outcomes=self.ledger.outcomes(), errors=self.last_errors)

    def _write_status(self, result: CycleResult | None) -> None:
        try:
            write_status(os.path.join(self.config.daemon.state_dir, "status.json"), self.status())
        except (OSError, StateError) as exc:
            self.metrics.cycle_errors.labels(kind="status").inc()
            log.error("cannot write status.json: %s", exc)
