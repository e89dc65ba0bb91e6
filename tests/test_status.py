"""status.json: one typed record, written and read in one place."""
import json

import pytest

from malletrain.daemon.status import (
    SCHEMA_VERSION,
    Change,
    Counters,
    CycleStats,
    DaemonStatus,
    JobStatus,
    Measured,
    Member,
    read_status,
    write_status,
)
from malletrain.domain.errors import InputError


def sample_status():
    change = Change(1.0, 3, "grow", "n1", "n1,n2", "grow 1→2: …", "gain")
    job = JobStatus("17", "lr-0.1", "alice", "running", "RUNNING", "None", ("n1", "n2"), 2, 1, 4, "resnet",
                    Measured(2, 180.5, 1.5), 181.0, "fit", {"1": 95.0, "2": 181.0}, None,
                    "grow 1→2: …", "gain", change, (change,), probes=(4,))
    return DaemonStatus(2.0, 3, True, 10.0, "scavenger", 0, ("n3",), Counters(starts=1, rescales=1),
                        CycleStats(2, 3, 0.5, 1.2, False), (job,))


def test_round_trip(tmp_path):
    st = sample_status()
    write_status(str(tmp_path / "status.json"), st)
    assert read_status(str(tmp_path / "status.json")) == st
    doc = json.loads((tmp_path / "status.json").read_text())
    assert doc["schema_version"] == SCHEMA_VERSION and doc["jobs"][0]["reason_code"] == "gain"
    assert st.job("17").measured.samples_per_s == 180.5 and st.job("18") is None


def test_explain_lists_every_count_still_to_measure(tmp_path, capsys):
    """A cycle probes at the largest wanted count the job's share reaches, so explain names them all
    (not only the smallest); a status written before ``probes`` existed still reads, from ``probe``."""
    import dataclasses

    from malletrain.cli.main import main
    st = sample_status()
    job = dataclasses.replace(st.jobs[0], probe=2, probes=(2, 4, 8))
    write_status(str(tmp_path / "status.json"), dataclasses.replace(st, jobs=(job,)))
    assert main(["explain", "17", "--state-dir", str(tmp_path)]) == 0
    assert "still to measure at 2, 4, 8 node(s)" in capsys.readouterr().out
    doc = json.loads((tmp_path / "status.json").read_text())
    del doc["jobs"][0]["probes"]
    (tmp_path / "status.json").write_text(json.dumps(doc))
    assert read_status(str(tmp_path / "status.json")).jobs[0].probes == ()
    assert main(["explain", "17", "--state-dir", str(tmp_path)]) == 0
    assert "still to measure at 2 node(s)" in capsys.readouterr().out


def test_an_elastic_groups_members_round_trip_and_show_in_status_and_explain(tmp_path, capsys):
    import dataclasses

    from malletrain.cli.main import main
    st = sample_status()
    members = (Member(0, "18", "running", "n1"), Member(1, "19", "running", "n2"), Member(2, "17", "held", ""))
    job = dataclasses.replace(st.jobs[0], members=members)
    write_status(str(tmp_path / "status.json"), dataclasses.replace(st, jobs=(job,)))
    assert read_status(str(tmp_path / "status.json")).jobs[0].members == members
    assert main(["status", "--state-dir", str(tmp_path)]) == 0
    assert "elastic group: 2 running (n1 n2), 1 held" in capsys.readouterr().out
    assert main(["explain", "17", "--state-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "elastic group of 3 one-node member(s)" in out and "member 2: job 17, held" in out
    doc = json.loads((tmp_path / "status.json").read_text())
    doc["jobs"][0]["members"] = [{"task": "x", "job": 1, "state": None, "node": ""}]
    (tmp_path / "status.json").write_text(json.dumps(doc))
    with pytest.raises(InputError):
        read_status(str(tmp_path / "status.json"))


def test_explain_shows_an_elastic_groups_pause_per_kind_and_a_restarting_jobs_two(tmp_path, capsys):
    """Issue #26: a group's pauses are learned per kind; explain says which were measured, and
    that a loss is shown but not charged.  A status written before the kinds still reads."""
    import dataclasses

    from malletrain.cli.main import main
    from malletrain.daemon.status import Rescale
    st = sample_status()
    group = Rescale(6.0, 0.05, 1, 3, 30.0, 10.0, grow_s=0.2, grow_n=3, preemption_s=0.05, preemption_n=0,
                    loss_s=2.1, loss_n=2)
    write_status(str(tmp_path / "status.json"), dataclasses.replace(st, jobs=(dataclasses.replace(st.jobs[0],
                                                                                                 rescale=group),)))
    assert read_status(str(tmp_path / "status.json")).jobs[0].rescale == group
    assert main(["explain", "17", "--state-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "pauses in place: start 6s learned from 1 measurement(s) (configured 30s)" in out
    assert "grow 0.2s learned from 3 measurement(s)" in out and "preemption 0.05s (as the shrink)" in out
    assert "loss 2.1s learned from 2 measurement(s), not charged" in out
    doc = json.loads((tmp_path / "status.json").read_text())
    for k in ("grow_s", "grow_n", "preemption_s", "preemption_n", "loss_s", "loss_n"):
        del doc["jobs"][0]["rescale"][k]
    (tmp_path / "status.json").write_text(json.dumps(doc))
    assert main(["explain", "17", "--state-dir", str(tmp_path)]) == 0
    assert "rescale pauses: up 6s learned from 1 measurement(s)" in capsys.readouterr().out


def test_missing_malformed_or_other_schema_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="no status yet"):
        read_status(str(tmp_path / "none.json"))
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(InputError, match="cannot read status"):
        read_status(str(tmp_path / "bad.json"))
    write_status(str(tmp_path / "s.json"), sample_status())
    doc = json.loads((tmp_path / "s.json").read_text())
    doc["schema_version"] = SCHEMA_VERSION + 1
    (tmp_path / "s.json").write_text(json.dumps(doc))
    with pytest.raises(InputError, match="schema_version"):
        read_status(str(tmp_path / "s.json"))


def test_status_and_explain_escape_control_characters(tmp_path, capsys):
    """A job name or reason with terminal escapes, CR or newlines is shown escaped, never raw."""
    from malletrain.cli.main import main
    from malletrain.daemon.status import Counters, DaemonStatus, JobStatus, write_status
    evil = "x\x1b[2J\x1b]0;pwned\x07\rroot\nfake-row"
    job = JobStatus(job="7", name=evil, user="mallory", state="held", slurm_state="PENDING",
                    slurm_reason="JobHeldUser", nodes=(), size=0, min_nodes=1, max_nodes=2, profile=evil,
                    measured=None, predicted=None, curve_source=None, curve={}, probe=None,
                    reason=evil, reason_code="gave-up", last_action=None, history=())
    write_status(str(tmp_path / "status.json"), DaemonStatus(
        t=0.0, cycle=1, slurm_up=True, interval_s=10, partition="scavenger", idle_nodes=0, vacating=(),
        counters=Counters(), last_cycle=None, jobs=(job,), excluded_nodes={"n1": "until 5: " + evil}))
    for argv in (["status"], ["explain", "7"]):
        assert main([*argv, "--state-dir", str(tmp_path)]) == 0
        out = capsys.readouterr().out
        assert "\x1b" not in out and "\r" not in out and "\x07" not in out
        assert "\\x1b[2J" in out and "fake-row" in out
        assert all("fake-row" not in line or "\\n" in line for line in out.splitlines())


def test_the_status_file_holds_what_asdict_gives_in_compact_json(tmp_path):
    """status.json is written with json's C encoder (no indent) from a copy-free conversion: the
    same document as ``dataclasses.asdict``, read back equal."""
    import dataclasses
    st = sample_status()
    members = (Member(0, "18", "running", "n1"), Member(2, "17", "held", ""))
    st = dataclasses.replace(st, jobs=(dataclasses.replace(st.jobs[0], members=members), *st.jobs[1:]))
    write_status(str(tmp_path / "status.json"), st)
    text = (tmp_path / "status.json").read_text()
    assert json.loads(text) == json.loads(json.dumps(dataclasses.asdict(st))) and "\n" not in text
    assert read_status(str(tmp_path / "status.json")) == st
