import subprocess
import sys

import pytest

COMMANDS = [[], ["replay"], ["jpa"], ["jpa", "predict"], ["bench"], ["bench", "allocator"],
            ["bench", "compare"], ["bench", "jpa"], ["bench", "replay"], ["bench", "quality"],
            ["example"]]


@pytest.mark.parametrize("cmd", COMMANDS, ids=lambda c: " ".join(c) or "top")
def test_help_everywhere(cmd):
    r = subprocess.run([sys.executable, "-m", "malletrain", *cmd, "--help"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "usage: malletrain" in r.stdout
    assert len(r.stdout.splitlines()) >= 4


def test_no_command_is_an_error():
    r = subprocess.run([sys.executable, "-m", "malletrain"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
