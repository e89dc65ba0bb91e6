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
import math
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from malletrain.domain.errors import InputError
from malletrain.runtime.checkpoint import CheckpointStore
from malletrain.runtime.launch import discover
from malletrain.runtime.logical import mix
from malletrain.runtime.metrics import MetricsWriter
from malletrain.runtime.signals import StopRequest

log = logging.getLogger("malletrain.adapters.ddp")

EXIT_STOPPED = 3
STOP, CKPT, PRUNE = range(3)


class Malleable:
    """A DDP loop's side of the contract (module docstring).  Create it after
    ``init_process_group`` (or without one: a single process)."""

    def __init__(self, checkpoint_dir: str, *, global_batch: int, micro_batch: int | None = None,
                 seed: int = 0, checkpoint_every_s: float = 60.0, keep: int = 3,
                 env: dict[str, str] | None = None) -> None:
        env = dict(os.environ) if env is None else env
        self.rank, self.world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
        if not isinstance(global_batch, int) or global_batch < self.world:
            raise InputError(f"global_batch must be an integer >= the {self.world} processes, got {global_batch!r}")
        if micro_batch is not None and (not isinstance(micro_batch, int) or micro_batch < 1):
            raise InputError(f"micro_batch must be an integer >= 1 (or None), got {micro_batch!r}")
        if not checkpoint_every_s >= 0:
            raise InputError(f"checkpoint_every_s must be >= 0 (0: only when stopping), got {checkpoint_every_s!r}")
        self.global_batch, self.seed = int(global_batch), int(seed)
        share = math.ceil(self.global_batch / self.world)
        self.accumulation = max(1, math.ceil(share / micro_batch)) if micro_batch else 1
        self.checkpoint_every_s = float(checkpoint_every_s)
        self.store = CheckpointStore(checkpoint_dir, keep)
        os.makedirs(checkpoint_dir, mode=0o700, exist_ok=True)
        try:
            grace = float(env.get("MALLETRAIN_GRACE_S") or 30.0)
        except ValueError:
            grace = 30.0
        self.stop = StopRequest(deadline_s=max(0.1, grace / 2)).install()
        info = discover(env)      # the job, restart, node count and node, as the runtime reads them
        base = dict(job=info.job, world=self.world, nodes=info.nodes, node=info.node, restart=info.restart)
        self.metrics = MetricsWriter(env.get("MALLETRAIN_METRICS") if self.rank == 0 else None, base=base)
        self.global_step = 0          # optimizer steps done
        self.epoch = 0
        self.in_epoch = 0             # steps done in the current epoch
        self.per_epoch = 0            # steps per epoch (set by sampler())
        self.finished = False
        self.stopped: str | None = None
        self._micro = 0
        self._model: Any = None
        self._optimizer: Any = None
        self._scheduler: Any = None
        self._last_ckpt_t = time.monotonic()
        self._saved_step = -1
        self._prune = False
        self._reporter: Any = None
        self._t_step = time.perf_counter()
        self._perm: tuple[int, int, list[int]] | None = None     # (epoch, dataset_len, permutation)

    # ---- data ------------------------------------------------------------------------------
    def sampler(self, dataset_len: int) -> _BatchSampler:
        """The ``batch_sampler`` for the DataLoader: this rank's micro-batches of each global
        step, from where the run stands (epoch, step in it)."""
        self.per_epoch = dataset_len // self.global_batch
        if self.per_epoch < 1:
            raise InputError(f"dataset of {dataset_len} samples is smaller than one global batch ({self.global_batch})")
        return _BatchSampler(self, dataset_len)

    def micro_batches(self, epoch: int, step_in_epoch: int, dataset_len: int) -> list[list[int]]:
        """This rank's micro-batches (sample indices) of step ``step_in_epoch`` of ``epoch``."""
        if self._perm is None or self._perm[:2] != (epoch, dataset_len):     # drawn once per epoch
            g = torch.Generator().manual_seed(mix(self.seed, epoch))
            self._perm = (epoch, dataset_len, torch.randperm(dataset_len, generator=g).tolist())
        batch = self._perm[2][step_in_epoch * self.global_batch:(step_in_epoch + 1) * self.global_batch]
        parts = self.world * self.accumulation
        cuts = [len(batch) * i // parts for i in range(parts + 1)]
        mine = range(self.rank * self.accumulation, (self.rank + 1) * self.accumulation)
        return [batch[cuts[i]:cuts[i + 1]] for i in mine]

    def weight(self, n: int) -> float:
        """What a micro-batch of ``n`` samples' mean loss is multiplied by: its share of the
        global batch, times the world size (DDP averages the ranks' gradients)."""
        return n * self.world / self.global_batch

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
        self.metrics.record("start", step=self.global_step, samples=self.samples, step_s=0.0, mode="ddp",
                            restore_s=round(chosen.read_s, 4) if chosen is not None else 0.0)
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
            self.metrics.record("checkpoint", step=self.global_step, samples=self.samples, step_s=0.0,
                                write_s=round(time.perf_counter() - t0, 4), bytes=saved.bytes)
        if dist.is_initialized():
            dist.barrier()
        self._saved_step, self._last_ckpt_t = self.global_step, time.monotonic()

    @property
    def samples(self) -> int:
        return self.global_step * self.global_batch

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
        self.global_step += 1
        self.in_epoch += 1
        now = time.perf_counter()
        self.metrics.record("progress", step=self.global_step, samples=self.samples,
                            step_s=round(now - self._t_step, 5))
        self._t_step = now
        flags = torch.tensor([float(self.stop.requested), 0.0, float(self._prune)])
        every = self.checkpoint_every_s
        if self.rank == 0 and every and time.monotonic() - self._last_ckpt_t >= every:
            flags[CKPT] = 1.0
        if dist.is_initialized():
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
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

    def report(self, value: float, **fields: float) -> bool:
        """A validation value at this step: a ``metric`` record, and in a campaign trial the
        study's pruner is asked (rank 0; the verdict is agreed at the next step).  Returns whether
        the trial is being pruned."""
        extra = {k: float(v) for k, v in fields.items()}
        prune = False
        if self.rank == 0 and not self._prune:
            if self._reporter is None:
                from malletrain.campaign.trial import Reporter
                self._reporter = Reporter.from_env() or False
            if self._reporter:
                from malletrain.campaign.trial import reporter_verdict
                prune, promise = reporter_verdict(self._reporter, value, steps=self.global_step,
                                                  samples=self.samples, epochs=self.epoch)
                if promise is not None:
                    extra["promise"] = promise
        self.metrics.record("metric", step=self.global_step, samples=self.samples, step_s=0.0, value=float(value),
                            prune=prune, **extra)
        self._prune = self._prune or prune
        return self._prune

    def close(self) -> int:
        """The final checkpoint (when the run did not stop), the exit record; the exit status for
        the script: 0 (done or pruned) or 3 (stopped: the job must be requeued)."""
        if self.stopped is None:
            self.checkpoint()
        since = self.stop.since_s()
        reason = "done" if self.finished else (self.stopped or "closed")
        if since is not None:
            log.warning("stop: %s -> checkpoint of step %d and exit %.2fs after the signal",
                        self.stop.name(), self.global_step, since)
        self.metrics.record("exit", step=self.global_step, samples=self.samples, step_s=0.0, reason=reason,
                            signal=self.stop.name() if since is not None else None,
                            signal_to_exit_s=round(since, 3) if since is not None else None)
        self.metrics.close()
        self.stop.uninstall()
        sys.stdout.flush()
        if dist.is_initialized():
            dist.barrier()      # every rank is past its last collective before any leaves the group
        return EXIT_STOPPED if self.stopped == "signal" else 0


class _BatchSampler:
    """This rank's micro-batches of every step left in the current epoch (``len``: how many)."""

    def __init__(self, owner: Malleable, dataset_len: int) -> None:
        self.owner, self.n = owner, dataset_len

    def __iter__(self) -> Iterator[list[int]]:
        o = self.owner
        epoch, first = o.epoch, o.in_epoch
        for k in range(first, o.per_epoch):
            yield from o.micro_batches(epoch, k, self.n)

    def __len__(self) -> int:
        return max(0, self.owner.per_epoch - self.owner.in_epoch) * self.owner.accumulation


def _module(model):
    """The module under a DDP wrapper (its state dict has no ``module.`` prefix)."""
    return getattr(model, "module", model)
