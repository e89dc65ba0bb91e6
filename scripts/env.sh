#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment in .venv and install
# malletrain into it.  Works on a fresh Debian 12 machine as root: installs
# python3-venv/pip with apt when they are missing.  Usage: source scripts/env.sh [EXTRAS]
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
EXTRAS="${1:-}"
PY="${PYTHON:-python3}"
if ! command -v "$PY" >/dev/null 2>&1 || ! "$PY" -c 'import venv, ensurepip' >/dev/null 2>&1; then
    echo "[env] installing python3, venv and pip with apt" >&2
    apt-get update -qq && apt-get install -y -qq python3 python3-venv python3-pip >/dev/null
    PY=python3
fi
"$PY" - <<'PYCHECK'
import sys
if sys.version_info < (3, 11):
    sys.exit(f"malletrain needs Python >= 3.11, found {sys.version.split()[0]}")
PYCHECK
VENV="$ROOT/.venv"
if [ ! -x "$VENV/bin/python" ]; then
    echo "[env] creating $VENV" >&2
    "$PY" -m venv "$VENV"
fi
STAMP="$VENV/.installed${EXTRAS:+-$EXTRAS}"
if [ ! -f "$STAMP" ] || [ "$ROOT/pyproject.toml" -nt "$STAMP" ]; then
    echo "[env] installing malletrain${EXTRAS:+[$EXTRAS]} into $VENV" >&2
    "$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
    "$VENV/bin/python" -m pip install -q -e "$ROOT${EXTRAS:+[$EXTRAS]}"
    touch "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
