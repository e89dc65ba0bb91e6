"""The malleable workload file (YAML), validated with file/line/field errors.

```yaml
jobs:
  - name: bert-0          # unique
    submit: 0             # seconds from trace start, or ISO-8601
    min_nodes: 1
    max_nodes: 16
    work: 2.0e6           # samples to finish
    rescale_up_s: 30
    rescale_down_s: 10
    profile: bert         # jobs with one key scale alike
    user: alice           # optional: whose job (per-user weights, fairness); default: a user of its own
    sensitivity: 1.0      # optional: slowdown exponent on slow nodes (0 = unaffected, 1 = at the slowest's pace)
    topology_penalty: 0.1 # optional: share of its rate lost per extra topology group it spans
    throughput: {1: 110.0, 2: 205.0, 4: 380.0, 8: 610.0, 16: 800.0}
```
``throughput`` is the ground truth for the replay oracle (linear
interpolation between listed counts, proportional below the smallest, flat
above the largest).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml

from malletrain.domain.config import read_yaml
from malletrain.domain.errors import InputError
from malletrain.domain.model import MAX_NODES, interpolate
from malletrain.domain.text import clipped
from malletrain.domain.timeutil import parse_time

JOB_KEYS = ("name", "submit", "min_nodes", "max_nodes", "work", "rescale_up_s",
            "rescale_down_s", "profile", "user", "sensitivity", "topology_penalty", "throughput")
REQUIRED = ("name", "submit", "min_nodes", "max_nodes", "work", "throughput")
MAX_VALUE = 1e15          # work, seconds and samples/s beyond this are typos (and overflow floats)


@dataclass(frozen=True)
class TrueCurve:
    """Ground-truth throughput, piecewise linear in the node count."""

    counts: tuple[int, ...]
    values: tuple[float, ...]

    def __call__(self, n: float) -> float:
        return interpolate(self.counts, self.values, n)


@dataclass(frozen=True)
class WorkloadJob:
    name: str
    submit: float          # seconds from trace start, or absolute epoch if absolute
    submit_is_absolute: bool
    min_nodes: int
    max_nodes: int
    work: float
    rescale_up_s: float
    rescale_down_s: float
    profile: str
    truth: TrueCurve
    line: int
    user: str = ""
    sensitivity: float = 0.0
    topology_penalty: float = 0.0


class _LineLoader(yaml.SafeLoader):
    pass


def _construct_mapping(loader: _LineLoader, node: yaml.MappingNode) -> dict:
    mapping = _LineDict(loader.construct_mapping(node, deep=True))
    mapping.line = node.start_mark.line + 1
    mapping.key_lines = {loader.construct_object(k, deep=True): k.start_mark.line + 1
                         for k, _ in node.value}
    return mapping


class _LineDict(dict):
    line = 0
    key_lines: dict = {}


_LineLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def load_workload(path: str) -> list[WorkloadJob]:
    doc = read_yaml(path, loader=_LineLoader, what="workload")
    if not isinstance(doc, dict) or set(doc) != {"jobs"}:
        keys = sorted(doc) if isinstance(doc, dict) else type(doc).__name__
        raise InputError(f"expected a mapping with exactly the key 'jobs', got {keys}", path=path)
    if not isinstance(doc["jobs"], list) or not doc["jobs"]:
        raise InputError("'jobs' must be a non-empty list", path=path,
                         line=getattr(doc, "key_lines", {}).get("jobs"), field="jobs")
    jobs, names = [], set()
    for entry in doc["jobs"]:
        job = _parse_job(entry, path)
        if job.name in names:
            raise InputError(f"duplicate job name {job.name!r}", path=path, line=job.line, field="name")
        names.add(job.name)
        jobs.append(job)
    return jobs


def _parse_job(entry: Any, path: str) -> WorkloadJob:
    if not isinstance(entry, dict):
        raise InputError(f"each job must be a mapping, got {entry!r}", path=path)
    line = getattr(entry, "line", None)
    kl = getattr(entry, "key_lines", {})
    unknown = sorted(set(map(str, entry)) - set(JOB_KEYS))
    if unknown:
        raise InputError(f"unknown key(s) {', '.join(unknown)}; valid keys: {', '.join(JOB_KEYS)}",
                         path=path, line=kl.get(unknown[0], line), field=unknown[0])
    for key in REQUIRED:
        if key not in entry:
            raise InputError("missing", path=path, line=line, field=key)

    def err(key: str, msg: str) -> InputError:
        return InputError(msg, path=path, line=kl.get(key, line), field=key)

    def number(key: str, default: float | None = None, integer: bool = False, minimum: float = 0.0,
               strict: bool = False, maximum: float = MAX_VALUE):
        v = entry.get(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise err(key, f"expected a number, got {clipped(v)}")
        if not abs(v) <= maximum:       # NaN, ±inf and integers too large for a float
            raise err(key, f"expected a finite number <= {maximum:g}, got {clipped(v)}")
        if integer and not float(v).is_integer():
            raise err(key, f"expected an integer, got {v!r}")
        if v < minimum or (strict and v == minimum):
            raise err(key, f"must be {'>' if strict else '>='} {minimum:g}, got {v!r}")
        return int(v) if integer else float(v)

    name = entry["name"]
    if not isinstance(name, str) or not name.strip():
        raise err("name", f"expected a non-empty string, got {name!r}")
    submit_raw = entry["submit"]
    if isinstance(submit_raw, str):
        try:
            submit, absolute = parse_time(submit_raw), True
        except ValueError as exc:
            raise err("submit", f"not ISO-8601 or seconds: {clipped(submit_raw)}") from exc
    else:
        submit, absolute = number("submit"), False
    min_nodes = number("min_nodes", integer=True, minimum=1, maximum=MAX_NODES)
    max_nodes = number("max_nodes", integer=True, minimum=1, maximum=MAX_NODES)
    if min_nodes > max_nodes:
        raise err("min_nodes", f"min_nodes={min_nodes} > max_nodes={max_nodes}")
    work = number("work", strict=True)
    profile = entry.get("profile", "")
    if not isinstance(profile, str):
        raise err("profile", f"expected a string, got {profile!r}")
    user = entry.get("user", "")
    if not isinstance(user, str) or len(user) > 256:
        raise err("user", f"expected a string (at most 256 characters), got {clipped(user)}")
    thr = entry["throughput"]
    if not isinstance(thr, dict) or not thr:
        raise err("throughput", "expected a non-empty mapping {node_count: samples_per_s}")
    pts = []
    for k, v in thr.items():
        if isinstance(k, bool) or not isinstance(k, int) or not 0 < k <= MAX_NODES:
            raise err("throughput", f"node count {clipped(k)} is not a positive integer <= {MAX_NODES}")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= MAX_VALUE:
            raise err("throughput", f"throughput at {k} nodes must be a positive number <= {MAX_VALUE:g}, "
                                    f"got {clipped(v)}")
        pts.append((k, float(v)))
    pts.sort()
    return WorkloadJob(name.strip(), submit, absolute, min_nodes, max_nodes, work,
                       number("rescale_up_s", 0.0), number("rescale_down_s", 0.0), profile,
                       TrueCurve(tuple(p[0] for p in pts), tuple(p[1] for p in pts)), line or 0,
                       user.strip(), number("sensitivity", 0.0, maximum=4.0),
                       number("topology_penalty", 0.0, maximum=0.99))
