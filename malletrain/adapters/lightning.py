"""A PyTorch Lightning (2.x) training script made malleable: :class:`Malleable`, a callback.

A script written the usual way — a ``LightningModule``, its ``train_dataloader``, a ``Trainer``
and ``trainer.fit`` — started by ``torchrun`` (``malletrain submit --launch torchrun``) changes
in a few lines (README, "Bring your own Lightning script")::

    mt = Malleable(args.ckpt, global_batch=256, micro_batch=64)
    ...   # in the LightningModule:
        loss = F.cross_entropy(self(x), y) * mt.weight(len(y))      # was: without the weight
        mt.report(acc)                                                # at validation, after self.log
    def train_dataloader(self):
        return mt.dataloader(self.train_set)                          # was: DataLoader(..., shuffle=True)
    trainer = L.Trainer(max_epochs=E, **mt.trainer_args())            # devices, nodes, callback, I/O
    trainer.fit(model, ckpt_path=mt.resume_from())                    # the newest good checkpoint

**What Lightning does that a harvester must undo, and how.**

* *Its SLURM environment requeues the job itself* on SIGUSR1 (``scontrol requeue``), which
  fights the daemon's hold → update → release.  Under torchrun Lightning picks its
  TorchElastic environment instead, which never requeues; :meth:`Malleable.trainer_args`
  sets ``devices`` and ``num_nodes`` from torchrun's world (they change with every rescale).
* *Its SIGTERM handler* broadcasts from inside the signal handler and raises at the next batch
  end, mid-accumulation.  From ``on_train_start`` (after Lightning installed its handlers) this
  callback's own handlers take SIGTERM and SIGUSR2: they only set a flag.  At each optimizer
  step the ranks agree on it (one small all-reduce); a stop is a checkpoint of that step
  boundary and ``SystemExit(3)`` out of ``trainer.fit`` (Lightning tears down on the way), so the
  batch script requeues the job.  A campaign's pruned trial exits 0 the same way.
* *Its checkpoints are not atomic* and a restart mid-epoch does not know the data already
  seen.  The checkpoint goes through a ``CheckpointIO`` plugin onto
  :class:`~malletrain.runtime.CheckpointStore` (temporary file, fsync, rename, checksum,
  ``weights_only`` loading, the newest good one wins); :meth:`Malleable.resume_from` names it.
* *Its accumulation and data split depend on the world size.*  :meth:`Malleable.dataloader`
  yields this rank's micro-batches of each global step (the plan of
  :mod:`malletrain.adapters.contract`, world-size independent), from the step the run stands at;
  the callback sets ``accumulate_grad_batches`` for the current world and, on every load,
  rewrites Lightning's epoch and batch counters from its own position at the new world's
  accumulation (its ``global_step``, the optimizer steps, does not change).
* *Its fit ends before the script does* (``torch.save`` of the model after ``fit``).  The fit
  ends with a checkpoint, and the final ``exit`` record (``done``) is written when the process
  leaves cleanly (:meth:`Contract.exit_at_end`); until then a stop only sets the flag, so a job
  stopped while the script saves its model finishes the save, and one killed during it is
  requeued, restored at its end (Lightning trains nothing) and saves again.
* *Its loop counters go wrong after a restore at an epoch's last step* (2.6 never counts that
  run's first epoch as begun): another reason they are rewritten, never trusted, on load.

Results agree across world sizes to float rounding (the all-reduce sums in another order), not
bitwise, as with the DDP adapter.
"""
from __future__ import annotations

import logging
import os
import signal
import time
from typing import Any

import pytorch_lightning as pl
import torch
import torch.distributed as dist
from lightning_fabric.plugins.io.torch_io import TorchCheckpointIO
from torch.utils.data import DataLoader

from malletrain.adapters.contract import CKPT, PRUNE, STOP, Contract, loader_kwargs, torchrun_place
from malletrain.domain.errors import InputError
from malletrain.runtime.checkpoint import NAME, CheckpointStore

log = logging.getLogger("malletrain.adapters.lightning")

STATE_KEY = "malletrain"


def _validates(trainer, epoch: int) -> bool:
    """Whether Lightning validates after the last batch of ``epoch``: a validation loop, an
    epoch that ``check_val_every_n_epoch`` names, and validation at each epoch's end
    (``val_check_interval`` 1.0, the default).  Anything else (validation every so many
    batches or seconds) is taken as no: the report may then be lost, never the training."""
    every = getattr(trainer, "check_val_every_n_epoch", None)
    try:
        enabled = bool(trainer.enable_validation)
    except (AttributeError, TypeError):
        return False
    return (enabled and isinstance(every, int) and every > 0 and (epoch + 1) % every == 0
            and getattr(trainer, "val_check_interval", None) == 1.0)


class Malleable(Contract, pl.Callback):
    """The Lightning side of the contract (module docstring).  Create it before the ``Trainer``
    (torchrun's ``RANK``/``WORLD_SIZE`` say where this process stands; without torchrun: one
    process)."""

    def __init__(self, checkpoint_dir: str, *, global_batch: int, micro_batch: int | None = None,
                 seed: int = 0, checkpoint_every_s: float = 60.0, keep: int = 3,
                 env: dict[str, str] | None = None) -> None:
        env = dict(os.environ) if env is None else env
        rank, world = torchrun_place(env)
        try:
            self.local_world = int(env.get("LOCAL_WORLD_SIZE", str(world)))
        except ValueError:
            raise InputError("LOCAL_WORLD_SIZE must be an integer (torchrun sets it)") from None
        if not (1 <= self.local_world <= world and world % self.local_world == 0):
            raise InputError(f"RANK={rank}, WORLD_SIZE={world}, LOCAL_WORLD_SIZE={self.local_world} do not fit")
        Contract.__init__(self, checkpoint_dir, rank=rank, world=world, global_batch=global_batch,
                          micro_batch=micro_batch, seed=seed, checkpoint_every_s=checkpoint_every_s,
                          keep=keep, env=env, mode="lightning")
        self.torchrun = "TORCHELASTIC_RUN_ID" in env
        self.io = _StoreIO(self.store)
        self._trainer: Any = None
        self._seen_step = 0
        self._resumed: tuple[str, float] | None = None       # (path, read seconds)
        self._handlers: dict[int, Any] = {}
        self._saved_step = -1

    # ---- what the script passes to Lightning ---------------------------------------------
    def trainer_args(self, *, callbacks: list | tuple = (), plugins: list | tuple = ()) -> dict[str, Any]:
        """Keyword arguments for ``Trainer``: the world's ``devices`` and ``num_nodes``, the DDP
        strategy, this callback and the checkpoint I/O (after the script's own ``callbacks`` and
        ``plugins``), and Lightning's distributed sampler off (the adapter's data plan splits the
        data)."""
        from lightning_fabric.plugins.environments import LightningEnvironment
        env = [] if self.torchrun else [LightningEnvironment()]     # never Lightning's SLURM requeue
        return {"devices": self.local_world, "num_nodes": self.world // self.local_world,
                "strategy": "ddp" if self.world > 1 else "auto", "use_distributed_sampler": False,
                "callbacks": [*callbacks, self], "plugins": [*plugins, self.io, *env]}

    def dataloader(self, dataset, **kwargs) -> DataLoader:
        """The training DataLoader: this rank's micro-batches of every global step left in the
        epoch.  ``kwargs`` go to ``DataLoader`` (``num_workers``, ``collate_fn``, ...), not
        ``batch_size``, ``shuffle``, ``sampler`` or ``drop_last``: the adapter's plan decides them."""
        kwargs = loader_kwargs(kwargs)
        return DataLoader(dataset, batch_sampler=self.batch_sampler(len(dataset), whole_epoch=True), **kwargs)

    def resume_from(self) -> str | None:
        """The newest good checkpoint's path (for ``trainer.fit(ckpt_path=...)``), or None.  Each
        rank reads and checks the files itself (the process group does not exist yet), so all
        choose alike; the state read is kept for Lightning's load."""
        chosen = self.store.restore(quarantine=False)
        if chosen is None:
            return None
        self.io.keep(chosen.path, chosen.state)
        self._resumed = (chosen.path, chosen.read_s)
        return chosen.path

    def weight(self, n: int) -> float:
        """What a micro-batch of ``n`` samples' mean loss is multiplied by: its share of the
        global batch, times the world size (DDP averages the ranks' gradients) and the
        accumulation count (Lightning divides each micro-batch's loss by it)."""
        return n * self.world * self.accumulation / self.global_batch

    def report(self, value: float, **fields: float) -> bool:
        """As :meth:`Contract.report`; a value from Lightning's sanity check before training
        (``num_sanity_val_steps``) is no report."""
        if self._trainer is not None and self._trainer.sanity_checking:
            return False
        return super().report(value, **fields)

    # ---- Lightning's hooks -----------------------------------------------------------------
    def setup(self, trainer, pl_module, stage: str) -> None:
        if trainer.world_size != self.world:
            raise InputError(f"the Trainer has {trainer.world_size} processes, the job {self.world}: "
                             "pass **mt.trainer_args() to the Trainer")
        trainer.accumulate_grad_batches = self.accumulation
        self._trainer = trainer
        if self.rank == 0 and self._resumed is not None:        # newer files that failed: set aside
            step = int(NAME.match(os.path.basename(self._resumed[0])).group(1))      # type: ignore[union-attr]
            for newer in (s for s in self.store.steps() if s > step):
                path = self.store.path(newer)
                log.warning("checkpoint %s is unusable; set aside as %s.corrupt", path, path)
                os.replace(path, path + ".corrupt")

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.global_step, "epoch": self.epoch, "in_epoch": self.in_epoch,
                "per_epoch": self.per_epoch, "global_batch": self.global_batch, "seed": self.seed, "world": self.world,
                "accumulation": self.accumulation, "rng": torch.get_rng_state()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        st = state_dict
        if st.get("global_batch") != self.global_batch or st.get("seed") != self.seed:
            raise InputError(f"checkpoint was written with global_batch={st.get('global_batch')}, "
                             f"seed={st.get('seed')}; this run has {self.global_batch}, {self.seed}: "
                             "the data order would change (use a new checkpoint directory)",
                             path=self.store.directory)
        self.global_step, self.epoch, self.in_epoch = int(st["step"]), int(st["epoch"]), int(st["in_epoch"])
        torch.set_rng_state(st["rng"])

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict[str, Any]) -> None:
        """Lightning's loop counters, rewritten from the adapter's own (epoch, steps done in it,
        accumulation): the epoch begun and not finished, ``in_epoch × accumulation`` of its
        micro-batches done, saved at a batch end (every checkpoint is written at a step boundary
        in ``on_train_batch_end``).  What Lightning kept is not used: a checkpoint of another
        world size counts another number of micro-batches a step, and Lightning 2.6's own totals
        go wrong after a restore at an epoch's last step (it never counts that run's first epoch
        as begun; a later restore then skipped or repeated data)."""
        st = checkpoint.get("callbacks", {}).get(self.state_key, {})
        loops = checkpoint.get("loops", {}).get("fit_loop")
        if not isinstance(loops, dict) or not all(isinstance(st.get(k), int) for k in ("epoch", "in_epoch")):
            return
        epoch, done = st["epoch"], st["in_epoch"] * self.accumulation
        per_epoch = st.get("per_epoch")
        last = done > 0 and (st["in_epoch"] >= per_epoch if isinstance(per_epoch, int) and per_epoch > 0
                             else bool(loops["epoch_loop.batch_progress"].get("is_last_batch")))
        begun = {"ready": epoch + 1, "started": epoch + 1, "processed": epoch, "completed": epoch}
        loops["epoch_progress"] = {"total": dict(begun), "current": dict(begun)}
        total = max(done, int(loops["epoch_loop.batch_progress"]["total"].get("processed", 0)))
        # saved at a batch end: the last micro-batch processed, not yet completed
        end = 1
        if last and _validates(trainer, epoch):
            # Saved at the epoch's last batch, so before the epoch's validation (which Lightning
            # runs after it): resumed as "restarted on the last batch, in the middle of the
            # validation", Lightning runs the validation first (its report, a rung of a pruner)
            # and then ends the epoch; as saved at a batch end it would skip it.  (Only for an
            # epoch that validates: without a validation to run, Lightning trains on from there.)
            end = 0
            val = loops.get("epoch_loop.val_loop.batch_progress")
            seen = val.get("total", {}).get("completed", 0) if isinstance(val, dict) else 0
            seen = seen if isinstance(seen, int) and seen >= 0 else 0
            loops["epoch_loop.val_loop.batch_progress"] = {
                "total": {"ready": seen + 1, "started": seen + 1, "processed": seen, "completed": seen},
                "current": {"ready": 1, "started": 1, "processed": 0, "completed": 0}, "is_last_batch": False}
            stepped = loops.get("epoch_loop.state_dict")
            if isinstance(stepped, dict) and isinstance(stepped.get("_batches_that_stepped"), int):
                stepped["_batches_that_stepped"] += 1       # Lightning adds it on a batch-end restore
        loops["epoch_loop.batch_progress"] = {
            "total": {"ready": total, "started": total, "processed": total, "completed": total - end},
            "current": {"ready": done, "started": done, "processed": done, "completed": done - end},
            "is_last_batch": last}
        if st.get("accumulation") != self.accumulation:
            log.info("checkpoint of %d process(es) loaded on %d: %d micro-batch(es) a step instead of %s",
                     st.get("world"), self.world, self.accumulation, st.get("accumulation"))

    def on_train_start(self, trainer, pl_module) -> None:
        # after Lightning installed its own handlers (its teardown puts back what was there)
        for sig in (signal.SIGTERM, signal.SIGUSR2):
            self._handlers[sig] = signal.getsignal(sig)
            signal.signal(sig, lambda signum, frame: self.stop.notify(signum))
        self._seen_step = self._saved_step = trainer.global_step
        if self.global_step != trainer.global_step:
            raise InputError(f"the checkpoint's step {trainer.global_step} is not the adapter's {self.global_step}")
        self.started(self._resumed[1] if self._resumed else 0.0)
        log.info("rank %d/%d resumes at step %d (epoch %d, step %d of it); %d micro-batch(es) of the global batch "
                 "%d per step", self.rank, self.world, self.global_step, self.epoch, self.in_epoch,
                 self.accumulation, self.global_batch)

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if trainer.current_epoch != self.epoch:
            self.epoch, self.in_epoch = trainer.current_epoch, 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if trainer.global_step == self._seen_step:
            return                                       # a micro-batch that did not step
        self._seen_step = trainer.global_step
        flags = self.agree(self.stepped())
        if flags[PRUNE] > 0 or flags[STOP] > 0:
            self.stopped = "pruned" if flags[PRUNE] > 0 else "signal"
            if self.stopped == "signal":
                self._checkpoint(trainer)
            raise SystemExit(self._close())
        if flags[CKPT] > 0:
            self._checkpoint(trainer)

    def on_train_end(self, trainer, pl_module) -> None:
        """The fit ended on its own (its epochs or steps, or the script's early stopping): the
        training is done.  The final checkpoint; the exit record waits for the process to leave
        (:meth:`on_fit_end`, :meth:`Contract.exit_at_end`): the script's lines after ``fit`` are part of
        the work."""
        self.finished = True
        self._checkpoint(trainer)
        if dist.is_initialized():
            dist.barrier()      # every rank is past its last collective of the fit

    def on_fit_end(self, trainer, pl_module) -> None:
        """After Lightning's teardown, which put back the signal handlers that were there before
        ``fit``.  A run restored at its end trained nothing (Lightning skips the loop: no train
        start or end); its work is done all the same.  From here to the process's exit a stop
        only sets the flag again (the script's own save goes on), and the final ``exit`` record
        is written at interpreter exit (:meth:`Contract.exit_at_end`)."""
        if not self.finished and trainer.fit_loop.done:
            self.finished = True
            self.global_step = trainer.global_step
            self.started(self._resumed[1] if self._resumed else 0.0)
            log.info("rank %d/%d restored at the end of its training (step %d): nothing to train",
                     self.rank, self.world, self.global_step)
        if not self.finished or self._exit_pending:
            return
        for sig in (signal.SIGTERM, signal.SIGUSR2):
            self._handlers.setdefault(sig, signal.getsignal(sig))
            signal.signal(sig, lambda signum, frame: self.stop.notify(signum))
        self.exit_at_end(log)

    # ---- internals -------------------------------------------------------------------------
    def _checkpoint(self, trainer) -> None:
        if self._saved_step == self.global_step:
            return
        t0 = time.perf_counter()
        trainer.save_checkpoint(self.store.path(self.global_step))      # every rank; rank 0 writes
        self._saved_step = self.global_step
        if self.rank == 0:
            self.saved(time.perf_counter() - t0, os.path.getsize(self.store.path(self.global_step)))

    def _close(self) -> int:
        if self.stopped != "signal":        # on a stop, the flag handlers stay (Contract.exit_record)
            for sig, handler in self._handlers.items():
                signal.signal(sig, handler)
            self._handlers = {}
        status = self.exit_record(log)
        if dist.is_initialized():
            dist.barrier()      # every rank is past its last collective before any leaves
        return status


class _StoreIO(TorchCheckpointIO):
    """Lightning's checkpoint I/O onto the adapter's :class:`CheckpointStore` for the files it
    names (``ckpt-<step>.pt`` in its directory); other paths (a ``ModelCheckpoint`` of the
    script's own) as Lightning writes them."""

    def __init__(self, store: CheckpointStore) -> None:
        super().__init__()
        self.store = store
        self._kept: tuple[str, dict] | None = None

    def keep(self, path: str, state: dict) -> None:
        self._kept = (path, state)

    def _step(self, path) -> int | None:
        path = os.fspath(path)
        m = NAME.match(os.path.basename(path))
        if m and os.path.abspath(os.path.dirname(path)) == os.path.abspath(self.store.directory):
            return int(m.group(1))
        return None

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        step = self._step(path)
        if step is None:
            return super().save_checkpoint(checkpoint, path, storage_options)
        self.store.save(step, _plain(checkpoint))

    def load_checkpoint(self, path, map_location: Any = None, weights_only: bool | None = None) -> dict[str, Any]:
        if self._step(path) is None:
            return super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)
        if self._kept is not None and self._kept[0] == os.fspath(path):
            state, self._kept = self._kept[1], None
            return state
        try:
            return CheckpointStore.read(os.fspath(path))
        except ValueError as exc:
            raise InputError(f"checkpoint {path} is unusable: {exc}") from None


def _plain(obj):
    """Dict subclasses (Lightning's ``AttributeDict`` hyper-parameters) as plain dicts: the
    store loads with ``weights_only``, which refuses classes it does not know."""
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_plain(v) for v in obj]
    return obj
