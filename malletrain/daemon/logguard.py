"""Log lines no user can multiply (SECURITY.md): deduplicated, rate-limited, audit lines kept.

journald rate-limits a service's messages and then drops whatever comes, the audit trail
included.  Many of the daemon's lines are caused by what users do (a refused progress file,
a job released every cycle, a file that hangs), and some would repeat every cycle.  So, on
the handler:

* **audit lines always pass**: every Slurm write (``command``) and every action on a job
  (``action``); they are never counted against the budget below;
* **repeats are deduplicated**: a line with the same logger, level, message template and job
  as one logged less than ``repeat_s`` ago is suppressed and counted; the first one after that
  says how many were suppressed;
* **the rest is rate-limited**: at most ``burst`` lines at once and ``per_s`` a second after
  (a token bucket); the next line that passes says how many were dropped.

Time is the record's own (``LogRecord.created``): the filter reads no clock.  Memory is
bounded (``max_keys`` lines remembered, the oldest forgotten first).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

AUDIT_FIELDS = ("command", "action")


@dataclass
class _Seen:
    since: float          # when the line last passed
    suppressed: int = 0   # repeats suppressed since


class LogGuard(logging.Filter):
    def __init__(self, *, repeat_s: float = 600.0, burst: int = 200, per_s: float = 2.0,
                 max_keys: int = 10_000) -> None:
        super().__init__()
        self.repeat_s, self.burst, self.per_s, self.max_keys = repeat_s, burst, per_s, max_keys
        self._seen: dict[tuple, _Seen] = {}
        self._tokens = float(burst)
        self._last: float | None = None
        self._dropped_since = 0     # dropped by the rate limit since the last line that passed
        self.suppressed = 0         # repeats suppressed (all time)
        self.dropped = 0            # lines dropped by the rate limit (all time)

    def filter(self, record: logging.LogRecord) -> bool:
        if any(hasattr(record, f) for f in AUDIT_FIELDS):
            return True
        now = record.created
        key = (record.name, record.levelno, str(record.msg), str(getattr(record, "job", "")))
        seen = self._seen.get(key)
        if seen is not None and now - seen.since < self.repeat_s:
            seen.suppressed += 1
            self.suppressed += 1
            return False
        if self._last is not None:
            self._tokens = min(float(self.burst), self._tokens + max(0.0, now - self._last) * self.per_s)
        self._last = now
        if self._tokens < 1.0:
            self._dropped_since += 1
            self.dropped += 1
            return False
        self._tokens -= 1.0
        notes = []
        if seen is not None and seen.suppressed:
            notes.append(f"{seen.suppressed} more like it in the last {now - seen.since:.0f}s not logged")
        if self._dropped_since:
            notes.append(f"{self._dropped_since} other line(s) dropped by the log rate limit before it")
            self._dropped_since = 0
        if notes:
            record.msg = f"{record.getMessage()} [{'; '.join(notes)}]"
            record.args = None
        self._seen.pop(key, None)                 # the newest last: the oldest is forgotten first
        self._seen[key] = _Seen(now)
        while len(self._seen) > self.max_keys:
            del self._seen[next(iter(self._seen))]
        return True
