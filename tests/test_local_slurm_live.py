"""``scripts/local-slurm.sh down`` leaves nothing behind (issue #11): no process started for the
cluster (daemons, MariaDB, job steps) and no mount namespace holding the Debian root's mounts.

A release other than the host's runs its daemons chrooted in a cached Debian root, each in a
private mount namespace with /proc, /dev, /sys, /tmp, /home and the checkout bound in.  Those
mounts never show in the host's mount table; they live as long as a process of that namespace
does.  So the test looks at every process: while the cluster is up, some process's command line
names the cluster's directory and some process runs in the root with a /proc mounted there (the
check sees what it is meant to find); after ``down``, none does.
"""
from __future__ import annotations

import os

import pytest
from live import TEST_PORT, cluster_dir, wait_until

from devtools.local_slurm import LocalSlurm

pytestmark = [pytest.mark.live]

def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:      # the process ended, or is a kernel thread
        return b""


def _processes_naming(directory: str) -> list[tuple[str, str]]:
    """(pid, command line) of the processes whose command line names ``directory`` (the
    config, spool and pid files all live below it)."""
    hits = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        cmd = _read(f"/proc/{pid}/cmdline")
        if directory.encode() in cmd:
            hits.append((pid, cmd.replace(b"\0", b" ").decode(errors="replace")[:200]))
    return hits


def _program(argv: str) -> str:
    return os.path.basename(argv.split(" ", 1)[0])


def _chrooted_in(root: str) -> list[str]:
    """Processes running chrooted in ``root`` (each in the private mount namespace that holds
    the root's mounts; the namespace ends with its last process)."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if os.readlink(f"/proc/{pid}/root") == root:
                out.append(pid)
        except OSError:
            continue
    return out


def _has_proc_mounted(pid: str) -> bool:
    """The process's mount table (as seen from its root) has a proc file system on /proc."""
    return any(line.split(" - ", 1)[-1].startswith("proc ") and line.split()[4] == "/proc"
               for line in _read(f"/proc/{pid}/mountinfo").decode(errors="replace").splitlines())


@pytest.mark.parametrize("version", ["26.05"])
def test_down_leaves_no_process_and_no_mount(version):
    if os.geteuid() != 0:
        pytest.fail("the real-Slurm tests need root (slurmd); run the test command as root")
    directory = cluster_dir("down")
    cluster = LocalSlurm(directory, TEST_PORT + 80)
    try:
        cluster.up("--slurm", version, "--accounting", "--nodes", "2")
        assert cluster.run("sinfo", "-h", "-o", "%D").stdout.strip() == "2"
        up_procs = _processes_naming(directory)
        ctld = [pid for pid, argv in up_procs if _program(argv) == "slurmctld"]
        root = os.readlink(f"/proc/{ctld[0]}/root") if ctld else "/"   # the Debian root it runs in
        chrooted = _chrooted_in(root)
        mounted = [pid for pid in chrooted if _has_proc_mounted(pid)]
    finally:
        cluster.script("down")
    assert ctld and any(_program(argv) == "slurmd" for _, argv in up_procs), up_procs
    assert root != "/", f"slurmctld of Slurm {version} does not run chrooted in a Debian root"
    assert chrooted and mounted, f"no process ran in {root} with its /proc mounted while the cluster was up"
    # down waits for its processes; allow the kernel a moment to reap the last of them
    wait_until(lambda: not _processes_naming(directory), 10, "no process naming the cluster's directory")
    wait_until(lambda: not _chrooted_in(root), 10, f"no process (and so no mount namespace) left in {root}")
