"""Benchmarks shipped with malletrain (``malletrain bench``); each prints its figures.

``allocator``/``compare`` (:mod:`.allocator`), ``quality`` (:mod:`.quality`) and
``slurm`` (:mod:`.slurm`, a live cluster).  Each returns a :class:`Report`:
the figures as a JSON-able dict and the lines a person reads.
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
