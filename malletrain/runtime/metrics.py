"""Progress records for the daemon's profiler (``malletrain.daemon.progress`` reads them).

Rank 0 appends one JSON object per line to ``$MALLETRAIN_METRICS``::

    {"t": ..., "job": "17", "step": 120, "samples": 7680, "step_s": 0.21, "world": 8,
     "nodes": 2, "node": "n3", "event": "progress", "restart": 1}

``progress`` records are rate-limited to one per ``min_interval_s``; ``start``,
``checkpoint`` and ``exit`` always go out.  Lines are written and flushed by a
background thread from a bounded queue: a slow or full filesystem drops
records (counted) instead of stalling a training step.  The file is created
``O_EXCL`` or appended to only if it is a regular file of this user's (never
through a symlink or into a FIFO a teammate planted under the predictable name),
and kept 0644: the daemon, another account, reads it.
"""
from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time

from malletrain.domain.safefile import open_append

log = logging.getLogger("malletrain.runtime")


class MetricsWriter:
    def __init__(self, path: str | None, *, base: dict, min_interval_s: float = 0.5,
                 max_queue: int = 256) -> None:
        self.path, self.base, self.min_interval_s = path, dict(base), min_interval_s
        self.dropped = 0
        self.written = 0
        self._last_progress = float("-inf")
        self._q: queue.Queue = queue.Queue(maxsize=max_queue)
        self._thread = None
        if path:
            self._thread = threading.Thread(target=self._drain, name="malletrain-metrics", daemon=True)
            self._thread.start()

    def record(self, event: str, **fields) -> bool:
        """Queue one record; False when it was rate-limited or dropped."""
        if self._thread is None:
            return False
        now = time.time()
        if event == "progress":
            if now - self._last_progress < self.min_interval_s:
                return False
            self._last_progress = now
        rec = {"t": round(now, 3), **self.base, **fields, "event": event}
        try:
            self._q.put_nowait(json.dumps(rec, separators=(",", ":")) + "\n")
        except queue.Full:
            self.dropped += 1
            return False
        return True

    def _drain(self) -> None:
        assert self.path is not None    # started only with a path
        fh = None
        warned = False
        while True:
            line = self._q.get()
            if line is None:
                break
            try:
                if fh is None:   # never through a planted symlink or FIFO; 0644 for the daemon
                    fh = os.fdopen(open_append(self.path, 0o644), "a", encoding="utf-8")
                fh.write(line)
                fh.flush()
                self.written += 1
            except OSError as exc:
                self.dropped += 1
                if not warned:      # once: a refused or failing file would repeat it every record
                    log.warning("cannot write progress record to %s: %s", self.path, exc)
                    warned = True
                if fh is not None:
                    try:
                        fh.close()
                    except OSError:
                        pass
                fh = None
        if fh is not None:
            fh.close()

    def close(self, timeout_s: float = 2.0) -> None:
        if self._thread is None:
            return
        try:
            self._q.put(None, timeout=timeout_s)
        except queue.Full:
            return
        self._thread.join(timeout_s)
        self._thread = None
