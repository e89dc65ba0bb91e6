"""A hand-written Hugging Face Accelerate loop made malleable: :class:`Malleable`.

A loop written the usual way — an ``Accelerator`` with gradient accumulation, ``prepare``,
``accelerator.accumulate(model)``, ``accelerator.backward`` — started by ``torchrun``
(``malletrain submit --launch torchrun``) changes in a few lines (README, "Bring your own
training script")::

    mt = Malleable(args.ckpt, global_batch=256, micro_batch=64)
    accelerator = Accelerator(gradient_accumulation_steps=mt.accumulation)   # was: args.grad_accum
    model, opt, loader = accelerator.prepare(model, opt, mt.dataloader(train))   # was: DataLoader(..., shuffle=True)
    mt.restore(accelerator)                                 # the newest complete checkpoint
    for epoch in mt.epochs(args.epochs):                    # was: range(args.epochs)
        for x, y in loader:
            with accelerator.accumulate(model):
                loss = F.cross_entropy(model(x), y) * mt.weight(len(y))
                accelerator.backward(loss)
                opt.step(); opt.zero_grad()
            mt.step(accelerator)                            # stop, checkpoint
    raise SystemExit(mt.close(accelerator))                 # 0 done; 3 stopped: the job requeues

**What Accelerate does that a harvester must undo, and how.**

* *``save_state`` writes a directory file by file* and ``load_state`` takes what it finds.
  :meth:`Malleable.checkpoint` saves into a fresh directory, rank 0 seals it with a manifest
  (size and SHA-256 of every file, :func:`~malletrain.adapters.contract.seal`) and only then
  renames it to ``step-<step>``; :meth:`Malleable.restore` loads the newest one that still
  matches its manifest and sets newer ones aside (``corrupt-step-<step>``).
* *Its random states are one file per rank*; after a change of world size a new rank finds none
  (Accelerate logs it and goes on with its own).  The data order does not depend on them: the
  adapter's DataLoader yields every micro-batch of each global step (the world-size independent
  plan of :mod:`malletrain.adapters.contract`), and ``prepare`` hands rank ``r`` the micro-batches
  ``r, r+W, ...`` of it.  A model with dropout follows another (statistically equal) path after
  a change of world size.
* *The accumulation is fixed when the Accelerator is built*; ``mt.accumulation`` is the count for
  this world.  ``accelerator.backward`` divides each micro-batch's loss by it, so
  :meth:`Malleable.weight` includes it.  ``load_state`` puts back the micro-batch counter as the
  old world counted (in the middle of a step at the new one: an extra, short step; measured, 51
  steps instead of 50 and parameters 0.01 apart); the adapter restarts it at the step boundary.
* *No checkpoint on a signal.*  SIGTERM/SIGUSR2 set a flag; at each optimizer step
  (:meth:`Malleable.step`, after the step that synced the gradients) the ranks agree on it in one
  small all-reduce; a stop is a checkpoint of that step boundary and ``SystemExit(3)``.

Results agree across world sizes to float rounding (the all-reduce sums in another order).
"""
from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import time
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from malletrain.adapters.contract import (
    CKPT,
    PRUNE,
    STOP,
    Contract,
    loader_kwargs,
    numbered,
    seal,
    torchrun_place,
    verify,
)
from malletrain.domain.errors import InputError
from malletrain.domain.safefile import write_atomic

log = logging.getLogger("malletrain.adapters.accelerate")

STATE = "malletrain.json"       # the adapter's own state in a checkpoint directory


class Malleable(Contract):
    """An Accelerate loop's side of the contract (module docstring).  Create it before the
    ``Accelerator`` (torchrun's ``RANK``/``WORLD_SIZE`` say where this process stands)."""

    def __init__(self, checkpoint_dir: str, *, global_batch: int, micro_batch: int | None = None,
                 seed: int = 0, checkpoint_every_s: float = 60.0, keep: int = 3,
                 env: dict[str, str] | None = None) -> None:
        env = dict(os.environ) if env is None else env
        rank, world = torchrun_place(env)
        Contract.__init__(self, checkpoint_dir, rank=rank, world=world, global_batch=global_batch,
                          micro_batch=micro_batch, seed=seed, checkpoint_every_s=checkpoint_every_s,
                          keep=keep, env=env, mode="accelerate")
        self.directory, self.keep = checkpoint_dir, keep
        self._saved_step = -1

    # ---- data ------------------------------------------------------------------------------
    def dataloader(self, dataset, **kwargs) -> DataLoader:
        """The training DataLoader for ``accelerator.prepare``: every micro-batch of each global
        step left in the epoch, in order (``prepare`` deals them out to the ranks).  ``kwargs``
        go to ``DataLoader`` (``num_workers``, ``collate_fn``, ...), not the batching."""
        kwargs = loader_kwargs(kwargs)
        return DataLoader(dataset, batch_sampler=self.batch_sampler(len(dataset), every_rank=True), **kwargs)

    def weight(self, n: int) -> float:
        """What a micro-batch of ``n`` samples' mean loss is multiplied by: its share of the
        global batch, times the world size (DDP averages the ranks' gradients) and the
        accumulation count (``accelerator.backward`` divides by it)."""
        return n * self.world * self.accumulation / self.global_batch

    def epochs(self, total: int) -> Iterator[int]:
        """The epochs left to train (from the restored one); after the last, the run is done."""
        while self.epoch < total:
            yield self.epoch
            if self.per_epoch and self.in_epoch >= self.per_epoch:
                self.epoch, self.in_epoch = self.epoch + 1, 0
        self.finished = True

    # ---- checkpoints -----------------------------------------------------------------------
    def checkpoints(self) -> list[int]:
        return numbered(self.directory, "step-")

    def restore(self, accelerator) -> int:
        """Load the newest complete checkpoint into what ``accelerator`` prepared (every rank the
        same directory: each checks the files itself).  Returns the step it resumes at."""
        t0 = time.perf_counter()
        bad = []
        for step in self.checkpoints():
            path = os.path.join(self.directory, f"step-{step}")
            problem = verify(path)
            if problem is not None:
                log.warning("checkpoint %s is incomplete (%s); falling back to the previous one", path, problem)
                bad.append(step)
                continue
            with open(os.path.join(path, STATE), encoding="utf-8") as fh:
                st = json.load(fh)
            if st.get("global_batch") != self.global_batch or st.get("seed") != self.seed:
                raise InputError(f"checkpoint was written with global_batch={st.get('global_batch')}, "
                                 f"seed={st.get('seed')}; this run has {self.global_batch}, {self.seed}: "
                                 "the data order would change (use a new checkpoint directory)", path=path)
            accelerator.load_state(path)
            # the accumulation counter comes back as that rank counted micro-batches at the old
            # world size; every checkpoint is a step boundary, so the next micro-batch starts a step
            accelerator.step = 0
            self.global_step, self.epoch, self.in_epoch = int(st["step"]), int(st["epoch"]), int(st["in_epoch"])
            self._saved_step = self.global_step
            log.info("restored %s (step %d, epoch %d)", path, self.global_step, self.epoch)
            break
        accelerator.wait_for_everyone()         # every rank chose; the ones found incomplete go aside
        if self.rank == 0:
            for step in bad:
                os.replace(os.path.join(self.directory, f"step-{step}"),
                           os.path.join(self.directory, f"corrupt-step-{step}"))
        self.started(time.perf_counter() - t0)
        log.info("rank %d/%d resumes at step %d (epoch %d); %d micro-batch(es) of the global batch %d per step",
                 self.rank, self.world, self.global_step, self.epoch, self.accumulation, self.global_batch)
        return self.global_step

    def checkpoint(self, accelerator) -> None:
        """Save this step boundary (every rank calls it): ``save_state`` into a fresh directory,
        sealed by rank 0 and renamed to ``step-<step>``; the oldest beyond ``keep`` go."""
        if self._saved_step == self.global_step:
            return
        t0 = time.perf_counter()
        tag = torch.tensor([secrets.randbits(62) if self.rank == 0 else 0], dtype=torch.long)
        if dist.is_initialized():
            dist.broadcast(tag, 0)
        tmp = os.path.join(self.directory, f".tmp-{self.global_step}-{int(tag)}")
        accelerator.save_state(tmp)                  # every rank writes its own random states
        accelerator.wait_for_everyone()
        if self.rank == 0:
            write_atomic(os.path.join(tmp, STATE), json.dumps(
                {"step": self.global_step, "epoch": self.epoch, "in_epoch": self.in_epoch,
                 "global_batch": self.global_batch, "seed": self.seed, "world": self.world}).encode(), 0o600)
            size = seal(tmp, self.global_step)
            final = os.path.join(self.directory, f"step-{self.global_step}")
            if os.path.isdir(final):                 # a run killed after this step's save: redone
                shutil.rmtree(final)
            os.replace(tmp, final)
            for old in self.checkpoints()[self.keep:]:
                shutil.rmtree(os.path.join(self.directory, f"step-{old}"), ignore_errors=True)
            self.saved(time.perf_counter() - t0, size)
        accelerator.wait_for_everyone()
        self._saved_step = self.global_step

    # ---- the loop --------------------------------------------------------------------------
    def step(self, accelerator) -> bool:
        """Call after each micro-batch (after ``opt.step()`` in ``accumulate``).  When the
        gradients were synced (an optimizer step): a progress record and the ranks' agreement on
        a stop, a due checkpoint or a pruned trial.  On an agreed stop it checkpoints and raises
        ``SystemExit`` (3: requeue; 0: pruned)."""
        if not accelerator.sync_gradients:
            return False
        flags = self.agree(self.stepped())
        if flags[PRUNE] > 0 or flags[STOP] > 0:
            self.stopped = "pruned" if flags[PRUNE] > 0 else "signal"
            if self.stopped == "signal":
                self.checkpoint(accelerator)
            raise SystemExit(self.close(accelerator))
        if flags[CKPT] > 0:
            self.checkpoint(accelerator)
        return True

    def close(self, accelerator) -> int:
        """The final checkpoint (when the run did not stop), the exit record; the exit status for
        the script: 0 (done or pruned) or 3 (stopped: the job must be requeued).  A run whose
        epochs are all done writes its ``done`` record when the process leaves
        (:meth:`Contract.exit_at_end`): the script's ``torch.save`` of its model after ``close()``
        is part of the work."""
        if self.stopped is None:
            self.checkpoint(accelerator)
        status = self.exit_at_end(log) if self.finished and self.stopped is None else self.exit_record(log)
        accelerator.wait_for_everyone()
        return status
