"""What a service needs around the cycle: JSON logs, a Prometheus endpoint
(``prometheus-client``), and systemd's notify protocol (READY / WATCHDOG /
STOPPING / STATUS).

Kept hand-written, on purpose: the JSON log formatter (a dozen lines; the
libraries for it add a dependency for no gain) and sd_notify (one datagram on
a Unix socket; ``python-systemd`` needs libsystemd headers to build).
"""
from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

_EXTRA = ("cycle", "job", "action", "reason", "command", "rc", "slurm_release")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: t, level, logger, msg, and cycle/job/reason when known."""

    def format(self, record: logging.LogRecord) -> str:
        out = {"t": round(record.created, 3), "level": record.levelname.lower(),
               "logger": record.name, "msg": record.getMessage()}
        for key in _EXTRA:
            if hasattr(record, key):
                out[key] = getattr(record, key)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


class CycleFilter(logging.Filter):
    """Stamps every record with the daemon's current cycle number."""

    def __init__(self) -> None:
        super().__init__()
        self.cycle = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if not hasattr(record, "cycle"):
            record.cycle = self.cycle
        return True


def setup_logging(fmt: str, level: int = logging.INFO) -> CycleFilter:
    handler = logging.StreamHandler()
    cf = CycleFilter()
    handler.addFilter(cf)
    handler.setFormatter(JsonFormatter() if fmt == "json" else
                         logging.Formatter("%(asctime)s %(levelname)s %(name)s [cycle %(cycle)s] %(message)s"))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level)
    return cf


# ---------------------------------------------------------------- Prometheus

class DaemonMetrics:
    """The daemon's Prometheus metrics (``prometheus-client``, its own registry).

    Names are those of earlier releases: counters end in ``_total``, latencies
    are summaries (``_sum``/``_count``); prometheus-client adds ``_created``.
    ``malletrain_decisions_total{code}`` counts applied changes by reason code.
    """

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Summary
        self.registry = r = CollectorRegistry(auto_describe=True)
        self.idle_nodes = Gauge("malletrain_idle_nodes", "Harvestable idle nodes seen by the last cycle",
                                registry=r)
        self.allocated_nodes = Gauge("malletrain_allocated_nodes", "Nodes malleable jobs hold", registry=r)
        self.jobs = Gauge("malletrain_jobs", "Malleable jobs by state", ["state"], registry=r)
        self.events = {name: Counter(f"malletrain_{name}_total", text, registry=r) for name, text in (
            ("preemptions", "Malleable jobs requeued by Slurm"),
            ("rescales", "Grow/shrink operations applied"),
            ("starts", "Jobs started by the daemon"),
            ("stops", "Jobs stopped by the daemon"),
            ("vacates", "Proactive vacates before a primary job's start"))}
        self.decisions = Counter("malletrain_decisions_total", "Applied changes by reason code", ["code"],
                                 registry=r)
        self.decision_seconds = Summary("malletrain_decision_seconds", "decide() latency", registry=r)
        self.cycle_seconds = Summary("malletrain_cycle_seconds", "Whole cycle latency", registry=r)
        self.command_seconds = Summary("malletrain_slurm_command_seconds", "Slurm command latency",
                                       ["command"], registry=r)
        self.commands_last_cycle = Gauge("malletrain_slurm_commands_last_cycle",
                                         "Slurm commands in the last cycle", ["kind"], registry=r)
        self.slurm_up = Gauge("malletrain_slurm_up", "1 when the last cycle reached Slurm", registry=r)
        self.cycle_errors = Counter("malletrain_cycle_errors_total", "Cycles that failed", ["kind"],
                                    registry=r)
        self.reload_failures = Counter("malletrain_reload_failures_total",
                                       "Config reloads rejected (the old config stays)", registry=r)
        self.progress_skipped = Counter("malletrain_progress_lines_skipped_total",
                                        "Malformed or oversized progress lines", registry=r)
        self.events.update({name: Counter(f"malletrain_{name}_total", text, registry=r) for name, text in (
            ("refused_writes", "Writes refused: the job no longer matched its id, owner, partition or tag"),
            ("progress_files_refused", "Progress files not opened (not the owner's, a symlink, a FIFO, "
                                       "outside progress_roots)"),
            ("tag_reads", "Job comments (tags) read alone"),
            ("recoveries", "Lost or hung malleable jobs requeued by the safety net"))})
        self.excluded_nodes = Gauge("malletrain_excluded_nodes",
                                    "Nodes left out of harvesting after repeated job failures or hangs",
                                    registry=r)
        self.state_writable = Gauge("malletrain_state_writable",
                                    "1 when the state store takes writes; 0: read-only, nothing is applied",
                                    registry=r)
        self.metrics_rejected = Counter("malletrain_metrics_connections_rejected_total",
                                        "Metrics connections closed at once: all slots busy", registry=r)
        self._seen: dict[str, float] = {}

    def advance(self, name: str, total: float) -> None:
        """Move a counter to a cumulative ``total`` kept elsewhere (it only ever grows)."""
        counter = self.events.get(name) or self.progress_skipped
        delta = total - self._seen.get(name, 0.0)
        if delta > 0:
            counter.inc(delta)
            self._seen[name] = total

    def render(self) -> str:
        from prometheus_client import generate_latest
        return generate_latest(self.registry).decode()


def serve_metrics(metrics: DaemonMetrics, host: str, port: int, *, max_connections: int = 8,
                  timeout_s: float = 5.0) -> Any:
    """Serve ``/metrics`` on host:port from a daemon thread; returns the server (``shutdown()``).

    prometheus-client's handler behind a bounded server: at most ``max_connections``
    at once (more are closed at once and counted), each with a ``timeout_s`` socket
    timeout, so idle or slow clients cannot exhaust the daemon's threads or files.
    """
    from http.server import ThreadingHTTPServer

    from prometheus_client import MetricsHandler

    class Handler(MetricsHandler.factory(metrics.registry)):  # type: ignore[misc]
        timeout = timeout_s

        def log_message(self, format: str, *args: Any) -> None:   # no stderr line per scrape
            pass

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = max_connections

        def __init__(self) -> None:
            self.slots = threading.BoundedSemaphore(max_connections)
            super().__init__((host, port), Handler)

        def process_request(self, request: Any, client_address: Any) -> None:
            if not self.slots.acquire(blocking=False):
                metrics.metrics_rejected.inc()
                self.shutdown_request(request)
                return
            try:
                super().process_request(request, client_address)
            except Exception:
                self.slots.release()
                raise

        def process_request_thread(self, request: Any, client_address: Any) -> None:
            try:
                super().process_request_thread(request, client_address)
            finally:
                self.slots.release()

    server = Server()
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server


# ---------------------------------------------------------------- systemd

class Notifier:
    """sd_notify over $NOTIFY_SOCKET; a no-op outside systemd."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        self.addr = env.get("NOTIFY_SOCKET")
        usec = env.get("WATCHDOG_USEC")
        self.watchdog_s = int(usec) / 1e6 if usec and usec.isdigit() else None
        self._last_ping = 0.0

    def send(self, text: str) -> bool:
        if not self.addr:
            return False
        addr = "\0" + self.addr[1:] if self.addr.startswith("@") else self.addr
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
                s.sendto(text.encode(), addr)
            return True
        except OSError:
            return False

    def ready(self, status: str = "") -> None:
        self.send("READY=1" + (f"\nSTATUS={status}" if status else ""))

    def watchdog(self, clock: Callable[[], float] = time.monotonic) -> None:
        if self.watchdog_s is not None and clock() - self._last_ping >= self.watchdog_s / 3:
            self._last_ping = clock()
            self.send("WATCHDOG=1")

    def status(self, text: str) -> None:
        """What ``systemctl status`` shows on its Status line (one line, no user text)."""
        self.send("STATUS=" + text.replace("\n", " "))

    def stopping(self) -> None:
        self.send("STOPPING=1")


def status_line(cycle: int, interval_s: float, idle_nodes: int, running_jobs: int, held_nodes: int,
                cycle_ms: float, *, slurm_up: bool = True, state_writable: bool = True) -> str:
    """The service's one-line status after a cycle, e.g. ``cycle 12 (every 10s): 3 idle
    node(s), 2 malleable job(s) on 5 node(s), last cycle 41 ms``."""
    text = (f"cycle {cycle} (every {interval_s:g}s): {idle_nodes} idle node(s), {running_jobs} malleable "
            f"job(s) on {held_nodes} node(s), last cycle {cycle_ms:.0f} ms")
    if not slurm_up:
        text += "; Slurm unreachable, jobs left as they are"
    if not state_writable:
        text += "; state store read-only, applying nothing"
    return text
