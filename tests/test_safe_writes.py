"""The runtime and the CLI write under predictable names in directories a teammate may share:
no write follows a symlink planted there (into the victim's own files), new files are created
``O_EXCL``, and what is private stays private (checkpoints, batch scripts, campaign state)
whatever the umask; progress files stay 0644 (the daemon, another account, reads them).

Each planted symlink points at a "victim" file of the writing user (say ``~/.bashrc``): the
write must leave it as it was."""
from __future__ import annotations

import json
import os
import stat

import pytest

from malletrain import campaign
from malletrain.cli.main import main
from malletrain.domain.safefile import UnsafeFile, open_append, write_atomic
from malletrain.runtime.metrics import MetricsWriter

VICTIM = "export PATH=/usr/bin\n"


@pytest.fixture
def victim(tmp_path):
    p = tmp_path / "home" / ".bashrc"
    p.parent.mkdir()
    p.write_text(VICTIM)
    return p


@pytest.fixture
def umask():
    old = os.umask(0o022)
    try:
        yield os.umask
    finally:
        os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


# ---------------------------------------------------------------- progress file (runtime, rank 0)
def _write_records(path, n=3):
    w = MetricsWriter(str(path), base={"job": "17"}, min_interval_s=0.0)
    for i in range(n):
        w.record("checkpoint", step=i)
    w.close()
    return w


def test_progress_file_is_not_written_through_a_planted_symlink(tmp_path, victim):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.symlink(victim, shared / "17.jsonl")         # the teammate knows the job id
    w = _write_records(shared / "17.jsonl")
    assert victim.read_text() == VICTIM
    assert w.written == 0 and w.dropped == 3


def test_progress_file_is_0644_whatever_the_umask(tmp_path, umask):
    umask(0o002)                                    # a group-writable file: the daemon refuses it
    _write_records(tmp_path / "a.jsonl")
    assert mode(tmp_path / "a.jsonl") == 0o644
    umask(0o077)                                    # private: the daemon could not read it
    _write_records(tmp_path / "b.jsonl")
    assert mode(tmp_path / "b.jsonl") == 0o644
    (tmp_path / "c.jsonl").write_text('{"event":"start"}\n')     # an earlier run's, appended to
    os.chmod(tmp_path / "c.jsonl", 0o664)
    _write_records(tmp_path / "c.jsonl", n=1)
    assert mode(tmp_path / "c.jsonl") == 0o644
    assert len((tmp_path / "c.jsonl").read_text().splitlines()) == 2


def test_open_append_refuses_fifos_hard_links_and_symlinks(tmp_path, victim):
    os.mkfifo(tmp_path / "fifo")
    os.link(victim, tmp_path / "hard")
    os.symlink(victim, tmp_path / "soft")
    for name in ("fifo", "hard", "soft"):
        with pytest.raises(UnsafeFile):
            open_append(str(tmp_path / name))
    assert victim.read_text() == VICTIM


# ---------------------------------------------------------------- campaign state and trial params
BASE = """
name: t
command: [python3, train.py]
dir: out
search: random
trials: 2
seed: 3
space:
  lr: {log_uniform: [0.001, 0.1]}
"""


def test_campaign_state_is_not_written_through_a_planted_temp_name(tmp_path, victim, umask):
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(BASE)
    spec = campaign.load_spec(str(spec_path))
    os.makedirs(spec.dir)
    os.symlink(victim, os.path.join(spec.dir, "campaign.json.tmp"))      # the old fixed temp name
    os.makedirs(os.path.join(spec.dir, "t000"))
    os.symlink(victim, os.path.join(spec.dir, "t000", "params.json"))
    jobs = iter(["101", "102"])
    campaign.submit_campaign(spec, lambda name, cmd, token: next(jobs), lambda i: f"k{i}")
    assert victim.read_text() == VICTIM
    st = campaign.load_state(spec)
    assert [t["job"] for t in st["trials"]] == ["101", "102"]
    assert mode(campaign.state_path(spec)) == 0o600
    params = os.path.join(spec.dir, "t000", "params.json")
    assert not os.path.islink(params) and json.loads(open(params).read()) == st["trials"][0]["params"]
    assert mode(os.path.join(spec.dir, "t001")) == 0o700
    assert not [n for n in os.listdir(spec.dir) if ".tmp." in n]       # no temp file left behind


def test_write_atomic_leaves_nothing_behind_on_failure(tmp_path):
    (tmp_path / "x.json").mkdir()                   # the rename over it fails
    (tmp_path / "x.json" / "keep").write_text("")
    with pytest.raises(OSError):
        write_atomic(str(tmp_path / "x.json"), b"{}", 0o600)
    assert sorted(os.listdir(tmp_path)) == ["x.json"]


# ---------------------------------------------------------------- batch script and metrics dir
def _invoke(capsys, *argv):
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:
        code = exc.code
    cap = capsys.readouterr()
    return code, cap.out, cap.err


@pytest.fixture
def fake_sbatch(monkeypatch, tmp_path):
    from malletrain.slurm import submit
    seen = {}

    def fake(runner, argv, token, partition, **kw):
        seen["script"] = argv[-1]
        seen["text"] = open(argv[-1]).read()
        return "4242"
    monkeypatch.setattr(submit, "submit", fake)
    cfg = tmp_path / "c.yaml"
    cfg.write_text("slurm:\n  partition: scavenger\n")
    return seen, cfg


def test_batch_script_is_private_and_not_written_through_a_symlink(tmp_path, capsys, monkeypatch,
                                                                  fake_sbatch, victim, umask):
    seen, cfg = fake_sbatch
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    monkeypatch.setattr("uuid.uuid4", lambda: type("U", (), {"hex": "ab" * 16})())   # a known token
    os.symlink(victim, metrics / f"job-{'ab' * 8}.sbatch")
    code, out, err = _invoke(capsys, "submit", "--config", cfg, "--metrics-dir", metrics, "--", "true")
    assert code == 0, err
    assert victim.read_text() == VICTIM
    assert seen["script"] == str(metrics / f"job-{'ab' * 8}.sbatch")
    assert not os.path.islink(seen["script"]) and "srun" in seen["text"]
    assert mode(seen["script"]) == 0o700


def test_a_metrics_directory_others_may_write_is_refused(tmp_path, capsys, fake_sbatch):
    seen, cfg = fake_sbatch
    shared = tmp_path / "team"
    shared.mkdir()
    os.chmod(shared, 0o775)
    code, _, err = _invoke(capsys, "submit", "--config", cfg, "--metrics-dir", shared, "--", "true")
    assert code == 2 and "Traceback" not in err, err
    assert str(shared) in err and "written by others" in err and "0775" in err
    assert "script" not in seen and os.listdir(shared) == []


def test_a_new_metrics_directory_is_0755_whatever_the_umask(tmp_path, capsys, fake_sbatch, umask):
    seen, cfg = fake_sbatch
    umask(0o077)                 # 0700 would keep the daemon (another account) out
    code, _, err = _invoke(capsys, "submit", "--config", cfg, "--metrics-dir", tmp_path / "m", "--", "true")
    assert code == 0, err
    assert mode(tmp_path / "m") == 0o755


# ---------------------------------------------------------------- checkpoints (torch)
@pytest.mark.torch
def test_checkpoints_are_private_and_not_written_through_planted_temp_names(tmp_path, victim, umask):
    import torch

    from malletrain.runtime.checkpoint import CheckpointStore
    store = CheckpointStore(str(tmp_path / "ck"))
    os.makedirs(store.directory, mode=0o755)        # a directory a teammate can read
    os.chmod(store.directory, 0o755)
    for step in (1, 2):                             # the old temp names: <final>.tmp.<pid>
        os.symlink(victim, f"{store.path(step)}.tmp.{os.getpid()}")
    store.save(1, {"w": torch.ones(3)})
    store.save(2, {"w": torch.ones(3)})
    assert victim.read_text() == VICTIM
    assert mode(store.path(2)) == 0o600 and not os.path.islink(store.path(2))
    assert store.restore().step == 2
    fresh = CheckpointStore(str(tmp_path / "new"))
    fresh.save(1, {"w": torch.ones(3)})
    assert mode(fresh.directory) == 0o700


@pytest.mark.torch
def test_a_symlinked_or_fifo_checkpoint_is_skipped_not_followed(tmp_path):
    import torch

    from malletrain.runtime.checkpoint import CheckpointStore
    store = CheckpointStore(str(tmp_path / "ck"))
    store.save(1, {"w": torch.ones(3)})
    os.symlink(store.path(1), store.path(5))        # valid content, but through a symlink
    os.mkfifo(store.path(7))                        # would block a plain open() forever
    got = store.restore()
    assert got is not None and got.step == 1
    assert os.path.exists(store.path(5) + ".corrupt") and os.path.exists(store.path(7) + ".corrupt")
