#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment in .venv and install
# malletrain into it.  Works on a fresh Debian 12 machine as root: installs
# python3-venv/pip with apt when they are missing.  Usage: source scripts/env.sh [EXTRAS]
#
# Sourced into the caller's shell (an interactive one too): the work runs in a subshell under
# `set -euo pipefail`, and only PATH (the venv's bin/ first) changes in the caller, whose own
# shell options are left as they were.  A failure returns non-zero and changes nothing.
_malletrain_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
_malletrain_env() (
    set -euo pipefail
    ROOT="$_malletrain_root"
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
)
# Called plainly, not as a condition: bash ignores `set -e` inside a function tested by if/&&/||.
# A caller under `set -e` (test.sh, demo.sh) stops here on failure, as it should.
_malletrain_env "$@"
_malletrain_rc=$?
unset -f _malletrain_env
if [ "$_malletrain_rc" -eq 0 ]; then
    PATH="$_malletrain_root/.venv/bin:$PATH"
    export PATH
    unset _malletrain_rc _malletrain_root
else
    unset _malletrain_rc _malletrain_root
    echo "[env] setting up the environment failed (see above)" >&2
    # sourced: hand the failure back to the caller; run as a script: exit with it
    return 1 2>/dev/null || exit 1
fi
