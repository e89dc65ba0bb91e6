"""How long does re-forming a gloo process group in place take on this machine (issue #26)?

A feasibility probe, not the runtime: ``python -m devtools.reform_probe`` starts 4 training
processes (an MLP, gloo, CPU) around one TCPStore held by this process, and measures the pause
of the surviving ranks for each kind of change, done in place (no process restarts):

* ``shrink``: one rank leaves at a step boundary; the others destroy the group and build one of
  3 under a fresh key prefix;
* ``grow``: a process that already imported torch and built the model joins; the group of 4 is
  built and rank 0 sends it the parameters and the optimizer state (checked by SHA-256);
* ``loss``: one rank is killed with SIGKILL between steps; the survivors learn it from a failed
  collective (or its timeout), drop the partial step and re-form with 3.

Each pause is split into phases (agree, destroy, init, transfer, detect) and printed as a
table and JSON. What it cannot show here: NCCL's re-initialisation and the transfer cost of a
large model over a real network.
"""
from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import multiprocessing as mp
import os
import signal
import statistics
import sys
import time

STEPS_BETWEEN = 5


def _model():
    import torch
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))


def _flat(model, opt):
    import torch
    parts = [p.data.reshape(-1) for p in model.parameters()]
    for p in model.parameters():
        st = opt.state.get(p, {})
        if "exp_avg" in st:
            parts += [st["exp_avg"].reshape(-1), st["exp_avg_sq"].reshape(-1)]
    return torch.cat(parts)


def _sha(t) -> str:
    return hashlib.sha256(t.numpy().tobytes()).hexdigest()


def _worker(member: int, first_round: int, port: int, timeout_s: float, q) -> None:
    """One member: trains, and at each round the store names re-forms with whoever it lists."""
    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=60))
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(256, 64, generator=g), torch.randint(0, 10, (256,), generator=g)
    rnd, joined = first_round, False
    store.set(f"prepared/{member}", "1")
    while True:
        store.wait([f"round{rnd}"])
        plan = json.loads(store.get(f"round{rnd}").decode())
        if plan.get("end"):
            return
        if member not in plan["members"]:
            store.set(f"left{rnd}/{member}", "1")
            return
        rank, world = plan["members"].index(member), len(plan["members"])
        t0 = time.perf_counter()
        if dist.is_initialized():
            dist.destroy_process_group()
        t1 = time.perf_counter()
        dist.init_process_group("gloo", store=dist.PrefixStore(f"pg{rnd}/", store), rank=rank,
                                world_size=world, timeout=datetime.timedelta(seconds=timeout_s))
        t2 = time.perf_counter()
        if plan.get("new"):                    # state from rank 0 to everyone (joiners use it)
            if not joined:                     # a joiner: Adam's state exists after one step
                model(x[:1]).sum().backward()
                opt.step()
                opt.zero_grad()
            flat = _flat(model, opt)
            buf = flat.clone() if rank == 0 else torch.empty_like(flat)
            dist.broadcast(buf, 0)
            digest = torch.tensor(list(bytes.fromhex(_sha(buf))), dtype=torch.uint8)
            ref = digest.clone()
            dist.broadcast(ref, 0)
            assert torch.equal(ref, digest), "state hash differs"
            i = 0
            for p in model.parameters():
                n = p.numel()
                p.data.copy_(buf[i:i + n].view_as(p))
                i += n
                st = opt.state[p]
                st["exp_avg"].copy_(buf[i:i + n].view_as(p))
                st["exp_avg_sq"].copy_(buf[i + n:i + 2 * n].view_as(p))
                i += 2 * n
        t3 = time.perf_counter()
        joined = True
        lost = False
        store.set(f"ready{rnd}/{member}", "1")
        for _ in range(plan.get("steps", STEPS_BETWEEN)):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            try:
                for p in model.parameters():
                    dist.all_reduce(p.grad)
            except Exception:                  # noqa: BLE001 - a peer is gone: drop the step
                opt.zero_grad()
                lost = True
                break
            opt.step()
            opt.zero_grad()
        t4 = time.perf_counter()
        q.put({"round": rnd, "member": member, "rank": rank, "destroy_s": t1 - t0, "init_s": t2 - t1,
               "transfer_s": t3 - t2, "lost": lost, "detect_s": t4 - t3 if lost else None, "t_end": time.time()})
        store.set(f"done{rnd}/{member}", "1")
        rnd += 1


def run(repeats: int, timeout_s: float) -> dict:
    import torch.distributed as dist

    from malletrain.runtime.selfcheck import free_port
    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, timeout=datetime.timedelta(seconds=60),
                          wait_for_workers=False)
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs: dict[int, mp.process.BaseProcess] = {}
    nxt = 0

    def spawn():
        """A member process that joins at the next round, once it imported torch and built
        the model (the joiner prepares before it asks to join)."""
        nonlocal nxt
        p = ctx.Process(target=_worker, args=(nxt, rnd, port, timeout_s, q), daemon=True)
        p.start()
        procs[nxt] = p
        store.wait([f"prepared/{nxt}"])
        nxt += 1
        return nxt - 1

    rnd = 0
    members = [spawn() for _ in range(4)]
    pauses: dict[str, list[dict]] = {"shrink": [], "grow": [], "loss": []}

    def round_(plan: dict, kind: str | None, t_change: float) -> None:
        nonlocal rnd
        store.set(f"round{rnd}", json.dumps(plan))
        got = [q.get(timeout=120) for _ in plan["members"]]
        for m in plan["members"]:
            store.wait([f"done{rnd}/{m}"])
        if kind:
            survivors = [r for r in got if r["member"] in plan.get("old", [])]
            pause = max(r["t_end"] for r in survivors) - t_change
            pauses[kind].append({"pause_s": pause,
                                 "destroy_s": max(r["destroy_s"] for r in survivors),
                                 "init_s": max(r["init_s"] for r in survivors),
                                 "transfer_s": max(r["transfer_s"] for r in survivors)})
        rnd += 1

    round_({"members": members, "new": False}, None, 0.0)
    for _ in range(repeats):
        # shrink: the last member leaves at a step boundary
        t = time.time()
        gone = members[-1]
        old, members = members[:-1], members[:-1]
        round_({"members": members, "old": old, "new": False}, "shrink", t)
        procs[gone].join(30)
        # grow: a prepared process joins
        joiner = spawn()
        t = time.time()
        old, members = members, members + [joiner]
        round_({"members": members, "old": old, "new": True}, "grow", t)
        # unplanned loss: SIGKILL a member mid-training, the survivors find out in a collective
        victim = members[-1]
        store.set(f"round{rnd}", json.dumps({"members": members, "old": members, "new": False,
                                             "steps": 10 ** 9}))
        store.wait([f"ready{rnd}/{victim}"])
        time.sleep(0.2)
        t = time.time()
        os.kill(procs[victim].pid, signal.SIGKILL)
        got = [q.get(timeout=120) for _ in members[:-1]]
        t_detect = max(r["t_end"] for r in got)
        rnd += 1
        members = [m for m in members if m != victim]
        round_({"members": members, "old": members, "new": False}, "loss", t)
        pauses["loss"][-1]["detect_s"] = t_detect - t
        # back to 4 for the next repeat
        joiner = spawn()
        old, members = members, members + [joiner]
        round_({"members": members, "old": old, "new": True}, None, 0.0)
    store.set(f"round{rnd}", json.dumps({"end": True}))
    for p in procs.values():
        p.join(30)
    out = {}
    for kind, rows in pauses.items():
        out[kind] = {k: statistics.median([r[k] for r in rows if r.get(k) is not None] or [float("nan")])
                     for k in rows[0]}
        out[kind]["n"] = len(rows)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m devtools.reform_probe", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--timeout-s", type=float, default=5.0, help="the collectives' timeout")
    a = ap.parse_args(argv)
    res = run(a.repeats, a.timeout_s)
    for kind, row in res.items():
        print(f"{kind:7s} " + "  ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}"
                                        for k, v in row.items()))
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
