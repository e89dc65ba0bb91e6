"""Build the example shipped in ``examples/`` from the public data.

* ``philly-1day.csv.gz`` – 24 h of Microsoft Philly's per-minute node usage
  (2017-10-10), as per-node idle/busy events on its 420 nodes;
* ``workload-pollux.yaml`` – 60 malleable jobs over those 24 h (more work than the idle nodes can finish) whose
  ground-truth curves are Pollux/AdaptDL measurements of six models.
Both are small enough to ship; rebuilding them is deterministic.
"""
from __future__ import annotations

import os

from devtools.datasets import default_data_dir, make_workload, philly_events, write_events, write_workload

PHILLY_DAY = "2017-10-10T00:00:00Z"


def build_example(data_dir: str | None, out_dir: str) -> None:
    data = data_dir or default_data_dir()
    os.makedirs(out_dir, exist_ok=True)
    write_events(philly_events(data, PHILLY_DAY, 24.0), os.path.join(out_dir, "philly-1day.csv.gz"))
    write_workload(make_workload(data, n_jobs=60, span_s=20 * 3600, seed=7,
                                 work_node_hours=(10.0, 80.0)),
                   os.path.join(out_dir, "workload-pollux.yaml"))
