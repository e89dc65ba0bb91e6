import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
EXAMPLES = os.path.join(ROOT, "examples")
SHARED = os.path.join(os.path.dirname(ROOT), "shared", "data")


# ---------------------------------------------------------------- the real local Slurm cluster
import pytest  # noqa: E402


def pytest_configure(config):
    """The run's temporary files go under a directory of its own (scripts/test.sh passes one with
    --basetemp): the live tests open it to the operator account and the test users, and change
    the mode of nothing above it.  Run as root without --basetemp, a fresh one in /tmp is used
    (pytest's default, /tmp/pytest-of-root, is shared with other runs and kept 0700)."""
    import tempfile

    import live
    if config.option.basetemp is None and os.geteuid() == 0:
        config.option.basetemp = tempfile.mkdtemp(prefix="malletrain-tests.")
        config._malletrain_own_basetemp = config.option.basetemp
    if config.option.basetemp is not None:
        live.OWN_TMP = os.path.abspath(str(config.option.basetemp))


def pytest_unconfigure(config):
    import shutil
    own = getattr(config, "_malletrain_own_basetemp", None)
    if own:
        shutil.rmtree(own, ignore_errors=True)


@pytest.fixture(autouse=True)
def _no_training_run_left_behind():
    """A test that failed before its training runs ended leaves none running for the next."""
    yield
    import helpers
    helpers.reap_launched()


@pytest.fixture(scope="session")
def operator_malletrain(tmp_path_factory):
    """``malletrain`` installed where the operator account can run it (built once per run)."""
    from live import install_for_operator
    return install_for_operator(str(tmp_path_factory.mktemp("operator")))


@pytest.fixture(scope="module")
def cluster(request, operator_malletrain):
    """The test cluster (scripts/local-slurm.sh, 4 nodes), up for one test module: the
    host's Slurm, or the release a test names with
    ``@pytest.mark.parametrize("cluster", VERSIONS, indirect=True)``; a module's ``CLUSTER_ARGS``
    go to ``local-slurm.sh up`` (another shape restarts the cluster from a clean state)."""
    from live import Cluster
    if os.geteuid() != 0:
        pytest.fail("the real-Slurm tests need root (slurmd); run the test command as root")
    c = Cluster(getattr(request, "param", "host"))
    c.operator = operator_malletrain
    c.up(*getattr(request.module, "CLUSTER_ARGS", ()))     # a module may ask for e.g. --min-job-age
    c.clean()
    yield c
    c.clean()
    c.script("down")


@pytest.fixture
def clean(cluster):
    cluster.clean()
    yield cluster
    cluster.clean()


@pytest.fixture(scope="module")
def users(cluster):
    """The unprivileged test users (created if missing, homes 0711), each with an association."""
    import pwd
    import subprocess

    from live import TEST_USERS
    out = {}
    for name in TEST_USERS:
        try:
            pwd.getpwnam(name)
        except KeyError:
            subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", name], check=True)
        pw = pwd.getpwnam(name)
        os.chmod(pw.pw_dir, 0o711)          # others may enter, not list (a typical home)
        cluster.add_user(name)              # an association (AccountingStorageEnforce)
        out[name] = pw
    return out


@pytest.fixture(scope="module")
def user_conf(cluster, tmp_path_factory):
    """The cluster's client config, somewhere every user can read it (the checkout may not be)."""
    import shutil

    from live import share
    d = tmp_path_factory.mktemp("slurm-etc")
    shutil.copy(cluster.conf, d / "slurm.conf")
    os.chmod(d / "slurm.conf", 0o644)
    return share(d / "slurm.conf")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed live test shows the tail of each daemon log it wrote (the daemon's account
    of why it did what it did), since CI keeps only the test output."""
    outcome = yield
    report = outcome.get_result()
    tmp = item.funcargs.get("tmp_path") if hasattr(item, "funcargs") else None
    if not report.failed or tmp is None or item.get_closest_marker("live") is None:
        return
    for log in sorted(tmp.glob("*.log")):
        lines = log.read_text(errors="replace").splitlines()[-60:]
        report.sections.append((f"{log.name} (last {len(lines)} lines)", "\n".join(lines)))


@pytest.fixture
def shared_dir():
    """A world-searchable directory in /tmp (like a scratch area), so that only ownership and
    modes decide what the progress reader accepts (the progress-file tests)."""
    import shutil
    import tempfile
    d = tempfile.mkdtemp(prefix="mt-progress-", dir="/tmp")
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)
