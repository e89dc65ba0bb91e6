"""Optional pyslurm backend: reads through the Slurm C API, writes through the CLI.

Used only when ``import pyslurm`` works and its major version equals the
running Slurm's (``sinfo --version``); pyslurm is built against one Slurm
release and misreads any other.  PyPI's pyslurm is 25.11 only while Debian 12
ships Slurm 22.05, so on this project's machines the contract tests skip it
and say why; this module has not run against a real pyslurm.  The reads map
pyslurm's ``Jobs``/``Nodes`` collections onto the same records the CLI
parser produces, so everything above the parser is shared.
"""
from __future__ import annotations

import re

from malletrain.domain.config import DaemonConfig, SlurmConfig
from malletrain.slurm.adapter import SlurmBackend
from malletrain.slurm.parse import JobRecord, NodeRecord, expand
from malletrain.slurm.runner import Runner, SlurmCommandError


def slurm_major(runner: Runner) -> int | None:
    try:
        out = runner.read(["sinfo", "--version"])
    except SlurmCommandError:
        return None
    m = re.search(r"(\d+)\.\d+", out)
    return int(m.group(1)) if m else None


def available(runner: Runner) -> tuple[bool, str]:
    """(usable, reason)."""
    try:
        import pyslurm
    except Exception as exc:   # ImportError, or a shared-library mismatch at import
        return False, f"import pyslurm failed: {exc}"
    ver = getattr(pyslurm, "__version__", "")
    m = re.match(r"(\d+)", ver)
    major = slurm_major(runner)
    if not m or major is None or int(m.group(1)) != major:
        return False, f"pyslurm {ver or '?'} does not match Slurm major version {major}"
    return True, f"pyslurm {ver} on Slurm {major}"


class PyslurmBackend(SlurmBackend):
    def __init__(self, slurm_conf: str | None, slurm: SlurmConfig, daemon: DaemonConfig, **kw) -> None:
        import pyslurm
        self._pyslurm = pyslurm
        super().__init__(Runner(slurm_conf=slurm_conf, timeout_s=slurm.command_timeout_s),
                         slurm, daemon, **kw)

    def _jobs(self) -> list[JobRecord]:
        out = []
        for job in self._pyslurm.Jobs.load().values():
            out.append(JobRecord(
                str(job.id), job.partition or "", str(job.state).upper(), job.state_reason or "",
                int(job.num_nodes or 0), expand(job.allocated_nodes or ""),
                float(job.start_time) if job.start_time else None,
                expand(getattr(job, "scheduled_nodes", "") or ""),
                float(job.submit_time) if job.submit_time else None,
                job.user_name or "", uid=int(job.user_id) if job.user_id is not None else None,
                name=job.name or "", comment=job.comment or ""))
        return out

    def _nodes(self) -> list[NodeRecord]:
        out = []
        for node in self._pyslurm.Nodes.load().values():
            if self.slurm.partition not in (node.partitions or []):
                continue
            states = {str(node.state).upper(), *[str(f).upper() for f in (node.state_flags or [])]}
            gres = ",".join(node.configured_gres) if isinstance(node.configured_gres, (list, dict)) \
                else str(node.configured_gres or "")
            out.append(NodeRecord(node.name, frozenset(states), gres, ""))
        return out
