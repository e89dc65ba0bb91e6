"""The bundled reference model of ``malletrain selfcheck`` and the consistency tests.

A small CNN with BatchNorm (buffers) and Dropout (RNG) on generated 8x8
"digits" (no download), trained with SGD + momentum, weight decay and a step
LR schedule, so that every piece of state a checkpoint must carry is
exercised.  Run as a worker::

    RANK=0 WORLD_SIZE=1 python -m malletrain.runtime.reference --dir D --until 24

It trains until step ``--until`` (or a stop signal: exit status 3), writes its
checkpoint and prints ``sha256 <digest> step <n>`` of all parameters and buffers.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import logging
import sys
from typing import Any


def make_data(seed: int = 0, n: int = 1024, classes: int = 10):
    """Deterministic 8x8 images: a class template plus noise."""
    import torch
    g = torch.Generator().manual_seed(seed)
    templates = torch.rand(classes, 1, 8, 8, generator=g)
    y = torch.randint(0, classes, (n,), generator=g)
    x = templates[y] + 0.35 * torch.randn(n, 1, 8, 8, generator=g)
    return x.float(), y


def make_model(width: int = 8, dropout: float = 0.2, classes: int = 10):
    from torch import nn
    return nn.Sequential(
        nn.Conv2d(1, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
        nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Dropout(dropout), nn.Linear(2 * width * 16, classes))


def make_optim(model, lr: float = 0.05):
    import torch
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=1e-4)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.7)
    return opt, sched


def loss_fn(model, batch):
    import torch.nn.functional as F
    x, y = batch
    return F.cross_entropy(model(x), y)


def state_sha256(model) -> str:
    """SHA-256 over every parameter and buffer (names, dtypes, shapes and bytes)."""
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        t = t.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m malletrain.runtime.reference", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dir", required=True, help="checkpoint directory")
    p.add_argument("--until", type=int, required=True, help="train until this global step")
    p.add_argument("--workers", type=int, default=4, help="logical workers L")
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--mode", default="consistency", choices=("consistency", "tolerance"))
    p.add_argument("--mapping", default="contiguous",
                   help="contiguous, round_robin or JSON list of lists (one per rank)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--every", type=int, default=0, help="checkpoint every N steps (0: off)")
    p.add_argument("--step-sleep-s", type=float, default=0.0,
                   help="sleep after each step (tests use it to land signals mid-run)")
    p.add_argument("--width", type=int, default=8)
    p.add_argument("--samples", type=int, default=1024)
    p.add_argument("--report-s", type=float, default=0.5,
                   help="at most one progress record per this many seconds (0: every step)")
    p.add_argument("--background-checkpoints", choices=("on", "off", "auto"), default="auto",
                   help="periodic checkpoints written by a thread (auto: elastic jobs only)")
    p.add_argument("--elastic", action="store_true",
                   help="run as one member of an elastic job (MALLETRAIN_MEMBER names it)")
    args = p.parse_args(argv)

    import time

    import torch

    from malletrain.runtime import RuntimeConfig
    from malletrain.runtime.trainer import OUT_OF_GROUP, Runtime
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s",
                        stream=sys.stderr)
    mapping = json.loads(args.mapping) if args.mapping.startswith("[") else args.mapping
    elastic: dict[str, Any] = {"elastic": True} if args.elastic else {}   # else: as the environment says
    cfg = RuntimeConfig.from_env(checkpoint_dir=args.dir, logical_workers=args.workers,
                                 micro_batch=args.micro_batch, mode=args.mode, seed=args.seed,
                                 checkpoint_every_steps=args.every, checkpoint_every_s=0.0,
                                 mapping=mapping, keep=3,
                                 background_checkpoints={"on": True, "off": False}.get(args.background_checkpoints),
                                 report_s=args.report_s, **elastic)
    rt = Runtime(cfg)
    torch.manual_seed(args.seed)   # same initial parameters everywhere (rank 0's are broadcast too)
    model = make_model(args.width)
    opt, sched = make_optim(model)
    rt.prepare(model, opt, sched, data=make_data(args.seed, args.samples))
    for _ in rt.steps(args.until):
        rt.train_step(loss_fn)
        if args.step_sleep_s:
            time.sleep(args.step_sleep_s)
    rc = rt.close()
    if rt.info.rank == 0 and rt.stopped not in OUT_OF_GROUP:
        print(f"sha256 {state_sha256(model)} step {rt.step} stopped {rt.stopped or '-'}", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
