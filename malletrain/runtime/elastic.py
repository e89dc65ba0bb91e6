"""An elastic job: members leave and join at step boundaries; the others keep training.

``RuntimeConfig(elastic=True, ...)`` makes :class:`~malletrain.runtime.trainer.Runtime` one of
these.  Each process is a *member* (one per node: in Slurm, one member of the job's group, its
id ``MALLETRAIN_MEMBER`` or ``SLURM_ARRAY_TASK_ID``).  Members meet in the job's private store
(:mod:`.membership`), and every round of membership gets a gloo process group of its own:

* **leave** (a member got SIGTERM: Slurm preempts or holds its node): the leave flag rides with
  the step's rows; at the boundary every rank agrees who leaves, the leavers exit (status 3,
  to be requeued and held), the others build the next group.  Nobody restarts, nothing is read
  from disk.  When every member leaves at once the group stops as a whole: a checkpoint, as
  before.
* **join** (a new member started, built its model and data, and asked the store): rank 0 sees
  the request, the count rides with the step's rows, and at the boundary the group admits it.
  The state (model, optimizer, scheduler, every logical worker's RNG stream, the step) goes
  from a survivor to the joiner as plain bytes (:mod:`.wire`, never pickled) and is checked by
  SHA-256 against the digest the sender put in the store.
* **loss** (``kill -9``, a dead node): the step's collective fails (a closed connection at once;
  a silent peer when its pulse stood still for ``dead_s``, or at ``collective_timeout_s``).  The
  partial step is undone; the survivors agree in the store who goes on (:func:`.membership.decide`),
  build the next group, and whoever is behind (a peer that finished the step while another did
  not) gets the newest state from one that is ahead, so no step is lost or applied twice.
* the first member (or the first after the whole group stopped) *founds* a generation and
  restores the newest checkpoint; every later one joins.

Consistency mode only: each process keeps every logical worker's RNG stream (each row carries
its workers' streams after the step), so the state any survivor holds is the whole state, and
the final parameters are bitwise those of an uninterrupted run.  Each new group's ranks prove
that they read the generation's key from the private store (an HMAC over the data plane) before
any of their rows is used.  If the group cannot re-form within its bounds, each process holding
the newest state writes a checkpoint and exits to be requeued (today's path).

What a CPU machine cannot show: NCCL (only gloo is supported here), and the cost of sending a
large model's state over a real network.
"""
from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import threading
import time

import torch
import torch.distributed as dist

from malletrain.domain.errors import ConfigError, InputError, MalletrainError
from malletrain.runtime import logical, membership, wire
from malletrain.runtime.config import RuntimeConfig
from malletrain.runtime.launch import DistInfo, discover_process
from malletrain.runtime.membership import MembershipError
from malletrain.runtime.rendezvous import RendezvousError, mac, open_private_dir
from malletrain.runtime.trainer import EXTRA, JOIN, LEAVE, Flags, Runtime

log = logging.getLogger("malletrain.runtime")
DIR_NAME = ".elastic"
ATTEMPTS = 3          # re-forming tries after a failure before falling back to a checkpoint
TAKEOVER = 10         # a generation is taken over after its pulses stood still this many dead_s


def member_id(env=None) -> int:
    env = os.environ if env is None else env
    member = membership.ascii_int(env.get("MALLETRAIN_MEMBER") or env.get("SLURM_ARRAY_TASK_ID"))
    if member is None:
        raise InputError("an elastic job needs its member id: MALLETRAIN_MEMBER or "
                         "SLURM_ARRAY_TASK_ID (an integer)")
    return membership.check_member(member)


def _not_writable_by_others(path: str) -> None:
    """The checkpoint directory holds the elastic store's directory: whoever may write it could
    swap that directory for one of their own.  Refused unless it is the caller's and no one
    else may write it."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    st = os.stat(path)
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise InputError("an elastic job's checkpoint directory must be yours and writable by "
                         "no one else (its store is the job's rendezvous)", path=path)


def private_dir(parent: str) -> str:
    """``<parent>/.elastic``, created 0700 if missing; refused unless it is a directory of this
    user that no one else can enter (the store in it is the rendezvous: it must stay private),
    checked as the TCP rendezvous checks its key directory."""
    try:
        os.close(open_private_dir(parent, DIR_NAME, "the elastic store's directory"))
    except RendezvousError as exc:
        raise InputError(str(exc)) from None
    path = os.path.join(parent, DIR_NAME)
    for sub in ("pulse", "life"):
        os.makedirs(os.path.join(path, sub), mode=0o700, exist_ok=True)
    return path


class _Pulse(threading.Thread):
    """Rewrites this member's pulse counter every ``pulse_s``, whatever training does."""

    def __init__(self, directory: str, member: int, pulse_s: float) -> None:
        super().__init__(name="malletrain-pulse", daemon=True)
        self.directory, self.member, self.pulse_s = directory, member, pulse_s
        self.halt = threading.Event()

    def run(self) -> None:
        count = 0
        while not self.halt.is_set():
            count += 1
            try:
                membership.write_pulse(self.directory, self.member, count)
            except OSError as exc:
                log.warning("pulse: %s", exc)
            self.halt.wait(self.pulse_s)


class ElasticRuntime(Runtime):
    def __init__(self, cfg: RuntimeConfig, info: DistInfo | None = None, *, member: int | None = None) -> None:
        if not cfg.elastic:
            raise ConfigError("ElasticRuntime needs elastic=True", field="elastic")
        base = info or discover_process()
        if base.world != 1:
            raise ConfigError("an elastic job runs one process per member (no srun/torchrun "
                              "inside a member)", field="elastic")
        super().__init__(cfg, base)
        if self.backend != "gloo":
            raise ConfigError("elastic jobs use gloo (NCCL re-initialisation is not supported yet)",
                              field="backend")
        self.member = member_id() if member is None else membership.check_member(member)
        _not_writable_by_others(cfg.checkpoint_dir)
        self.dir = private_dir(cfg.checkpoint_dir)
        try:
            self._life = membership.hold_life(self.dir, self.member)
        except MembershipError as exc:
            raise InputError(str(exc), path=self.dir) from None
        self.kv = dist.FileStore(os.path.join(self.dir, "store"), -1)
        self.kv.set_timeout(datetime.timedelta(seconds=cfg.collective_timeout_s))
        self.watch = membership.Watch(self.dir)
        self._pulse = _Pulse(self.dir, self.member, cfg.pulse_s)
        self._pulse.start()
        self.gen, self.ns, self.round = 0, "", 0
        self.members: tuple[int, ...] = (self.member,)
        self.joins_seen = 0
        self._leave_flags: list[bool] = []
        self._join_count = 0
        self._rng_next: dict = {}
        self._graveyard: list = []          # (group, its operation in flight) of earlier rounds
        self._rng_bytes = torch.get_rng_state().numel()
        self.reforms: list[dict] = []         # one record per change: kind, pause and its phases
        self._phase: dict[str, float] = {}
        self._t_last = time.perf_counter()    # when the last step was applied
        self._gap_since: float | None = None  # a join request drawn but not written, since when
        self._superseded = False

    # ---- setup -------------------------------------------------------------------------
    def prepare(self, model, optimizer, scheduler=None, *, data) -> Runtime:
        """Attach the model and data, then found the group (restoring the newest checkpoint)
        or be admitted into the running one (receiving its state)."""
        t0 = time.perf_counter()
        self._attach(model, optimizer, scheduler, data)
        try:
            entry = membership.enter(self.kv, self.member, self.watch, dead_s=self.cfg.dead_s,
                                     takeover_s=TAKEOVER * self.cfg.dead_s, wait_s=self.cfg.join_wait_s)
        except (MalletrainError, RuntimeError) as exc:     # not admitted in time; a store error
            log.error("member %d: %s; exiting to be requeued", self.member, exc)
            self.stopped = "unadmitted"
            self._started(t0)
            return self
        self.gen, self.ns, self.joins_seen = entry.gen, entry.ns, entry.joins_seen
        if entry.founder:
            restored = self.store.restore(quarantine=True)
            if restored is not None:
                self._load(restored.state)
                log.info("member %d founds generation %d from %s (step %d)", self.member,
                         entry.gen, restored.path, restored.step)
            else:
                log.info("member %d founds generation %d (no checkpoint)", self.member, entry.gen)
        else:
            self.step = -1                   # no state until a survivor sends it
            t1 = time.perf_counter()
            if not self._settle(entry.round, entry.members):
                self.stopped = "unadmitted"
            else:
                self._record("join", t1)
        self._started(t0)
        self._t_last = time.perf_counter()
        return self

    def _rng_workers(self):
        return range(self.cfg.logical_workers)

    # ---- the step's extra columns ---------------------------------------------------------
    def _local_flags(self) -> Flags:
        """Leave (this member got a signal) and, from rank 0, the joins to take in and whether
        this generation was superseded (its STOP column: every member then leaves without a
        checkpoint, since the group that superseded it owns the checkpoints now)."""
        stop, force, ckpt, prune, _, _ = super()._local_flags()
        joins, superseded = 0, False
        if self.info.rank == 0 and self.stopped is None:
            try:
                superseded = membership.current_gen(self.kv)[1] != self.ns
                joins = 0 if superseded else self._poll_joins()
            except (MalletrainError, RuntimeError) as exc:
                log.warning("elastic store: %s (no joins this step)", str(exc)[:200])
        return float(superseded), force, ckpt, prune, stop, float(joins)

    def _poll_joins(self) -> int:
        k = membership.pending_joins(self.kv, self.ns, self.joins_seen, self._room())
        if k:
            self._gap_since = None
            membership.offer(self.kv, self.ns, self.joins_seen, k, lambda m: membership.gone(self.dir, m))
            return k
        now = time.monotonic()
        if self._gap_since is None:
            self._gap_since = now
        elif now - self._gap_since >= self.cfg.dead_s:       # a joiner died mid-request
            self._gap_since = None
            if membership.void_gap(self.kv, self.ns, self.joins_seen):
                log.warning("join request %d was never written: voided", self.joins_seen + 1)
        return 0

    def _room(self) -> int:
        """Joins the group can take: at most one process per logical worker."""
        return max(0, self.cfg.logical_workers - len(self.members))

    def _tail_words(self) -> int:
        return (self._rng_bytes + 3) // 4

    def _tail(self, worker: int):
        raw = self.rng[worker]["cpu"].reshape(-1).to(torch.uint8)
        pad = (-raw.numel()) % 4
        if pad:
            raw = torch.cat([raw, raw.new_zeros(pad)])
        return raw.view(torch.float32)

    def _gathered(self, gathered) -> None:
        n, m = self.numel, self._buf_words
        base = n + EXTRA + m
        self._leave_flags = [bool(g[0, n + LEAVE] > 0) for g in gathered]
        self._join_count = int(gathered[0][0, n + JOIN])
        self._rng_next = {}
        for r, ws in enumerate(self.owned):
            for i, w in enumerate(ws):
                raw = gathered[r][i, base:].contiguous().view(torch.uint8)[:self._rng_bytes]
                self._rng_next[w] = {"cpu": raw.clone()}

    # ---- the collectives -----------------------------------------------------------------
    def _exchange(self, rows):
        if self.pg is None:
            return [rows]
        out = [torch.empty_like(rows) for _ in range(self.info.world)]
        return out if self._wait(self.pg.allgather([out], [rows])) else None

    def _wait(self, work) -> bool:
        """Whether ``work`` succeeded; False (the group aborted) on a failure, a peer whose
        pulse stood still for ``dead_s``, or ``collective_timeout_s``."""
        t0 = time.monotonic()
        nap, look = 0.0002, t0 + self.cfg.pulse_s
        others = [m for m in self.members if m != self.member]
        while not work.is_completed():
            now = time.monotonic()
            if now >= look:
                look = now + self.cfg.pulse_s
                self.watch.observe(others)
                gone = [m for m in others if self.watch.dead(m, self.cfg.dead_s)]
                if gone:
                    log.warning("member(s) %s gone (life lock free, or no pulse for %.1fs)",
                                gone, self.cfg.dead_s)
                    return self._abort(work)
            if now - t0 > self.cfg.collective_timeout_s:
                log.warning("a collective took over %.0fs", self.cfg.collective_timeout_s)
                return self._abort(work)
            time.sleep(nap)
            nap = min(nap * 2, 0.005)
        try:
            work.wait()
        except RuntimeError as exc:
            log.warning("collective failed: %s", str(exc).splitlines()[0][:200])
            return self._abort()
        return True

    def _abort(self, work=None) -> bool:
        """Drop the current group.  It is not aborted: gloo's abort waits for an operation in
        flight, which a frozen peer holds up to the collective timeout; the group is kept until
        that operation ended and then released (:meth:`_bury`)."""
        if self.pg is not None:
            self._graveyard.append((self.pg, work))
            self.pg = None
        return False

    def _broadcast(self, tensor, root: int) -> bool:
        opts = dist.BroadcastOptions()
        opts.rootRank, opts.rootTensor = root, 0
        return self._wait(self.pg.broadcast([tensor], opts))

    def _allgather(self, tensor) -> list | None:
        out = [torch.empty_like(tensor) for _ in range(self.info.world)]
        return out if self._wait(self.pg.allgather([out], [tensor])) else None

    def _barrier(self) -> None:
        """Rank 0 alone writes a checkpoint: every rank holds the whole state."""

    def checkpoint(self, *, background: bool = False) -> None:
        """As :meth:`Runtime.checkpoint`, unless this generation was superseded: the newer
        group owns the checkpoints then."""
        if self._superseded:
            return
        if self.info.rank == 0 and self.ns:
            try:
                if membership.current_gen(self.kv)[1] != self.ns:
                    log.error("generation %d was superseded: no checkpoint", self.gen)
                    self._superseded = True
                    return
            except (MalletrainError, RuntimeError) as exc:
                log.warning("elastic store: %s", str(exc)[:200])
        super().checkpoint(background=background)

    def _leave_group(self) -> None:
        self.pg = None
        self._graveyard.clear()
        if self.stopped in (None, "signal", "forced", "pruned") and self.ns:   # ended as a whole
            try:
                membership.close(self.kv, self.ns)
            except RuntimeError as exc:
                log.warning("elastic store: %s", str(exc)[:200])
        self._pulse.halt.set()
        os.close(self._life)

    # ---- membership changes ----------------------------------------------------------------
    def _after_step(self, *, stop: bool, forced: bool, ckpt: bool, prune: bool = False) -> None:
        if not forced:
            self._t_last = time.perf_counter()
            self.rng.update(self._rng_next)
        if prune and not self._at_end:
            self.stopped = "pruned"
            return
        if stop and not forced:              # superseded by a newer generation (rank 0 saw it)
            log.error("generation %d was superseded: leaving without a checkpoint", self.gen)
            self._superseded = True
            self.stopped = "lost"
            self._abort()
            return
        leavers = [m for m, f in zip(self.members, self._leave_flags) if f]
        if leavers and len(leavers) == len(self.members):
            self.stopped = "forced" if forced else "signal"    # the whole group: a checkpoint
            self.checkpoint()
            return
        if ckpt:
            self.checkpoint(background=self._background)
        if leavers or self._join_count:
            try:
                self._change(leavers, self._join_count)
            except (MalletrainError, RuntimeError) as exc:    # a store error or malformed value
                log.error("re-forming: %s", str(exc)[:200])
                self._fall_back()

    def _change(self, leavers: list[int], joins: int) -> None:
        """The planned change every rank agreed on at this boundary: propose it as the way out
        of this round (the first proposal wins, so a rank whose step failed meanwhile and went
        to :func:`.membership.decide` ends in the same round) and go there."""
        taken = membership.offered(self.kv, self.ns, self.joins_seen, joins) if joins else []
        survivors = [m for m in self.members if m not in leavers]
        admitted: list[tuple[int, int]] = []
        refused: list[tuple[int, str]] = []
        room, seen = self.cfg.logical_workers - len(survivors), set(survivors)
        for n, m, ok in taken:
            if not ok or m in seen:
                refused.append((n, f"member {m} is already in the group" if ok else "gone or unreadable"))
            elif len(admitted) >= room:
                refused.append((n, f"the group is full ({self.cfg.logical_workers} logical workers)"))
            else:
                admitted.append((n, m))
                seen.add(m)
        members = tuple(survivors + [m for _, m in admitted]) or (self.member,)
        proposal = membership.Transition(self.round + 1, members, self.joins_seen + joins,
                                         tuple(admitted), tuple(refused))
        t = membership.transition(self.kv, self.ns, self.round, proposal)
        kind = "grow" if t.admitted and not leavers else "shrink" if leavers and not t.admitted else "change"
        if self._adopt(t, leaving=self.member in leavers):
            self._record(kind, self._t_last)

    def _lost(self) -> None:
        self._phase["detect_s"] = time.perf_counter() - self._t_last
        self._abort()
        t = self._decide(self.round, self.members)
        if t is not None and self._adopt(t, leaving=False):
            self._record("loss", self._t_last)

    def _decide(self, rnd: int, members: tuple[int, ...]) -> membership.Transition | None:
        """After round ``rnd`` failed: the agreed way out (None: no agreement within the bound,
        and the fallback taken)."""
        t0 = time.perf_counter()
        try:
            t = membership.decide(self.kv, self.ns, rnd, members, self.member, self.joins_seen,
                                  self.watch, dead_s=self.cfg.dead_s,
                                  wait_s=self.cfg.collective_timeout_s + 2 * self.cfg.dead_s)
        except (MalletrainError, RuntimeError) as exc:
            log.error("%s", str(exc)[:200])
            self._fall_back()
            return None
        self._phase["agree_s"] = self._phase.get("agree_s", 0.0) + time.perf_counter() - t0
        return t

    def _adopt(self, t: membership.Transition, *, leaving: bool) -> bool:
        """Go to the agreed round ``t`` (or leave, when this member is not in it)."""
        self._abort()
        return self._accept(t, leaving=leaving) and self._settle(t.round, t.members)

    def _accept(self, t: membership.Transition, *, leaving: bool) -> bool:
        """Take the agreed transition ``t`` as this member's own: False (and this member out of
        the group) when it is not in it; its new rank 0 tells the joiners."""
        if self.member not in t.members:
            if leaving:
                log.info("member %d leaves generation %d at step %d", self.member, self.gen, self.step)
                self.stopped = "left"
            else:
                log.warning("member %d was left out of round %d; exiting to be requeued",
                            self.member, t.round)
                self.stopped = "lost"
            return False
        self.joins_seen = t.seen
        if t.members[0] == self.member:
            membership.announce(self.kv, self.ns, t)
        return True

    def _settle(self, rnd: int, members: tuple[int, ...]) -> bool:
        """Build round ``rnd``'s group, check the peers' proofs and bring everyone to the
        newest state; after a failure, agree again on who is left.  False (and the fallback
        taken) when that fails ``ATTEMPTS`` times."""
        for _ in range(ATTEMPTS):
            if self._form(rnd, members):
                self._bury()
                return True
            t = self._decide(rnd, members)
            if t is None or not self._accept(t, leaving=False):
                return False
            rnd, members = t.round, t.members
        self._fall_back()
        return False

    def _bury(self) -> None:
        """Release the groups of earlier rounds whose last operation has ended."""
        self._graveyard = [(pg, work) for pg, work in self._graveyard
                           if work is not None and not work.is_completed()]

    def _form(self, rnd: int, members: tuple[int, ...]) -> bool:
        rank, world = members.index(self.member), len(members)
        self.round, self.members = rnd, members
        self.info = dataclasses.replace(self.info, rank=rank, world=world, nodes=world)
        self.owned = logical.assign(self.cfg.logical_workers, world, self.cfg.mapping)  # type: ignore[arg-type]
        self.mine = self.owned[rank]
        self.where = {w: (r, i) for r, ws in enumerate(self.owned) for i, w in enumerate(ws)}
        self._retarget_metrics()
        if world == 1:
            self.pg = None
            return self.step >= 0 or self._fall_back_alone()
        dead = [m for m in members if m != self.member and membership.gone(self.dir, m)]
        if dead:                             # the group would wait for them until its timeout
            log.warning("round %d: member(s) %s are gone already", rnd, dead)
            return False
        timeout = datetime.timedelta(seconds=self.cfg.collective_timeout_s)
        t0 = time.perf_counter()
        try:
            opts = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined,unused-ignore]  # (no torch: no attribute to miss)
            opts._timeout = timeout
            opts._devices = [dist.ProcessGroupGloo.create_default_device()]
            self.pg = dist.ProcessGroupGloo(dist.PrefixStore(f"{self.ns}/r{rnd}/pg/", self.kv),
                                            rank, world, opts)
        except RuntimeError as exc:
            log.warning("round %d: the group did not form: %s", rnd, str(exc).splitlines()[0][:200])
            self.pg = None
            return False
        try:
            proved = self._prove(rnd)
            self._phase["form_s"] = self._phase.get("form_s", 0.0) + time.perf_counter() - t0
            return proved and self._sync(rnd)
        except (MalletrainError, RuntimeError) as exc:   # a malformed value, a store timeout
            log.warning("round %d: %s", rnd, str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__)
            self._abort()
            return False

    def _prove(self, rnd: int) -> bool:
        """Every rank shows it read the generation's key (the private store's) over the data
        plane: a process that took a rank's place without it is refused."""
        key = membership.secret(self.kv, self.ns)
        token = [bytes.fromhex(mac(key, "peer", self.ns, rnd, r)) for r in range(self.info.world)]
        rows = self._allgather(torch.tensor(list(token[self.info.rank]), dtype=torch.uint8))
        if rows is None:
            return False
        for r, row in enumerate(rows):
            if bytes(row.tolist()) != token[r]:
                log.error("round %d: the process at rank %d does not know the group's key", rnd, r)
                self._abort()
                return False
        return True

    def _sync(self, rnd: int) -> bool:
        steps = self._allgather(torch.tensor([self.step], dtype=torch.long))
        if steps is None:
            return False
        held = [int(s) for s in steps]
        top = max(held)
        if top < 0:
            log.error("round %d: no member holds the training state", rnd)
            self._abort()
            return False
        if all(s == top for s in held):
            return True
        src = held.index(top)
        key = f"{self.ns}/r{rnd}/state"
        t0 = time.perf_counter()
        if self.info.rank == src:
            blob = wire.encode({k: v for k, v in self.state().items() if k != "extra"})
            self.kv.set(key, f"{wire.digest(blob)}:{blob.numel()}")
            size = torch.tensor([blob.numel()], dtype=torch.long)
        else:
            size = torch.tensor([0], dtype=torch.long)
        if not self._broadcast(size, src):
            return False
        if self.info.rank != src:
            want, _, told = self.kv.get(key).decode("utf-8", "replace").partition(":")
            if told != str(int(size)):       # the size sent must be the one in the private store
                log.error("round %d: the state's size does not match the store's", rnd)
                self._abort()
                return False
            blob = torch.empty(int(size), dtype=torch.uint8)
        if not self._broadcast(blob, src):
            return False
        if self.info.rank != src:
            if wire.digest(blob) != want:
                log.error("round %d: the state received does not match its digest", rnd)
                self._abort()
                return False
            self._load(wire.decode(blob))
        self._phase["transfer_s"] = time.perf_counter() - t0
        return True

    def _fall_back(self) -> None:
        """Re-forming failed: the newest state this process holds goes to a checkpoint (the
        store keeps the newest step), and it exits to be requeued: today's path."""
        self.pg = None
        if self.step >= 0 and self.stopped is None:
            self._save_alone()
        if self.stopped is None:
            self.stopped = "lost"

    def _fall_back_alone(self) -> bool:
        log.error("member %d is alone and holds no state", self.member)
        self.stopped = "lost"
        return False

    def _save_alone(self) -> None:
        saved = self.store.save(self.step, self.state())
        log.warning("fallback: checkpoint of step %d written (%d bytes)", self.step, saved.bytes)
        self._saved_step = self.step

    def _retarget_metrics(self) -> None:
        """Rank 0 writes the progress records: a member that became or stopped being rank 0
        gets a new writer; every record names the group's size after the change."""
        if (self.info.rank == 0) != (self.metrics.path is not None):
            self.metrics.close()
            self.metrics = self._metrics_writer(member=self.member)
        # the records name the group's size now (one member per node): the daemon's JPA learns from it
        self.metrics.base.update(world=self.info.world, nodes=self.info.nodes)

    def _record(self, kind: str, since: float) -> None:
        """One change done: its pause (from ``since``: the last applied step, or a joiner's
        admission) and phases go to the log, :attr:`reforms` and the metrics."""
        rec = {"kind": kind, "generation": self.gen, "round": self.round, "members": list(self.members),
               "at_step": self.step, "pause_s": round(time.perf_counter() - since, 4),
               **{k: round(v, 4) for k, v in self._phase.items()}}
        self._phase = {}
        self.reforms.append(rec)
        log.info("generation %d round %d (%s): members %s at step %d, pause %.3fs", self.gen,
                 self.round, kind, list(self.members), self.step, rec["pause_s"])
        self.metrics.record("reform", step=max(self.step, 0), samples=max(self.samples, 0), step_s=0.0,
                            **{k: v for k, v in rec.items() if k != "at_step"})
