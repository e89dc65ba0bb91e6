"""A plain Hugging Face Trainer fine-tuning run, as researchers write one (no malletrain).

    torchrun --nproc-per-node 2 train_plain.py --epochs 10 --out-dir run --out model

A tiny BERT built from a config (no model hub here) classifies scikit-learn's digits read as
sequences of 64 pixel tokens.  Dropout is off so that a run is reproducible.  train_malleable.py
is the same script made malleable (README, "Bring your own Hugging Face script").
"""
import argparse

import torch
from sklearn.datasets import load_digits
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments


class Digits(torch.utils.data.Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.y[i]}


def data():
    d = load_digits()
    x = torch.tensor(d.data, dtype=torch.long) + 1      # intensities 0..16 as tokens 1..17 (0: padding)
    y = torch.tensor(d.target, dtype=torch.long)
    return Digits(x[:1400], y[:1400]), Digits(x[1400:], y[1400:])


def accuracy(pred):
    return {"accuracy": float((pred.predictions.argmax(-1) == pred.label_ids).mean())}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=10)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--out-dir", default="run")
    p.add_argument("--out", default="model")
    args = p.parse_args()
    torch.manual_seed(0)
    config = BertConfig(vocab_size=18, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, num_labels=10,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = BertForSequenceClassification(config)
    train, val = data()
    targs = TrainingArguments(output_dir=args.out_dir, num_train_epochs=args.epochs, learning_rate=args.lr,
                              per_device_train_batch_size=args.batch_size,
                              gradient_accumulation_steps=args.grad_accum,
                              eval_strategy="epoch", logging_strategy="epoch", save_strategy="no",
                              report_to="none", use_cpu=True, disable_tqdm=True)
    trainer = Trainer(model=model, args=targs, train_dataset=train, eval_dataset=val, compute_metrics=accuracy)
    trainer.train()
    trainer.save_model(args.out)


if __name__ == "__main__":
    main()
