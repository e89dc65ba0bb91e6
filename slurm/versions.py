"""What differs between the Slurm releases malletrain meets, in one place.

Seen on real daemons (``scripts/local-slurm.sh --slurm 22.05|24.11|26.05``; fixtures in
``tests/fixtures/slurm`` captured by ``python -m devtools capture-fixtures``):

=====================================  =========  =========  =========
                                       22.05.8    24.11.5    26.05.5
=====================================  =========  =========  =========
daemon's text reads (``-o`` formats)   same       same       same
rescale: requeuehold/update/release    same id    same id    same id
``--json`` data format                 openapi    v0.0.42    v0.0.45
                                       v0.0.38
numbers in JSON                        plain      {set, infinite, number}
``sinfo --json``                       ``nodes``  ``sinfo``: one entry per
                                       list       (partition, state) group
a run of a job has its own id          no         no         yes (``sluid``)
=====================================  =========  =========  =========

The daemon reads only the text formats (SECURITY.md: they hold only Slurm-written fields
and cost a fraction of the JSON), which have not changed across these releases, so the CLI
backend needs no per-release code path; it logs the release and these notes once at start.
The JSON normaliser in :mod:`malletrain.slurm.parse` (for tools) handles both shapes.

On 26.05 each run of a job (the first start and every requeue) has its own Slurm Lifecycle
Unique ID, ``step_id.sluid`` in JSON, while the job id stays the same; malletrain keys on the
job id, which is what keeps a rescaled job one job.  :attr:`JobRecord.run_id` carries the
sluid where Slurm gives one.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from malletrain.domain.errors import BackendError

OLDEST_TESTED = (22, 5)
NEWEST_TESTED = (26, 5)
_DATA_PARSER = {(22, 5): "v0.0.38", (24, 11): "v0.0.42", (26, 5): "v0.0.45"}   # the table above
_VERSION = re.compile(r"slurm(?:-wlm)?\s+(\d+)\.(\d+)\.(\d+)")


@dataclass(frozen=True)
class Release:
    """A Slurm release and what malletrain knows of it."""

    major: int
    minor: int
    micro: int

    @property
    def text(self) -> str:
        return f"{self.major}.{self.minor:02d}.{self.micro}"

    @property
    def json_numbers_wrapped(self) -> bool:
        """JSON numbers are ``{set, infinite, number}`` objects (23.02 and later)."""
        return (self.major, self.minor) >= (23, 2)

    @property
    def data_parser(self) -> str:
        """The JSON/REST API version this release writes (``/slurm/<it>/jobs``); '' if not seen here."""
        return _DATA_PARSER.get((self.major, self.minor), "")

    @property
    def run_ids(self) -> bool:
        """Each run of a job has its own id (``sluid``, 26.05 and later)."""
        return (self.major, self.minor) >= (26, 5)

    @property
    def tested(self) -> bool:
        return OLDEST_TESTED <= (self.major, self.minor) <= NEWEST_TESTED

    def notes(self) -> str:
        """One line for the daemon's start-up log."""
        bits = [f"Slurm {self.text}"]
        if not self.tested:
            bits.append(f"untested (malletrain is tested on {OLDEST_TESTED[0]}.{OLDEST_TESTED[1]:02d}"
                        f" to {NEWEST_TESTED[0]}.{NEWEST_TESTED[1]:02d})")
        if self.run_ids:
            bits.append("each run of a job has its own sluid; jobs are followed by job id")
        return "; ".join(bits)


def parse_release(text: str) -> Release:
    """``sinfo --version`` output (``slurm 24.11.5``) → :class:`Release`."""
    m = _VERSION.search(text)
    if m is None:
        raise BackendError(f"cannot read a Slurm version from {text.strip()[:80]!r}")
    return Release(int(m.group(1)), int(m.group(2)), int(m.group(3)))
