"""Build the example shipped in ``examples/`` from the public data.

* ``philly-1day.csv.gz`` – 24 h of Microsoft Philly's per-minute node usage
  (2017-10-10), as per-node idle/busy events on its 420 nodes;
* ``workload-pollux.yaml`` – 60 malleable jobs over those 24 h (more work than the idle nodes can finish) whose
  ground-truth curves are Pollux/AdaptDL measurements of six models;
* ``philly-nodes.csv`` – a topology group (cabinet) and speed for each of the 420 nodes,
  dealt from PAL's per-node ResNet measurements of TACC Longhorn (MIT), for
  ``replay --node-info``;
* ``workload-mixed.yaml`` – 80 jobs of the six models over 16 h, each also slowed by slow
  nodes and extra groups as its model class would be (``devtools.datasets.SENSITIVITY``): the
  fairness and variability benchmarks' workload.
All are small enough to ship; rebuilding them is deterministic.
"""
from __future__ import annotations

import csv
import os

from devtools.datasets import (
    default_data_dir,
    make_workload,
    node_info_rows,
    philly_events,
    write_events,
    write_workload,
)

PHILLY_DAY = "2017-10-10T00:00:00Z"


def build_example(data_dir: str | None, out_dir: str) -> None:
    data = data_dir or default_data_dir()
    os.makedirs(out_dir, exist_ok=True)
    write_events(philly_events(data, PHILLY_DAY, 24.0), os.path.join(out_dir, "philly-1day.csv.gz"))
    write_workload(make_workload(data, n_jobs=60, span_s=20 * 3600, seed=7,
                                 work_node_hours=(10.0, 80.0)),
                   os.path.join(out_dir, "workload-pollux.yaml"))
    events = philly_events(data, PHILLY_DAY, 24.0)
    names = list(dict.fromkeys(e[1] for e in events))
    with open(os.path.join(out_dir, "philly-nodes.csv"), "w", newline="") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(("node", "group", "slowdown"))
        w.writerows(node_info_rows(data, names, seed=3))
    write_workload(make_workload(data, 80, 16 * 3600, seed=21, work_node_hours=(2, 16), sensitive=True),
                   os.path.join(out_dir, "workload-mixed.yaml"))
