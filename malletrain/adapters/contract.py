"""What every adapter shares: the settings, the data plan, the stop flag, the records.

:class:`Contract` holds one process's side of the harvester's contract, whatever the framework:

* **Settings**, checked before anything is installed: ``global_batch`` (kept at every world
  size), ``micro_batch`` (the most samples one backward pass takes; the accumulation count ``A``
  follows from it and the world size), ``seed`` (the data order), ``checkpoint_every_s``.
* **The data plan** (:meth:`Contract.micro_batches`): step ``k`` of epoch ``e`` trains on samples
  ``perm_e[k·G : (k+1)·G]`` of a permutation seeded by (seed, epoch), the same samples whatever
  the number of processes ``W``; they are cut into ``W·A`` near-equal micro-batches and rank
  ``r`` takes ``A`` of them.  :meth:`Contract.weight` scales a micro-batch's mean loss so that the
  gradient applied is the global batch's mean gradient at every ``W``.
* **The stop flag**: SIGTERM/SIGUSR2 set it (:class:`~malletrain.runtime.signals.StopRequest`);
  the framework's adapter agrees on it across ranks at a step boundary.
* **Checkpoint directories** a framework writes file by file (the Hugging Face Trainer's,
  Accelerate's ``save_state``): :func:`seal` writes a manifest of every file (size, SHA-256)
  once all are written, :func:`verify` says whether a directory still matches it.
* **Records** for the daemon's profiler and a campaign's pruner (``start``, ``progress``,
  ``checkpoint``, ``metric``, ``exit``, as the runtime writes them) and a campaign trial's report
  (:meth:`Contract.report`).
* **A clean exit** (:func:`settle_at_exit`): every adapter registers, when it is made, a hook
  that gives torch's gloo threads a moment at interpreter exit to free what they still hold
  (:func:`settle_collectives`), whatever the script or its framework does last.

It imports torch (the ``train`` extra) but no framework; each adapter module adds its framework.
"""
from __future__ import annotations

import atexit
import functools
import hashlib
import json
import math
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from malletrain.domain.errors import InputError
from malletrain.domain.safefile import write_atomic
from malletrain.runtime.checkpoint import CheckpointStore
from malletrain.runtime.launch import discover
from malletrain.runtime.logical import mix
from malletrain.runtime.metrics import MetricsWriter
from malletrain.runtime.signals import StopRequest

EXIT_STOPPED = 3
MANIFEST = "malletrain-complete.json"     # in a checkpoint directory: every file's size and SHA-256
STOP, CKPT, PRUNE = range(3)
# How long the main thread sleeps (the GIL released) after a run's last collective: ample for a
# gloo worker thread to free the collective it has just finished (microseconds when it runs).
SETTLE_S = 0.1


def settle_collectives() -> None:
    """Let torch's gloo worker threads free the collectives they have just finished before the
    process exits.

    A gloo worker frees a finished collective on its own thread.  A collective issued during
    ``backward`` (DDP's gradient all-reduce; a barrier that waits on one) holds a Python object
    (the context autograd stashes for its threads), so freeing it takes the GIL.  When the DDP
    model outlives ``destroy_process_group`` (the script's own reference holds the process
    group), those threads live on into interpreter shutdown; one that asks for the GIL after
    shutdown has begun is ended inside a C++ destructor, and the process aborts ("terminate
    called without an active exception", exit 134) after the run has finished: the job fails
    although its work is done.  Measured with torch 2.13 (CPU, gloo, 2 processes, a DDP model
    alive to the end, a barrier right after the last backward): 7 of 160 runs aborted; none of
    100 once the main thread slept 0.1 s after the barrier.
    Sleeping releases the GIL at once, so the worker, already waiting for it, frees the
    collective while the interpreter is whole."""
    time.sleep(SETTLE_S)


@functools.cache          # once per process
def settle_at_exit() -> None:
    """Run :func:`settle_collectives` at interpreter exit (registered once per process; every
    :class:`Contract` calls it when it is made).

    ``atexit`` hooks run after the script's last line and before interpreter shutdown begins, so
    this covers whatever comes last: an adapter's final barrier, the script's own collectives
    after the adapter's ``close``, a framework's teardown (the Hugging Face Trainer owns the end
    of training), a run that leaves through ``SystemExit``.  It costs ``SETTLE_S`` once per
    process exit, in every process, distributed or not (a process group destroyed before exit
    leaves no trace of having been used, while the DDP model holding it keeps its threads).
    A process killed by a signal or leaving by ``os._exit`` runs no hooks: it has no clean exit
    to lose.  Measured (``devtools.gloo_exit``, the job of :func:`settle_collectives`'s figures
    with this hook in place of the sleep after its barrier): 0 of 100 runs aborted, against 7 of
    100 without it in the same session."""
    atexit.register(settle_collectives)


def torchrun_place(env: dict[str, str]) -> tuple[int, int]:
    """(rank, world) of this process as torchrun says (``RANK``, ``WORLD_SIZE``); one process
    without torchrun.  Garbage is a clear error."""
    try:
        rank, world = int(env.get("RANK", "0")), int(env.get("WORLD_SIZE", "1"))
    except ValueError:
        raise InputError("RANK and WORLD_SIZE must be integers (torchrun sets them)") from None
    if not 0 <= rank < world:
        raise InputError(f"RANK={rank}, WORLD_SIZE={world} do not fit")
    return rank, world


def loader_kwargs(kwargs: dict) -> dict:
    """The DataLoader arguments a script may pass an adapter's ``dataloader()``: not the
    batching, which the adapter's plan decides."""
    taken = {"batch_size", "shuffle", "sampler", "batch_sampler", "drop_last"} & set(kwargs)
    if taken:
        raise InputError(f"dataloader(): {', '.join(sorted(taken))} are set by the adapter (global_batch, "
                         "micro_batch and seed)")
    return kwargs


def numbered(directory: str, prefix: str) -> list[int]:
    """Steps of the ``<prefix><step>`` entries of ``directory``, newest first."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    return sorted((int(n[len(prefix):]) for n in names
                   if n.startswith(prefix) and n[len(prefix):].isdigit() and len(n) - len(prefix) < 12),
                  reverse=True)


class Contract:
    """One process's side of the contract (module docstring).  ``rank``/``world``: this process
    in the job's current world."""

    def __init__(self, checkpoint_dir: str, *, rank: int, world: int, global_batch: int,
                 micro_batch: int | None, seed: int, checkpoint_every_s: float, keep: int,
                 env: dict[str, str] | None, mode: str) -> None:
        env = dict(os.environ) if env is None else env
        self.rank, self.world, self.mode = rank, world, mode
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
        settle_at_exit()
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
        self.per_epoch = 0            # steps an epoch (set by batch_sampler())
        self.finished = False
        self.stopped: str | None = None
        self._exit_pending = False      # the final exit record waits for interpreter exit (exit_at_end)
        self._prune = False
        self._reporter: Any = None
        self._last_ckpt_t = time.monotonic()
        self._t_step = time.perf_counter()
        self._perm: tuple[int, int, list[int]] | None = None     # (epoch, dataset_len, permutation)

    @property
    def samples(self) -> int:
        return self.global_step * self.global_batch

    # ---- data ------------------------------------------------------------------------------
    def steps_per_epoch(self, dataset_len: int) -> int:
        steps = dataset_len // self.global_batch
        if steps < 1:
            raise InputError(f"dataset of {dataset_len} samples is smaller than one global batch ({self.global_batch})")
        return steps

    def step_parts(self, epoch: int, step_in_epoch: int, dataset_len: int) -> list[list[int]]:
        """All ``W·A`` micro-batches (sample indices) of step ``step_in_epoch`` of ``epoch``;
        rank ``r`` trains parts ``r·A`` to ``r·A + A - 1``."""
        if self._perm is None or self._perm[:2] != (epoch, dataset_len):     # drawn once per epoch
            g = torch.Generator().manual_seed(mix(self.seed, epoch))
            self._perm = (epoch, dataset_len, torch.randperm(dataset_len, generator=g).tolist())
        batch = self._perm[2][step_in_epoch * self.global_batch:(step_in_epoch + 1) * self.global_batch]
        parts = self.world * self.accumulation
        cuts = [len(batch) * i // parts for i in range(parts + 1)]
        return [batch[cuts[i]:cuts[i + 1]] for i in range(parts)]

    def micro_batches(self, epoch: int, step_in_epoch: int, dataset_len: int) -> list[list[int]]:
        """This rank's micro-batches (sample indices) of step ``step_in_epoch`` of ``epoch``."""
        parts = self.step_parts(epoch, step_in_epoch, dataset_len)
        return parts[self.rank * self.accumulation:(self.rank + 1) * self.accumulation]

    def dealt(self, epoch: int, step_in_epoch: int, dataset_len: int) -> list[list[int]]:
        """All ``W·A`` micro-batches of a step in the order Accelerate's ``prepare`` deals them
        out (rank ``r`` gets positions ``r, r+W, ...``), so that each rank trains its parts."""
        parts = self.step_parts(epoch, step_in_epoch, dataset_len)
        a_, w_ = self.accumulation, self.world
        return [parts[r * a_ + a] for a in range(a_) for r in range(w_)]

    def weight(self, n: int) -> float:
        """What a micro-batch of ``n`` samples' mean loss is multiplied by: its share of the
        global batch, times the world size (DDP averages the ranks' gradients)."""
        return n * self.world / self.global_batch

    def batch_sampler(self, dataset_len: int, *, every_rank: bool = False, whole_epoch: bool = False) -> BatchPlan:
        """A DataLoader ``batch_sampler`` over the steps left in the current epoch (from
        ``epoch``/``in_epoch`` as they stand when it is iterated): this rank's micro-batches, or
        (``every_rank``) all of them in the order Accelerate's ``prepare`` deals them out.
        ``len``: the micro-batches left, or (``whole_epoch``) those of the whole epoch, which is
        what Lightning counts its epoch's batches against.  A run restored at the last step of
        an epoch goes on with the next epoch (Lightning builds the loader, and reads it ahead,
        before it calls any epoch hook; without this its next epoch would be empty and lost)."""
        self.per_epoch = self.steps_per_epoch(dataset_len)
        if self.in_epoch >= self.per_epoch:     # restored at the last step of an epoch: the next one
            self.epoch, self.in_epoch = self.epoch + 1, 0
        return BatchPlan(self, dataset_len, every_rank, whole_epoch)

    # ---- the step boundary -----------------------------------------------------------------
    def stepped(self) -> torch.Tensor:
        """Count an optimizer step, write its progress record, and return this rank's flags
        (stop, checkpoint due, pruned) for the ranks to agree on (:meth:`agree`).  The stop flag is
        1 + the seconds since this rank's signal, so the agreed flag also says when the first
        signal anywhere in the job came."""
        self.global_step += 1
        self.in_epoch += 1
        now = time.perf_counter()
        self.metrics.record("progress", step=self.global_step, samples=self.samples,
                            step_s=round(now - self._t_step, 5))
        self._t_step = now
        since = self.stop.since_s()
        flags = torch.tensor([0.0 if since is None else 1.0 + since, 0.0, float(self._prune)])
        every = self.checkpoint_every_s
        if self.rank == 0 and every and time.monotonic() - self._last_ckpt_t >= every:
            flags[CKPT] = 1.0
        return flags

    def agree(self, flags: torch.Tensor) -> torch.Tensor:
        """The ranks' agreement on :meth:`stepped`'s flags (MAX all-reduce).  A rank that stops
        before its own copy of the signal came counts its stop from the first rank's."""
        if dist.is_initialized():
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        if flags[STOP] > 0 and not self.stop.requested:
            self.stop.peer(float(flags[STOP]) - 1.0)
        return flags

    # ---- records ---------------------------------------------------------------------------
    def started(self, restore_s: float) -> None:
        self.metrics.record("start", step=self.global_step, samples=self.samples, step_s=0.0, mode=self.mode,
                            restore_s=round(restore_s, 4))

    def saved(self, write_s: float, size: int) -> None:
        self.metrics.record("checkpoint", step=self.global_step, samples=self.samples, step_s=0.0,
                            write_s=round(write_s, 4), bytes=size)
        self._last_ckpt_t = time.monotonic()

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

    def exit_at_end(self, log) -> int:
        """The run's training finished: its ``exit`` record waits for the process to leave, so
        that the script's own lines after its training (``torch.save`` of the model, a test run)
        are part of the work.  It is written at interpreter exit, ``done`` only when those lines
        raised nothing (an unhandled exception leaves it ``closed``: the job's failure goes to
        Slurm and the daemon's recovery, which also reads a non-zero exit after ``done`` as not
        finished).  Until then a stop only sets the flag and the script's save goes on; a job
        killed before then has no exit record, is requeued, resumes at its final checkpoint,
        trains nothing and runs those lines again.  Returns 0, the exit status."""
        if not self._exit_pending:
            self._exit_pending = True
            atexit.register(self._exit_at_end, log)
        return 0

    def _exit_at_end(self, log) -> None:
        if getattr(sys, "last_value", None) is not None:     # the script died of an exception
            self.finished = False
        self.exit_record(log)

    def exit_record(self, log) -> int:
        """The ``exit`` record; the exit status: 0 (done or pruned) or 3 (stopped: requeue)."""
        since = self.stop.since_s()
        reason = "done" if self.finished else (self.stopped or "closed")
        if since is not None:
            log.warning("stop: %s -> checkpoint of step %d and exit %.2fs after the signal",
                        self.stop.name(), self.global_step, since)
        self.metrics.record("exit", step=self.global_step, samples=self.samples, step_s=0.0, reason=reason,
                            signal=self.stop.name() if since is not None else None,
                            signal_to_exit_s=round(since, 3) if since is not None else None)
        self.metrics.close()
        if self.stopped != "signal":
            # on a stop the handlers stay until the process exits: a second delivery (srun's,
            # or torchrun's closing SIGTERM to a rank still tearing down) must not turn exit 3
            # into death by SIGTERM
            self.stop.uninstall()
        sys.stdout.flush()
        return EXIT_STOPPED if self.stopped == "signal" else 0


class BatchPlan:
    """The micro-batches of every step left in the current epoch (:meth:`Contract.batch_sampler`)."""

    def __init__(self, owner: Contract, dataset_len: int, every_rank: bool, whole_epoch: bool) -> None:
        self.owner, self.n, self.every_rank, self.whole_epoch = owner, dataset_len, every_rank, whole_epoch

    def __iter__(self) -> Iterator[list[int]]:
        o = self.owner
        epoch, first = o.epoch, o.in_epoch
        for k in range(first, o.per_epoch):
            if self.every_rank:
                yield from o.dealt(epoch, k, self.n)
            else:
                yield from o.micro_batches(epoch, k, self.n)

    def __len__(self) -> int:
        o = self.owner
        steps = o.per_epoch if self.whole_epoch else max(0, o.per_epoch - o.in_epoch)
        return steps * o.accumulation * (o.world if self.every_rank else 1)


# ---- the manifest ---------------------------------------------------------------------------
def _files(path: str) -> list[str]:
    out = []
    for root, dirs, names in os.walk(path):
        dirs.sort()
        for name in sorted(names):
            rel = os.path.relpath(os.path.join(root, name), path)
            if rel != MANIFEST:
                out.append(rel)
    return out


def _digest(path: str) -> tuple[int, str]:
    h = hashlib.sha256()
    size = 0
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()


def seal(path: str, step: int) -> int:
    """Write the manifest of the checkpoint directory ``path`` (atomically); its total bytes."""
    digests = {rel: _digest(os.path.join(path, rel)) for rel in _files(path)}
    files = {rel: [size, sha] for rel, (size, sha) in digests.items()}
    write_atomic(os.path.join(path, MANIFEST), json.dumps({"step": step, "files": files}).encode(), 0o600)
    return sum(size for size, _ in digests.values())


def verify(path: str) -> str | None:
    """None when the manifest of ``path`` matches every file in it; else what is wrong."""
    try:
        with open(os.path.join(path, MANIFEST), "rb") as fh:
            manifest = json.loads(fh.read(1 << 22))
        files = manifest["files"]
        if not isinstance(files, dict) or sorted(files) != _files(path):
            return "the files are not those of the manifest"
        for rel, want in files.items():
            if list(_digest(os.path.join(path, rel))) != want:
                return f"{rel} differs from the manifest"
    except FileNotFoundError:
        return "no manifest (the save did not finish)"
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as exc:
        return f"unreadable manifest or file: {str(exc)[:200]}"
    return None
