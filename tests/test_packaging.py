"""The wheel, installed (not editable) into a fresh venv, is what a centre runs.

Build it, install it, and use that install — from a directory outside this
checkout, with nothing of the checkout on its path — for a replay of the
shipped example and (as root, against the local Slurm cluster) the daemon,
``submit`` and ``campaign`` paths.
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import zipfile

import pytest
from live import Cluster, DaemonProc, wait_until

pytestmark = [pytest.mark.packaging, pytest.mark.slow]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(argv, **kw):
    out = subprocess.run(argv, capture_output=True, text=True, timeout=kw.pop("timeout", 900), **kw)
    assert out.returncode == 0, f"{' '.join(map(str, argv))}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """Built from a copy of the tracked files: no stale build/ and nothing written here."""
    from live import build_wheel
    return pathlib.Path(build_wheel(tmp_path_factory.mktemp("build")))


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory):
    """``malletrain`` argv of a fresh venv with only the wheel and its dependencies."""
    from live import install
    return install(str(wheel), tmp_path_factory.mktemp("venv") / "v")


def test_the_wheel_installs_one_import_name_with_its_data(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert tops == {"malletrain"}, tops
    for must in ("malletrain/py.typed", "malletrain/slurm/templates/malleable.sbatch",
                 "malletrain/jpa/advisor.py", "malletrain/milp/lp.py", "malletrain/slurm/submit.py"):
        assert must in names, must
    assert not any(n.startswith(("devtools/", "tests/")) for n in names)


def test_installed_copy_replays_the_shipped_example(installed, tmp_path):
    out = tmp_path / "out"
    run([*installed, "replay", "--trace", os.path.join(ROOT, "examples", "philly-1day.csv.gz"),
         "--workload", os.path.join(ROOT, "examples", "workload-pollux.yaml"), "--policy", "static",
         "--noise", "0.05", "--out", str(out), "--quiet"], cwd=str(tmp_path))
    got = json.loads((out / "summary.json").read_text())
    want = json.loads(open(os.path.join(ROOT, "tests", "golden", "replay", "v2", "philly-1day-static.json")).read())
    assert {k: got[k] for k in want} == want
    assert (out / "nodes.png").stat().st_size > 0
    where = run([os.path.join(os.path.dirname(installed[0]), "python"), "-c",
                 "import malletrain.slurm.submit as s; print(s.__file__); print(len(s.read_template()))"],
                cwd=str(tmp_path)).stdout.split()
    assert "site-packages" in where[0] and int(where[1]) > 100


@pytest.mark.live
def test_installed_copy_submits_runs_and_campaigns_on_real_slurm(installed, tmp_path):
    if os.geteuid() != 0:
        pytest.fail("the real-Slurm tests need root (slurmd); run the test command as root")
    cluster = Cluster()
    cluster.up()
    cluster.clean()
    trial = tmp_path / "trial.py"
    trial.write_text(
        "import argparse, json, os\n"
        "p = argparse.ArgumentParser(); p.add_argument('--params'); p.add_argument('--ckpt')\n"
        "a = p.parse_args(); x = json.load(open(a.params))['x']\n"
        "os.makedirs(a.ckpt, exist_ok=True)\n"
        "json.dump({'score': x * x, 'final': True}, open(os.path.join(a.ckpt, 'result.json'), 'w'))\n")
    spec = tmp_path / "camp.yaml"
    spec.write_text(json.dumps({
        "name": "pkg", "kind": "hpo", "command": [sys.executable, str(trial)], "dir": str(tmp_path / "camp"),
        "search": "grid", "metric": "score", "goal": "max", "space": {"x": [1, 3]},
        "job": {"min_nodes": 1, "max_nodes": 1, "launch": "batch", "rescale_up_s": 1, "rescale_down_s": 1}}))
    d = DaemonProc(tmp_path, cluster, malletrain=installed)
    try:
        job = cluster.submit_synth(tmp_path, "pkg", hi=2, work=400, rate=100.0, malletrain=installed)
        (script,) = (tmp_path / "metrics").glob("job-*.sbatch")
        text = script.read_text()                # the packaged template, filled in
        assert "MALLETRAIN_METRICS=" in text and "{{launch}}" not in text and "devtools.synthjob" in text
        env = dict(cluster.env)
        run([*installed, "campaign", "submit", str(spec)], env=env, cwd=str(tmp_path), timeout=120)
        d.start()

        def done():
            st = d.status()
            rows = json.loads(run([*installed, "campaign", "status", "--json", str(spec)], env=env,
                                  cwd=str(tmp_path), timeout=60).stdout)
            gone = job not in cluster.jobs()
            return gone and all(r["state"] == "done" for r in rows) and st is not None and rows
        rows = wait_until(done, 240, "the synthetic job and both trials to finish")
        assert sorted(r["metric"] for r in rows) == [1, 9]
        status = run([*installed, "status", "--state-dir", str(d.state_dir)], env=env,
                     cwd=str(tmp_path), timeout=60).stdout
        assert "cycle" in status
    finally:
        d.stop()
        cluster.clean()
        cluster.script("down")
