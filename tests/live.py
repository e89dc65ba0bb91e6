"""Helpers for the tests that run against the real local Slurm cluster."""
from __future__ import annotations

import ctypes
import json
import os
import signal
import struct
import subprocess
import sys
import time

from devtools.local_slurm import LocalSlurm
from malletrain.slurm.submit import build_submission

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TEST_PORT = int(os.environ.get("MALLETRAIN_TEST_SLURM_PORT", "7817"))
# The Slurm releases the live tests meet: the host's packages (Debian 12: 22.05) and the
# two newer ones scripts/local-slurm.sh runs from cached Debian roots.  Each has its own
# directory and ports, so a failed teardown of one never blocks the next.
VERSIONS = ("host", "24.11", "26.05")
_PORT_OFFSET = {"host": 0, "22.05": 20, "24.11": 40, "26.05": 60}
GRACE_S = 10
TEST_USERS = ("mt-alice", "mt-mallory")     # created by the hostile-user tests
OPERATOR = "malletrain"     # the service account: a Slurm operator (slurmdbd), never root
# The run's own temporary directory (pytest's basetemp; tests/conftest.py sets it).  The live
# tests open it, and only it, to the operator account and the test users: the checkout may sit
# where only root can enter (/root, a 0700 directory), and no test changes the mode of anything
# outside the checkout and this directory.
OWN_TMP: str | None = None


def own_tmp() -> str:
    assert OWN_TMP, "tests/conftest.py sets live.OWN_TMP (pytest's basetemp) before any live test"
    return OWN_TMP


def cluster_dir(name: str = "host") -> str:
    """Where a test cluster lives: in the run's own temporary directory (never the checkout, which
    other accounts may not be able to enter), or below $MALLETRAIN_TEST_SLURM_DIR."""
    base = os.environ.get("MALLETRAIN_TEST_SLURM_DIR") or os.path.join(own_tmp(), "slurm")
    return base if name == "host" else f"{base}-{name}"


def share(path) -> str:
    """Let other accounts reach ``path``, which must lie in the run's own temporary directory:
    o+rx on it when it is a directory, o+x on each directory from it up to that temporary
    directory.  Directories above are never changed: each must already let others through
    (``/tmp`` does), or this fails saying which one does not."""
    path = os.path.abspath(str(path))
    top = own_tmp()
    inside = path == top or path.startswith(top + os.sep)
    if inside and os.path.isdir(path):
        os.chmod(path, os.stat(path).st_mode | 0o005)
    p = path if os.path.isdir(path) else os.path.dirname(path)
    while p != os.sep:
        mode = os.stat(p).st_mode
        if inside and (p == top or p.startswith(top + os.sep)):
            if not mode & 0o001:
                os.chmod(p, mode | 0o001)
        elif not mode & 0o001:
            raise AssertionError(f"{p} (above {path}) does not let other accounts through; the live tests "
                                 "never change it: run them with --basetemp in a directory others can pass "
                                 "(scripts/test.sh does)")
        p = os.path.dirname(p)
    return path


def _run(argv, **kw) -> subprocess.CompletedProcess:
    out = subprocess.run(argv, capture_output=True, text=True, timeout=kw.pop("timeout", 900), **kw)
    assert out.returncode == 0, f"{' '.join(map(str, argv))}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


def build_wheel(where) -> str:
    """A wheel built from a copy of the checkout's files (tracked and not ignored): no stale
    build/ and nothing written into the checkout."""
    import shutil
    src = os.path.join(str(where), "src", "malletrain")
    files = _run(["git", "-C", ROOT, "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
                 ).stdout.split("\0")
    for f in filter(None, files):
        if os.path.isfile(os.path.join(ROOT, f)):
            os.makedirs(os.path.dirname(os.path.join(src, f)), exist_ok=True)
            shutil.copy2(os.path.join(ROOT, f), os.path.join(src, f))
    out = os.path.join(str(where), "wheel")
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", out, src])
    (whl,) = [f for f in os.listdir(out) if f.endswith(".whl")]
    return os.path.join(out, whl)


def install(wheel: str, venv) -> list[str]:
    """A fresh venv with only the wheel and its dependencies, of a Python every account can run
    (the system's /usr/bin/python3 where there is one: this checkout's interpreter may live
    under /root), reachable by the operator account.  Returns the ``malletrain`` argv."""
    py = "/usr/bin/python3"
    if not (os.path.exists(py) and os.stat(os.path.realpath(py)).st_mode & 0o001):
        py = sys.executable
    _run([py, "-m", "venv", str(venv)])
    _run([os.path.join(str(venv), "bin", "python"), "-m", "pip", "install", "-q", wheel])
    share(venv)
    return [os.path.join(str(venv), "bin", "malletrain")]


def install_for_operator(where) -> list[str]:
    """The daemon as a centre installs it (a wheel in a venv, never this checkout), where the
    operator account can run it.  Returns the ``malletrain`` argv."""
    return install(build_wheel(where), os.path.join(str(where), "venv"))


def wait_until(pred, timeout_s: float, what: str, poll_s: float = 0.5):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")


class Cluster(LocalSlurm):
    """The test cluster of one Slurm release, with accounting (the daemon is an operator)."""

    def __init__(self, version: str = "host") -> None:
        self.version = version
        super().__init__(cluster_dir(version), TEST_PORT + _PORT_OFFSET[version])
        self.release = ""      # what sinfo --version says, e.g. "24.11.5"
        self.operator: list[str] | None = None   # the daemon's argv as the operator (conftest)

    @property
    def job_python(self) -> str:
        """The Python a job runs: this one on the host's Slurm; the Debian root's own
        (stdlib only, PYTHONPATH=this checkout) where slurmd runs chrooted in one."""
        return sys.executable if self.version == "host" else "/usr/bin/python3"

    def up(self, *args: str) -> None:
        super().up("--slurm", self.version, "--accounting", "--nodes", "4", "--grace", str(GRACE_S), *args)
        self.release = self.sh("sinfo", "--version").split()[-1]
        share(os.path.join(self.dir, "bin"))    # the operator account runs these commands
        share(self.conf)

    def add_user(self, name: str) -> None:
        """An association for a user created after the cluster came up."""
        self.script("add-user", name)

    def runner(self, **kw):
        """A Runner on this cluster's own client commands."""
        from malletrain.slurm.runner import Runner
        return Runner(slurm_conf=self.conf, bin_dir=self.bin, **kw)

    def sh(self, *argv: str, check: bool = True) -> str:
        out = subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=60)
        if check and out.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {out.stderr}")
        return out.stdout

    def as_operator(self, *argv: str) -> None:
        """Run a command of this cluster as the operator account (the daemon's rights); it must
        succeed."""
        out = subprocess.run(["setpriv", f"--reuid={OPERATOR}", f"--regid={OPERATOR}", "--init-groups", "--", *argv],
                             env=self.env, capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, (argv, out.stderr)

    def jobs(self) -> dict[str, dict]:
        """Every queued job's Slurm-written fields (user text never enters this read)."""
        out = self.sh("squeue", "-h", "-a", "-o", "%i|%P|%T|%r|%N|%S|%u")
        res = {}
        for line in out.splitlines():
            jid, part, state, reason, nodes, start, user = line.split("|")
            res[jid] = dict(partition=part, state=state, reason=reason, nodes=nodes, start=start, user=user)
        return res

    def comment(self, jid: str) -> str:
        """One job's comment, read alone (whatever it holds)."""
        from malletrain.slurm.parse import TAG_FORMAT, parse_tag_record
        rec = parse_tag_record(jid, self.sh("squeue", "-h", "-j", jid, "-o", TAG_FORMAT, check=False))
        return rec.comment if rec else ""

    def job_times(self, jid: str) -> dict:
        out = self.sh("scontrol", "-o", "show", "job", jid)
        kv = dict(tok.split("=", 1) for tok in out.split() if "=" in tok)
        return {k: kv.get(k) for k in ("JobState", "StartTime", "EndTime", "NodeList", "Restarts")}

    def clean(self) -> None:
        for user in ("root", *TEST_USERS):
            self.sh("scancel", "--full", "-u", user, check=False)
            self.sh("scancel", "-u", user, check=False)
        wait_until(lambda: not any(j["state"] in ("RUNNING", "COMPLETING", "CONFIGURING")
                                   for j in self.jobs().values()), 60, "jobs to end")
        wait_until(lambda: self.sh("sinfo", "-h", "-N", "-p", "scavenger", "-o", "%T").split()
                   == ["idle"] * 4, 60, "all nodes idle")

    def submit_synth(self, tmp, name: str, *, lo=1, hi=4, work=1e9, rate=100.0, alpha=0.1,
                     checkpoint_s=0.0, up=2, down=1, malletrain: list[str] | None = None,
                     faults: list[str] = ()) -> str:
        """Submit the synthetic job with ``malletrain submit`` (this checkout's, or the
        argv prefix ``malletrain`` of an installed copy, run without this checkout on its path)."""
        installed = malletrain is not None
        env = dict(self.env) if installed else dict(self.env, PYTHONPATH=ROOT)
        job_env = ["env", f"PYTHONPATH={ROOT}"] if installed else []
        out = subprocess.run(
            [*(malletrain or [sys.executable, "-m", "malletrain"]), "submit", "--launch", "batch",
             "--name", name, "--min-nodes", str(lo),
             "--max-nodes", str(hi), "--rescale-up", str(up), "--rescale-down", str(down),
             "--metrics-dir", str(tmp / "metrics"), "--",
             *job_env, self.job_python, "-m", "devtools.synthjob", "--work", str(work), "--rate", str(rate),
             "--alpha", str(alpha), "--checkpoint", str(tmp / f"{name}.ckpt"),
             "--checkpoint-s", str(checkpoint_s), "--startup-s", "0.5", "--report-s", "0.3", *faults],
            env=env, cwd=str(tmp) if installed else None, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        return out.stdout.strip()


class DaemonProc:
    """``malletrain daemon`` as a subprocess, as systemd would run it: as the unprivileged
    operator account, from an installed copy (the cluster's, or ``malletrain``)."""

    def __init__(self, tmp, cluster: Cluster, *, interval_s=2.0, vacate_lead_s=60.0,
                 name="daemon", extra: dict | None = None, env: dict | None = None,
                 malletrain: list[str] | None = None) -> None:
        self.argv = malletrain or cluster.operator
        assert self.argv, "the cluster fixture installs the daemon for the operator account"
        self.extra_env = env or {}
        self.tmp, self.cluster = tmp, cluster
        self.state_dir = tmp / "state"
        self.config = tmp / f"{name}.yaml"
        self.log_path = tmp / f"{name}.log"
        cfg = {"core": {"horizon_s": 300, "min_dwell_s": 4},
               "slurm": {"slurm_conf": cluster.conf, "bin_dir": cluster.bin, "command_timeout_s": 5, "retries": 1,
                         "backoff_s": 0.3},
               "daemon": {"interval_s": interval_s, "state_dir": str(self.state_dir),
                          "metrics_port": 0, "vacate_lead_s": vacate_lead_s, "rescale_wait_s": 30,
                          "start_timeout_s": 30, "progress_roots": ["/tmp"]}}
        for sec, vals in (extra or {}).items():
            cfg[sec].update(vals)
        import yaml
        self.config.write_text(yaml.safe_dump(cfg))
        self.proc = None
        import pwd
        op = pwd.getpwnam(OPERATOR)
        self.state_dir.mkdir(exist_ok=True)
        os.chown(self.state_dir, op.pw_uid, op.pw_gid)
        share(tmp)
        os.chmod(self.config, 0o644)

    def start(self) -> DaemonProc:
        self.log = open(self.log_path, "a")
        env = dict(self.cluster.env, **self.extra_env, HOME=str(self.state_dir))
        env.pop("PYTHONPATH", None)
        # setpriv execs (no child left behind by a signal to a wrapper): kill -9 hits the daemon
        self.proc = subprocess.Popen(["setpriv", f"--reuid={OPERATOR}", f"--regid={OPERATOR}", "--init-groups",
                                      "--", *self.argv, "daemon", "--config", str(self.config)],
                                     stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=str(self.state_dir))
        return self

    def uid(self) -> int:
        """The real uid the daemon process runs as (once setpriv has exec'd it)."""
        def cmdline() -> bytes:
            with open(f"/proc/{self.proc.pid}/cmdline", "rb") as fh:
                return fh.read()
        wait_until(lambda: b"daemon" in cmdline() and not cmdline().startswith(b"setpriv"), 30,
                   "the daemon to start")
        with open(f"/proc/{self.proc.pid}/status") as fh:
            return int(next(x for x in fh if x.startswith("Uid:")).split()[1])

    def lines(self) -> list[dict]:
        out = []
        for line in self.log_path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                out.append({"msg": line})
        return out

    def status(self):
        """The daemon's last status (a DaemonStatus), None before the first one."""
        from malletrain.daemon.status import read_status
        from malletrain.domain.errors import InputError
        try:
            return read_status(str(self.state_dir / "status.json"))
        except InputError:
            return None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, sig=signal.SIGTERM, timeout_s=60) -> int:
        if self.alive():
            self.proc.send_signal(sig)
            self.proc.wait(timeout_s)
        if self.proc is None:
            return 0
        self.log.close()
        return self.proc.returncode


def metrics_records(tmp, job: str) -> list[dict]:
    path = tmp / "metrics" / f"{job}.jsonl"
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue   # the tests write garbage lines on purpose
        if isinstance(rec, dict) and "event" in rec:
            out.append(rec)
    return out


class OpenWatch:
    """Linux inotify on canary files: which of them did anyone open or read while watched?

    The hostile-user test plants canaries where a progress path could lead the daemon
    (another user's private file, a path outside the roots…) and asserts none is opened.
    """

    IN_ACCESS, IN_OPEN = 0x1, 0x20

    def __init__(self) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        self.fd = self._libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self.paths: dict[int, str] = {}
        self.seen: set[str] = set()

    def add(self, path: str) -> str:
        wd = self._libc.inotify_add_watch(self.fd, os.fsencode(path), self.IN_ACCESS | self.IN_OPEN)
        if wd < 0:
            raise OSError(ctypes.get_errno(), f"inotify_add_watch {path}")
        self.paths[wd] = path
        return path

    def opened(self) -> set[str]:
        while True:
            try:
                buf = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                break
            i = 0
            while i + 16 <= len(buf):
                wd, mask, _cookie, length = struct.unpack_from("iIII", buf, i)
                if mask & (self.IN_ACCESS | self.IN_OPEN) and wd in self.paths:
                    self.seen.add(self.paths[wd])
                i += 16 + length
        return set(self.seen)

    def close(self) -> None:
        os.close(self.fd)


class User:
    """Commands run as one unprivileged user (runuser), in their home."""

    def __init__(self, pw, conf: str, bin_dir: str = "") -> None:
        self.pw, self.conf, self.bin_dir = pw, conf, bin_dir     # bin_dir: the cluster's clients
        self.home = pw.pw_dir
        self.uid = pw.pw_uid

    def run(self, *argv: str, check: bool = True) -> str:
        path = f"{self.bin_dir}:{os.environ['PATH']}" if self.bin_dir else os.environ["PATH"]
        out = subprocess.run(["runuser", "-u", self.pw.pw_name, "--", "env", f"SLURM_CONF={self.conf}",
                              f"HOME={self.home}", f"PATH={path}", *argv], capture_output=True, text=True, timeout=60,
                             cwd=self.home)
        if check and out.returncode != 0:
            raise RuntimeError(f"{argv} as {self.pw.pw_name}: {out.stderr}")
        return out.stdout

    def write(self, rel: str, text: str | bytes, mode: int = 0o644) -> str:
        path = os.path.join(self.home, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(text.encode() if isinstance(text, str) else text)
        os.chmod(path, mode)
        for p in (path, *self._parents(path)):
            os.chown(p, self.uid, self.pw.pw_gid)
        return path

    def mkdir(self, rel: str, mode: int = 0o755) -> str:
        path = os.path.join(self.home, rel)
        os.makedirs(path, exist_ok=True)
        os.chmod(path, mode)
        for p in (path, *self._parents(path)):
            os.chown(p, self.uid, self.pw.pw_gid)
        return path

    def _parents(self, path: str):
        p = os.path.dirname(path)
        while p.startswith(self.home + "/"):
            yield p
            p = os.path.dirname(p)

    def sbatch(self, *args: str) -> str:
        return self.run("sbatch", "--parsable", *args).strip().split(";")[0]


def honest_job(alice: User, name: str, alpha: float) -> str:
    """A malleable job of this user: the synthetic job (stdlib only) under the shipped template."""
    synth = alice.write("mt/synthjob.py", open(os.path.join(ROOT, "devtools", "synthjob.py")).read())
    metrics = alice.mkdir("mt/metrics")
    token = f"alice{name}"
    script = os.path.join(alice.home, "mt", f"{name}.sbatch")
    argv, text = build_submission(
        ["/usr/bin/python3", synth, "--work", "1e9", "--rate", "100", "--alpha", str(alpha),
         "--checkpoint", os.path.join(alice.home, "mt", f"{name}.ckpt"), "--startup-s", "0.5",
         "--report-s", "0.3"],
        name=name, min_nodes=1, max_nodes=4, gpus_per_node=0, profile="synth", time_limit=None,
        rescale_up_s=2, rescale_down_s=1, metrics_dir=metrics, partition="scavenger", token=token,
        script_path=script, launch="batch")
    alice.write(f"mt/{name}.sbatch", text, 0o755)
    return alice.sbatch(*argv[2:])
