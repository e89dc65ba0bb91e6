#!/usr/bin/env bash
# Issue #26: the elastic group's schedule under real Slurm (shrink by requeuehold, Slurm's own
# preemption of one member, grow by release, kill -9 of one member, grow), ten times on each
# release: the survivors' pause per kind and whether a one-node preemption left the other
# members running. As root; about 6 minutes per release. Writes
# benchmarks/results/elastic-slurm.txt (and one JSON per release beside it).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/env.sh" train
cd "$ROOT"
R=benchmarks/results
mkdir -p "$R"
: > "$R/elastic-slurm.txt"
for v in host 24.11 26.05; do
    python -m devtools.elastic_slurm --slurm "$v" --cycles 10 --json "$R/elastic-slurm-$v.json" \
        | tee -a "$R/elastic-slurm.txt"
done
