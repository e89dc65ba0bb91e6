"""Live JPA input: tail the progress files jobs append to (the daemon's metrics source).

A job appends JSON lines to the file named by ``MALLETRAIN_METRICS``::

    {"t": 1795352400.5, "job": "17", "step": 120, "samples": 7680, "step_s": 0.21,
     "world": 8, "nodes": 2, "node": "n3", "event": "progress", "restart": 1}

``samples`` is cumulative; ``event`` is ``start``, ``progress``, ``checkpoint``
or ``exit``.  The daemon reads each file incrementally from the offset it
reached last time (persisted, so a restart neither re-reads nor loses lines).
A throughput sample is the rate between two consecutive ``progress`` records
of the same run (same ``restart`` and ``nodes``).  Malformed lines, lines
longer than ``max_line_bytes`` and records with impossible values are
skipped and counted, never raised.
"""
from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from malletrain.core.backend import Observation
from malletrain.domain.model import Sample

log = logging.getLogger("malletrain.progress")

EVENTS = ("start", "progress", "checkpoint", "exit")


@dataclass
class TailState:
    offset: int = 0
    inode: int = 0
    last: tuple | None = None    # (restart, nodes, t, samples) of the last progress record


@dataclass
class TailCounters:
    lines: int = 0
    bad: int = 0
    oversized: int = 0
    samples: int = 0


class ProgressTail:
    def __init__(self, *, max_line_bytes: int = 4096, max_read_bytes: int = 1 << 20) -> None:
        self.max_line_bytes = max_line_bytes
        self.max_read_bytes = max_read_bytes
        self.files: dict[str, TailState] = {}
        self.counters = TailCounters()

    def poll(self, job_id: str, path: str) -> list[Sample]:
        """New samples of ``job_id`` from ``path`` since the last poll."""
        st = self.files.setdefault(path, TailState())
        try:
            with open(path, "rb") as fh:
                info = os.fstat(fh.fileno())
                if info.st_ino != st.inode or info.st_size < st.offset:   # new or truncated file
                    st.offset, st.inode, st.last = 0, info.st_ino, None
                fh.seek(st.offset)
                chunk = fh.read(self.max_read_bytes)
        except FileNotFoundError:
            return []
        except OSError as exc:
            log.warning("cannot read progress file %s: %s", path, exc)
            return []
        end = chunk.rfind(b"\n")
        if end < 0:
            if len(chunk) > self.max_line_bytes:   # one endless line: skip it
                self.counters.oversized += 1
                st.offset += len(chunk)
            return []
        st.offset += end + 1
        out = []
        for raw in chunk[:end].split(b"\n"):
            self.counters.lines += 1
            if len(raw) > self.max_line_bytes:
                self.counters.oversized += 1
                continue
            rec = self._record(raw)
            if rec is None:
                self.counters.bad += 1
                continue
            sample = self._sample(job_id, st, rec)
            if sample is not None:
                out.append(sample)
        self.counters.samples += len(out)
        return out

    @staticmethod
    def _record(raw: bytes) -> dict | None:
        try:
            rec = json.loads(raw)
        except (ValueError, UnicodeDecodeError):
            return None
        if not isinstance(rec, dict) or rec.get("event", "progress") not in EVENTS:
            return None
        try:
            t = float(rec["t"])
            samples = float(rec.get("samples", 0))
            nodes = int(rec.get("nodes", 0))
            restart = int(rec.get("restart", 0))
        except (KeyError, TypeError, ValueError):
            return None
        if not (math.isfinite(t) and math.isfinite(samples)) or samples < 0 or nodes < 0:
            return None
        rec.update(t=t, samples=samples, nodes=nodes, restart=restart)
        return rec

    @staticmethod
    def _sample(job_id: str, st: TailState, rec: dict) -> Sample | None:
        if rec.get("event", "progress") != "progress" or rec["nodes"] < 1:
            if rec.get("event") in ("start", "exit"):
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

    def forget(self, path: str) -> None:
        self.files.pop(path, None)

    # persistence (the daemon's store saves and restores these)
    def dump(self) -> dict:
        return {p: [s.offset, s.inode, list(s.last) if s.last else None] for p, s in self.files.items()}

    def load(self, data: dict) -> None:
        for p, (offset, inode, last) in data.items():
            self.files[p] = TailState(int(offset), int(inode), tuple(last) if last else None)


class ProgressSource:
    """The daemon's metrics source: each observed job's progress file → samples.

    Reads the file the job's tag names (:class:`JobFacts.progress_path`),
    forgets the files of jobs that left, keeps the newest sample per job (for
    ``status``) and hands every new sample and the moved offsets to ``journal``
    (the store), so a restart neither re-reads nor loses anything.
    """

    def __init__(self, tail: ProgressTail, journal: SampleJournal | None = None) -> None:
        self.tail = tail
        self.journal = journal
        self.latest: dict[str, Sample] = {}
        self._paths: dict[str, str] = {}
        self._saved = tail.dump()

    def poll(self, observation: Observation) -> tuple[Sample, ...]:
        for job in observation.finished:
            path = self._paths.pop(job, None)
            if path is not None:
                self.tail.forget(path)
            self.latest.pop(job, None)
        out: list[Sample] = []
        for job, facts in observation.facts.items():
            if facts.progress_path:
                self._paths[job] = facts.progress_path
                out += self.tail.poll(job, facts.progress_path)
        for s in out:
            self.latest[s.job_id] = s
        if self.journal is not None:
            self.journal.add_samples(out)
            offsets = self.tail.dump()
            if offsets != self._saved:     # offsets moved: persist them
                self.journal.put("tails", offsets)
                self._saved = offsets
        return tuple(out)


class SampleJournal(Protocol):
    """Where :class:`ProgressSource` persists samples and file offsets (the store)."""

    def add_samples(self, samples: Iterable[Sample]) -> None: ...

    def put(self, key: str, value: object) -> None: ...
