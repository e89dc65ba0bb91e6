"""Elastic jobs (issue #26): members leave and join without restarting the others.

Real PyTorch (CPU, gloo) and real processes; the agreement's logic alone is in
tests/test_membership.py (fast tier).
"""
import datetime
import io
import os
import signal
import time

import pytest

pytestmark = pytest.mark.torch
torch = None


@pytest.fixture(autouse=True)
def _torch():
    global torch
    import torch as module  # the test extra installs torch: a missing torch fails, never skips
    torch = module


# ---- the store: c10d's FileStore answers as the dictionary store of the fast tier --------------
def test_filestore_compare_set_answers_as_the_fast_tiers_store(tmp_path):
    import torch.distributed as dist

    from tests.test_membership import DictStore
    real, fake = dist.FileStore(str(tmp_path / "s"), -1), DictStore()
    for key, expected, desired in [("k", "", "a"), ("k", "", "b"), ("k", "a", "c"), ("k", "zz", "d")]:
        assert real.compare_set(key, expected, desired) == fake.compare_set(key, expected, desired)
    assert real.add("n", 2) == fake.add("n", 2) == 2
    assert real.check(["k", "n"]) and not real.check(["missing"])


# ---- the state on the wire ---------------------------------------------------------------------
def _state():
    from malletrain.runtime.reference import make_model, make_optim
    torch.manual_seed(0)
    model = make_model()
    opt, sched = make_optim(model)
    model(torch.randn(4, 1, 8, 8)).sum().backward()
    opt.step()
    sched.step()
    return {"step": 7, "model": model.state_dict(), "optimizer": opt.state_dict(),
            "scheduler": sched.state_dict(),
            "rng": {0: {"cpu": torch.get_rng_state()}, 3: {"cpu": torch.get_rng_state()}},
            "mode": "consistency", "nan": float("nan"), "t": (1, 2.5, None, True)}


def _equal(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and a != a:
        return isinstance(b, float) and b != b
    return a == b and type(a) is type(b)


def test_a_state_crosses_the_wire_exactly_and_deterministically():
    from malletrain.runtime import wire
    st = _state()
    blob = wire.encode(st)
    assert _equal(wire.decode(blob), st)
    assert wire.digest(blob) == wire.digest(wire.encode(_state()))     # equal states, equal bytes
    assert isinstance(next(iter(wire.decode(blob)["rng"])), int)       # int keys stay ints


@pytest.mark.parametrize("damage", ["truncate", "header", "bounds", "dtype", "dtype-list", "overlap",
                                    "trailing", "pickle", "huge"])
def test_damaged_state_bytes_are_refused(damage):
    from malletrain.runtime import wire
    blob = wire.encode({"w": torch.arange(6.0)})
    raw = bytearray(blob.numpy().tobytes())
    hlen = int.from_bytes(raw[:8], "little")
    head = raw[8:8 + hlen].decode()
    if damage == "truncate":
        raw = raw[:-3]
    elif damage == "header":
        raw[8] = ord("!")
    elif damage in ("bounds", "dtype", "dtype-list", "overlap", "trailing"):
        new = head.replace('"float32",[6],0,24', {
            "bounds": '"float32",[6],0,2400', "dtype": '"object",[6],0,24',
            "dtype-list": '["float32"],[6],0,24',
            # two tensors on one span: an allocation the body does not pay for
            "overlap": '"float32",[6],0,24],["float32",[6],0,24'}.get(damage, '"float32",[6],0,24'))
        if damage == "overlap":
            new = new.replace('"tree":{"dict":[["w",{"t":0}]]}', '"tree":{"dict":[["w",{"t":0}],["v",{"t":1}]]}')
        body = raw[8 + hlen:] + (b"\0\0\0\0" if damage == "trailing" else b"")
        raw = bytearray(len(new).to_bytes(8, "little")) + new.encode() + body
    elif damage == "pickle":
        buf = io.BytesIO()
        torch.save({"w": 1}, buf)
        raw = bytearray(buf.getvalue())
    elif damage == "huge":
        raw[:8] = (1 << 40).to_bytes(8, "little")
    with pytest.raises(wire.WireError):
        wire.decode(torch.frombuffer(raw, dtype=torch.uint8))


def test_values_the_wire_does_not_carry_are_refused():
    from malletrain.runtime import wire
    with pytest.raises(wire.WireError, match="function"):
        wire.encode({"f": len})
    with pytest.raises(wire.WireError, match="key"):
        wire.encode({(1, 2): 3})


# ---- members as processes ----------------------------------------------------------------------
def test_members_leave_join_and_die_and_the_result_is_the_uninterrupted_runs_bits(tmp_path):
    """Three members; one leaves (SIGTERM, exit 3), a new one joins and gets the state, one is
    killed with SIGKILL mid-training: the survivors never restart, and the parameters at the end
    are bitwise those of one process trained without interruption."""
    from devtools.elastic_drill import Elastic, reference_sha
    until = 150
    ref = reference_sha(str(tmp_path), until)
    job = Elastic(str(tmp_path), until, timeout_s=10.0)
    try:
        for _ in range(3):
            job.start()
        job.wait_members(lambda ms: len(ms) == 3, "three members", 90)
        step = job.progress.wait_beyond(5, 60)
        leaver = job.running()[0]
        job.signal(leaver, signal.SIGTERM)
        assert job.wait_gone(leaver) == 3
        job.start()
        job.wait_members(lambda ms: len(ms) == 3, "three members again", 90)
        job.progress.wait_beyond(step + 10, 60)
        victim = job.running()[-1]
        job.signal(victim, signal.SIGKILL)
        job.wait_gone(victim)
        sha = job.finish(120)
    finally:
        job.kill_all()
    kinds = [r["kind"] for r in job.reforms()]
    assert {"shrink", "grow", "loss"} <= set(kinds), kinds
    assert sha == ref
    survivors = [m for m, rc, _ in job.exits if rc == 0]
    assert len(survivors) == 2
    for m in survivors:     # a survivor never restarted: one process, one founding or admission
        with open(tmp_path / f"member-{m}.log") as fh:
            log = fh.read()
        assert log.count("founds generation") + log.count("(join)") == 1


# ---- in one process: the fallback and the bounds -----------------------------------------------
def _runtime(tmp_path, **kw):
    from malletrain.runtime import Runtime, RuntimeConfig
    from malletrain.runtime.reference import make_data, make_model, make_optim
    cfg = RuntimeConfig(checkpoint_dir=str(tmp_path / "ck"), elastic=True, checkpoint_every_s=0.0,
                        logical_workers=4, micro_batch=8, **kw)
    rt = Runtime(cfg, member=0)
    torch.manual_seed(0)
    model = make_model()
    opt, sched = make_optim(model)
    return rt, model, opt, sched, make_data(0, 256)


def test_a_group_that_cannot_re_form_falls_back_to_a_checkpoint_and_a_requeue(tmp_path, monkeypatch):
    from malletrain.runtime import membership
    from malletrain.runtime.checkpoint import CheckpointStore
    from malletrain.runtime.elastic import ATTEMPTS, ElasticRuntime
    from malletrain.runtime.reference import loss_fn
    rt, model, opt, sched, data = _runtime(tmp_path)
    assert isinstance(rt, ElasticRuntime)
    rt.prepare(model, opt, sched, data=data)
    for _ in range(5):
        rt.train_step(loss_fn)
    tries = []
    monkeypatch.setattr(ElasticRuntime, "_form", lambda self, rnd, members: tries.append(rnd) or False)
    monkeypatch.setattr(membership, "decide", lambda store, ns, rnd, *a, **k: membership.Transition(
        rnd + 1, (0,), 0, (), ()))
    assert rt._settle(1, (0,)) is False
    assert len(tries) == ATTEMPTS
    assert rt.stopped == "lost"
    assert rt.close() == 3                               # requeued by the sbatch template
    assert CheckpointStore(str(tmp_path / "ck")).steps() == [5]


def test_a_joiner_a_live_group_never_admits_exits_to_be_requeued(tmp_path):
    import threading

    import torch.distributed as dist

    from malletrain.runtime import membership
    from malletrain.runtime.elastic import DIR_NAME
    d = tmp_path / "ck" / DIR_NAME
    d.mkdir(parents=True)
    os.chmod(d, 0o700)
    (d / "pulse").mkdir(mode=0o700)
    store = dist.FileStore(str(d / "store"), -1)
    store.set_timeout(datetime.timedelta(seconds=5))
    membership.claim(store, 9, 0, "")                  # member 9's generation: alive, never admits
    halt = threading.Event()

    def pulse():
        n = 0
        while not halt.is_set():
            n += 1
            membership.write_pulse(str(d), 9, n)
            halt.wait(0.05)
    t = threading.Thread(target=pulse, daemon=True)
    t.start()
    try:
        rt, model, opt, sched, data = _runtime(tmp_path, join_wait_s=1.5)
        t0 = time.monotonic()
        rt.prepare(model, opt, sched, data=data)
        assert 1.5 <= time.monotonic() - t0 < 10
        assert rt.stopped == "unadmitted" and list(rt.steps(10)) == []
        assert rt.close() == 3
    finally:
        halt.set()


def test_the_store_directory_must_be_private(tmp_path):
    from malletrain.domain.errors import InputError
    from malletrain.runtime.elastic import DIR_NAME
    (tmp_path / "ck" / DIR_NAME).mkdir(parents=True)
    os.chmod(tmp_path / "ck" / DIR_NAME, 0o777)
    with pytest.raises(InputError, match="private"):
        _runtime(tmp_path)


@pytest.mark.parametrize("kw,field", [({"mode": "tolerance"}, "elastic"), ({"mapping": ((0, 1), (2, 3))}, "mapping"),
                                      ({"pulse_s": 2.0}, "pulse_s")])
def test_settings_an_elastic_job_cannot_honour_are_refused(kw, field):
    from malletrain.domain.errors import ConfigError
    from malletrain.runtime import RuntimeConfig
    with pytest.raises(ConfigError) as err:
        RuntimeConfig(checkpoint_dir="x", elastic=True, **kw)
    assert err.value.field == field


def test_a_superseded_generation_stops_without_a_checkpoint(tmp_path):
    """Another member took the generation over (it judged this group dead): this group's
    rank 0 sees it at the next boundary, every member leaves, and nothing is written that
    would compete with the newer group's checkpoints."""
    from malletrain.runtime import membership
    from malletrain.runtime.checkpoint import CheckpointStore
    from malletrain.runtime.reference import loss_fn
    # the periodic checkpoint written in the foreground: the store is read right after step 3,
    # and a background write of step 2 may not have finished then (CI saw [] once)
    rt, model, opt, sched, data = _runtime(tmp_path, checkpoint_every_steps=2, background_checkpoints=False)
    rt.prepare(model, opt, sched, data=data)
    for _ in range(3):
        rt.train_step(loss_fn)
    assert CheckpointStore(str(tmp_path / "ck")).steps() == [2]
    gen, ns, text = membership.current_gen(rt.kv)
    assert membership.claim(rt.kv, 5, gen, text) is not None
    for _ in rt.steps(10):
        rt.train_step(loss_fn)
    assert rt.stopped == "lost" and rt.step == 4
    assert rt.close() == 3
    assert CheckpointStore(str(tmp_path / "ck")).steps() == [2]


def test_a_checkpoint_directory_others_may_write_is_refused(tmp_path):
    from malletrain.domain.errors import InputError
    (tmp_path / "ck").mkdir()
    os.chmod(tmp_path / "ck", 0o775)
    with pytest.raises(InputError, match="writable by no one else"):
        _runtime(tmp_path)
