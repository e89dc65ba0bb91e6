"""What a campaign's trials are doing: their progress records, results and a status table."""
from __future__ import annotations

import json
import os

from malletrain.campaign.slots import END_OF
from malletrain.campaign.spec import Spec
from malletrain.domain.text import shown


def last_record(path: str, max_bytes: int = 65536) -> dict | None:
    """The last well-formed JSON line of a progress file (None when there is none)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            tail = fh.read()
    except OSError:
        return None
    for raw in reversed(tail.splitlines()):
        try:
            rec = json.loads(raw)
        except ValueError:
            continue
        if isinstance(rec, dict):
            return rec
    return None


def read_result(spec: Spec, trial: dict) -> dict | None:
    path = os.path.join(spec.dir, trial["id"], "ckpt", "result.json")
    try:
        with open(path, encoding="utf-8") as fh:
            res = json.load(fh)
    except (OSError, ValueError):
        return None
    return res if isinstance(res, dict) else None


def status_rows(spec: Spec, trials: list[dict], slurm_states: dict[str, tuple[str, int]],
                metrics_dir: str) -> list[dict]:
    rows = []
    for t in trials:
        job = t.get("job")
        rec = last_record(os.path.join(metrics_dir, f"{job}.jsonl")) if job else None
        res = read_result(spec, t)
        state, nodes = slurm_states.get(str(job), (None, 0))
        if state is None:
            state = "not submitted" if not job else ("done" if res and res.get("final") else "gone")
        value = res.get(spec.metric) if res else None
        rows.append({"id": t["id"], "job": job, "state": state, "nodes": nodes,
                     "step": rec.get("step") if rec else None,
                     "samples": rec.get("samples") if rec else None,
                     "restarts": rec.get("restart") if rec else None,
                     "metric": value if isinstance(value, (int, float)) else None,
                     "final": bool(res and res.get("final")), "params": t["params"]})
    scored = [r for r in rows if r["metric"] is not None]
    best = (max if spec.goal == "max" else min)(scored, key=lambda r: r["metric"]) if scored else None
    for r in rows:
        r["best"] = r is best
    return rows


def format_status(spec: Spec, rows: list[dict]) -> list[str]:
    total = spec.fixed.get("steps")
    lines = [f"campaign {spec.name} ({spec.kind}, {spec.search} search, {len(rows)} trials) in {spec.dir}",
             f"{'TRIAL':<5} {'JOB':>6} {'STATE':<13} {'NODES':>5} {'STEP':>10} {'RESTARTS':>8} "
             f"{spec.metric.upper():>9}  PARAMS"]
    for r in rows:
        step = "-" if r["step"] is None else (f"{r['step']}/{total}" if total else str(r["step"]))
        metric = "-" if r["metric"] is None else f"{r['metric']:.4g}" + ("" if r["final"] else "~")
        params = " ".join(f"{k}={v}" for k, v in r["params"].items() if k not in spec.fixed)
        lines.append(f"{r['id']:<5} {r['job'] or '-':>6} {r['state']:<13} {r['nodes'] or '-':>5} "
                     f"{step:>10} {r['restarts'] if r['restarts'] is not None else '-':>8} "
                     f"{metric:>9}{' *' if r['best'] else '  '} {params}")
    best = next((r for r in rows if r["best"]), None)
    done = sum(r["state"] == "done" for r in rows)
    lines.append(f"{done}/{len(rows)} done; best so far: " +
                 (f"{best['id']} {spec.metric}={best['metric']:.4g} ({'final' if best['final'] else 'interim'})"
                  if best else "none yet") + "   (~ interim value, * best)")
    return [shown(line) for line in lines]


# ---- study campaigns ------------------------------------------------------------------------------
def rung(spec: Spec, step: int | None) -> int | None:
    """The highest pruning rung a trial reached: rung k is ``min_resource · η^k`` steps (of the
    spec's ``step_unit``); None before the first."""
    if step is None or step < spec.min_resource:
        return None
    k, at = 0, spec.min_resource * spec.reduction_factor
    while at <= step:
        k, at = k + 1, at * spec.reduction_factor
    return k


def study_rows(spec: Spec, slot_records: list[dict], views: list,
               slurm_states: dict[str, tuple[str, int]]) -> list[dict]:
    """One row per trial job: its trial (number, state, rung, values, parameters) and its job."""
    by_number = {v.number: v for v in views}
    rows = []
    for s in slot_records:
        v = by_number.get(s["trial"]) if s["trial"] is not None else None
        job = s.get("job")
        slurm, nodes = slurm_states.get(str(job), (None, 0))
        if s["end"] == "void":
            state = "void"
        elif v is not None and v.state != "running":
            state = END_OF.get(v.state, v.state)
        elif slurm is not None:
            state = slurm
        else:
            state = "not submitted" if not job else "gone"
        values = list(v.values) if v is not None and v.values is not None and v.state == "complete" else None
        rows.append({"slot": s["id"], "trial": s["trial"], "job": job, "state": state, "nodes": nodes,
                     "failures": s.get("failures", 0), "step": v.last_step if v else None,
                     "rung": rung(spec, v.last_step) if v else None,
                     "value": v.last_value if v else None, "values": values, "final": bool(values),
                     "params": dict(v.params) if v else {}})
    done = [r for r in rows if r["values"] is not None and r["state"] == "done"]   # a pruned trial keeps its last value
    if len(spec.metrics) > 1:       # several objectives: the best are the Pareto front
        front = {id(r) for r in pareto_front(done, spec.goals)}
        for r in rows:
            r["best"] = id(r) in front
        return rows
    best = None
    if done:
        pick = max if spec.goals[0] == "max" else min
        best = pick(done, key=lambda r: r["values"][0])
    for r in rows:
        r["best"] = r is best
    return rows


def pareto_front(rows: list[dict], goals: tuple[str, ...]) -> list[dict]:
    """The rows whose ``values`` no other row's dominate (as good in every objective of ``goals``,
    better in one), in their order; equal values are all kept."""
    signs = [1.0 if g == "max" else -1.0 for g in goals]
    keyed = [[s * v for s, v in zip(signs, r["values"])] for r in rows]

    def dominated(a: list[float]) -> bool:
        return any(all(x >= y for x, y in zip(b, a)) and b != a for b in keyed)
    return [r for r, k in zip(rows, keyed) if not dominated(k)]


def format_study_status(spec: Spec, rows: list[dict]) -> list[str]:
    unit = {"steps": "step", "samples": "sample", "epochs": "epoch"}[spec.step_unit]
    prune = f"pruner {spec.pruner}" if spec.pruner != "none" else "no pruning"
    lines = [f"campaign {spec.name} ({spec.kind}, Optuna {spec.sampler}, {prune}, {spec.trials} trials, "
             f"at most {spec.max_concurrent} at once) in {spec.dir}",
             f"study: {os.path.join(spec.dir, 'study.journal')} (optuna-dashboard shows it)",
             f"{'JOB#':<5} {'TRIAL':>5} {'JOB':>7} {'STATE':<10} {'NODES':>5} {unit.upper():>9} {'RUNG':>4} "
             f"{'FAILS':>5} {'/'.join(m.upper() for m in spec.metrics):>12}  PARAMS"]
    for r in rows:
        if r["values"] is not None:
            metric = "/".join(f"{x:.4g}" for x in r["values"])
        elif r["value"] is not None:
            metric = f"{r['value']:.4g}~"
        else:
            metric = "-"
        params = " ".join(f"{k}={v}" for k, v in r["params"].items() if k not in spec.fixed)
        lines.append(f"{r['slot']:<5} {'-' if r['trial'] is None else r['trial']:>5} {r['job'] or '-':>7} "
                     f"{r['state']:<10} {r['nodes'] or '-':>5} {'-' if r['step'] is None else r['step']:>9} "
                     f"{'-' if r['rung'] is None else r['rung']:>4} {r['failures']:>5} "
                     f"{metric:>12}{' *' if r['best'] else '  '} {params}")
    count = {k: sum(r["state"] == k for r in rows) for k in ("done", "pruned", "failed")}
    head = f"{count['done']} done, {count['pruned']} pruned, {count['failed']} failed of {spec.trials}; "
    if len(spec.metrics) > 1:
        front = sorted((r for r in rows if r["best"]), key=lambda r: r["trial"])
        goals = ", ".join(f"{m} {g}" for m, g in zip(spec.metrics, spec.goals))
        lines.append(head + f"Pareto front ({goals}): " +
                     (", ".join(f"trial {r['trial']}" for r in front) if front else "none yet") +
                     "   (~ last reported value, * on the front)")
    else:
        best = next((r for r in rows if r["best"]), None)
        lines.append(head + "best so far: " + (f"trial {best['trial']} {spec.metrics[0]}={best['values'][0]:.4g}"
                                               if best else "none yet") + "   (~ last reported value, * best)")
    return [shown(line) for line in lines]
