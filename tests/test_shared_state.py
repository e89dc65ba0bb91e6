"""Shared state one user can exhaust (issue #22): every store the daemon keeps for all users is
bounded per user or aged out.  Runs as any user (no root, Slurm or torch)."""
from __future__ import annotations

from malletrain.domain.model import Sample
from malletrain.jpa.advisor import Advisor


def _retire(a: Advisor, job: str, profile: str) -> None:
    a.register(job, profile)
    for t, n in enumerate([1, 1, 2, 2, 4, 4]):
        a.add(Sample(job, n, 100.0 * n ** 0.8, float(t)))
    a.forget(job)


def test_one_users_many_profiles_do_not_push_out_anothers_prior():
    a = Advisor(warmup_samples=0)
    _retire(a, "1", "alice/resnet")
    for i in range(Advisor.MAX_RETIRED_PROFILES + 10):          # mallory's thousands of profiles
        _retire(a, f"m{i}", f"mallory/p{i}")
    kept = a.retired()
    assert "alice/resnet" in kept
    assert sum(1 for p in kept if p.startswith("mallory/")) == Advisor.MAX_RETIRED_PROFILES_PER_OWNER
    assert a.curve("2", 1, 8, [1, 2, 4, 8], "alice/resnet").source == "profile-prior"


def test_jobs_without_a_profile_keep_nothing_in_the_shared_store():
    """A job with no profile in its tag has the private profile job-<id>, which no later job can
    use: retiring it only filled the store (4,096 such jobs pushed out every user's prior)."""
    a = Advisor(warmup_samples=0)
    _retire(a, "1", "alice/resnet")
    for i in range(50):
        _retire(a, str(100 + i), f"job-{100 + i}")
    assert list(a.retired()) == ["alice/resnet"]


def test_the_whole_store_is_bounded_and_the_biggest_keeper_yields_first():
    a = Advisor(warmup_samples=0)
    a.MAX_RETIRED_PROFILES, a.MAX_RETIRED_PROFILES_PER_OWNER = 10, 4
    for u in range(5):                                          # 5 users x 4 profiles > 10
        for p in range(4):
            _retire(a, f"{u}-{p}", f"u{u}/p{p}")
    kept = a.retired()
    assert len(kept) == 10
    per_user = sorted(sum(1 for p in kept if p.startswith(f"u{u}/")) for u in range(5))
    assert per_user == [2, 2, 2, 2, 2]


def test_a_stored_prior_is_bounded_again_when_loaded():
    stored = {f"job-{i}": {str(i): {"1": 1.0, "2": 1.8, "4": 3.0}} for i in range(100)}
    stored.update({f"mallory/p{i}": {"9": {"1": 1.0, "2": 1.8, "4": 3.0}} for i in range(500)})
    stored["alice/resnet"] = {"1": {"1": 1.0, "2": 1.8, "4": 3.0}}
    a = Advisor()
    a.load_retired(stored)
    kept = a.retired()
    assert "alice/resnet" in kept and not any(p.startswith("job-") for p in kept)
    assert len(kept) == 1 + Advisor.MAX_RETIRED_PROFILES_PER_OWNER


# ---------------------------------------------------------------- nothing kept for ever

def test_offsets_of_files_no_job_names_any_more_age_out(tmp_path):
    """Offsets restored from the store for jobs Slurm purged while the daemon was down were kept
    (and persisted) for ever: no observed job ever leaves to drop them."""
    import os

    from malletrain.core.backend import JobFacts, Observation
    from malletrain.daemon.progress import OFFSETS_KEPT_S, ProgressSource, ProgressTail
    from malletrain.domain.model import Snapshot

    class Journal:
        kv: dict = {}

        def add_samples(self, samples):
            pass

        def put(self, key, value):
            self.kv[key] = value
    live = tmp_path / "8.jsonl"
    live.write_text('{"t": 1, "samples": 0, "nodes": 1}\n')
    tail = ProgressTail()
    tail.load({f"/scratch/u/{i}.jsonl": [100, 5, None, False, None, None] for i in range(1000)})
    journal = Journal()
    src = ProgressSource(tail, journal)
    facts = {"8": JobFacts("p", "u", str(live), uid=os.getuid(), state="RUNNING")}
    src.poll(Observation(Snapshot(0.0, (), ()), (), facts))
    assert len(tail.files) == 1001                        # not at once: a job may be in between
    src.poll(Observation(Snapshot(OFFSETS_KEPT_S + 1, (), ()), (), facts))
    assert list(tail.files) == [str(live)] and list(journal.kv["tails"]) == [str(live)]


def test_a_job_that_left_leaves_no_counts_behind(tmp_path):
    from malletrain.core.backend import JobFacts, Observation
    from malletrain.daemon.progress import ProgressSource, ProgressTail
    from malletrain.domain.model import Snapshot
    src = ProgressSource(ProgressTail())
    for j in range(100):                                  # owners unknown: refused, counted per job
        src.poll(Observation(Snapshot(0.0, (), ()), (), {str(j): JobFacts("p", "u", f"/x/{j}.jsonl", uid=None)}))
        src.poll(Observation(Snapshot(0.0, (), ()), (str(j),), {}))
    assert dict(src.tail.counters.by_job) == {} and src.tail._refused == {}


def test_the_actions_table_is_bounded_per_job_and_aged_out(tmp_path):
    from malletrain.daemon import store as store_mod
    from malletrain.daemon.store import Store
    from malletrain.domain.model import Action, ActionKind, ReasonCode
    st = Store(str(tmp_path / "state.db"))
    try:
        def act(job):
            return Action(job, ActionKind.STOP, ("n1",), (), "stopped again", ReasonCode.LOST)
        for i in range(store_mod.ACTIONS_PER_JOB + 300):   # a job its owner releases every cycle
            st.add_actions(1000.0 + i, i, [act("7")])
        st.add_actions(2000.0, 1, [act("8")])
        rows = dict(st.db.execute("SELECT job, COUNT(*) FROM actions GROUP BY job").fetchall())
        assert rows == {"7": store_mod.ACTIONS_PER_JOB, "8": 1}
        assert st.history("7", 1)[0].t == 1000.0 + store_mod.ACTIONS_PER_JOB + 299   # the newest stay
        later = 2000.0 + store_mod.ACTIONS_KEPT_S + store_mod.PRUNE_EVERY_S
        st.add_actions(later, 2, [act("9")])
        assert dict(st.db.execute("SELECT job, COUNT(*) FROM actions GROUP BY job").fetchall()) == {"9": 1}
    finally:
        st.close()


def test_samples_of_jobs_purged_while_the_daemon_was_down_are_dropped(tmp_path):
    from helpers import FakeSlurm, held_job

    from malletrain.daemon.loop import Daemon
    from malletrain.daemon.store import Store
    from malletrain.slurm.runner import Runner
    state = tmp_path / "state"
    st = Store(str(state / "state.db"))
    st.add_samples([Sample(j, n, 100.0 * n, float(t)) for j in ("gone", "7")
                    for t, n in enumerate([1, 1, 1, 2, 2, 2, 4, 4, 4])])
    st.close()
    fake = FakeSlurm()
    held_job(fake, "7")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"daemon: {{state_dir: {state}, metrics_port: 0, interval_s: 2, rescale_wait_s: 1}}\n")
    d = Daemon(str(cfg), runner=Runner(exec_fn=fake, sleep=lambda s: None, retries=0))
    try:
        d.cycle_once()
        assert d.store.sample_jobs() == {"7"}
        assert d.source.advisor.measured("gone") == {} and d.source.advisor.measured("7")
    finally:
        d.store.close()


# ---------------------------------------------------------------- logs no user can multiply

def _record(msg, *args, t=0.0, level=30, name="malletrain.progress", **extra):
    import logging
    r = logging.LogRecord(name, level, __file__, 1, msg, args or None, None)
    r.created = t
    for k, v in extra.items():
        setattr(r, k, v)
    return r


def test_repeated_lines_are_logged_once_per_window_with_a_count():
    from malletrain.daemon.logguard import LogGuard
    g = LogGuard(repeat_s=600.0)
    passed = [g.filter(_record("job %s: not reading progress file %s: %s", "7", "/p", "why", t=10.0 * i,
                               job="7")) for i in range(100)]
    assert passed[0] and not any(passed[1:60]) and passed[60]      # once per 600 s
    again = _record("job %s: not reading progress file %s: %s", "7", "/p", "why", t=1200.0, job="7")
    assert g.filter(again) and "not logged" in again.getMessage()
    assert g.filter(_record("job %s: not reading progress file %s: %s", "8", "/q", "why", t=1.0, job="8"))


def test_audit_lines_always_pass_whatever_users_cause():
    from malletrain.daemon.logguard import LogGuard
    g = LogGuard(burst=50, per_s=1.0)
    audit = noise = 0
    for i in range(20_000):                       # one cycle's flood from 10,000 jobs
        noise += g.filter(_record("job %s: not reading progress file: %s", str(i), "why", t=1.0, job=str(i)))
        audit += g.filter(_record("slurm write: %s", f"scontrol hold {i}", t=1.0, name="malletrain.slurm",
                                  level=20, command=["scontrol", "hold", str(i)]))
    assert audit == 20_000 and noise == 50
    later = _record("Slurm is back after %.0fs", 30.0, t=11.0, name="malletrain.daemon", level=20)
    assert g.filter(later) and "dropped by the log rate limit" in later.getMessage()


def test_the_daemons_handler_deduplicates(capsys):
    """Through the handler the daemon installs (setup_logging): a refusal repeated every cycle is
    written once; every Slurm write is written."""
    import logging

    from malletrain.daemon.service import setup_logging
    root = logging.getLogger()
    saved, level = list(root.handlers), root.level
    try:
        setup_logging("json")
        log, audit = logging.getLogger("malletrain.progress"), logging.getLogger("malletrain.slurm")
        for i in range(50):
            log.warning("job %s: not reading progress file %s: %s", "7", "/p", "owned by someone else",
                        extra={"job": "7"})
            audit.info("slurm write: %s", f"scontrol hold {i}", extra={"command": ["scontrol", "hold", str(i)]})
        err = capsys.readouterr().err
        assert err.count("not reading progress file") == 1 and err.count("slurm write") == 50
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in saved:
            root.addHandler(h)
        root.setLevel(level)
