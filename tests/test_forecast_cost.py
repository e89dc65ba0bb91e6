"""Issue #23: the forecasts computed incrementally give what the plain computation gives.

Each fast path is checked against the straightforward one it replaced, on seeded random inputs:
the availability model's stays (numpy ages, cached survival table, grouped answer) against a
node-by-node loop; the grid index in numpy against ``math.log``; FreeOrder read off a StayMap's
groups against counting every node; placement's C-level sort keys against the rank function.
(The replays' decisions are pinned by the golden files.)  No timing here: the figures come from
``python -m devtools bench forecasts``.
"""
import math
import random

import numpy as np
import pytest

from malletrain.core.availability import GRID, GRID_RATIO, IdleHistory, _index, _indices, _StayTable
from malletrain.core.objective import FreeOrder, _longest_first, _own_sums, _prefix
from malletrain.core.placement import _ranked, _ranker
from malletrain.core.stays import StayMap
from malletrain.domain.model import STAYING, Node, Stay


def _reference_stays(h: IdleHistory, now: float, nodes, horizon: float) -> dict:
    """The node-by-node computation the vectorised one replaced."""
    k = len(GRID) - 1
    surv = None
    if h.closed >= h.min_stretches:
        starts = sorted(h._starts)
        censored, hi = [0.0] * k, len(starts)
        import bisect
        for i in range(k):
            lo = bisect.bisect_right(starts, now - GRID[i + 1])
            censored[i] = (hi - lo) * h._weight
            hi = lo
        censored[k - 1] += hi * h._weight
        at_risk = sum(h._closed) + sum(censored)
        surv, s = [1.0], 1.0
        for i in range(k):
            d = h._closed[i]
            risk = at_risk - censored[i] / 2.0
            if risk > 0 and d > 0:
                s *= max(0.0, 1.0 - d / risk)
            surv.append(s)
            at_risk -= d + censored[i]
    table = _StayTable(surv, horizon)
    out = {}
    for n in nodes:
        window = None if n.window_end_s is None else max(0.0, n.window_end_s - now)
        if surv is None and (window is None or window >= horizon):
            continue
        age = max(0.0, now - h.since.get(n.name, now))
        out[n.name] = table.stay(age, window, h._scale(n.name) if surv is not None else 0)
    return out


@pytest.mark.parametrize("seed", range(6))
def test_stays_equal_the_node_by_node_computation(seed):
    rng = random.Random(seed)
    names = [f"n{i:03d}" for i in range(150)]       # more than the per-node arrays' first 64 slots
    h = IdleHistory(min_stretches=10, half_life=50)
    pool: set[str] = set(rng.sample(names, 30))
    t = 1.6e9
    for step in range(400):
        t += rng.choice([1.0, 7.5, 30.0, 30.0, 240.0, 3600.0])
        for n in rng.sample(names, rng.randint(0, 4)):     # the primary scheduler takes and frees nodes
            pool.symmetric_difference_update({n})
        windows = {n: (t + rng.uniform(-50, 2000) if rng.random() < 0.2 else None) for n in pool}
        nodes = tuple(Node(n, window_end_s=windows[n]) for n in sorted(pool, key=lambda x: rng.random()))
        h.observe(t, nodes)
        if step % 3 == 0:
            extra = (Node("never-seen"),) if step % 2 else ()
            got = h.stays(t, nodes + extra, 600.0)
            want = _reference_stays(h, t, nodes + extra, 600.0)
            assert got == want
            again = h.stays(t + 0.5, nodes + extra, 600.0)          # cached parts reused: still equal
            assert again == _reference_stays(h, t + 0.5, nodes + extra, 600.0)
    assert h.closed >= h.min_stretches


def test_an_unchanged_answer_is_the_same_object_and_a_changed_one_is_not():
    h = IdleHistory(min_stretches=3)
    for i in range(5):
        h.update(100.0 * i, [f"x{i}"])
        h.update(100.0 * i + 50.0, [])
    nodes = (Node("a"), Node("b"))
    h.observe(1000.0, nodes)
    first = h.stays(1000.5, nodes, 600.0)
    assert isinstance(first, StayMap)
    assert h.stays(1000.6, nodes, 600.0) is first            # nothing changed: the same mapping
    later = h.stays(5000.0, nodes, 600.0)                     # the nodes aged: new stays
    assert later is not first and later == _reference_stays(h, 5000.0, nodes, 600.0)


def test_the_survival_table_is_reused_only_while_it_is_exact():
    rng = random.Random(3)
    h = IdleHistory(min_stretches=5)
    t = 0.0
    for i in range(40):
        h.update(t, [f"n{j}" for j in range(i % 7 + 1)])
        t += rng.uniform(1, 500)
    for now in sorted(t + rng.uniform(0, 5e4) for _ in range(200)):
        cached = h.survival(now)
        h._censored = None                      # force a fresh count
        assert h.survival(now) == cached


def test_the_vectorised_grid_index_equals_math_log_even_at_grid_points():
    rng = np.random.default_rng(0)
    ages = np.concatenate([rng.uniform(0, 2, 500), np.exp(rng.uniform(0, 20, 2000)), np.array(GRID),
                           np.nextafter(np.array(GRID), 0), np.nextafter(np.array(GRID), np.inf),
                           np.array(GRID[1:]) * GRID_RATIO ** -3 * GRID_RATIO ** 3, [1e12, 0.0]])
    assert _indices(ages).tolist() == [_index(float(a)) for a in ages]


def _random_stays(rng, names, kinds):
    return {n: rng.choice(kinds) for n in names if rng.random() < 0.9}     # some nodes have none


@pytest.mark.parametrize("seed", range(20))
def test_free_order_from_groups_equals_counting_every_node(seed):
    rng = random.Random(seed)
    names = tuple(f"n{i}" for i in range(rng.randint(1, 80)))
    kinds = [Stay(round(rng.random(), 2), round(rng.random(), 2)) for _ in range(rng.randint(1, 6))] + [STAYING]
    codes = np.array([rng.randrange(len(kinds)) for _ in names], dtype=np.int64)
    grouped = StayMap(names, codes, kinds)
    plain = dict(grouped)
    pool = set(names) | {f"new{i}" for i in range(rng.randint(0, 5))}      # nodes the stays do not know
    held = set(rng.sample(sorted(pool), rng.randint(0, len(pool) // 2)))
    free = pool - held - set(rng.sample(sorted(pool), rng.randint(0, 3)))
    for limit in (0, 1, 3, 10, len(pool), len(pool) + 5):
        want = FreeOrder([plain.get(n, STAYING) for n in free], [plain.get(n, STAYING) for n in held], limit)
        got = FreeOrder.of(grouped, free, held, limit)
        assert got.sums == want.sums
        assert FreeOrder.of(plain, free, held, limit).sums == want.sums


@pytest.mark.parametrize("seed", range(10))
def test_placement_sort_keys_equal_the_rank_function(seed):
    rng = random.Random(seed)
    kinds = [Stay(rng.random(), rng.random()) for _ in range(4)] + [Stay(0.5, 0.5), Stay(0.5, 0.25)]
    nodes = [Node(f"n{i}", group=rng.choice("ab"), variability=rng.choice([1.0, 1.2]),
                  window_end_s=rng.choice([None, None, rng.uniform(0, 1e4)])) for i in range(200)]
    stays = {n.name: rng.choice(kinds) for n in nodes if rng.random() < 0.8}
    assert _ranked(nodes, stays) == sorted(nodes, key=_ranker(stays))
    assert _ranked(nodes, {}) == sorted(nodes, key=_ranker({}))


def test_a_stay_map_is_the_plain_mapping():
    kinds = [Stay(0.2, 0.9), Stay(1.0, 0.0)]
    m = StayMap(("a", "b", "c"), np.array([1, 0, 1]), kinds)
    assert m == {"a": kinds[1], "b": kinds[0], "c": kinds[1]}
    assert [(s, sorted(ns)) for s, ns in m.groups()] == [(kinds[1], ["a", "c"]), (kinds[0], ["b"])]
    assert math.isclose(sum(s.fraction * len(ns) for s, ns in m.groups()), 2.2)


@pytest.mark.parametrize("seed", range(20))
def test_free_order_from_pool_counts_equals_counting_every_free_node(seed):
    """Where the stays cover the pool, the free nodes' stays are all the pool's counts less the held
    nodes' (FreeOrder.of_pool): the same values, in the same order, as FreeOrder.of reading the free set."""
    rng = random.Random(100 + seed)
    nodes = tuple(Node(f"n{i}") for i in range(rng.randint(1, 80)))
    names = tuple(n.name for n in nodes)
    kinds = [Stay(round(rng.random(), 2), round(rng.random(), 2)) for _ in range(rng.randint(1, 6))] + [STAYING]
    kinds.append(kinds[0])      # two codes with one value
    codes = np.array([rng.randrange(len(kinds)) for _ in names], dtype=np.int64)
    grouped = StayMap(names, codes, kinds, source=nodes)
    assert grouped.covers(nodes) and not grouped.covers(list(nodes)) and not StayMap(names, codes, kinds).covers(nodes)
    held = set(rng.sample(names, rng.randint(0, len(names) // 2)))
    # nodes of pinned jobs, one of them no longer in the pool
    pinned = set(rng.sample(sorted(set(names) - held), min(3, len(names) - len(held)))) | {"gone"}
    free = set(names) - held - pinned
    for limit in (0, 1, 3, 10, len(names), len(names) + 5):
        want = FreeOrder.of(dict(grouped), free, held, limit)
        got = FreeOrder.of_pool(grouped, held | pinned, held, limit)
        assert got.sums == want.sums, limit


@pytest.mark.parametrize("seed", range(20))
def test_own_stays_read_off_the_ranks_equal_sorting_them(seed):
    """A job's own nodes' prefix sums read off a StayMap's ranks (StayMap.prefix) are bitwise those
    of sorting the nodes' stays: ties, two codes with one value, staying nodes, and a node the map
    does not hold (then the plain path, which counts it as staying)."""
    rng = random.Random(300 + seed)
    names = tuple(f"n{i}" for i in range(rng.randint(1, 90)))
    kinds = [Stay(round(rng.random(), 2), round(rng.random(), 2)) for _ in range(rng.randint(1, 8))]
    kinds += [STAYING, kinds[0], Stay(kinds[0].fraction, 0.0), Stay(1.0, 0.3)]
    codes = np.array([rng.randrange(len(kinds)) for _ in names], dtype=np.int64)
    grouped = StayMap(names, codes, kinds)
    for _ in range(10):
        own = rng.sample(names, rng.randint(0, len(names)))
        want = _prefix(_longest_first(grouped[n] for n in own))
        assert grouped.prefix(own) == want
        assert _own_sums(own, grouped) == want == _own_sums(own, dict(grouped))
        assert [math.copysign(1.0, x) for pair in grouped.prefix(own) for x in pair] == \
            [math.copysign(1.0, x) for pair in want for x in pair]
    stranger = [names[0], "elsewhere"]
    assert grouped.prefix(stranger) is None
    assert _own_sums(stranger, grouped) == _prefix(_longest_first([grouped[names[0]], STAYING]))


@pytest.mark.parametrize("seed", range(4))
def test_a_held_answer_equals_a_fresh_one_at_every_time_up_to_the_next_change(seed):
    """For one pool object and no stretch opening or closing, the stays are returned without a
    recomputation until the first time a node's age interval or the survival curve can change
    (IdleHistory._hold).  Stepping through time — across the crossings, and right at them — every
    answer equals the node-by-node one; the held path is taken (and a negative control: the answer
    does change as the nodes age)."""
    rng = random.Random(seed)
    h = IdleHistory(min_stretches=5, half_life=30)
    t = 1.6e9 if seed % 2 else 0.0
    for _ in range(200):                    # closed stretches, short on some nodes, long on others
        h.update(t, [f"n{j}" for j in range(25) if rng.random() < 0.3 + 0.025 * j])
        t += rng.uniform(1, 900)
    h.update(t, [])
    nodes = tuple(Node(f"n{i}") for i in range(25))
    assert len({h._scale(n.name) for n in nodes}) > 2        # nodes of differing time scales
    h.observe(t, nodes[:20])
    h.observe(t + 40.0, nodes)              # five younger nodes
    t += 41.0
    held, answers = 0, []          # the answers themselves: an id alone may be reused once one is freed
    for _ in range(300):
        t += rng.choice([0.5, 3.0, 10.0, 60.0])
        before = h._hold
        got = h.stays(t, nodes, 600.0)
        held += before is not None and h._hold is before
        answers.append(got)
        assert got == _reference_stays(h, t, nodes, 600.0)
        hold = h._hold
        if hold is not None and math.isfinite(hold.until_s) and rng.random() < 0.5:   # just before and at its end
            for at in (np.nextafter(hold.until_s, -np.inf), hold.until_s):
                assert h.stays(float(at), nodes, 600.0) == _reference_stays(h, float(at), nodes, 600.0)
            t = max(t, float(hold.until_s))
    assert held > 50 and len({id(a) for a in answers}) > 5


@pytest.mark.parametrize("seed", range(8))
def test_memoised_stays_are_bitwise_the_general_computation(seed):
    """_StayTable.memoised (the grid reads of each (interval, scale, horizon) kept across curves)
    against _conditional (the general computation, as for a node with a window): every (age
    interval, time scale) of the grid, on random survival curves (some reaching 0), with one
    table's reads reused by the next curve's."""
    rng = random.Random(seed)
    k = len(GRID)
    horizon = rng.choice([60.0, 600.0, 3600.0, 1e6, 5e7])     # 5e7: the horizon's end beyond the grid
    pairs = [(i, sc) for i in range(k - 1) for sc in range(-6, 7)]
    for _ in range(2):
        s, surv = 1.0, [1.0]
        for _ in range(k - 1):
            s *= 1.0 - (rng.random() * 0.2 if rng.random() < 0.7 else 0.0)
            surv.append(0.0 if seed % 3 == 0 and len(surv) > k * 0.8 else s)
        rng.shuffle(pairs)
        table = _StayTable(surv, horizon)
        together = table.memoised_many(pairs)
        for p, st in zip(pairs, together):
            f = GRID_RATIO ** p[1]
            want = table._conditional(GRID[p[0]] * f, None, f)
            got = (st.fraction, st.leave_p)
            assert got == (want.fraction, want.leave_p), p
            signs = [math.copysign(1.0, x) for x in (want.fraction, want.leave_p)]
            assert [math.copysign(1.0, x) for x in got] == signs


@pytest.mark.parametrize("seed", range(10))
def test_a_curves_rate_function_is_interpolate_bitwise(seed):
    """Curve.rate (made once per curve, the arithmetic inlined) against interpolate over the sorted
    points: listed counts (as ints and floats), between them, below the smallest, above the largest,
    zero and negative counts, and a curve without points."""
    from malletrain.domain.model import Curve, CurvePoint, interpolate
    rng = random.Random(500 + seed)
    ks = sorted(rng.sample(range(1, 70), rng.randint(1, 12)))
    curve = Curve({k: CurvePoint(v, v, v) for k, v in zip(ks, (rng.uniform(0, 1e4) for _ in ks))})
    keys = sorted(curve.points)
    values = [curve.points[k].mean for k in keys]
    probes = [0, -1.5, 0.25, float(keys[0]), keys[-1] + 3, 1e9] + keys + [rng.uniform(0, 80) for _ in range(200)]
    for n in probes:
        want = curve.points[n].mean if n in curve.points else (0.0 if n <= 0 else interpolate(keys, values, n))
        assert curve.rate(n) == want and curve.mean(n) == want, n
    assert Curve({}).rate(3.5) == 0.0 == Curve({}).mean(2)


def _state(h: IdleHistory) -> tuple:
    slots = [h._slot[n] for n in sorted(h._slot)]
    return (h._closed, h._weight, h._log_sum, h._log_weight, h.closed, sorted(h.since.items()),
            h._starts.tolist(), {n: h.recent(n) for n in sorted(h._slot)}, h._seq,
            [(None if math.isnan(h._at[k]) else float(h._at[k]), float(h._sum[k]), float(h._len[k])) for k in slots])


@pytest.mark.parametrize("seed", range(4))
def test_nodes_leaving_at_once_close_as_one_at_a_time_would(seed):
    """update closes every node that left at one instant in one pass (their beginnings leave the
    sorted array at once, the slot arrays are written once; the grid intervals of a few one by one,
    of many in numpy); the same as closing them one update at a time in the order they entered,
    through the renormalisation of the weights (half_life 2: the weights pass 1e200 after ~1,300
    closes)."""
    rng = random.Random(seed)
    names = [f"n{i:03d}" for i in range(200)]
    batch, single = IdleHistory(min_stretches=5, half_life=2), IdleHistory(min_stretches=5, half_life=2)
    pool: list[str] = rng.sample(names, 100)
    t = 1.6e9
    batch.update(t, tuple(pool))
    single.update(t, tuple(pool))
    renormed = False
    for _ in range(300):
        t += rng.choice([1.0, 30.0, 30.0, 600.0])
        many = rng.choice([4, 12, 40])          # intervals one by one, and in numpy (more than availability._FEW)
        leave = set(rng.sample(pool, rng.randint(0, min(len(pool), many))))
        come = [n for n in rng.sample(names, rng.randint(0, many)) if n not in pool]
        kept = [n for n in pool if n not in leave]
        by_entry = sorted(leave, key=lambda n: single._seq[n])
        for i in range(len(by_entry)):            # one node leaves per update, at the same instant
            single.update(t, tuple(kept + by_entry[i + 1:]))
        pool = kept + come
        weight = batch._weight
        batch.update(t, tuple(pool))
        single.update(t, tuple(pool))
        renormed |= batch._weight < weight
        assert _state(batch) == _state(single)
    assert renormed and batch.closed > 1000


@pytest.mark.parametrize("seed", range(30))
def test_stay_maps_compare_as_their_plain_dicts(seed):
    """Two StayMaps of the same names compare code by code, without building their dicts: equal
    exactly when the plain dicts are (codes renumbered, two codes with one value, a code that no
    node has whose value differs, one node moved, values equal but not identical)."""
    rng = random.Random(500 + seed)
    names = tuple(f"n{i}" for i in range(rng.randint(0, 40)))
    kinds = [Stay(round(rng.random(), 1), round(rng.random(), 1)) for _ in range(rng.randint(1, 5))]
    codes = np.array([rng.randrange(len(kinds)) for _ in names], dtype=np.int64)
    a = StayMap(names, codes, kinds)
    perm = list(range(len(kinds)))
    rng.shuffle(perm)       # the same stays under other code numbers, plus an unused code
    spare = Stay(rng.random(), rng.random())
    other_kinds = [Stay(kinds[perm.index(c)].fraction, kinds[perm.index(c)].leave_p) for c in range(len(kinds))]
    b_codes = np.array([perm[c] for c in codes.tolist()], dtype=np.int64)
    variants = [StayMap(tuple(names), b_codes, other_kinds + [spare])]
    if len(names):
        moved = b_codes.copy()
        moved[rng.randrange(len(names))] = rng.randrange(len(kinds))
        variants.append(StayMap(names, moved, other_kinds))
        changed = list(other_kinds)
        changed[rng.randrange(len(kinds))] = spare
        variants.append(StayMap(names, b_codes, changed))
    for b in variants:
        want = dict(a.items()) == dict(b.items())
        fresh_a, fresh_b = StayMap(names, codes, kinds), StayMap(b._names, b._codes, b._values)
        assert (fresh_a == fresh_b) is want and (fresh_b == fresh_a) is want
        assert fresh_a._dict is None and fresh_b._dict is None       # no dict was built
        assert (a == dict(b.items())) is want and (dict(b.items()) == a) is want
    assert a == StayMap(names, codes.copy(), kinds) and a != {"elsewhere": STAYING}


def test_a_stay_map_builds_its_dict_only_when_read_node_by_node():
    kinds = [Stay(0.2, 0.9), Stay(1.0, 0.0)]
    m = StayMap(("a", "b", "c"), np.array([1, 0, 1]), kinds)
    assert len(m) == 3 and m.count() == [1, 2] and m.prefix(["a", "b"]) is not None and m.groups()
    assert m._dict is None
    assert m.get("b") is kinds[0] and m["a"] is kinds[1] and "c" in m and "d" not in m and m.get("d") is None
    assert list(m) == ["a", "b", "c"] and m.keys() == {"a", "b", "c"}
    assert list(m.values()) == [kinds[1], kinds[0], kinds[1]]
    assert m._dict is not None and m.plain() is m.plain()
    with pytest.raises(TypeError):
        hash(m)
    fresh = m.unbuilt()       # the same map with nothing built on it
    assert fresh._dict is None and fresh._groups is None and fresh._ranked is None and fresh._totals is None
    assert fresh == m and fresh is not m
    pool = (Node("a"), Node("b"), Node("c"))
    assert m.unbuilt(pool).covers(pool) and not fresh.covers(pool) and m.unbuilt(pool) == m


@pytest.mark.parametrize("seed", range(10))
def test_memoised_pause_costs_equal_computing_them_afresh(seed):
    """RescaleLearner.cost is memoised per job; after every change of a random sequence (samples of
    every kind, shared profiles, elastic groups, re-registration, forgetting, pruning, evictions
    from small tables, a dump loaded into a fresh learner) each job's cost equals the computation
    without the memo."""
    from malletrain.domain.model import PauseKind, PauseSample
    from malletrain.jpa.rescale import RescaleLearner
    rng = random.Random(700 + seed)
    learner = RescaleLearner(keep=3)
    learner.MAX_JOBS, learner.MAX_PROFILES = 12, 3       # small tables: evictions happen
    jobs = [f"j{i}" for i in range(8)]
    guesses = {j: (rng.uniform(1, 60), rng.uniform(1, 30)) for j in jobs}

    def check(lr):
        for j in jobs:
            up, down = guesses[j]
            assert lr.cost(j, up, down) == lr._cost(j, up, down), j
    for step in range(300):
        op = rng.random()
        j = rng.choice(jobs)
        if op < 0.6:
            learner.add(PauseSample(j, rng.choice(list(PauseKind)), rng.uniform(0, 120), float(step)))
        elif op < 0.75:
            learner.register(j, rng.choice(["", "p1", "p2", "p3", "p4"]), rng.random() < 0.3)
        elif op < 0.8:
            learner.forget(j)
        elif op < 0.83:
            learner.prune(set(rng.sample(jobs, 5)))
        elif op < 0.86:
            guesses[j] = (rng.uniform(1, 60), rng.uniform(1, 30))
        check(learner)
        if step % 50 == 49:
            fresh = RescaleLearner(keep=3)
            fresh.load(learner.dump())
            check(fresh)
