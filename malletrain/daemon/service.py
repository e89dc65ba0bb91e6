"""What a service needs around the cycle: JSON logs, a Prometheus endpoint
(``prometheus-client``), and systemd's notify protocol (READY / WATCHDOG /
STOPPING / STATUS).

Kept hand-written, on purpose: the JSON log formatter (a dozen lines; the
libraries for it add a dependency for no gain) and sd_notify (one datagram on
a Unix socket; ``python-systemd`` needs libsystemd headers to build).
"""
from __future__ import annotations

import io
import json
import logging
import os
import selectors
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from malletrain.daemon.logguard import LogGuard

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
    handler.addFilter(LogGuard())      # no user can flood the journal (and so push out the audit lines)
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
    ``malletrain_decisions_total{code}`` counts applied changes by reason code;
    ``malletrain_group_members{state}`` the members of adopted elastic groups.
    """

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Summary
        self.registry = r = CollectorRegistry(auto_describe=True)
        self.idle_nodes = Gauge("malletrain_idle_nodes", "Harvestable idle nodes seen by the last cycle",
                                registry=r)
        self.allocated_nodes = Gauge("malletrain_allocated_nodes", "Nodes malleable jobs hold", registry=r)
        self.jobs = Gauge("malletrain_jobs", "Malleable jobs by state", ["state"], registry=r)
        self.members = Gauge("malletrain_group_members", "Members of adopted elastic groups by state",
                             ["state"], registry=r)
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
        self.cycle_errors = Counter("malletrain_cycle_errors_total",
                                    "Cycles with an error, by kind: slurm, plan, state, status (failed); "
                                    "jpa, curves, promises, forecasts, decide (contained: the others decided); "
                                    "internal (a bug: nothing applied, the next cycle runs)",
                                    ["kind"], registry=r)
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
                                        "Metrics connections closed unanswered: all slots taken (the oldest "
                                        "of the busiest client went), too slow, or an oversized request",
                                        registry=r)
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
                  timeout_s: float = 5.0, max_request_bytes: int = 8192) -> MetricsServer:
    """Serve ``/metrics`` on host:port from a daemon thread; returns the server (``shutdown()``).

    prometheus-client's handler answers each request, behind a server that no slow client
    can hold (:class:`MetricsServer`).
    """
    server = MetricsServer(metrics, host, port, max_connections=max_connections,
                           timeout_s=timeout_s, max_request_bytes=max_request_bytes)
    server.start()
    return server


class _Conn:
    __slots__ = ("sock", "peer", "since", "inbuf", "out")

    def __init__(self, sock: socket.socket, peer: str, since: float) -> None:
        self.sock, self.peer, self.since = sock, peer, since
        self.inbuf = bytearray()
        self.out: memoryview | None = None


class MetricsServer:
    """An HTTP/1.0 ``/metrics`` endpoint that slow clients cannot blind.

    One thread multiplexes every connection (non-blocking sockets, ``selectors``), so a
    client that trickles its request (a byte every few seconds) or reads the answer
    slowly holds no thread and no slot that others wait for:

    * each connection has ``timeout_s`` in all, from accept to the last byte of the
      answer (a deadline, not a per-read timeout that every trickled byte renews);
    * a request (line and headers) is at most ``max_request_bytes``;
    * at most ``max_connections`` are open at once; a new one always gets in: the oldest
      connection of the client address holding the most is closed to make room (a
      scrape from elsewhere never waits behind one address's connections, and one from
      the same address displaces that address's stale ones).

    Connections closed unanswered are counted in ``malletrain_metrics_connections_rejected_total``.
    The complete request is answered by prometheus-client's ``MetricsHandler`` (content
    negotiation, gzip, ``name[]`` filters) on in-memory files.
    """

    def __init__(self, metrics: DaemonMetrics, host: str, port: int, *, max_connections: int = 8,
                 timeout_s: float = 5.0, max_request_bytes: int = 8192) -> None:
        from prometheus_client import MetricsHandler
        if max_connections < 1 or not timeout_s > 0 or max_request_bytes < 64:
            raise ValueError("max_connections >= 1, timeout_s > 0, max_request_bytes >= 64")
        self.metrics = metrics
        self.max_connections, self.timeout_s = max_connections, timeout_s
        self.max_request_bytes = max_request_bytes
        self.handler = MetricsHandler.factory(metrics.registry)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.socket = socket.socket(family, socket.SOCK_STREAM)
        try:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.socket.bind((host, port))
            self.socket.listen(max(8, max_connections))
            self.socket.setblocking(False)
        except OSError:
            self.socket.close()
            raise
        self.server_address = self.socket.getsockname()[:2]
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(self.socket, selectors.EVENT_READ)
        self._sel.register(self._wake_r, selectors.EVENT_READ)
        self._conns: dict[socket.socket, _Conn] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._closed = False
        self.answered = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._serve, name="metrics", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        """Stop serving and close every connection (and the listening socket)."""
        self._stop.set()
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(5)
        self.server_close()

    def server_close(self) -> None:
        if self._closed or (self._thread is not None and self._thread.is_alive()):
            return                              # the serving thread closes them when it stops
        self._closed = True
        for conn in list(self._conns.values()):
            self._drop(conn, counted=False)
        for s in (self.socket, self._wake_r, self._wake_w):
            s.close()
        self._sel.close()

    # ---- the loop --------------------------------------------------------------------
    def _serve(self) -> None:
        try:
            while not self._stop.is_set():
                now = time.monotonic()
                due = min((c.since + self.timeout_s for c in self._conns.values()), default=now + 1.0)
                for key, mask in self._sel.select(max(0.01, min(1.0, due - now))):
                    if key.fileobj is self.socket:
                        self._accept()
                    elif key.fileobj is self._wake_r:
                        return
                    else:
                        live: _Conn = key.data
                        if self._conns.get(live.sock) is not live:    # dropped earlier this turn
                            continue
                        if mask & selectors.EVENT_READ:
                            self._read(live)
                        elif mask & selectors.EVENT_WRITE:
                            self._write(live)
                now = time.monotonic()
                for conn in [c for c in self._conns.values() if now - c.since >= self.timeout_s]:
                    self._drop(conn)
        except Exception:   # noqa: BLE001 - the endpoint must not take the daemon down
            logging.getLogger("malletrain.daemon").exception("metrics endpoint stopped")
        finally:
            for conn in list(self._conns.values()):
                self._drop(conn, counted=False)

    def _accept(self) -> None:
        for _ in range(4 * self.max_connections):       # drain the backlog, bounded per turn
            try:
                sock, addr = self.socket.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:     # EMFILE and friends: try again next turn
                return
            sock.setblocking(False)
            if len(self._conns) >= self.max_connections:
                self._drop(self._victim())
            conn = _Conn(sock, str(addr[0]), time.monotonic())
            self._conns[sock] = conn
            self._sel.register(sock, selectors.EVENT_READ, conn)

    def _victim(self) -> _Conn:
        """The oldest connection of the address that holds the most (ties: the older one)."""
        by_peer: dict[str, list[_Conn]] = {}
        for c in self._conns.values():
            by_peer.setdefault(c.peer, []).append(c)
        conns = max(by_peer.values(), key=lambda cs: (len(cs), -min(c.since for c in cs)))
        return min(conns, key=lambda c: c.since)

    def _read(self, conn: _Conn) -> None:
        try:
            data = conn.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(conn)
            return
        if not data:
            self._drop(conn)
            return
        conn.inbuf += data
        end = conn.inbuf.find(b"\r\n\r\n")
        if end < 0:
            end = conn.inbuf.find(b"\n\n")
        if end < 0:
            if len(conn.inbuf) > self.max_request_bytes:
                self._drop(conn)
            return
        if end > self.max_request_bytes:
            self._drop(conn)
            return
        try:
            conn.out = memoryview(self._answer(bytes(conn.inbuf), conn.peer))
        except Exception:   # noqa: BLE001 - one bad answer closes one connection, not the endpoint
            logging.getLogger("malletrain.daemon").exception("metrics: cannot answer a request")
            self._drop(conn)
            return
        self._sel.modify(conn.sock, selectors.EVENT_WRITE, conn)

    def _answer(self, request: bytes, peer: str) -> bytes:
        handler: Any = object.__new__(self.handler)     # no socket: in-memory files instead
        handler.rfile, handler.wfile = io.BytesIO(request), io.BytesIO()
        handler.client_address, handler.server, handler.request = (peer, 0), self, None
        handler.close_connection = True
        handler.handle_one_request()
        return handler.wfile.getvalue()

    def _write(self, conn: _Conn) -> None:
        assert conn.out is not None
        try:
            sent = conn.sock.send(conn.out)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._drop(conn)
            return
        conn.out = conn.out[sent:]
        if not len(conn.out):
            self.answered += 1
            self._drop(conn, counted=False)

    def _drop(self, conn: _Conn, *, counted: bool = True) -> None:
        if self._conns.pop(conn.sock, None) is None:
            return
        if counted:
            self.metrics.metrics_rejected.inc()
        try:
            self._sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()


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
                cycle_ms: float, *, slurm_up: bool = True, state_writable: bool = True, errors: int = 0) -> str:
    """The service's one-line status after a cycle, e.g. ``cycle 12 (every 10s): 3 idle
    node(s), 2 malleable job(s) on 5 node(s), last cycle 41 ms``."""
    text = (f"cycle {cycle} (every {interval_s:g}s): {idle_nodes} idle node(s), {running_jobs} malleable "
            f"job(s) on {held_nodes} node(s), last cycle {cycle_ms:.0f} ms")
    if not slurm_up:
        text += "; Slurm unreachable, jobs left as they are"
    if not state_writable:
        text += "; state store read-only, applying nothing"
    if errors:
        text += f"; {errors} error(s) contained in the last cycle (see malletrain status)"
    return text
