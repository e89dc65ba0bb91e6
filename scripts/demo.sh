#!/usr/bin/env bash
# The main job on the embedded default (fresh Debian 12, as root; a few minutes):
#  1. installs malletrain (.venv) and Slurm, starts a local 4-node Slurm cluster
#     (scripts/local-slurm.sh --accounting: slurmctld + 4 slurmd, fake GPUs, batch +
#     scavenger, slurmdbd with the service account `malletrain` as an operator);
#  2. runs `malletrain daemon` as `malletrain` from a wheel in a venv of the system's
#     Python (as a centre deploys it) and waits for its first cycle;
#  3. submits 2 malleable jobs with `malletrain submit` (synthetic training jobs that
#     checkpoint on SIGTERM and write real progress records) and an Optuna campaign of
#     6 real PyTorch trials (examples/train/demo-optuna.yaml: TPE + ASHA over a CNN on
#     scikit-learn's digits, srun one process per node, consistency mode, each trial job
#     queueing the next), which the daemon starts, grows and shrinks on idle nodes;
#  4. replays 8 jobs of the ALCF Theta 2022 log, time-compressed, into `batch`;
#  5. prints a report (nodes harvested, primary-job waits, preemptions, rescales, a verdict),
#     `malletrain status` and `malletrain campaign status`; leaves the cluster down
#     (KEEP_CLUSTER=1 keeps it).
#
# The checkout may lie anywhere root can reach (/root/..., a 0700 directory, a path with
# spaces): what the operator account must read (its venv, the cluster's config, the daemon's
# config, state and the jobs' progress files) lives in a directory the demo creates under
# /var/tmp and removes at the end; nothing outside it and the checkout changes mode or owner.
# Outputs are copied to out/demo-slurm/ (or $OUT): report.txt, report.json, daemon.log,
# state/status.json, campaign/ (trials' checkpoints, results, progress files and output).
#
# The demo fails at once (exit 1, the tail of the daemon's log) if the daemon dies or never
# reports a cycle, and exits non-zero when nothing was harvested or a trial did not finish.
# However it ends (failure, Ctrl-C), it stops the daemon and the cluster it started.
#
#   bash scripts/demo.sh                 the demo
#   bash scripts/demo.sh --check-setup   only its set-up: cluster, operator install, the daemon's
#                                        first cycle; then everything is taken down (a test runs it)
# REPLAY=1 runs the earlier replay demo (a real Philly day, all policies) instead.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ "${REPLAY:-0}" = 1 ]; then exec bash "$ROOT/scripts/demo-replay.sh"; fi
CHECK_SETUP=0
case "${1:-}" in
    --check-setup) CHECK_SETUP=1 ;;
    "") ;;
    -h|--help) sed -n '2,33p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "demo: unknown argument $1 (valid: --check-setup, --help)" >&2; exit 2 ;;
esac
[ "$(id -u)" = 0 ] || { echo "demo: run it as root (it starts a Slurm cluster and a service account)" >&2; exit 2; }
FINAL="${OUT:-$ROOT/out/demo-slurm}"
say() { echo "[demo] $*"; }

# ---- the demo's own directory, and the one exit path that takes everything down
WORK="$(mktemp -d /var/tmp/malletrain-demo.XXXXXX)"
chmod 755 "$WORK"           # the operator account enters it; nothing secret lives at its top
OUT="$WORK/out"; CLUSTER_DIR="$WORK/slurm"; OPV="$WORK/operator"
mkdir -p "$OUT/metrics" "$OUT/state"
DAEMON=""; DRIVER=""; CLUSTER_UP=0
finish() {
    local rc=$?
    trap - EXIT INT TERM
    [ -n "$DRIVER" ] && kill "$DRIVER" 2>/dev/null || true
    if [ -n "$DAEMON" ] && kill -0 "$DAEMON" 2>/dev/null; then
        kill -TERM "$DAEMON" 2>/dev/null || true; wait "$DAEMON" 2>/dev/null || true
        say "daemon stopped (SIGTERM)"
    fi
    local keep=0
    if [ "$CLUSTER_UP" = 1 ]; then
        if [ "${KEEP_CLUSTER:-0}" = 1 ] && [ "$rc" = 0 ]; then
            keep=1; say "cluster kept (KEEP_CLUSTER=1): SLURM_CONF=$SLURM_CONF; take it down with" \
                "bash scripts/local-slurm.sh down --dir $CLUSTER_DIR, then rm -rf $WORK"
        else
            bash "$ROOT/scripts/local-slurm.sh" down --dir "$CLUSTER_DIR" >/dev/null 2>&1 \
                || say "WARNING: local-slurm.sh down --dir $CLUSTER_DIR failed"
            say "cluster down"
        fi
    fi
    if [ "$CHECK_SETUP" = 0 ] && [ -d "$OUT" ]; then
        rm -rf "$FINAL"; mkdir -p "$FINAL"
        cp -a "$OUT/." "$FINAL/" 2>/dev/null || say "WARNING: could not copy all outputs to $FINAL"
        say "outputs in $FINAL"
    fi
    [ "$keep" = 1 ] || rm -rf "$WORK"
    exit "$rc"
}
trap finish EXIT
trap 'say "interrupted"; exit 130' INT
trap 'say "terminated"; exit 143' TERM

fail() {
    say "FAILED: $*"
    if [ -s "$OUT/daemon.log" ]; then say "last lines of the daemon's log:"; tail -n 40 "$OUT/daemon.log" | sed 's/^/    /'; fi
    exit 1
}

# ---- 1. the cluster (its config and client wrappers must be readable by the operator account)
if [ "$CHECK_SETUP" = 0 ]; then source "$ROOT/scripts/env.sh" train,hpo; fi
CLUSTER_UP=1    # from here on, take it down whatever happens (down is a no-op on nothing)
UP="$(bash "$ROOT/scripts/local-slurm.sh" up --accounting --nodes 4 --grace 10 --dir "$CLUSTER_DIR")" \
    || fail "local-slurm.sh up failed (see above)"
SLURM_CONF="$(sed -n 's/^SLURM_CONF=//p' <<<"$UP")"; SLURM_BIN="$(sed -n 's/^SLURM_BIN=//p' <<<"$UP")"
export SLURM_CONF
export PATH="$SLURM_BIN:$PATH"
say "cluster up: $SLURM_CONF"

# ---- 2. the daemon, as a centre runs it: the unprivileged `malletrain` account (a Slurm
# operator, set up by --accounting), from a wheel in a venv of the system's Python, built from
# a copy of the checkout (no build/ left in or reused from it), never from the checkout itself.
mkdir -p "$OPV/src"
tar -C "$ROOT" --exclude=./.git --exclude=./.venv --exclude=./out --exclude='./.local-slurm*' --exclude=./build \
    --exclude=./runs -cf - . | tar -C "$OPV/src" -xf -
SYSPY=/usr/bin/python3
if ! "$SYSPY" -c 'import venv, ensurepip' >/dev/null 2>&1; then
    say "installing the system's python3-venv with apt"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null || fail "apt-get install python3-venv"
fi
"$SYSPY" -m venv "$OPV/venv" || fail "cannot create a venv with $SYSPY (apt-get install python3-venv)"
"$OPV/venv/bin/python" -m pip install -q "$OPV/src" >"$WORK/pip.log" 2>&1 \
    || { tail -n 20 "$WORK/pip.log"; fail "installing malletrain for the operator account"; }
rm -rf "$OPV/src"
cat > "$OUT/config.yaml" <<EOF
core:
  horizon_s: 300
  min_dwell_s: 6
slurm:
  slurm_conf: $SLURM_CONF
  bin_dir: $SLURM_BIN
daemon:
  interval_s: 3
  state_dir: $OUT/state
  metrics_port: 0
  vacate_lead_s: 30
  progress_roots: [$OUT]
EOF
"$OPV/venv/bin/malletrain" config check "$OUT/config.yaml" || fail "the daemon's configuration was rejected"
chown malletrain:malletrain "$OUT/state"
chmod -R o+rX "$OPV" "$OUT"
setpriv --reuid=malletrain --regid=malletrain --init-groups -- \
    "$OPV/venv/bin/malletrain" daemon --config "$OUT/config.yaml" > "$OUT/daemon.log" 2>&1 &
DAEMON=$!
say "daemon pid $DAEMON (user malletrain); waiting for its first cycle"
cycles() { "$OPV/venv/bin/python" - "$OUT/state/status.json" <<'PY' 2>/dev/null || echo 0
import json, sys
print(int(json.load(open(sys.argv[1]))["cycle"]))
PY
}
for _ in $(seq 120); do
    kill -0 "$DAEMON" 2>/dev/null || { wait "$DAEMON" || true; DAEMON=""; fail "the daemon exited before its first cycle"; }
    [ "$(cycles)" -ge 1 ] && break
    sleep 0.5
done
[ "$(cycles)" -ge 1 ] || fail "the daemon reported no cycle within 60 s"
say "daemon cycling (cycle $(cycles))"
if [ "$CHECK_SETUP" = 1 ]; then say "set-up ok"; exit 0; fi

# ---- 3. malleable work, submitted by this user (root here) into the harvest partition
cd "$ROOT"
export MALLETRAIN_METRICS_DIR="$OUT/metrics"
scancel --quiet -u "$(id -un)" 2>/dev/null || true
for spec in "resnet 0.05 1 4" "bert 0.25 1 4"; do
    set -- $spec
    malletrain submit --launch batch --name "$1" --min-nodes "$3" --max-nodes "$4" --rescale-up 3 --rescale-down 2 -- \
        "$ROOT/.venv/bin/python" -m devtools.synthjob --work 1e9 --rate 200 --alpha "$2" \
        --checkpoint "$OUT/$1.ckpt" --checkpoint-s 1 --report-s 0.5 >/dev/null
done
malletrain campaign submit examples/train/demo-optuna.yaml --dir "$OUT/campaign"
squeue
say "harvesting the idle cluster for 15 s before primary jobs arrive"
alive() { kill -0 "$DAEMON" 2>/dev/null || { wait "$DAEMON" || true; DAEMON=""; fail "the daemon died"; }; }
for _ in $(seq 15); do alive; sleep 1; done
malletrain status --state-dir "$OUT/state" || true

# ---- 4. primary jobs; the daemon is watched all along
python -m devtools.demo_live --stream examples/primary-jobs.csv --out "$OUT" --state-dir "$OUT/state" \
    --ctld-log "$CLUSTER_DIR/log/slurmctld.log" --max-s 200 > "$OUT/driver.log" 2>&1 &
DRIVER=$!
while kill -0 "$DRIVER" 2>/dev/null; do alive; sleep 2; done
DRIVER_RC=0; wait "$DRIVER" || DRIVER_RC=$?; DRIVER=""
grep -v '^\[demo\]' "$OUT/driver.log" || true

# ---- 5. what users see, and the verdict
echo; say "malletrain status:"; malletrain status --state-dir "$OUT/state" || true
echo; say "malletrain campaign status:"
malletrain campaign status examples/train/demo-optuna.yaml --dir "$OUT/campaign" | tee "$OUT/campaign-status.txt" || true
# "D done, P pruned, F failed of N; best so far: ..."
ENDED="$(sed -nE 's/^([0-9]+) done, ([0-9]+) pruned, ([0-9]+) failed of ([0-9]+);.*/\1 \2 \3 \4/p' "$OUT/campaign-status.txt" | tail -n 1)"
[ "$DRIVER_RC" = 0 ] || fail "the report's verdict: nothing harvested (or the driver failed: $OUT/driver.log)"
set -- ${ENDED:-0 0 0 6}
[ "$(( $1 + $2 ))" = "$4" ] && [ "$3" = 0 ] || fail "only $1 done and $2 pruned ($3 failed) of $4 trials within the demo"
say "report: $FINAL/report.txt"
