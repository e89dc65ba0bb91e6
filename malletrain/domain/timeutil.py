"""Parsing of the time formats the input files use (no clock reads)."""
from __future__ import annotations

import re
from datetime import UTC, datetime

# epoch seconds a datetime can show (years 1 to 9999): a time outside is a typo, not a date
MIN_EPOCH_S = -62_135_596_800
MAX_EPOCH_S = 253_402_300_799


def parse_time(text: str) -> float:
    """ISO-8601 (``2021-02-10T00:08:52Z``; naive means UTC) or epoch seconds.

    Every bad text (also an integer too large for a float) raises ``ValueError``."""
    s = text.strip()
    if not s:
        raise ValueError("empty time")
    try:
        epoch = int(s)
    except ValueError:
        pass
    else:
        if not MIN_EPOCH_S <= epoch <= MAX_EPOCH_S:
            raise ValueError("epoch seconds out of range (years 1 to 9999)")
        return float(epoch)
    if s.endswith("Z"):
        s = s[:-1] + "+00:00"
    dt = datetime.fromisoformat(s)
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# sbatch --time: minutes, minutes:seconds, hours:minutes:seconds, days-hours,
# days-hours:minutes, days-hours:minutes:seconds, or no limit
_SLURM_TIME = re.compile(r"\d{1,9}(:\d{1,2}){0,2}|\d{1,6}-\d{1,2}(:\d{1,2}){0,2}|unlimited|infinite",
                         re.IGNORECASE | re.ASCII)


def is_slurm_time(text: str) -> bool:
    """Whether ``text`` is a time limit ``sbatch --time`` accepts (its documented formats)."""
    return bool(_SLURM_TIME.fullmatch(text))
