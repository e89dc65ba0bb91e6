"""train_plain.py made malleable with malletrain's Hugging Face adapter (the lines marked ``# malletrain``).

    malletrain submit --launch torchrun --min-nodes 1 --max-nodes 4 -- \
        python train_malleable.py --epochs 10 --out-dir run --out model

It stops at a step boundary on Slurm's signal, checkpoints, and resumes on any number of nodes
with the same global batch (12 micro-batches of 10, whatever the processes: 12 on one, 6 on each
of two, ...), reports progress and the validation accuracy, and exits 3 when the work is not
finished, so the job is requeued.
"""
import argparse

import torch
from sklearn.datasets import load_digits
from transformers import BertConfig, BertForSequenceClassification, Trainer

from malletrain.adapters.hf import Malleable  # malletrain


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
    p.add_argument("--out-dir", default="run")
    p.add_argument("--out", default="model")
    args = p.parse_args()
    torch.manual_seed(0)
    config = BertConfig(vocab_size=18, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64, num_labels=10,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = BertForSequenceClassification(config)
    train, val = data()
    mt = Malleable(args.out_dir, global_batch=12 * args.batch_size, micro_batch=args.batch_size,  # malletrain
                   metric="eval_accuracy")
    targs = mt.training_args(output_dir=args.out_dir, num_train_epochs=args.epochs, learning_rate=args.lr,  # malletrain
                             eval_strategy="epoch", logging_strategy="epoch", save_strategy="no",
                             report_to="none", use_cpu=True, disable_tqdm=True)
    trainer = Trainer(model=model, args=targs, train_dataset=mt.dataset(train), eval_dataset=val,  # malletrain
                      compute_metrics=accuracy, callbacks=[mt])  # malletrain
    trainer.train(resume_from_checkpoint=mt.resume_from())  # malletrain: the newest complete checkpoint
    trainer.save_model(args.out)


if __name__ == "__main__":
    main()
