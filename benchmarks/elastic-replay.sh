#!/usr/bin/env bash
# Issue #26: what rescaling in place is worth over today's restarts, in replay. The Philly day and
# the Theta slice (as in benchmarks/run.sh), policies malletrain and oracle, 5 seeds each, once with
# the workloads' pauses (today: every change restarts the job) and once as elastic jobs with the
# pauses measured by `python -m devtools.elastic_drill bench` (grow 0.050 s, shrink 0.038 s; a
# joiner's node still idles for the workload's rescale_up_s while it starts; a start from no nodes
# is still a restart). Needs ../shared/data. Writes benchmarks/results/elastic-replay.txt.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/env.sh" dev
cd "$ROOT"
DATA="${DATA:-$ROOT/../shared/data}"
OUT=benchmarks/results/elastic-replay.txt
python - "$DATA" <<'PY' | tee "$OUT"
import sys

from malletrain.bench.quality import bench_quality

data = sys.argv[1]
traces = {
    "philly-day": dict(trace_path="examples/philly-1day.csv.gz", workload_path="examples/workload-pollux.yaml"),
    "theta-slice": dict(trace_path=f"{data}/traces/theta_2022.swf", workload_path="benchmarks/results/theta-workload.yaml",
                        nodes=128, start=1646092800.0, end=1646265600.0),
}
ELASTIC = (0.050, 0.038)
for name, where in traces.items():
    means = {}
    for label, elastic in (("restart", None), ("elastic", ELASTIC)):
        rep = bench_quality(policies=["malletrain", "oracle"], max_jobs=10, seeds=5, progress=False,
                            elastic=elastic, **where)
        print(f"== {name}, {label} pauses{'' if elastic is None else f' (grow {elastic[0]} s, shrink {elastic[1]} s)'}")
        for line in rep.lines:
            if not line.startswith("malletrain /"):
                print("  " + line)
        for row in rep.data["rows"]:
            means.setdefault((row["label"], label), []).append(row)
    for policy in ("malletrain", "oracle"):
        a, b = means[(policy, "restart")], means[(policy, "elastic")]
        ua, ub = (sum(r["useful_samples"] for r in x) / len(x) for x in (a, b))
        la, lb = (sum(r["lost_samples"] + r["rescale_pause_samples"] for r in x) / len(x) for x in (a, b))
        # the share lost to pauses under restarts, at the restart runs' own decisions (a policy that
        # pays less per change also changes more often, so the gain may exceed it)
        print(f"{name:12s} {policy:10s} useful samples elastic / restart: {ub / ua:.4f}  "
              f"(lost+pause {la:.4g} -> {lb:.4g}, {100 * la / ua:.2f}% -> {100 * lb / ub:.2f}% of useful)")
PY
