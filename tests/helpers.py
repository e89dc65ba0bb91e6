"""Small builders shared by the tests."""
from __future__ import annotations

import gzip

from malletrain.domain.timeutil import iso

T0 = 1_600_000_000


def write_events(path, rows, gz=False):
    opener = gzip.open if gz else open
    with opener(path, "wt") as fh:
        fh.write("time,node,state\n")
        for t, n, s in rows:
            fh.write(f"{iso(T0 + t)},{n},{s}\n")


def write_workload(path, jobs):
    import yaml
    with open(path, "w") as fh:
        yaml.safe_dump({"jobs": jobs}, fh, sort_keys=False)


def job(name="a", submit=0, lo=1, hi=4, work=1000.0, up=0, down=0, profile="p", thr=None):
    return {"name": name, "submit": submit, "min_nodes": lo, "max_nodes": hi, "work": work,
            "rescale_up_s": up, "rescale_down_s": down, "profile": profile,
            "throughput": thr or {1: 10.0, 2: 20.0, 4: 40.0}}
