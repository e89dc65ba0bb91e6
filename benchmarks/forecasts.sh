#!/usr/bin/env bash
# The forecasts' cost guard (issue #23), no tests involved: replay the 15-day 4,734-node synthetic
# trace, the Theta 2022 log and the Philly day with the forecasts on and off in one run, time the
# allocator both ways, print the ratios and exit 1 when a target is missed. Takes ~10 minutes.
#   bash benchmarks/forecasts.sh [--traces synthetic,philly]     (extra arguments go to the benchmark)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/env.sh" dev
cd "$ROOT"
DATA="${DATA:-$ROOT/../shared/data}"
OUT="$ROOT/benchmarks/results/forecast-cost.txt"
echo "== python -m devtools bench forecasts --data $DATA --guard $*" | tee "$OUT"
python -m devtools bench forecasts --data "$DATA" --guard "$@" 2>&1 | tee -a "$OUT"
