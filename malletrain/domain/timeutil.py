"""Parsing of the time formats the input files use (no clock reads)."""
from __future__ import annotations

from datetime import UTC, datetime


def parse_time(text: str) -> float:
    """ISO-8601 (``2021-02-10T00:08:52Z``; naive means UTC) or epoch seconds."""
    s = text.strip()
    if not s:
        raise ValueError("empty time")
    try:
        return float(int(s))
    except ValueError:
        pass
    if s.endswith("Z"):
        s = s[:-1] + "+00:00"
    dt = datetime.fromisoformat(s)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
