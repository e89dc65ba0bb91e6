"""A Hugging Face ``Trainer`` run made malleable: :class:`Malleable`, a ``TrainerCallback``.

A fine-tuning script written the usual way — a model, ``TrainingArguments``, a ``Trainer`` and
``trainer.train()`` — started by ``torchrun`` (``malletrain submit --launch torchrun``) changes
in a few lines (README, "Bring your own Hugging Face script")::

    mt = Malleable(args.out_dir, global_batch=120, micro_batch=10, metric="eval_accuracy")
    targs = mt.training_args(output_dir=args.out_dir, ...)   # was: TrainingArguments(..., per_device_...=10)
    trainer = Trainer(model=model, args=targs, train_dataset=mt.dataset(train), ..., callbacks=[mt])
    trainer.train(resume_from_checkpoint=mt.resume_from())     # the newest complete checkpoint

**What the Trainer does that a harvester must undo, and how.**

* *No checkpoint on a signal.*  SIGTERM/SIGUSR2 only set a flag; at each optimizer step
  (``on_step_end``) the ranks agree on it (one small all-reduce) and ask the Trainer to save
  and stop.  Once the Trainer has written ``checkpoint-<step>`` (``on_save``), rank 0 writes a
  manifest of every file in it (size and SHA-256, atomically: ``malletrain-complete.json``),
  and every rank leaves with ``SystemExit(3)`` (the script's code after ``train()`` never runs
  as if the work were done), so that the batch script requeues the job.  A campaign's pruned
  trial exits 0 the same way; ``checkpoint_every_s`` asks for a save without a stop.
* *Its training ends before the script does* (``trainer.save_model`` after ``train()``).  The
  last epoch ends with a checkpoint, and the final ``exit`` record (``done``) is written when the
  process leaves cleanly (:meth:`Contract.exit_at_end`): a job stopped or killed while the
  script saves its model is not read as done, and a requeued one resumes at the end.
* *An epoch stopped at its last step is never evaluated* (``eval_strategy="epoch"``: the
  Trainer evaluates after the epoch's end, and the resumed run starts the next epoch).  On such a
  stop the adapter asks for the evaluation before the save, when it fits the stop's time
  (:meth:`Malleable._evaluate_before_leaving`).
* *Its checkpoints are not atomic* (files written in place, one by one).
  :meth:`Malleable.resume_from` names the newest ``checkpoint-<step>`` whose manifest matches
  every file; newer ones, left half-written by a kill, are set aside (``corrupt-checkpoint-<step>``).
* *It resumes exactly only with a fixed global batch.*  The per-device batch stays
  ``micro_batch`` at every world size and :meth:`Malleable.training_args` sets the accumulation
  so that ``micro_batch x accumulation x world`` is the global batch; the Trainer's data
  (Accelerate's seedable sampler: one permutation per epoch, whatever the world, cut into
  per-device batches that the ranks take in turn) then trains the same samples at every step at
  any world size, and after a restart it skips the steps already done.  The number of
  micro-batches a step sums is the same at every world size too, and that matters: for a model
  that takes the Trainer's loss arguments but averages its own loss (sequence classification),
  the Trainer neither divides by the accumulation nor by the tokens, so the gradient it applies is
  that number times the batch's mean gradient; a fixed number keeps the scale, and with it the
  gradient clipping, the same at every world size.  Every world size the job may get must
  therefore divide ``global_batch / micro_batch`` (12 serves 1-4, 6 and 12 processes); another is
  a clear error at start.  :meth:`Malleable.dataset` keeps the whole global batches of the
  training set, so that no epoch ends with a step of another size.

Results agree across world sizes to float rounding (the all-reduce sums in another order), not
bitwise; layers with dropout draw from each rank's own random stream, so a model with dropout
follows another (statistically equal) path after a change of world size.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Any

import torch
import torch.distributed as dist
from transformers import TrainerCallback, TrainingArguments

from malletrain.adapters.contract import CKPT, PRUNE, STOP, Contract, numbered, seal, torchrun_place, verify
from malletrain.domain.errors import InputError

log = logging.getLogger("malletrain.adapters.hf")

OWNED = ("per_device_train_batch_size", "gradient_accumulation_steps",
         "save_total_limit", "seed", "data_seed")


class Malleable(Contract, TrainerCallback):
    """The Trainer's side of the contract (module docstring).  Create it before the
    ``TrainingArguments`` (torchrun's ``RANK``/``WORLD_SIZE`` say where this process stands;
    without torchrun: one process).  ``metric``: the evaluation metric reported to the daemon
    and a campaign's pruner (e.g. ``eval_accuracy``)."""

    def __init__(self, output_dir: str, *, global_batch: int, micro_batch: int, seed: int = 0,
                 checkpoint_every_s: float = 60.0, keep: int = 3, metric: str | None = None,
                 env: dict[str, str] | None = None) -> None:
        env = dict(os.environ) if env is None else env
        rank, world = torchrun_place(env)
        if not isinstance(micro_batch, int) or micro_batch < 1:
            raise InputError(f"micro_batch (the per-device batch) must be an integer >= 1, got {micro_batch!r}")
        if isinstance(global_batch, int) and global_batch >= world and global_batch % (world * micro_batch):
            raise InputError(f"the global batch {global_batch} is not a whole number of micro-batches of "
                             f"{micro_batch} on each of {world} processes: choose a global batch that is a multiple "
                             "of micro_batch x every world size the job may get (e.g. 12 x micro_batch serves "
                             "1, 2, 3, 4, 6 and 12 processes)")
        Contract.__init__(self, output_dir, rank=rank, world=world, global_batch=global_batch,
                          micro_batch=micro_batch, seed=seed, checkpoint_every_s=checkpoint_every_s,
                          keep=keep, env=env, mode="hf")
        self.per_device = micro_batch
        self.accumulation = self.global_batch // (self.world * micro_batch)
        self.output_dir, self.keep, self.metric = output_dir, keep, metric
        self._read_s = 0.0
        self._resumed_step: int | None = None
        self._looked = False
        self._leaving: int | None = None
        self._save_asked: float | None = None
        self._sealed_step: int | None = None

    # ---- what the script passes to the Trainer ---------------------------------------------
    def training_args(self, **kwargs: Any) -> TrainingArguments:
        """``TrainingArguments(**kwargs)`` with the per-device batch and the accumulation of this
        world, the adapter's seed (the data order), and as many checkpoints kept as the adapter
        keeps.  The script's ``kwargs`` must not set those.  (Not ``dataloader_drop_last``: it
        would drop evaluation samples too, as many as the world size makes partial;
        :meth:`dataset` already gives whole global batches.)"""
        taken = sorted(set(OWNED) & set(kwargs))
        if taken:
            raise InputError(f"training_args(): {', '.join(taken)} are set by the adapter (global_batch, "
                             "micro_batch, seed, keep)")
        if os.path.abspath(str(kwargs.get("output_dir", self.output_dir))) != os.path.abspath(self.output_dir):
            raise InputError("training_args(): output_dir must be the adapter's (its checkpoints live there)")
        return TrainingArguments(**{**kwargs, "output_dir": self.output_dir},
                                 per_device_train_batch_size=self.per_device,
                                 gradient_accumulation_steps=self.accumulation,
                                 save_total_limit=self.keep, seed=self.seed, data_seed=self.seed)

    def dataset(self, dataset) -> torch.utils.data.Subset:
        """The training set's first ``steps x global_batch`` samples (whole global batches)."""
        steps = self.steps_per_epoch(len(dataset))
        return torch.utils.data.Subset(dataset, range(steps * self.global_batch))

    def resume_from(self) -> str | None:
        """The newest ``checkpoint-<step>`` whose manifest matches its files (for
        ``trainer.train(resume_from_checkpoint=...)``), or None.  Every rank checks the files
        itself, so all choose alike; rank 0 sets newer, incomplete ones aside at the start."""
        t0 = time.perf_counter()
        self._looked = True
        for step in self.checkpoints():
            path = os.path.join(self.output_dir, f"checkpoint-{step}")
            problem = verify(path)
            if problem is None:
                self._read_s, self._resumed_step = time.perf_counter() - t0, step
                return path
            log.warning("checkpoint %s is incomplete (%s); falling back to the previous one", path, problem)
        return None

    def checkpoints(self) -> list[int]:
        """Steps of the ``checkpoint-<step>`` directories present, newest first."""
        return numbered(self.output_dir, "checkpoint-")

    # ---- the Trainer's hooks ---------------------------------------------------------------
    def on_train_begin(self, args, state, control, **kwargs) -> None:
        if args.world_size != self.world or args.gradient_accumulation_steps != self.accumulation:
            raise InputError("the Trainer's world or accumulation is not the adapter's: build the arguments "
                             "with mt.training_args(...)")
        loader = kwargs.get("train_dataloader")
        n = len(getattr(loader, "dataset", None) or ()) if loader is not None else 0
        if n % self.global_batch:
            raise InputError(f"the training set has {n} samples, not whole global batches of {self.global_batch}: "
                             "pass train_dataset=mt.dataset(train) to the Trainer (an epoch would end with a "
                             "short step of another size at every world size)")
        if self.rank == 0 and self._looked:     # resume_from found these newer ones incomplete
            for step in self.checkpoints():
                if self._resumed_step is not None and step <= self._resumed_step:
                    break
                path = os.path.join(self.output_dir, f"checkpoint-{step}")
                log.warning("checkpoint %s is incomplete; set aside as corrupt-checkpoint-%d", path, step)
                os.replace(path, os.path.join(self.output_dir, f"corrupt-checkpoint-{step}"))
        self.global_step = state.global_step
        self.started(self._read_s)
        log.info("rank %d/%d resumes at step %d; %d micro-batch(es) of %d per device, global batch %d",
                 self.rank, self.world, self.global_step, self.accumulation, self.per_device, self.global_batch)

    def on_step_end(self, args, state, control, **kwargs) -> None:
        self.global_step = state.global_step - 1
        self.epoch = int(state.epoch or 0)
        flags = self.agree(self.stepped())
        if flags[PRUNE] > 0:
            self.stopped = "pruned"
            self.exit_record(log)
            raise SystemExit(0)
        if flags[STOP] > 0:
            self.stopped = "signal"
            control.should_save = control.should_training_stop = True
            self._leaving = 3
            if self._evaluate_before_leaving(args, state):
                control.should_evaluate = True      # the Trainer evaluates before it saves
        elif flags[CKPT] > 0:
            control.should_save = True
        if control.should_save:
            self._save_asked = time.perf_counter()

    def _evaluate_before_leaving(self, args, state) -> bool:
        """A stop on an epoch's last step under ``eval_strategy="epoch"``: the Trainer evaluates
        after ``on_epoch_end``, which a stop never reaches, and the run resumed at the epoch's
        end starts the next epoch, so that epoch's evaluation (a pruner's rung, a study's final
        value) would never be reported.  It runs before the save when the last one took at most
        half the time the stop may take (a quarter of the grace time; every rank's longest, one
        all-reduce) or none was timed yet; else the report is lost and the log says so."""
        strategy = getattr(args.eval_strategy, "value", args.eval_strategy)
        epoch = state.epoch
        if strategy != "epoch" or not epoch or epoch != int(epoch):
            return False
        runtimes = [h["eval_runtime"] for h in state.log_history
                    if isinstance(h, dict) and isinstance(h.get("eval_runtime"), (int, float))]
        took = torch.tensor([float(runtimes[-1]) if runtimes else 0.0])
        if dist.is_initialized():
            dist.all_reduce(took, op=dist.ReduceOp.MAX)
        if took.item() <= self.stop.deadline_s / 2:
            return True
        log.warning("stopped at the end of epoch %d: its evaluation (%.1f s last time) does not fit the stop's "
                    "time (%.1f s); it is not reported", int(epoch), took.item(), self.stop.deadline_s)
        return False

    def on_save(self, args, state, control, **kwargs) -> None:
        """The Trainer wrote ``checkpoint-<step>``: every rank's files are in (a barrier), rank 0
        writes the manifest; on a stop every rank leaves.  The checkpoint record's ``write_s``
        runs from the step that asked for the save (the Trainer's own writing included) to the
        manifest."""
        t0, self._save_asked = self._save_asked or time.perf_counter(), None
        path = os.path.join(self.output_dir, f"checkpoint-{state.global_step}")
        if dist.is_initialized():
            dist.barrier()
        if self.rank == 0 and os.path.isdir(path):
            size = seal(path, state.global_step)
            self.saved(time.perf_counter() - t0, size)
        self._sealed_step = state.global_step
        if dist.is_initialized():
            dist.barrier()
        if self._leaving is not None:
            status = self.exit_record(log)
            raise SystemExit(status)

    def on_evaluate(self, args, state, control, metrics=None, **kwargs) -> None:
        if self.metric and isinstance(metrics, dict) and isinstance(metrics.get(self.metric), (int, float)):
            self.report(float(metrics[self.metric]))

    def on_epoch_end(self, args, state, control, **kwargs) -> None:
        """The last epoch ended (its epochs, ``max_steps`` or the script's early stopping): a final
        checkpoint, which the Trainer saves after the epoch's evaluation, so that a job stopped
        while the script writes its results (``trainer.save_model``) resumes at the end instead of
        at its last stop."""
        ending = control.should_training_stop or (state.max_steps and state.global_step >= state.max_steps)
        if ending and self._sealed_step != state.global_step:
            control.should_save = True
            self._save_asked = time.perf_counter()

    def on_train_end(self, args, state, control, **kwargs) -> None:
        """The training is done; the ``exit`` record waits for the process to leave
        (:meth:`Contract.exit_at_end`): the script's lines after ``train()`` are part of the
        work.  Until then the stop handlers stay (a stop while the script saves its model only
        sets the flag), and a job killed before it ends is requeued and resumes from the final
        checkpoint (:meth:`on_epoch_end`) to save again."""
        self.finished = True
        self.global_step = state.global_step
        self.exit_at_end(log)
