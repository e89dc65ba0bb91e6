#!/usr/bin/env bash
# The forecasts' cost guard (issue #23), no tests involved: replay the 15-day 4,734-node synthetic
# trace, the Theta 2022 log and the Philly day with the forecasts on and off in one run, time the
# allocator both ways, print the ratios and exit 1 when a target is missed. Three pairs of replays
# per trace, the order alternating, the median pair's ratio held to the target (one pair's ratio
# moves by a tenth or more from run to run on this machine). Took 10 minutes here (stop 63).
#   bash benchmarks/forecasts.sh [--traces synthetic,philly] [--repeat 1]   (extra arguments go to the benchmark)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/env.sh" dev
cd "$ROOT"
DATA="${DATA:-$ROOT/../shared/data}"
OUT="$ROOT/benchmarks/results/forecast-cost.txt"
echo "== python -m devtools bench forecasts --data $DATA --guard --repeat 3 $*" | tee "$OUT"
python -m devtools bench forecasts --data "$DATA" --guard --repeat 3 "$@" 2>&1 | tee -a "$OUT"
