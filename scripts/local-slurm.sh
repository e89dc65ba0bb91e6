#!/usr/bin/env bash
# A real multi-node Slurm cluster on this one machine (Debian 12, as root):
# munge, one slurmctld and N emulated slurmd nodes (slurmd -N nK), each with 4
# fake GPUs, a `batch` partition and a preemptible `scavenger` partition
# (partition-priority preemption, REQUEUE, GraceTime, whole-node allocation).
#
#   scripts/local-slurm.sh up [--slurm V] [--accounting] [--nodes N] [--grace S] [--max-jobs N] [--dir DIR]
#                             [--min-job-age S] [--preempt-mode requeue|cancel] [--enforce-limits]
#   scripts/local-slurm.sh add-user NAME [--dir DIR]                 (with --accounting)
#
# --min-job-age S: how long slurmctld keeps an ended job (MinJobAge, default 600; short values
# make it purge ended jobs soon, as some sites do).  --preempt-mode cancel: Slurm cancels a
# preempted scavenger job (it ends PREEMPTED) instead of requeueing it (default requeue).
# --enforce-limits (with --accounting): AccountingStorageEnforce=associations,limits,qos, so
# association and QOS limits set with sacctmgr hold (default: associations only).
#
# --rest PORT adds JWT authentication (AuthAltTypes=auth/jwt, a key in DIR/etc) and
# runs slurmrestd as `nobody` on 127.0.0.1:PORT; `scontrol token` gives a token.
#
# --cloud-nodes M adds M nodes c[1-M] without slurmd, declared State=CLOUD: Slurm
# keeps them powered down (idle~) and lists them (PrivateData=cloud) in both
# partitions; for benchmarks of a centre-sized partition (they never run a job).
#   scripts/local-slurm.sh status [--dir DIR]                        show daemons and nodes
#   scripts/local-slurm.sh down [--dir DIR]                          stop everything it started
#   scripts/local-slurm.sh stop-ctld | start-ctld [--dir DIR]        outage drills (tests)
#
# --accounting adds slurmdbd and a private MariaDB (Debian packages), enforces
# associations and makes the service account `malletrain` (created if missing) a
# Slurm operator (AdminLevel=Operator), as centres deploy the daemon; `add-user
# NAME` gives one more user an association.
#
# --slurm host (default) runs the host's Slurm packages (Debian 12: 22.05);
# --slurm 22.05|24.11|26.05 runs that release: the host's if it matches, else
# from a minimal Debian root (bookworm|trixie|sid) built once with debootstrap
# and cached in $MALLETRAIN_SLURM_ROOTS (default /var/cache/malletrain/roots).
# Its daemons run chrooted in a private mount namespace (nothing to unmount);
# its clients run on the host through wrappers in DIR/bin that use the root's
# own loader and libraries, so any user (the daemon's operator account too)
# can run them.
#
# `up` prints `SLURM_CONF=<path>` and `SLURM_BIN=<dir>`: point clients at both
# (export SLURM_CONF=...; PATH=<dir>:$PATH).  Everything lives under DIR
# (default: .local-slurm/ in the repository, or $LOCAL_SLURM_DIR; other accounts, the
# daemon's among them, read its config and clients: where the checkout's parents are private,
# use a --dir they can reach, as scripts/demo.sh does); `down`
# cancels the jobs, stops the daemons and leaves nothing running.  `up` with
# a different version, node count or grace time restarts the cluster from a
# clean state.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CMD="${1:-}"; shift || true
case "$CMD" in -h|--help) set -- --help ;; esac
NODES=4; GRACE=10; MAXJOBS=10000; MINJOBAGE=600; PREEMPT=requeue; LIMITS=0; DIR="${LOCAL_SLURM_DIR:-$ROOT/.local-slurm}"; SLURM=host; ACCT=0; CLOUD=0; REST=0
ARGS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --slurm) SLURM="$2"; shift 2 ;;
        --accounting) ACCT=1; shift ;;
        --nodes) NODES="$2"; shift 2 ;;
        --grace) GRACE="$2"; shift 2 ;;
        --max-jobs) MAXJOBS="$2"; shift 2 ;;
        --min-job-age) MINJOBAGE="$2"; shift 2 ;;
        --preempt-mode) PREEMPT="$2"; shift 2 ;;
        --enforce-limits) LIMITS=1; shift ;;
        --cloud-nodes) CLOUD="$2"; shift 2 ;;
        --rest) REST="$2"; shift 2 ;;
        --dir) DIR="$2"; shift 2 ;;
        -h|--help) sed -n '2,48p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) echo "local-slurm: unknown option $1 (valid: --slurm V, --accounting, --nodes N, --grace S, --max-jobs N, --min-job-age S, --preempt-mode M, --enforce-limits, --dir DIR, --cloud-nodes M, --rest PORT)" >&2; exit 2 ;;
        *) ARGS+=("$1"); shift ;;
    esac
done
[[ "$NODES" =~ ^[1-9][0-9]*$ ]] || { echo "local-slurm: --nodes must be a positive integer" >&2; exit 2; }
[[ "$GRACE" =~ ^[0-9]+$ ]] || { echo "local-slurm: --grace must be whole seconds" >&2; exit 2; }
[[ "$REST" =~ ^[0-9]{1,5}$ ]] || { echo "local-slurm: --rest must be a TCP port (0 = no slurmrestd)" >&2; exit 2; }
[[ "$CLOUD" =~ ^[0-9]{1,5}$ ]] || { echo "local-slurm: --cloud-nodes must be an integer below 100000" >&2; exit 2; }
[[ "$MINJOBAGE" =~ ^[0-9]{1,6}$ ]] && [ "$MINJOBAGE" -ge 2 ] || { echo "local-slurm: --min-job-age must be whole seconds, 2 to 999999" >&2; exit 2; }
case "$PREEMPT" in requeue|cancel) ;; *) echo "local-slurm: --preempt-mode must be requeue or cancel" >&2; exit 2 ;; esac
[[ "$MAXJOBS" =~ ^[1-9][0-9]{0,6}$ ]] || { echo "local-slurm: --max-jobs must be a positive integer (< 10^7)" >&2; exit 2; }
case "$SLURM" in
    host|22.05|24.11|26.05) ;;
    *) echo "local-slurm: --slurm must be host, 22.05, 24.11 or 26.05" >&2; exit 2 ;;
esac
CONF="$DIR/etc/slurm.conf"
BIN="$DIR/bin"
ROOTS="${MALLETRAIN_SLURM_ROOTS:-/var/cache/malletrain/roots}"
RFS=""       # the Debian root whose Slurm runs this cluster; "" = the host's packages
CTLD_PORT="${LOCAL_SLURM_PORT:-6817}"
NODE_PORT0=$((CTLD_PORT + 4))
DBD_PORT=$((CTLD_PORT + 1)); DB_PORT=$((CTLD_PORT + 2))
OPERATOR="${MALLETRAIN_OPERATOR:-malletrain}"
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

major_minor() { sed -E 's/^([0-9]+\.[0-9]+).*/\1/'; }
host_version() { dpkg-query -W -f '${Version}' slurmctld 2>/dev/null | major_minor; }
suite_of() { case "$1" in 22.05) echo bookworm ;; 24.11) echo trixie ;; 26.05) echo sid ;; esac; }

# A minimal Debian root holding one Slurm release, built once and cached.  Host
# paths that name the root must resolve inside it too (PluginDir in slurm.conf,
# the client wrappers a job's script may call): a link $RFS -> / inside the root.
build_root() {
    local suite="$1" tmp="$RFS.tmp"
    command -v debootstrap >/dev/null || {
        log "installing debootstrap with apt"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null; }
    rm -rf "$tmp"; mkdir -p "$ROOTS"
    log "building a Debian $suite root for Slurm $SLURM in $RFS (once, about a minute)"
    if ! debootstrap --variant=minbase --include=slurmctld,slurmd,slurm-client,slurmdbd,slurmrestd,slurm-wlm-jwt-plugin,munge,python3 \
            "$suite" "$tmp" "${MALLETRAIN_DEBIAN_MIRROR:-http://deb.debian.org/debian}" >"$ROOTS/$suite.log" 2>&1; then
        log "debootstrap $suite failed; see $ROOTS/$suite.log"; tail -5 "$ROOTS/$suite.log" >&2; rm -rf "$tmp"; exit 1
    fi
    mkdir -p "$tmp$(dirname "$RFS")"; ln -s / "$tmp$RFS"
    mv "$tmp" "$RFS"
}

# Where this cluster's Slurm comes from: the host's packages, or a cached root (sets RFS).
resolve_slurm() {
    [ "$SLURM" = host ] && return
    [ "$(host_version)" = "$SLURM" ] && return
    local suite have; suite="$(suite_of "$SLURM")"
    RFS="$ROOTS/$suite"
    { [ -x "$RFS/usr/sbin/slurmctld" ] && [ -L "$RFS$RFS" ]; } || build_root "$suite"
    have="$(chroot "$RFS" dpkg-query -W -f '${Version}' slurmctld | major_minor)"
    if [ "$have" != "$SLURM" ]; then
        log "$RFS holds Slurm $have, not $SLURM (Debian $suite moved on); remove it to rebuild"; exit 1
    fi
    # the root's daemons look users and hosts up in its own /etc
    cp /etc/passwd /etc/group /etc/hosts "$RFS/etc/"
}

# The Python the project's venv is made from, for jobs run in a root: its install prefix
# (pyenv, /opt, ...), or, for Debian's own python3.X, its binary and standard library
# (never the host's whole /usr over the root's).  The root's newer libc and libraries run it.
# Printed as SOURCE=TARGET (TARGET: where the root shows it; a path alone is shown at its own).
venv_python_paths() {
    local cfg="$ROOT/.venv/pyvenv.cfg" home version link real
    [ -f "$cfg" ] || return 0
    home="$(sed -n 's/^home *= *//p' "$cfg")"; version="$(sed -n 's/^version *= *//p' "$cfg" | cut -d. -f1,2)"
    case "$home" in
        ""|/bin|/usr/bin|/usr/local/bin)
            # the venv's python3 names the system's (/usr/bin/python3, which in a root is the
            # root's own python3.Y): show the host's interpreter there, and its standard library
            link="$(readlink "$ROOT/.venv/bin/python3" 2>/dev/null || true)"
            real="$(readlink -f "$ROOT/.venv/bin/python3" 2>/dev/null || true)"
            [ -n "$version" ] && [ -x "$real" ] || return 0
            case "$link" in /*) echo "$real=$link" ;; *) echo "$real" ;; esac
            for p in "/usr/lib/python$version" "/usr/local/lib/python$version"; do
                [ -d "$p" ] && echo "$p"
            done ;;
        */bin) [ -d "${home%/bin}" ] && echo "${home%/bin}" ;;
    esac
    return 0
}

# Run a Slurm daemon: the host's, or chrooted in the root inside a private mount
# namespace that shows the host's /tmp, /home, the repository, DIR and the venv's
# Python at their own paths (jobs' files, the config, jobs that run the project's
# Python) and the host's munge socket.  The mounts live as long as the daemons do:
# there is nothing to unmount.
run_daemon() {
    if [ -z "$RFS" ]; then SLURM_CONF="$CONF" "$@"; return; fi
    local binds=(/tmp /home "$ROOT" "$DIR")
    mapfile -t -O 4 binds < <(venv_python_paths)
    unshare --mount --propagation private -- bash -c '
        set -e; R="$1"; shift
        mount -t proc proc "$R/proc"; mount --rbind /dev "$R/dev"; mount --rbind /sys "$R/sys"
        mkdir -p "$R/run/munge"; mount --bind /run/munge "$R/run/munge"
        while [ "$1" != -- ]; do
            src="${1%%=*}"; dst="${1#*=}"
            if [ -d "$src" ]; then mkdir -p "$R$dst"
            elif [ ! -e "$R$dst" ]; then mkdir -p "$(dirname "$R$dst")"; touch "$R$dst"; fi
            mount --rbind "$src" "$R$dst"; shift
        done; shift
        exec chroot "$R" "$@"' _ "$RFS" "${binds[@]}" -- \
        env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin SLURM_CONF="$CONF" ${SLURM_JWT:+SLURM_JWT=$SLURM_JWT} "$@"
}

# DIR/bin: this cluster's client commands, for this script, the tests and any user.
# For a root's Slurm each is a two-line wrapper that runs the root's binary with
# the root's loader and libraries (no chroot: unprivileged users can run it).
write_bin() {
    rm -rf "$BIN"; mkdir -p "$BIN"
    local libs="$RFS/usr/lib/x86_64-linux-gnu/slurm-wlm:$RFS/usr/lib/x86_64-linux-gnu" c p
    for c in sbatch scancel scontrol sinfo squeue sacct sacctmgr sdiag srun salloc sprio sshare; do
        if [ -z "$RFS" ]; then
            p="$(command -v "$c" 2>/dev/null)" && ln -s "$p" "$BIN/$c"
            continue
        fi
        [ -x "$RFS/usr/bin/$c" ] || continue
        {
            echo "#!/bin/sh"
            echo "# Slurm $SLURM's $c from $RFS, run with that root's loader and libraries."
            echo "exec $RFS/lib64/ld-linux-x86-64.so.2 --argv0 $c --library-path $libs $RFS/usr/bin/$c \"\$@\""
        } > "$BIN/$c"
        chmod 755 "$BIN/$c"
    done
    chmod 755 "$DIR" "$BIN"
}

sl() { local c="$1"; shift; SLURM_CONF="$CONF" "$BIN/$c" "$@"; }

# The release a running cluster was started with (every command but `up` acts on that one).
known_slurm() {
    local v; v="$(awk '{print $4}' "$DIR/shape" 2>/dev/null || true)"
    SLURM="${v:-host}"
    if [ "$SLURM" != host ] && [ "$(host_version)" != "$SLURM" ]; then RFS="$ROOTS/$(suite_of "$SLURM")"; fi
}

# This cluster's slurmd and slurmstepd processes: they work in DIR/log (seen through the
# root's path when chrooted).  A process tree, children first.
cluster_daemons() {
    local p cwd
    for p in $(pgrep -f 'slurmd|slurmstepd' || true); do
        cwd="$(readlink "/proc/$p/cwd" 2>/dev/null)" || continue
        case "$cwd" in *"$DIR/log") echo "$p" ;; esac
    done
}
tree() { local c; for c in $(pgrep -P "$1" || true); do tree "$c"; done; echo "$1"; }

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
    local CLOUD_LIST=""; [ "$CLOUD" -gt 0 ] && CLOUD_LIST=",c[1-$CLOUD]"
    local host; host="$(hostname -s)"
    mkdir -p "$DIR/etc" "$DIR/state" "$DIR/spool" "$DIR/log" "$DIR/dev" "$DIR/run"
    for i in 0 1 2 3; do [ -c "$DIR/dev/gpu$i" ] || mknod "$DIR/dev/gpu$i" c 1 3; done
    cat > "$CONF" <<EOF
# Written by scripts/local-slurm.sh: $NODES emulated nodes on one host, Slurm $SLURM${RFS:+ from $RFS}.
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
MinJobAge=$MINJOBAGE
MaxJobCount=$MAXJOBS
SlurmctldTimeout=30
SlurmdTimeout=60
InactiveLimit=0
JobCompType=jobcomp/none
NodeName=n[1-$NODES] NodeAddr=127.0.0.1 Port=[$NODE_PORT0-$((NODE_PORT0 + NODES - 1))] CPUs=4 RealMemory=2000 Gres=gpu:4 State=UNKNOWN
$( [ "$CLOUD" -gt 0 ] && echo "NodeName=c[1-$CLOUD] CPUs=4 RealMemory=2000 Gres=gpu:4 State=CLOUD" )
$( [ "$CLOUD" -gt 0 ] && echo "PrivateData=cloud" )
PartitionName=batch     Nodes=n[1-$NODES]${CLOUD_LIST} Default=YES PriorityTier=10 PreemptMode=OFF     OverSubscribe=EXCLUSIVE MaxTime=INFINITE State=UP
PartitionName=scavenger Nodes=n[1-$NODES]${CLOUD_LIST} Default=NO  PriorityTier=1  PreemptMode=${PREEMPT^^} OverSubscribe=EXCLUSIVE MaxTime=INFINITE State=UP GraceTime=$GRACE
EOF
    cat > "$DIR/etc/gres.conf" <<EOF
NodeName=n[1-$NODES] Name=gpu File=$DIR/dev/gpu[0-3]
EOF
    if [ "$ACCT" = 1 ]; then
        cat >> "$CONF" <<EOF
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$DBD_PORT
AccountingStorageEnforce=associations$( [ "$LIMITS" = 1 ] && echo ",limits,qos" )
EOF
        write_dbd_config
    else
        echo "AccountingStorageType=accounting_storage/none" >> "$CONF"
    fi
    if [ "$REST" -gt 0 ]; then
        [ -f "$DIR/etc/jwt.key" ] || { dd if=/dev/urandom of="$DIR/etc/jwt.key" bs=32 count=1 2>/dev/null; }
        chmod 600 "$DIR/etc/jwt.key"
        printf 'AuthAltTypes=auth/jwt\nAuthAltParameters=jwt_key=%s\n' "$DIR/etc/jwt.key" >> "$CONF"
    fi
    if [ -n "$RFS" ]; then
        echo "PluginDir=$RFS/usr/lib/x86_64-linux-gnu/slurm-wlm" >> "$CONF"
        echo "CgroupPlugin=disabled" > "$DIR/etc/cgroup.conf"
    else
        echo "CgroupPlugin=cgroup/v1" > "$DIR/etc/cgroup.conf"
    fi
    echo "$SHAPE" > "$DIR/shape"
}

# ---- accounting: a private MariaDB, slurmdbd, associations, the operator account
# Install Debian packages where this cluster's Slurm lives: the root, or the host.
slurm_apt() {
    log "installing $*${RFS:+ in $RFS}"
    local apt=(env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@")
    if [ -n "$RFS" ]; then chroot "$RFS" "${apt[@]}" >/dev/null; else "${apt[@]}" >/dev/null; fi
}

install_accounting() {
    command -v mariadbd >/dev/null || { log "installing mariadb-server with apt"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq mariadb-server >/dev/null; }
    [ -x "${RFS:-}/usr/sbin/slurmdbd" ] || slurm_apt slurmdbd
    id "$OPERATOR" >/dev/null 2>&1 || useradd --system --home-dir /var/lib/malletrain --shell /usr/sbin/nologin "$OPERATOR"
}

write_dbd_config() {
    [ -f "$DIR/etc/db-password" ] || { head -c 18 /dev/urandom | base64 | tr -d '/+=' > "$DIR/etc/db-password"; }
    chmod 600 "$DIR/etc/db-password"
    ( umask 077; cat > "$DIR/etc/slurmdbd.conf" <<EOF
# Written by scripts/local-slurm.sh (mode 600: it holds the database password).
AuthType=auth/munge
DbdHost=$(hostname -s)
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
PidFile=$DIR/run/slurmdbd.pid
LogFile=$DIR/log/slurmdbd.log
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$DB_PORT
StorageUser=slurm
StoragePass=$(cat "$DIR/etc/db-password")
StorageLoc=slurm_acct_db
${RFS:+PluginDir=$RFS/usr/lib/x86_64-linux-gnu/slurm-wlm}
EOF
    )
}

db() { mariadb --no-defaults -S "$DIR/run/mysql.sock" -u root "$@"; }

start_db() {
    alive "$DIR/run/mariadb.pid" && return
    mkdir -p "$DIR/mysql" "$DIR/log" "$DIR/run"
    if [ ! -d "$DIR/mysql/mysql" ]; then
        mariadb-install-db --no-defaults --datadir="$DIR/mysql" --user=root \
            --auth-root-authentication-method=socket --skip-test-db >"$DIR/log/mariadb-install.log" 2>&1 \
            || { log "mariadb-install-db failed; see $DIR/log/mariadb-install.log"; exit 1; }
    fi
    setsid mariadbd --no-defaults --datadir="$DIR/mysql" --socket="$DIR/run/mysql.sock" --port="$DB_PORT" \
        --bind-address=127.0.0.1 --user=root --pid-file="$DIR/run/mariadb.pid" \
        --log-error="$DIR/log/mariadb.log" --skip-name-resolve </dev/null >/dev/null 2>&1 &
    for _ in $(seq 100); do db -e 'SELECT 1' >/dev/null 2>&1 && break; sleep 0.2; done
    db -e 'SELECT 1' >/dev/null 2>&1 || { log "MariaDB did not come up; see $DIR/log/mariadb.log"; exit 1; }
    db -e "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$(cat "$DIR/etc/db-password")';
           GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1'; FLUSH PRIVILEGES;"
}

start_dbd() {
    alive "$DIR/run/slurmdbd.pid" || run_daemon slurmdbd
    for _ in $(seq 100); do sl sacctmgr -n show cluster >/dev/null 2>&1 && return; sleep 0.2; done
    log "slurmdbd did not come up; see $DIR/log/slurmdbd.log"; tail -5 "$DIR/log/slurmdbd.log" >&2; exit 1
}

# The cluster, one account, root and every login user (uid 1000-59999) with an
# association, and the service account as an operator.
associations() {
    sl sacctmgr -i -n show cluster format=cluster | grep -qw malletrain || sl sacctmgr -i add cluster malletrain >/dev/null
    sl sacctmgr -i -n show account format=account | grep -qw research \
        || sl sacctmgr -i add account research Description=local Organization=local >/dev/null
    local u
    for u in root $(awk -F: '$3 >= 1000 && $3 < 60000 {print $1}' /etc/passwd); do add_user "$u"; done
    add_user "$OPERATOR"
    sl sacctmgr -i modify user "$OPERATOR" set AdminLevel=Operator >/dev/null 2>&1 || true
}

add_user() {
    sl sacctmgr -i -n show assoc user="$1" format=user | grep -qw "$1" \
        || sl sacctmgr -i add user "$1" Account=research >/dev/null
}

# Stop the daemon a pid file names (read once: daemons remove their pid file as they exit).
stop_pidfile() {
    local pid
    pid="$(cat "$1" 2>/dev/null)" || return 0
    kill "$pid" 2>/dev/null || return 0
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
}

start_restd() {
    alive "$DIR/run/slurmrestd.pid" && return
    local plugins="${RFS:-}/usr/lib/x86_64-linux-gnu/slurm-wlm"
    if [ ! -x "${RFS:-}/usr/sbin/slurmrestd" ] || [ ! -f "$plugins/auth_jwt.so" ]; then
        slurm_apt slurmrestd slurm-wlm-jwt-plugin
    fi
    # slurmrestd runs in the foreground and refuses root: as nobody, detached, its pid kept
    SLURM_JWT=daemon run_daemon slurmrestd -u nobody -g nogroup -a rest_auth/jwt -s openapi/slurmctld \
        "127.0.0.1:$REST" </dev/null >>"$DIR/log/slurmrestd.log" 2>&1 &
    disown
    for _ in $(seq 50); do
        if (exec 3<>"/dev/tcp/127.0.0.1/$REST") 2>/dev/null; then
            pgrep -f "^slurmrestd .* 127.0.0.1:$REST\$" | head -1 > "$DIR/run/slurmrestd.pid"
            return
        fi
        sleep 0.2
    done
    log "slurmrestd did not come up; see $DIR/log/slurmrestd.log"; exit 1
}

ctld_up() { alive "$DIR/run/slurmctld.pid" && [ -x "$BIN/scontrol" ] && SLURM_CONF="$CONF" timeout 10 "$BIN/scontrol" ping 2>/dev/null | grep -q UP; }

start_ctld() {
    alive "$DIR/run/slurmctld.pid" && return
    run_daemon slurmctld -f "$CONF"
    for _ in $(seq 100); do ctld_up && return; sleep 0.2; done
    log "slurmctld did not come up; see $DIR/log/slurmctld.log"; tail -5 "$DIR/log/slurmctld.log" >&2; exit 1
}

stop_ctld() { stop_pidfile "$DIR/run/slurmctld.pid"; }

start_nodes() {
    local n="$1"
    for i in $(seq 1 "$n"); do
        alive "$DIR/run/slurmd-n$i.pid" && continue
        mkdir -p "$DIR/spool/n$i"
        run_daemon slurmd -f "$CONF" -N "n$i"
    done
    for _ in $(seq 150); do
        local idle
        idle="$(sl sinfo -h -N -p batch -o '%N %T' 2>/dev/null | awk '$2=="idle"' | wc -l)"
        [ "$idle" -ge "$n" ] && return
        sleep 0.2
    done
    log "nodes did not all become idle:"; sl sinfo -N -p batch >&2 || true; exit 1
}

down() {
    if [ -f "$CONF" ] && ctld_up; then
        SLURM_CONF="$CONF" timeout 10 "$BIN/scancel" --quiet --full --partition=batch,scavenger 2>/dev/null || true
        SLURM_CONF="$CONF" timeout 10 "$BIN/scancel" --quiet --hold 2>/dev/null || true
        for _ in $(seq 50); do
            [ -z "$(sl squeue -h -t R,CG -o %i 2>/dev/null)" ] && break; sleep 0.2
        done
    fi
    for pid in "$DIR"/run/slurmd-*.pid; do
        [ -f "$pid" ] && alive "$pid" && kill "$(cat "$pid")" 2>/dev/null || true
    done
    stop_ctld
    stop_pidfile "$DIR/run/slurmrestd.pid"
    stop_pidfile "$DIR/run/slurmdbd.pid"
    stop_pidfile "$DIR/run/mariadb.pid"
    sleep 0.3
    for pid in "$DIR"/run/slurmd-*.pid; do
        [ -f "$pid" ] && alive "$pid" && kill -9 "$(cat "$pid")" 2>/dev/null || true
        rm -f "$pid"
    done
    # job steps of an emulated node outlive its slurmd (proctrack/linuxproc): kill this
    # cluster's steps with everything they started, and any job script left orphaned
    local p
    for p in $(cluster_daemons) $(pgrep -f "$DIR/spool/" || true); do
        kill -9 $(tree "$p") 2>/dev/null || true
    done
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
    echo "SLURM_BIN=$BIN"
    head -1 "$CONF" | sed 's/^# Written by scripts.local-slurm.sh: //'
    if ctld_up; then echo "slurmctld: up (pid $(cat "$DIR/run/slurmctld.pid"))"; else echo "slurmctld: down"; fi
    local n=0
    for pid in "$DIR"/run/slurmd-*.pid; do [ -f "$pid" ] && alive "$pid" && n=$((n + 1)); done
    echo "slurmd: $n running"
    ctld_up && sl sinfo -N -o '%N %P %T %G' || true
}

case "$CMD" in
    up)
        install_packages
        [ "$ACCT" = 1 ] && install_accounting      # before resolve_slurm copies /etc/passwd
        resolve_slurm
        mkdir -p "$DIR"
        SHAPE="$NODES $GRACE $MAXJOBS $SLURM $ACCT $CLOUD $REST $MINJOBAGE $PREEMPT $LIMITS"
        if [ -f "$DIR/shape" ] && [ "$(cat "$DIR/shape")" != "$SHAPE" ]; then
            log "shape changed ($(cat "$DIR/shape") -> $SHAPE): restarting from a clean state"
            down; rm -rf "$DIR/state" "$DIR/spool"
        fi
        if ! ctld_up; then
            down 2>/dev/null || true
            rm -rf "$DIR/state" "$DIR/spool" "$DIR/mysql"
            mkdir -p "$DIR/etc"
            write_config
            write_bin
        fi
        start_munge
        if [ "$ACCT" = 1 ]; then start_db; start_dbd; associations; fi
        start_ctld
        start_nodes "$NODES"
        [ "$REST" -gt 0 ] && start_restd
        log "up: Slurm $(sl sinfo --version | awk '{print $2}'), $NODES nodes, GraceTime=${GRACE}s, logs in $DIR/log"
        echo "SLURM_CONF=$CONF"
        echo "SLURM_BIN=$BIN"
        ;;
    down) known_slurm; down; log "down" ;;
    status) known_slurm; status ;;
    add-user)
        known_slurm
        [ "${#ARGS[@]}" = 1 ] || { echo "usage: $0 add-user NAME [--dir DIR]" >&2; exit 2; }
        [ "$(awk '{print $5}' "$DIR/shape" 2>/dev/null)" = 1 ] || { log "add-user: this cluster runs without --accounting"; exit 2; }
        [ -z "$RFS" ] || cp /etc/passwd /etc/group "$RFS/etc/"
        add_user "${ARGS[0]}" ;;
    stop-ctld) known_slurm; stop_ctld ;;
    start-ctld) known_slurm; start_ctld ;;
    *) echo "usage: $0 up|down|status|add-user NAME|stop-ctld|start-ctld [--slurm V] [--accounting] [--nodes N] [--grace S] [--max-jobs N] [--dir DIR]" >&2; exit 2 ;;
esac
