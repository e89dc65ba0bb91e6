"""Every bad input: a clear error naming file/line/field, exit 2, nothing in --out."""
import os

import pytest
from helpers import job, write_events, write_workload

from malletrain.cli.main import main

GOOD_ROWS = [(0, "n0", "idle"), (0, "n1", "busy"), (60, "n1", "idle")]


def run(tmp_path, capsys, trace_text=None, jobs=None, workload_text=None, extra=()):
    tr, wl, out = tmp_path / "t.csv", tmp_path / "w.yaml", tmp_path / "out"
    if trace_text is None:
        write_events(tr, GOOD_ROWS)
    else:
        tr.write_text(trace_text)
    if workload_text is not None:
        wl.write_text(workload_text)
    else:
        write_workload(wl, jobs if jobs is not None else [job()])
    code = main(["replay", "--trace", str(tr), "--workload", str(wl), "--out", str(out), "--quiet",
                 *extra])
    err = capsys.readouterr().err
    leftovers = [p for p in os.listdir(tmp_path) if p.startswith(".replay-") or p == "out"]
    return code, err, leftovers


@pytest.mark.parametrize("mutate,needles", [
    (lambda j: j.update(colour="red"), ["unknown key", "colour", "valid keys", "min_nodes"]),
    (lambda j: j.pop("work"), ["field 'work'", "missing"]),
    (lambda j: j.update(work=-5), ["field 'work'", "> 0"]),
    (lambda j: j.update(min_nodes=-1), ["field 'min_nodes'", ">= 1"]),
    (lambda j: j.update(min_nodes=8, max_nodes=2), ["min_nodes=8 > max_nodes=2"]),
    (lambda j: j.update(rescale_up_s="soon"), ["rescale_up_s", "expected a number"]),
    (lambda j: j.update(submit="yesterday"), ["submit", "ISO-8601"]),
    (lambda j: j.update(throughput={0: 5.0}), ["throughput", "positive integer"]),
    (lambda j: j.update(throughput={2: -5.0}), ["throughput", "positive number"]),
    (lambda j: j.update(max_nodes=2.5), ["max_nodes", "integer"]),
])
def test_bad_workload(tmp_path, capsys, mutate, needles):
    j = job()
    mutate(j)
    code, err, left = run(tmp_path, capsys, jobs=[j])
    assert code == 2 and not left
    assert "w.yaml" in err and "line" in err
    for n in needles:
        assert n in err


@pytest.mark.parametrize("text,needles", [
    ("jobs: [\n", ["not valid YAML", "line"]),
    ("tasks: []\n", ["exactly the key 'jobs'"]),
    ("jobs: []\n", ["non-empty list"]),
])
def test_bad_workload_document(tmp_path, capsys, text, needles):
    code, err, left = run(tmp_path, capsys, workload_text=text)
    assert code == 2 and not left
    for n in needles:
        assert n in err


def test_duplicate_job_names(tmp_path, capsys):
    code, err, _ = run(tmp_path, capsys, jobs=[job(), job()])
    assert code == 2 and "duplicate job name" in err


@pytest.mark.parametrize("text,needles", [
    ("time,node,state\n2021-01-01T00:00:10Z,n0,idle\n2021-01-01T00:00:05Z,n0,busy\n",
     ["line 3", "not sorted", "field 'time'"]),
    ("time,node,state\nyesterday,n0,idle\n", ["line 2", "unparseable time"]),
    ("time,node,state\n2021-01-01T00:00:00Z,n0,sleeping\n", ["line 2", "field 'state'"]),
    ("time,node,state\n2021-01-01T00:00:00Z,n0\n", ["line 2", "3 comma-separated"]),
    ("time,node,state\n2021-01-01T00:00:00Z,n0,idle\n2021-01-01T00:01:00Z,n7,busy\n",
     ["line 3", "first appears after"]),
    ("time,node,state\n", ["no rows"]),
    ("hello world\n", ["unknown trace format"]),
    ("JobID|Start|End|NodeList|State\n1|2021-01-01T00:00:00|2021-01-01T01:00:00|n[1-|COMPLETED\n",
     ["line 2", "NodeList", "bad hostlist"]),
    ("JobID|Start|End\n1|2021-01-01T00:00:00|x\n", ["lacks NodeList"]),
    ("1 0 0 100 8 -1 -1 8 -1 -1 1 -1 -1 -1 -1 -1 -1 -1\n2 0 0 100 8\n", ["line 2", "18 fields"]),
])
def test_bad_traces(tmp_path, capsys, text, needles):
    code, err, left = run(tmp_path, capsys, trace_text=text)
    assert code == 2 and not left, err
    assert "t.csv" in err
    for n in needles:
        assert n in err


def test_unknown_policy_exits_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        run(tmp_path, capsys, extra=("--policy", "magic"))
    assert e.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


@pytest.mark.parametrize("extra", [("--interval", "0"), ("--noise", "-1"), ("--nodes", "x"),
                                   ("--start", "soon")])
def test_bad_flags_exit_2(tmp_path, capsys, extra):
    with pytest.raises(SystemExit) as e:
        run(tmp_path, capsys, extra=extra)
    assert e.value.code == 2


def test_empty_time_window(tmp_path, capsys):
    code, err, left = run(tmp_path, capsys, extra=("--start", "2030-01-01T00:00:00Z",
                                                   "--end", "2020-01-01T00:00:00Z"))
    assert code == 2 and "empty time window" in err and not left


def test_existing_out_is_untouched_on_error(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "summary.json").write_text("previous")
    code, _, _ = run(tmp_path, capsys, jobs=[job(work=-1)])
    assert code == 2 and (out / "summary.json").read_text() == "previous"
