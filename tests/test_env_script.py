"""scripts/env.sh is sourced, often into an interactive shell (README: ``source scripts/env.sh
train``): it must leave the caller's shell options alone and fail without changing anything.
Each case runs a copy of the script in a fake checkout whose venv is already installed (or a
fake Python that fails the version check), so nothing is installed and no network is used."""
from __future__ import annotations

import os
import shutil
import subprocess
import time

import pytest
from conftest import ROOT


@pytest.fixture
def checkout(tmp_path):
    (tmp_path / "scripts").mkdir()
    shutil.copy(os.path.join(ROOT, "scripts", "env.sh"), tmp_path / "scripts" / "env.sh")
    (tmp_path / "pyproject.toml").write_text("")
    py = tmp_path / "bin" / "python-too-old"       # passes `-c 'import venv'`, fails the version check
    py.parent.mkdir()
    py.write_text('#!/bin/sh\n[ "$1" = "-c" ] && exit 0\nexit 3\n')
    py.chmod(0o755)
    return tmp_path


def _installed(checkout) -> None:
    venv_bin = checkout / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "python").write_text("#!/bin/sh\nexit 0\n")
    (venv_bin / "python").chmod(0o755)
    stamp = checkout / ".venv" / ".installed-x"
    stamp.touch()
    later = time.time() + 5      # newer than pyproject.toml: nothing to reinstall
    os.utime(stamp, (later, later))


def _bash(checkout, script: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-c", script], cwd=checkout, capture_output=True, text=True,
                          timeout=60, env={**os.environ, **env})


def test_sourcing_puts_the_venv_first_and_leaves_shell_options_alone(checkout):
    _installed(checkout)
    out = _bash(checkout, 'source scripts/env.sh x; echo "rc=$? opts=$-"; '
                          'set -o | grep -E "^(errexit|nounset|pipefail)"; echo "first=${PATH%%:*}"; false; echo alive')
    assert out.returncode == 0, out.stderr
    assert "rc=0" in out.stdout and "e" not in out.stdout.split("opts=")[1].split()[0]
    assert all(line.split()[1] == "off" for line in out.stdout.splitlines()
               if line.startswith(("errexit", "nounset", "pipefail")))
    assert f"first={checkout}/.venv/bin" in out.stdout
    assert "alive" in out.stdout        # a failing command no longer ends the caller's shell


def test_a_failed_set_up_returns_non_zero_and_changes_nothing(checkout):
    out = _bash(checkout, 'before="$PATH"; source scripts/env.sh x; rc=$?; '
                          '[ "$PATH" = "$before" ] && echo same-path; echo "rc=$rc opts=$-"; echo alive',
                PYTHON=str(checkout / "bin" / "python-too-old"))
    assert "rc=1" in out.stdout and "same-path" in out.stdout and "alive" in out.stdout, out
    assert "e" not in out.stdout.split("opts=")[1].split()[0]
    assert "setting up the environment failed" in out.stderr
    # set -e held inside: it stopped at the version check, before creating a venv
    assert not (checkout / ".venv").exists() and "creating" not in out.stderr


def test_a_strict_caller_stops_at_the_failure(checkout):
    out = _bash(checkout, "set -euo pipefail; source scripts/env.sh x; echo not-reached",
                PYTHON=str(checkout / "bin" / "python-too-old"))
    assert out.returncode != 0 and "not-reached" not in out.stdout
    run = _bash(checkout, "bash scripts/env.sh x", PYTHON=str(checkout / "bin" / "python-too-old"))
    assert run.returncode == 1 and "setting up the environment failed" in run.stderr
