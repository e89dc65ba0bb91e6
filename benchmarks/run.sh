#!/usr/bin/env bash
# Run every benchmark of issue #2 and keep the output in benchmarks/results/.
# Needs ../shared/data (the public data) for the JPA, Theta and workload figures.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/env.sh" highs
cd "$ROOT"
RES="$ROOT/benchmarks/results"
DATA="${DATA:-$ROOT/../shared/data}"
mkdir -p "$RES"
run() { local name="$1"; shift; echo "== $name: $*" | tee "$RES/$name.txt"; "$@" 2>&1 | tee -a "$RES/$name.txt"; }
run allocator-summit malletrain bench allocator --nodes 4734 --jobs 100 --repeat 30
run allocator-summit-plain malletrain bench allocator --nodes 4734 --jobs 100 --repeat 30 --no-forecasts
run allocator-10k    malletrain bench allocator --nodes 10000 --jobs 1000 --repeat 10
run compare          malletrain bench compare --sizes 10x64,20x128 --repeat 3
run jpa              python -m devtools bench jpa --data "$DATA"
run advise           python -m devtools bench advise --data "$DATA"
run fairness         python -m devtools bench fairness --data "$DATA"
run fairness-160     python -m devtools bench fairness --data "$DATA" --jobs 160
run variability      python -m devtools bench variability
run replay-15d       python -m devtools bench replay --data "$DATA" --json
run replay-theta     python -m devtools bench replay --data "$DATA" --trace "$DATA/traces/theta_2022.swf" --json
# Quality: two real traces, one workload each, every policy.
python -m devtools example --data "$DATA" --out "$RES/philly"
run quality-philly   malletrain bench quality --trace "$RES/philly/philly-1day.csv.gz" \
    --workload "$RES/philly/workload-pollux.yaml" --max-jobs 10 --policies malletrain,bftrainer-guess,bftrainer,oracle --plain --bound --clairvoyant --seeds 5
python - "$DATA" "$RES/theta-workload.yaml" <<'PY'
import sys
from devtools.datasets import make_workload, write_workload
write_workload(make_workload(sys.argv[1], 30, 36 * 3600, seed=11, work_node_hours=(5, 40)), sys.argv[2])
PY
run quality-theta    malletrain bench quality --trace "$DATA/traces/theta_2022.swf" \
    --workload "$RES/theta-workload.yaml" --nodes 128 --max-jobs 10 --policies malletrain,bftrainer-guess,bftrainer,oracle --plain --bound --clairvoyant --seeds 5 \
    --start 2022-03-01T00:00:00Z --end 2022-03-03T00:00:00Z
