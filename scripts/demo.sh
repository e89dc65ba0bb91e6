#!/usr/bin/env bash
# The main job on the embedded default (fresh Debian 12, as root; a few minutes):
#  1. installs malletrain (.venv) and Slurm, starts a local 4-node Slurm cluster
#     (scripts/local-slurm.sh --accounting: slurmctld + 4 slurmd, fake GPUs, batch +
#     scavenger, slurmdbd with the service account `malletrain` as an operator);
#  2. submits 2 malleable jobs with `malletrain submit` (synthetic training jobs that
#     checkpoint on SIGTERM and write real progress records) and an HPO campaign of
#     6 real PyTorch trials (examples/train/hpo-digits.yaml: a CNN on scikit-learn's
#     digits, srun one process per node, consistency mode);
#  3. runs `malletrain daemon` as `malletrain` from a wheel in a venv of the system's
#     Python (as a centre deploys it), which starts, grows and shrinks them on idle nodes;
#  4. replays 8 jobs of the ALCF Theta 2022 log, time-compressed, into `batch`;
#  5. prints a report (nodes harvested, primary-job waits, preemptions, rescales)
#     `malletrain status` and `malletrain campaign status`; leaves the cluster down
#     (KEEP_CLUSTER=1 keeps it).
# Outputs in out/demo-slurm/: report.txt, report.json, daemon.log, state/status.json,
# campaign/ (trials' checkpoints, results, progress files and output).
# REPLAY=1 runs the earlier replay demo (a real Philly day, all policies) instead.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ "${REPLAY:-0}" = 1 ]; then exec bash "$ROOT/scripts/demo-replay.sh"; fi
source "$ROOT/scripts/env.sh" train
cd "$ROOT"
OUT="${OUT:-$ROOT/out/demo-slurm}"
rm -rf "$OUT"; mkdir -p "$OUT/metrics"
eval "$(bash scripts/local-slurm.sh up --accounting --nodes 4 --grace 10 | grep '^SLURM_CONF=' | sed 's/^/export /')"
echo "[demo] cluster up: $SLURM_CONF"
scancel --quiet -u "$(id -un)" 2>/dev/null || true

cat > "$OUT/config.yaml" <<EOF
core:
  horizon_s: 300
  min_dwell_s: 6
slurm:
  slurm_conf: $SLURM_CONF
daemon:
  interval_s: 3
  state_dir: $OUT/state
  metrics_port: 0
  vacate_lead_s: 30
  progress_roots: [$OUT]
EOF
malletrain config check "$OUT/config.yaml"

# The daemon runs as a centre runs it: the unprivileged `malletrain` account (a Slurm operator,
# set up by --accounting) from a wheel in a venv of the system's Python, never from this checkout.
OPV="$OUT/operator"
mkdir -p "$OPV/src"    # built from a copy: no build/ left in (or reused from) the checkout
tar -C "$ROOT" --exclude=./.git --exclude=./.venv --exclude=./out --exclude='./.local-slurm*' --exclude=./build \
    -cf - . | tar -C "$OPV/src" -xf -
python -m pip wheel -q --no-deps -w "$OPV/wheel" "$OPV/src" >/dev/null 2>&1
SYSPY=/usr/bin/python3; [ -x "$SYSPY" ] || SYSPY=python3
"$SYSPY" -m venv "$OPV/venv" && "$OPV/venv/bin/pip" install -q "$OPV"/wheel/malletrain-*.whl >/dev/null
mkdir -p "$OUT/state"; chown malletrain:malletrain "$OUT/state"
chmod -R o+rX "$OUT"

export MALLETRAIN_METRICS_DIR="$OUT/metrics"
for spec in "resnet 0.05 1 4" "bert 0.25 1 4"; do
    set -- $spec
    malletrain submit --launch batch --name "$1" --min-nodes "$3" --max-nodes "$4" --rescale-up 3 --rescale-down 2 -- \
        "$ROOT/.venv/bin/python" -m devtools.synthjob --work 1e9 --rate 200 --alpha "$2" \
        --checkpoint "$OUT/$1.ckpt" --checkpoint-s 1 --report-s 0.5 >/dev/null
done
malletrain campaign submit examples/train/hpo-digits.yaml --dir "$OUT/campaign"
squeue

setpriv --reuid=malletrain --regid=malletrain --init-groups -- \
    "$OPV/venv/bin/malletrain" daemon --config "$OUT/config.yaml" > "$OUT/daemon.log" 2>&1 &
DAEMON=$!
trap 'kill $DAEMON 2>/dev/null || true' EXIT
echo "[demo] daemon pid $DAEMON; harvesting the idle cluster for 15 s before primary jobs arrive"
sleep 15
malletrain status --state-dir "$OUT/state" || true

python -m devtools.demo_live --stream examples/primary-jobs.csv --out "$OUT" --state-dir "$OUT/state" \
    --ctld-log "$(dirname "$(dirname "$SLURM_CONF")")/log/slurmctld.log" --max-s 200 | tee "$OUT/driver.log" | grep -v '^\[demo\]' || true

echo; echo "[demo] malletrain status:"; malletrain status --state-dir "$OUT/state" || true
echo; echo "[demo] malletrain campaign status:"
malletrain campaign status examples/train/hpo-digits.yaml --dir "$OUT/campaign" | tee "$OUT/campaign-status.txt" || true
kill -TERM $DAEMON; wait $DAEMON || true
trap - EXIT
echo "[demo] daemon stopped (SIGTERM); its JSON log is $OUT/daemon.log"
scancel --quiet -u "$(id -un)" || true
if [ "${KEEP_CLUSTER:-0}" != 1 ]; then bash scripts/local-slurm.sh down; fi
echo "[demo] report: $OUT/report.txt"
