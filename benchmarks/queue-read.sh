#!/usr/bin/env bash
# What the unforgeable queue read costs at 3,000 and 30,000 queued jobs (SECURITY.md):
# starts its own local Slurm (.local-slurm-bench, port 7917), fills the queue with held jobs,
# times the daemon's read against squeue --json and the unsafe text format, and the daemon's
# adoption and steady observe(); prints the table (stored in benchmarks/results/queue-read.txt)
# and stops the cluster.  As root; submitting 30,000 jobs takes a few minutes.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/env.sh" dev
cd "$ROOT"
python -m devtools bench queue --jobs "${JOBS:-3000,30000}" "$@" | tee benchmarks/results/queue-read.txt
