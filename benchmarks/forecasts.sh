#!/usr/bin/env bash
# The forecasts' cost guard (issue #23), no tests involved: replay the 15-day 4,734-node synthetic
# trace, the Theta 2022 log and the Philly day with the forecasts on and off in one run, time the
# allocator both ways, print the ratios and exit 1 when a target is missed. Three pairs of replays
# per trace, the order alternating, the median pair's ratio held to the target (one pair's ratio
# moves by a tenth or more from run to run on this machine). Took 10 minutes here (stop 63).
# The run is written on top of benchmarks/results/forecast-cost.txt, the earlier runs kept below it;
# the guard's exit status (1: a target missed) is the script's.
#   bash benchmarks/forecasts.sh [--traces synthetic,philly] [--repeat 1]   (extra arguments go to the benchmark)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/env.sh" dev
cd "$ROOT"
DATA="${DATA:-$ROOT/../shared/data}"
OUT="$ROOT/benchmarks/results/forecast-cost.txt"
NEW="$(mktemp)"
trap 'rm -f "$NEW" "$OUT.tmp"' EXIT
echo "== python -m devtools bench forecasts --data $DATA --guard --repeat 3 $*" | tee "$NEW"
rc=0
python -m devtools bench forecasts --data "$DATA" --guard --repeat 3 "$@" 2>&1 | tee -a "$NEW" || rc=$?
{ cat "$NEW"; if [ -s "$OUT" ]; then echo; cat "$OUT"; fi; } > "$OUT.tmp"
mv "$OUT.tmp" "$OUT"
exit "$rc"
