"""Live JPA input: tail the progress files jobs append to (the daemon's metrics source).

A job appends JSON lines to the file named by ``MALLETRAIN_METRICS``::

    {"t": 1795352400.5, "job": "17", "step": 120, "samples": 7680, "step_s": 0.21,
     "world": 8, "nodes": 2, "node": "n3", "event": "progress", "restart": 1}

``samples`` is cumulative; ``event`` is ``start``, ``progress``, ``checkpoint``
or ``exit`` (an ``exit`` with ``"reason": "done"`` is the job's final result).
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
``max_read_bytes`` and ``max_records`` records are read per job per cycle, and
``max_bytes_per_cycle`` over all jobs, running jobs first, the others taking
turns (the rest waits for the next cycle); an ``exit`` record is the job's final
result only when it names the job (``"job"``) and the file was not replaced
since; a record's numbers must be finite and in range
(``nodes`` at most the job's ``max_nodes``, a rate at most
``max_samples_per_s``); malformed, oversized, nested-too-deep and
out-of-range records are skipped and counted for that job, never raised.
"""
from __future__ import annotations

import json
import logging
import os
import stat
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from malletrain.core.backend import JobFacts, Observation
from malletrain.daemon.files import Refused, open_as_owner
from malletrain.domain.model import PauseSample, Sample

log = logging.getLogger("malletrain.progress")

EVENTS = ("start", "progress", "checkpoint", "exit")
_ACTIVE = ("RUNNING", "CONFIGURING")     # Slurm states of a job that is running now


class _Unread:
    """An ended job's file not read to its end yet (this cycle's budget ran out)."""


_UNREAD = _Unread()


@dataclass
class TailState:
    offset: int = 0
    inode: int = 0
    last: tuple | None = None    # (restart, nodes, t, samples) of the last progress record
    done: bool = False           # the last run ended with a final ``done`` record
    step_s: float = 0.0          # the last progress record's step time
    records: int = 0             # valid records read (this daemon's lifetime)
    eof: bool = False            # the last poll read to the end of the file
    run: tuple | None = None     # (restart, nodes) of the last progress record's run
    new_runs: list = field(default_factory=list)   # (restart, nodes, t) of runs first seen this poll
    measured: float | None = None   # hold_s of the size change whose pause was measured from this file


@dataclass
class TailCounters:
    lines: int = 0
    bad: int = 0
    oversized: int = 0
    samples: int = 0
    refused: int = 0      # files not opened: not the owner's, a symlink, a FIFO, outside the roots
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
                 roots: Sequence[str] = ("/",)) -> None:
        self.max_line_bytes = max_line_bytes
        self.max_read_bytes = max_read_bytes
        self.max_records = max_records
        self.max_samples_per_s = max_samples_per_s
        self.roots = tuple(roots)
        self.budget: int | None = None         # bytes left to read this cycle (None: no limit)
        self.files: dict[str, TailState] = {}
        self.counters = TailCounters()
        self._refused: dict[str, str] = {}     # path -> last reason logged

    def poll(self, job_id: str, path: str, *, uid: int | None = None,
             max_nodes: int = 1_000_000) -> list[Sample]:
        """New samples of ``job_id`` from ``path`` since the last poll.

        With ``uid`` the file is opened only as that user could
        (:func:`open_as_owner`); without, it must still be a regular file reached
        without following a symlink (for callers that own the file themselves).
        """
        if self.budget is not None and self.budget <= 0:
            return []                 # this cycle's reading is spent: the rest waits
        st = self.files.get(path) or TailState()
        try:
            fd = (open_as_owner(path, uid, self.roots) if uid is not None else
                  os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC))
            with os.fdopen(fd, "rb") as fh:
                info = os.fstat(fh.fileno())
                if not stat.S_ISREG(info.st_mode):
                    raise Refused("not a regular file")
                if info.st_ino != st.inode or info.st_size < st.offset:   # new, replaced or truncated
                    st.offset, st.inode, st.last, st.done, st.step_s = 0, info.st_ino, None, False, 0.0
                    st.run, st.new_runs = None, []
                want = self.max_read_bytes if self.budget is None else min(self.max_read_bytes, self.budget)
                fh.seek(st.offset)
                chunk = fh.read(want)
                if self.budget is not None:
                    self.budget -= len(chunk)
                st.eof = st.offset + len(chunk) >= info.st_size
        except FileNotFoundError:
            return []
        except Refused as exc:
            self._refuse(job_id, path, str(exc))
            return []
        except OSError as exc:
            self._refuse(job_id, path, exc.strerror or str(exc))
            return []
        self._refused.pop(path, None)
        self.files[path] = st           # only files that were opened are remembered
        end = chunk.rfind(b"\n")
        if end < 0:
            if len(chunk) > self.max_line_bytes:   # one endless line: skip it
                self._skip(job_id, oversized=True)
                st.offset += len(chunk)
            return []
        out = []
        pos = 0
        lines = chunk[:end].split(b"\n", self.max_records)     # the rest waits for the next cycle
        if len(lines) > self.max_records:
            st.eof = False
        for raw in lines[:self.max_records]:
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
            if rec["event"] == "start":
                st.done = False
            elif rec["event"] == "exit":     # final only when it names this job (not a stale file's)
                st.done = rec["reason"] == "done" and rec["job"] == job_id
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
        st.offset += pos
        self.counters.samples += len(out)
        return out

    def _skip(self, job_id: str, *, oversized: bool = False) -> None:
        if oversized:
            self.counters.oversized += 1
        else:
            self.counters.bad += 1
        self.counters.by_job[job_id] += 1

    def _refuse(self, job_id: str, path: str, why: str) -> None:
        self.counters.refused += 1
        self.counters.by_job[job_id] += 1
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
        job = rec.get("job")
        return {"event": rec.get("event", "progress"), "job": job if isinstance(job, str) else None,
                "t": float(t), "samples": float(samples),
                "nodes": int(nodes), "restart": int(restart), "reason": rec.get("reason"),
                "step_s": None if step_s is None else float(step_s)}

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
                    list(s.run) if s.run else None, s.measured] for p, s in self.files.items()}

    def load(self, data: dict) -> None:
        for p, entry in data.items():
            try:
                offset, inode, last, *rest = entry
                st = TailState(int(offset), int(inode), tuple(last) if last else None,
                               bool(rest[0]) if rest else False)
                if len(rest) >= 3:   # the run last read and the change measured (so a restart measures nothing twice)
                    st.run = tuple(int(x) for x in rest[1]) if rest[1] else None
                    st.measured = float(rest[2]) if rest[2] is not None else None
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
                 max_bytes_per_cycle: int | None = None, max_pause_s: float = 3600.0) -> None:
        self.tail = tail
        self.journal = journal
        self.max_bytes_per_cycle = max_bytes_per_cycle
        self._turn = 0                               # where this cycle's reading of idle jobs starts
        self.latest: dict[str, Sample] = {}
        self.final: dict[str, bool | None] = {}      # ended jobs: did the last run end ``done``?
        self.last_progress: dict[str, float] = {}    # observation clock when a job's file last grew
        self._paths: dict[str, str] = {}
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

    def step_s(self, job: str) -> float:
        st = self._state(job)
        return st.step_s if st else 0.0

    def pauses(self) -> tuple[PauseSample, ...]:
        """Rescale pauses measured since the last call."""
        out, self._pauses = tuple(self._pauses), []
        return out

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
                self._pauses.append(PauseSample(job, ch.direction, min(high, max(low, t - ch.hold_s)),
                                                self._now))
                return

    def poll(self, observation: Observation) -> tuple[Sample, ...]:
        now = observation.snapshot.now_s
        self._now = now
        for job in observation.finished:
            self._drop(job)
        out: list[Sample] = []
        self.tail.budget = self.max_bytes_per_cycle
        for job, facts in observation.ended.items():    # the last records of a job that ended
            if job not in self.final:
                done = self._final(job, facts, out)
                if not isinstance(done, _Unread):        # read to its end next cycle otherwise
                    self.final[job] = done
        for job in [j for j in self.final if j not in observation.ended]:
            del self.final[job]
        # running jobs first (their samples feed the JPA), then the others, taking turns
        running = [kv for kv in observation.facts.items() if kv[1].state in _ACTIVE]
        idle = [kv for kv in observation.facts.items() if kv[1].state not in _ACTIVE]
        if idle:
            self._turn %= len(idle)
            idle = idle[self._turn:] + idle[:self._turn]
            self._turn += 1
        for job, facts in running + idle:
            got = self._read(job, facts, out)
            if got:
                self.last_progress[job] = now
        self.tail.budget = None
        for s in out:
            self.latest[s.job_id] = s
        self._persist(out)
        return tuple(out)

    def _read(self, job: str, facts: JobFacts, out: list[Sample]) -> int:
        """Poll one job's file into ``out``; the number of valid records read."""
        if not facts.progress_path:
            return 0
        if facts.uid is None:      # without the owner's uid nothing can be checked: not read
            self.tail._refuse(job, facts.progress_path, "the job's owner is unknown")
            return 0
        self._paths[job] = facts.progress_path
        st = self.tail.files.get(facts.progress_path)
        before = st.records if st else 0
        try:
            out += self.tail.poll(job, facts.progress_path, uid=facts.uid, max_nodes=facts.max_nodes)
        except Exception:   # one job's data must never stop the others (SECURITY.md)
            self.tail.counters.by_job[job] += 1
            log.exception("job %s: progress file %s could not be processed", job, facts.progress_path,
                          extra={"job": job, "reason": "progress error"})
            return 0
        st = self.tail.files.get(facts.progress_path)
        if st is not None and st.new_runs:
            self._measure(job, facts, st)
        return (st.records if st else 0) - before

    def _final(self, job: str, facts: JobFacts, out: list[Sample]) -> bool | None | _Unread:
        """Read an ended job's file to its end (at most 64 reads): True when its last run ended
        ``done``; :data:`_UNREAD` when this cycle's read budget ran out first (go on next cycle)."""
        if not facts.progress_path or facts.uid is None:
            self._drop(job)
            return None
        for _ in range(64):
            self._read(job, facts, out)
            st = self.tail.files.get(facts.progress_path)
            if st is None or st.eof or not os.path.lexists(facts.progress_path):
                break
            if self.tail.budget is not None and self.tail.budget <= 0:
                return _UNREAD
        st = self.tail.files.get(facts.progress_path)
        done = bool(st and st.done)
        self._drop(job)
        return done

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


class SampleJournal(Protocol):
    """Where :class:`ProgressSource` persists samples and file offsets (the store)."""

    def add_samples(self, samples: Iterable[Sample]) -> None: ...

    def put(self, key: str, value: object) -> None: ...
