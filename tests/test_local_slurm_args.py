"""scripts/local-slurm.sh refuses bad options with exit 2 and a clear line, before it installs,
builds or starts anything (fast tier: no root, no Slurm)."""
from __future__ import annotations

import os
import subprocess

import pytest

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts", "local-slurm.sh")


@pytest.mark.parametrize("args,needle", [
    (["--slurm", "23.11"], "--slurm must be host, 22.05, 24.11 or 26.05"),
    (["--rest", "http"], "--rest must be a TCP port"),
    (["--cloud-nodes", "-5"], "--cloud-nodes must be an integer"),
    (["--cloud-nodes", "100000"], "--cloud-nodes must be an integer"),
    (["--nodes", "0"], "--nodes must be a positive integer"),
    (["--max-jobs", "1e9"], "--max-jobs must be a positive integer"),
    (["--min-job-age", "1"], "--min-job-age must be whole seconds"),
    (["--min-job-age", "ten"], "--min-job-age must be whole seconds"),
    (["--preempt-mode", "suspend"], "--preempt-mode must be requeue or cancel"),
    (["--bogus"], "unknown option --bogus"),
])
def test_bad_options_exit_2_before_doing_anything(tmp_path, args, needle):
    out = subprocess.run(["bash", SCRIPT, "up", *args, "--dir", str(tmp_path / "c")], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 2 and needle in out.stderr, out.stderr
    assert not (tmp_path / "c").exists()      # nothing created


def test_help_names_every_option():
    out = subprocess.run(["bash", SCRIPT, "--help"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0
    for opt in ("--slurm", "--accounting", "--cloud-nodes", "--rest", "add-user", "--max-jobs", "--min-job-age",
                "--preempt-mode"):
        assert opt in out.stdout, opt
