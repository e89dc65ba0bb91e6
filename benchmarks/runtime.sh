#!/usr/bin/env bash
# Training-runtime figures: consistency vs tolerance step time at P=2 (target <= 10% for the
# example CNN at its default micro-batch, 32), also at micro-batches 16 and 64 and for the MLP;
# checkpoint write, signal -> exit and start -> first step; and the consistency self-check.
# Writes benchmarks/results/runtime-*.{json,txt} and selfcheck-*.{json,txt}.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/env.sh" train
cd "$ROOT"
R=benchmarks/results
mkdir -p "$R"
for run in "cnn 32" "cnn 16" "cnn 64" "mlp 32"; do
    set -- $run
    python -m devtools bench runtime --procs 2 --arch "$1" --micro-batch "$2" --json "$R/runtime-$1-mb$2.json" \
        | tee "$R/runtime-$1-mb$2.txt"
done
malletrain selfcheck consistency --workers 4 --procs 1,2,3,4 --steps 24 --rescale 1,4,2,3 --kill9 \
    --json "$R/selfcheck-consistency.json" | tee "$R/selfcheck-consistency.txt"
malletrain selfcheck consistency --workers 4 --procs 1,2,3,4 --steps 24 --mode tolerance \
    --json "$R/selfcheck-tolerance.json" | tee "$R/selfcheck-tolerance.txt"
# issue #25: what each adapter costs (DDP, Lightning, Hugging Face Trainer: step overhead, signal -> exit,
# launch -> first step, checkpoint)
python -m devtools bench adapters --procs 2 --json "$R/adapters.json" | tee "$R/adapters.txt"
