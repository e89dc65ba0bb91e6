#!/usr/bin/env bash
# The daemon's steady cycle at a centre-sized queue (issue: <= 1 s and <= 3 read commands at
# 20,000 jobs): per Slurm release in $RELEASES (default: the host's), starts its own local
# Slurm with 1,000 nodes in the harvest partition (4 real, 996 powered-down CLOUD nodes),
# fills the queue with 1,000, 5,000 and 20,000 held jobs of three users, measures the real
# daemon cycle and slurmctld's own RPC account (sdiag), prints the table (stored in
# benchmarks/results/scale-<release>.txt) and stops the cluster.  As root; about 6 minutes
# per release.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/env.sh" dev
cd "$ROOT"
for rel in ${RELEASES:-host}; do
    out="$(mktemp)"
    python -m devtools bench scale --slurm "$rel" "$@" | tee "$out"
    v="$(sed -n 's/.*(Slurm \([0-9]*\.[0-9]*\)\..*/\1/p' "$out" | head -1)"
    mv "$out" "benchmarks/results/scale-${v:-$rel}.txt"
done
