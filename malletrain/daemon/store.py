"""The daemon's state on local disk: one sqlite file.

Tables: ``books`` (per-job memory the backend writes ahead of every Slurm
step), ``samples`` (JPA input, so a restart keeps what was learned),
``actions`` (every applied change with its reason, for ``explain``) and
``kv`` (progress-file offsets, counters, learned pauses, since when jobs are set aside).  Every write is its own
transaction (WAL mode), so ``kill -9`` at any point leaves a consistent file.
Any sqlite or OS error (a full disk, a broken file) raises
:class:`StateError`; the daemon then applies nothing until writes work again.
The file is the daemon's alone (mode 0600).  Nothing in it grows for ever: samples are kept
per job up to ``samples_kept`` (the oldest age out) and leave with their job; actions are kept
per job up to ``ACTIONS_PER_JOB``, for ``ACTIONS_KEPT_S`` and ``MAX_ACTIONS`` in all (the
oldest go first; ``explain`` shows the newest few).
"""
from __future__ import annotations

import functools
import json
import os
import sqlite3
from collections.abc import Callable, Iterable
from dataclasses import asdict
from typing import Any, TypeVar

from malletrain.daemon.status import Change
from malletrain.domain.errors import StateError
from malletrain.domain.model import Action, Sample
from malletrain.slurm.adapter import Book

SCHEMA = """
CREATE TABLE IF NOT EXISTS books (job TEXT PRIMARY KEY, data TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS samples (job TEXT, nodes INTEGER, rate REAL, t REAL);
CREATE TABLE IF NOT EXISTS actions (t REAL, cycle INTEGER, job TEXT, kind TEXT,
                                    from_nodes TEXT, to_nodes TEXT, reason TEXT, code TEXT);
CREATE TABLE IF NOT EXISTS kv (key TEXT PRIMARY KEY, data TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS samples_job ON samples(job);
CREATE INDEX IF NOT EXISTS actions_job ON actions(job);
CREATE INDEX IF NOT EXISTS actions_t ON actions(t);
"""

ACTIONS_PER_JOB = 200                 # the newest actions kept per job
ACTIONS_KEPT_S = 30 * 86400.0         # actions older than this go
MAX_ACTIONS = 500_000                 # actions kept in all
PRUNE_EVERY_S = 3600.0                # how often the age and total bounds are applied


F = TypeVar("F", bound=Callable[..., Any])


def _guarded(fn: F) -> F:
    @functools.wraps(fn)
    def wrapper(self: Store, *args: Any, **kw: Any) -> Any:
        try:
            return fn(self, *args, **kw)
        except (sqlite3.Error, OSError, ValueError, TypeError) as exc:
            raise StateError(f"state store {self.path}: {exc}") from None
    return wrapper  # type: ignore[return-value]


class Store:
    def __init__(self, path: str, *, samples_kept: int = 2000) -> None:
        self.path = path
        self.samples_kept = samples_kept
        self._pruned_at: float | None = None     # daemon clock of the last age/total prune of actions
        self._open()

    @_guarded
    def _open(self) -> None:
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), mode=0o750, exist_ok=True)
        old = os.umask(0o077)
        try:
            self.db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            self.db.execute("PRAGMA journal_mode=WAL")
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.db.executescript(SCHEMA)
        cols = {row[1] for row in self.db.execute("PRAGMA table_info(actions)")}
        if "code" not in cols:     # a state.db from before reason codes
            self.db.execute("ALTER TABLE actions ADD COLUMN code TEXT")

    def close(self) -> None:
        self.db.close()

    # books
    @_guarded
    def save_book(self, job: str, book: Book | None) -> None:
        if book is None:
            self.db.execute("DELETE FROM books WHERE job=?", (job,))
        else:
            d = asdict(book)
            self.db.execute("INSERT OR REPLACE INTO books VALUES (?, ?)", (job, json.dumps(d)))

    @_guarded
    def books(self) -> dict[str, Book]:
        out = {}
        for job, data in self.db.execute("SELECT job, data FROM books"):
            d = json.loads(data)
            d["launching"] = tuple(d["launching"])
            d["running"] = tuple(d["running"])
            d["members"] = tuple(d.get("members", ()))
            out[job] = Book(**d)
        return out

    # samples
    @_guarded
    def add_samples(self, samples: Iterable[Sample]) -> None:
        rows = [(s.job_id, s.nodes, s.samples_per_s, s.t_s) for s in samples]
        if rows:
            with self.db:
                self.db.executemany("INSERT INTO samples VALUES (?, ?, ?, ?)", rows)
                for job in {r[0] for r in rows}:    # age out: keep the newest samples_kept per job
                    self.db.execute("DELETE FROM samples WHERE rowid IN (SELECT rowid FROM samples "
                                    "WHERE job=? ORDER BY t DESC LIMIT -1 OFFSET ?)", (job, self.samples_kept))

    @_guarded
    def forget_samples(self, jobs: Iterable[str]) -> None:
        with self.db:
            self.db.executemany("DELETE FROM samples WHERE job=?", [(j,) for j in jobs])

    @_guarded
    def sample_jobs(self) -> set[str]:
        """The jobs that have samples stored."""
        return {job for (job,) in self.db.execute("SELECT DISTINCT job FROM samples")}

    @_guarded
    def samples(self) -> list[Sample]:
        return [Sample(j, n, r, t) for j, n, r, t in
                self.db.execute("SELECT job, nodes, rate, t FROM samples ORDER BY job, t")]

    # actions
    @_guarded
    def add_actions(self, t: float, cycle: int, actions: Iterable[Action]) -> None:
        rows = [(t, cycle, a.job_id, a.kind.value, ",".join(a.from_nodes), ",".join(a.to_nodes),
                 a.reason, a.code.value) for a in actions]
        if rows:
            with self.db:
                self.db.executemany("INSERT INTO actions (t, cycle, job, kind, from_nodes, to_nodes, "
                                    "reason, code) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
                for job in {r[2] for r in rows}:     # a job's newest ACTIONS_PER_JOB stay
                    self.db.execute("DELETE FROM actions WHERE rowid IN (SELECT rowid FROM actions WHERE job=? "
                                    "ORDER BY t DESC, rowid DESC LIMIT -1 OFFSET ?)", (job, ACTIONS_PER_JOB))
                if self._pruned_at is None or not 0 <= t - self._pruned_at < PRUNE_EVERY_S:
                    self._pruned_at = t
                    self.db.execute("DELETE FROM actions WHERE t < ?", (t - ACTIONS_KEPT_S,))
                    self.db.execute("DELETE FROM actions WHERE rowid IN (SELECT rowid FROM actions "
                                    "ORDER BY t DESC, rowid DESC LIMIT -1 OFFSET ?)", (MAX_ACTIONS,))

    @_guarded
    def history(self, job: str, limit: int = 10) -> list[Change]:
        rows = self.db.execute("SELECT t, cycle, kind, from_nodes, to_nodes, reason, code FROM actions "
                               "WHERE job=? ORDER BY t DESC LIMIT ?", (job, limit)).fetchall()
        return [Change(t, c, k, f, to, r, code or "") for t, c, k, f, to, r, code in reversed(rows)]

    # key/value
    @_guarded
    def put(self, key: str, value) -> None:
        self.db.execute("INSERT OR REPLACE INTO kv VALUES (?, ?)", (key, json.dumps(value)))

    @_guarded
    def get(self, key: str, default=None):
        row = self.db.execute("SELECT data FROM kv WHERE key=?", (key,)).fetchone()
        return json.loads(row[0]) if row else default


def peek(path: str, key: str, default=None):
    """One key/value entry of a store, read without writing (``malletrain advise``); a store that
    cannot be opened or read is an :class:`InputError` naming it."""
    import sqlite3

    from malletrain.domain.errors import InputError
    if not os.path.exists(path):
        raise InputError("no daemon state here", path=path)
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
        try:
            row = db.execute("SELECT data FROM kv WHERE key=?", (key,)).fetchone()
        finally:
            db.close()
        return json.loads(row[0]) if row else default
    except (sqlite3.Error, ValueError, OSError) as exc:
        raise InputError(f"cannot read the daemon's state: {exc}", path=path) from None
