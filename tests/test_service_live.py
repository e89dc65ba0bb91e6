"""The systemd service as a centre installs it, under a real systemd (SECURITY.md, README
"Running as a service").

A Debian trixie container booted by ``systemd-nspawn`` is the login node: systemd 257 as PID 1,
Slurm 24.11's clients, the host's network.  It reaches the local 24.11 cluster (accounting on,
``malletrain`` an operator) through the bound munge socket.  Inside it,
``scripts/install-service.sh --wheel`` installs a wheel of this checkout exactly as the README
tells a centre to; the ``malletrain`` account comes from the host with its uid, as a site's
directory service would give it.  Then, through ``systemctl`` and the journal:

- ``start`` reaches READY (Type=notify), the status line counts cycles, the journal holds the
  daemon's JSON lines, the process runs as ``malletrain`` with no capability;
- ``reload`` applies a valid change; a bad file fails the reload and the daemon keeps its config
  (a raw SIGHUP with a bad file too);
- under the unit's hardening (ProtectSystem=strict, ProtectHome=read-only, PrivateTmp, no
  capabilities) the daemon harvests: it starts an ordinary user's job, reads her progress file
  in her home, serves its metrics, and writes nothing outside ``/var/lib/malletrain``;
- the watchdog restarts a daemon that hangs (SIGSTOP), and the job keeps running meanwhile;
- ``stop`` leaves every malleable job as it is.
"""
from __future__ import annotations

import json
import os
import pwd
import socket
import time
import urllib.request

import pytest
from live import OPERATOR, ROOT, TEST_USERS, User, build_wheel, honest_job, wait_until

from devtools.service_container import Container, build_root

pytestmark = [pytest.mark.slow, pytest.mark.live]

UNIT = "malletrain.service"
METRICS_PORT = 9687          # the installed default; the container shares the host's network
CONFIG = "/etc/malletrain/config.yaml"
STATE = "/var/lib/malletrain"
SLURM_CONF = "/etc/slurm-cluster/slurm.conf"     # inside the container


def _config(cluster, interval_s: float) -> str:
    """The service's config for the test: the installed defaults, a short interval, homes as
    the only progress root."""
    return (f"core: {{policy: malletrain, horizon_s: 300, min_dwell_s: 4}}\n"
            f"slurm: {{partition: scavenger, slurm_conf: {SLURM_CONF}, command_timeout_s: 10}}\n"
            f"daemon: {{interval_s: {interval_s:g}, state_dir: {STATE}, metrics_port: {METRICS_PORT}, "
            f"vacate_lead_s: 60, rescale_wait_s: 30, start_timeout_s: 30, progress_roots: [/home]}}\n")


class Service:
    """The unit inside the container, seen through systemctl and the journal."""

    def __init__(self, box: Container) -> None:
        self.box = box

    def show(self) -> dict[str, str]:
        return self.box.show(UNIT, "ActiveState", "SubState", "MainPID", "StatusText", "NRestarts", "Result")

    def main_pid(self) -> int:
        return int(self.show()["MainPID"])

    def status(self) -> str:
        return self.show()["StatusText"]

    def cycling(self, interval_s: float) -> bool:
        s = self.show()
        return s["ActiveState"] == "active" and s["StatusText"].startswith("cycle ") and \
            f"(every {interval_s:g}s)" in s["StatusText"]

    def journal(self, since_pid: int | None = None) -> list[dict]:
        """The journal's entries of the unit (newest last), as journalctl's JSON records."""
        out = self.box.sh("journalctl", "-u", UNIT, "-o", "json", "--no-pager").stdout
        recs = [json.loads(line) for line in out.splitlines() if line.strip()]
        return [r for r in recs if since_pid is None or r.get("_PID") == str(since_pid)]

    def daemon_lines(self, pid: int) -> list[dict]:
        """What the daemon process ``pid`` wrote: every line must be one JSON object."""
        lines = []
        for rec in self.journal(pid):
            msg = rec["MESSAGE"]
            if isinstance(msg, list):        # journald stores non-UTF-8 text as bytes
                msg = bytes(msg).decode("utf-8", "replace")
            lines.append(json.loads(msg))
        return lines

    def messages(self) -> str:
        out = self.box.sh("journalctl", "-u", UNIT, "-o", "cat", "--no-pager").stdout
        return out

    def status_json(self) -> dict:
        with open(self.box.path(f"{STATE}/status.json")) as fh:
            return json.load(fh)


@pytest.fixture(scope="module")
def service(cluster, tmp_path_factory):
    """The container, booted, with the service installed by install-service.sh."""
    with socket.socket() as s:
        if s.connect_ex(("127.0.0.1", METRICS_PORT)) == 0:
            pytest.fail(f"port {METRICS_PORT} (the service's default metrics port) is taken on this host")
    tmp = tmp_path_factory.mktemp("service")
    wheel = build_wheel(tmp)
    root = build_root()
    with Container(root, str(tmp / "container.log"), ro_binds=(ROOT, cluster.dir, "/home")) as box:
        box.add_account(OPERATOR)
        box.copy_in(wheel, "/root/" + os.path.basename(wheel))
        # the cluster's client config, where a login node keeps it: the unit's PrivateTmp would hide
        # a checkout (and so the test cluster's directory) under /tmp from the service
        os.makedirs(box.path(os.path.dirname(SLURM_CONF)), exist_ok=True)
        for name in ("slurm.conf", "cgroup.conf", "gres.conf"):
            src = os.path.join(os.path.dirname(cluster.conf), name)
            if os.path.exists(src):
                box.copy_in(src, os.path.join(os.path.dirname(SLURM_CONF), name))
        box.sh("bash", os.path.join(ROOT, "scripts", "install-service.sh"), "--wheel",
               "/root/" + os.path.basename(wheel), "--slurm-conf", SLURM_CONF, timeout_s=600)
        yield Service(box)
        box.systemctl("stop", UNIT, check=False)


@pytest.mark.parametrize("cluster", ["24.11"], indirect=True)
def test_the_service_under_real_systemd(cluster, service, users, user_conf):
    box, svc = service.box, service
    assert box.systemctl("is-enabled", UNIT).stdout.strip() == "enabled"

    # ---- start: READY, cycles in the status line, JSON lines in the journal, the account
    try:
        wait_until(lambda: svc.cycling(10), 60, "the installed service (defaults: every 10 s) to cycle")
    except AssertionError as exc:      # say what the unit did
        raise AssertionError(f"{exc}; unit {svc.show()}; journal: {svc.messages()[-3000:]}") from None
    pid = svc.main_pid()
    lines = wait_until(lambda: [r for r in svc.daemon_lines(pid) if r.get("slurm_release")], 30,
                       "the daemon's 'Slurm 24.11' line in the journal")
    assert lines[0]["slurm_release"].startswith("24.11.")
    assert all({"t", "level", "logger", "msg", "cycle"} <= set(r) for r in svc.daemon_lines(pid))
    status = box.sh("cat", f"/proc/{pid}/status").stdout      # pid: in the container's namespace
    proc = dict(line.split(":", 1) for line in status.splitlines())
    operator = pwd.getpwnam(OPERATOR)
    assert proc["Uid"].split() == [str(operator.pw_uid)] * 4
    assert int(proc["CapEff"], 16) == 0 and int(proc["CapBnd"], 16) == 0 and proc["NoNewPrivs"].strip() == "1"

    # ---- reload: a valid change applies; a bad file fails the reload and changes nothing
    box.write(CONFIG, _config(cluster, 2))
    box.systemctl("reload", UNIT)
    wait_until(lambda: svc.cycling(2), 30, "the reloaded interval (2 s) in the status line")
    assert svc.main_pid() == pid
    assert any(r["msg"].startswith("config reloaded") for r in svc.daemon_lines(pid))
    box.write(CONFIG, _config(cluster, 2).replace("interval_s: 2", "interval_s: -5"))
    bad = box.systemctl("reload", UNIT, check=False)
    assert bad.returncode != 0, "a bad config must fail `systemctl reload`"
    assert "interval_s" in svc.messages()          # the config check named the field
    box.sh("kill", "-HUP", str(pid))                # a raw SIGHUP, bypassing the unit's check
    wait_until(lambda: any(r["msg"].startswith("reload failed, keeping the running config")
                           for r in svc.daemon_lines(pid)), 20, "the daemon to refuse the bad file")
    time.sleep(4)
    assert svc.cycling(2) and svc.main_pid() == pid and svc.show()["ActiveState"] == "active"
    box.write(CONFIG, _config(cluster, 2))

    # ---- under the hardening it harvests: an ordinary user's job, her progress file in her home
    alice = User(users[TEST_USERS[0]], user_conf, cluster.bin)
    job = honest_job(alice, "svc", 0.1)
    wait_until(lambda: cluster.jobs().get(job, {}).get("state") == "RUNNING", 60,
               "the service to start Alice's job on the idle nodes")

    def measured():
        jobs = {j["job"]: j for j in svc.status_json()["jobs"]}
        return job in jobs and jobs[job].get("measured") and jobs[job]["measured"]["samples_per_s"] > 0
    wait_until(measured, 60, "the service to read her progress file (ProtectHome=read-only)")
    wait_until(lambda: cluster.jobs()[job]["nodes"] == "n[1-4]", 90, "the job to grow to the 4 idle nodes")

    def scraped() -> str:
        return urllib.request.urlopen(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=10).read().decode()
    wait_until(lambda: "malletrain_allocated_nodes 4.0" in scraped(), 20,
               "its Prometheus endpoint to count the 4 nodes it gave the job")
    hardening = box.show(UNIT, "ProtectSystem", "ProtectHome", "PrivateTmp", "CapabilityBoundingSet",
                         "NoNewPrivileges")
    assert hardening["ProtectSystem"] == "strict" and hardening["ProtectHome"] == "read-only"
    assert hardening["PrivateTmp"] == "yes" and hardening["NoNewPrivileges"] == "yes"
    assert hardening["CapabilityBoundingSet"] == ""
    written = box.sh("find", "/", "/tmp", "/var/tmp", "-xdev", "-user", OPERATOR,
                     "-not", "-path", f"{STATE}*").stdout.split()
    assert written == [], f"the daemon wrote outside {STATE}: {written}"
    assert {"state.db", "status.json"} <= set(os.listdir(box.path(STATE)))

    # ---- the watchdog restarts a daemon that hangs; the job runs on meanwhile
    box.write("/etc/systemd/system/malletrain.service.d/watchdog-test.conf",
              "# the test's hang detector: shorter than the unit's 180 s\n"
              "[Service]\nWatchdogSec=15s\nTimeoutAbortSec=5s\nRestartSec=1s\n")
    box.systemctl("daemon-reload")
    box.systemctl("restart", UNIT)
    wait_until(lambda: svc.cycling(2), 60, "the restarted service to cycle")
    pid, restarts = svc.main_pid(), int(svc.show()["NRestarts"])
    before = cluster.job_times(job)
    box.sh("kill", "-STOP", str(pid))
    wait_until(lambda: svc.main_pid() not in (0, pid) and svc.cycling(2), 90,
               "systemd's watchdog to restart the hung daemon")
    assert int(svc.show()["NRestarts"]) == restarts + 1
    assert "Watchdog timeout" in svc.messages()
    after = cluster.job_times(job)
    assert (after["JobState"], after["NodeList"], after["Restarts"]) == \
        (before["JobState"], before["NodeList"], before["Restarts"]), "the job was touched by the restart"

    # ---- stop leaves every malleable job as it is
    pid = svc.main_pid()
    stopped_at = time.time()
    box.systemctl("stop", UNIT)
    assert svc.show()["ActiveState"] == "inactive" and svc.show()["Result"] == "success"
    assert any(r["msg"].startswith("stopping after cycle") for r in svc.daemon_lines(pid))
    time.sleep(6)                                   # three of its intervals
    later = cluster.job_times(job)
    assert (later["JobState"], later["NodeList"], later["Restarts"], later["StartTime"]) == \
        (after["JobState"], after["NodeList"], after["Restarts"], after["StartTime"])
    metrics_dir = os.path.join(alice.home, "mt", "metrics")
    newest = max(os.path.getmtime(os.path.join(metrics_dir, f)) for f in os.listdir(metrics_dir))
    assert newest > stopped_at + 3, "the job's process stopped writing progress after the service stopped"
