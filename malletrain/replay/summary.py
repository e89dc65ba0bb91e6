"""``summary.json``: the figures of one replay, as one frozen record.

Written by :func:`write_summary` (keys sorted, so equal replays give equal
files) and read back by :func:`read_summary` (reports, scripts, tests).
``schema_version`` changes whenever a field is renamed or removed.  Timing
fields (``wall_s``, ``decision_ms_*``) are the only ones that differ between
two runs of the same replay.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from typing import IO, Any

from malletrain.domain.errors import InputError

SCHEMA_VERSION = 1
TIMING_FIELDS = ("wall_s", "decision_ms_p50", "decision_ms_p95", "decision_ms_mean")


@dataclass(frozen=True)
class ReplaySummary:
    policy: str
    trace_span_s: float
    nodes: int
    events: int
    idle_node_s: float
    allocated_node_s: float
    harvested_fraction: float
    useful_samples: float
    lost_samples: float
    rescale_pause_samples: float
    jobs: int
    jobs_completed: int
    rescales: int
    starts: int
    stops: int
    preemptions: int
    decisions: int                  # decide() runs; unchanged cycles are decisions_reused
    decisions_reused: int
    decision_ms_p50: float
    decision_ms_p95: float
    decision_ms_mean: float
    jpa_rejected_samples: int
    solver_notes: int               # timeouts, fallbacks, kept plans
    solver_notes_first: tuple[str, ...]
    interval_s: float
    horizon_s: float
    seed: int
    noise: float
    max_jobs: int | None
    wall_s: float
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["solver_notes_first"] = list(self.solver_notes_first)
        return d


def write_summary(fh: IO[str], summary: ReplaySummary) -> None:
    json.dump(summary.to_dict(), fh, indent=2, sort_keys=True)
    fh.write("\n")


def read_summary(path: str) -> ReplaySummary:
    """A replay's summary; :class:`InputError` when missing, malformed or of another schema."""
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read replay summary: {exc}", path=path) from None
    if not isinstance(doc, dict) or doc.get("schema_version") != SCHEMA_VERSION:
        raise InputError(f"not a version-{SCHEMA_VERSION} replay summary", path=path,
                         field="schema_version")
    names = {f.name for f in fields(ReplaySummary)}
    missing = names - set(doc) - {"schema_version"}
    if missing:
        raise InputError(f"missing {', '.join(sorted(missing))}", path=path)
    doc["solver_notes_first"] = tuple(doc["solver_notes_first"])
    return ReplaySummary(**{k: v for k, v in doc.items() if k in names})
