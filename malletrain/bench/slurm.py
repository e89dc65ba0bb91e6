"""``malletrain bench slurm``: Slurm commands per cycle and cycle latency of the
real daemon cycle against a running cluster (``benchmarks/slurm.sh`` starts the
local one and submits synthetic malleable jobs first).

Each cycle is one :meth:`Daemon.cycle_once`; a cycle that applied no change is
*steady* (target: at most 3 read commands).  Cycles that rescale include the
wait for jobs to checkpoint, so their latency is reported separately.
"""
from __future__ import annotations

import time
from typing import Any

from malletrain.bench import Report
from malletrain.domain.stats import percentile


def bench_slurm(config_path: str, cycles: int = 40, interval_s: float = 2.0) -> Report:
    from malletrain.daemon.loop import Daemon
    d = Daemon(config_path)
    rows = []
    try:
        for _ in range(cycles):
            t0 = time.perf_counter()
            d.cycle_once()
            wall = time.perf_counter() - t0
            lc = d.last_cycle
            assert lc is not None
            rows.append(dict[str, Any](reads=lc.reads, writes=lc.writes, cycle_s=wall,
                             decision_ms=lc.decision_ms, reused=lc.reused))
            time.sleep(max(0.0, interval_s - wall))
    finally:
        d.store.close()
    steady = [r for r in rows if r["writes"] == 0]
    change = [r for r in rows if r["writes"] > 0]
    dec = [r["decision_ms"] for r in rows if r["decision_ms"] is not None and not r["reused"]]

    def lat(rs):
        xs = [1000 * r["cycle_s"] for r in rs]
        return dict(n=len(xs), p50_ms=percentile(xs, 0.5), p95_ms=percentile(xs, 0.95)) if xs else dict(n=0)

    out = dict(cycles=len(rows), steady_cycles=len(steady),
               steady_reads_max=max((r["reads"] for r in steady), default=None),
               steady_reads_mean=sum(r["reads"] for r in steady) / len(steady) if steady else None,
               change_reads_mean=sum(r["reads"] for r in change) / len(change) if change else None,
               change_writes_mean=sum(r["writes"] for r in change) / len(change) if change else None,
               steady_latency=lat(steady), change_latency=lat(change),
               decision_ms_p50=percentile(dec, 0.5) if dec else None,
               decision_ms_p95=percentile(dec, 0.95) if dec else None,
               plans_reused=sum(1 for r in rows if r["reused"]))
    lines = []
    lines.append(f"cycles: {out['cycles']} ({out['steady_cycles']} steady, {len(change)} with changes, "
          f"{out['plans_reused']} reused the previous plan)")
    lines.append(f"Slurm read commands per steady cycle: max {out['steady_reads_max']}, mean "
          f"{out['steady_reads_mean'] or 0:.2f} (target <= 3)")
    if change:
        lines.append(f"cycles with changes: {out['change_reads_mean']:.1f} reads, "
              f"{out['change_writes_mean']:.1f} writes on average")
    sl, cl = out["steady_latency"], out["change_latency"]
    if sl["n"]:
        lines.append(f"steady cycle latency: p50 {sl['p50_ms']:.1f} ms, p95 {sl['p95_ms']:.1f} ms")
    if cl["n"]:
        lines.append(f"cycle latency with rescales (includes waiting for checkpoints): p50 "
              f"{cl['p50_ms']:.0f} ms, p95 {cl['p95_ms']:.0f} ms")
    if dec:
        lines.append(f"decide(): p50 {out['decision_ms_p50']:.2f} ms, p95 {out['decision_ms_p95']:.2f} ms")
    return Report(out, lines)
