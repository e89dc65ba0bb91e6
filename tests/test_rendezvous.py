"""The training rendezvous is authenticated and no rank unpickles what a peer sends.

The handshake's pure parts run here against an in-memory store (fast tier); the tests
marked ``torch`` start real gloo processes on 127.0.0.1: an impostor in rank 1's place
(the runtime's own code, without the job's key, sending a pickle that would create a
file when unpickled) and an audit hook that fails any unpickling in an honest run.
"""
from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from malletrain.runtime import rendezvous as rdzv
from malletrain.runtime.rendezvous import RendezvousError, handshake


class MemStore:
    """c10d's store semantics that the handshake uses: set overwrites, get waits for the key."""

    def __init__(self, timeout_s: float = 5.0) -> None:
        self.data: dict[str, bytes] = {}
        self.cv = threading.Condition()
        self.timeout_s = timeout_s

    def set(self, key, value):
        with self.cv:
            self.data[key] = value.encode() if isinstance(value, str) else bytes(value)
            self.cv.notify_all()

    def get(self, key):
        with self.cv:
            if not self.cv.wait_for(lambda: key in self.data, self.timeout_s):
                raise RuntimeError(f"timeout waiting for {key}")
            return self.data[key]


def _run_ranks(targets):
    """Run each (name, fn) in a thread; {name: result or exception}."""
    out: dict = {}

    def call(name, fn):
        try:
            out[name] = fn()
        except Exception as exc:   # noqa: BLE001 - collected for the assertions
            out[name] = exc
    threads = [threading.Thread(target=call, args=t) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


def test_honest_ranks_agree_and_the_key_is_private_and_gone(tmp_path):
    store = MemStore()
    seen_modes = []
    write = rdzv.write_secret

    def spy(dfd, **kw):
        ident, secret = write(dfd, **kw)
        seen_modes.append(os.stat(f"key-{ident}", dir_fd=dfd).st_mode)
        return ident, secret
    rdzv.write_secret = spy
    try:
        got = _run_ranks([(r, lambda r=r: handshake(store, r, 3, str(tmp_path / "ck"), 5.0))
                          for r in range(3)])
    finally:
        rdzv.write_secret = write
    assert all(isinstance(p, rdzv.Proof) for p in got.values()), got
    assert len({p.prefix for p in got.values()}) == 1
    assert all(p.peer_token(1) == got[0].peer_token(1) for p in got.values())
    assert stat.S_IMODE(seen_modes[0]) == 0o600
    d = tmp_path / "ck" / rdzv.DIR_NAME
    assert stat.S_IMODE(os.stat(d).st_mode) == 0o700
    assert os.listdir(d) == []                       # the key is removed once all proved it
    assert not any(got[0].secret.hex().encode() in v for v in store.data.values())   # never in the store
    assert got[0].prefix[len("malletrain/pg/"):-1] not in str(store.data)


def test_a_rank_without_the_key_is_refused(tmp_path):
    store = MemStore(timeout_s=2.0)
    got = _run_ranks([(0, lambda: handshake(store, 0, 2, str(tmp_path / "job"), 2.0)),
                      (1, lambda: handshake(store, 1, 2, str(tmp_path / "elsewhere"), 1.0))])
    assert isinstance(got[1], RendezvousError) and "no rendezvous key" in str(got[1])
    assert isinstance(got[0], RendezvousError)
    assert os.listdir(tmp_path / "job" / rdzv.DIR_NAME) == []


def test_a_forged_proof_is_refused_by_rank_0(tmp_path):
    store = MemStore(timeout_s=3.0)

    def impostor():     # knows the protocol and the id, not the secret
        store.get(rdzv.NS + "c/0")
        store.set(rdzv.NS + "c/1", "ab" * 16)
        store.set(rdzv.NS + "p/1", "cd" * 32)
    got = _run_ranks([(0, lambda: handshake(store, 0, 2, str(tmp_path), 3.0)), ("x", impostor)])
    assert isinstance(got[0], RendezvousError) and "rank 1 did not prove" in str(got[0])
    assert rdzv.NS + "a/1" not in store.data          # rank 0 answered nobody


def test_a_store_that_is_not_rank_0s_is_refused(tmp_path):
    """Someone listening on the port first: it can copy ids and echo proofs, never answer."""
    store = MemStore(timeout_s=3.0)
    key_dir = tmp_path / "ck"
    dfd = rdzv.open_private_dir(str(key_dir))
    stale_id, _ = rdzv.write_secret(dfd)        # a real key file (an earlier run's), id seen before
    os.close(dfd)

    def fake_root():
        store.set(rdzv.NS + "id", stale_id)
        store.set(rdzv.NS + "c/0", "ef" * 16)
        proof = store.get(rdzv.NS + "p/1").decode()
        store.set(rdzv.NS + "a/1", proof)          # echo: the best it can do without the key
    got = _run_ranks([(1, lambda: handshake(store, 1, 2, str(key_dir), 3.0)), ("x", fake_root)])
    assert isinstance(got[1], RendezvousError) and "did not prove" in str(got[1])


@pytest.mark.parametrize("bad", ["group", "symlink", "garbage_id"])
def test_key_directory_and_id_are_checked(tmp_path, bad):
    store = MemStore(timeout_s=1.0)
    parent = tmp_path / "ck"
    parent.mkdir()
    d = parent / rdzv.DIR_NAME
    if bad == "group":
        d.mkdir()
        os.chmod(d, 0o770)
    elif bad == "symlink":
        (tmp_path / "theirs").mkdir(mode=0o700)
        os.symlink(tmp_path / "theirs", d)
    else:
        store.set(rdzv.NS + "id", "../../../etc/passwd")
    with pytest.raises(RendezvousError) as err:
        handshake(store, 1, 2, str(parent), 1.0)
    assert {"group": "must be yours and private", "symlink": "cannot open",
            "garbage_id": "malformed"}[bad] in str(err.value)


def test_stale_keys_are_pruned(tmp_path):
    dfd = rdzv.open_private_dir(str(tmp_path))
    try:
        old, _ = rdzv.write_secret(dfd)
        os.utime(f"key-{old}", (0, 0), dir_fd=dfd)
        new, _ = rdzv.write_secret(dfd)
        assert os.listdir(dfd) == [f"key-{new}"]
    finally:
        os.close(dfd)


# ---------------------------------------------------------------- real processes (torch, gloo)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# An attacker in rank 1's place: the runtime's own reference training, in its own directory
# (it never saw the job's key), that sends a pickle instead of its RNG states.
IMPOSTOR = textwrap.dedent("""
    import os, runpy, sys
    import torch.distributed as dist
    CANARY = os.environ["CANARY"]

    class Evil:
        def __reduce__(self):
            return (open, (CANARY, "w"))

    real = dist.all_gather_object
    dist.all_gather_object = lambda out, obj, *a, **k: real(out, Evil(), *a, **k)
    sys.argv = ["reference"] + sys.argv[1:]
    runpy.run_module("malletrain.runtime.reference", run_name="__main__")
""")

PLAIN = textwrap.dedent("""
    import runpy, sys
    sys.argv = ["reference"] + sys.argv[1:]
    runpy.run_module("malletrain.runtime.reference", run_name="__main__")
""")

# An honest rank that fails on any unpickling of a class (what a peer's pickle needs)
AUDITED = textwrap.dedent("""
    import runpy, sys
    def hook(event, args):
        if event == "pickle.find_class":
            raise RuntimeError(f"unpickled {args}")
    sys.addaudithook(hook)
    sys.argv = ["reference"] + sys.argv[1:]
    runpy.run_module("malletrain.runtime.reference", run_name="__main__")
""")


def _spawn(code_by_rank, args_by_rank, env):
    from malletrain.runtime.selfcheck import free_port
    port = free_port()
    base = {k: v for k, v in os.environ.items() if k != "MALLETRAIN_METRICS"}
    return [subprocess.Popen([sys.executable, "-c", code, *args], cwd=ROOT, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env={**base, "RANK": str(r), "WORLD_SIZE": str(len(code_by_rank)),
                                  "LOCAL_RANK": str(r), "MASTER_ADDR": "127.0.0.1",
                                  "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1", **env})
            for r, (code, args) in enumerate(zip(code_by_rank, args_by_rank))]


def _finish(ps, timeout_s=120):
    deadline = time.monotonic() + timeout_s
    out = []
    for p in ps:
        try:
            o, e = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in ps:
                q.kill()
            raise
        out.append((p.returncode, o, e))
    return out


@pytest.mark.torch
def test_an_impostor_rank_cannot_join_or_run_code(tmp_path):
    canary = tmp_path / "pwned"
    args = ["--until", "4", "--every", "2"]
    ps = _spawn([PLAIN, IMPOSTOR],
                [["--dir", str(tmp_path / "job"), *args], ["--dir", str(tmp_path / "attacker"), *args]],
                {"CANARY": str(canary), "MALLETRAIN_COLLECTIVE_TIMEOUT_S": "8"})
    (rc0, out0, err0), (rc1, _, err1) = _finish(ps)
    assert not canary.exists(), "rank 0 unpickled the impostor's object: code ran as the job's owner"
    assert rc0 != 0 and "sha256" not in out0, "rank 0 trained with a process that lacks the job's key"
    assert "RendezvousError" in err0 and "rank 1" in err0, err0[-2000:]
    assert "owns logical workers" not in err0
    assert rc1 != 0


@pytest.mark.torch
def test_no_rank_unpickles_peer_data(tmp_path):
    """Checkpoints gather every worker's RNG state across ranks: as tensors, not pickles."""
    ps = _spawn([AUDITED, AUDITED], [["--dir", str(tmp_path), "--until", "4", "--every", "2"]] * 2,
                {"MALLETRAIN_COLLECTIVE_TIMEOUT_S": "60"})
    res = _finish(ps)
    assert [rc for rc, _, _ in res] == [0, 0], res[0][2][-2000:] + res[1][2][-2000:]
    assert res[0][1].startswith("sha256 ")
    assert os.listdir(tmp_path / rdzv.DIR_NAME) == []


def test_collective_timeout_comes_from_the_environment_and_is_checked():
    from malletrain.domain.errors import ConfigError
    from malletrain.runtime.config import RuntimeConfig
    cfg = RuntimeConfig.from_env({"MALLETRAIN_COLLECTIVE_TIMEOUT_S": "8"}, checkpoint_dir="c")
    assert cfg.collective_timeout_s == 8.0
    for bad in ("soon", "0", "nan", "-1"):
        with pytest.raises(ConfigError, match="collective_timeout_s"):
            RuntimeConfig.from_env({"MALLETRAIN_COLLECTIVE_TIMEOUT_S": bad}, checkpoint_dir="c")
