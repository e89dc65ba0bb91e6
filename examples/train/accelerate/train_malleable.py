"""train_plain.py made malleable with malletrain's Accelerate helper (the lines marked ``# malletrain``).

    malletrain submit --launch torchrun --min-nodes 1 --max-nodes 4 -- \
        python train_malleable.py --epochs 5 --out model.pt --ckpt ckpt

It stops at a step boundary on Slurm's signal, checkpoints, and resumes on any number of nodes
with the same global batch (here 4 x 64, whatever the processes), reports progress and the
validation accuracy, and exits 3 when the work is not finished, so the job is requeued.
"""
import argparse

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from sklearn.datasets import load_digits
from torch.utils.data import TensorDataset

from malletrain.adapters.accelerate import Malleable  # malletrain


def data():
    d = load_digits()
    x = torch.tensor(d.data, dtype=torch.float32) / 16.0
    y = torch.tensor(d.target, dtype=torch.long)
    return TensorDataset(x[:1400], y[:1400]), (x[1400:], y[1400:])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--out", default="model.pt")
    p.add_argument("--ckpt", default="ckpt")  # malletrain
    args = p.parse_args()
    mt = Malleable(args.ckpt, global_batch=4 * args.batch_size, micro_batch=args.batch_size)  # malletrain
    accelerator = Accelerator(gradient_accumulation_steps=mt.accumulation, cpu=True)  # malletrain
    torch.manual_seed(0)
    train, (xv, yv) = data()
    loader = mt.dataloader(train)  # malletrain: the global batch at every world size
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    mt.restore(accelerator)  # malletrain: the newest complete checkpoint
    for epoch in mt.epochs(args.epochs):  # malletrain
        for x, y in loader:
            with accelerator.accumulate(model):
                loss = F.cross_entropy(model(x), y) * mt.weight(len(y))  # malletrain
                accelerator.backward(loss)
                opt.step()
                opt.zero_grad()
            mt.step(accelerator)  # malletrain: stop and checkpoint at a step boundary
        with torch.no_grad():
            acc = (model(xv).argmax(1) == yv).float().mean().item()
        accelerator.print(f"epoch {epoch} val_acc {acc:.4f}", flush=True)
        mt.report(acc)  # malletrain
    status = mt.close(accelerator)  # malletrain: the final checkpoint; 0 done, 3 stopped (the job requeues)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        torch.save(accelerator.unwrap_model(model).state_dict(), args.out)
    raise SystemExit(status)  # malletrain


if __name__ == "__main__":
    main()
