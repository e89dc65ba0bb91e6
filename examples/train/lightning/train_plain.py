"""A plain PyTorch Lightning training script, as researchers write one (no malletrain).

    torchrun --nproc-per-node 2 train_plain.py --devices 2 --epochs 5 --out model.pt

A LightningModule (an MLP on scikit-learn's digits) and a Trainer; Lightning splits each epoch
among the processes.  train_malleable.py is the same script made malleable (README, "Bring your
own Lightning script").
"""
import argparse

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset


def data():
    d = load_digits()
    x = torch.tensor(d.data, dtype=torch.float32) / 16.0
    y = torch.tensor(d.target, dtype=torch.long)
    return TensorDataset(x[:1400], y[:1400]), TensorDataset(x[1400:], y[1400:])


class Digits(pl.LightningModule):
    def __init__(self, lr, batch_size):
        super().__init__()
        self.lr, self.batch_size = lr, batch_size
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
        self.train_set, self.val_set = data()

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_acc", (self(x).argmax(1) == y).float().mean(), sync_dist=True)

    def on_validation_epoch_end(self):
        acc = float(self.trainer.callback_metrics["val_acc"])
        if self.global_rank == 0 and not self.trainer.sanity_checking:
            print(f"epoch {self.current_epoch} val_acc {acc:.4f}", flush=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)

    def train_dataloader(self):
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=512)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--devices", type=int, default=1)
    p.add_argument("--num-nodes", type=int, default=1)
    p.add_argument("--accumulate", type=int, default=1)
    p.add_argument("--out", default="model.pt")
    args = p.parse_args()
    pl.seed_everything(0)
    model = Digits(args.lr, args.batch_size)
    trainer = pl.Trainer(max_epochs=args.epochs, accelerator="cpu", devices=args.devices, num_nodes=args.num_nodes,
                         accumulate_grad_batches=args.accumulate,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.fit(model)
    if trainer.global_rank == 0:
        torch.save(model.net.state_dict(), args.out)


if __name__ == "__main__":
    main()
