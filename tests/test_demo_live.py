"""The README's main command from where a newcomer clones it (issue #22): ``scripts/demo.sh``'s
set-up steps (``--check-setup``: the cluster, the operator's install, the daemon's first cycle as
the unprivileged account) from a copy of the checkout in a 0700 directory whose path holds a
space, changing the mode of nothing outside the demo's own directory, which it removes; and,
with a daemon that dies at once, a failure that says why and takes the cluster down."""
from __future__ import annotations

import glob
import os
import shutil
import stat
import subprocess

import pytest
from live import ROOT, TEST_PORT

pytestmark = [pytest.mark.slow, pytest.mark.live]

PORT = TEST_PORT + 100       # beside the test clusters' ports


def _copy_checkout(dest: str) -> None:
    """The tracked and not-ignored files, as a fresh clone would have them (no .venv, no out/)."""
    files = subprocess.run(["git", "-C", ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           capture_output=True, check=True).stdout.decode().split("\0")
    for f in filter(None, files):
        src = os.path.join(ROOT, f)
        if os.path.isfile(src):
            os.makedirs(os.path.dirname(os.path.join(dest, f)), exist_ok=True)
            shutil.copy2(src, os.path.join(dest, f))


def _modes_above(path: str) -> dict[str, tuple[int, int, int]]:
    out = {}
    p = os.path.dirname(os.path.abspath(path))
    while True:
        st = os.stat(p)
        out[p] = (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid)
        if p == os.sep:
            return out
        p = os.path.dirname(p)


def _demo_dirs() -> set[str]:
    return set(glob.glob("/var/tmp/malletrain-demo.*"))


def _demo_processes() -> set[str]:
    """Processes whose command line or working directory names a demo directory."""
    out = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:
            continue
        if "malletrain-demo." in cmd or "malletrain-demo." in cwd:
            out.add(f"{pid}: {cmd}")
    return out


def _demo(checkout: str, timeout_s: float = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, LOCAL_SLURM_PORT=str(PORT))
    env.pop("PYTHONPATH", None)
    return subprocess.run(["bash", os.path.join(checkout, "scripts", "demo.sh"), "--check-setup"], env=env,
                          capture_output=True, text=True, timeout=timeout_s, cwd="/")


@pytest.fixture
def private_checkout(tmp_path):
    """A copy of the checkout in ``<tmp>/private/a checkout``, ``private`` 0700 (like /root)."""
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    os.chmod(private, 0o700)
    checkout = private / "a checkout"
    _copy_checkout(str(checkout))
    return str(checkout)


def test_demo_set_up_works_from_a_private_directory(private_checkout):
    before_dirs = _demo_dirs()
    modes = {**_modes_above(private_checkout), **_modes_above(ROOT)}
    out = _demo(private_checkout)
    said = out.stdout + out.stderr
    assert out.returncode == 0, said[-4000:]
    assert "[demo] daemon cycling" in said and "[demo] set-up ok" in said, said[-4000:]
    assert "[demo] cluster down" in said
    assert {**_modes_above(private_checkout), **_modes_above(ROOT)} == modes   # nothing above changed
    assert _demo_dirs() == before_dirs          # its own directory removed
    assert not _demo_processes(), _demo_processes()
    assert not os.path.exists(os.path.join(private_checkout, "out"))   # --check-setup keeps no outputs


def test_demo_stops_at_once_and_takes_the_cluster_down_when_the_daemon_dies(private_checkout):
    """A daemon that exits at start: the demo says so with the tail of the daemon's log, exits 1
    and leaves no cluster behind (before, a daemon that could not start left a demo that reported
    0% harvested after six minutes and a cluster running for the next hour)."""
    loop = os.path.join(private_checkout, "malletrain", "daemon", "loop.py")
    with open(loop, "a", encoding="utf-8") as fh:      # the copy's daemon dies when it starts
        fh.write('\ndef _refuse(self):\n    raise SystemExit("demo-test: this daemon refuses to start")\n'
                 '\n\nDaemon.run = _refuse\n')
    before_dirs = _demo_dirs()
    out = _demo(private_checkout)
    said = out.stdout + out.stderr
    assert out.returncode == 1, said[-4000:]
    assert "FAILED: the daemon exited before its first cycle" in said, said[-4000:]
    assert "demo-test: this daemon refuses to start" in said       # the log's tail is shown
    assert "[demo] cluster down" in said
    assert _demo_dirs() == before_dirs
    assert not _demo_processes(), _demo_processes()
