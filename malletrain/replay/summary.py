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

SCHEMA_VERSION = 2
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
    # jobs and users (schema 2)
    objective: str = "samples"
    progress_units: float = 0.0        # Σ over jobs of the fraction of its work done
    jct_mean_s: float = 0.0            # completed jobs: completion − submit
    jct_p95_s: float = 0.0
    wait_mean_s: float = 0.0           # started jobs: first start − submit
    wait_p95_s: float = 0.0
    never_started: int = 0             # admitted jobs that never got a node
    max_starved_s: float = 0.0         # longest an admitted job went without nodes while others ran
    jain_users: float = 1.0            # Jain's index over users' node-seconds (divided by their weight)
    users: int = 0
    # forecasts (schema 2)
    rescale_learned: int = 0           # job directions whose pause estimate was checked (3 measurements)
    rescale_error_p50: float = 0.0     # relative error of those estimates against the workload's truth
    rescale_error_max: float = 0.0
    rescale_guess: tuple[float, float] | None = None   # what the policy was told before it learned
    window_oracle: bool = False
    planned_lead_s: float | None = None   # idle windows' ends known this long before (None: never)
    schema_version: int = SCHEMA_VERSION

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["solver_notes_first"] = list(self.solver_notes_first)
        d["rescale_guess"] = list(self.rescale_guess) if self.rescale_guess is not None else None
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
    if doc.get("rescale_guess") is not None:
        doc["rescale_guess"] = tuple(doc["rescale_guess"])
    return ReplaySummary(**{k: v for k, v in doc.items() if k in names})
