"""The folder tree is the architecture: which room may import which.

Rooms are the subpackages of ``malletrain`` (jpa/, milp/ and slurm/ install as
malletrain.jpa, .milp, .slurm).  Read from the source with ``ast``: every
import, including the ones inside functions.
"""
import ast
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# repository folder -> import name, as pyproject.toml maps them
FOLDERS = {"malletrain": "malletrain", "jpa": "malletrain.jpa", "milp": "malletrain.milp",
           "slurm": "malletrain.slurm"}
ROOMS = ("domain", "core", "jpa", "milp", "slurm", "replay", "daemon", "cli", "bench", "runtime",
         "campaign", "adapters")
# room -> rooms it may import (besides itself)
ALLOWED = {
    "domain": set(),
    "jpa": {"domain"},
    "milp": {"domain"},
    "core": {"domain", "jpa", "milp"},
    "slurm": {"domain", "core"},
    "replay": {"domain", "core"},
    "daemon": {"domain", "core", "slurm"},
    "runtime": {"domain", "campaign"},     # a trial's reports to its study (campaign.trial)
    "campaign": {"domain"},
    "adapters": {"domain", "runtime", "campaign"},      # campaign: a trial's reports to its study
    "bench": {"domain", "core", "milp", "replay", "daemon", "campaign"},   # campaign: the study adapter
    "cli": set(ROOMS),
}
# the pure core: standard-library modules it may use (no I/O, no clock), and numpy's arithmetic ...
PURE_STDLIB = {"__future__", "typing", "dataclasses", "functools", "collections", "math", "enum",
               "bisect", "statistics", "itertools", "heapq", "operator", "numpy"}
# ... and the shell around it, which measures latency and logs why
CORE_SHELL = {"malletrain/core/cycle.py": PURE_STDLIB | {"logging", "time"}}


def modules():
    for folder, pkg in FOLDERS.items():
        base = os.path.join(ROOT, folder)
        for dirpath, _, files in os.walk(base):
            for f in files:
                if f.endswith(".py"):
                    path = os.path.join(dirpath, f)
                    rel = os.path.relpath(path, base)[:-3].replace(os.sep, ".")
                    name = pkg if rel == "__init__" else f"{pkg}.{rel.removesuffix('.__init__')}"
                    yield name, path


def imports(path):
    tree = ast.parse(open(path, encoding="utf-8").read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module
            for a in node.names:          # from malletrain import campaign
                yield f"{node.module}.{a.name}"


def room(name):
    parts = name.split(".")
    if parts[0] != "malletrain" or len(parts) < 2:
        return None
    return parts[1] if parts[1] in ROOMS else None


ALL = sorted(modules())


def test_every_module_lives_in_a_room():
    loose = [n for n, _ in ALL if room(n) is None and n not in ("malletrain", "malletrain.__main__")]
    assert not loose, loose


@pytest.mark.parametrize("name,path", ALL, ids=[n for n, _ in ALL])
def test_imports_follow_the_rooms(name, path):
    mine = room(name)
    for imp in imports(path):
        other = room(imp)
        if imp.startswith("devtools"):
            pytest.fail(f"{name} imports the repository's dev tools ({imp})")
        if other is None or other == mine or mine is None:
            continue
        assert other in ALLOWED[mine], f"{name} ({mine}) imports {imp} ({other})"
        if mine in ("jpa", "milp") and other == "domain":   # the domain model and errors only
            assert imp.split(".")[:3] in (["malletrain", "domain", "model"],
                                          ["malletrain", "domain", "errors"]), f"{name} imports {imp}"


@pytest.mark.parametrize("name,path", [(n, p) for n, p in ALL if room(n) == "core"],
                         ids=[n for n, _ in ALL if room(n) == "core"])
def test_core_imports_no_io(name, path):
    rel = os.path.relpath(path, ROOT)
    allowed = CORE_SHELL.get(rel, PURE_STDLIB)
    for imp in imports(path):
        top = imp.split(".")[0]
        if top == "malletrain":
            continue
        assert top in allowed, f"{rel} imports {imp}"


def test_the_profiler_imports_neither_numpy_nor_io():
    """jpa's fits are plain Python floats, so that they are the same to the last bit on every
    machine (numpy's BLAS kernels differ per CPU: ``jpa/scaling.py``)."""
    for name, path in ALL:
        if room(name) == "jpa":
            for imp in imports(path):
                top = imp.split(".")[0]
                assert top == "malletrain" or (top in PURE_STDLIB and top != "numpy"), f"{name} imports {imp}"


def test_nothing_imports_the_cli():
    for name, path in ALL:
        if room(name) == "cli" or name == "malletrain.__main__":
            continue
        assert not any(room(i) == "cli" for i in imports(path)), name
    for f in os.listdir(os.path.join(ROOT, "devtools")):
        if f.endswith(".py"):
            assert not any(room(i) == "cli" for i in imports(os.path.join(ROOT, "devtools", f))), f


def test_no_cycles_between_rooms():
    graph = {r: set() for r in ROOMS}
    for name, path in ALL:
        a = room(name)
        for imp in imports(path):
            b = room(imp)
            if a and b and a != b:
                graph[a].add(b)
    state = {}

    def visit(r, trail):
        if state.get(r) == "open":
            pytest.fail("import cycle: " + " -> ".join(trail + [r]))
        if state.get(r) == "done":
            return
        state[r] = "open"
        for s in sorted(graph[r]):
            visit(s, trail + [r])
        state[r] = "done"
    for r in ROOMS:
        visit(r, [])


def test_deciding_with_the_exact_dp_loads_no_solver_and_no_io():
    """Import the core and decide with the knapsack DP: PuLP, sqlite, the Slurm
    adapter, the daemon, replay and the CLI stay unloaded."""
    code = """
import sys
from malletrain.core.decide import decide
from malletrain.domain.config import CoreConfig
from malletrain.domain.model import Curve, CurvePoint, JobSpec, JobState, Node, Snapshot
nodes = tuple(Node(f"n{i}") for i in range(8))
jobs = tuple(JobState(JobSpec(str(j), 1, 4)) for j in range(3))
curve = Curve({n: CurvePoint(10.0 * n ** 0.8, 9.0, 11.0) for n in range(1, 5)})
plan = decide(Snapshot(0.0, nodes, jobs), {j.job_id: curve for j in jobs}, CoreConfig(policy="oracle"))
assert plan.solver == "mck-dp", plan.solver
bad = [m for m in sys.modules if m.split(".")[0] in ("pulp", "sqlite3", "highspy", "yaml")
       or m.startswith(("malletrain.slurm", "malletrain.daemon", "malletrain.replay", "malletrain.cli"))]
print(",".join(sorted(bad)))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "", r.stdout


def test_a_milp_solve_loads_pulp():
    code = """
import sys
from malletrain.milp.problem import JobChoice, Problem, job_values
from malletrain.milp.solve import allocate
opts = job_values([1, 2, 3], 0, 600.0, 0.0, 0.0, lambda n: 10.0 * n)
problem = Problem((JobChoice("a", opts, ("gpu",), 0),), {"gpu": 3})
assert "pulp" not in sys.modules
allocate(problem, method="highs", time_limit_s=5.0)
print("pulp" in sys.modules)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().splitlines()[-1] == "True"


def test_only_the_study_adapter_imports_optuna():
    """One module speaks to Optuna (one major version behind one adapter); the daemon never does."""
    users = sorted(name for name, path in ALL if any(i.split(".")[0] == "optuna" for i in imports(path)))
    assert users == ["malletrain.campaign.study"]
