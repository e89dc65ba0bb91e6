"""A login node with systemd as PID 1, for the service test (``tests/test_service_live.py``).

A minimal Debian trixie root (systemd, dbus, Python, and Slurm 24.11's clients, which must
match the 24.11 cluster's slurmctld) is built once with debootstrap and cached beside
``local-slurm.sh``'s roots, as ``$MALLETRAIN_SLURM_ROOTS/trixie-systemd``.  ``systemd-nspawn
--boot`` runs it on the host's network, on a tmpfs overlay (``--volatile=overlay``): what a test
installs is gone when the container stops, and the cached root stays as built.

What the container shares with the host: the host's munge socket (the cluster's munged: the
container runs none), the host's CA certificates (pip reaches PyPI through the same trust
as the host) and the read-only binds the caller names (the cluster's directory, ``/home``,
the checkout).  Accounts the host's Slurm knows are copied in with their host uids, since
munge credentials carry uids.  Commands run inside with ``nsenter`` on the container's PID 1.
"""
from __future__ import annotations

import grp
import os
import pwd
import shutil
import signal
import subprocess
import time

ROOTS = os.environ.get("MALLETRAIN_SLURM_ROOTS", "/var/cache/malletrain/roots")
SUITE = "trixie"
PACKAGES = ("systemd", "systemd-sysv", "dbus", "python3", "python3-venv", "slurm-client")
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# what pip and Python's ssl read from the environment on the host (a proxy, a CA bundle)
_PASS_ENV = ("PIP_CERT", "PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_DEFAULT_TIMEOUT", "SSL_CERT_FILE",
             "REQUESTS_CA_BUNDLE", "http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "no_proxy")


def _apt_install(*packages: str) -> None:
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "install", "-y", "-qq", *packages], env=env, check=True,
                   capture_output=True, timeout=600)


def build_root(roots: str = ROOTS) -> str:
    """The cached container root (built with debootstrap on first use, about a minute)."""
    root = os.path.join(roots, f"{SUITE}-systemd")
    done = os.path.join(root, "etc", "malletrain-container-root")
    if os.path.exists(done):
        return root
    missing = [pkg for pkg, tool in (("debootstrap", "debootstrap"), ("systemd-container", "systemd-nspawn"))
               if shutil.which(tool) is None]
    if missing:
        _apt_install(*missing)
    tmp = root + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(roots, exist_ok=True)
    mirror = os.environ.get("MALLETRAIN_DEBIAN_MIRROR", "http://deb.debian.org/debian")
    with open(os.path.join(roots, f"{SUITE}-systemd.log"), "w") as log:
        subprocess.run(["debootstrap", "--variant=minbase", "--include=" + ",".join(PACKAGES), SUITE, tmp, mirror],
                       stdout=log, stderr=subprocess.STDOUT, check=True, timeout=1200)
    # the cluster's munged serves the container through the bound socket: never start one inside
    os.symlink("/dev/null", os.path.join(tmp, "etc/systemd/system/munge.service"))
    # local-slurm.sh's 24.11 cluster names its plugins by its own root's path (PluginDir in
    # slurm.conf): inside the container that path is the container's own, identical, plugins
    link = os.path.join(tmp, os.path.join(roots, SUITE).lstrip("/"))
    os.makedirs(os.path.dirname(link), exist_ok=True)
    os.symlink("/", link)
    with open(os.path.join(tmp, "etc", "malletrain-container-root"), "w") as fh:
        fh.write(f"debootstrap {SUITE}: {' '.join(PACKAGES)}\n")
    os.rename(tmp, root)
    return root


class Container:
    """One booted container: ``boot()``, ``sh(...)``, ``systemctl(...)``, ``write``/``read``
    of files inside, ``down()``.  Use as a context manager."""

    def __init__(self, root: str, log_path: str, *, ro_binds: tuple[str, ...] = (),
                 name: str = "malletrain-svc") -> None:
        self.root, self.log_path, self.name = root, log_path, name
        self.ro_binds = ro_binds
        self.proc: subprocess.Popen | None = None
        self.pid = 0            # the container's PID 1 (systemd), as the host sees it

    # ---------------------------------------------------------------- lifecycle
    def boot(self, timeout_s: float = 90) -> None:
        argv = ["systemd-nspawn", "-q", "-D", self.root, "--volatile=overlay", "--register=no", "--keep-unit",
                "--boot", f"--machine={self.name}", "--console=read-only", "--bind=/run/munge",
                "--bind-ro=/etc/ssl/certs", *(f"--bind-ro={p}" for p in self.ro_binds)]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"systemd-nspawn exited {self.proc.returncode}; see {self.log_path}")
            if not self.pid:
                self.pid = self._init_pid()
            if self.pid:
                state = self.sh("systemctl", "is-system-running", check=False).stdout.strip()
                if state in ("running", "degraded"):
                    return
            time.sleep(0.5)
        raise RuntimeError(f"the container did not boot in {timeout_s:.0f}s; see {self.log_path}")

    def _init_pid(self) -> int:
        assert self.proc is not None
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    stat = fh.read()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == self.proc.pid and stat.split("(", 1)[1].startswith("systemd)"):
                return int(entry)
        return 0

    def down(self, timeout_s: float = 60) -> None:
        """Power the container off (SIGTERM to nspawn: an orderly shutdown), killing it if it hangs."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)

    def __enter__(self) -> Container:
        self.boot()
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    # ---------------------------------------------------------------- inside
    def sh(self, *argv: str, check: bool = True, timeout_s: float = 300) -> subprocess.CompletedProcess:
        """Run ``argv`` inside (as root, in all of the container's namespaces)."""
        env = {"PATH": _PATH, "LANG": "C.UTF-8", "HOME": "/root",
               **{k: os.environ[k] for k in _PASS_ENV if k in os.environ}}
        out = subprocess.run(["nsenter", "-t", str(self.pid), "-m", "-u", "-i", "-n", "-p", "--", *argv],
                             env=env, capture_output=True, text=True, timeout=timeout_s)
        if check and out.returncode != 0:
            raise RuntimeError(f"in the container: {' '.join(argv)} exited {out.returncode}\n"
                               f"{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
        return out

    def systemctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return self.sh("systemctl", "--no-pager", *args, check=check)

    def show(self, unit: str, *props: str) -> dict[str, str]:
        out = self.systemctl("show", unit, *(f"--property={p}" for p in props)).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def path(self, inside: str) -> str:
        """The host's path of a file inside the container (through its PID 1's root)."""
        return f"/proc/{self.pid}/root/{inside.lstrip('/')}"

    def write(self, inside: str, text: str, mode: int = 0o644) -> None:
        host = self.path(inside)
        os.makedirs(os.path.dirname(host), exist_ok=True)
        with open(host, "w") as fh:
            fh.write(text)
        os.chmod(host, mode)

    def copy_in(self, src: str, inside: str) -> None:
        shutil.copy(src, self.path(inside))

    def add_account(self, name: str) -> None:
        """The host's system account ``name``, with its host uid and gid (as a site's NSS gives it)."""
        pw = pwd.getpwnam(name)
        group = grp.getgrgid(pw.pw_gid).gr_name
        self.sh("groupadd", "--system", "-g", str(pw.pw_gid), group)
        self.sh("useradd", "--system", "-u", str(pw.pw_uid), "-g", str(pw.pw_gid), "--no-create-home",
                "--home-dir", pw.pw_dir, "--shell", "/usr/sbin/nologin", name)
