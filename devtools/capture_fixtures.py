"""Capture the Slurm parser fixtures from a real slurmctld of one release.

``python -m devtools capture-fixtures --slurm 24.11 --out tests/fixtures/slurm`` starts a fresh
4-node cluster of that release (``scripts/local-slurm.sh`` in a temporary directory and its own
ports), builds one queue state and writes what the daemon's reads print for it:

* job 7: a held malleable job in ``scavenger`` whose comment is a malletrain tag;
* job 8: a primary job running on n[1-3];
* job 9: a primary job waiting for 4 nodes, planned on n[1-4] (n4 is PLANNED).

Files (``V`` = the release's major.minor): ``squeue-V.txt`` (the queue read,
``parse.SQUEUE_FORMAT``), ``squeue-tag-V.txt`` (job 7's tag read, ``parse.TAG_FORMAT``),
``sinfo-V.txt`` (``parse.SINFO_FORMAT``), and ``squeue-V.json`` / ``sinfo-V.json``.  Times are
epoch seconds (``SLURM_TIME_FORMAT=%s``).  Needs root (slurmd); the cluster is taken down after.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time

from devtools.local_slurm import LocalSlurm
from malletrain.slurm.parse import SINFO_FORMAT, SQUEUE_FORMAT, TAG_FORMAT

TAG = "malletrain:v1 token=abc min=1 max=4 profile=p up=2 down=1 metrics=/tmp/m"
PORT = 8217


class _Cluster(LocalSlurm):
    def __init__(self, version: str) -> None:
        super().__init__(tempfile.mkdtemp(prefix=f"malletrain-capture-{version}-"), PORT)
        self.version = version

    def sh(self, *argv: str) -> str:
        out = self.run(*argv)
        if out.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {out.stderr.strip()}")
        return out.stdout

    def down(self) -> None:
        try:
            self.script("down")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


def _wait(pred, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        if pred():
            return
        time.sleep(0.5)
    raise RuntimeError(f"timed out waiting for {what}")


def capture(version: str, out_dir: str) -> list[str]:
    """Build the state on a fresh cluster of ``version`` and write the fixtures; returns the paths."""
    c = _Cluster(version)
    try:
        c.up("--slurm", c.version, "--nodes", "4")
        release = c.sh("sinfo", "--version").split()[-1]
        tag = ".".join(release.split(".")[:2])
        sb = ("sbatch", "--parsable", "-o", "/dev/null")
        for _ in range(6):           # ids 1-6, so the jobs below are 7, 8 and 9 as in every fixture
            c.sh("scancel", c.sh(*sb, "--hold", "--wrap", "true").strip().split(";")[0])
        held = c.sh(*sb, "-p", "scavenger", "-N", "1", "--hold", f"--comment={TAG}", "--wrap", "sleep 600")
        run = c.sh(*sb, "-p", "batch", "-N", "3", "-w", "n[1-3]", "-t", "10", "--wrap", "sleep 600")
        _wait(lambda: c.sh("squeue", "-h", "-j", run.strip(), "-o", "%T").strip() == "RUNNING", "job 8 to run")
        pend = c.sh(*sb, "-p", "batch", "-N", "4", "-t", "10", "--wrap", "sleep 60")
        ids = [x.strip().split(";")[0] for x in (held, run, pend)]
        if ids != ["7", "8", "9"]:
            raise RuntimeError(f"expected job ids 7, 8, 9 on a fresh cluster, got {ids}")
        _wait(lambda: "planned" in c.sh("sinfo", "-h", "-N", "-p", "batch", "-o", "%T")
              and c.sh("squeue", "-h", "-j", "9", "-o", "%Y").strip() not in ("", "(null)"),
              "backfill to plan job 9 on n[1-4]", 90)
        files = {
            f"squeue-{tag}.txt": c.sh("squeue", "-h", "-a", "-o", SQUEUE_FORMAT),
            f"squeue-tag-{tag}.txt": c.sh("squeue", "-h", "-j", "7", "-o", TAG_FORMAT),
            f"sinfo-{tag}.txt": c.sh("sinfo", "-h", "-N", "-p", "scavenger", "-o", SINFO_FORMAT),
            f"squeue-{tag}.json": _pretty(c.sh("squeue", "-a", "--json")),
            f"sinfo-{tag}.json": _pretty(c.sh("sinfo", "--json")),
        }
        os.makedirs(out_dir, exist_ok=True)
        paths = []
        for name, text in files.items():
            path = os.path.join(out_dir, name)
            with open(path + ".tmp", "w") as fh:
                fh.write(text)
            os.replace(path + ".tmp", path)
            paths.append(path)
        return paths
    finally:
        c.down()


def _pretty(text: str) -> str:
    return json.dumps(json.loads(text), indent=1, sort_keys=True) + "\n"
