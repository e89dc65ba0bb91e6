"""A local cluster (``scripts/local-slurm.sh``) in its own directory and port, for the development
commands that start one (``bench queue``, ``bench scale``, ``capture-fixtures``)."""
from __future__ import annotations

import os
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "scripts", "local-slurm.sh")


class LocalSlurm:
    def __init__(self, directory: str, port: int) -> None:
        self.dir, self.port = directory, port
        self.env = dict(os.environ, LOCAL_SLURM_PORT=str(port), SLURM_TIME_FORMAT="%s", LC_ALL="C")
        self.conf = self.bin = ""

    def script(self, *args: str, timeout_s: float = 900) -> str:
        out = subprocess.run(["bash", SCRIPT, *args, "--dir", self.dir], env=self.env, capture_output=True,
                             text=True, timeout=timeout_s)
        if out.returncode != 0:
            raise RuntimeError(f"local-slurm.sh {' '.join(args)}: {out.stderr[-2000:]}")
        return out.stdout

    def up(self, *args: str) -> None:
        """``local-slurm.sh up ARGS``; then the cluster's config and client commands are this env's."""
        said = dict(x.split("=", 1) for x in self.script("up", *args).splitlines()
                    if x.startswith(("SLURM_CONF=", "SLURM_BIN=")))
        self.conf, self.bin = said["SLURM_CONF"], said["SLURM_BIN"]
        self.env["SLURM_CONF"] = self.conf
        self.env["PATH"] = f"{self.bin}:{os.environ['PATH']}"

    def run(self, *argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=300)

    def count(self) -> int:
        """Jobs in the queue."""
        return len(self.run("squeue", "-h", "-a", "-o", "%i").stdout.split())
