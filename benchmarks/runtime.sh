#!/usr/bin/env bash
# Training-runtime figures: consistency vs tolerance step time at P=2 (target <= 10%),
# checkpoint write, signal -> exit and start -> first step for the digits example,
# plus the consistency self-check.  Writes benchmarks/results/runtime*.{json,txt}.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/env.sh" train
cd "$ROOT"
mkdir -p benchmarks/results
for arch in cnn mlp; do
    malletrain bench runtime --procs 2 --arch "$arch" --json "benchmarks/results/runtime-$arch.json" \
        | tee "benchmarks/results/runtime-$arch.txt"
done
malletrain selfcheck consistency --workers 4 --procs 1,2,3,4 --steps 24 --rescale 1,4,2,3 --kill9 \
    --json benchmarks/results/selfcheck-consistency.json | tee benchmarks/results/selfcheck-consistency.txt
malletrain selfcheck consistency --workers 4 --procs 1,2,3,4 --steps 24 --mode tolerance \
    --json benchmarks/results/selfcheck-tolerance.json | tee benchmarks/results/selfcheck-tolerance.txt
