import itertools
import math
import random

import pytest

from malletrain.milp import JobChoice, Option, Problem, allocate, evaluate, mck
from malletrain.milp.bftrainer import solve_per_node
from malletrain.milp.count import solve_count_milp
from malletrain.milp.greedy import solve_greedy
from malletrain.milp.mck import solve_mck
from malletrain.milp.problem import job_values


def curve(rng):
    a, b, c = rng.uniform(1, 10), rng.uniform(0, 0.3), rng.uniform(0, 0.2)
    return lambda n: 0.0 if n <= 0 else 1.0 / (a / n + b + c * math.log2(n))


def random_problem(rng, types=("gpu",), jobs=None, cap_max=24):
    choices = []
    for i in range(jobs or rng.randint(1, 7)):
        lo = rng.randint(1, 4)
        hi = rng.randint(lo, 12)
        cur = rng.choice([0] + list(range(lo, hi + 1)))
        t = rng.choice(types)
        opts = job_values(list(range(lo, hi + 1)), cur, rng.uniform(60, 1200),
                          rng.uniform(0, 300), rng.uniform(0, 100), curve(rng))
        choices.append(JobChoice(f"j{i}", opts, (t,) if cur else tuple(types), cur))
    return Problem(tuple(choices), {t: rng.randint(0, cap_max) for t in types})


def brute_force(p):
    best = -math.inf
    per_job = []
    for j in p.jobs:
        per_job.append([(None, 0)] + [(t, o.size) for t in j.node_types for o in j.options if o.size])
    for combo in itertools.product(*per_job):
        try:
            best = max(best, evaluate(p, {j.job_id: c for j, c in zip(p.jobs, combo)}))
        except ValueError:
            pass
    return best


def test_knapsack_dp_reaches_the_milp_optimum_randomized():
    rng = random.Random(12345)
    proven = 0
    for _ in range(60):
        p = random_problem(rng)
        dp = solve_mck(p)
        assert evaluate(p, dp.sizes) == pytest.approx(dp.objective, rel=1e-9, abs=1e-9)
        for solver in ("cbc", "highs"):
            milp = solve_count_milp(p, solver, time_limit_s=60.0)
            # the DP is exact: never below any feasible MILP answer ...
            assert dp.objective >= milp.objective - 1e-6 * max(1.0, abs(milp.objective))
            # ... and equal to every proven optimum
            if milp.status == "optimal":
                proven += 1
                assert dp.objective == pytest.approx(milp.objective, rel=1e-7, abs=1e-6)
    assert proven >= 100  # a loaded machine may let CBC stop early once in a while


def reference_mck(p):
    """The knapsack DP written out scalar by scalar: every capacity of every table, every option
    that beats each smaller one, the choice walked back with the current size first, then no
    nodes, then the smallest size that reproduces the table."""
    (ntype, cap), = p.capacity.items()
    jobs = sorted(p.jobs, key=lambda j: max(o.size for o in j.options))
    cap = min(cap, sum(max(o.size for o in j.options) for j in jobs))
    tables, kept, base = [[0.0] * (cap + 1)], [], 0.0
    for j in jobs:
        v0 = j.value_of(0)
        base += v0
        gains, best = {}, 0.0
        for o in sorted(j.options):
            if 0 < o.size <= cap and o.value - v0 > best:
                best = gains[o.size] = o.value - v0
        kept.append(gains)
        dp = tables[-1]
        tables.append([max([dp[c]] + [dp[c - s] + g for s, g in gains.items() if s <= c])
                       for c in range(cap + 1)])
    sizes, c = {}, cap
    for idx in range(len(jobs) - 1, -1, -1):
        j, gains, dp, target = jobs[idx], kept[idx], tables[idx], tables[idx + 1][c]
        cur = j.current_size
        if 0 < cur <= c and cur in gains and dp[c - cur] + gains[cur] == target:
            pick = cur
        elif dp[c] == target:
            pick = 0
        else:
            pick = min(s for s, g in gains.items() if s <= c and dp[c - s] + g == target)
        sizes[j.job_id] = (ntype, pick) if pick else (None, 0)
        c -= pick
    return sizes, tables[-1][cap] + base


def test_vectorised_knapsack_dp_is_the_scalar_dp_bit_for_bit():
    """The DP applies a job's options in blocks over strided windows and computes each table only
    where it is read: the same sizes and the bitwise same objective as the plain DP, with ties
    (integer values), dominated options, sizes beyond the capacity, and blocks cut small."""
    rng = random.Random(2026)
    for _ in range(400):
        jobs = []
        for i in range(rng.randint(0, 7)):
            sizes = sorted(rng.sample(range(1, 30), rng.randint(1, 9)))
            whole = rng.random() < 0.6          # whole-number values: ties the walk back must break
            v = (lambda s: float(rng.randint(0, 3) + s // 4)) if whole else (lambda s: rng.uniform(-10, 90))
            opts = [Option(0, 0.0 if whole else rng.uniform(-5.0, 5.0))] + [Option(s, v(s)) for s in sizes]
            rng.shuffle(opts)
            jobs.append(JobChoice(f"j{i}", tuple(opts), ("gpu",), rng.choice([0] + sizes)))
        p = Problem(tuple(jobs), {"gpu": rng.randint(0, 60)})
        want_sizes, want_objective = reference_mck(p)
        for block in (mck.BLOCK_ELEMENTS, rng.randint(1, 60)):
            got = solve_mck(p, block=block)
            assert got.sizes == want_sizes
            assert got.objective == want_objective      # bitwise: the same additions, exact maxima


def test_cbc_gets_no_thread_count_of_one():
    """``-threads 1`` makes the bundled CBC stall for 10 s in about one run of six (milp/lp.py):
    one thread is asked for by leaving the option out."""
    from malletrain.milp import lp
    assert lp.make_solver("cbc", 5.0).optionsDict.get("threads") is None
    assert lp.make_solver("cbc", 5.0, threads=2).optionsDict.get("threads") == 2


def test_highs_agrees_with_cbc():
    rng = random.Random(7)
    for _ in range(15):
        p = random_problem(rng)
        assert solve_count_milp(p, "highs").objective == pytest.approx(
            solve_count_milp(p, "cbc").objective, rel=1e-7, abs=1e-6)


def test_multi_type_milp_matches_brute_force():
    rng = random.Random(99)
    for _ in range(25):
        p = random_problem(rng, types=("a100", "v100"), jobs=rng.randint(1, 3), cap_max=10)
        got = allocate(p)  # auto -> MILP for two types
        assert got.solver == "milp-cbc"
        assert got.objective == pytest.approx(brute_force(p), rel=1e-7, abs=1e-6)
        evaluate(p, got.sizes)  # feasible: raises otherwise


def test_negative_control_a_suboptimal_answer_is_detected():
    """The optimality check can fail: greedy is beaten on this instance."""
    # A has the best gain per node (30) but blocks B, which is worth more in total.
    a = JobChoice("A", (Option(0, 0), Option(3, 90.0)), ("gpu",))
    b = JobChoice("B", (Option(0, 0), Option(4, 100.0)), ("gpu",))
    p = Problem((a, b), {"gpu": 4})
    assert solve_mck(p).objective == pytest.approx(100.0)
    assert solve_greedy(p).objective < solve_mck(p).objective


def test_greedy_is_always_feasible():
    rng = random.Random(5)
    for _ in range(40):
        p = random_problem(rng, types=("a", "b"))
        g = solve_greedy(p)
        assert evaluate(p, g.sizes) == pytest.approx(g.objective)


def test_solver_failure_falls_back_to_greedy_with_a_note(monkeypatch):
    import malletrain.milp.solve as solve_mod

    def boom(*a, **k):
        raise RuntimeError("solver binary missing")
    monkeypatch.setattr(solve_mod, "solve_count_milp", boom)
    p = random_problem(random.Random(1), types=("a", "b"))
    got = allocate(p, method="cbc")
    assert got.status == "fallback" and got.solver == "greedy"
    assert "fell back to greedy" in got.notes[0] and "solver binary missing" in got.notes[0]


def test_unknown_allocator_is_an_error():
    from malletrain.domain.errors import SolverError
    with pytest.raises(SolverError):
        allocate(random_problem(random.Random(1)), method="gurobi")


def test_missing_zero_option_is_rejected():
    from malletrain.domain.errors import InputError
    p = Problem((JobChoice("x", (Option(1, 1.0),), ("gpu",)),), {"gpu": 1})
    with pytest.raises(InputError):
        allocate(p)


def test_pause_costs_charged_at_current_rate():
    f = lambda n: 10.0 * n
    opts = {o.size: o.value for o in job_values([1, 2, 4], 2, 100.0, 30.0, 5.0, f)}
    assert opts[2] == pytest.approx(100 * 20)             # no change, no pause
    assert opts[4] == pytest.approx(100 * 40 - 30 * 20)   # grow: up pause at T(2)
    assert opts[1] == pytest.approx(100 * 10 - 5 * 20)    # shrink: down pause at T(2)
    assert opts[0] == pytest.approx(0 - 5 * 20)


def per_node_instance(rng, n_jobs, n_nodes):
    from malletrain.bench.allocator import per_node_instance as build
    return build(rng, n_jobs, n_nodes, curve=curve, max_choices=range(3, 9), held_share=1.0)


def test_bftrainer_per_node_formulation_matches_count_optimum():
    rng = random.Random(21)
    for _ in range(6):
        nodes, jobs, problem = per_node_instance(rng, rng.randint(2, 4), rng.randint(6, 14))
        res = solve_per_node(jobs, nodes, 600, time_limit_s=300)   # correctness, not speed: a loaded
        assert res.status == "optimal"                             # machine must not turn it into 'kept'
        assert res.objective == pytest.approx(solve_mck(problem).objective, rel=1e-6, abs=1e-6)
        seen = set()
        for j in jobs:
            got = res.nodes[j.job_id]
            assert not (set(got) & seen)
            seen |= set(got)
            assert len(got) == 0 or j.min_nodes <= len(got) <= j.max_nodes
            # no migration: keeps all of its nodes, or gives some up and takes none
            assert set(j.current) <= set(got) or set(got) <= set(j.current)


def test_bftrainer_keeps_allocation_when_solver_gives_no_optimum(monkeypatch):
    from malletrain.milp import lp
    monkeypatch.setattr(lp, "solve", lambda prob, solver: lp.Outcome(False, False, "NotSolved"))
    nodes, jobs, _ = per_node_instance(random.Random(3), 3, 12)
    res = solve_per_node(jobs, nodes, 600)
    assert res.status == "kept" and "allocation unchanged" in res.notes[0]
    for j in jobs:
        assert res.nodes[j.job_id] == j.current


def test_fallback_note_reaches_the_log_and_the_summary(monkeypatch, caplog, tmp_path):
    """A solver failure inside a replay is logged and counted, not hidden."""
    from test_stress import random_trace, random_workload

    import malletrain.milp.solve as solve_mod
    from malletrain.domain.config import CoreConfig
    from malletrain.replay.engine import ReplayOptions, run_replay

    def boom(*a, **k):
        raise RuntimeError("cbc exploded")
    monkeypatch.setattr(solve_mod, "solve_count_milp", boom)
    rng = random.Random(4)
    res = run_replay(random_trace(rng, 8, 3000), random_workload(rng, 3),
                     ReplayOptions(core=CoreConfig(policy="oracle", allocator="cbc")))
    assert res.summary.solver_notes > 0
    assert "cbc exploded" in res.summary.solver_notes_first[0]
    assert any("fell back to greedy" in r.getMessage() for r in caplog.records)

