"""``--launch torchrun`` without Slurm or torch: the batch script's line, torchrun's arguments
from the job, and how torchrun's ending maps onto the exit status the batch script acts on."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest
from helpers import descendants, kill_tree

from malletrain.domain.errors import InputError
from malletrain.runtime.launch import discover
from malletrain.runtime.torchrun import EXIT_STOPPED, exit_status, torchrun_argv
from malletrain.slurm.submit import render_script, torchrun_command

JOB = {"MASTER_ADDR": "node07", "MASTER_PORT": "23456", "SLURM_JOB_ID": "4242", "MALLETRAIN_RESTART": "3",
       "SLURM_JOB_NUM_NODES": "4", "MALLETRAIN_GRACE_S": "12.5"}


def test_the_batch_script_runs_the_wrapper_once_per_node_under_the_users_interpreter():
    script = render_script(["/opt/venv/bin/python3", "train.py", "--lr", "0.1 0.2"], metrics_dir="/m",
                           grace_s=10, launch="torchrun", tasks_per_node=2, template="{{launch}}")
    assert script == ("srun --ntasks-per-node=1 /opt/venv/bin/python3 -m malletrain.runtime.torchrun "
                      "--nproc-per-node 2 -- train.py --lr '0.1 0.2'")
    assert torchrun_command(["python", "-m", "pkg.train", "x"], 1)[-4:] == ["--", "-m", "pkg.train", "x"]


@pytest.mark.parametrize("command", [["./train.sh"], ["python3"], ["python3", "-u", "train.py"],
                                     ["python3", "-m"], ["bash", "-c", "python train.py"]])
def test_a_command_torchrun_cannot_run_is_refused(command):
    with pytest.raises(InputError, match="torchrun"):
        torchrun_command(command, 1)


def test_torchrun_arguments_come_from_the_job():
    argv = torchrun_argv(JOB, 2, ["train.py", "--epochs", "3"])
    assert argv == ["--nnodes=4", "--nproc-per-node=2", "--rdzv-backend=c10d", "--rdzv-endpoint=node07:23456",
                    "--rdzv-id=4242.3", "--max-restarts=0", "--shutdown-timeout=13",
                    "--signals-to-handle=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR2", "train.py", "--epochs", "3"]
    assert torchrun_argv(JOB, 1, ["-m", "pkg.train"])[-2:] == ["--module", "pkg.train"]
    # the next run of the job: a new rendezvous id (no agent of the last run joins it)
    assert "--rdzv-id=4242.4" in torchrun_argv({**JOB, "MALLETRAIN_RESTART": "4"}, 1, ["t.py"])


@pytest.mark.parametrize("change, needle", [
    ({"MASTER_ADDR": ""}, "MASTER_ADDR"), ({"MASTER_ADDR": "a b;rm"}, "MASTER_ADDR"),
    ({"MASTER_PORT": ""}, "MASTER_PORT"), ({"MASTER_PORT": "99999"}, "MASTER_PORT"),
    ({"SLURM_JOB_NUM_NODES": "x"}, "SLURM_JOB_NUM_NODES"), ({"SLURM_JOB_ID": "../x y"}, "job id"),
])
def test_a_broken_job_environment_is_a_clear_error(change, needle):
    with pytest.raises(InputError, match=needle):
        torchrun_argv({**JOB, **change}, 1, ["t.py"])


class SignalException(Exception):
    pass


class ChildFailedError(Exception):
    def __init__(self, codes, times=None):
        super().__init__("failed")
        times = times or [0.0] * len(codes)
        self.failures = {rank: type("ProcessFailure", (), {"exitcode": c, "timestamp": t})()
                         for rank, (c, t) in enumerate(zip(codes, times))}


@pytest.mark.parametrize("error, status", [
    (None, 0),
    (SignalException("got signal 15"), EXIT_STOPPED),        # the agent was signalled: the job requeues
    (ChildFailedError([3, 3]), EXIT_STOPPED),                # every worker checkpointed and stopped
    (ChildFailedError([3, -15]), EXIT_STOPPED),              # ... one of them got the agent's closing SIGTERM
    (ChildFailedError([-15, -15]), 143),                     # killed before any checkpoint: not a stop
    (ChildFailedError([0, -9]), 137),                        # kill -9 of a worker
    (ChildFailedError([-15, -9], [5.0, 4.0]), 137),          # ... and the agent then stopped the other
    (ChildFailedError([3, 1]), 1),                           # a crash is a crash
    (ChildFailedError([2]), 2),
    (RuntimeError("rendezvous timed out"), 1),
])
def test_how_torchrun_ended_maps_onto_the_batch_scripts_exit_status(error, status):
    assert exit_status(error) == status


def test_workers_under_torchrun_join_the_agents_store():
    env = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "4000"}
    assert not discover(env).agent_store
    assert discover({**env, "TORCHELASTIC_USE_AGENT_STORE": "True"}).agent_store


def test_a_hung_run_is_killed_with_the_workers_in_sessions_of_their_own():
    """What tests/helpers.finished does past its timeout: torchrun's agent starts each worker in
    a session of its own, so the wrapper's process group would miss them; the tree is walked."""
    code = ("import subprocess, sys, time\n"
            "kid = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], start_new_session=True)\n"
            "print(kid.pid, flush=True)\n"
            "time.sleep(600)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    kid = int(p.stdout.readline())
    assert descendants(p.pid) == [kid]
    kill_tree(p)
    assert p.returncode == -9
    deadline = time.monotonic() + 10
    while _alive(kid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(kid)


def _alive(pid: int) -> bool:
    """Running, as opposed to gone or a zombie waiting for whoever inherited it."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
