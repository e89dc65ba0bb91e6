import subprocess
import sys

import pytest

COMMANDS = [[], ["replay"], ["jpa"], ["jpa", "predict"], ["bench"], ["bench", "allocator"],
            ["bench", "compare"], ["bench", "quality"], ["bench", "slurm"], ["selfcheck"],
            ["selfcheck", "consistency"], ["daemon"], ["config"], ["config", "check"], ["submit"],
            ["campaign"], ["campaign", "submit"], ["campaign", "status"], ["status"], ["explain"]]
DEV_COMMANDS = [[], ["bench"], ["bench", "jpa"], ["bench", "replay"], ["bench", "runtime"], ["example"]]


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: " ".join(c) or "top")
def test_help_everywhere(cmd):
    r = subprocess.run([sys.executable, "-m", "malletrain", *cmd, "--help"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "usage: malletrain" in r.stdout
    assert len(r.stdout.splitlines()) >= 4


@pytest.mark.parametrize("cmd", DEV_COMMANDS, ids=lambda c: " ".join(c) or "top")
def test_devtools_help(cmd):
    r = subprocess.run([sys.executable, "-m", "devtools", *cmd, "--help"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "usage: python -m devtools" in r.stdout


def test_no_command_is_an_error():
    r = subprocess.run([sys.executable, "-m", "malletrain"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
