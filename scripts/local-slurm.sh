#!/usr/bin/env bash
# A real multi-node Slurm cluster on this one machine (Debian 12, as root):
# munge, one slurmctld and N emulated slurmd nodes (slurmd -N nK), each with 4
# fake GPUs, a `batch` partition and a preemptible `scavenger` partition
# (partition-priority preemption, REQUEUE, GraceTime, whole-node allocation).
#
#   scripts/local-slurm.sh up [--nodes N] [--grace S] [--max-jobs N] [--dir DIR]   start (idempotent)
#   scripts/local-slurm.sh status [--dir DIR]                        show daemons and nodes
#   scripts/local-slurm.sh down [--dir DIR]                          stop everything it started
#   scripts/local-slurm.sh stop-ctld | start-ctld [--dir DIR]        outage drills (tests)
#
# `up` prints `SLURM_CONF=<path>`; point clients at it (export SLURM_CONF=...).
# Everything lives under DIR (default: .local-slurm/ in the repository, or
# $LOCAL_SLURM_DIR); `down` cancels the jobs, stops the daemons and leaves
# nothing running.  `up` with a different node count or grace time restarts
# the cluster from a clean state.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CMD="${1:-}"; shift || true
NODES=4; GRACE=10; MAXJOBS=10000; DIR="${LOCAL_SLURM_DIR:-$ROOT/.local-slurm}"
while [ $# -gt 0 ]; do
    case "$1" in
        --nodes) NODES="$2"; shift 2 ;;
        --grace) GRACE="$2"; shift 2 ;;
        --max-jobs) MAXJOBS="$2"; shift 2 ;;
        --dir) DIR="$2"; shift 2 ;;
        -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "local-slurm: unknown option $1 (valid: --nodes N, --grace S, --max-jobs N, --dir DIR)" >&2; exit 2 ;;
    esac
done
[[ "$NODES" =~ ^[1-9][0-9]*$ ]] || { echo "local-slurm: --nodes must be a positive integer" >&2; exit 2; }
[[ "$GRACE" =~ ^[0-9]+$ ]] || { echo "local-slurm: --grace must be whole seconds" >&2; exit 2; }
[[ "$MAXJOBS" =~ ^[1-9][0-9]{0,6}$ ]] || { echo "local-slurm: --max-jobs must be a positive integer (< 10^7)" >&2; exit 2; }
CONF="$DIR/etc/slurm.conf"
CTLD_PORT="${LOCAL_SLURM_PORT:-6817}"
NODE_PORT0=$((CTLD_PORT + 4))
log() { echo "[local-slurm] $*" >&2; }

install_packages() {
    if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null \
        || ! command -v sinfo >/dev/null || ! command -v munged >/dev/null; then
        log "installing slurmctld slurmd slurm-client munge with apt"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq slurmctld slurmd slurm-client munge >/dev/null
    fi
}

alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

start_munge() {
    if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then return; fi
    [ -f /etc/munge/munge.key ] || { log "creating /etc/munge/munge.key"; mungekey --create >/dev/null 2>&1 || \
        dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null; }
    mkdir -p /run/munge /var/log/munge /var/lib/munge
    munged --force 2>/dev/null
    touch "$DIR/started-munge"
    for _ in $(seq 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && return; sleep 0.1; done
    log "munge does not answer"; exit 1
}

write_config() {
    local host; host="$(hostname -s)"
    mkdir -p "$DIR/etc" "$DIR/state" "$DIR/spool" "$DIR/log" "$DIR/dev" "$DIR/run"
    for i in 0 1 2 3; do [ -c "$DIR/dev/gpu$i" ] || mknod "$DIR/dev/gpu$i" c 1 3; done
    cat > "$CONF" <<EOF
# Written by scripts/local-slurm.sh: $NODES emulated nodes on one host.
ClusterName=malletrain
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SlurmdParameters=config_overrides
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=5,sched_min_interval=200000
GresTypes=gpu
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
JobRequeue=1
ReturnToService=2
MpiDefault=none
KillWait=$((GRACE > 5 ? GRACE : 5))
MinJobAge=600
MaxJobCount=$MAXJOBS
SlurmctldTimeout=30
SlurmdTimeout=60
InactiveLimit=0
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
NodeName=n[1-$NODES] NodeAddr=127.0.0.1 Port=[$NODE_PORT0-$((NODE_PORT0 + NODES - 1))] CPUs=4 RealMemory=2000 Gres=gpu:4 State=UNKNOWN
PartitionName=batch     Nodes=n[1-$NODES] Default=YES PriorityTier=10 PreemptMode=OFF     OverSubscribe=EXCLUSIVE MaxTime=INFINITE State=UP
PartitionName=scavenger Nodes=n[1-$NODES] Default=NO  PriorityTier=1  PreemptMode=REQUEUE OverSubscribe=EXCLUSIVE MaxTime=INFINITE State=UP GraceTime=$GRACE
EOF
    cat > "$DIR/etc/gres.conf" <<EOF
NodeName=n[1-$NODES] Name=gpu File=$DIR/dev/gpu[0-3]
EOF
    cat > "$DIR/etc/cgroup.conf" <<EOF
CgroupPlugin=cgroup/v1
EOF
    echo "$NODES $GRACE $MAXJOBS" > "$DIR/shape"
}

ctld_up() { alive "$DIR/run/slurmctld.pid" && SLURM_CONF="$CONF" timeout 10 scontrol ping 2>/dev/null | grep -q UP; }

start_ctld() {
    alive "$DIR/run/slurmctld.pid" && return
    SLURM_CONF="$CONF" slurmctld -f "$CONF"
    for _ in $(seq 100); do ctld_up && return; sleep 0.2; done
    log "slurmctld did not come up; see $DIR/log/slurmctld.log"; tail -5 "$DIR/log/slurmctld.log" >&2; exit 1
}

stop_ctld() {
    if alive "$DIR/run/slurmctld.pid"; then
        kill "$(cat "$DIR/run/slurmctld.pid")" 2>/dev/null || true
        for _ in $(seq 100); do alive "$DIR/run/slurmctld.pid" || break; sleep 0.1; done
        alive "$DIR/run/slurmctld.pid" && kill -9 "$(cat "$DIR/run/slurmctld.pid")" 2>/dev/null || true
    fi
}

start_nodes() {
    local n="$1"
    for i in $(seq 1 "$n"); do
        alive "$DIR/run/slurmd-n$i.pid" && continue
        mkdir -p "$DIR/spool/n$i"
        SLURM_CONF="$CONF" slurmd -f "$CONF" -N "n$i"
    done
    for _ in $(seq 150); do
        local idle
        idle="$(SLURM_CONF="$CONF" sinfo -h -N -p batch -o '%N %T' 2>/dev/null | awk '$2=="idle"' | wc -l)"
        [ "$idle" -ge "$n" ] && return
        sleep 0.2
    done
    log "nodes did not all become idle:"; SLURM_CONF="$CONF" sinfo -N -p batch >&2 || true; exit 1
}

down() {
    if [ -f "$CONF" ] && ctld_up; then
        SLURM_CONF="$CONF" timeout 10 scancel --quiet --full --partition=batch,scavenger 2>/dev/null || true
        SLURM_CONF="$CONF" timeout 10 scancel --quiet --hold 2>/dev/null || true
        for _ in $(seq 50); do
            [ -z "$(SLURM_CONF="$CONF" squeue -h -t R,CG -o %i 2>/dev/null)" ] && break; sleep 0.2
        done
    fi
    for pid in "$DIR"/run/slurmd-*.pid; do
        [ -f "$pid" ] && alive "$pid" && kill "$(cat "$pid")" 2>/dev/null || true
    done
    stop_ctld
    sleep 0.3
    for pid in "$DIR"/run/slurmd-*.pid; do
        [ -f "$pid" ] && alive "$pid" && kill -9 "$(cat "$pid")" 2>/dev/null || true
        rm -f "$pid"
    done
    # job steps of an emulated node outlive its slurmd (proctrack/linuxproc)
    pkill -9 -f "slurmstepd: \[" 2>/dev/null || true
    # wait for everything started from this cluster's config to be gone
    for _ in $(seq 50); do pgrep -f "$CONF" >/dev/null 2>&1 || break; sleep 0.2; done
    pkill -9 -f "$CONF" 2>/dev/null || true
    if [ -f "$DIR/started-munge" ]; then
        pkill -x munged 2>/dev/null || true
        rm -f "$DIR/started-munge"
    fi
}

status() {
    if [ ! -f "$CONF" ]; then echo "local-slurm: not set up in $DIR"; return 1; fi
    echo "SLURM_CONF=$CONF"
    if ctld_up; then echo "slurmctld: up (pid $(cat "$DIR/run/slurmctld.pid"))"; else echo "slurmctld: down"; fi
    local n=0
    for pid in "$DIR"/run/slurmd-*.pid; do [ -f "$pid" ] && alive "$pid" && n=$((n + 1)); done
    echo "slurmd: $n running"
    ctld_up && SLURM_CONF="$CONF" sinfo -N -o '%N %P %T %G' || true
}

case "$CMD" in
    up)
        install_packages
        mkdir -p "$DIR"
        if [ -f "$DIR/shape" ] && [ "$(cat "$DIR/shape")" != "$NODES $GRACE $MAXJOBS" ]; then
            log "shape changed ($(cat "$DIR/shape") -> $NODES $GRACE $MAXJOBS): restarting from a clean state"
            down; rm -rf "$DIR/state" "$DIR/spool"
        fi
        if ! ctld_up; then
            down 2>/dev/null || true
            rm -rf "$DIR/state" "$DIR/spool"
            write_config
        fi
        start_munge
        start_ctld
        start_nodes "$NODES"
        log "up: $NODES nodes, GraceTime=${GRACE}s, logs in $DIR/log"
        echo "SLURM_CONF=$CONF"
        ;;
    down) down; log "down" ;;
    status) status ;;
    stop-ctld) stop_ctld ;;
    start-ctld) start_ctld ;;
    *) echo "usage: $0 up|down|status|stop-ctld|start-ctld [--nodes N] [--grace S] [--max-jobs N] [--dir DIR]" >&2; exit 2 ;;
esac
