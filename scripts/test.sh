#!/usr/bin/env bash
# The test command.
#   bash scripts/test.sh          every tier (CI; root on Debian 12): lint and types, the fast
#                                 tier, PyTorch, the real-Slurm tests, the installed wheel
#   bash scripts/test.sh --fast   contributors: no root, no Slurm, no torch (two to six minutes)
# Extra arguments go to pytest (e.g. -k decide, -x).  Tests never write into tracked files.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
FAST=0
if [ "${1:-}" = "--fast" ]; then FAST=1; shift; fi
if [ "$FAST" = 1 ]; then source "$ROOT/scripts/env.sh" dev; else source "$ROOT/scripts/env.sh" test; fi
cd "$ROOT"
echo "[test] ruff" >&2
python -m ruff check --no-cache .
echo "[test] mypy" >&2
python -m devtools.typecheck
if [ "$FAST" = 1 ]; then
    exec python -m pytest -q -p no:cacheprovider -m "not live and not torch and not packaging" "$@"
fi
# Every tier's temporary files, the live tests' Slurm clusters included, go under a directory of
# this run's own: the live tests open it (and nothing above it) to the operator account and the
# test users (tests/live.py share()), since the checkout may sit where only root can enter; and a
# pytest started beside this one (a contributor's fast tier) would reset the shared
# /tmp/pytest-of-root to 0700 under them.
BASE="$(mktemp -d /tmp/malletrain-tests.XXXXXX)"
chmod 711 "$BASE"
trap 'rm -rf "$BASE"' EXIT
# --durations: the slowest tests, so that the run's ~45 minutes can be watched where they go
python -m pytest -q -p no:cacheprovider --durations=30 --basetemp "$BASE/t" "$@"
