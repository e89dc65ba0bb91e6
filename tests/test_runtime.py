"""The training runtime with real PyTorch (CPU, gloo): checkpoints, bitwise
consistency across process counts and rescales, the stop protocol."""
from __future__ import annotations

import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest
from helpers import progress_records, torchrun, wait_step

from malletrain.runtime.checkpoint import CheckpointStore
from malletrain.runtime.selfcheck import Launcher, Plan, free_port

pytestmark = pytest.mark.torch
torch = None   # imported by the fixture below, so that the fast tier can collect (and deselect) this file


@pytest.fixture(autouse=True, scope="module")
def _torch():
    global torch
    import torch as module  # the test extra installs torch: a missing torch fails, never skips
    torch = module


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------- checkpoints
def _state(step):
    g = torch.Generator().manual_seed(step)
    return {"step": step, "w": torch.randn(50, generator=g), "rng": torch.get_rng_state()}


def test_checkpoints_are_atomic_checksummed_and_keep_k(tmp_path):
    store = CheckpointStore(str(tmp_path), keep=2)
    for s in (10, 20, 30):
        saved = store.save(s, _state(s))
        assert saved.bytes == os.path.getsize(saved.path)
    assert store.steps() == [30, 20]
    assert not [n for n in os.listdir(tmp_path) if ".tmp" in n]
    got = store.restore()
    assert got.step == 30 and torch.equal(got.state["w"], _state(30)["w"]) and got.skipped == ()


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty", "foreign"])
def test_corrupt_newest_checkpoint_falls_back_to_previous(tmp_path, caplog, damage):
    store = CheckpointStore(str(tmp_path), keep=3)
    store.save(10, _state(10))
    store.save(20, _state(20))
    path = store.path(20)
    blob = open(path, "rb").read()
    if damage == "flip":
        blob = blob[:500] + bytes([blob[500] ^ 0x01]) + blob[501:]
    elif damage == "truncate":
        blob = blob[: len(blob) // 2]
    elif damage == "empty":
        blob = b""
    else:
        blob = b"PK\x03\x04 not ours" * 10
    open(path, "wb").write(blob)
    with caplog.at_level(logging.WARNING, logger="malletrain.runtime"):
        got = store.restore()
    assert got.step == 10 and torch.equal(got.state["w"], _state(10)["w"])
    assert got.skipped == (path,)
    assert "unusable" in caplog.text and path in caplog.text
    assert os.path.exists(path + ".corrupt") and store.steps() == [10]


class _Planted:
    """Unpickling this runs code (what a hostile file in the checkpoint directory would do)."""

    def __reduce__(self):
        return (os.system, ("touch planted-ran",))


def test_a_planted_checkpoint_with_a_valid_header_is_refused_not_run(tmp_path, monkeypatch):
    import hashlib
    import io
    monkeypatch.chdir(tmp_path)
    store = CheckpointStore(str(tmp_path / "ck"), keep=3)
    store.save(10, _state(10))
    buf = io.BytesIO()
    torch.save({"step": 20, "w": _Planted()}, buf)
    payload = buf.getvalue()
    (tmp_path / "ck" / "ckpt-000000020.pt").write_bytes(
        b"MLTCKPT1" + hashlib.sha256(payload).hexdigest().encode() + payload)
    got = store.restore()
    assert got.step == 10 and not (tmp_path / "planted-ran").exists()
    assert os.path.exists(store.path(20) + ".corrupt")


def test_stale_temporary_and_old_quarantined_files_are_pruned(tmp_path):
    store = CheckpointStore(str(tmp_path), keep=2)
    stale = tmp_path / "ckpt-000000001.pt.tmp.999999"
    fresh = tmp_path / "ckpt-000000002.pt.tmp.999998"
    for p in (stale, fresh):
        p.write_bytes(b"partial")
    os.utime(stale, (time.time() - 3600, time.time() - 3600))
    for step in (3, 4, 5):
        (tmp_path / f"ckpt-00000000{step}.pt.corrupt").write_bytes(b"x")
    store.save(10, _state(10))
    names = sorted(os.listdir(tmp_path))
    assert names == ["ckpt-000000002.pt.tmp.999998", "ckpt-000000004.pt.corrupt",
                     "ckpt-000000005.pt.corrupt", "ckpt-000000010.pt"]


def test_no_valid_checkpoint_means_a_fresh_start(tmp_path, caplog):
    store = CheckpointStore(str(tmp_path))
    assert store.restore() is None
    (tmp_path / "ckpt-000000005.pt").write_bytes(b"garbage")
    with caplog.at_level(logging.WARNING, logger="malletrain.runtime"):
        assert store.restore() is None
    assert "starting from scratch" in caplog.text


# ---------------------------------------------------------------- consistency matrix
@pytest.fixture(scope="module")
def launcher():
    return Launcher(workers=4, mode="consistency", timeout_s=240)


@pytest.fixture(scope="module")
def reference(launcher, tmp_path_factory):
    d = str(tmp_path_factory.mktemp("ref"))
    return launcher.run(Plan("P=1", (1,)), 24, d).sha256


@pytest.mark.slow
@pytest.mark.parametrize("plan", [
    Plan("P=2", (2,)), Plan("P=3", (3,)), Plan("P=4", (4,)),
    Plan("P=3 round robin", (3,), mapping="round_robin"),
    Plan("P=2 uneven", (2,), mapping="[[0, 1, 2], [3]]"),
    Plan("P=2 worker 0 not on rank 0", (2,), mapping="[[3], [0, 1, 2]]"),
], ids=lambda p: p.label)
def test_parameters_are_bitwise_equal_for_every_process_count(launcher, reference, tmp_path, plan):
    assert launcher.run(plan, 24, str(tmp_path)).sha256 == reference


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_random_rescale_schedules_give_the_same_parameters(launcher, reference, tmp_path, seed):
    rng = random.Random(seed)
    sched = tuple(rng.randint(1, 4) for _ in range(rng.randint(3, 4)))
    out = launcher.run(Plan(f"rescale {sched}", sched), 24, str(tmp_path))
    assert out.launches == len(sched) and out.sha256 == reference, sched


@pytest.mark.slow
def test_kill9_and_resume_gives_the_same_parameters(launcher, reference, tmp_path):
    out = launcher.run(Plan("kill", (3, 2), kill_segment=1), 24, str(tmp_path))
    assert out.launches == 3 and "SIGKILL 2 process(es)" in out.notes[0], out.notes
    assert out.sha256 == reference


@pytest.mark.slow
def test_negative_control_tolerance_mode_differs(tmp_path):
    """The comparison can fail: the native all-reduce (per-process batches) changes the bits."""
    tol = Launcher(workers=4, mode="tolerance", timeout_s=240)
    a = tol.run(Plan("P=1", (1,)), 24, str(tmp_path / "a")).sha256
    b = tol.run(Plan("P=3", (3,)), 24, str(tmp_path / "b")).sha256
    assert a != b


@pytest.mark.slow
def test_mpi_launch_trains_the_same_parameters(reference, tmp_path):
    mpiexec = shutil.which("mpiexec", path=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    assert mpiexec, "mpiexec (pip package mpich, in the test extra) not found"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR")}
    env["MASTER_PORT"] = str(free_port())
    out = subprocess.run([mpiexec, "-n", "2", sys.executable, "-m", "malletrain.runtime.reference",
                          "--dir", str(tmp_path), "--until", "24"], env=env, capture_output=True,
                         text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "(mpi, gloo)" in out.stderr
    assert out.stdout.split()[1] == reference


# ---------------------------------------------------------------- signal -> checkpoint -> exit
def _start_long(launcher, tmp_path, procs, env_extra, sleep_s=0.05):
    metrics = str(tmp_path / "m.jsonl")
    ps = launcher.start(procs, str(tmp_path / "ck"), 100000, extra=["--step-sleep-s", str(sleep_s)],
                        env={**env_extra, "MALLETRAIN_METRICS": metrics})
    return ps, metrics


@pytest.mark.slow
@pytest.mark.parametrize("who", ["all", "rank1"])
def test_signal_checkpoints_at_a_step_boundary_and_exits_within_grace(tmp_path, who, launcher):
    ps, metrics = _start_long(launcher, tmp_path, 2, {"MALLETRAIN_GRACE_S": "10"})
    wait_step(metrics, 5)
    t0 = time.time()
    targets = ps if who == "all" else ps[1:]       # only one process signalled: all must stop
    for p in targets:
        p.send_signal(signal.SIGTERM)
    for p in ps:
        p.wait(timeout=30)
    took = time.time() - t0
    assert [p.returncode for p in ps] == [3, 3]   # EXIT_STOPPED: checkpointed, not finished
    assert took < 10, f"exit took {took:.1f}s, grace is 10s"
    exit_rec = [r for r in progress_records(metrics) if r["event"] == "exit"][-1]
    assert exit_rec["reason"] == "signal"
    if who == "all":
        assert exit_rec["signal"] == "SIGTERM" and exit_rec["signal_to_exit_s"] < 10
    else:   # rank 0 (which writes the records) never saw a signal but stopped at the same step
        assert exit_rec["signal"] is None
        err = ps[1].stderr.read()
        assert f"SIGTERM -> checkpoint of step {exit_rec['step']}" in err and "within the 10s" in err
    store = CheckpointStore(str(tmp_path / "ck"))
    assert store.steps()[0] == exit_rec["step"]
    assert any(r["event"] == "checkpoint" and r["step"] == exit_rec["step"] for r in progress_records(metrics))
    # resume on 3 processes to a later step == an uninterrupted run to that step
    end = exit_rec["step"] + 6
    resumed = launcher.run(Plan("resume", (3,)), end, str(tmp_path / "ck"))
    straight = launcher.run(Plan("straight", (1,)), end, str(tmp_path / "straight"))
    assert resumed.sha256 == straight.sha256


@pytest.mark.slow
def test_deadline_forces_the_checkpoint_of_the_last_boundary(tmp_path, launcher):
    # grace 0.2 s: the deadline (grace/2) has passed by the next step -> the step is abandoned
    ps, metrics = _start_long(launcher, tmp_path, 2, {"MALLETRAIN_GRACE_S": "0.2"}, sleep_s=0.5)
    wait_step(metrics, 3)
    for p in ps:
        p.send_signal(signal.SIGUSR2)
    for p in ps:
        p.wait(timeout=30)
    assert [p.returncode for p in ps] == [3, 3]   # EXIT_STOPPED: checkpointed, not finished
    exit_rec = [r for r in progress_records(metrics) if r["event"] == "exit"][-1]
    assert exit_rec["reason"] == "forced" and exit_rec["signal"] == "SIGUSR2"
    step = exit_rec["step"]
    assert CheckpointStore(str(tmp_path / "ck")).steps()[0] == step
    resumed = launcher.run(Plan("resume", (1,)), step + 4, str(tmp_path / "ck"))
    straight = launcher.run(Plan("straight", (2,)), step + 4, str(tmp_path / "straight"))
    assert resumed.sha256 == straight.sha256


# ---------------------------------------------------------------- --launch torchrun (no Slurm)
def _torchrun(procs, ckpt, until, *, sleep_s=0.0, metrics=None, grace_s=10):
    """The wrapper the torchrun launch runs on each node, here one node with ``procs`` workers."""
    env = {"MALLETRAIN_GRACE_S": str(grace_s), "PYTHONPATH": ROOT,
           **({"MALLETRAIN_METRICS": metrics} if metrics else {})}
    return torchrun(["-m", "malletrain.runtime.reference", "--dir", ckpt, "--until", str(until),
                     "--step-sleep-s", str(sleep_s)], procs, env=env)


def _sha(out: str) -> str:
    return next(line.split()[1] for line in out.splitlines() if line.startswith("sha256 "))


@pytest.mark.slow
def test_torchrun_launch_trains_the_same_parameters_and_stops_on_the_signal(reference, tmp_path):
    """Under torchrun (3 workers) the parameters are bitwise those of one process.  SIGTERM to the
    agent (what srun forwards to it): the workers checkpoint at a step boundary and the launch
    exits 3, so the batch script requeues; kill -9 of one worker exits 128+9; each resumes on
    another worker count to the uninterrupted run's parameters."""
    p = _torchrun(3, str(tmp_path / "a"), 24)
    out, err = p.communicate(timeout=240)
    assert p.returncode == 0, err[-3000:]
    assert _sha(out) == reference and "(torchrun, gloo)" in err
    # the stop signal
    metrics = str(tmp_path / "m.jsonl")
    p = _torchrun(2, str(tmp_path / "b"), 100000, sleep_s=0.05, metrics=metrics)
    wait_step(metrics, 5)
    t0 = time.time()
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 3, err[-3000:]
    assert time.time() - t0 < 10
    stop = [r for r in progress_records(metrics) if r["event"] == "exit"][-1]
    assert stop["reason"] == "signal" and CheckpointStore(str(tmp_path / "b")).steps()[0] == stop["step"]
    end = stop["step"] + 6
    p = _torchrun(3, str(tmp_path / "b"), end)
    resumed, err = p.communicate(timeout=240)
    assert p.returncode == 0, err[-3000:]
    straight = subprocess.run([sys.executable, "-m", "malletrain.runtime.reference", "--dir", str(tmp_path / "s"),
                               "--until", str(end)], capture_output=True, text=True, timeout=240,
                              env={**os.environ, "PYTHONPATH": ROOT})
    assert _sha(resumed) == _sha(straight.stdout)
    # kill -9 of one worker
    metrics = str(tmp_path / "k.jsonl")
    p = _torchrun(2, str(tmp_path / "c"), 100000, sleep_s=0.05, metrics=metrics)
    wait_step(metrics, 5)
    workers = subprocess.run(["pgrep", "-f", f"reference --dir {tmp_path / 'c'}"], capture_output=True,
                             text=True).stdout.split()
    workers = [w for w in workers if int(w) != p.pid]
    assert workers
    os.kill(int(workers[-1]), signal.SIGKILL)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 128 + signal.SIGKILL, err[-3000:]
    p = _torchrun(1, str(tmp_path / "c"), 24)
    out, err = p.communicate(timeout=240)
    assert p.returncode == 0 and _sha(out) == reference, err[-3000:]
