"""The daemon's data path without Slurm: progress file -> metrics source -> JPA,
the advisor seeded from the store, reason codes on every action."""
import json

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
    obs = Observation(Snapshot(0.0, (), ()), (), {"7": JobFacts("resnet", "alice", str(path))})
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
