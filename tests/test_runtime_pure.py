"""The training runtime's pure parts: launch discovery, logical workers, config,
the stop protocol, progress records, self-check arguments (no torch needed)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from malletrain.daemon.progress import ProgressTail
from malletrain.domain.errors import ConfigError, InputError
from malletrain.runtime import logical
from malletrain.runtime.config import RuntimeConfig
from malletrain.runtime.launch import default_port, discover
from malletrain.runtime.metrics import MetricsWriter
from malletrain.runtime.selfcheck import boundaries
from malletrain.runtime.signals import StopRequest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------- discovery
@pytest.mark.parametrize("env, want", [
    ({}, (0, 1, 0, "single", "127.0.0.1")),
    ({"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "0", "MASTER_ADDR": "h1"}, (2, 4, 0, "torchrun", "h1")),
    ({"SLURM_PROCID": "3", "SLURM_STEP_NUM_TASKS": "8", "SLURM_LOCALID": "1",
      "SLURM_LAUNCH_NODE_IPADDR": "10.0.0.5"}, (3, 8, 1, "srun", "10.0.0.5")),
    ({"SLURM_PROCID": "0", "SLURM_JOB_ID": "7"}, (0, 1, 0, "single", "127.0.0.1")),   # batch step
    ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}, (1, 2, 0, "mpi", "127.0.0.1")),
    ({"PMI_RANK": "1", "PMI_SIZE": "3", "MASTER_ADDR": "m"}, (1, 3, 0, "mpi", "m")),
])
def test_discover_reads_each_launcher(env, want):
    info = discover(env)
    assert (info.rank, info.world, info.local_rank, info.launcher, info.master_addr) == want


def test_discover_rejects_inconsistent_or_garbage_env():
    with pytest.raises(InputError, match="rank 4 of world 4"):
        discover({"RANK": "4", "WORLD_SIZE": "4"})
    with pytest.raises(InputError, match="SLURM_PROCID"):
        discover({"SLURM_PROCID": "x", "SLURM_STEP_NUM_TASKS": "2"})


def test_default_port_matches_the_sbatch_template():
    with open(os.path.join(ROOT, "slurm", "templates", "malleable.sbatch")) as fh:
        text = fh.read()
    assert "MASTER_PORT=$(( 20000 + (SLURM_JOB_ID * 13 + MALLETRAIN_RESTART) % 20000 ))" in text
    assert default_port("123", 2) == 20000 + (123 * 13 + 2) % 20000
    info = discover({"SLURM_JOB_ID": "123", "SLURM_RESTART_COUNT": "2"})
    assert info.master_port == default_port("123", 2) and info.restart == 2


# ---------------------------------------------------------------- logical workers
def test_assign_mappings():
    assert logical.assign(4, 3) == [(0, 1), (2,), (3,)]
    assert logical.assign(5, 2, "round_robin") == [(0, 2, 4), (1, 3)]
    assert logical.assign(4, 2, [[0, 1, 2], [3]]) == [(0, 1, 2), (3,)]
    for bad in ([[0, 1], [1, 2, 3]], [[0, 1, 2, 3], []], [[0, 1]]):
        with pytest.raises(ValueError):
            logical.assign(4, 2, bad)
    with pytest.raises(ValueError, match="P=5"):
        logical.assign(4, 5)


def test_runtime_config_rejects_unknown_and_bad_values():
    with pytest.raises(ConfigError, match="unknown runtime setting.*valid runtime settings:.*checkpoint_dir"):
        RuntimeConfig.from_env({}, checkpoint_dir="x", workers=4)
    with pytest.raises(ConfigError, match="mode"):
        RuntimeConfig(checkpoint_dir="x", mode="fast")
    with pytest.raises(ConfigError, match="MALLETRAIN_CHECKPOINT_DIR"):
        RuntimeConfig.from_env({})
    cfg = RuntimeConfig.from_env({"MALLETRAIN_GRACE_S": "10", "MALLETRAIN_METRICS": "/m",
                                  "MALLETRAIN_CHECKPOINT_DIR": "/c"})
    assert (cfg.grace_s, cfg.deadline_s, cfg.metrics_path, cfg.checkpoint_dir) == (10.0, 5.0, "/m", "/c")
    assert not cfg.elastic


def test_a_member_of_an_elastic_group_runs_elastic_from_the_environment():
    """The batch script exports MALLETRAIN_ELASTIC=1 in an elastic group's members (issue #26): a
    script built on from_env runs elastic there and as before elsewhere; one that insists on not
    running elastic in a member is told why, instead of training the trial once per node."""
    env = {"MALLETRAIN_CHECKPOINT_DIR": "/c", "MALLETRAIN_ELASTIC": "1"}
    assert RuntimeConfig.from_env(env).elastic
    assert not RuntimeConfig.from_env({**env, "MALLETRAIN_ELASTIC": ""}).elastic     # not an array
    with pytest.raises(ConfigError, match="member of an elastic group"):
        RuntimeConfig.from_env(env, elastic=False)
    with pytest.raises(ConfigError, match="consistency"):
        RuntimeConfig.from_env(env, mode="throughput")


# ---------------------------------------------------------------- signals
def test_stop_request_repeat_gap_and_deadline():
    now = [100.0]
    st = StopRequest(deadline_s=5.0, repeat_gap_s=1.0, clock=lambda: now[0])
    assert not st.requested and not st.forced
    st.notify(signal.SIGTERM)
    st.notify(signal.SIGTERM)          # srun's forwarded copy, same moment: one request
    assert st.requested and not st.forced and st.name() == "SIGTERM"
    now[0] = 101.5
    st.notify(signal.SIGUSR2)          # a real second signal
    assert st.forced
    st2 = StopRequest(deadline_s=5.0, clock=lambda: now[0])
    st2.notify(signal.SIGUSR2)
    now[0] += 4.9
    assert not st2.forced
    now[0] += 0.2
    assert st2.forced


# ---------------------------------------------------------------- progress records
def test_metrics_records_feed_the_daemons_profiler(tmp_path):
    path = str(tmp_path / "7.jsonl")
    w = MetricsWriter(path, base=dict(job="7", world=2, nodes=2, node="n1", restart=0), min_interval_s=0.0)
    w.record("start", step=0, samples=0, step_s=0.0)
    for i in range(1, 4):
        time.sleep(0.05)
        w.record("progress", step=i * 10, samples=i * 640, step_s=0.005)
    w.record("exit", step=30, samples=1920, step_s=0.0, reason="done")
    w.close()
    recs = [json.loads(x) for x in open(path)]
    assert [r["event"] for r in recs] == ["start", "progress", "progress", "progress", "exit"]
    assert set(recs[1]) >= {"t", "job", "step", "samples", "step_s", "world", "nodes", "node",
                            "event", "restart"}
    samples = ProgressTail().poll("7", path)
    assert len(samples) == 2 and all(s.nodes == 2 and s.samples_per_s > 0 for s in samples)


def test_metrics_rate_limit_and_unwritable_path(tmp_path):
    w = MetricsWriter(str(tmp_path / "m.jsonl"), base={}, min_interval_s=60)
    assert w.record("progress", step=1) and not w.record("progress", step=2)
    assert w.record("checkpoint", step=2)      # events other than progress always go out
    w.close()
    bad = MetricsWriter(str(tmp_path / "no" / "such" / "dir.jsonl"), base={}, min_interval_s=0)
    bad.record("start")                        # never raises into training
    bad.close()
    assert bad.dropped == 1 and bad.written == 0


def test_boundaries_split_steps_evenly():
    assert boundaries(24, 4) == [6, 12, 18, 24]
    assert boundaries(10, 3) == [3, 7, 10]
    with pytest.raises(ValueError):
        boundaries(2, 3)


@pytest.mark.parametrize("argv, match", [
    (["--procs", "1,x"], "comma-separated integers"),
    (["--procs", "1,5"], "5 processes > 4 logical workers"),
    (["--rescale", "1,2,3", "--steps", "2"], "only 2 steps"),
])
def test_selfcheck_rejects_bad_arguments_with_exit_2(argv, match):
    out = subprocess.run([sys.executable, "-m", "malletrain", "selfcheck", "consistency", *argv],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and match in out.stderr, out.stderr


def test_a_stop_agreed_from_a_peer_counts_from_the_peers_signal():
    now = [50.0]
    st = StopRequest(deadline_s=5.0, clock=lambda: now[0])
    assert st.name() == "-" and st.since_s() is None
    st.peer(1.25)                      # another rank got SIGTERM 1.25 s ago
    assert st.requested and st.name() == "peer" and st.since_s() == pytest.approx(1.25)
    now[0] += 4.0
    assert st.forced                   # 5.25 s since the first signal anywhere in the job
    st.notify(signal.SIGTERM)          # this rank's own copy, later: the first signal still counts
    assert st.since_s() == pytest.approx(5.25)
    own = StopRequest(deadline_s=5.0, clock=lambda: now[0])
    own.notify(signal.SIGUSR2)
    own.peer(3.0)                      # its own signal came first: unchanged
    assert own.name() == "SIGUSR2" and own.since_s() == 0.0
