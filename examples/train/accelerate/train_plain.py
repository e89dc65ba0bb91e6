"""A plain Hugging Face Accelerate training loop, as researchers write one (no malletrain).

    torchrun --nproc-per-node 2 train_plain.py --epochs 5 --out model.pt

An MLP on scikit-learn's digits; ``accelerator.prepare`` splits each epoch among the processes
and ``accelerator.accumulate`` sums ``--grad-accum`` batches per optimizer step.
train_malleable.py is the same loop made malleable (README, "Bring your own training script").
"""
import argparse

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset


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
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--out", default="model.pt")
    args = p.parse_args()
    accelerator = Accelerator(gradient_accumulation_steps=args.grad_accum, cpu=True)
    torch.manual_seed(0)
    train, (xv, yv) = data()
    loader = DataLoader(train, batch_size=args.batch_size, shuffle=True)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    for epoch in range(args.epochs):
        for x, y in loader:
            with accelerator.accumulate(model):
                loss = F.cross_entropy(model(x), y)
                accelerator.backward(loss)
                opt.step()
                opt.zero_grad()
        with torch.no_grad():
            acc = (model(xv).argmax(1) == yv).float().mean().item()
        accelerator.print(f"epoch {epoch} val_acc {acc:.4f}", flush=True)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        torch.save(accelerator.unwrap_model(model).state_dict(), args.out)


if __name__ == "__main__":
    main()
