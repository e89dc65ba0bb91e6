#!/usr/bin/env bash
# Issue #26: rescaling in place. The schedule (shrink, preempt, grow, kill -9, grow) ten times,
# as an elastic job and under today's restart, both checked bitwise against an uninterrupted run;
# then 1,000 seeded chaos events (leave, join, kill -9, freeze). Needs the train extra; about
# 50 minutes on a 2-core machine. Writes benchmarks/results/elastic-{bench,chaos}.txt.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/env.sh" train
cd "$ROOT"
R=benchmarks/results
mkdir -p "$R"
python -m devtools.elastic_drill bench --cycles 10 | tee "$R/elastic-bench.txt"
python -m devtools.elastic_drill chaos --events 1000 --seed 1 | tee "$R/elastic-chaos.txt"
