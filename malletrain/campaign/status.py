"""What a campaign's trials are doing: their progress records, results and a status table."""
from __future__ import annotations

import json
import os

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
