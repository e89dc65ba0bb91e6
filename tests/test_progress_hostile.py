"""Hostile progress files and records (SECURITY.md): the daemon opens a file only as its
job's owner could, bounds every number, and one job's garbage never reaches the JPA or
stops the others.  Runs as any user (no root, Slurm or torch)."""
from __future__ import annotations

import json
import os
import time

import pytest

from malletrain.core.backend import JobFacts, Observation
from malletrain.daemon.files import Refused, open_as_owner
from malletrain.daemon.progress import ProgressSource, ProgressTail
from malletrain.domain.model import Snapshot

ME = os.getuid()
OTHER = ME + 4242            # a uid that owns nothing here



def rec(t, samples, nodes=2, **kw):
    return json.dumps(dict(t=t, samples=samples, nodes=nodes, event="progress", restart=0, **kw)) + "\n"


def good_lines(t0=100.0, n=4):
    return "".join(rec(t0 + i, 200.0 * i) for i in range(n))


def write(path, text, mode=0o644):
    with open(path, "w") as fh:
        fh.write(text)
    os.chmod(path, mode)


def test_the_owners_own_file_is_read(shared_dir):
    p = os.path.join(shared_dir, "7.jsonl")
    write(p, good_lines())
    got = ProgressTail(roots=("/tmp",)).poll("7", p, uid=ME, max_nodes=4)
    assert [s.samples_per_s for s in got] == [200.0, 200.0, 200.0]


@pytest.mark.parametrize("case", ["symlink", "symlinked-dir", "fifo", "outside-roots", "foreign",
                                  "unsearchable-dir", "nul", "relative", "dotdot", "directory"])
def test_files_the_owner_could_not_read_are_refused(shared_dir, case):
    target = os.path.join(shared_dir, "secret.jsonl")
    write(target, good_lines(), 0o600)
    p, uid, roots = os.path.join(shared_dir, "7.jsonl"), ME, ("/tmp",)
    if case == "symlink":
        os.symlink(target, p)
    elif case == "symlinked-dir":
        os.symlink(shared_dir, shared_dir + "-link")
        p = shared_dir + "-link/secret.jsonl"
    elif case == "fifo":
        os.mkfifo(p)                       # would block a plain open() for ever
    elif case == "outside-roots":
        p, roots = target, ("/home",)
    elif case == "foreign":
        p, uid = target, OTHER             # someone else's file
    elif case == "unsearchable-dir":
        os.chmod(shared_dir, 0o700)
        p, uid = target, OTHER
    elif case == "nul":
        p = target + "\0x"
    elif case == "relative":
        p = os.path.relpath(target)
    elif case == "dotdot":
        p = os.path.join(shared_dir, "..", os.path.basename(shared_dir), "secret.jsonl")
    elif case == "directory":
        p = shared_dir
    t0 = time.monotonic()
    with pytest.raises(Refused):
        os.close(open_as_owner(p, uid, roots))
    tail = ProgressTail(roots=roots)
    assert tail.poll("7", p, uid=uid) == [] and tail.counters.refused == 1
    assert tail.counters.by_job["7"] == 1
    assert time.monotonic() - t0 < 5
    if case == "symlinked-dir":
        os.unlink(shared_dir + "-link")


HOSTILE = {
    "nested": "[" * 100_000 + "]" * 100_000,
    "nested-object": '{"t":' * 50_000 + "1" + "}" * 50_000,
    "inf": '{"t": 1e999, "samples": 1, "nodes": 2}',
    "nan": '{"t": NaN, "samples": 1, "nodes": 2}',
    "big-int": '{"t": 100, "samples": ' + "9" * 400 + ', "nodes": 2}',
    "huge-nodes": '{"t": 105, "samples": 2000, "nodes": 1000000}',
    "nodes-string": '{"t": 105, "samples": 2000, "nodes": "2"}',
    "nodes-float": '{"t": 105, "samples": 2000, "nodes": 2.5}',
    "negative": '{"t": 105, "samples": -5, "nodes": 2}',
    "bool": '{"t": true, "samples": 1, "nodes": 2}',
    "not-object": '[1, 2, 3]',
    "nul": '{"t": 105\u0000, "samples": 1}',
    "non-utf8": b'{"t": 105, "samples": "\xff\xfe"}'.decode("latin-1"),
    "bad-event": '{"t": 105, "samples": 1, "nodes": 2, "event": "rm -rf"}',
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_records_are_skipped_and_counted_for_that_job(shared_dir, name):
    p = os.path.join(shared_dir, "7.jsonl")
    with open(p, "wb") as fh:
        fh.write(good_lines(100.0, 2).encode())
        fh.write(HOSTILE[name].encode("latin-1") + b"\n")
        fh.write(good_lines(102.0, 2).encode().replace(b'"t": 102.0', b'"t": 102.5'))
    tail = ProgressTail(max_line_bytes=1 << 20, roots=("/tmp",))
    got = tail.poll("7", p, uid=ME, max_nodes=4)
    assert all(s.nodes <= 4 and 0 < s.samples_per_s < 1e9 for s in got)
    assert tail.counters.by_job["7"] >= 1


def test_implausible_rates_never_reach_the_jpa(shared_dir):
    p = os.path.join(shared_dir, "7.jsonl")
    write(p, rec(100, 0) + rec(100 + 1e-300, 1e18) + rec(200, 1e18) + rec(3e10, 1e18 + 1e-300)
          + rec(300, 1e18))
    tail = ProgressTail(roots=("/tmp",), max_samples_per_s=1e6)
    got = tail.poll("7", p, uid=ME)
    assert all(1e-9 <= s.samples_per_s <= 1e6 for s in got)


def test_records_per_cycle_are_capped_and_the_rest_waits(shared_dir):
    p = os.path.join(shared_dir, "7.jsonl")
    write(p, "".join(rec(100 + i, 10.0 * i) for i in range(10_000)))
    tail = ProgressTail(roots=("/tmp",), max_records=1000, max_read_bytes=1 << 22)
    first = tail.poll("7", p, uid=ME)
    assert len(first) == 999 and tail.counters.lines == 1000
    polls = 1
    while tail.poll("7", p, uid=ME):
        polls += 1
    assert tail.counters.lines == 10_000 and polls == 10


def test_one_jobs_broken_file_does_not_stop_the_others(shared_dir, monkeypatch):
    good, bad = os.path.join(shared_dir, "1.jsonl"), os.path.join(shared_dir, "2.jsonl")
    write(good, good_lines())
    write(bad, good_lines())
    tail = ProgressTail(roots=("/tmp",))
    real = tail.read

    def explode(job, path, **kw):
        if job == "2":
            raise RuntimeError("a bug this input found")
        return real(job, path, **kw)

    monkeypatch.setattr(tail, "read", explode)
    src = ProgressSource(tail)
    obs = Observation(Snapshot(0.0, (), ()), (), {
        "2": JobFacts("p", "mallory", bad, uid=ME), "1": JobFacts("p", "alice", good, uid=ME),
        "3": JobFacts("p", "nobody-known", good, uid=None)})
    got = src.poll(obs)
    assert {s.job_id for s in got} == {"1"} and tail.counters.by_job["2"] == 1
    assert tail.counters.by_job["3"] == 1        # owner unknown: not read at all


def _final_line(job, reason="done"):
    return json.dumps(dict(t=200.0, job=job, event="exit", reason=reason, restart=0)) + "\n"


def test_a_final_record_counts_only_for_its_own_job_and_file(shared_dir):
    """A copied or renamed file ending 'done' (another job's, an old one) never marks this job
    finished; replacing the file forgets what the old one said."""
    p = os.path.join(shared_dir, "7.jsonl")
    tail = ProgressTail(roots=("/tmp",))
    write(p, good_lines() + _final_line("6"))            # someone else's final record
    tail.poll("7", p, uid=ME)
    assert not tail.files[p].done
    write(p + ".new", good_lines() + _final_line("7"))
    os.replace(p + ".new", p)
    tail.poll("7", p, uid=ME)
    assert tail.files[p].done
    write(p + ".new", good_lines())                       # replaced again: no final record now
    os.replace(p + ".new", p)
    tail.poll("7", p, uid=ME)
    assert not tail.files[p].done


def test_reading_is_bounded_per_cycle_running_jobs_first_the_rest_take_turns(shared_dir):
    line = rec(100.0, 1.0)
    paths = {}
    for j in ("1", "2", "3", "4"):
        paths[j] = os.path.join(shared_dir, f"{j}.jsonl")
        write(paths[j], good_lines() + line * 5000)      # ~0.4 MB each
    size = os.path.getsize(paths["1"])
    src = ProgressSource(ProgressTail(roots=("/tmp",), max_records=100_000), max_bytes_per_cycle=size + 10)
    facts = {"1": JobFacts("p", "u", paths["1"], uid=ME, state="PENDING"),
             "2": JobFacts("p", "u", paths["2"], uid=ME, state="PENDING"),
             "3": JobFacts("p", "u", paths["3"], uid=ME, state="RUNNING"),
             "4": JobFacts("p", "u", paths["4"], uid=ME, state="PENDING")}
    obs = Observation(Snapshot(0.0, (), ()), (), facts)
    read = []
    for _ in range(4):
        src.poll(obs)
        read.append({j for j in facts if paths[j] in src.tail.files and src.tail.files[paths[j]].offset > 0})
    assert read[0] == {"3"}                                # the running job first
    assert read[-1] == {"1", "2", "3", "4"}                # the others took turns


def test_an_ended_job_is_judged_only_once_its_file_is_read_to_the_end(shared_dir):
    p = os.path.join(shared_dir, "7.jsonl")
    write(p, good_lines() + rec(150.0, 1.0) * 20000 + _final_line("7"))
    src = ProgressSource(ProgressTail(roots=("/tmp",), max_records=100_000), max_bytes_per_cycle=200_000)
    ended = Observation(Snapshot(0.0, (), ()), (), {}, None, {"7": JobFacts("p", "u", p, uid=ME, state="COMPLETED")})
    cycles = 0
    while "7" not in src.final:
        src.poll(ended)
        cycles += 1
        assert cycles < 50
    assert cycles > 1 and src.final["7"] is True           # never judged from a partial read
