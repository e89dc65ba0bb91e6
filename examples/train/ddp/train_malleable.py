"""train_plain.py made malleable with malletrain's DDP adapter (the lines marked ``# malletrain``).

    malletrain submit --launch torchrun --min-nodes 1 --max-nodes 4 -- \
        python train_malleable.py --epochs 5 --out model.pt --ckpt ckpt

It stops at a step boundary on Slurm's signal, checkpoints, and resumes on any number of nodes
with the same global batch (here 4 x 64, whatever the processes), reports progress and the
validation accuracy, and exits 3 when the work is not finished, so the job is requeued.
"""
import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

from malletrain.adapters.ddp import Malleable  # malletrain


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
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    train, (xv, yv) = data()
    mt = Malleable(args.ckpt, global_batch=4 * args.batch_size, micro_batch=args.batch_size)  # malletrain
    loader = DataLoader(train, batch_sampler=mt.sampler(len(train)))  # malletrain
    model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    mt.restore(model, opt)  # malletrain
    for epoch in mt.epochs(args.epochs):  # malletrain
        for x, y in loader:
            loss = F.cross_entropy(model(x), y) * mt.weight(len(y))  # malletrain
            loss.backward()
            mt.step(opt)  # malletrain: opt.step() and opt.zero_grad(), stop and checkpoint
        with torch.no_grad():
            acc = (model(xv).argmax(1) == yv).float().mean().item()
        mt.report(acc)  # malletrain
        if dist.get_rank() == 0:
            print(f"epoch {epoch} val_acc {acc:.4f}", flush=True)
    if dist.get_rank() == 0:
        torch.save(model.module.state_dict(), args.out)
    status = mt.close()  # malletrain: the final checkpoint; 0 done, 3 stopped (the job requeues)
    dist.barrier()      # every rank done before the group is torn down
    dist.destroy_process_group()
    raise SystemExit(status)  # malletrain


if __name__ == "__main__":
    main()
