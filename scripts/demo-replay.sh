#!/usr/bin/env bash
# The replay demo (REPLAY=1 bash scripts/demo.sh): replays one real day of the Philly GPU
# cluster (shipped in examples/) with a stream of malleable jobs whose curves
# are Pollux measurements, once per policy, and prints them side by side.
# Results (summary.json, timeline.csv, nodes.png, progress.png) land in out/demo/.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/env.sh"
cd "$ROOT"
OUT="${OUT:-$ROOT/out/demo}"
mkdir -p "$OUT"
for policy in malletrain oracle greedy static; do
    malletrain replay --trace examples/philly-1day.csv.gz --workload examples/workload-pollux.yaml \
        --policy "$policy" --noise 0.05 --out "$OUT/$policy"
done
python - "$OUT" <<'PY'
import os, sys
from malletrain.replay.summary import read_summary
out = sys.argv[1]
print(f"\n{'policy':<11}{'useful samples':>16}{'harvested':>11}{'jobs done':>11}{'preempt':>9}{'rescales':>10}{'decide p95':>12}")
for p in ("malletrain", "oracle", "greedy", "static"):
    s = read_summary(os.path.join(out, p, "summary.json"))
    print(f"{p:<11}{s.useful_samples:>16.4g}{100*s.harvested_fraction:>10.1f}%"
          f"{s.jobs_completed:>6}/{s.jobs:<4}{s.preemptions:>9}{s.rescales:>10}"
          f"{s.decision_ms_p95:>10.1f}ms")
print(f"\nplots: {out}/<policy>/nodes.png and progress.png")
PY
