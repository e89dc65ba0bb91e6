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


def _enter(store, member, w, **kw):
    kw.setdefault("dead_s", 1)
    kw.setdefault("takeover_s", 10)
    kw.setdefault("wait_s", 5)
    return ms.enter(store, member, w, **kw)


def test_the_first_member_founds_a_generation_and_a_second_founder_loses():
    store, clock = DictStore(), Clock()
    e = _enter(store, 3, watch(clock, {}))
    assert (e.gen, e.round, e.members, e.founder) == (1, 0, (3,), True)
    assert e.ns.startswith("g1.") and ms.current_gen(store)[1] == e.ns
    assert json.loads(store.get(f"{e.ns}/members")) == [3]
    assert len(ms.secret(store, e.ns)) == 32
    assert ms.claim(store, 4, 0, "") is None       # generation 0 is gone: the stale claim loses
    assert ms.current_gen(store)[:2] == (1, e.ns)


def test_a_generation_is_set_up_before_it_is_claimed():
    """A joiner that reads ``gen`` finds the generation's keys already there."""
    store = DictStore()
    seen = []
    real = store.compare_set

    def spy(key, expected, desired):
        if key == "gen":
            ns = f"g1.{desired.split(':')[2]}"
            seen.append(store.check([f"{ns}/secret", f"{ns}/members"]))
        return real(key, expected, desired)
    store.compare_set = spy
    ms.claim(store, 0, 0, "")
    assert seen == [True]


def _found(store, clock, member=0, pulses=None):
    return _enter(store, member, watch(clock, pulses if pulses is not None else {member: 1}))


def test_a_joiner_is_admitted_at_a_boundary_with_the_groups_count_of_answered_requests():
    store, clock = DictStore(), Clock()
    pulses = {0: 1}
    e0 = _found(store, clock, 0, pulses)
    assert ms.pending_joins(store, e0.ns, 0) == 0
    done = []

    def group_boundary(_s):          # the group's rank 0, between two polls of the joiner
        clock.t += 0.01
        pulses[0] += 1
        k = ms.pending_joins(store, e0.ns, 0)
        if k and not done:
            ms.offer(store, e0.ns, 0, k, is_gone=lambda m: False)
            taken = ms.offered(store, e0.ns, 0, k)
            t = ms.transition(store, e0.ns, 0, ms.Transition(1, (0, 7), k, ((1, 7),), ()))
            ms.announce(store, e0.ns, t)
            done.append(taken)

    e = _enter(store, 7, watch(clock, pulses), sleep=group_boundary)
    assert done == [[(1, 7, True)]]
    assert (e.gen, e.ns, e.round, e.members, e.founder, e.joins_seen) == (1, e0.ns, 1, (0, 7), False, 1)


def test_a_join_entry_not_yet_written_is_not_counted_and_a_dead_ones_number_is_voided():
    """A joiner draws its number, then writes its entry: rank 0 counts only written entries,
    so every rank reads the same ones; a number drawn by a joiner that died before writing is
    voided, and the joiner that would still write it draws another."""
    store = DictStore()
    gen, ns = ms.claim(store, 0, 0, "")
    store.add(f"{ns}/joins", 1)                     # drawn, entry not yet written
    assert ms.pending_joins(store, ns, 0) == 0
    assert ms.void_gap(store, ns, 0)
    assert ms.pending_joins(store, ns, 0) == 1 and ms.joiners(store, ns, 0, 1) == [(1, -1)]
    # the void request is refused, a later joiner draws number 2 and is admitted
    e = _enter(store, 5, watch(Clock(), {0: 1}), sleep=lambda _s: ms.announce(
        store, ns, ms.Transition(1, (0, 5), 2, ((2, 5),), ((1, "void"),))))
    assert e.members == (0, 5) and ms.joiners(store, ns, 0, 2) == [(1, -1), (2, 5)]
    assert not ms.void_gap(store, ns, 2)           # nothing drawn beyond: no gap


def test_a_refused_joiner_is_told_why():
    store, clock = DictStore(), Clock()
    pulses = {0: 1}
    e0 = _found(store, clock, 0, pulses)

    def refuse(_s):
        clock.t += 0.01
        pulses[0] += 1
        if ms.pending_joins(store, e0.ns, 0):
            ms.announce(store, e0.ns, ms.Transition(1, (0,), 1, (), ((1, "the group is full"),)))

    with pytest.raises(MembershipError, match="full"):
        _enter(store, 1, watch(clock, pulses), sleep=refuse)


def test_a_closed_generation_is_followed_by_a_new_one():
    store, clock = DictStore(), Clock()
    e = _found(store, clock)
    ms.close(store, e.ns)
    e2 = _enter(store, 1, watch(clock, {}))
    assert (e2.gen, e2.founder, e2.members) == (2, True, (1,)) and e2.ns != e.ns


def test_a_generation_whose_pulses_all_stood_still_long_is_taken_over():
    """Every member of the generation died (no pulse moved for takeover_s, far longer than
    dead_s: a wrong takeover would leave two groups training): the waiting joiner founds the
    next generation instead of waiting for an admission that never comes."""
    store, clock = DictStore(), Clock()
    _found(store, clock, 0, {0: 5})
    pulses = {0: 5}                                 # member 0's counter never moves again

    def tick(_s):
        clock.t += 0.1

    e = _enter(store, 1, watch(clock, pulses), takeover_s=10, wait_s=60, sleep=tick)
    assert (e.gen, e.founder) == (2, True)
    assert 9.9 <= clock.t < 11.0


def test_a_generation_with_a_free_life_lock_but_a_moving_pulse_is_not_taken_over():
    """A life lock on another node's filesystem may look free: takeover trusts pulses only."""
    store, clock = DictStore(), Clock()
    _found(store, clock, 0, {0: 1})
    pulses = {0: 1}

    def tick(_s):
        clock.t += 0.5
        pulses[0] += 1

    w = ms.Watch("unused", clock=clock, read=lambda _d, m: pulses.get(m), gone=lambda _d, m: True)
    with pytest.raises(MembershipError, match="not admitted"):
        _enter(store, 1, w, takeover_s=2, wait_s=20, sleep=tick)


def test_a_live_group_that_never_admits_times_the_joiner_out():
    store, clock = DictStore(), Clock()
    pulses = {0: 1}
    _found(store, clock, 0, pulses)

    def tick(_s):
        clock.t += 0.1
        pulses[0] += 1                              # alive, but never at a boundary

    with pytest.raises(MembershipError, match="not admitted"):
        _enter(store, 1, watch(clock, pulses), wait_s=3, sleep=tick)


def test_survivors_agree_without_the_dead_member_and_a_late_one_is_left_out():
    store, clock = DictStore(), Clock()
    pulses = {0: 1, 1: 1, 2: 1}
    _, ns = ms.claim(store, 0, 0, "")

    def tick(_s):
        clock.t += 0.1
        pulses[1] += 1           # 1 is alive (it registers below); 2 is dead (its counter stands)

    store.set(f"{ns}/r4/alive/1", "1")
    got = ms.decide(store, ns, 4, (0, 1, 2), 0, 3, watch(clock, pulses), dead_s=1, wait_s=10, sleep=tick)
    assert (got.round, got.members, got.seen) == (5, (0, 1), 3)
    # member 2 turns up late: the transition stands, and it is not in it
    late = ms.decide(store, ns, 4, (0, 1, 2), 2, 3, watch(clock, pulses), dead_s=1, wait_s=10)
    assert late == got and 2 not in late.members


def test_a_planned_change_some_ranks_reached_is_what_a_failed_rank_adopts():
    """Rank A finished the step that carried a join and proposed the planned round; rank B's
    copy of that step failed and B went to decide(): B ends in A's round, not one of its own."""
    store, clock = DictStore(), Clock()
    _, ns = ms.claim(store, 0, 0, "")
    planned = ms.Transition(3, (0, 1, 9), 4, ((4, 9),), ())
    assert ms.transition(store, ns, 2, planned) == planned
    got = ms.decide(store, ns, 2, (0, 1), 1, 3, watch(clock, {0: 1, 1: 1}), dead_s=1, wait_s=5)
    assert got == planned
    assert ms.transition(store, ns, 2, ms.Transition(3, (1,), 3, (), ())) == planned   # first wins


def test_decide_waits_for_a_member_that_is_alive_but_has_not_registered_yet():
    store, clock = DictStore(), Clock()
    pulses = {0: 1, 1: 1}
    _, ns = ms.claim(store, 0, 0, "")
    calls = []

    def tick(_s):
        clock.t += 0.1
        pulses[1] += 1
        calls.append(1)
        if len(calls) == 30:                        # 3 s later, member 1 notices the failure
            store.set(f"{ns}/r0/alive/1", "1")

    got = ms.decide(store, ns, 0, (0, 1), 0, 0, watch(clock, pulses), dead_s=1, wait_s=10, sleep=tick)
    assert got.members == (0, 1) and len(calls) == 30


def test_decide_is_bounded():
    store, clock = DictStore(), Clock()
    pulses = {0: 1, 1: 1}
    _, ns = ms.claim(store, 0, 0, "")

    def tick(_s):
        clock.t += 0.5
        pulses[1] += 1                              # alive forever, never registers

    with pytest.raises(MembershipError, match="did not agree"):
        ms.decide(store, ns, 0, (0, 1), 0, 0, watch(clock, pulses), dead_s=1, wait_s=5, sleep=tick)


@pytest.mark.parametrize("value,match", [
    ("x:1:0123456789abcdef", "gen is malformed"),
    ("1:1:nothex", "gen is malformed"),
    ("\u00b2:1:0123456789abcdef", "gen is malformed"),       # a digit to str.isdigit, not to int()
])
def test_malformed_generations_are_refused(value, match):
    store, clock = DictStore(), Clock()
    store.set("gen", json.loads(f'"{value}"'))
    with pytest.raises(MembershipError, match=match):
        _enter(store, 1, watch(clock, {0: 1}), wait_s=1, sleep=lambda _s: None)


@pytest.mark.parametrize("value,match", [
    ("not json", "members is not JSON"),
    ("[1, 1]", "distinct"),
    ("[[1]]", "distinct"),
    ("[-1]", "member id"),
    ("x" * (ms.VALUE_MAX + 1), "bytes"),
])
def test_malformed_member_lists_are_refused(value, match):
    store, clock = DictStore(), Clock()
    e = _found(store, clock)
    store.set(f"{e.ns}/members", value)
    with pytest.raises(MembershipError, match=match):
        _enter(store, 1, watch(clock, {0: 1}), wait_s=1, sleep=lambda _s: None)


@pytest.mark.parametrize("text", ['{"round": 0, "members": [0, 1], "seen": 1}',
                                  '{"round": 2, "members": [0], "seen": 1}',
                                  '{"round": 2, "members": [0, 1], "seen": 0}',
                                  '[1]', 'nope'])
def test_malformed_admissions_are_refused(text):
    with pytest.raises(MembershipError):
        ms._admission(text, 1, 1, "g1.x", 1)


@pytest.mark.parametrize("text", ['{"round": 5, "members": [0], "seen": 0, "admitted": [], "refused": []}',
                                  '{"round": 3, "members": [0], "seen": -1, "admitted": [], "refused": []}',
                                  '{"round": 3, "members": [0], "seen": 0, "admitted": [[1]], "refused": []}',
                                  '{"round": 3, "members": [], "seen": 0, "admitted": [], "refused": []}',
                                  '{"round": 3, "members": [0], "seen": 0, "admitted": [], "refused": [[1, 2]]}'])
def test_malformed_transitions_are_refused(text):
    with pytest.raises(MembershipError):
        ms._transition(text, 2)


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
    _, ns = ms.claim(store, 0, 0, "")
    for n, m in ((1, 5), (2, 6)):
        store.add(f"{ns}/joins", 1)
        store.set(f"{ns}/join/{n}", str(m))
    ms.offer(store, ns, 0, 2, is_gone=lambda m: m == 6)
    assert ms.offered(store, ns, 0, 2) == [(1, 5, True), (2, 6, False)]
    ms.offer(store, ns, 0, 2, is_gone=lambda m: True)      # a second offer does not replace the first
    assert ms.offered(store, ns, 0, 2) == [(1, 5, True), (2, 6, False)]
    store.set(f"{ns}/offer/0/2", '[[1, 5, "yes"]]')
    with pytest.raises(MembershipError, match="malformed"):
        ms.offered(store, ns, 0, 2)
