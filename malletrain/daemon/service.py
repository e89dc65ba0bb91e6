"""What a service needs around the cycle: JSON logs, a Prometheus endpoint,
and systemd's notify protocol (READY / WATCHDOG / STOPPING / STATUS)."""
from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

_EXTRA = ("cycle", "job", "action", "reason", "command", "rc")


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

class Metrics:
    """A tiny registry rendered in the Prometheus text format (0.0.4)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[tuple[str, tuple], float] = {}
        self._help: dict[str, tuple[str, str]] = {}

    def describe(self, name: str, kind: str, text: str) -> None:
        self._help[name] = (kind, text)

    def set(self, name: str, value: float, **labels: str) -> None:
        with self._lock:
            self._values[(name, tuple(sorted(labels.items())))] = float(value)

    def inc(self, name: str, value: float = 1.0, **labels: str) -> None:
        key = (name, tuple(sorted(labels.items())))
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + value

    def observe(self, name: str, seconds: float, **labels: str) -> None:
        """A summary without quantiles: _sum and _count."""
        self.inc(name + "_sum", seconds, **labels)
        self.inc(name + "_count", 1, **labels)

    def render(self) -> str:
        with self._lock:
            items = sorted(self._values.items())
        lines, said = [], set()
        for (name, labels), value in items:
            base = name.removesuffix("_sum").removesuffix("_count")
            if base in self._help and base not in said:
                kind, text = self._help[base]
                lines += [f"# HELP {base} {text}", f"# TYPE {base} {kind}"]
                said.add(base)
            lab = ",".join(f'{k}="{v}"' for k, v in labels)
            lines.append(f"{name}{{{lab}}} {value:g}" if lab else f"{name} {value:g}")
        return "\n".join(lines) + "\n"


def serve_metrics(metrics: Metrics, host: str, port: int) -> ThreadingHTTPServer:
    """Serve ``/metrics`` on host:port in a daemon thread; returns the server."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:   # noqa: N802 (http.server API)
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404)
                return
            body = metrics.render().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server


# ---------------------------------------------------------------- systemd

class Notifier:
    """sd_notify over $NOTIFY_SOCKET; a no-op outside systemd."""

    def __init__(self, env: dict | None = None) -> None:
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

    def stopping(self) -> None:
        self.send("STOPPING=1")
