"""train_plain.py made malleable with malletrain's Lightning adapter (the lines marked ``# malletrain``).

    malletrain submit --launch torchrun --min-nodes 1 --max-nodes 4 -- \
        python train_malleable.py --epochs 5 --out model.pt --ckpt ckpt

It stops at a step boundary on Slurm's signal, checkpoints, and resumes on any number of nodes
with the same global batch (here 4 x 64, whatever the processes), reports progress and the
validation accuracy, and exits 3 when the work is not finished, so the job is requeued.
"""
import argparse

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset

from malletrain.adapters.lightning import Malleable  # malletrain


def data():
    d = load_digits()
    x = torch.tensor(d.data, dtype=torch.float32) / 16.0
    y = torch.tensor(d.target, dtype=torch.long)
    return TensorDataset(x[:1400], y[:1400]), TensorDataset(x[1400:], y[1400:])


class Digits(pl.LightningModule):
    def __init__(self, lr, batch_size, mt):  # malletrain: mt
        super().__init__()
        self.lr, self.batch_size, self.mt = lr, batch_size, mt  # malletrain: mt
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
        self.train_set, self.val_set = data()

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = F.cross_entropy(self(x), y) * self.mt.weight(len(y))  # malletrain
        self.log("train_loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_acc", (self(x).argmax(1) == y).float().mean(), sync_dist=True)

    def on_validation_epoch_end(self):
        acc = float(self.trainer.callback_metrics["val_acc"])
        self.mt.report(acc)  # malletrain
        if self.global_rank == 0 and not self.trainer.sanity_checking:
            print(f"epoch {self.current_epoch} val_acc {acc:.4f}", flush=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)

    def train_dataloader(self):
        return self.mt.dataloader(self.train_set)  # malletrain: the global batch at every world size

    def val_dataloader(self):
        return DataLoader(self.val_set, batch_size=512)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--out", default="model.pt")
    p.add_argument("--ckpt", default="ckpt")  # malletrain
    args = p.parse_args()
    pl.seed_everything(0)
    mt = Malleable(args.ckpt, global_batch=4 * args.batch_size, micro_batch=args.batch_size)  # malletrain
    model = Digits(args.lr, args.batch_size, mt)  # malletrain: mt
    trainer = pl.Trainer(max_epochs=args.epochs, accelerator="cpu", **mt.trainer_args(),  # malletrain
                         logger=False, enable_checkpointing=False, enable_progress_bar=False)
    trainer.fit(model, ckpt_path=mt.resume_from())  # malletrain: the newest good checkpoint
    if trainer.global_rank == 0:
        torch.save(model.net.state_dict(), args.out)


if __name__ == "__main__":
    main()
