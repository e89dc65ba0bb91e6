"""Who am I in this job?  Rank, world size and rendezvous address from the launcher.

:func:`discover` is pure: it reads only the mapping it is given (normally
``os.environ``).  Launchers are tried in this order:

=========  ==========================================  =============================
launcher   rank / world                                 rendezvous
=========  ==========================================  =============================
torchrun   ``RANK`` / ``WORLD_SIZE`` / ``LOCAL_RANK``   ``MASTER_ADDR`` / ``MASTER_PORT``
                                                        (the agent's store when
                                                        ``TORCHELASTIC_USE_AGENT_STORE``)
srun       ``SLURM_PROCID`` / ``SLURM_STEP_NUM_TASKS``  ``MASTER_ADDR`` (the sbatch
           / ``SLURM_LOCALID``                          template sets it), else
                                                        ``SLURM_LAUNCH_NODE_IPADDR``
mpirun     ``OMPI_COMM_WORLD_*``, ``PMI_*``, ``PMIX_*``  ``MASTER_ADDR``, else rank 0's
                                                        host broadcast with mpi4py
none       rank 0 of 1                                  127.0.0.1
=========  ==========================================  =============================

Rank 0's host name goes over MPI as raw bytes (bounded, checked), never pickled.
The rendezvous itself is authenticated (:mod:`malletrain.runtime.rendezvous`).

Without ``MASTER_PORT`` the port is derived from the Slurm job id and restart
count, so two jobs sharing a node (or a job's next run while the last one's
socket lingers) do not collide.  A Slurm *batch* step (no ``srun``) is one
process: ``SLURM_PROCID`` alone does not make a multi-process launch.
"""
from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from malletrain.domain.errors import InputError

PORT_BASE, PORT_SPAN = 20000, 20000
HOST_MAX = 255                       # a host name, as rank 0 broadcasts it over MPI
HOST = re.compile(r"^[A-Za-z0-9._:-]{1,255}$")


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world: int
    local_rank: int
    master_addr: str
    master_port: int
    launcher: str          # torchrun | srun | mpi | single
    job: str               # Slurm job id, or "local"
    restart: int           # SLURM_RESTART_COUNT
    nodes: int             # nodes in the allocation
    node: str              # this process's node name
    agent_store: bool = False   # torchrun's agent serves the store at MASTER_ADDR:MASTER_PORT (rank 0 joins it)


def _int(env: Mapping[str, str], key: str, default: int | None = None) -> int:
    raw = env.get(key)
    if raw is None or raw == "":
        if default is None:
            raise InputError(f"environment variable {key} is not set")
        return default
    try:
        return int(raw)
    except ValueError:
        raise InputError(f"environment variable {key}={raw!r} is not an integer") from None


def default_port(job: str, restart: int) -> int:
    try:
        jid = int(job.split("_")[0])
    except ValueError:
        jid = 0
    return PORT_BASE + (jid * 13 + restart) % PORT_SPAN


def discover(env: Mapping[str, str], *, mpi_master: str | None = None) -> DistInfo:
    """The process's place in the job, from launcher environment variables."""
    # an elastic group's member (one task of a job array) is part of the array's job
    job = env.get("SLURM_ARRAY_JOB_ID") or env.get("SLURM_JOB_ID") or env.get("MALLETRAIN_JOB") or "local"
    restart = _int(env, "SLURM_RESTART_COUNT", _int(env, "MALLETRAIN_RESTART", 0))
    nodes = _int(env, "SLURM_JOB_NUM_NODES", _int(env, "SLURM_NNODES", 1))
    node = env.get("SLURMD_NODENAME") or env.get("HOSTNAME") or "localhost"
    port = _int(env, "MASTER_PORT", default_port(job, restart))
    agent_store = False
    if "RANK" in env and "WORLD_SIZE" in env:
        rank, world = _int(env, "RANK"), _int(env, "WORLD_SIZE")
        local, launcher = _int(env, "LOCAL_RANK", 0), "torchrun"
        addr = env.get("MASTER_ADDR") or "127.0.0.1"
        agent_store = env.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    elif "SLURM_STEP_NUM_TASKS" in env and "SLURM_PROCID" in env:
        rank, world = _int(env, "SLURM_PROCID"), _int(env, "SLURM_STEP_NUM_TASKS")
        local, launcher = _int(env, "SLURM_LOCALID", 0), "srun"
        nodes = _int(env, "SLURM_STEP_NUM_NODES", nodes)
        addr = env.get("MASTER_ADDR") or env.get("SLURM_LAUNCH_NODE_IPADDR") or "127.0.0.1"
    else:
        mpi = _mpi_env(env)
        if mpi is not None:
            (rank, world, local), launcher = mpi, "mpi"
            addr = env.get("MASTER_ADDR") or mpi_master or "127.0.0.1"
        else:
            rank, world, local, launcher, addr = 0, 1, 0, "single", "127.0.0.1"
    if world < 1 or not 0 <= rank < world:
        raise InputError(f"inconsistent launch: rank {rank} of world {world} ({launcher})")
    return DistInfo(rank, world, local, addr, port, launcher, job, restart, nodes, node, agent_store)


def _mpi_env(env: Mapping[str, str]) -> tuple[int, int, int] | None:
    for r, w, lr in (("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
                     ("PMIX_RANK", "PMIX_SIZE", "PMIX_LOCAL_RANK"),
                     ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID")):
        if r in env and w in env:
            return _int(env, r), _int(env, w), _int(env, lr, 0)
    return None


def mpi_master_addr() -> str | None:
    """Rank 0's host name broadcast over MPI (needs mpi4py); None without it."""
    try:
        from mpi4py import MPI
    except (ImportError, RuntimeError, OSError):   # no mpi4py, or no MPI library behind it
        return None
    comm = MPI.COMM_WORLD
    # raw bytes, never comm.bcast (which pickles): no rank unpickles what another sends
    buf = bytearray(HOST_MAX + 1)
    if comm.Get_rank() == 0:
        name = socket.gethostname().encode("utf-8")[:HOST_MAX]
        buf[0], buf[1:1 + len(name)] = len(name), name
    comm.Bcast([buf, MPI.BYTE], root=0)
    host = bytes(buf[1:1 + buf[0]]).decode("utf-8", "replace")
    return host if HOST.match(host) else None


def discover_process() -> DistInfo:
    """:func:`discover` on this process's environment (the impure wrapper)."""
    env = dict(os.environ)
    env.setdefault("HOSTNAME", socket.gethostname())
    master = None
    if "MASTER_ADDR" not in env and "RANK" not in env and "SLURM_STEP_NUM_TASKS" not in env \
            and _mpi_env(env) is not None:
        master = mpi_master_addr()
    return discover(env, mpi_master=master)
