import random

import pytest

from malletrain.core.placement import place
from malletrain.domain.model import JobSpec, JobState, Node


def nodes(n, groups=2, windows=None):
    return [Node(f"n{i:02d}", group=f"g{i % groups}",
                 window_end_s=None if windows is None else windows[i]) for i in range(n)]


def job(jid, held=(), lo=1, hi=64):
    return JobState(JobSpec(jid, lo, hi), tuple(held), "gpu" if held else None)


def test_shrink_releases_shortest_windows_first():
    pool = nodes(6, windows=[100, 500, 50, 900, None, 10])
    j = job("a", [n.name for n in pool])
    got = place(pool, [j], {"a": ("gpu", 3)})["a"]
    # kept: unknown window (counts as long), 900, 500
    assert set(got) == {"n04", "n03", "n01"}


def test_grow_keeps_nodes_and_prefers_own_group_then_long_windows():
    pool = nodes(8, groups=2, windows=[100, 100, 200, 900, 300, 800, 400, 700])
    j = job("a", ["n00"])                                    # group g0
    got = place(pool, [j], {"a": ("gpu", 3)})["a"]
    assert got[0] == "n00"
    assert set(got[1:]) == {"n06", "n04"}                   # g0, longest windows


def test_start_takes_a_whole_group_when_one_fits():
    pool = nodes(8, groups=2)
    got = place(pool, [job("a")], {"a": ("gpu", 4)})["a"]
    assert len({p[-1] for p in got}) and len({int(n[1:]) % 2 for n in got}) == 1


def test_not_enough_nodes_is_an_error():
    with pytest.raises(ValueError):
        place(nodes(2), [job("a")], {"a": ("gpu", 3)})


def test_random_invariants():
    rng = random.Random(42)
    for _ in range(300):
        pool = nodes(rng.randint(0, 30), groups=rng.randint(1, 4),
                     windows=None if rng.random() < 0.3 else None)
        names = [n.name for n in pool]
        rng.shuffle(names)
        jobs, targets, budget = [], {}, len(pool)
        for i in range(rng.randint(1, 6)):
            held = [names.pop() for _ in range(min(len(names), rng.randint(0, 4)))]
            hi = max(1, len(held) + rng.randint(0, 5))
            jobs.append(job(f"j{i}", held, 1, hi))
        for j in jobs:
            want = rng.randint(0, j.spec.max_nodes)
            want = min(want, budget)
            targets[j.job_id] = ("gpu", want)
            budget -= want
        out = place(pool, jobs, targets)
        assigned = [n for ns in out.values() for n in ns]
        assert len(assigned) == len(set(assigned))                     # never twice
        assert set(assigned) <= {n.name for n in pool}                 # never outside the pool
        assert len(assigned) <= len(pool)                              # never more than idle
        for j in jobs:
            got = out[j.job_id]
            assert len(got) == targets[j.job_id][1]
            assert len(got) <= j.spec.max_nodes                        # never above max
            assert set(j.nodes) <= set(got) or set(got) <= set(j.nodes)  # never migrate
