"""Live JPA input: tail the progress files jobs append to (the daemon's metrics source).

A job appends JSON lines to the file named by ``MALLETRAIN_METRICS``::

    {"t": 1795352400.5, "job": "17", "step": 120, "samples": 7680, "step_s": 0.21,
     "world": 8, "nodes": 2, "node": "n3", "event": "progress", "restart": 1}

``samples`` is cumulative; ``event`` is ``start``, ``progress``, ``checkpoint``,
``metric`` (a validation value: not used here; its ``promise``, a number in [0.001, 1000] a
campaign trial writes — η^k after surviving k pruning rungs — is handed to the core, where it
only reorders its owner's own jobs) or ``exit`` (an
``exit`` whose ``reason`` is ``done`` is the job's final result; ``pruned`` — a campaign's
pruner stopped the trial — and ``failed`` — the trial used up its campaign's retries — end the
job for good the same way: it is not requeued).  A job whose last run wrote ``done`` and then
ended ``FAILED`` (its process exited non-zero after it: the script's own lines after its
training, e.g. ``sys.exit(1)`` or a failed final save) is not finished: the process's exit status
came last, and the daemon's recovery runs it again (it resumes at its final checkpoint).
The daemon reads each file incrementally from the offset it reached last time
(persisted, so a restart neither re-reads nor loses lines).  A throughput
sample is the rate between two consecutive ``progress`` records of the same
run (same ``restart`` and ``nodes``).

Rescale pauses: when the daemon changed a job's size (:class:`SizeChange` in its
facts: told to stop at ``hold_s``, released at ``release_s`` onto ``nodes``), the
first ``progress`` record of the job's next run on that many nodes ends the pause:
``pause = t_first − hold_s``, measured once per change (the run last read and the
change measured are persisted with the offsets) and bounded by what the daemon saw
itself — at least ``release_s − hold_s`` (Slurm's part, which no job can shorten) and
at most the time of the read; a change read more than ``max_pause_s`` after it was
made (the daemon was down) is not measured.  These are the rescale-cost learner's
input (:mod:`malletrain.jpa.rescale`).

Everything in the file comes from the job's owner (SECURITY.md): the file is
opened as its owner could (:mod:`malletrain.daemon.files`); at most
``max_read_bytes`` and ``max_records`` records are read per job per read, and
``max_bytes_per_cycle`` over all jobs (:meth:`ProgressSource.poll` says in which
order: no job's file can spend what another job needs); an ``exit`` record is the job's final
result only when it names the job (``"job"``) and the file was not replaced
since; a record's numbers must be finite and in range
(``nodes`` at most the job's ``max_nodes``, a rate at most
``max_samples_per_s``); malformed, oversized, nested-too-deep and
out-of-range records are skipped and counted for that job, never raised.
"""
from __future__ import annotations

import enum
import json
import logging
import os
import stat
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from malletrain.core.backend import JobFacts, Observation
from malletrain.daemon.files import Hanging, PathWorkers, Refused, TimedOut, open_as_owner
from malletrain.domain.model import (
    MAX_MEMBERS,
    MAX_PAUSE_S,
    MAX_PROMISE,
    MIN_PROMISE,
    Direction,
    PauseKind,
    PauseSample,
    Sample,
)

log = logging.getLogger("malletrain.progress")

EVENTS = ("start", "progress", "checkpoint", "metric", "exit", "reform")
# an elastic group's re-formings (runtime/elastic.py): the survivors' pause of a planned change
REFORM_KINDS = ("grow", "shrink", "change", "loss", "join")
MAX_REFORMS_READ = 64      # re-forming records kept per file and poll (the rest are not measured)
MAX_MEMBER_ID = 10**7      # a member id is an array task id
FINAL_REASONS = ("done", "pruned", "failed")     # an exit record with one of these: the job is over
_ACTIVE = ("RUNNING", "CONFIGURING")     # Slurm states of a job that is running now
QUIET_READS = 2        # reads of a held job's file that found nothing new, after which it rests until released


OFFSETS_KEPT_S = 3600.0    # what is kept of a file no observed job names any more (offsets, refusals) goes after this
PIECE_BYTES = 64 << 10     # a read is made in pieces of this size and stops once it holds max_records lines
ENDED_READS = 16           # reads of an ended job's file per cycle (each at most max_read_bytes)


class ReadStatus(enum.Enum):
    READ = "read"            # the file was opened and read (perhaps nothing new)
    MISSING = "missing"      # there is no file at the path
    REFUSED = "refused"      # not a file its owner could read (files.py), or an error reading it
    DEFERRED = "deferred"    # not tried: this cycle's byte budget or time is spent (the file waits its turn)
    TIMED_OUT = "timed out"  # the file system did not answer in time (the read goes on, abandoned)
    HANGING = "hanging"      # not tried: an earlier read of the path still hangs, or timed out lately


@dataclass(frozen=True)
class Fetched:
    """What one read of a file returned (the I/O part of a poll; parsing is separate)."""

    inode: int
    size: int          # the file's size when it was read
    start: int         # the offset ``data`` starts at (0 when the file is new, replaced or truncated)
    data: bytes


@dataclass(frozen=True)
class TailRead:
    """The outcome of one :meth:`ProgressTail.read`."""

    status: ReadStatus
    samples: tuple[Sample, ...] = ()
    records: int = 0        # valid records read
    consumed: int = 0       # bytes the file's offset moved (what the cycle's budget is charged)
    eof: bool = False       # this read saw the end of the file (its last line may be unfinished)
    lines: int = 0          # lines read, valid or not


@dataclass
class TailState:
    offset: int = 0
    inode: int = 0
    last: tuple | None = None    # (restart, nodes, t, samples) of the last progress record
    done: bool = False           # the last run ended with a final record (``FINAL_REASONS``)
    final: str | None = None     # ... and that record's reason (done, pruned or failed)
    step_s: float = 0.0          # the last progress record's step time
    records: int = 0             # valid records read (this daemon's lifetime)
    eof: bool = False            # the last poll read to the end of the file
    run: tuple | None = None     # (restart, nodes) of the last progress record's run
    new_runs: list = field(default_factory=list)   # (restart, nodes, t) of runs first seen this poll
    measured: float | None = None   # hold_s of the size change whose pause was measured from this file
    promise: float | None = None    # the last ``metric`` record's promise (a campaign trial's rungs survived)
    elastic: bool = False        # the file holds re-forming records: its job rescales in place
    new_reforms: list = field(default_factory=list)   # (kind, pause_s, t, nodes, nodes before) this poll
    group_nodes: int = 0         # the group's size in its last progress or re-forming record
    members: tuple[int, ...] | None = None   # who the group's last re-forming record names


@dataclass
class TailCounters:
    lines: int = 0
    bad: int = 0
    oversized: int = 0
    samples: int = 0
    refused: int = 0      # files not opened: not the owner's, a symlink, a FIFO, outside the roots
    timed_out: int = 0    # reads that did not answer within read_timeout_s (hung NFS, FUSE, autofs)
    hanging: int = 0      # reads not tried: the path (or too many paths) still hangs
    by_job: Counter = field(default_factory=Counter)   # skipped lines and refusals per job


# Bounds of a progress record's fields (beyond them the record is not plausible).
MAX_T_S = 1e11            # year 5138
MAX_SAMPLES = 1e18
MAX_RESTART = 10**9
MIN_RATE = 1e-9           # samples/s; slower is not a measurement (and 1/rate must stay finite)
MAX_STEP_S = 1e6


def _number(value: object, lo: float, hi: float, *, integer: bool = False) -> float | None:
    """``value`` when it is a JSON number in [lo, hi] (an int when ``integer``), else None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if integer and not isinstance(value, int):
        return None
    if isinstance(value, int) and not -10**19 < value < 10**19:
        return None
    return value if lo <= value <= hi else None     # NaN fails both comparisons


class ProgressTail:
    def __init__(self, *, max_line_bytes: int = 4096, max_read_bytes: int = 1 << 20,
                 max_records: int = 1000, max_samples_per_s: float = 1e9,
                 roots: Sequence[str] = ("/",), io: PathWorkers | None = None,
                 read_timeout_s: float = 2.0) -> None:
        self.max_line_bytes = max_line_bytes
        self.max_read_bytes = max_read_bytes
        self.max_records = max_records
        self.max_samples_per_s = max_samples_per_s
        self.roots = tuple(roots)
        self.budget: int | None = None         # bytes left to read this cycle (None: no limit)
        # With ``io``, every open and read of a user's path runs in its worker, at most
        # ``read_timeout_s`` each and until ``deadline`` (time.monotonic) in all; without, inline
        # (for callers reading their own files).
        self.io = io
        self.read_timeout_s = read_timeout_s
        self.deadline: float | None = None
        self.files: dict[str, TailState] = {}
        self.counters = TailCounters()
        self._refused: dict[str, str] = {}     # path -> last reason logged

    def poll(self, job_id: str, path: str, *, uid: int | None = None,
             max_nodes: int = 1_000_000) -> list[Sample]:
        """New samples of ``job_id`` from ``path`` since the last poll (see :meth:`read`)."""
        return list(self.read(job_id, path, uid=uid, max_nodes=max_nodes).samples)

    def read(self, job_id: str, path: str, *, uid: int | None = None, max_nodes: int = 1_000_000,
             cap: int | None = None, max_lines: int | None = None) -> TailRead:
        """Read what ``job_id`` appended to ``path`` since the last read: at most ``cap`` (and
        ``max_read_bytes``, and what is left of :attr:`budget`) bytes, ``max_lines`` (and
        ``max_records``) lines.

        With ``uid`` the file is opened only as that user could
        (:func:`open_as_owner`); without, it must still be a regular file reached
        without following a symlink (for callers that own the file themselves).
        The budget is charged what the read consumed (the bytes the offset moved), not what
        was asked for: a file of empty lines costs what its lines are worth.  A read starts only
        when a whole line still fits the budget; otherwise the file waits (``DEFERRED``).
        """
        want = self.max_read_bytes if cap is None else min(self.max_read_bytes, cap)
        if self.budget is not None:
            if self.budget < min(want, self.max_line_bytes + 1):
                return TailRead(ReadStatus.DEFERRED)    # this cycle's reading is spent: the rest waits
            want = min(want, self.budget)
        lines = self.max_records if max_lines is None else min(self.max_records, max_lines)
        if want <= 0 or lines <= 0:
            return TailRead(ReadStatus.DEFERRED)
        st = self.files.get(path) or TailState()
        try:
            if self.io is None:
                got = self.fetch(path, uid, st.offset, st.inode, want, lines)
            else:
                timeout = self.read_timeout_s
                if self.deadline is not None:
                    timeout = min(timeout, self.deadline - time.monotonic())
                    if timeout <= 0:
                        return TailRead(ReadStatus.DEFERRED)     # this cycle's time for reading is spent
                offset, inode = st.offset, st.inode
                got = self.io.call(path, -1 if uid is None else uid,
                                   lambda: self.fetch(path, uid, offset, inode, want, lines), timeout)
        except TimedOut as exc:
            self.counters.timed_out += 1
            self.counters.by_job[job_id] += 1
            self._say(job_id, path, f"{exc}; not read again while that read hangs, nor for a while after")
            return TailRead(ReadStatus.TIMED_OUT)
        except Hanging:
            self.counters.hanging += 1
            return TailRead(ReadStatus.HANGING)
        except FileNotFoundError:
            return TailRead(ReadStatus.MISSING)
        except Refused as exc:
            self._refuse(job_id, path, str(exc))
            return TailRead(ReadStatus.REFUSED)
        except OSError as exc:
            self._refuse(job_id, path, exc.strerror or str(exc))
            return TailRead(ReadStatus.REFUSED)
        self._refused.pop(path, None)
        self.files[path] = st           # only files that were opened are remembered
        return self._parse(job_id, st, got, max_nodes, lines)

    def fetch(self, path: str, uid: int | None, offset: int, inode: int, want: int, max_lines: int) -> Fetched:
        """The I/O of a read (nothing else touches the file): open ``path`` as its owner could,
        and read from ``offset`` (from 0 when the file is not ``inode`` any more or is shorter
        than ``offset``) at most ``want`` bytes, in pieces, stopping once ``max_lines`` lines
        are complete.  Raises ``FileNotFoundError``, :class:`Refused` or ``OSError``."""
        fd = (open_as_owner(path, uid, self.roots) if uid is not None else
              os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC))
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise Refused("not a regular file")
            start = offset if info.st_ino == inode and info.st_size >= offset else 0
            parts: list[bytes] = []
            size = lines = 0
            while size < want and lines < max_lines:
                piece = os.pread(fd, min(PIECE_BYTES, want - size), start + size)
                if not piece:
                    break
                parts.append(piece)
                size += len(piece)
                lines += piece.count(b"\n")
        finally:
            os.close(fd)
        return Fetched(info.st_ino, info.st_size, start, b"".join(parts))

    def _parse(self, job_id: str, st: TailState, got: Fetched, max_nodes: int, max_lines: int) -> TailRead:
        if got.inode != st.inode or got.start != st.offset:     # new, replaced or truncated
            st.offset, st.inode, st.last, st.done, st.final, st.step_s = got.start, got.inode, None, False, None, 0.0
            st.run, st.new_runs, st.promise = None, [], None
            st.elastic, st.new_reforms, st.group_nodes, st.members = False, [], 0, None
        chunk = got.data
        eof = got.start + len(chunk) >= got.size
        end = chunk.rfind(b"\n")
        if end < 0:
            consumed = 0
            if len(chunk) > self.max_line_bytes:   # one endless line: skip it
                self._skip(job_id, oversized=True)
                consumed = len(chunk)
            return self._consumed(st, TailRead(ReadStatus.READ, consumed=consumed, eof=eof, lines=int(consumed > 0)))
        out = []
        pos = records = 0
        lines = chunk[:end].split(b"\n", max_lines)     # the rest waits for the next read
        if len(lines) > max_lines:
            eof = False
        lines = lines[:max_lines]
        for raw in lines:
            pos += len(raw) + 1
            self.counters.lines += 1
            if len(raw) > self.max_line_bytes:
                self._skip(job_id, oversized=True)
                continue
            rec = self._record(raw, max_nodes)
            if rec is None:
                self._skip(job_id)
                continue
            st.records += 1
            records += 1
            if rec["event"] == "metric" and rec["promise"] is not None:
                st.promise = rec["promise"]
            if rec["event"] == "reform" and rec["kind"] is not None and rec["pause_s"] is not None:
                st.elastic = True
                if len(st.new_reforms) < MAX_REFORMS_READ:
                    st.new_reforms.append((rec["kind"], rec["pause_s"], rec["t"], rec["nodes"], st.group_nodes))
            if rec["event"] == "reform" and rec["members"] is not None:
                st.members = rec["members"]
            if rec["event"] in ("reform", "progress") and rec["nodes"] >= 1:
                st.group_nodes = rec["nodes"]
            if rec["event"] == "start":
                st.done, st.final = False, None
            elif rec["event"] == "exit":     # final only when it names this job (not a stale file's)
                st.done = rec["reason"] in FINAL_REASONS and rec["job"] == job_id
                st.final = rec["reason"] if st.done else None
            elif rec["event"] == "progress" and rec["step_s"] is not None:
                st.step_s = rec["step_s"]
            if rec["event"] == "progress" and rec["nodes"] >= 1:
                key = (rec["restart"], rec["nodes"])
                if key != st.run:
                    st.run = key
                    if len(st.new_runs) < 64:
                        st.new_runs.append((*key, rec["t"]))
            sample = self._sample(job_id, st, rec)
            if sample is not None:
                if MIN_RATE <= sample.samples_per_s <= self.max_samples_per_s:
                    out.append(sample)
                else:
                    self._skip(job_id)
        self.counters.samples += len(out)
        return self._consumed(st, TailRead(ReadStatus.READ, tuple(out), records, pos, eof, len(lines)))

    def _consumed(self, st: TailState, r: TailRead) -> TailRead:
        st.offset += r.consumed
        st.eof = r.eof
        if self.budget is not None:
            self.budget -= r.consumed
        return r

    def _skip(self, job_id: str, *, oversized: bool = False) -> None:
        if oversized:
            self.counters.oversized += 1
        else:
            self.counters.bad += 1
        self.counters.by_job[job_id] += 1

    def _refuse(self, job_id: str, path: str, why: str) -> None:
        self.counters.refused += 1
        self.counters.by_job[job_id] += 1
        self._say(job_id, path, why)

    def _say(self, job_id: str, path: str, why: str) -> None:
        if self._refused.get(path) != why:      # say it once per file and reason
            self._refused[path] = why
            log.warning("job %s: not reading progress file %s: %s", job_id, path, why,
                        extra={"job": job_id, "reason": "progress file refused"})

    @staticmethod
    def _record(raw: bytes, max_nodes: int) -> dict | None:
        try:
            rec = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return None
        if not isinstance(rec, dict) or rec.get("event", "progress") not in EVENTS:
            return None
        t = _number(rec.get("t"), 0.0, MAX_T_S)
        samples = _number(rec.get("samples", 0), 0.0, MAX_SAMPLES)
        nodes = _number(rec.get("nodes", 0), 0, max_nodes, integer=True)
        restart = _number(rec.get("restart", 0), 0, MAX_RESTART, integer=True)
        if t is None or samples is None or nodes is None or restart is None:
            return None
        step_s = _number(rec.get("step_s"), 0.0, MAX_STEP_S)
        promise = _number(rec.get("promise"), MIN_PROMISE, MAX_PROMISE)
        job = rec.get("job")
        kind = rec.get("kind")
        pause = _number(rec.get("pause_s"), 0.0, MAX_PAUSE_S)
        members = rec.get("members")
        if not (isinstance(members, list) and len(members) <= MAX_MEMBERS
                and all(type(m) is int and 0 <= m < MAX_MEMBER_ID for m in members)):
            members = None
        return {"event": rec.get("event", "progress"), "job": job if isinstance(job, str) else None,
                "kind": kind if kind in REFORM_KINDS else None, "pause_s": None if pause is None else float(pause),
                "members": None if members is None else tuple(members),
                "t": float(t), "samples": float(samples),
                "nodes": int(nodes), "restart": int(restart), "reason": rec.get("reason"),
                "step_s": None if step_s is None else float(step_s),
                "promise": None if promise is None else float(promise)}

    @staticmethod
    def _sample(job_id: str, st: TailState, rec: dict) -> Sample | None:
        if rec["event"] != "progress" or rec["nodes"] < 1:
            if rec["event"] in ("start", "exit"):
                st.last = None
            return None
        key = (rec["restart"], rec["nodes"])
        prev, st.last = st.last, (*key, rec["t"], rec["samples"])
        if prev is None or prev[:2] != key:
            return None
        dt, ds = rec["t"] - prev[2], rec["samples"] - prev[3]
        if dt <= 0 or ds <= 0:
            return None
        return Sample(job_id, rec["nodes"], ds / dt, rec["t"])

    def forget(self, path: str, job_id: str | None = None) -> None:
        self.files.pop(path, None)
        self._refused.pop(path, None)
        if job_id is not None:
            self.counters.by_job.pop(job_id, None)

    # persistence (the daemon's store saves and restores these)
    def dump(self) -> dict:
        return {p: [s.offset, s.inode, list(s.last) if s.last else None, s.done,
                    list(s.run) if s.run else None, s.measured, s.promise, s.final] for p, s in self.files.items()}

    def load(self, data: dict) -> None:
        for p, entry in data.items():
            try:
                offset, inode, last, *rest = entry
                st = TailState(int(offset), int(inode), tuple(last) if last else None,
                               bool(rest[0]) if rest else False)
                if len(rest) >= 3:   # the run last read and the change measured (so a restart measures nothing twice)
                    st.run = tuple(int(x) for x in rest[1]) if rest[1] else None
                    st.measured = float(rest[2]) if rest[2] is not None else None
                if len(rest) >= 4:   # the last promise read
                    promise = _number(rest[3], MIN_PROMISE, MAX_PROMISE)
                    st.promise = None if promise is None else float(promise)
                if len(rest) >= 5 and rest[4] in FINAL_REASONS and st.done:   # the final record's reason
                    st.final = rest[4]
                self.files[p] = st
            except (TypeError, ValueError):
                log.warning("stored offset of %s unreadable; reading that file from the start", p)


class ProgressSource:
    """The daemon's metrics source: each observed job's progress file → samples.

    Reads the file the job's tag names (:class:`JobFacts.progress_path`),
    forgets the files of jobs that left, keeps the newest sample per job (for
    ``status``) and hands every new sample and the moved offsets to ``journal``
    (the store), so a restart neither re-reads nor loses anything.
    """

    def __init__(self, tail: ProgressTail, journal: SampleJournal | None = None, *,
                 max_bytes_per_cycle: int | None = None, max_pause_s: float = 3600.0,
                 cycle_timeout_s: float | None = None) -> None:
        self.tail = tail
        self.journal = journal
        self.max_bytes_per_cycle = max_bytes_per_cycle
        self.cycle_timeout_s = cycle_timeout_s       # all reading of one cycle (with the tail's io)
        self._turn = 0                               # where this cycle's reading of idle jobs starts
        self._quiet: dict[str, int] = {}             # held jobs: reads that found nothing new since released
        self.latest: dict[str, Sample] = {}
        self.final: dict[str, bool | None] = {}      # ended jobs: did the last run end ``done``?
        self.failed_after_done: set[str] = set()     # ended FAILED after a ``done`` record (final: False)
        self.last_progress: dict[str, float] = {}    # observation clock when a job's file last grew
        self._paths: dict[str, str] = {}
        self._named: dict[str, float] = {}           # path -> when an observed job last named it
        self._pauses: list[PauseSample] = []
        self._now = 0.0
        self.max_pause_s = max_pause_s
        self._saved = tail.dump()

    def _state(self, job: str) -> TailState | None:
        path = self._paths.get(job)
        return self.tail.files.get(path) if path else None

    def finished(self, job: str) -> bool:
        """Whether the job's last run, as read so far, ended with its final ``done`` record."""
        st = self._state(job)
        return bool(st and st.done)

    def members(self, job: str) -> tuple[int, ...] | None:
        """An elastic group's members (array task ids) as its last re-forming record read names
        them; None before one was read."""
        st = self._state(job)
        return st.members if st else None

    def step_s(self, job: str) -> float:
        st = self._state(job)
        return st.step_s if st else 0.0

    def promises(self) -> dict[str, float]:
        """The promise each job whose file is read reported last (campaign trials; bounded when
        read).  It only re-splits its owner's nodes among the owner's jobs (core.decide)."""
        out = {}
        for job in self._paths:
            st = self._state(job)
            if st is not None and st.promise is not None:
                out[job] = st.promise
        return out

    def pauses(self) -> tuple[PauseSample, ...]:
        """Rescale pauses measured since the last call."""
        out, self._pauses = tuple(self._pauses), []
        return out

    def _measure_reforms(self, job: str, facts: JobFacts, st: TailState) -> None:
        """An elastic group's changes (issue #26), each measured as its kind
        (:class:`~malletrain.domain.model.PauseKind`):

        * the daemon's shrink: the survivors' pause of the first ``shrink`` at or after its hold
          while the group was still above the size it was shrunk to (once per change);
        * a ``shrink`` the daemon did not order (before its hold, or with the group already at or
          below that size): a node taken back, a *preemption* (mostly Slurm's; an owner's cancel
          of one member looks the same);
        * the daemon's grow: the survivors' pause plus the joiners' start (from the daemon's
          release to the re-forming), during which the joiners' share of the new size did no
          work, as one pause at the new size, the way the replay charges it (replay/sim.py);
        * a ``loss``: a member gone unannounced, the survivors' pause (mostly the time to notice).

        Preemptions and losses are what the job's file alone reports: at most one of each a read
        (and the learner keeps them to the job, :mod:`malletrain.jpa.rescale`).

        Joins seen by a joiner and mixed changes are not measured.  Bounded like every
        measurement: within ``max_pause_s`` and no later than the read."""
        reforms, st.new_reforms = st.new_reforms, []
        ch = facts.change
        unprompted: set[PauseKind] = set()     # at most one preemption and one loss a read
        for kind, pause_s, t, nodes, before in reforms:
            if kind == "shrink":
                ours = (ch.hold_s if ch is not None and ch.direction is Direction.DOWN and t >= ch.hold_s
                        and (not before or before > ch.nodes) else None)     # the daemon's: when it held
                if ours is not None and st.measured == ours:
                    continue                            # the same shrink, in two steps: measured once
                if ours is not None:
                    st.measured = ours
                    measured = PauseKind.SHRINK
                elif PauseKind.PREEMPTION in unprompted:
                    continue
                else:
                    measured = PauseKind.PREEMPTION
                    unprompted.add(measured)
                self._pauses.append(PauseSample(job, measured, min(pause_s, self.max_pause_s), self._now))
            elif kind == "loss" and PauseKind.LOSS not in unprompted:
                unprompted.add(PauseKind.LOSS)
                self._pauses.append(PauseSample(job, PauseKind.LOSS, min(pause_s, self.max_pause_s), self._now))
            elif (kind == "grow" and ch is not None and ch.direction is Direction.UP and nodes >= 1
                  and st.measured != ch.hold_s and t >= ch.release_s):      # once per change
                st.measured = ch.hold_s
                start = min(max(0.0, min(t, self._now) - ch.release_s), self.max_pause_s)
                share = max(1, nodes - before) / nodes if before else 1.0
                self._pauses.append(PauseSample(job, PauseKind.GROW, min(self.max_pause_s, pause_s + start * share),
                                                self._now))

    def _measure(self, job: str, facts: JobFacts, st: TailState) -> None:
        """The pause of the job's latest size change, from the first record of its new run."""
        runs, st.new_runs = st.new_runs, []
        ch = facts.change
        if ch is None or st.measured == ch.hold_s:
            return
        for _, nodes, t in runs:
            if nodes == ch.nodes and t >= ch.hold_s:
                low, high = ch.release_s - ch.hold_s, self._now - ch.hold_s
                st.measured = ch.hold_s          # one measurement per change, whatever comes of it
                if high < low or high > self.max_pause_s:
                    return     # read too late to tell the pause from the wait (a restart, a slow read)
                self._pauses.append(PauseSample(job, ch.kind, min(high, max(low, t - ch.hold_s)),
                                                self._now))
                return

    def wake(self, job: str) -> None:
        """The daemon released ``job`` (a start or a grow): its file is read every cycle again."""
        self._quiet.pop(job, None)

    def poll(self, observation: Observation) -> tuple[Sample, ...]:
        """Read the observed jobs' files, within ``max_bytes_per_cycle``:

        1. running jobs and ended jobs not judged yet, each up to an equal share of the budget
           (at least one whole line, at most ``max_read_bytes``), running jobs first, each
           group in turns: one job's huge file (newlines, a sparse file) cannot spend what the
           others need (a running job not read is taken for hung after ``hang_floor_s``);
        2. what is left: running jobs up to ``max_read_bytes``, ended jobs up to their own cap
           (``ENDED_READS`` reads a cycle), then the other (pending, held) jobs, in turns.

        An ended job is judged (:attr:`final`) only from a read that reached the end of its file
        this cycle; a file not read to its end waits for the next cycle, whatever the others'
        files hold.  A cancelled job's file is not read at all: its owner or an admin ended it,
        and what was read of it before says whether its work had finished.
        """
        now = observation.snapshot.now_s
        self._now = now
        for job in observation.finished:
            self._drop(job)
        for job in [j for j in self.final if j not in observation.ended]:
            del self.final[job]
        self.failed_after_done &= self.final.keys()
        out: list[Sample] = []
        ended = []
        for job, facts in observation.ended.items():
            if job in self.final:
                continue
            if facts.state == "CANCELLED":
                st = self._state(job)
                self.final[job] = True if st is not None and st.done else None
                self._drop(job)
            else:
                ended.append((job, facts))
        running = [kv for kv in observation.facts.items() if kv[1].state in _ACTIVE]
        # a held job whose file gave nothing new twice since it was last released has nothing more
        # to give until it runs again (its processes are gone: Slurm lists a job pending only after
        # they ended, and only the daemon or its owner releases it: wake()): not read, so a queue
        # of thousands of held jobs costs no file access a cycle
        self._quiet = {j: n for j, n in self._quiet.items() if j in observation.facts and observation.facts[j].held}
        idle = [kv for kv in observation.facts.items()
                if kv[1].state not in _ACTIVE and self._quiet.get(kv[0], 0) < QUIET_READS]
        self._turn += 1
        running, ended, idle = (_turns(group, self._turn) for group in (running, ended, idle))
        budget = self.max_bytes_per_cycle
        self.tail.budget = budget
        if self.cycle_timeout_s is not None:
            self.tail.deadline = time.monotonic() + self.cycle_timeout_s
        ended_cap = ENDED_READS * self.tail.max_read_bytes
        used: dict[str, _Used] = {}     # what each job's file gave this cycle
        if budget is None:
            share = self.tail.max_read_bytes
        else:
            share = budget // max(1, len(running) + len(ended))
            share = max(self.tail.max_line_bytes + 1, min(self.tail.max_read_bytes, share))
        try:
            for job, facts in running:
                self._live(job, facts, out, share, used)
            for job, facts in ended:
                self._final(job, facts, out, share if budget is not None else ended_cap, used)
            if budget is not None:
                for job, facts in running:
                    self._live(job, facts, out, self.tail.max_read_bytes, used)
                for job, facts in ended:
                    if job not in self.final:
                        self._final(job, facts, out, ended_cap, used)
            for job, facts in idle:
                self._live(job, facts, out, self.tail.max_read_bytes, used)
                u = used.get(job)
                if facts.held and u is not None and u.settled:
                    self._quiet[job] = self._quiet.get(job, 0) + 1 if u.lines == 0 else 0
        finally:
            self.tail.budget = self.tail.deadline = None
        for s in out:
            self.latest[s.job_id] = s
        self._age(observation, now)
        self._persist(out)
        return tuple(out)

    def _live(self, job: str, facts: JobFacts, out: list[Sample], cap: int, used: dict[str, _Used]) -> None:
        """Read a job in the queue on, up to ``cap`` bytes this cycle (``max_records`` lines)."""
        u = used.setdefault(job, _Used())
        if u.settled or u.bytes >= cap or u.lines >= self.tail.max_records:
            return
        r = self._read(job, facts, out, cap - u.bytes, self.tail.max_records - u.lines)
        if r.status is ReadStatus.DEFERRED:
            return
        u.bytes += r.consumed
        u.lines += r.lines
        u.settled = r.status is not ReadStatus.READ or r.eof
        if r.records:
            self.last_progress[job] = self._now

    def _read(self, job: str, facts: JobFacts, out: list[Sample], cap: int | None = None,
              max_lines: int | None = None) -> TailRead:
        """Read one job's file into ``out``."""
        if not facts.progress_path:
            return TailRead(ReadStatus.MISSING)
        self._paths[job] = facts.progress_path
        if facts.uid is None:      # without the owner's uid nothing can be checked: not read
            self.tail._refuse(job, facts.progress_path, "the job's owner is unknown")
            return TailRead(ReadStatus.REFUSED)
        try:
            r = self.tail.read(job, facts.progress_path, uid=facts.uid, max_nodes=facts.max_nodes, cap=cap,
                               max_lines=max_lines)
        except Exception:   # one job's data must never stop the others (SECURITY.md)
            self.tail.counters.by_job[job] += 1
            log.exception("job %s: progress file %s could not be processed", job, facts.progress_path,
                          extra={"job": job, "reason": "progress error"})
            return TailRead(ReadStatus.REFUSED)
        out += r.samples
        st = self.tail.files.get(facts.progress_path)
        if st is not None and not facts.elastic:    # re-forming records count for groups only
            st.new_reforms, st.elastic, st.members = [], False, None
        if st is not None and st.new_reforms:
            self._measure_reforms(job, facts, st)
        if st is not None and st.new_runs:
            if st.elastic:          # its changes are measured from its re-forming records
                st.new_runs = []
            else:
                self._measure(job, facts, st)
        return r

    def _final(self, job: str, facts: JobFacts, out: list[Sample], cap: int, used: dict[str, _Used]) -> None:
        """Read an ended job's file on (up to ``cap`` bytes this cycle) and judge it once a read
        reached the end of the file: :attr:`final` is True when its last run ended with a final
        record (``done``, ``pruned``, ``failed``), False when it did not, when it ended ``FAILED``
        after ``done`` (:attr:`failed_after_done`) or there is no file, None when there is no file to trust (none
        named, or refused).  A read that did not happen (budget) or stopped short judges nothing."""
        verdict: bool | None = None
        if facts.progress_path:
            u = used.setdefault(job, _Used())
            while True:
                if u.reads >= ENDED_READS or u.bytes >= cap:
                    return                  # go on next cycle
                r = self._read(job, facts, out, cap - u.bytes)
                if r.status in (ReadStatus.DEFERRED, ReadStatus.TIMED_OUT, ReadStatus.HANGING):
                    return                  # not read: no verdict (go on next cycle)
                if r.status is ReadStatus.MISSING:   # never wrote one: no record facility, like no path
                    verdict = None
                    break
                if r.status is ReadStatus.REFUSED:
                    verdict = None
                    break
                u.reads += 1
                u.bytes += r.consumed
                if r.eof:
                    st = self.tail.files.get(facts.progress_path)
                    verdict = bool(st and st.done)
                    if verdict and st is not None and st.final == "done" and facts.state == "FAILED":
                        verdict = False      # the process exited non-zero after its 'done': not finished
                        self.failed_after_done.add(job)
                        # kept, read to its end and no longer final: the requeued run goes on
                        # from here, and its old 'done' is never read as its end (finished())
                        st.done, st.final = False, None
                        self.final[job] = verdict
                        return
                    break
                if not r.consumed:
                    return                  # an unfinished line within the cap: next cycle
        self.final[job] = verdict
        self._drop(job)

    def _age(self, observation: Observation, now: float) -> None:
        """Nothing is kept for ever: what is known of jobs no longer observed goes at once (it
        left while the daemon was down, or without a word), what is known of a file no observed
        job names (its offset, a refusal) after ``OFFSETS_KEPT_S`` (offsets restored from the
        store included)."""
        known = set(observation.facts) | set(observation.ended)
        for table in (self._paths, self.latest, self.last_progress, self.tail.counters.by_job):
            for job in [j for j in table if j not in known]:
                del table[job]
        named = {f.progress_path for f in (*observation.facts.values(), *observation.ended.values())
                 if f.progress_path}
        for path in named:
            self._named[path] = now
        for path in [*self.tail.files, *self.tail._refused]:
            if path not in named and now - self._named.setdefault(path, now) > OFFSETS_KEPT_S:
                self.tail.forget(path)
        for path in [p for p in self._named if p not in self.tail.files and p not in self.tail._refused]:
            del self._named[path]

    def _drop(self, job: str) -> None:
        path = self._paths.pop(job, None)
        if path is not None:
            self.tail.forget(path, job)
        self.latest.pop(job, None)
        self.last_progress.pop(job, None)

    def _persist(self, out: list[Sample]) -> None:
        if self.journal is not None:
            self.journal.add_samples(out)
            offsets = self.tail.dump()
            if offsets != self._saved:     # offsets moved: persist them
                self.journal.put("tails", offsets)
                self._saved = offsets


@dataclass
class _Used:
    """What one job's file gave in this cycle's reading."""

    bytes: int = 0
    lines: int = 0
    reads: int = 0
    settled: bool = False      # read to its end, missing or refused: nothing more this cycle


def _turns(group: list, turn: int) -> list:
    """``group`` rotated by ``turn``: who reads first changes every cycle."""
    if not group:
        return group
    k = turn % len(group)
    return group[k:] + group[:k]


class SampleJournal(Protocol):
    """Where :class:`ProgressSource` persists samples and file offsets (the store)."""

    def add_samples(self, samples: Iterable[Sample]) -> None: ...

    def put(self, key: str, value: object) -> None: ...
