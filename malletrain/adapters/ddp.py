"""A plain PyTorch DDP loop made malleable: :class:`Malleable`.

A script written the usual way — ``init_process_group``, a ``DistributedSampler``, a
``DataLoader``, ``DistributedDataParallel``, ``backward`` and ``optimizer.step`` per batch,
started by ``torchrun`` — changes in a few lines (README, "Bring your own DDP script")::

    mt = Malleable(args.ckpt, global_batch=256, micro_batch=64)      # after init_process_group
    loader = DataLoader(ds, batch_sampler=mt.sampler(len(ds)))       # was: sampler=DistributedSampler(ds)
    mt.restore(model, opt)                                           # the newest good checkpoint
    for epoch in mt.epochs(args.epochs):                             # was: range(args.epochs)
        for x, y in loader:
            loss = F.cross_entropy(model(x), y) * mt.weight(len(y))  # was: without the weight
            loss.backward()
            mt.step(opt)                                             # was: opt.step(); opt.zero_grad()
    status = mt.close()                                              # 0 done, 3 stopped (requeue)
    dist.destroy_process_group()
    raise SystemExit(status)

**The global batch is kept at every world size.**  Step ``k`` of epoch ``e`` trains on samples
``perm_e[k·G : (k+1)·G]`` of a permutation seeded by (seed, epoch): the same samples whatever the
number of processes ``W``.  They are cut into ``W·A`` micro-batches of near-equal size (``A``,
the accumulation count, is the fewest that keeps each at most ``micro_batch``); rank ``r`` takes
``A`` of them.  Every rank runs the same number of backward passes per step, so DDP's gradient
all-reduce after each of them pairs up; :meth:`weight` scales a micro-batch's mean loss by its
share of the global batch times ``W`` (DDP averages over the ``W`` ranks), so the gradient
applied is the global batch's mean gradient at every ``W``.  :meth:`step` calls the optimizer
after the ``A``-th micro-batch.  Results agree across world sizes to float rounding (the
all-reduce sums in another order), not bitwise: that is :class:`~malletrain.runtime.Runtime`'s
consistency mode.

**Stop, checkpoint, resume.**  At each optimizer step the ranks agree (one small all-reduce) on
whether any of them got SIGTERM/SIGUSR2 (Slurm's preemption, the daemon's requeue, the time-limit
warning), whether a checkpoint is due (``checkpoint_every_s``) and whether a campaign's pruner
stopped the trial.  A stop is a checkpoint of that step boundary (rank 0 writes it atomically:
:class:`~malletrain.runtime.CheckpointStore`) and ``SystemExit(3)``; the batch script requeues
the job, and the next run restores the newest good checkpoint on whatever world size it has, at
the same epoch and step.  A pruned trial exits 0 at once.  Progress (``start``, ``progress``,
``checkpoint``, ``metric``, ``exit``) goes to ``$MALLETRAIN_METRICS`` as the runtime writes it.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from malletrain.adapters.contract import CKPT, PRUNE, STOP, BatchPlan, Contract
from malletrain.domain.errors import InputError

log = logging.getLogger("malletrain.adapters.ddp")


class Malleable(Contract):
    """A DDP loop's side of the contract (module docstring).  Create it after
    ``init_process_group`` (or without one: a single process)."""

    def __init__(self, checkpoint_dir: str, *, global_batch: int, micro_batch: int | None = None,
                 seed: int = 0, checkpoint_every_s: float = 60.0, keep: int = 3,
                 env: dict[str, str] | None = None) -> None:
        rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
        super().__init__(checkpoint_dir, rank=rank, world=world, global_batch=global_batch,
                         micro_batch=micro_batch, seed=seed, checkpoint_every_s=checkpoint_every_s, keep=keep,
                         env=env, mode="ddp")
        self._micro = 0
        self._model: Any = None
        self._optimizer: Any = None
        self._scheduler: Any = None
        self._saved_step = -1

    # ---- data ------------------------------------------------------------------------------
    def sampler(self, dataset_len: int) -> BatchPlan:
        """The ``batch_sampler`` for the DataLoader: this rank's micro-batches of each global
        step, from where the run stands (epoch, step in it)."""
        return self.batch_sampler(dataset_len)

    def epochs(self, total: int) -> Iterator[int]:
        """The epochs left to train (from the restored one); after the last, the run is done."""
        while self.epoch < total:
            yield self.epoch
            if self.per_epoch and self.in_epoch >= self.per_epoch:
                self.epoch, self.in_epoch = self.epoch + 1, 0
        self.finished = True

    # ---- state -----------------------------------------------------------------------------
    def restore(self, model, optimizer, scheduler=None) -> int:
        """Attach the model (DDP-wrapped or not), optimizer and scheduler, and load the newest
        good checkpoint into them (every rank the same file).  Returns the step it resumes at."""
        self._model, self._optimizer, self._scheduler = model, optimizer, scheduler
        chosen = self.store.restore(quarantine=True) if self.rank == 0 else None
        if dist.is_initialized():
            step = torch.tensor([chosen.step if chosen is not None else -1], dtype=torch.long)
            dist.broadcast(step, 0)
            if self.rank != 0 and int(step) >= 0:
                chosen = self.store.restore_step(int(step))
        if chosen is not None:
            st = chosen.state
            if st.get("global_batch") != self.global_batch or st.get("seed") != self.seed:
                raise InputError(f"checkpoint was written with global_batch={st.get('global_batch')}, "
                                 f"seed={st.get('seed')}; this run has {self.global_batch}, {self.seed}: "
                                 "the data order would change (use a new checkpoint directory)",
                                 path=self.store.directory)
            _module(model).load_state_dict(st["model"])
            optimizer.load_state_dict(st["optimizer"])
            if scheduler is not None and st.get("scheduler") is not None:
                scheduler.load_state_dict(st["scheduler"])
            self.global_step, self.epoch, self.in_epoch = int(st["step"]), int(st["epoch"]), int(st["in_epoch"])
            torch.set_rng_state(st["rng"])
            log.info("restored %s (step %d, epoch %d) in %.3fs", chosen.path, self.global_step, self.epoch,
                     chosen.read_s)
        self._saved_step = self.global_step
        self.started(chosen.read_s if chosen is not None else 0.0)
        log.info("rank %d/%d resumes at step %d (epoch %d); %d micro-batch(es) of the global batch %d per step",
                 self.rank, self.world, self.global_step, self.epoch, self.accumulation, self.global_batch)
        return self.global_step

    def state(self) -> dict:
        return {"model": _module(self._model).state_dict(), "optimizer": self._optimizer.state_dict(),
                "scheduler": self._scheduler.state_dict() if self._scheduler is not None else None,
                "step": self.global_step, "epoch": self.epoch, "in_epoch": self.in_epoch,
                "global_batch": self.global_batch, "seed": self.seed, "rng": torch.get_rng_state()}

    def checkpoint(self) -> None:
        """Write a checkpoint of this step boundary (every rank calls it; rank 0 writes)."""
        if self._saved_step == self.global_step:
            return
        t0 = time.perf_counter()
        if self.rank == 0:
            saved = self.store.save(self.global_step, self.state())
            self.saved(time.perf_counter() - t0, saved.bytes)
        if dist.is_initialized():
            dist.barrier()
        self._saved_step = self.global_step

    # ---- the loop --------------------------------------------------------------------------
    def step(self, optimizer=None, scheduler=None) -> bool:
        """Call after each micro-batch's backward.  After the ``accumulation``-th: the optimizer
        (and scheduler) step, gradients zeroed, a progress record, and the ranks' agreement on a
        stop, a due checkpoint or a pruned trial.  Returns whether the optimizer stepped.  On an
        agreed stop it checkpoints and raises ``SystemExit`` (3: requeue; 0: pruned)."""
        self._micro += 1
        if self._micro < self.accumulation:
            return False
        self._micro = 0
        opt = optimizer or self._optimizer
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched = scheduler or self._scheduler
        if sched is not None:
            sched.step()
        flags = self.agree(self.stepped())
        if flags[PRUNE] > 0 or flags[STOP] > 0:
            self.stopped = "pruned" if flags[PRUNE] > 0 else "signal"
            if self.stopped == "signal":
                self.checkpoint()
            status = self.close()
            if dist.is_initialized():
                dist.destroy_process_group()    # as the script would have at its end
            raise SystemExit(status)
        if flags[CKPT] > 0:
            self.checkpoint()
        return True

    def close(self) -> int:
        """The final checkpoint (when the run did not stop), the exit record; the exit status for
        the script: 0 (done or pruned) or 3 (stopped: the job must be requeued).  A run whose
        epochs are all done writes its ``done`` record when the process leaves
        (:meth:`Contract.exit_at_end`): what the script does after ``close()`` is part of the work."""
        if self.stopped is None:
            self.checkpoint()
        status = self.exit_at_end(log) if self.finished and self.stopped is None else self.exit_record(log)
        if dist.is_initialized():
            dist.barrier()      # every rank is past its last collective before any leaves the group
        return status


def _module(model):
    """The module under a DDP wrapper (its state dict has no ``module.`` prefix)."""
    return getattr(model, "module", model)
