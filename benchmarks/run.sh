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
# What the forecasts cost: every trace replayed with them on and off in one run, and the allocator
# both ways; prints the on/off ratios and whether the targets of issue #23 hold (forecasts.sh
# runs the same with --guard: exit 1 when one is missed).
run forecast-cost    python -m devtools bench forecasts --data "$DATA"
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
# Where Theta's headroom over bftrainer lies: its pauses set to zero, one direction at a time.
echo "== pause-share-theta" > "$RES/pause-share-theta.txt"
python - "$DATA/traces/theta_2022.swf" "$RES/theta-workload.yaml" <<'PY' | tee -a "$RES/pause-share-theta.txt"
# Where Theta's headroom lies: bftrainer (true curves) with the workload's start/grow pauses, its
# stop/shrink pauses, or both set to zero.  Useful samples and lost+pause, seed 0, 5% noise.
import dataclasses
import sys

from malletrain.domain.config import CoreConfig
from malletrain.domain.timeutil import parse_time
from malletrain.replay.engine import ReplayOptions, run_replay
from malletrain.replay.traces import load_trace
from malletrain.replay.workload import load_workload

trace = load_trace(sys.argv[1], nodes=128, start=parse_time("2022-03-01T00:00:00Z"),
                   end=parse_time("2022-03-03T00:00:00Z"))
workload = load_workload(sys.argv[2])
base = None
for label, zero in (("true pauses", {}), ("up free", {"rescale_up_s": 0.0}),
                    ("down free", {"rescale_down_s": 0.0}),
                    ("both free", {"rescale_up_s": 0.0, "rescale_down_s": 0.0})):
    jobs = [dataclasses.replace(j, **zero) for j in workload]
    s = run_replay(trace, jobs, ReplayOptions(core=CoreConfig(policy="bftrainer"), noise=0.05, max_jobs=10,
                                              rescale_guess=None)).summary
    base = base or s.useful_samples
    print(f"bftrainer {label:12s} useful {s.useful_samples:.4g} ({s.useful_samples / base:.3f}x)  "
          f"lost+pause {s.lost_samples + s.rescale_pause_samples:.4g}  starts {s.starts}  rescales {s.rescales}")
PY
# What live planning buys: the policy told each idle node's next busy time S seconds ahead, as
# Slurm's planned starts would (replay only: the traces have no pending jobs to plan).
: > "$RES/planned-lead.txt"
for lead in 60 300 900 1800; do
    for args in "--trace $RES/philly/philly-1day.csv.gz --workload $RES/philly/workload-pollux.yaml" \
                "--trace $DATA/traces/theta_2022.swf --workload $RES/theta-workload.yaml --nodes 128 --start 2022-03-01T00:00:00Z --end 2022-03-03T00:00:00Z"; do
        # shellcheck disable=SC2086
        { echo "== malletrain bench quality $args --max-jobs 10 --policies malletrain --seeds 5 --planned-lead $lead"
          malletrain bench quality $args --max-jobs 10 --policies malletrain --seeds 5 --planned-lead "$lead" 2>/dev/null; } \
            | tee -a "$RES/planned-lead.txt"
    done
done
# Issue #24: a NAS-Bench-201 campaign on the Philly day and the Theta slice (random, ASHA, ASHA + promise).
bash "$ROOT/benchmarks/campaign.sh"
