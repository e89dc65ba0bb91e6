#!/usr/bin/env python3
"""A complete malleable training script: a small CNN or MLP on scikit-learn's digits.

The data ships with scikit-learn (1,797 8x8 images, no download).  Run it
anywhere: alone, under ``torchrun``, under ``srun`` (what ``malletrain submit``
does), or as a campaign trial.  Stop it with SIGTERM/SIGUSR2 and start it
again with any number of processes: it resumes from its newest checkpoint and,
in consistency mode, ends with exactly the parameters of an uninterrupted run.

    python examples/train/digits_train.py --ckpt /tmp/digits --steps 200
    malletrain submit --name digits --min-nodes 1 --max-nodes 4 -- \\
        python examples/train/digits_train.py --ckpt ~/runs/digits --steps 2000

Hyper-parameters come from flags or from ``--params FILE`` (JSON, what a
campaign writes); the validation result goes to ``<ckpt>/result.json``.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys

import torch
import torch.nn.functional as F
from torch import nn

from malletrain.runtime import Runtime, RuntimeConfig

DEFAULTS = dict(arch="cnn", width=16, depth=2, dropout=0.1, lr=0.05, momentum=0.9,
                weight_decay=1e-4, micro_batch=32, workers=4, steps=300, seed=0,
                mode="consistency", eval_every=50, checkpoint_every_s=120.0)


def load_data(seed: int):
    """(train, validation) tensors; a fixed 80/20 split of the bundled digits."""
    from sklearn.datasets import load_digits
    d = load_digits()
    x = torch.tensor(d.data, dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0
    y = torch.tensor(d.target, dtype=torch.long)
    order = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    cut = int(0.8 * len(y))
    tr, va = order[:cut], order[cut:]
    return (x[tr], y[tr]), (x[va], y[va])


def build_model(arch: str, width: int, depth: int, dropout: float) -> nn.Module:
    """The NAS space: a CNN of ``depth`` conv blocks or an MLP of ``depth`` hidden layers."""
    layers: list[nn.Module] = []
    if arch == "cnn":
        ch = 1
        for i in range(depth):
            layers += [nn.Conv2d(ch, width * 2 ** i, 3, padding=1), nn.BatchNorm2d(width * 2 ** i),
                       nn.ReLU()]
            ch = width * 2 ** i
        layers += [nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Dropout(dropout), nn.Linear(ch * 4, 10)]
    elif arch == "mlp":
        dim = 64
        layers.append(nn.Flatten())
        for _ in range(depth):
            layers += [nn.Linear(dim, width), nn.ReLU(), nn.Dropout(dropout)]
            dim = width
        layers.append(nn.Linear(dim, 10))
    else:
        raise SystemExit(f"unknown arch {arch!r} (cnn or mlp)")
    return nn.Sequential(*layers)


def loss_fn(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


@torch.no_grad()
def evaluate(model, data) -> dict:
    model.eval()
    x, y = data
    logits = model(x)
    out = {"val_loss": float(F.cross_entropy(logits, y)),
           "val_acc": float((logits.argmax(1) == y).float().mean())}
    model.train()
    return out


def write_result(path: str, result: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(result, fh)
    os.replace(tmp, path)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ckpt", default=os.environ.get("MALLETRAIN_CHECKPOINT_DIR"),
                   help="checkpoint directory (default $MALLETRAIN_CHECKPOINT_DIR)")
    p.add_argument("--params", help="JSON file of hyper-parameters (a campaign trial's)")
    for key, value in DEFAULTS.items():
        p.add_argument("--" + key.replace("_", "-"), type=type(value), default=None,
                       help=f"default {value}")
    args = p.parse_args(argv)
    if not args.ckpt:
        p.error("--ckpt or MALLETRAIN_CHECKPOINT_DIR is required")
    hp = dict(DEFAULTS)
    if args.params:
        with open(args.params, encoding="utf-8") as fh:
            given = json.load(fh)
        unknown = sorted(set(given) - set(DEFAULTS))
        if unknown:
            p.error(f"unknown parameter(s) {', '.join(unknown)} in {args.params}; "
                    f"valid: {', '.join(DEFAULTS)}")
        hp.update(given)
    hp.update({k: v for k, v in vars(args).items() if k in DEFAULTS and v is not None})
    return args.ckpt, hp


def main(argv=None) -> int:
    ckpt, hp = parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(message)s")
    rt = Runtime(RuntimeConfig.from_env(
        checkpoint_dir=ckpt, logical_workers=int(hp["workers"]), micro_batch=int(hp["micro_batch"]),
        mode=hp["mode"], seed=int(hp["seed"]), checkpoint_every_s=float(hp["checkpoint_every_s"]),
        extra={"hyper_parameters": hp}))
    train, val = load_data(int(hp["seed"]))
    torch.manual_seed(int(hp["seed"]))
    model = build_model(hp["arch"], int(hp["width"]), int(hp["depth"]), float(hp["dropout"]))
    opt = torch.optim.SGD(model.parameters(), lr=float(hp["lr"]), momentum=float(hp["momentum"]),
                          weight_decay=float(hp["weight_decay"]))
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=int(hp["steps"]))
    rt.prepare(model, opt, sched, data=train)
    size = sum(p.numel() for p in model.parameters())      # a NAS objective (accuracy vs. size)
    result_path = os.path.join(ckpt, "result.json")
    for _step in rt.steps(int(hp["steps"])):
        rt.train_step(loss_fn)
        if rt.info.rank == 0 and rt.step % int(hp["eval_every"]) == 0:
            res = evaluate(model, val)
            write_result(result_path, {"step": rt.step, "final": False, "params": size, **res})
            rt.report(res["val_acc"], val_loss=res["val_loss"])   # a campaign's pruner may stop the trial
    rc = rt.close()      # 3 when a signal stopped the run early: the sbatch template requeues; 0 when pruned
    if rt.info.rank == 0:
        res = {"step": rt.step, "final": rt.finished, "params": size, **evaluate(model, val)}
        write_result(result_path, res)
        print(json.dumps(res), flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
