"""The per-cycle read budget (issue #22, "read budget starvation"): one job's huge progress file
(a sparse file, a file of empty lines) cannot spend what other users' jobs need.  Running jobs
are read first, each ended job has its own cap, the budget is charged what was consumed, an
ended job is judged only from a read that reached the end of its file, and a cancelled job's
file is not read at all.  Runs as any user (no root, Slurm or torch)."""
from __future__ import annotations

import json
import os

from malletrain.core.backend import JobFacts, Observation
from malletrain.daemon.progress import ProgressSource, ProgressTail
from malletrain.domain.model import Snapshot

ME = os.getuid()
MiB = 1 << 20



def rec(t, samples, nodes=2, **kw):
    return json.dumps(dict(t=t, samples=samples, nodes=nodes, event="progress", restart=0, **kw)) + "\n"


def honest(path, t0=100.0, n=6, final_job=None):
    with open(path, "a") as fh:
        fh.write("".join(rec(t0 + i, 200.0 * i) for i in range(n)))
        if final_job:
            fh.write(json.dumps(dict(t=t0 + n, job=final_job, event="exit", reason="done", restart=0)) + "\n")
    os.chmod(path, 0o644)


def sparse(path, size=1 << 34):
    """A 16 GiB file of zeros that takes no disk space: one endless line."""
    with open(path, "wb") as fh:
        fh.truncate(size)
    os.chmod(path, 0o644)


def newlines(path, size=8 * MiB):
    with open(path, "wb") as fh:
        fh.write(b"\n" * size)
    os.chmod(path, 0o644)


def obs(facts=None, ended=None, now=0.0):
    return Observation(Snapshot(now, (), ()), (), facts or {}, None, ended or {})


def test_a_huge_ended_file_does_not_starve_running_jobs(shared_dir):
    """An ended job's sparse file used to be read first, up to 64 MiB a cycle: the whole budget,
    so another user's running job got no reads and was eventually taken for hung."""
    huge, good = os.path.join(shared_dir, "1.jsonl"), os.path.join(shared_dir, "2.jsonl")
    sparse(huge)
    honest(good)
    src = ProgressSource(ProgressTail(roots=("/tmp",)), max_bytes_per_cycle=4 * MiB)
    o = obs(facts={"2": JobFacts("p", "alice", good, uid=ME, state="RUNNING")},
            ended={"1": JobFacts("p", "mallory", huge, uid=ME, state="FAILED")})
    for cycle in range(3):
        got = src.poll(o)
        if cycle == 0:
            assert {s.job_id for s in got} == {"2"} and src.last_progress["2"] == 0.0
        assert "1" not in src.final                 # never read to its end: never judged


def test_an_ended_job_is_never_judged_from_a_file_that_was_not_read(shared_dir):
    """Another ended job's file, skipped because the budget was spent, used to be judged 'ended
    without a final result' (requeued although it had finished), also when an earlier read had
    seen the end of the file."""
    huge, good = os.path.join(shared_dir, "1.jsonl"), os.path.join(shared_dir, "2.jsonl")
    newlines(huge)
    honest(good)
    src = ProgressSource(ProgressTail(roots=("/tmp",)), max_bytes_per_cycle=4 * MiB)
    src.poll(obs(facts={"2": JobFacts("p", "alice", good, uid=ME, state="RUNNING")}))
    assert src.tail.files[good].eof                 # seen to its end while it ran
    honest(good, t0=200.0, final_job="2")            # then its last records and the final one
    o = obs(ended={"1": JobFacts("p", "mallory", huge, uid=ME, state="FAILED"),
                   "2": JobFacts("p", "alice", good, uid=ME, state="COMPLETED")})
    for _ in range(3):
        src.poll(o)
        assert src.final.get("2", True) is True     # no verdict, or the right one
    assert src.final["2"] is True


def test_the_budget_is_charged_what_was_consumed(shared_dir):
    """A file of empty lines gives max_records lines a read; it used to be charged the whole
    chunk read (1 MiB for 1,000 bytes), so two such running jobs spent a 2 MiB budget and a third
    user's running job was not read."""
    paths = {j: os.path.join(shared_dir, f"{j}.jsonl") for j in ("1", "2", "3")}
    newlines(paths["1"])
    newlines(paths["2"])
    honest(paths["3"])
    tail = ProgressTail(roots=("/tmp",))
    src = ProgressSource(tail, max_bytes_per_cycle=2 * MiB + 100)
    facts = {j: JobFacts("p", "u", paths[j], uid=ME, state="RUNNING") for j in ("1", "2", "3")}
    for _ in range(3):                               # whoever reads first: every job is read
        src.poll(obs(facts=facts))
        assert "3" in src.latest
    assert tail.files[paths["1"]].offset == tail.files[paths["2"]].offset == 3 * 1000


def test_a_cancelled_jobs_file_is_not_read(shared_dir):
    p = os.path.join(shared_dir, "7.jsonl")
    honest(p, final_job="7")
    tail = ProgressTail(roots=("/tmp",))
    src = ProgressSource(tail, max_bytes_per_cycle=4 * MiB)
    src.poll(obs(ended={"7": JobFacts("p", "alice", p, uid=ME, state="CANCELLED")}))
    assert tail.counters.lines == 0 and p not in tail.files
    assert src.final["7"] is None                   # nothing read: the safety net leaves it


def test_an_ended_huge_file_has_its_own_cap_and_waits(shared_dir):
    """One ended job reads at most its own cap a cycle, however much budget is left, and a file
    that never ends (sparse, 16 GiB) is never judged; the honest ended job beside it is."""
    huge, good = os.path.join(shared_dir, "1.jsonl"), os.path.join(shared_dir, "2.jsonl")
    sparse(huge)
    honest(good, final_job="2")
    tail = ProgressTail(roots=("/tmp",))
    src = ProgressSource(tail, max_bytes_per_cycle=64 * MiB)
    o = obs(ended={"1": JobFacts("p", "mallory", huge, uid=ME, state="FAILED"),
                   "2": JobFacts("p", "alice", good, uid=ME, state="COMPLETED")})
    src.poll(o)
    assert src.final == {"2": True}
    assert tail.files[huge].offset <= 16 * MiB


def test_a_pending_jobs_file_rests_after_two_reads_that_found_nothing_until_it_runs_again(shared_dir):
    """A queue of thousands of held jobs cost a file access each, every cycle (0.24 s a cycle at
    20,000 queued jobs, 2,000 of them malleable).  A pending job's processes are gone (Slurm lists
    a job pending only after they ended), so once two reads found nothing new its file rests until
    the job runs; a completing job's file (its exit record may still come) is read every cycle."""
    held, completing = os.path.join(shared_dir, "1.jsonl"), os.path.join(shared_dir, "2.jsonl")
    never = os.path.join(shared_dir, "3.jsonl")        # held since submit: no file yet
    honest(held)
    honest(completing)
    src = ProgressSource(ProgressTail(roots=("/tmp",)))
    reads: list[str] = []
    real = src.tail.read

    def counting(job_id, path, **kw):
        reads.append(job_id)
        return real(job_id, path, **kw)
    src.tail.read = counting

    def cycle(state1="PENDING", held1=True):
        reads.clear()
        got = src.poll(obs(facts={"1": JobFacts("p", "alice", held, uid=ME, state=state1, held=held1),
                                  "2": JobFacts("p", "bob", completing, uid=ME, state="COMPLETING"),
                                  "3": JobFacts("p", "carol", never, uid=ME, state="PENDING", held=True)}))
        return sorted(set(reads)), got

    assert cycle()[0] == ["1", "2", "3"]      # 1 gave records; 3 has no file: nothing new, 1 of 2
    assert cycle()[0] == ["1", "2", "3"]      # 1: nothing new, 1 of 2; 3: 2 of 2
    assert cycle()[0] == ["1", "2"]           # 3 rests
    assert cycle()[0] == ["2"]                # 1 rests too; the completing job is still read
    with open(held, "a") as fh:
        fh.write(rec(200.0, 5000.0))
    assert cycle()[0] == ["2"] and src.tail.files[held].offset < os.path.getsize(held)
    src.wake("1")                             # the daemon released it: read again at once
    seen, _ = cycle("PENDING", held1=False)   # launching (pending, not held): read every cycle
    assert "1" in seen and src.tail.files[held].offset == os.path.getsize(held)
    for _ in range(3):
        assert "1" in cycle("PENDING", held1=False)[0]
    assert "1" in cycle("RUNNING", held1=False)[0]
