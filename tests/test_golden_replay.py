"""Behaviour is pinned: replaying the shipped example gives the summary the
pre-restructuring code gave (tests/golden/replay/, recorded before the layout
change), field for field, apart from the timing fields."""
import json
import os

import pytest

from malletrain.domain.config import CoreConfig
from malletrain.replay.engine import ReplayOptions, run_replay
from malletrain.replay.summary import TIMING_FIELDS, read_summary
from malletrain.replay.traces import load_trace
from malletrain.replay.workload import load_workload

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN = os.path.join(ROOT, "tests", "golden", "replay")


@pytest.fixture(scope="module")
def example():
    return (load_trace(os.path.join(ROOT, "examples", "philly-1day.csv.gz")),
            load_workload(os.path.join(ROOT, "examples", "workload-pollux.yaml")))


@pytest.mark.parametrize("policy", ["malletrain", "oracle", "greedy", "static"])
def test_shipped_example_matches_the_recorded_summary(example, policy):
    trace, workload = example
    res = run_replay(trace, workload, ReplayOptions(core=CoreConfig(policy=policy), noise=0.05))
    got = res.summary.to_dict()
    for k in (*TIMING_FIELDS, "schema_version"):
        got.pop(k)
    with open(os.path.join(GOLDEN, f"philly-1day-{policy}.json")) as fh:
        want = json.load(fh)
    assert json.dumps(got, sort_keys=True) == json.dumps(want, sort_keys=True)


def test_summary_round_trips_and_rejects_other_schemas(tmp_path, example):
    from malletrain.domain.errors import InputError
    from malletrain.replay.engine import write_outputs
    trace, workload = example
    res = run_replay(trace, workload[:3], ReplayOptions(core=CoreConfig(policy="static")))
    write_outputs(res, str(tmp_path / "out"), plots=False)
    assert read_summary(str(tmp_path / "out" / "summary.json")) == res.summary
    doc = json.loads((tmp_path / "out" / "summary.json").read_text())
    doc["schema_version"] = 99
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(InputError, match="schema_version"):
        read_summary(str(tmp_path / "bad.json"))
