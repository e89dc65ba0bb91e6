"""``malletrain bench quality``: every policy on one trace and workload, side by side.

With ``plain``, one more row: the ``malletrain`` policy as it was before it learned pauses and
stays (``learn_rescale``, ``availability`` and ``variability`` off) and told the workload's true
pauses: what the forecasts are measured against.

With ``bound``, one more row: the ``oracle`` policy on the same trace and workload with every
rescale pause set to zero (so a preemption loses nothing either: a job checkpoints in no time),
each idle node's true next busy time handed to it (``window_oracle``) and a horizon of one
interval.  It knows everything and pays nothing for a change: the headroom any policy has over
the others on this trace.  It is a reference, not a proof: it is still a sequence of greedy
decisions, so a clairvoyant schedule over the whole trace could do a little better.

With ``clairvoyant``, one more row: the ``oracle`` policy told each idle node's true next busy
time (``window_oracle``) and the workload's true pauses, which it pays as every other policy
does.  It knows the curves, the pauses and the future of every node, so it is what no learning
from the past can beat by much: the reference for targets on useful work and on lost+pause.
"""
from __future__ import annotations

import dataclasses
import statistics
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from malletrain.bench import Report
from malletrain.domain.config import CoreConfig

if TYPE_CHECKING:
    from malletrain.replay.workload import WorkloadJob


@dataclasses.dataclass(frozen=True)
class _Run:
    """One row of the table: a policy, the workload it meets and what it is told."""

    label: str
    policy: str
    jobs: list[WorkloadJob]                  # the workload (pauses zeroed for ``bound``)
    knobs: dict[str, Any]                    # CoreConfig fields besides the policy
    window_oracle: bool = False              # told each idle node's true next busy time
    told: tuple[float, float] | None = None  # the pauses it is told (None: the true ones)
    planned_lead_s: float | None = None      # planned starts revealed this long before


# policies that act on nothing a job reports (true curves, told pauses): the seed changes nothing
SEED_FREE = ("bftrainer", "bftrainer-guess", "static")


def bench_quality(trace_path: str, workload_path: str, policies: Sequence[str], *,
                  nodes: int | None = None, start: float | None = None, end: float | None = None,
                  max_jobs: int | None = None, noise: float = 0.05, interval_s: float = 30.0,
                  progress: bool = True, core: dict | None = None, bound: bool = False,
                  plain: bool = False, seeds: int = 1, clairvoyant: bool = False,
                  planned_lead_s: float | None = None,
                  elastic: tuple[float, float] | None = None) -> Report:
    """Every policy on one trace and workload (same seeds and noise).  ``lost+pause``: samples
    lost to preemptions plus those lost to rescale pauses (at the old rate).  With ``seeds`` > 1
    every row is the mean over seeds 0..seeds-1 (± the standard deviation): one seed's
    difference of a few percent is within the noise of the samples a policy learns from."""
    from malletrain.replay.engine import ReplayOptions, run_replay
    from malletrain.replay.traces import load_trace
    from malletrain.replay.workload import load_workload
    trace = load_trace(trace_path, nodes=nodes, start=start, end=end)
    workload = load_workload(workload_path)
    free = [dataclasses.replace(j, rescale_up_s=0.0, rescale_down_s=0.0) for j in workload]
    knobs = core or {}
    guess = ReplayOptions().rescale_guess
    runs = [_Run(p, p, workload, knobs, told=guess, planned_lead_s=planned_lead_s) for p in policies]
    if plain:
        runs.append(_Run("malletrain-plain", "malletrain", workload,
                         {**knobs, "learn_rescale": False, "availability": False, "variability": False}))
    if bound:
        runs.append(_Run("bound", "oracle", free, {**knobs, "horizon_s": interval_s}, window_oracle=True))
    if clairvoyant:
        runs.append(_Run("clairvoyant", "oracle", workload, knobs, window_oracle=True))
    rows, lines, means = [], [], {}
    for run in runs:
        label, policy = run.label, run.policy
        got = []
        for seed in range(1 if policy in SEED_FREE else max(1, seeds)):
            opts = ReplayOptions(core=CoreConfig(policy=policy, **run.knobs), interval_s=interval_s,
                                 max_jobs=max_jobs, noise=noise, seed=seed, quiet=True,
                                 window_oracle=run.window_oracle, rescale_guess=run.told,
                                 planned_lead_s=run.planned_lead_s, elastic=elastic)
            s = run_replay(trace, run.jobs, opts).summary
            rows.append({**s.to_dict(), "label": label})
            got.append(s)
        useful = [s.useful_samples for s in got]
        lost = [s.lost_samples + s.rescale_pause_samples for s in got]
        means[label] = (statistics.fmean(useful), statistics.fmean(lost))
        lines.append(f"{label:16s} useful {_spread(useful)}  harvested "
                     f"{100 * statistics.fmean(s.harvested_fraction for s in got):5.1f}%  done "
                     f"{statistics.fmean(s.jobs_completed for s in got):5.1f}/{got[0].jobs}  "
                     f"lost+pause {_spread(lost)} ({100 * means[label][1] / max(means[label][0], 1e-9):4.2f}%)  "
                     f"rescales {statistics.fmean(s.rescales for s in got):6.0f}  preempt "
                     f"{statistics.fmean(s.preemptions for s in got):5.0f}  decide p95 "
                     f"{max(s.decision_ms_p95 for s in got):7.1f} ms  wall {sum(s.wall_s for s in got):6.1f} s")
        if seeds > 1 and len(got) == 1:
            lines[-1] += "  (one seed: it acts on no reported sample)"
        if progress:
            print(lines[-1], file=sys.stderr)
    if "malletrain" in means:
        mine = means["malletrain"]
        for k, (u, lp) in means.items():
            if k != "malletrain" and u:
                lost_ratio = f", lost+pause {mine[1] / lp:.3f}" if lp else ""
                lines.append(f"malletrain / {k}: useful {mine[0] / u:.3f}{lost_ratio}")
    if "bound" in means and "bftrainer" in means and means["bftrainer"][0]:
        lines.append(f"bound / bftrainer: {means['bound'][0] / means['bftrainer'][0]:.3f} (the most any "
                     "policy could gain over bftrainer here, to within the greedy bound's slack)")
    if "clairvoyant" in means and "bftrainer" in means and means["bftrainer"][0]:
        lines.append(f"clairvoyant / bftrainer: {means['clairvoyant'][0] / means['bftrainer'][0]:.3f} (knowing "
                     "every node's future, paying the true pauses)")
    return Report({"trace": trace_path, "seeds": max(1, seeds), "rows": rows}, lines)


def _spread(xs: Sequence[float]) -> str:
    if len(xs) == 1:
        return f"{xs[0]:10.4g}"
    return f"{statistics.fmean(xs):10.4g} ± {statistics.stdev(xs):8.2g}"
