"""A plain PyTorch DDP training script, as researchers write one (no malletrain).

    torchrun --nproc-per-node 2 train_plain.py --epochs 5 --out model.pt

An MLP on scikit-learn's digits; a DistributedSampler splits each epoch among the processes.
train_malleable.py is the same script made malleable (README, "Bring your own DDP script").
"""
import argparse
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


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
    args = p.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    train, (xv, yv) = data()
    sampler = DistributedSampler(train, shuffle=True, seed=0)
    loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
        with torch.no_grad():
            acc = (model(xv).argmax(1) == yv).float().mean().item()
        if dist.get_rank() == 0:
            print(f"epoch {epoch} val_acc {acc:.4f}", flush=True)
    if dist.get_rank() == 0:
        torch.save(model.module.state_dict(), args.out)
    dist.barrier()      # every rank done before the group is torn down
    time.sleep(0.1)     # torch 2.13: gloo's threads free that barrier before the interpreter exits,
    #                     else the process may abort at exit (malletrain.adapters.contract.settle_collectives)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
