"""The elastic group's agreement (runtime/membership.py) over a dictionary store: no torch.

The store answers as c10d's FileStore does (checked in tests/test_elastic.py against the real
one): ``compare_set`` sets when the key is missing and ``expected`` is empty or when the value
equals ``expected``, and returns the value the key holds afterwards.
"""
import json
import os

import pytest

from malletrain.runtime import membership as ms
from malletrain.runtime.membership import MembershipError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class DictStore:
    def __init__(self):
        self.d = {}

    def set(self, key, value):
        self.d[key] = value.encode() if isinstance(value, str) else value

    def get(self, key):
        return self.d[key]

    def check(self, keys):
        return all(k in self.d for k in keys)

    def add(self, key, amount):
        self.d[key] = str(int(self.d.get(key, b"0")) + amount).encode()
        return int(self.d[key])

    def compare_set(self, key, expected, desired):
        cur = self.d.get(key)
        if (cur is None and expected == "") or (cur is not None and cur.decode() == expected):
            self.d[key] = desired.encode()
        return self.d.get(key, expected.encode())


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def watch(clock, pulses):
    """A Watch over in-memory pulse counters (member -> counter)."""
    return ms.Watch("unused", clock=clock, read=lambda _d, m: pulses.get(m))


def test_the_first_member_founds_a_generation_and_a_second_founder_loses():
    store, clock = DictStore(), Clock()
    e = ms.enter(store, 3, watch(clock, {}), dead_s=1, wait_s=5)
    assert (e.gen, e.round, e.members, e.founder) == (1, 0, (3,), True)
    assert json.loads(store.get("g1/members")) == [3]
    assert len(store.get("g1/secret")) == 64
    assert ms.claim(store, 4, 0, "") is None       # generation 0 is gone: the stale claim loses
    assert ms.current_gen(store)[0] == 1


def test_a_joiner_is_admitted_at_a_boundary_with_the_groups_count_of_answered_requests():
    store, clock = DictStore(), Clock()
    pulses = {0: 1}
    ms.enter(store, 0, watch(clock, pulses), dead_s=1, wait_s=5)
    assert ms.pending_joins(store, 1, 0) == 0
    seen = []

    def group_boundary(_s):          # the group's rank 0, between two polls of the joiner
        clock.t += 0.01
        pulses[0] += 1
        k = ms.pending_joins(store, 1, 0)
        if k and not seen:
            taken = ms.joiners(store, 1, 0, k)
            seen.append(taken)
            ms.admit(store, 1, 1, (0, 7), taken, [], 1)

    e = ms.enter(store, 7, watch(clock, pulses), dead_s=1, wait_s=5, sleep=group_boundary)
    assert seen == [[(1, 7)]]
    assert (e.gen, e.round, e.members, e.founder, e.joins_seen) == (1, 1, (0, 7), False, 1)


def test_a_join_entry_not_yet_written_is_not_counted():
    """A joiner draws its number, then writes its entry: rank 0 counts only written entries,
    so every rank reads the same ones."""
    store = DictStore()
    ms.claim(store, 0, 0, "")
    store.add("g1/joins", 1)                        # drawn, entry not yet written
    assert ms.pending_joins(store, 1, 0) == 0
    store.set("g1/join/1", "5")
    store.add("g1/joins", 1)
    store.set("g1/join/2", "6")
    assert ms.pending_joins(store, 1, 0) == 2
    assert ms.joiners(store, 1, 0, 2) == [(1, 5), (2, 6)]


def test_a_refused_joiner_is_told_why():
    store, clock = DictStore(), Clock()
    pulses = {0: 1}
    ms.enter(store, 0, watch(clock, pulses), dead_s=1, wait_s=5)

    def refuse(_s):
        clock.t += 0.01
        pulses[0] += 1
        if ms.pending_joins(store, 1, 0):
            ms.admit(store, 1, 0, (0,), [], [(1, "member 0 is already in the group")], 1)

    with pytest.raises(MembershipError, match="already in the group"):
        ms.enter(store, 0, watch(clock, pulses), dead_s=1, wait_s=5, sleep=refuse)


def test_a_closed_generation_is_followed_by_a_new_one():
    store, clock = DictStore(), Clock()
    ms.enter(store, 0, watch(clock, {}), dead_s=1, wait_s=5)
    ms.close(store, 1)
    e = ms.enter(store, 1, watch(clock, {}), dead_s=1, wait_s=5)
    assert (e.gen, e.founder, e.members) == (2, True, (1,))


def test_a_generation_whose_members_have_no_pulse_is_replaced():
    """Every member of the generation died (no pulse moved for dead_s): the waiting joiner
    founds the next generation instead of waiting for an admission that never comes."""
    store, clock = DictStore(), Clock()
    ms.enter(store, 0, watch(clock, {0: 5}), dead_s=1, wait_s=60)
    pulses = {0: 5}                                 # member 0's counter never moves again

    def tick(_s):
        clock.t += 0.1

    e = ms.enter(store, 1, watch(clock, pulses), dead_s=1, wait_s=60, sleep=tick)
    assert (e.gen, e.founder) == (2, True)
    assert 0.9 <= clock.t < 2.0


def test_a_live_group_that_never_admits_times_the_joiner_out():
    store, clock = DictStore(), Clock()
    pulses = {0: 1}
    ms.enter(store, 0, watch(clock, pulses), dead_s=1, wait_s=5)

    def tick(_s):
        clock.t += 0.1
        pulses[0] += 1                              # alive, but never at a boundary

    with pytest.raises(MembershipError, match="not admitted"):
        ms.enter(store, 1, watch(clock, pulses), dead_s=1, wait_s=3, sleep=tick)


def test_survivors_agree_without_the_dead_member_and_a_late_one_is_left_out():
    store, clock = DictStore(), Clock()
    pulses = {0: 1, 1: 1, 2: 1}
    w0 = watch(clock, pulses)

    def tick(_s):
        clock.t += 0.1
        pulses[1] += 1           # 1 is alive (it registers below); 2 is dead (its counter stands)

    store.set("g1/r4/alive/1", "17")
    got = ms.decide(store, 1, 4, (0, 1, 2), 0, 18, w0, dead_s=1, wait_s=10, sleep=tick)
    assert got == {0: 18, 1: 17}
    # member 2 turns up late: the decision stands, and it is not in it
    late = ms.decide(store, 1, 4, (0, 1, 2), 2, 18, watch(clock, pulses), dead_s=1, wait_s=10)
    assert late == got and 2 not in late


def test_decide_waits_for_a_member_that_is_alive_but_has_not_registered_yet():
    store, clock = DictStore(), Clock()
    pulses = {0: 1, 1: 1}
    calls = []

    def tick(_s):
        clock.t += 0.1
        pulses[1] += 1
        calls.append(1)
        if len(calls) == 30:                        # 3 s later, member 1 notices the failure
            store.set("g1/r0/alive/1", "9")

    got = ms.decide(store, 1, 0, (0, 1), 0, 9, watch(clock, pulses), dead_s=1, wait_s=10, sleep=tick)
    assert got == {0: 9, 1: 9} and len(calls) == 30


def test_decide_is_bounded():
    store, clock = DictStore(), Clock()
    pulses = {0: 1, 1: 1}

    def tick(_s):
        clock.t += 0.5
        pulses[1] += 1                              # alive forever, never registers

    with pytest.raises(MembershipError, match="did not agree"):
        ms.decide(store, 1, 0, (0, 1), 0, 9, watch(clock, pulses), dead_s=1, wait_s=5, sleep=tick)


@pytest.mark.parametrize("key,value,match", [
    ("gen", "x:1:2", "gen is malformed"),
    ("g1/members", "not json", "members is not JSON"),
    ("g1/members", "[1, 1]", "distinct"),
    ("g1/members", "[-1]", "member id"),
    ("g1/members", "x" * (ms.VALUE_MAX + 1), "bytes"),
])
def test_malformed_store_values_are_refused(key, value, match):
    store, clock = DictStore(), Clock()
    ms.enter(store, 0, watch(clock, {0: 1}), dead_s=1, wait_s=1)
    store.set(key, value)
    with pytest.raises(MembershipError, match=match):
        ms.enter(store, 1, watch(clock, {0: 1}), dead_s=1, wait_s=1, sleep=lambda _s: None)


@pytest.mark.parametrize("text", ['{"round": 0, "members": [0, 1], "seen": 1}',
                                  '{"round": 2, "members": [0], "seen": 1}',
                                  '{"round": 2, "members": [0, 1], "seen": 0}',
                                  '[1]', 'nope'])
def test_malformed_admissions_are_refused(text):
    with pytest.raises(MembershipError):
        ms._admission(text, 1, 1, 1)


def test_member_ids_are_bounded():
    for bad in (-1, ms.MEMBER_MAX, "3", 1.0, True):
        with pytest.raises(MembershipError):
            ms.check_member(bad)


def test_watch_calls_a_member_dead_only_after_dead_s_without_a_change():
    clock, pulses = Clock(), {5: 1}
    w = watch(clock, pulses)
    w.observe([5])
    clock.t = 0.9
    w.observe([5])
    assert not w.dead(5, 1.0)
    clock.t = 1.0
    assert w.dead(5, 1.0)
    pulses[5] = 2
    w.observe([5])
    assert not w.dead(5, 1.0)
    assert not w.dead(6, 1.0)                      # never looked at: not judged


def test_pulse_files_round_trip(tmp_path):
    (tmp_path / "pulse").mkdir()
    assert ms.read_pulse(str(tmp_path), 3) is None
    ms.write_pulse(str(tmp_path), 3, 41)
    assert ms.read_pulse(str(tmp_path), 3) == 41
    (tmp_path / "pulse" / "4").write_text("garbage")
    assert ms.read_pulse(str(tmp_path), 4) is None


def test_a_life_lock_runs_a_member_id_once_and_frees_the_moment_its_process_dies(tmp_path):
    import subprocess
    import sys
    (tmp_path / "life").mkdir()
    d = str(tmp_path)
    assert not ms.gone(d, 4)                        # never started: not known to be gone
    holder = subprocess.Popen([sys.executable, "-c", (
        f"import sys, time; sys.path.insert(0, {ROOT!r})\n"
        "from malletrain.runtime import membership as ms\n"
        f"fd = ms.hold_life({d!r}, 4); print('held', flush=True); time.sleep(60)")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert not ms.gone(d, 4)
        with pytest.raises(MembershipError, match="running already"):
            ms.hold_life(d, 4, tries=2)
    finally:
        holder.kill()                               # SIGKILL: no chance to clean up
        holder.wait()
    assert ms.gone(d, 4)
    fd = ms.hold_life(d, 4)                         # the id can run again
    os.close(fd)


def test_a_watch_knows_a_member_with_a_free_life_lock_is_dead_at_once():
    clock = Clock()
    w = ms.Watch("unused", clock=clock, read=lambda _d, m: 1, gone=lambda _d, m: m == 2)
    w.observe([1, 2])
    assert w.dead(2, 1.0) and not w.dead(1, 1.0)


def test_rank_0s_offer_refuses_a_joiner_that_is_gone_and_every_rank_reads_the_same_answer():
    store = DictStore()
    ms.claim(store, 0, 0, "")
    for n, m in ((1, 5), (2, 6)):
        store.add("g1/joins", 1)
        store.set(f"g1/join/{n}", str(m))
    ms.offer(store, 1, 0, 2, is_gone=lambda m: m == 6)
    assert ms.offered(store, 1, 0, 2) == [(1, 5, True), (2, 6, False)]
    store.set("g1/offer/0/2", '[[1, 5, "yes"]]')
    with pytest.raises(MembershipError, match="malformed"):
        ms.offered(store, 1, 0, 2)
