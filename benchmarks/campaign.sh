#!/usr/bin/env bash
# Issue #24's campaign targets: a NAS-Bench-201 campaign (CIFAR-100 table, stated learning-curve
# model; no training) replayed on the idle nodes of the Philly day and of the Theta slice (128
# nodes, 1-3 March 2022), in three modes: random search with every trial to
# the end, ASHA, ASHA with promise-aware allocation; on the Philly day also the clairvoyant
# baseline asha-oracle (each trial's exact promise known when it is asked). Prints the time to a
# trial within 1 point of the table's best and the node-hours spent on pruned trials, per seed,
# and the ratios.
# About four hours on a 2-core machine (a seed whose ASHA run never reaches the target asks ~19,000
# trials, and Optuna's successive halving reads every trial at every report: ~20 minutes for that run).
#   bash benchmarks/campaign.sh [--seeds 5]      (extra arguments go to every run)
# The ten Philly seeds of benchmarks/campaign.md add seeds 5-9 (about 15 minutes; a run depends on its seed only):
#   malletrain bench campaign --trace examples/philly-1day.csv.gz --first-seed 5 --seeds 5
#       (results/campaign-philly-seeds5-9.txt; with --modes asha-oracle: ...-oracle-seeds5-9.txt)
# and seeds 10-19 (about 40 minutes), run after cd5042f as a check on seeds the change was not found on:
#   malletrain bench campaign --trace examples/philly-1day.csv.gz --first-seed 10 --seeds 10 \
#       --modes random-full,asha,asha-promise,asha-oracle      (results/campaign-philly-promise.txt)
# After the re-split in node-equivalents (5305f95), asha-promise and asha-oracle on seeds 0-19, and
# plain asha with the whole core in node-equivalents (--modes asha --objective speedup), the unit's
# share of the gain: results/campaign-philly-equivalents.txt (about 70 minutes for the three).
# random-full and asha report no promise: their runs above are unchanged.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/env.sh" dev
cd "$ROOT"
DATA="${DATA:-$ROOT/../shared/data}"
RES="$ROOT/benchmarks/results"
mkdir -p "$RES"
run() { local name="$1"; shift; echo "== $name: $*" | tee "$RES/$name.txt"; "$@" 2>&1 | tee -a "$RES/$name.txt"; }
run campaign-philly  malletrain bench campaign --trace examples/philly-1day.csv.gz --seeds 5 \
    --modes random-full,asha,asha-promise,asha-oracle "$@"
run campaign-theta   malletrain bench campaign --trace "$DATA/traces/theta_2022.swf" --nodes 128 \
    --start 2022-03-01T00:00:00Z --end 2022-03-03T00:00:00Z --seeds 3 "$@"
# the same nodes over a week (6,304 idle node-hours against 235 in the two days), ten seeds: ~45 minutes
# (benchmarks/campaign.md's: seeds 0-2 of every mode, then --first-seed 3 --seeds 7 for random-full, asha and
# asha-promise: results/campaign-theta-week*.txt)
run campaign-theta-week malletrain bench campaign --trace "$DATA/traces/theta_2022.swf" --nodes 128 \
    --start 2022-03-01T00:00:00Z --end 2022-03-08T00:00:00Z --seeds 10 \
    --modes random-full,asha,asha-promise "$@"
# TPE instead of random search (stop 62, results/campaign-theta-week-tpe.txt, ~45 minutes; not run here):
#   malletrain bench campaign --trace "$DATA/traces/theta_2022.swf" --nodes 128 \
#       --start 2022-03-01T00:00:00Z --end 2022-03-08T00:00:00Z --seeds 10 --modes asha --sampler tpe
#   (and --seeds 3 --modes asha-promise --sampler tpe)
# Stop 66 (3cae1a5: the trials at a user's highest rung grow by their promise): asha-promise on seeds
# 0-19 of both, the asha-promise figures of benchmarks/campaign.md (~25 and ~35 minutes; random-full, asha and the
# speedup objective report no promise and keep their files above):
run campaign-philly-top malletrain bench campaign --trace examples/philly-1day.csv.gz --seeds 20 \
    --modes asha-promise "$@"
run campaign-theta-week-top malletrain bench campaign --trace "$DATA/traces/theta_2022.swf" --nodes 128 \
    --start 2022-03-01T00:00:00Z --end 2022-03-08T00:00:00Z --seeds 20 --modes asha-promise "$@"
# and the clairvoyant asha-oracle with it (results/campaign-oracle-top.txt, ~20 minutes as two runs of ten seeds):
#   malletrain bench campaign --trace examples/philly-1day.csv.gz --seeds 20 --modes asha-oracle
#   malletrain bench campaign --trace "$DATA/traces/theta_2022.swf" --nodes 128 \
#       --start 2022-03-01T00:00:00Z --end 2022-03-08T00:00:00Z --seeds 3 --modes asha-oracle
# A bound on any allocation of the ASHA modes (--bound: the idle node-hours, the order the study
# asks its cells in, each trial's start pause, a winner on at most max_nodes of the nodes idle at each
# moment and restarted after every moment none is), 20 seeds, with random-full for the ceiling of a
# gain over it, and the clairvoyant asha-first (stop 65: while a known winner is live, the other
# trials wait); the figures against asha and asha-promise take their means from the files
# above. ~40 minutes each (seed 4's asha-first asks ~16,500 trials on the Theta week).
run campaign-philly-bound malletrain bench campaign --trace examples/philly-1day.csv.gz --seeds 20 \
    --modes random-full,asha-first --bound "$@"
run campaign-theta-week-bound malletrain bench campaign --trace "$DATA/traces/theta_2022.swf" --nodes 128 \
    --start 2022-03-01T00:00:00Z --end 2022-03-08T00:00:00Z --seeds 20 --modes random-full,asha-first --bound "$@"
# The runs drawn (stop 63, --plot: each run's best trial against the hours, the idle node-hours
# beneath), seeds 0-2 of the three modes with the bound; ~8 minutes each:
run campaign-philly-plot malletrain bench campaign --trace examples/philly-1day.csv.gz --seeds 3 --bound \
    --plot "$RES/campaign-philly.png" "$@"
run campaign-theta-week-plot malletrain bench campaign --trace "$DATA/traces/theta_2022.swf" --nodes 128 \
    --start 2022-03-01T00:00:00Z --end 2022-03-08T00:00:00Z --seeds 3 --modes random-full,asha,asha-promise \
    --bound --plot "$RES/campaign-theta-week.png" "$@"
# Where the Theta week's ASHA runs lose their time (stop 64, --winners: each trial of a cell within the
# target, when it was asked, pruned at which rung or complete, and since stop 65 the soonest it could
# have completed alone on the idle nodes from its ask), seeds 0-2; ~5 minutes:
run campaign-theta-week-winners malletrain bench campaign --trace "$DATA/traces/theta_2022.swf" --nodes 128 \
    --start 2022-03-01T00:00:00Z --end 2022-03-08T00:00:00Z --seeds 3 --modes asha,asha-promise --winners "$@"
# the same for the clairvoyant asha-first (stop 65): which winners the pruner still drops; ~2 minutes:
run campaign-theta-week-first-winners malletrain bench campaign --trace "$DATA/traces/theta_2022.swf" \
    --nodes 128 --start 2022-03-01T00:00:00Z --end 2022-03-08T00:00:00Z --seeds 3 --modes asha-first --winners "$@"
# Stop 67: plain asha run again with today's code on seeds 0-19 of both (its files above came from
# stops 41-43, before stop 65's restart pauses; ~35 and ~40 minutes; the results were made as two runs of
# ten seeds side by side, --first-seed 0 --seeds 10 and --first-seed 10 --seeds 10, the same runs):
run campaign-philly-asha malletrain bench campaign --trace examples/philly-1day.csv.gz --seeds 20 --modes asha "$@"
run campaign-theta-week-asha malletrain bench campaign --trace "$DATA/traces/theta_2022.swf" --nodes 128 \
    --start 2022-03-01T00:00:00Z --end 2022-03-08T00:00:00Z --seeds 20 --modes asha "$@"
# and every 20-seed series of today's code in one summary (bench campaign-merge: nothing replayed;
# seed for seed, with a 95% bootstrap interval of each ratio over the seeds):
run campaign-philly-summary malletrain bench campaign-merge "$RES/campaign-philly-asha.txt" \
    "$RES/campaign-philly-top.txt" "$RES/campaign-philly-bound.txt"
run campaign-theta-week-summary malletrain bench campaign-merge "$RES/campaign-theta-week-asha.txt" \
    "$RES/campaign-theta-week-top.txt" "$RES/campaign-theta-week-bound.txt"
# Twenty more Theta seeds (20-39) of the three modes with the bound (stop 67; ~40 minutes as two runs of
# ten side by side), and the three modes on all 40 seeds in one summary:
run campaign-theta-week-seeds20-39 malletrain bench campaign --trace "$DATA/traces/theta_2022.swf" --nodes 128 \
    --start 2022-03-01T00:00:00Z --end 2022-03-08T00:00:00Z --first-seed 20 --seeds 20 \
    --modes random-full,asha,asha-promise --bound "$@"
run campaign-theta-week-summary-40 malletrain bench campaign-merge --modes random-full,asha,asha-promise \
    "$RES/campaign-theta-week-asha.txt" "$RES/campaign-theta-week-top.txt" "$RES/campaign-theta-week-bound.txt" \
    "$RES/campaign-theta-week-seeds20-39.txt"
# Ten more Philly seeds (20-29; stop 67, ~35 minutes) and the three modes on all 30 in one summary:
run campaign-philly-seeds20-29 malletrain bench campaign --trace examples/philly-1day.csv.gz --first-seed 20 \
    --seeds 10 --modes random-full,asha,asha-promise --bound "$@"
run campaign-philly-summary-30 malletrain bench campaign-merge --modes random-full,asha,asha-promise \
    "$RES/campaign-philly-asha.txt" "$RES/campaign-philly-top.txt" "$RES/campaign-philly-bound.txt" \
    "$RES/campaign-philly-seeds20-29.txt"
