"""The daemon's data path without Slurm: progress file -> metrics source -> JPA,
the advisor seeded from the store, reason codes on every action."""
import json
import os
import subprocess

from malletrain.core.backend import JobFacts, Observation
from malletrain.daemon.loop import Daemon
from malletrain.daemon.progress import ProgressSource, ProgressTail
from malletrain.daemon.store import Store
from malletrain.domain.model import Sample, Snapshot


class Journal:
    def __init__(self):
        self.samples, self.kv = [], {}

    def add_samples(self, samples):
        self.samples += list(samples)

    def put(self, key, value):
        self.kv[key] = value


def progress(path, t, samples, nodes=2, restart=0, event="progress"):
    with open(path, "a") as fh:
        fh.write(json.dumps(dict(t=t, job="7", samples=samples, nodes=nodes, restart=restart,
                                 event=event)) + "\n")


def test_progress_source_reads_the_file_the_tag_names_and_forgets_finished_jobs(tmp_path):
    path = tmp_path / "7.jsonl"
    progress(path, 100.0, 0.0)
    progress(path, 101.0, 200.0)
    progress(path, 102.0, 400.0)
    journal = Journal()
    src = ProgressSource(ProgressTail(), journal)
    obs = Observation(Snapshot(0.0, (), ()), (), {"7": JobFacts("resnet", "alice", str(path), uid=os.getuid())})
    got = src.poll(obs)
    assert [(s.job_id, s.nodes, s.samples_per_s) for s in got] == [("7", 2, 200.0), ("7", 2, 200.0)]
    assert journal.samples == list(got) and str(path) in journal.kv["tails"]
    assert src.latest["7"].t_s == 102.0
    assert src.poll(obs) == ()                       # nothing new: nothing twice
    progress(path, 103.0, 500.0)
    assert [s.samples_per_s for s in src.poll(obs)] == [100.0]
    gone = Observation(Snapshot(0.0, (), ()), ("7",), {})
    assert src.poll(gone) == () and "7" not in src.latest and str(path) not in src.tail.files
    no_file = Observation(Snapshot(0.0, (), ()), (), {"8": JobFacts("p", "bob", None)})
    assert src.poll(no_file) == ()


def test_a_size_change_is_measured_from_its_hold_to_the_first_step_of_the_new_run(tmp_path):
    """The pause the daemon charges a job is measured once per change, from the job's own records,
    bounded by what the daemon saw itself (SECURITY.md: a job cannot claim a pause shorter than
    Slurm's part of it, or one that ended after the daemon read it)."""
    from malletrain.core.backend import SizeChange
    from malletrain.domain.model import Direction
    path = tmp_path / "7.jsonl"
    progress(path, 100.0, 0.0, nodes=1)
    progress(path, 101.0, 100.0, nodes=1)
    src = ProgressSource(ProgressTail())

    def poll(now, change):
        facts = {"7": JobFacts("p", "alice", str(path), uid=os.getuid(), change=change)}
        src.poll(Observation(Snapshot(now, (), ()), (), facts))
        return src.pauses()
    assert poll(102.0, None) == ()
    grow = SizeChange(Direction.UP, hold_s=110.0, release_s=118.0, nodes=3)
    assert poll(115.0, grow) == ()                       # not running on 3 nodes yet
    progress(path, 121.0, 100.0, nodes=3, restart=1, event="start")
    progress(path, 126.0, 100.0, nodes=3, restart=1)   # the first step at the new size
    progress(path, 127.0, 400.0, nodes=3, restart=1)
    (p,) = poll(130.0, grow)
    assert (p.job_id, p.direction, p.pause_s, p.kind.value) == ("7", Direction.UP, 16.0, "grow")
    assert poll(140.0, grow) == ()                       # measured once
    shrink = SizeChange(Direction.DOWN, hold_s=200.0, release_s=230.0, nodes=2)
    progress(path, 205.0, 500.0, nodes=2, restart=2)   # claims to run before Slurm released it
    (p,) = poll(240.0, shrink)
    assert p.pause_s == 30.0                             # at least Slurm's part (release - hold)
    late = SizeChange(Direction.UP, hold_s=300.0, release_s=301.0, nodes=4, start=True)
    progress(path, 900.0, 600.0, nodes=4, restart=3)   # claims a time after the read
    (p,) = poll(320.0, late)
    assert p.pause_s == 20.0                             # at most until the daemon read it
    assert p.kind.value == "start"                       # (the daemon started it: a start, not a grow)


def test_an_elastic_groups_changes_are_measured_from_its_reforming_records(tmp_path):
    """Issue #26: a group's members re-form in place, so what a change costs is the survivors'
    pause (a shrink) plus, for a grow, the joiner's start from the release, charged for the share
    of the new size it idled; never the time from the hold to the first record at the new size
    (the joiner's own start under Slurm, seconds, which the survivors did not wait for).  Each is
    measured as its kind: a shrink the daemon did not order is a node taken back (a preemption),
    a loss is a loss."""
    from malletrain.core.backend import SizeChange
    from malletrain.domain.model import Direction, PauseKind
    path = tmp_path / "7.jsonl"

    def reform(t, kind, nodes, pause_s):
        with open(path, "a") as fh:
            fh.write(json.dumps(dict(t=t, job="7", samples=0, nodes=nodes, restart=0, event="reform", kind=kind,
                                     pause_s=pause_s, members=list(range(nodes)))) + "\n")
    progress(path, 90.0, 0.0, nodes=2)
    progress(path, 91.0, 100.0, nodes=2)
    src = ProgressSource(ProgressTail())

    def poll(now, change, elastic=True):
        facts = {"7": JobFacts("p", "alice", str(path), uid=os.getuid(), change=change, elastic=elastic)}
        src.poll(Observation(Snapshot(now, (), ()), (), facts))
        return [(p.kind, round(p.pause_s, 4)) for p in src.pauses()]
    assert poll(95.0, None) == []
    reform(96.0, "shrink", 1, 0.03)          # before any change of the daemon's: a node taken back
    reform(97.0, "grow", 2, 0.03)            # nor is a grow it did not make measured
    reform(97.5, "shrink", 1, 0.0)           # more such claims in one read count once
    reform(97.6, "loss", 1, 0.0)
    reform(97.7, "loss", 1, 0.0)
    reform(97.8, "grow", 2, 0.03)
    assert poll(98.0, None) == [(PauseKind.PREEMPTION, 0.03), (PauseKind.LOSS, 0.0)]
    grow = SizeChange(Direction.UP, hold_s=100.0, release_s=100.0, nodes=3)
    reform(106.0, "grow", 3, 0.05)           # the joiner started for 6 s; the others paused 0.05 s
    progress(path, 106.5, 200.0, nodes=3)
    progress(path, 107.0, 300.0, nodes=3)
    assert poll(110.0, grow) == [(PauseKind.GROW, round(0.05 + 6.0 / 3, 4))]
    reform(111.0, "grow", 4, 0.04)           # a second admission for the same change: measured once
    assert poll(112.0, grow) == []
    shrink = SizeChange(Direction.DOWN, hold_s=120.0, release_s=120.0, nodes=2)
    reform(121.0, "shrink", 3, 0.038)        # the daemon's shrink 4 -> 2, in two steps
    reform(121.5, "shrink", 2, 0.02)
    reform(125.0, "loss", 1, 0.2)            # a member gone unannounced
    progress(path, 126.0, 400.0, nodes=1)
    assert poll(130.0, shrink) == [(PauseKind.SHRINK, 0.038), (PauseKind.LOSS, 0.2)]
    reform(129.0, "grow", 2, 0.1)            # (Slurm's own start of a member: not measured)
    reform(129.2, "shrink", 1, 0.01)         # the group is at the size the daemon shrank it to: taken back
    assert poll(129.5, shrink) == [(PauseKind.PREEMPTION, 0.01)]
    reform(129.8, "grow", 3, 0.1)
    shrink2 = SizeChange(Direction.DOWN, hold_s=130.0, release_s=130.0, nodes=1)
    reform(131.0, "shrink", 2, 5e9)          # beyond any pause: no measurement
    reform(131.5, "shrink", 2, "0")          # nor one that is not a number
    reform(131.6, "shrink", 1, 5e4)          # a claim beyond max_pause_s is cut to it
    assert poll(132.0, shrink2) == [(PauseKind.SHRINK, 3600.0)]
    assert src.members("7") == (0,)          # the last record naming its members well
    reform(133.0, "grow", 2, 0.05)
    with open(path, "a") as fh:              # members that are not task ids name nobody
        for bad in ([0, -1], ["1"], [True], list(range(5000)), "0,1"):
            fh.write(json.dumps(dict(t=134.0, job="7", samples=0, nodes=2, event="reform", kind="grow",
                                     pause_s=0.1, members=bad)) + "\n")
    poll(135.0, None)
    assert src.members("7") == (0, 1)
    reform(136.0, "shrink", 1, 0.0)          # a plain job's file: its re-forming records count for nothing
    assert poll(137.0, SizeChange(Direction.DOWN, hold_s=135.0, release_s=135.0, nodes=1), elastic=False) == []
    assert src.members("7") is None


def test_daemon_seeds_the_advisor_from_its_store(tmp_path):
    state = tmp_path / "state"
    store = Store(str(state / "state.db"))
    store.add_samples([Sample("7", n, 100.0 * n ** 0.9, float(t)) for t, n in
                       enumerate([1, 1, 1, 2, 2, 2, 4, 4, 4])])
    store.close()
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"daemon: {{state_dir: {state}, metrics_port: 0}}\n")
    d = Daemon(str(cfg))
    try:
        assert set(d.source.advisor.measured("7")) == {1, 2, 4}
    finally:
        d.store.close()


# ---------------------------------------------------------------- containment (SECURITY.md)

def _daemon(tmp_path, fake, extra=""):
    from malletrain.slurm.runner import Runner
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"daemon: {{state_dir: {tmp_path / 'state'}, metrics_port: 0, interval_s: 2, "
                   f"rescale_wait_s: 1{extra}}}\n")
    return Daemon(str(cfg), runner=Runner(exec_fn=fake, sleep=lambda s: None, retries=0)), cfg


def test_a_store_that_takes_no_writes_stops_all_writes_and_heals_by_itself(tmp_path, caplog):
    import sqlite3
    import stat

    from helpers import FakeSlurm, held_job

    from malletrain.daemon.status import read_status
    fake = FakeSlurm()
    held_job(fake, "7")
    d, _ = _daemon(tmp_path, fake)
    try:
        good = d.store.db
        d.store.db = sqlite3.connect(":memory:")
        d.store.db.close()                    # every write now fails, like a full disk
        for _ in range(3):
            d.cycle_once()                    # never raises
        writes = [c for c in fake.calls if c[0] == "scontrol" and c[1] not in ("-o", "show")]
        assert writes == []
        st = read_status(str(tmp_path / "state" / "status.json"))
        assert not st.state_writable and "state store" in st.state_error
        assert d.metrics.state_writable._value.get() == 0
        assert "applying nothing" in caplog.text
        d.store.db = good                     # space is back
        d.cycle_once()
        assert [c[1] for c in fake.calls if c[0] == "scontrol" and c[1] not in ("-o", "show")] == ["update", "release"]
        assert read_status(str(tmp_path / "state" / "status.json")).state_writable
        mode = stat.S_IMODE(os.stat(tmp_path / "state" / "state.db").st_mode)
        assert mode == 0o600
        assert stat.S_IMODE(os.stat(tmp_path / "state" / "status.json").st_mode) == 0o640
    finally:
        d.store.close()


def test_a_bad_reload_keeps_the_running_config(tmp_path):
    from helpers import FakeSlurm
    d, cfg = _daemon(tmp_path, FakeSlurm())
    try:
        for text in ("daemon: {interval_s: .inf}\n", "daemon: {vacate_lead_s: .nan}\n",
                     "daemon: {interval_s: 1e-300}\n", "[" * 10000 + "\n", "\0\xff", "core: {policy: oracle}\n"):
            cfg.write_text(text)
            d._reload = True
            d._do_reload()
            assert d.config.daemon.interval_s == 2 and d.config.daemon.vacate_lead_s == 60
        assert d.metrics.reload_failures._value.get() == 6
    finally:
        d.store.close()


def test_sigterm_during_an_outage_ends_the_cycle_without_retrying_reads(tmp_path):
    """Told to stop while slurmctld does not answer, the cycle's reads fail once each instead of
    retrying with backoff (systemd would otherwise SIGKILL it at TimeoutStopSec); SIGHUP does not."""
    import signal

    from malletrain.slurm.runner import Runner
    calls = []

    def down(argv, **kw):
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 1, "", "Unable to contact slurm controller")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"daemon: {{state_dir: {tmp_path / 'state'}, metrics_port: 0}}\n")
    sleeps = []
    d = Daemon(str(cfg), runner=Runner(exec_fn=down, sleep=sleeps.append, retries=3))
    try:
        d._signal(signal.SIGHUP, None)
        assert not d.runner.stop.is_set()
        d.cycle_once()
        assert sleeps and len(calls) > len(sleeps)            # retried while running
        calls.clear()
        sleeps.clear()
        d._signal(signal.SIGTERM, None)
        d.cycle_once()
        assert calls and not sleeps and d._stop                 # each read tried once, no backoff
        assert d.slurm_down_since is not None
    finally:
        d.store.close()


def test_metrics_endpoint_cannot_be_exhausted_by_idle_connections():
    import socket
    import urllib.request

    from malletrain.daemon.service import DaemonMetrics, serve_metrics
    m = DaemonMetrics()
    server = serve_metrics(m, "127.0.0.1", 0, max_connections=4, timeout_s=1.0)
    port = server.server_address[1]
    import threading
    import time
    threads0 = threading.active_count()
    idle = []
    most = 0
    for _ in range(50):                      # never send a byte; the kernel's backlog is 4 too
        idle.append(socket.create_connection(("127.0.0.1", port), timeout=30))
        most = max(most, threading.active_count() - threads0)
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:      # the slow ones time out, the rest were closed at once
            try:
                body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
                break
            except OSError:
                time.sleep(0.2)
        else:
            raise AssertionError("the endpoint never answered while idle clients held connections")
        assert "malletrain_idle_nodes" in body
        # the slots held while idle clients waited; the others were closed at once (how many
        # depends on how the kernel paced the connects against the 1 s timeouts)
        assert most <= 4 + 1
        assert m.metrics_rejected._value.get() >= 1
    finally:
        for s in idle:
            s.close()
        server.shutdown()
        server.server_close()


def test_each_cycle_tells_systemd_what_it_sees(tmp_path):
    """STATUS= after every cycle: the cycle, the idle nodes, the jobs it runs; and why it waits."""
    from helpers import FakeSlurm, held_job

    from malletrain.domain.errors import BackendError
    sent: list[str] = []
    fake = FakeSlurm()
    held_job(fake, "7")
    d, _ = _daemon(tmp_path, fake)
    d.notifier.send = lambda text: sent.append(text) or True
    try:
        d.cycle_once()
        first = [t for t in sent if t.startswith("STATUS=")]
        assert first and first[-1].startswith("STATUS=cycle 1 (every 2s): ")
        assert f"{d.backend.idle_nodes} idle node(s)" in first[-1]

        def down(*argv, **kw):
            raise BackendError("slurmctld is down")
        d.backend.observe = down
        d.cycle_once()
        assert sent[-1].startswith("STATUS=cycle 2 ") and sent[-1].endswith(
            "Slurm unreachable, jobs left as they are")
    finally:
        d.store.close()


def test_the_ledger_counts_completions_waits_and_fairness():
    from malletrain.core.backend import JobFacts, Observation
    from malletrain.daemon.outcomes import Ledger
    from malletrain.domain.model import JobSpec, JobState, Snapshot

    def job(jid, user, nodes=()):
        return JobState(JobSpec(jid, 1, 4, 0, 0, "", 100.0, jid, user), tuple(nodes))

    def obs(t, jobs, ended=(), finished=()):
        facts = {j.job_id: JobFacts("", j.spec.owner) for j in jobs}
        return Observation(Snapshot(t, (), tuple(jobs)), tuple(finished), facts, None,
                           {jid: JobFacts("", "alice", state=state) for jid, state in ended})
    led = Ledger(lambda user: 2.0 if user == "bob" else 1.0)
    led.observe(obs(100.0, [job("1", "alice"), job("2", "bob")]), {})
    led.observe(obs(160.0, [job("1", "alice", ("n1", "n2")), job("2", "bob")]), {})
    led.observe(obs(260.0, [job("1", "alice", ("n1", "n2")), job("2", "bob", ("n3",))]), {})
    led.observe(obs(360.0, [job("2", "bob", ("n3",))], ended=[("1", "COMPLETED")]), {"1": True})
    led.observe(obs(400.0, [job("2", "bob", ("n3",))], ended=[("1", "COMPLETED")]), {"1": True})  # once
    o = led.outcomes()
    assert o.completed == 1 and o.jct_mean_s == 260.0 and o.wait_mean_s == 60.0
    assert led.node_s == {"alice": 400.0, "bob": 140.0}
    assert o.users == 2 and o.jain_users == (400 + 70) ** 2 / (2 * (400 ** 2 + 70 ** 2))
    led.observe(obs(460.0, [], ended=[("2", "FAILED")], finished=["1"]), {"2": False})
    assert led.outcomes().completed == 1 and "1" not in led.submit      # a failed run is no completion
    again = Ledger()
    again.load(led.dump())
    assert again.outcomes().completed == 1 and again.node_s == led.node_s


def test_a_restart_does_not_measure_a_change_twice(tmp_path):
    from malletrain.core.backend import SizeChange
    from malletrain.domain.model import Direction
    path = tmp_path / "7.jsonl"
    tail = ProgressTail()
    src = ProgressSource(tail)
    grow = SizeChange(Direction.UP, hold_s=100.0, release_s=104.0, nodes=2)

    def poll(src, now):
        facts = {"7": JobFacts("p", "alice", str(path), uid=os.getuid(), change=grow)}
        src.poll(Observation(Snapshot(now, (), ()), (), facts))
        return src.pauses()
    progress(path, 108.0, 10.0)
    progress(path, 109.0, 20.0)
    assert [p.pause_s for p in poll(src, 110.0)] == [8.0]
    saved = tail.dump()                                  # the daemon stops here and restarts
    again = ProgressTail()
    again.load(saved)
    src2 = ProgressSource(again)
    progress(path, 5000.0, 90.0)                       # the same run, hours later
    assert poll(src2, 5001.0) == ()
    late = ProgressSource(ProgressTail(), max_pause_s=3600.0)   # nothing persisted: read too late to tell
    assert poll(late, 5002.0) == ()


def test_status_shows_the_name_each_user_gave_from_the_tag(tmp_path, capsys):
    """The queue read holds no user text, so the name shown comes from the tag (bounded and
    printable at parse; escaped again when printed), never from parsing Slurm's job name."""
    from helpers import FakeSlurm, held_job

    from malletrain.cli.main import main
    from malletrain.daemon.status import read_status
    from malletrain.slurm.parse import Tag
    fake = FakeSlurm()
    held_job(fake, "7", comment=Tag("tok", 1, 4, "p", 2.0, 1.0, "", name="resnet-50 lr=0.1").encode())
    held_job(fake, "8", comment=Tag("tok2", 1, 4, "p", 2.0, 1.0, "", name="hpo-3").encode(), uid=1001)
    d, _ = _daemon(tmp_path, fake)
    try:
        d.cycle_once()
    finally:
        d.store.close()
    st = read_status(str(tmp_path / "state" / "status.json"))
    assert {j.job: j.name for j in st.jobs} == {"7": "resnet-50 lr=0.1", "8": "hpo-3"}
    assert main(["status", "--state-dir", str(tmp_path / "state")]) == 0
    out = capsys.readouterr().out
    assert "resnet-50 lr=0" in out and "hpo-3" in out


def test_a_purged_job_does_not_stop_the_cycle(tmp_path):
    """A tracked job that slurmctld no longer holds (purged after MinJobAge, e.g. while the daemon
    was down): ``squeue -j ID`` of that one id exits 1 "Invalid job id specified" (checked on the
    real 22.05, 24.11 and 26.05 by tests/test_slurm_live.py).  That is "no such job", not an
    outage: the daemon forgets it and keeps serving the others (before, every cycle failed as
    "Slurm unreachable" until some other tracked job left the queue)."""
    from helpers import FakeSlurm, held_job

    from malletrain.daemon.status import read_status
    fake = FakeSlurm()
    held_job(fake, "7")
    held_job(fake, "8", uid=1001)
    d, _ = _daemon(tmp_path, fake)
    try:
        d.cycle_once()
        fake.run_pending()
        d.cycle_once()
        assert {j for j, r in fake.jobs.items() if r["state"] == "RUNNING"} == {"7", "8"}
        fake.purge("7")                        # ended and purged between two cycles
        before = len(fake.calls)
        for _ in range(3):
            d.cycle_once()
            st = read_status(str(tmp_path / "state" / "status.json"))
            assert st.slurm_up, "a purged job made the cycle fail"
        assert "7" not in d.backend.records and "7" not in d.backend.books
        assert [j.job for j in st.jobs] == ["8"]
        reads = [c for c in fake.calls[before:] if c[0] == "squeue" and "7" in c]
        assert len(reads) == 1          # read once as gone, then forgotten (not re-read every cycle)
    finally:
        d.store.close()


def test_a_full_collection_between_cycles_runs_only_when_python_is_about_to_want_one():
    """``collect_if_due`` (the daemon calls it while it waits for its next cycle): no full pass
    while the collector's count of young passes is low, one once it reaches its threshold less
    one (the count then starts again), none with the collector disabled.  Automatic collections
    are held off meanwhile (huge young thresholds), so the counts move only as the test says."""
    import gc

    from malletrain.daemon.collect import collect_if_due
    saved, was = gc.get_threshold(), gc.isenabled()
    try:
        gc.enable()
        gc.set_threshold(10**9, 10**9, 4)
        gc.collect()
        assert gc.get_count()[2] == 0 and not collect_if_due()
        gc.collect(1)
        gc.collect(1)                   # a young pass of generation 1 counts once in generation 2's count
        assert gc.get_count()[2] == 2 and not collect_if_due()
        gc.collect(1)
        assert gc.get_count()[2] == 3
        assert collect_if_due() and gc.get_count()[2] == 0
        for _ in range(3):
            gc.collect(1)
        gc.disable()
        assert not collect_if_due() and gc.get_count()[2] == 3
    finally:
        gc.set_threshold(*saved)
        if was:
            gc.enable()
        else:
            gc.disable()
