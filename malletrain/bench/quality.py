"""``malletrain bench quality``: every policy on one trace and workload, side by side."""
from __future__ import annotations

import sys
from collections.abc import Sequence

from malletrain.bench import Report
from malletrain.domain.config import CoreConfig


def bench_quality(trace_path: str, workload_path: str, policies: Sequence[str], *,
                  nodes: int | None = None, start: float | None = None, end: float | None = None,
                  max_jobs: int | None = None, noise: float = 0.05, interval_s: float = 30.0,
                  progress: bool = True, core: dict | None = None) -> Report:
    """Every policy on one trace and workload (same seed and noise).  ``lost+pause``: samples
    lost to preemptions plus those lost to rescale pauses (at the old rate)."""
    from malletrain.replay.engine import ReplayOptions, run_replay
    from malletrain.replay.traces import load_trace
    from malletrain.replay.workload import load_workload
    trace = load_trace(trace_path, nodes=nodes, start=start, end=end)
    workload = load_workload(workload_path)
    rows, lines = [], []
    for policy in policies:
        opts = ReplayOptions(core=CoreConfig(policy=policy, **(core or {})), interval_s=interval_s,
                             max_jobs=max_jobs, noise=noise, seed=0, quiet=True)
        s = run_replay(trace, workload, opts).summary
        rows.append(s.to_dict())
        lp = s.lost_samples + s.rescale_pause_samples
        lines.append(f"{policy:15s} useful {s.useful_samples:11.5g}  harvested "
                     f"{100 * s.harvested_fraction:5.1f}%  done {s.jobs_completed:3d}/{s.jobs}  "
                     f"lost+pause {lp:9.4g} ({100 * lp / max(s.useful_samples, 1e-9):4.2f}%)  rescales "
                     f"{s.rescales:5d}  preempt {s.preemptions:4d}  decide p95 {s.decision_ms_p95:7.1f} ms  "
                     f"wall {s.wall_s:6.1f} s")
        if progress:
            print(lines[-1], file=sys.stderr)
    base = {r["policy"]: r["useful_samples"] for r in rows}
    if "malletrain" in base:
        for k, v in base.items():
            if k != "malletrain" and v:
                lines.append(f"malletrain / {k}: {base['malletrain'] / v:.3f}")
    return Report({"trace": trace_path, "rows": rows}, lines)
