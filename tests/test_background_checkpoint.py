"""Checkpoints as durability only (issue #26): periodic checkpoints copied at a step boundary and
written by a thread while training goes on, bitwise the same as synchronous ones; the checkpoint
of a stop or of the end waits for them."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

pytestmark = pytest.mark.torch
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_a_snapshot_is_a_copy_training_cannot_change():
    import torch

    from malletrain.runtime.checkpoint import snapshot
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 1, "rng": {0: (1, 2)}}
    copy = snapshot(state)
    before = {k: v.clone() for k, v in copy["model"].items()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    opt.state_dict()["param_groups"][0]["lr"] = 7.0
    assert all(torch.equal(copy["model"][k], before[k]) for k in before)
    assert not torch.equal(copy["model"]["weight"], model.state_dict()["weight"])
    assert copy["optimizer"]["param_groups"][0]["lr"] == 0.1 and copy["rng"] == {0: (1, 2)}


def test_a_background_save_lands_whole_and_a_failed_one_says_so(tmp_path):
    import torch

    from malletrain.runtime.checkpoint import BackgroundSave, CheckpointStore
    store = CheckpointStore(str(tmp_path / "ckpt"))
    gate = threading.Event()
    real = store.save

    def slow(step, state):
        gate.wait(30)
        return real(step, state)
    store.save = slow
    done = []
    bg = BackgroundSave(store, 7, {"step": 7, "w": torch.arange(4.0)}, done.append)
    assert bg.running() and store.steps() == []          # the caller goes on while it writes
    gate.set()
    assert bg.wait() and [s.step for s in done] == [7] and store.steps() == [7]
    assert torch.equal(store.restore(quarantine=False).state["w"], torch.arange(4.0))

    def broken(step, state):
        raise OSError(28, "No space left on device")
    store.save = broken
    assert BackgroundSave(store, 8, {"step": 8}).wait() is False


def _run(tmp_path, name, background):
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT")}
    env.update(RANK="0", WORLD_SIZE="1", OMP_NUM_THREADS="1", PYTHONPATH=ROOT,
               MALLETRAIN_METRICS=str(tmp_path / f"{name}.jsonl"))
    out = subprocess.run([sys.executable, "-m", "malletrain.runtime.reference", "--dir", str(tmp_path / name),
                          "--until", "40", "--every", "5", "--report-s", "0", "--background-checkpoints", background],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    recs = [json.loads(x) for x in (tmp_path / f"{name}.jsonl").read_text().splitlines()]
    return out.stdout.split()[1], [r for r in recs if r["event"] == "checkpoint"]


def test_background_checkpoints_hold_the_same_bits_as_synchronous_ones(tmp_path):
    import torch

    from malletrain.runtime.checkpoint import CheckpointStore
    sha_sync, sync = _run(tmp_path, "sync", "off")
    sha_bg, bg = _run(tmp_path, "bg", "on")
    assert sha_sync == sha_bg
    assert [r["step"] for r in sync] == [5, 10, 15, 20, 25, 30, 35, 40]
    assert not any(r.get("background") for r in sync)
    assert bg and all(r.get("background") and r["step"] % 5 == 0 for r in bg)
    # the last one (the end, due at step 40 too) was waited for before the exit
    assert bg[-1]["step"] == 40 and CheckpointStore(str(tmp_path / "bg")).steps()[0] == 40
    a, b = CheckpointStore(str(tmp_path / "sync")), CheckpointStore(str(tmp_path / "bg"))
    for step in set(a.steps()) & set(b.steps()):
        x, y = a.restore_step(step).state, b.restore_step(step).state
        assert all(torch.equal(x["model"][k], y["model"][k]) for k in x["model"]), step
        assert x["step"] == y["step"] == step
