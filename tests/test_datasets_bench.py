"""Workload/trace builders and the benchmark commands, on small self-made data."""
import json
import os

import pytest

from devtools.__main__ import main as dev_main
from devtools.datasets import (
    APPS,
    full_curves,
    make_workload,
    philly_events,
    synthetic_trace,
    write_events,
    write_workload,
)
from malletrain.cli.main import main
from malletrain.replay.engine import idle_node_seconds
from malletrain.replay.traces import load_trace
from malletrain.replay.workload import load_workload


@pytest.fixture
def data_dir(tmp_path):
    """A miniature shared/data: Pollux-shaped curves for every app, a Philly sequence."""
    for i, app in enumerate(APPS):
        d = tmp_path / "scalability" / "pollux" / app
        d.mkdir(parents=True)
        rows = ["num_nodes,num_replicas,local_bsz,step_time,sync_time"]
        for reps in (4, 6, 8, 12, 16, 24, 32, 48, 64):
            for nodes in (reps // 4 or 1, reps // 2 or 1):
                step = 0.1 * (1 + 0.02 * i) * (1 + 0.05 * reps ** 0.5)
                rows.append(f"{nodes},{reps},32,{step:.6f},0.01")
        (d / "scalability.csv").write_text("\n".join(rows) + "\n")
    (tmp_path / "idle").mkdir()
    seq = ["time,active,total"] + [f"2017-10-10 00:{m:02d}:00,{5 + (m % 4)},10" for m in range(30)]
    (tmp_path / "idle" / "philly-node-sequence.csv").write_text("\n".join(seq) + "\n")
    pal = tmp_path / "variability" / "pal"
    pal.mkdir(parents=True)
    runs = ["cabinet,cab-node,mean_iter_dur"] + [f"c00{k % 2},c00{k % 2}-{k},{100 + 3 * k}" for k in range(6)]
    (pal / "resnet-longhorn-agg.csv").write_text("\n".join(runs) + "\n")
    return str(tmp_path)


def test_node_info_is_dealt_from_the_longhorn_measurements(data_dir, tmp_path):
    from devtools.datasets import node_info_rows
    from malletrain.domain.nodes import load_node_info
    rows = node_info_rows(data_dir, [f"x{i}" for i in range(10)], seed=1)
    assert [r[0] for r in rows] == [f"x{i}" for i in range(10)]
    assert {r[1] for r in rows} <= {"c000-0", "c001-0", "c000-1", "c001-1"}
    assert sorted(r[2] for r in rows[:6]) == [round((100 + 3 * k) / 107.5, 4) for k in range(6)]   # each once
    path = tmp_path / "nodes.csv"
    path.write_text("node,group,slowdown\n" + "".join(f"{n},{g},{s}\n" for n, g, s in rows))
    assert load_node_info(str(path))["x0"] == (rows[0][1], rows[0][2])


def test_workload_uses_4_gpu_nodes_and_loads(data_dir, tmp_path):
    curves = full_curves(data_dir)
    assert set(curves) == set(APPS)
    doc = make_workload(data_dir, 12, 3600, seed=3)
    assert make_workload(data_dir, 12, 3600, seed=3) == doc            # seeded
    path = tmp_path / "w.yaml"
    write_workload(doc, str(path))
    jobs = load_workload(str(path))
    assert len(jobs) == 12
    for j in jobs:
        assert j.min_nodes <= j.max_nodes and j.work > 0
        # n nodes = 4n replicas: 8 replicas -> 2 nodes
        app = j.name.rsplit("-", 1)[0]
        assert j.truth(2) == pytest.approx(curves[app][8], rel=1e-3)


def test_philly_events_reproduce_the_counts(data_dir, tmp_path):
    rows = philly_events(data_dir, "2017-10-10T00:00:00Z", 0.5)
    path = tmp_path / "p.csv.gz"
    write_events(rows, str(path))
    tr = load_trace(str(path))
    assert len(tr.nodes) == 10
    assert int(tr.initial_busy.sum()) == 5
    busy = tr.initial_busy.copy()
    for _t, i, b in zip(tr.times, tr.node_idx, tr.busy):
        busy[i] = b
    assert int(busy.sum()) == 5 + (29 % 4)   # the last minute's active count


def test_synthetic_trace_size_and_idle():
    tr = synthetic_trace(200, 2.0, 20_000, seed=1)
    assert len(tr.nodes) == 200 and 0 < tr.n_events <= 20_000 + 400
    frac = idle_node_seconds(tr) / (200 * (tr.end_s - tr.start_s))
    assert 0.0 < frac < 0.6
    assert (tr.times[1:] >= tr.times[:-1]).all()


def test_example_builder(data_dir, tmp_path):
    out = tmp_path / "ex"
    assert dev_main(["example", "--data", data_dir, "--out", str(out)]) == 0
    assert sorted(os.listdir(out)) == ["philly-1day.csv.gz", "philly-nodes.csv", "workload-mixed.yaml",
                                       "workload-pollux.yaml"]


def test_bench_allocator_and_compare_print_figures(capsys):
    assert main(["bench", "allocator", "--nodes", "200", "--jobs", "8", "--repeat", "3", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["decision_ms_p95"] >= res["decision_ms_p50"] > 0 and res["objective"] > 0
    assert res["idle_collect"] is True          # as the daemon runs: a full collection between decisions, when due
    assert main(["bench", "allocator", "--nodes", "200", "--jobs", "8", "--repeat", "3", "--no-idle-collect"]) == 0
    assert "no garbage collection between them" in capsys.readouterr().out
    assert main(["bench", "compare", "--sizes", "3x12", "--repeat", "1", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["rows"][0]
    assert row["bftrainer_status"] == "optimal"
    assert abs(row["gap_bftrainer_vs_dp"]) < 1e-6


def test_bench_jpa_and_replay_and_quality(data_dir, tmp_path, capsys):
    assert dev_main(["bench", "jpa", "--data", data_dir, "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["mape_near"] < 5.0      # the miniature curves are smooth
    assert dev_main(["bench", "replay", "--nodes", "64", "--days", "0.5", "--events", "2000",
                 "--jobs", "5", "--data", data_dir, "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["events"] > 0 and res["decisions"] > 0
    doc = make_workload(data_dir, 4, 1800, seed=1)
    write_workload(doc, str(tmp_path / "w.yaml"))
    write_events(philly_events(data_dir, "2017-10-10T00:00:00Z", 0.5), str(tmp_path / "p.csv"))
    assert main(["bench", "quality", "--trace", str(tmp_path / "p.csv"), "--workload",
                 str(tmp_path / "w.yaml"), "--policies", "malletrain,oracle,static", "--bound", "--clairvoyant",
                 "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["label"] for r in rows] == ["malletrain", "oracle", "static", "bound", "clairvoyant"]
    assert [r["policy"] for r in rows] == ["malletrain", "oracle", "static", "oracle", "oracle"]
    bound, oracle, seer = rows[3], rows[1], rows[4]
    assert main(["bench", "quality", "--trace", str(tmp_path / "p.csv"), "--workload",
                 str(tmp_path / "w.yaml"), "--policies", "malletrain,static", "--plain", "--seeds", "2",
                 "--json"]) == 0
    seeded = json.loads(capsys.readouterr().out)["rows"]
    # static acts on no reported sample: one run; the others once per seed; plain has the
    # forecasts off and is told the true pauses
    assert [(r["label"], r["seed"]) for r in seeded] == [
        ("malletrain", 0), ("malletrain", 1), ("static", 0), ("malletrain-plain", 0), ("malletrain-plain", 1)]
    assert seeded[0]["rescale_guess"] == [30.0, 10.0] and seeded[3]["rescale_guess"] is None
    # the bound pays nothing for a change and knows the windows: no pause or loss, and at least
    # as much useful work as the oracle that pays the workload's pauses
    assert bound["window_oracle"] and not oracle["window_oracle"]
    assert bound["lost_samples"] == 0 and bound["rescale_pause_samples"] == 0
    assert oracle["lost_samples"] + oracle["rescale_pause_samples"] > 0
    assert bound["useful_samples"] >= oracle["useful_samples"]
    # the clairvoyant row knows the windows but pays the workload's true pauses
    assert seer["window_oracle"] and seer["rescale_guess"] is None
    assert seer["lost_samples"] + seer["rescale_pause_samples"] > 0
    assert bound["useful_samples"] >= seer["useful_samples"]
    # --planned-lead reaches the policies compared, not the reference rows (which know every
    # window's end from the start); without it no row is told any
    assert all(r["planned_lead_s"] is None for r in rows)
    assert main(["bench", "quality", "--trace", str(tmp_path / "p.csv"), "--workload",
                 str(tmp_path / "w.yaml"), "--policies", "malletrain,static", "--clairvoyant",
                 "--planned-lead", "300", "--json"]) == 0
    led = json.loads(capsys.readouterr().out)["rows"]
    assert [(r["label"], r["planned_lead_s"], r["window_oracle"]) for r in led] == [
        ("malletrain", 300.0, False), ("static", 300.0, False), ("clairvoyant", None, True)]
    # the clairvoyant row is the same run with or without a lead elsewhere in the table
    assert led[2]["useful_samples"] == seer["useful_samples"]
    with pytest.raises(SystemExit) as bad:      # argparse: exit 2, the flag named
        main(["bench", "quality", "--trace", str(tmp_path / "p.csv"), "--workload",
              str(tmp_path / "w.yaml"), "--planned-lead", "-5"])
    assert bad.value.code == 2 and "--planned-lead" in capsys.readouterr().err


def test_scale_bench_reads_sdiag_and_renders_its_table():
    """sdiag's by-message-type section (format as slurmctld prints it); the by-user section is not counted."""
    from devtools import bench_scale
    sdiag = ("Server thread count:  1\n"
             "Remote Procedure Call statistics by message type\n"
             "\tREQUEST_PARTITION_INFO                  ( 2009) count:40     ave_time:123    total_time:4920\n"
             "\tREQUEST_JOB_INFO                        ( 2003) count:20     ave_time:2400   total_time:48000\n"
             "\n"
             "Remote Procedure Call statistics by user\n"
             "\troot            (       0) count:80     ave_time:1000   total_time:80000\n")

    class Fake:
        def run(self, *argv):
            import subprocess
            return subprocess.CompletedProcess(argv, 0, sdiag, "")
    assert bench_scale.sdiag_rpcs(Fake()) == {"REQUEST_PARTITION_INFO": (40, 4920), "REQUEST_JOB_INFO": (20, 48000)}
    row = dict(jobs=20000, cycle_ms_p50=531.4, cycle_ms_p95=571.3, reads_max=3, read_mb_mean=1.54,
               ctld_rpcs_per_cycle=4.2, ctld_ms_per_cycle=48.0, ctld_share_of_interval=0.024, adoption_cycles=161,
               rest=dict(text_ms=162.0, text_mb=1.52, rest_ms=27818.0, rest_mb=153.2, rest_parse_ms=1734.0,
                         rest_path="slurm/v0.0.42/jobs"))
    text = "\n".join(bench_scale.lines(dict(slurm="24.11.5", nodes=1000, cloud_nodes=996, interval_s=2.0,
                                            cycles=20, users=3, rows=[row])))
    assert " 20,000 |    531 ms |    571 ms |     3 |    1.54 |" in text
    assert "182.4x" in text and "GET /slurm/v0.0.42/jobs" in text


def test_bench_forecasts_digest_names_the_decisions(data_dir):
    """``bench forecasts --digest``: a digest of every plan per replay, the same for the same replay
    (two commits can be compared) and different where the decisions differ (forecasts on vs off)."""
    from devtools.bench_forecasts import _replay, _trace_and_workload, bench_forecasts
    report = bench_forecasts(data_dir, ("philly",), alloc_repeat=2, digest=True)
    off, on = report.data["replays"][0]["off"], report.data["replays"][0]["on"]
    assert len(off["plans"]) == 16 and off["plans"] != on["plans"]
    assert any(f"plans {on['plans']}" in line for line in report.lines)
    # some fresh decisions only gave the last plan again (the memo cannot tell); never all of them
    assert all(0 < r["repeated"] < r["decisions"] for r in (off, on))
    trace, workload, _ = _trace_and_workload("philly", data_dir, 10)
    assert _replay(trace, workload, False, 10, digest=True)["plans"] == off["plans"]
    assert _replay(trace, workload, False, 3, digest=True)["plans"] != off["plans"]
    assert _replay(trace, workload, False, 10)["plans"] is None
    assert _replay(trace, workload, False, 10)["repeated"] is None


def test_bench_forecasts_repeat_alternates_the_order_and_holds_the_median_pair(monkeypatch):
    """``--repeat N``: N replays each way, the order alternating (a machine that grows slower during
    the run favours neither mode), every pair's ratio kept, the median run of each mode reported."""
    from devtools import bench_forecasts as bf
    walls = iter([10.0, 16.0, 20.0, 11.0, 12.0, 30.0])     # off, on; on, off; off, on
    order: list[bool] = []

    def fake(trace, workload, on, max_jobs, digest=False, split=False):
        order.append(on)
        return {"wall_s": next(walls), "on": on}
    monkeypatch.setattr(bf, "_replay", fake)
    off, on, ratios, ratio = bf._paired(None, None, 10, False, False, 3)
    assert order == [False, True, True, False, False, True]
    assert ratios == [16.0 / 10.0, 20.0 / 11.0, 30.0 / 12.0]
    assert (off["wall_s"], on["wall_s"], ratio) == (11.0, 20.0, 20.0 / 11.0)      # the median pair's runs
    walls = iter([10.0, 30.0, 10.0, 10.0])              # two pairs: 3.0 and 1.0; the higher middle one
    assert bf._paired(None, None, 10, False, False, 2)[1:] == ({"wall_s": 30.0, "on": True}, [3.0, 1.0], 3.0)


def test_bench_forecasts_split_counts_every_cycle_once(data_dir):
    """``bench forecasts --split``: the cycles of each kind add up to the replay's cycles, the reused
    and stood ones are the replay's own counts, and each kind's time is within the replay's."""
    from devtools.bench_forecasts import KINDS, _replay, _trace_and_workload
    trace, workload, _ = _trace_and_workload("philly", data_dir, 10)
    r = _replay(trace, workload, True, 10, split=True)
    kinds = r["kinds"]
    assert list(kinds) == list(KINDS)
    assert sum(n for n, _ in kinds.values()) == r["decisions"] + r["reused"]
    assert kinds["reused"][0] == r["reused"]
    digested = _replay(trace, workload, True, 10, digest=True)
    assert kinds["stood"][0] == digested["stood"] > 0
    assert kinds["fresh, no change"][0] > 0 and kinds["fresh, changes"][0] > 0
    assert 0 < sum(s for _, s in kinds.values()) <= r["wall_s"]
    assert digested["kinds"] is None          # not timed while hashing


def test_bench_forecasts_floor_plays_the_models_answers_back_with_the_same_decisions(data_dir):
    """``bench forecasts --floor``: a replay that plays back the availability model's recorded
    answers makes the recording's decisions without calling the model; a tape that does not match
    the replay's questions is refused, and other answers give other decisions."""
    from devtools.bench_forecasts import _floor, _replay, _same_run, _Tape, _trace_and_workload
    from malletrain.core.availability import IdleHistory
    trace, workload, _ = _trace_and_workload("philly", data_dir, 10)
    tape = _Tape()
    with tape.recording():
        recorded = _replay(trace, workload, True, 10, digest=True)
    assert tape.model_s > 0 and len(tape.answers) > 1000
    real = IdleHistory.stays
    with tape.playing():
        assert IdleHistory.stays is not real
        played = _replay(trace, workload, True, 10, digest=True)
    assert IdleHistory.stays is real
    assert played["plans"] == recorded["plans"] and _same_run(recorded, played)
    assert _replay(trace, workload, True, 10, digest=True)["plans"] == recorded["plans"]
    shifted = _Tape()
    shifted.answers = tape.answers[1:]
    with shifted.playing(), pytest.raises(RuntimeError, match="asked the model"):
        _replay(trace, workload, True, 10)
    blind = _Tape()         # no predictions: other decisions, so the replay soon asks other questions
    blind.answers = [(at, n, {}) for at, n, _ in tape.answers]
    with blind.playing(), pytest.raises(RuntimeError, match="asked the model"):
        _replay(trace, workload, True, 10)
    rec, play, model_s = _floor(trace, workload, 10)
    assert _same_run(rec, play) and _same_run(rec, recorded) and model_s > 0
