"""The malleable training loop a script adopts in a few lines.

    rt = Runtime(RuntimeConfig.from_env(checkpoint_dir="ckpt", logical_workers=4, micro_batch=16))
    rt.prepare(model, optimizer, scheduler, data=(X, y))     # restores the newest checkpoint
    for step in rt.steps(total_steps):
        rt.train_step(lambda m, batch: F.cross_entropy(m(batch[0]), batch[1]))
    rt.close()                                               # final checkpoint, exit record

A step in **consistency** mode (the default):

1. Each process runs its logical workers one after the other.  Before worker
   w: the model's buffers are reset to their value at the start of the step
   (every worker sees the same BatchNorm statistics, as DDP's broadcast gives
   every replica rank 0's buffers) and the RNG is switched to w's own stream;
   w's micro-batch is a pure function of (seed, epoch, step, w).
2. Each worker's flattened gradient (plus its loss and the stop flags) is one
   row; every process all-gathers every row and sums them in worker order
   0..L-1, so the sum is the same float operations on every process and for
   every P.  The mean is applied as the gradient; the optimizer steps.
3. Buffers become those left by worker 0's forward: their raw bytes ride in
   worker 0's row (a bit-exact carrier), so no extra collective is needed.

In **tolerance** mode each process runs its workers' samples as one batch and
the gradients meet in the native all-reduce: faster, equal only to rounding.

Stop flags ride along with the gradients, so every process stops at the same
step boundary even when only one of them got the signal; a forced stop
abandons the step in progress and checkpoints the last boundary.
"""
from __future__ import annotations

import datetime
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from malletrain.domain.errors import InputError
from malletrain.runtime import logical
from malletrain.runtime.checkpoint import BackgroundSave, CheckpointStore, snapshot
from malletrain.runtime.config import RuntimeConfig
from malletrain.runtime.launch import DistInfo, discover_process
from malletrain.runtime.metrics import MetricsWriter
from malletrain.runtime.rendezvous import RendezvousError, handshake
from malletrain.runtime.signals import StopRequest

log = logging.getLogger("malletrain.runtime")

# exit status of a run that stopped (signal) before its last step: the sbatch template
# requeues the job on it (Slurm alone would count a job that exits during its preemption
# grace time as COMPLETED and never run it again)
EXIT_STOPPED = 3
# how an elastic job's member ends without ending the job (:mod:`.elastic`): it left (a signal),
# was left out by the others, or was never admitted; the group trains on without it
OUT_OF_GROUP = ("left", "lost", "unadmitted")

# extra columns after the flattened gradient in each exchanged row (LEAVE and JOIN: an elastic
# job's membership changes, :mod:`.elastic`)
LOSS, STOP, FORCE, CKPT, PRUNE, LEAVE, JOIN = range(7)
EXTRA = 7
Flags = tuple[float, float, float, float, float, float]   # stop, force, ckpt, prune, leave, join


@dataclass(frozen=True)
class StepResult:
    step: int          # steps completed after this one
    loss: float        # mean loss over the L logical workers
    applied: bool      # False when a forced stop abandoned the step


class Runtime:
    def __new__(cls, cfg: RuntimeConfig, *args, **kwargs):
        if cls is Runtime and cfg.elastic:       # members that leave and join (:mod:`.elastic`)
            from malletrain.runtime.elastic import ElasticRuntime
            return super().__new__(ElasticRuntime)
        return super().__new__(cls)

    def __init__(self, cfg: RuntimeConfig, info: DistInfo | None = None) -> None:
        self.cfg = cfg
        self.info = info or discover_process()
        torch.set_num_threads(cfg.threads)
        if cfg.mode == "consistency":
            torch.use_deterministic_algorithms(True, warn_only=True)
        backend = cfg.backend
        if backend == "auto":
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        self.backend = backend
        if backend == "nccl":
            torch.cuda.set_device(self.info.local_rank)
            self.device = torch.device("cuda", self.info.local_rank)
        else:
            self.device = torch.device("cpu")
        mapping = [list(x) for x in cfg.mapping] if isinstance(cfg.mapping, (list, tuple)) else cfg.mapping
        try:
            self.owned = logical.assign(cfg.logical_workers, self.info.world, mapping)
        except ValueError as exc:
            raise InputError(str(exc)) from None
        self.mine = self.owned[self.info.rank]
        self.where = {w: (r, i) for r, ws in enumerate(self.owned) for i, w in enumerate(ws)}
        self.pg: Any = None
        self.timings: dict[str, float] = {}
        if self.info.world > 1:
            self._init_group()
        self.store = CheckpointStore(cfg.checkpoint_dir, cfg.keep)
        os.makedirs(cfg.checkpoint_dir, mode=0o700, exist_ok=True)   # private by default
        self.stop = StopRequest(deadline_s=cfg.deadline_s).install()
        self.metrics = self._metrics_writer()
        self.step = 0
        self.stopped: str | None = None       # None | "signal" | "forced" | "pruned"
        self.finished = False
        self._total_steps: int | None = None
        self._prune = False                   # this rank heard the pruner say stop
        self._reporter: Any = None            # a campaign trial's study (rank 0), found on the first report
        self._step_times: list[float] = []
        self._last_ckpt_t = time.monotonic()
        self._saved_step = -1
        self._bg: BackgroundSave | None = None   # rank 0's checkpoint being written by a thread

    # ---- setup -------------------------------------------------------------------------
    def _metrics_writer(self, **base) -> MetricsWriter:
        """Progress records, written by rank 0 alone (the others get a writer that drops them)."""
        base = dict(job=self.info.job, world=self.info.world, nodes=self.info.nodes,
                    node=self.info.node, restart=self.info.restart, **base)
        return MetricsWriter(self.cfg.metrics_path if self.info.rank == 0 else None, base=base,
                             min_interval_s=self.cfg.report_s)

    def _init_group(self) -> None:
        """The process group, after the authenticated handshake (:mod:`.rendezvous`): every
        rank proves it read this run's private key before anything it sends is used."""
        t0 = time.perf_counter()
        timeout = datetime.timedelta(seconds=self.cfg.collective_timeout_s)
        where = f"{self.info.master_addr}:{self.info.master_port}"
        # under torchrun the agent already serves a store there: every rank is its client
        master = self.info.rank == 0 and not self.info.agent_store
        try:
            self._store = dist.TCPStore(self.info.master_addr, self.info.master_port,
                                        world_size=self.info.world, is_master=master,
                                        timeout=timeout, wait_for_workers=False)
        except Exception as exc:   # noqa: BLE001 - c10d's errors: port taken, host unreachable
            raise RendezvousError(f"rendezvous store at {where}: {str(exc)[:300]}") from None
        proof = handshake(self._store, self.info.rank, self.info.world, self.cfg.checkpoint_dir,
                          self.cfg.collective_timeout_s)
        dist.init_process_group(self.backend, store=dist.PrefixStore(proof.prefix, self._store),
                                rank=self.info.rank, world_size=self.info.world, timeout=timeout)
        self.pg = dist.group.WORLD
        mine = torch.tensor(list(proof.peer_token(self.info.rank)), dtype=torch.uint8, device=self.device)
        rows = [torch.empty_like(mine) for _ in range(self.info.world)]
        dist.all_gather(rows, mine)
        for r, row in enumerate(rows):
            if bytes(row.cpu().tolist()) != proof.peer_token(r):
                dist.destroy_process_group()
                self.pg = None
                raise RendezvousError(f"rendezvous: the process connected as rank {r} does not know "
                                      "this run's key: refusing to train with it")
        self.timings["init_group_s"] = time.perf_counter() - t0

    def prepare(self, model, optimizer, scheduler=None, *, data) -> Runtime:
        """Attach the model, optimizer, scheduler and dataset; restore the newest checkpoint."""
        t0 = time.perf_counter()
        self._attach(model, optimizer, scheduler, data)
        restored = self._restore_agreed()
        if restored is None:
            self._broadcast_initial()
            if self.cfg.mode == "tolerance":
                self._seed_rng(logical.mix(self.cfg.seed, 0, self.info.rank))
        else:
            self._load(restored.state)
            log.info("restored %s (step %d) in %.3fs", restored.path, restored.step, restored.read_s)
        self._started(t0)
        return self

    def _attach(self, model, optimizer, scheduler, data) -> None:
        self.model = model.to(self.device)
        self.optimizer, self.scheduler = optimizer, scheduler
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.numel = sum(p.numel() for p in self.params)
        self.buffers = list(model.buffers())
        self._buf_words = _words(self.buffers)
        self.data = data
        n = len(data[0]) if isinstance(data, tuple) else len(data)
        try:
            self.per_epoch = logical.steps_per_epoch(n, self.cfg.logical_workers, self.cfg.micro_batch)
        except ValueError as exc:
            raise InputError(str(exc)) from None
        self._perm_epoch: int | None = None
        self._perm: Any = None
        self.rng = {w: self._seed_rng(logical.mix(self.cfg.seed, w)) for w in self._rng_workers()}

    def _rng_workers(self):
        """The logical workers whose RNG streams this process keeps: its own."""
        return self.mine

    def _started(self, t0: float) -> None:
        self._saved_step = self.step
        self.timings["restore_s"] = time.perf_counter() - t0
        self.t_start = time.monotonic()
        self.metrics.record("start", step=self.step, samples=self.samples, step_s=0.0,
                            mode=self.cfg.mode, restore_s=round(self.timings["restore_s"], 4))
        log.info("rank %d/%d (%s, %s) owns logical workers %s of %d; step %d",
                 self.info.rank, self.info.world, self.info.launcher, self.backend,
                 list(self.mine), self.cfg.logical_workers, self.step)

    def _seed_rng(self, seed: int) -> dict:
        torch.manual_seed(seed)
        return self._get_rng()

    def _get_rng(self) -> dict:
        st = {"cpu": torch.get_rng_state()}
        if self.device.type == "cuda":
            st["cuda"] = torch.cuda.get_rng_state(self.device)
        return st

    def _set_rng(self, st: dict) -> None:
        torch.set_rng_state(st["cpu"])
        if self.device.type == "cuda" and "cuda" in st:
            torch.cuda.set_rng_state(st["cuda"], self.device)

    def _restore_agreed(self):
        """Every rank resumes from the same checkpoint: rank 0 chooses (newest valid,
        quarantining corrupt ones), the others read exactly that file."""
        if self.pg is None:
            return self.store.restore(quarantine=True)
        chosen = self.store.restore(quarantine=True) if self.info.rank == 0 else None
        step = torch.tensor([chosen.step if chosen is not None else -1], dtype=torch.long)
        dist.broadcast(step, 0)
        if self.info.rank == 0 or int(step) < 0:
            return chosen
        return self.store.restore_step(int(step))

    def _broadcast_initial(self) -> None:
        if self.pg is None:
            return
        with torch.no_grad():
            for t in list(self.model.parameters()) + self.buffers:
                dist.broadcast(t.data, 0)

    @property
    def samples(self) -> int:
        return self.step * self.cfg.global_batch

    # ---- data --------------------------------------------------------------------------
    def batch_indices(self, step: int, worker: int):
        epoch, j = logical.epoch_of(step, self.per_epoch)
        if self._perm_epoch != epoch:
            n = len(self.data[0]) if isinstance(self.data, tuple) else len(self.data)
            g = torch.Generator().manual_seed(logical.mix(self.cfg.seed, epoch))
            self._perm, self._perm_epoch = torch.randperm(n, generator=g), epoch
        b, start = self.cfg.micro_batch, j * self.cfg.global_batch + worker * self.cfg.micro_batch
        return self._perm[start:start + b]

    def _batch(self, idx):
        if isinstance(self.data, tuple):
            return tuple(t[idx].to(self.device) for t in self.data)
        items = [self.data[int(i)] for i in idx]
        return tuple(torch.stack([torch.as_tensor(x[k]) for x in items]).to(self.device)
                     for k in range(len(items[0])))

    # ---- the loop ----------------------------------------------------------------------
    def steps(self, total_steps: int):
        """Yield the step number until ``total_steps`` are done or a stop is agreed."""
        self._total_steps = total_steps
        while self.step < total_steps and self.stopped is None:
            yield self.step
        if self.stopped is None and self.step >= total_steps:
            self.finished = True

    def train_step(self, loss_fn) -> StepResult:
        """One step over all L logical workers; ``loss_fn(model, batch) -> scalar tensor``."""
        t0 = time.perf_counter()
        flags = self._local_flags()
        if self.cfg.mode == "consistency":
            res = self._consistent_step(loss_fn, flags)
        else:
            res = self._tolerant_step(loss_fn, flags)
        dt = time.perf_counter() - t0
        if res.applied:
            self._step_times.append(dt)
            self.metrics.record("progress", step=self.step, samples=self.samples,
                                step_s=round(sum(self._step_times) / len(self._step_times), 5),
                                loss=round(res.loss, 6))
            self._step_times = self._step_times[-20:]
        return res

    def _local_flags(self) -> Flags:
        ckpt = 0.0
        if self.info.rank == 0:
            every, every_s = self.cfg.checkpoint_every_steps, self.cfg.checkpoint_every_s
            if (every and (self.step + 1) % every == 0) or \
                    (every_s and time.monotonic() - self._last_ckpt_t >= every_s):
                ckpt = 1.0
        return float(self.stop.requested), float(self.stop.forced), ckpt, float(self._prune), 0.0, 0.0

    # ---- validation --------------------------------------------------------------------
    def report(self, value: float, **fields: float) -> bool:
        """Record a validation ``value`` (and any ``fields``, e.g. ``val_loss``) at the current
        step: a ``metric`` progress record.  In a campaign trial (``MALLETRAIN_TRIAL``), rank 0
        also reports it to the study, in the campaign's step unit (global steps, samples or
        epochs: the same at any node count), and when the pruner says stop, every process stops
        at the next step boundary (the verdict rides with the step's data, as a stop signal does)
        and :meth:`close` exits 0 with reason ``pruned``: the trial is over, its nodes free.
        Returns whether a stop for pruning is pending.  Reporting the same step again after a
        requeue is harmless (the study keeps the first value)."""
        value = float(value)
        extra = {k: float(v) for k, v in fields.items()}
        prune = False
        if self.info.rank == 0 and not self._at_end and not self._prune:
            reporter = self._trial_reporter()
            if reporter is not None:
                from malletrain.campaign.trial import reporter_verdict
                epochs = self.step // self.per_epoch if self.per_epoch else 0
                prune, promise = reporter_verdict(reporter, value, steps=self.step, samples=self.samples,
                                                  epochs=epochs)
                if promise is not None:      # the daemon reorders its owner's trials by it
                    extra["promise"] = promise
        self.metrics.record("metric", step=self.step, samples=self.samples, step_s=0.0, value=value,
                            prune=prune, **extra)
        if prune:
            log.warning("step %d: the campaign's pruner stops this trial (value %g)", self.step, value)
            self._prune = True
        return self._prune

    @property
    def _at_end(self) -> bool:
        """The last step of :meth:`steps` is done (a trial that got there is not pruned)."""
        return self._total_steps is not None and self.step >= self._total_steps

    def _trial_reporter(self):
        if self._reporter is None:
            from malletrain.campaign.trial import Reporter
            self._reporter = Reporter.from_env() or False
        return self._reporter or None

    def _flatten_into(self, row) -> None:
        if all(p.grad is not None for p in self.params):
            torch.cat([p.grad.reshape(-1) for p in self.params], out=row)
            return
        off = 0
        for p in self.params:
            n = p.numel()
            if p.grad is None:
                row[off:off + n].zero_()
            else:
                row[off:off + n].copy_(p.grad.reshape(-1))
            off += n

    def _clear_grads(self) -> None:
        for p in self.params:
            p.grad = None

    def _set_grads(self, flat) -> None:
        off = 0
        for p in self.params:
            n = p.numel()
            p.grad = flat[off:off + n].view_as(p)
            off += n

    def _consistent_step(self, loss_fn, flags) -> StepResult:
        L, n, m = self.cfg.logical_workers, self.numel, self._buf_words
        width, tail = max(len(ws) for ws in self.owned), self._tail_words()
        # row: gradient (n) | loss | flags | worker 0's buffers as raw 32-bit words (m) | tail
        rows = torch.zeros(width, n + EXTRA + m + tail, dtype=torch.float32, device=self.device)
        snap = [b.detach().clone() for b in self.buffers]
        rng_start = {w: self.rng[w] for w in self.mine}
        for i, w in enumerate(self.mine):
            if self.stop.forced:
                flags = self._local_flags()
                break
            if i:
                with torch.no_grad():
                    for b, s in zip(self.buffers, snap):
                        b.copy_(s)
            self._set_rng(self.rng[w])
            batch = self._batch(self.batch_indices(self.step, w))
            self._clear_grads()
            loss = loss_fn(self.model, batch)
            loss.backward()
            self.rng[w] = self._get_rng()
            if w == 0 and m:
                rows[i, n + EXTRA:n + EXTRA + m] = _pack(self.buffers)
            if tail:
                rows[i, n + EXTRA + m:] = self._tail(w)
            self._flatten_into(rows[i, :n])
            rows[i, n + LOSS] = loss.detach().float()
        rows[:, n + STOP:n + EXTRA] = torch.tensor(flags, device=self.device)
        gathered = self._exchange(rows)
        if gathered is None:     # an elastic job lost a member mid-step: the step is redone
            self._undo(snap, rng_start)
            self._lost()
            return StepResult(self.step, float("nan"), False)
        self._gathered(gathered)
        stop, force, ckpt, prune = torch.cat([g[:, n + STOP:n + PRUNE + 1] for g in gathered]).amax(0).tolist()
        if force:
            self._undo(snap, rng_start)
            self._after_step(stop=True, forced=True, ckpt=False)
            return StepResult(self.step, float("nan"), False)
        r0, i0 = self.where[0]
        acc = gathered[r0][i0, :n + 1].clone()
        for w in range(1, L):
            r, i = self.where[w]
            acc += gathered[r][i, :n + 1]
        acc.div_(L)
        self._set_grads(acc[:n])
        if m:
            _unpack(self.buffers, gathered[r0][i0, n + EXTRA:n + EXTRA + m])
        self._apply()
        self._after_step(stop=bool(stop), forced=False, ckpt=bool(ckpt), prune=bool(prune))
        return StepResult(self.step, float(acc[n + LOSS]), True)

    # ---- hooks an elastic job (:mod:`.elastic`) fills in ------------------------------------
    def _tail_words(self) -> int:
        """32-bit words each consistency row carries after the buffers."""
        return 0

    def _tail(self, worker: int):
        raise NotImplementedError

    def _exchange(self, rows):
        """Every process's rows, in rank order (None: a member was lost, redo the step)."""
        if self.pg is None:
            return [rows]
        gathered = [torch.empty_like(rows) for _ in range(self.info.world)]
        dist.all_gather(gathered, rows)
        return gathered

    def _gathered(self, gathered) -> None:
        """Sees every process's rows before the step is applied."""

    def _lost(self) -> None:
        raise AssertionError("only an elastic job loses members")

    def _undo(self, snap, rng_start) -> None:
        with torch.no_grad():
            for b, s in zip(self.buffers, snap):
                b.copy_(s)
        self.rng.update(rng_start)
        self._clear_grads()

    def _barrier(self) -> None:
        if self.pg is not None:
            dist.barrier()

    def _leave_group(self) -> None:
        if self.pg is not None:
            dist.destroy_process_group()
            self.pg = None

    def _tolerant_step(self, loss_fn, flags) -> StepResult:
        L, n = self.cfg.logical_workers, self.numel
        idx = torch.cat([self.batch_indices(self.step, w) for w in self.mine])
        batch = self._batch(idx)
        self._clear_grads()
        loss = loss_fn(self.model, batch)
        loss.backward()
        share = len(self.mine) / L
        flat = torch.zeros(n + EXTRA, dtype=torch.float32, device=self.device)
        self._flatten_into(flat[:n])
        flat[:n].mul_(share)
        flat[n + LOSS] = loss.detach().float() * share
        flat[n + STOP:] = torch.tensor(flags, device=self.device)
        if self.pg is not None:
            dist.all_reduce(flat)
            if self._buf_words:     # DDP semantics: every replica gets rank 0's buffers (one broadcast)
                packed = _pack(self.buffers)
                dist.broadcast(packed, 0)
                _unpack(self.buffers, packed)
        if flat[n + FORCE] > 0:
            self._clear_grads()
            self._after_step(stop=True, forced=True, ckpt=False)
            return StepResult(self.step, float("nan"), False)
        self._set_grads(flat[:n])
        self._apply()
        self._after_step(stop=bool(flat[n + STOP] > 0), forced=False, ckpt=bool(flat[n + CKPT] > 0),
                         prune=bool(flat[n + PRUNE] > 0))
        return StepResult(self.step, float(flat[n + LOSS]), True)

    def _apply(self) -> None:
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        self._clear_grads()
        self.step += 1

    def _after_step(self, *, stop: bool, forced: bool, ckpt: bool, prune: bool = False) -> None:
        if prune and not self._at_end:
            self.stopped = "pruned"           # over for good: no checkpoint, the nodes go at once
        elif stop:
            self.stopped = "forced" if forced else "signal"
            self.checkpoint()
        elif ckpt:
            self.checkpoint(background=self._background)

    @property
    def _background(self) -> bool:
        b = self.cfg.background_checkpoints
        return self.cfg.elastic if b is None else b

    # ---- checkpoints -------------------------------------------------------------------
    def state(self) -> dict:
        """Everything needed to continue exactly (gathers the workers' RNG states: collective)."""
        rng = {w: _cpu_rng(s) for w, s in self.rng.items()} if self.cfg.mode == "consistency" else {}
        if self.pg is not None and rng and len(rng) < self.cfg.logical_workers:
            rng = self._gather_rng(rng)
        return {
            "format": 1, "step": self.step, "samples": self.samples, "mode": self.cfg.mode,
            "logical_workers": self.cfg.logical_workers, "micro_batch": self.cfg.micro_batch,
            "seed": self.cfg.seed, "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "rng": rng, "extra": dict(self.cfg.extra),
        }

    def _gather_rng(self, rng: dict) -> dict:
        """Every worker's RNG state from the rank that owns it: raw bytes in one uint8 tensor
        (never a pickled object: a peer's data is not unpickled).  Which row is which worker
        follows from the mapping every rank knows; the row layout from this rank's own states."""
        first = rng[self.mine[0]]
        keys = sorted(first)
        sizes = [first[k].numel() for k in keys]
        width = max(len(ws) for ws in self.owned)
        mine = torch.zeros(width, sum(sizes), dtype=torch.uint8, device=self.device)
        for i, w in enumerate(self.mine):
            mine[i] = torch.cat([rng[w][k].reshape(-1).to(torch.uint8) for k in keys]).to(self.device)
        rows = [torch.empty_like(mine) for _ in range(self.info.world)]
        dist.all_gather(rows, mine)
        out = {}
        for r, ws in enumerate(self.owned):
            got = rows[r].cpu()
            for i, w in enumerate(ws):
                out[w] = dict(zip(keys, (part.clone() for part in got[i].split(sizes))))
        return out

    def checkpoint(self, *, background: bool = False) -> None:
        """Write a checkpoint of the current step (all processes call it; rank 0 writes).

        ``background``: rank 0 copies the state and a thread writes it while training goes on
        (none of the ranks waits); a periodic checkpoint due while the last one is still being
        written is left out.  A synchronous checkpoint (a stop, the end) first waits for the
        background one, and writes that one again if it failed."""
        if self._saved_step == self.step:
            return
        t0 = time.perf_counter()
        state = self.state()
        if background:
            if self.info.rank == 0:
                self._save_in_background(state, t0)
            self._saved_step = self.step
            self._last_ckpt_t = time.monotonic()
            return
        if self.info.rank == 0:
            self._wait_background()
            saved = self.store.save(self.step, state)
            total = time.perf_counter() - t0
            self.timings["checkpoint_s"] = total
            log.info("checkpoint step %d: %.2f MB in %.3fs", self.step, saved.bytes / 1e6, total)
            self.metrics.record("checkpoint", step=self.step, samples=self.samples, step_s=0.0,
                                write_s=round(total, 4), bytes=saved.bytes)
        self._barrier()
        self._saved_step = self.step
        self._last_ckpt_t = time.monotonic()

    def _save_in_background(self, state: dict, t0: float) -> None:
        if self._bg is not None and self._bg.running():
            log.info("checkpoint of step %d left out: step %d is still being written", self.step, self._bg.step)
            return
        self._wait_background()
        step, samples = self.step, self.samples
        copy = snapshot(state)
        copied_s = time.perf_counter() - t0

        def done(saved) -> None:
            log.info("checkpoint step %d: %.2f MB in %.3fs (in the background; training paused %.3fs "
                     "for the copy)", step, saved.bytes / 1e6, saved.write_s, copied_s)
            self.metrics.record("checkpoint", step=step, samples=samples, step_s=0.0,
                                write_s=round(saved.write_s, 4), bytes=saved.bytes,
                                pause_s=round(copied_s, 4), background=True)
        self._bg = BackgroundSave(self.store, step, copy, done)

    def _wait_background(self) -> None:
        """Rank 0: wait for the background checkpoint; write it again if it failed."""
        bg, self._bg = self._bg, None
        if bg is not None and not bg.wait():
            self.store.save(bg.step, bg.state)

    def _load(self, st: dict) -> None:
        cfg = self.cfg
        for key in ("logical_workers", "micro_batch", "seed", "mode"):
            if st.get(key) != getattr(cfg, key):
                raise InputError(f"checkpoint was written with {key}={st.get(key)!r} but this run "
                                 f"has {key}={getattr(cfg, key)!r}; training cannot continue "
                                 f"consistently (use a new checkpoint_dir)", path=cfg.checkpoint_dir)
        self.model.load_state_dict(st["model"])
        self.optimizer.load_state_dict(st["optimizer"])
        if self.scheduler is not None and st.get("scheduler") is not None:
            self.scheduler.load_state_dict(st["scheduler"])
        self.step = int(st["step"])
        if cfg.mode == "consistency":
            self.rng = {w: st["rng"][w] for w in self._rng_workers()}
        else:
            self._seed_rng(logical.mix(cfg.seed, self.step, self.info.rank))

    # ---- exit --------------------------------------------------------------------------
    def close(self) -> int:
        """Final checkpoint, exit record, leave the process group.

        Returns the exit status for the script: 0 (done, or pruned: the trial is over), or
        :data:`EXIT_STOPPED` when a stop signal ended the run before its last step (the job must
        be requeued)."""
        if self.stopped is None:
            self.checkpoint()
        if self._bg is not None:        # a member leaving, a pruned trial: its last write still lands
            self._bg.wait()
        since = self.stop.since_s()
        reason = "done" if self.finished else (self.stopped or "closed")
        pruned = self.stopped == "pruned"
        if since is not None:
            verdict = "within" if since <= self.cfg.grace_s else "OVER"
            done = "left the group at" if self.stopped in OUT_OF_GROUP else "checkpoint of"
            log.warning("stop: %s -> %s step %d and exit %.2fs after the signal "
                        "(%s the %.0fs grace time)", self.stop.name(), done, self.step, since, verdict,
                        self.cfg.grace_s)
            self.timings["signal_to_exit_s"] = since
        self.metrics.record("exit", step=self.step, samples=self.samples, step_s=0.0,
                            reason=reason, signal=self.stop.name() if since is not None else None,
                            signal_to_exit_s=round(since, 3) if since is not None else None)
        self.metrics.close()
        self.stop.uninstall()
        self._leave_group()
        return EXIT_STOPPED if self.stopped is not None and not pruned else 0


def _cpu_rng(st: dict) -> dict:
    return {k: v.cpu() for k, v in st.items()}


def _words(buffers) -> int:
    """32-bit words needed to carry the buffers' raw bytes."""
    nbytes = sum(b.numel() * b.element_size() for b in buffers)
    return (nbytes + 3) // 4


def _pack(buffers):
    """The buffers' raw bytes as float32 words (a bit-exact carrier: collectives copy bits)."""
    raw = torch.cat([b.detach().contiguous().view(-1).view(torch.uint8) for b in buffers])
    pad = (-raw.numel()) % 4
    if pad:
        raw = torch.cat([raw, raw.new_zeros(pad)])
    return raw.view(torch.float32)


def _unpack(buffers, words) -> None:
    raw = words.contiguous().view(torch.uint8)
    off = 0
    with torch.no_grad():
        for b in buffers:
            nb = b.numel() * b.element_size()
            b.copy_(raw[off:off + nb].clone().view(b.dtype).view_as(b))
            off += nb
