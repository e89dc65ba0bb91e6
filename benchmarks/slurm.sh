#!/usr/bin/env bash
# Slurm commands per cycle and cycle latency of the daemon on the local cluster:
# starts it, submits 4 synthetic malleable jobs, runs 40 daemon cycles, prints the
# figures (stored in benchmarks/results/slurm-cycle.txt), cleans up.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/env.sh"
cd "$ROOT"
W="$(mktemp -d)"
eval "$(bash scripts/local-slurm.sh up --nodes 4 | grep '^SLURM_CONF=' | sed 's/^/export /')"
scancel --quiet -u "$(id -un)" || true
cat > "$W/config.yaml" <<CFG
core: {horizon_s: 300, min_dwell_s: 6}
slurm: {slurm_conf: $SLURM_CONF}
daemon: {interval_s: 2, state_dir: $W/state, metrics_port: 0, log_format: text}
CFG
for i in 1 2 3 4; do
    MALLETRAIN_METRICS_DIR="$W/m" malletrain submit --launch batch --name "b$i" --min-nodes 1 --max-nodes 4 \
        --rescale-up 2 --rescale-down 1 -- "$ROOT/.venv/bin/python" -m devtools.synthjob \
        --work 1e9 --rate 100 --alpha "0.$i" --checkpoint "$W/b$i.ckpt" --checkpoint-s 1 >/dev/null
done
malletrain bench slurm --config "$W/config.yaml" --cycles "${CYCLES:-40}" 2>/dev/null | tee benchmarks/results/slurm-cycle.txt
scancel --quiet -u "$(id -un)" || true
rm -rf "$W"
