"""User-path I/O with a deadline (issue #22, "no deadline on user paths"): opening or reading a
progress file on a hung NFS, FUSE or autofs mount must not block the daemon's loop.  A read
that does not answer in time is abandoned in its worker thread, its path is not tried again
while it hangs, and stuck threads are bounded (per owner and in all).

The hang is real: the opener seam opens a FIFO without O_NONBLOCK, which blocks in the kernel
until a writer comes (the test lets one come at the end).  No timed assertions: a read's
deadline is tiny, and a guard of many seconds only tells "returned" from "blocked for good".
Runs as any user (no root, Slurm or torch)."""
from __future__ import annotations

import json
import os
import threading

import pytest

import malletrain.daemon.progress as progress
from malletrain.core.backend import JobFacts, Observation
from malletrain.daemon.files import Hanging, PathWorkers, TimedOut, open_as_owner
from malletrain.daemon.progress import ProgressSource, ProgressTail, ReadStatus
from malletrain.domain.model import Snapshot

ME = os.getuid()
GUARD_S = 30.0          # "returned at all" (a blocked loop never does), not a speed bound



class Hung:
    """An opener for which paths ending in ``hang.jsonl`` block in the kernel (a FIFO opened
    for reading, no writer), as an open on a hung mount does; other paths open as usual."""

    def __init__(self, d):
        self.fifo = os.path.join(d, "fifo")
        os.mkfifo(self.fifo)
        self.calls: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, path, uid, roots):
        with self.lock:
            self.calls.append(path)
        if path.endswith("hang.jsonl"):
            fd = os.open(self.fifo, os.O_RDONLY)     # blocks until release()
            os.close(fd)
            raise OSError(5, "Input/output error")
        return open_as_owner(path, uid, roots)

    def hung(self):
        return [p for p in self.calls if p.endswith("hang.jsonl")]

    def release(self):
        fd = os.open(self.fifo, os.O_RDWR | os.O_NONBLOCK)   # a writer: every blocked open returns
        os.close(fd)


def honest(path, t0=100.0, n=5):
    with open(path, "a") as fh:
        for i in range(n):
            fh.write(json.dumps(dict(t=t0 + i, samples=100.0 * i, nodes=2, event="progress")) + "\n")


def in_thread(fn):
    """Run ``fn`` in a thread; whether it returned within GUARD_S, and its result."""
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("r", fn()), daemon=True)
    t.start()
    t.join(GUARD_S)
    return not t.is_alive(), box.get("r")


def source(d, monkeypatch, hung, *, workers=None, timeout_s=0.05):
    monkeypatch.setattr(progress, "open_as_owner", hung)
    tail = ProgressTail(roots=("/tmp",), io=workers or PathWorkers(), read_timeout_s=timeout_s)
    return ProgressSource(tail, max_bytes_per_cycle=1 << 24, cycle_timeout_s=60.0)


def test_a_hung_progress_path_does_not_block_the_cycle(shared_dir, monkeypatch):
    hung = Hung(shared_dir)
    try:
        good = os.path.join(shared_dir, "1.jsonl")
        honest(good)
        bad = os.path.join(shared_dir, "2-hang.jsonl")
        src = source(shared_dir, monkeypatch, hung)
        facts = {"2": JobFacts("p", "mallory", bad, uid=ME + 1, state="RUNNING"),
                 "1": JobFacts("p", "alice", good, uid=ME, state="RUNNING")}
        ok, got = in_thread(lambda: src.poll(Observation(Snapshot(0.0, (), ()), (), facts)))
        assert ok, "a hung progress path blocked the cycle"
        assert {s.job_id for s in got} == {"1"}          # the other user's job was read
        assert src.tail.counters.timed_out == 1 and src.tail.counters.by_job["2"] == 1
        for _ in range(3):                               # not tried again while it hangs
            ok, _ = in_thread(lambda: src.poll(Observation(Snapshot(0.0, (), ()), (), facts)))
            assert ok
        assert len(hung.hung()) == 1 and src.tail.counters.hanging == 3
        assert src.tail.io is not None and src.tail.io.stuck == 1
    finally:
        hung.release()


def test_an_ended_job_whose_file_hangs_gets_no_verdict(shared_dir, monkeypatch):
    hung = Hung(shared_dir)
    try:
        bad = os.path.join(shared_dir, "7-hang.jsonl")
        src = source(shared_dir, monkeypatch, hung)
        ended = {"7": JobFacts("p", "alice", bad, uid=ME, state="FAILED")}
        for _ in range(2):
            ok, _ = in_thread(lambda: src.poll(Observation(Snapshot(0.0, (), ()), (), {}, None, ended)))
            assert ok and "7" not in src.final            # never judged "ended without a result"
    finally:
        hung.release()


def test_stuck_workers_are_bounded_per_owner_and_in_all(shared_dir, monkeypatch):
    hung = Hung(shared_dir)
    workers = PathWorkers(max_stuck=3, max_stuck_per_owner=2)
    threads_before = threading.active_count()
    try:
        src = source(shared_dir, monkeypatch, hung, workers=workers)
        facts = {str(j): JobFacts("p", f"user{j % 3}", os.path.join(shared_dir, f"{j}-hang.jsonl"),
                                  uid=ME + j % 3, state="RUNNING") for j in range(30)}
        for _ in range(5):
            ok, _ = in_thread(lambda: src.poll(Observation(Snapshot(0.0, (), ()), (), facts)))
            assert ok
        assert len(hung.hung()) == 3 and workers.stuck == 3       # 30 hanging paths, 3 threads
        owners = {int(p.rsplit("/", 1)[1].split("-")[0]) % 3 for p in hung.hung()}
        assert len(owners) >= 2                                   # no owner took them all
        assert threading.active_count() - threads_before <= 3 + 1
    finally:
        hung.release()


def test_the_worker_pool_contract():
    """Results and exceptions pass through; a call past its deadline raises TimedOut, its path
    is not tried again while it hangs (nor for retry_after_s after), and once it returns and
    the back-off is over the path is tried again."""
    now = [0.0]
    w = PathWorkers(retry_after_s=10.0, clock=lambda: now[0])
    assert w.call("/a", 1, lambda: 42, 5.0) == 42
    with pytest.raises(FileNotFoundError):
        w.call("/a", 1, lambda: os.stat("/nonexistent/x"), 5.0)
    gate, entered = threading.Event(), threading.Event()

    def blocked():
        entered.set()
        gate.wait()
        return "late"
    with pytest.raises(TimedOut):
        w.call("/slow", 1, blocked, 0.01)
    with pytest.raises(Hanging):
        w.call("/slow", 1, lambda: "again", 5.0)
    assert w.call("/other", 1, lambda: "fine", 5.0) == "fine"   # a fresh worker
    entered.wait(GUARD_S)
    gate.set()
    for _ in range(1000):                      # the stuck call returns and its thread ends
        if w.stuck == 0:
            break
        threading.Event().wait(0.01)
    assert w.stuck == 0
    with pytest.raises(Hanging):               # the back-off still holds
        w.call("/slow", 1, lambda: "again", 5.0)
    now[0] = 11.0
    assert w.call("/slow", 1, lambda: "again", 5.0) == "again"
    assert w.timed_out == 1 and w.not_started == 2


def test_the_tail_reports_a_timed_out_read(shared_dir, monkeypatch):
    hung = Hung(shared_dir)
    try:
        monkeypatch.setattr(progress, "open_as_owner", hung)
        tail = ProgressTail(roots=("/tmp",), io=PathWorkers(), read_timeout_s=0.01)
        p = os.path.join(shared_dir, "3-hang.jsonl")
        ok, r = in_thread(lambda: tail.read("3", p, uid=ME))
        assert ok and r.status is ReadStatus.TIMED_OUT
        ok, r = in_thread(lambda: tail.read("3", p, uid=ME))
        assert ok and r.status is ReadStatus.HANGING
    finally:
        hung.release()
