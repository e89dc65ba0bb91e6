#!/usr/bin/env bash
# Install malletrain as a systemd service on a login node (as root):
#   bash scripts/install-service.sh [--slurm-conf /etc/slurm/slurm.conf] [--wheel malletrain-*.whl]
# Creates the `malletrain` system account, a venv in /opt/malletrain with the wheel
# installed (built from this checkout unless --wheel names one), a default
# /etc/malletrain/config.yaml (kept if present) and the unit, then enables it.
# Slurm must know the account as an operator (needs slurmdbd):
#   sacctmgr -i add user malletrain account=root adminlevel=Operator
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SLURM_CONF_PATH="/etc/slurm/slurm.conf"
WHEEL=""
while [ $# -gt 0 ]; do
    case "$1" in
        --slurm-conf) SLURM_CONF_PATH="$2"; shift 2 ;;
        --wheel) WHEEL="$2"; shift 2 ;;
        *) echo "install-service.sh: unknown argument $1" >&2; exit 2 ;;
    esac
done
id malletrain >/dev/null 2>&1 || useradd --system --home-dir /var/lib/malletrain --shell /usr/sbin/nologin malletrain
mkdir -p /opt/malletrain /etc/malletrain
python3 -m venv /opt/malletrain/.venv
if [ -z "$WHEEL" ]; then
    BUILD="$(mktemp -d)"
    /opt/malletrain/.venv/bin/pip wheel -q --no-deps -w "$BUILD" "$ROOT"
    WHEEL="$(ls "$BUILD"/malletrain-*.whl)"
fi
/opt/malletrain/.venv/bin/pip install -q "$WHEEL"
install -m 0644 "$ROOT/README.md" /opt/malletrain/README.md
if [ ! -f /etc/malletrain/config.yaml ]; then
    cat > /etc/malletrain/config.yaml <<CFG
core:
  policy: malletrain
  horizon_s: 600
slurm:
  partition: scavenger
  slurm_conf: $SLURM_CONF_PATH
daemon:
  interval_s: 10
  state_dir: /var/lib/malletrain
  metrics_port: 9687
  vacate_lead_s: 60
CFG
fi
/opt/malletrain/.venv/bin/malletrain config check /etc/malletrain/config.yaml
install -m 0644 "$ROOT/scripts/malletrain.service" /etc/systemd/system/malletrain.service
systemctl daemon-reload
systemctl enable --now malletrain.service
systemctl status --no-pager malletrain.service || true
