"""The Prometheus endpoint under slow clients, with real sockets on 127.0.0.1.

Slow clients trickle a request (a byte every fraction of a second, which renews any
per-read timeout) or never send one; a real scrape in the same test must still be
answered, and every slow connection must be closed within its deadline.  Loops are
bounded; the timing bounds are generous (the machine is shared)."""
from __future__ import annotations

import socket
import threading
import time
import urllib.request

import pytest

from malletrain.daemon.service import DaemonMetrics, serve_metrics


@pytest.fixture
def endpoint():
    m = DaemonMetrics()
    server = serve_metrics(m, "127.0.0.1", 0, max_connections=4, timeout_s=1.5)
    try:
        yield m, server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def _scrape(port: int, attempts: int = 10) -> tuple[str, int]:
    """The body of the first answered scrape and how many attempts it took."""
    for i in range(1, attempts + 1):
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=3).read().decode(), i
        except OSError:
            time.sleep(0.3)
    raise AssertionError(f"no scrape answered in {attempts} attempts while slow clients were connected")


class Trickler(threading.Thread):
    """Sends a GET one byte every ``gap_s`` (never finishing the headers) until stopped or the
    server closes the connection; records when that happened."""

    def __init__(self, port: int, gap_s: float = 0.2, source: str = "127.0.0.1") -> None:
        super().__init__(daemon=True)
        self.port, self.gap_s, self.source = port, gap_s, source
        self.stop = threading.Event()
        self.closed_after: float | None = None

    def run(self) -> None:
        t0 = time.monotonic()
        with socket.create_connection(("127.0.0.1", self.port), timeout=5,
                                      source_address=(self.source, 0)) as s:
            payload = b"GET /metrics HTTP/1.1\r\nX-Slow: " + b"a" * 10_000
            for byte in payload:                     # bounded: at most 10 k bytes, and stop
                if self.stop.wait(self.gap_s):
                    return
                try:
                    s.send(bytes([byte]))
                    s.settimeout(0.001)
                    if s.recv(1) == b"":
                        raise ConnectionResetError
                except TimeoutError:
                    pass
                except OSError:
                    self.closed_after = time.monotonic() - t0
                    return
                finally:
                    s.settimeout(5)


def test_slow_clients_cannot_blind_the_scrape(endpoint):
    m, port = endpoint
    slow = [Trickler(port) for _ in range(8)]          # twice the slots, each renewing its reads
    for t in slow:
        t.start()
        time.sleep(0.05)
    try:
        time.sleep(0.5)                                 # all slots held by now (on the old server)
        body, attempts = _scrape(port)
        assert "malletrain_idle_nodes" in body
        for t in slow:
            t.join(15)                                  # each is closed by its deadline (1.5 s)
        assert all(t.closed_after is not None for t in slow), \
            [t.closed_after for t in slow]              # nobody keeps a connection by trickling
        assert max(t.closed_after for t in slow) < 10   # generous: deadline 1.5 s
        assert m.metrics_rejected._value.get() >= 8
    finally:
        for t in slow:
            t.stop.set()


def test_a_scrape_gets_in_while_one_address_holds_every_slot(endpoint):
    """Connections that never send a byte, from another address, all slots and more: the
    scrape displaces the oldest of them at once, it does not wait for their deadline."""
    m, port = endpoint
    idle = [socket.create_connection(("127.0.0.1", port), timeout=5, source_address=("127.0.0.2", 0))
            for _ in range(12)]
    try:
        time.sleep(0.3)
        t0 = time.monotonic()
        body, attempts = _scrape(port)
        took = time.monotonic() - t0
        assert "malletrain_idle_nodes" in body and attempts == 1
        assert took < 1.5, f"the scrape waited {took:.2f}s: it queued behind idle connections"
        assert m.metrics_rejected._value.get() >= 8     # 12 idle into 4 slots, then the scrape's room
    finally:
        for s in idle:
            s.close()


def test_oversized_request_is_closed_and_the_endpoint_goes_on(endpoint):
    m, port = endpoint
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        try:
            s.sendall(b"GET /metrics HTTP/1.1\r\nX-Big: " + b"a" * 100_000)
            got = s.recv(100)
        except OSError:     # reset while we were still sending: also closed
            got = b""
    assert got == b"" or got.startswith(b"HTTP/1.0 4"), got   # closed, or refused
    body, _ = _scrape(port)
    assert "malletrain_metrics_connections_rejected_total" in body
    # prometheus-client's handler still negotiates: OpenMetrics on request
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics",
                                 headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    with urllib.request.urlopen(req, timeout=3) as resp:
        assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
        assert resp.read().decode().rstrip().endswith("# EOF")
