"""``malletrain bench quality``: every policy on one trace and workload, side by side."""
from __future__ import annotations

import sys
from collections.abc import Sequence

from malletrain.bench import Report
from malletrain.domain.config import CoreConfig


def bench_quality(trace_path: str, workload_path: str, policies: Sequence[str], *,
                  nodes: int | None = None, start: float | None = None, end: float | None = None,
                  max_jobs: int | None = None, noise: float = 0.05, interval_s: float = 30.0,
                  progress: bool = True) -> Report:
    from malletrain.replay.engine import ReplayOptions, run_replay
    from malletrain.replay.traces import load_trace
    from malletrain.replay.workload import load_workload
    trace = load_trace(trace_path, nodes=nodes, start=start, end=end)
    workload = load_workload(workload_path)
    rows, lines = [], []
    for policy in policies:
        opts = ReplayOptions(core=CoreConfig(policy=policy), interval_s=interval_s,
                             max_jobs=max_jobs, noise=noise, seed=0, quiet=True)
        s = run_replay(trace, workload, opts).summary
        rows.append(s.to_dict())
        lines.append(f"{policy:10s} useful {s.useful_samples:12.5g}  harvested "
                     f"{100 * s.harvested_fraction:5.1f}%  done {s.jobs_completed:3d}/{s.jobs}  "
                     f"lost {s.lost_samples:10.4g}  rescales {s.rescales:5d}  preempt "
                     f"{s.preemptions:4d}  decide p95 {s.decision_ms_p95:8.1f} ms  wall {s.wall_s:7.1f} s")
        if progress:
            print(lines[-1], file=sys.stderr)
    base = {r["policy"]: r["useful_samples"] for r in rows}
    if "malletrain" in base:
        for k, v in base.items():
            if k != "malletrain" and v:
                lines.append(f"malletrain / {k}: {base['malletrain'] / v:.3f}")
    return Report({"trace": trace_path, "rows": rows}, lines)
