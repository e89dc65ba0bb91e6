"""``python -m devtools.typecheck``: mypy over the package as it installs.

jpa/, milp/ and slurm/ install as malletrain.jpa/.milp/.slurm (package-dir in
pyproject.toml), a mapping mypy cannot follow in a source tree.  This builds
the installed layout as a tree of symlinks in a temporary directory, runs
``mypy -p malletrain`` on it with the settings in pyproject.toml, and prints
mypy's findings with the repository's paths.  Exit status: mypy's.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAPPED = {"jpa": "jpa", "milp": "milp", "slurm": "slurm"}   # subpackage -> repository folder


def link_tree(dest: str) -> str:
    pkg = os.path.join(dest, "malletrain")
    os.makedirs(pkg)
    for name in os.listdir(os.path.join(ROOT, "malletrain")):
        if name != "__pycache__":
            os.symlink(os.path.join(ROOT, "malletrain", name), os.path.join(pkg, name))
    for sub, folder in MAPPED.items():
        os.symlink(os.path.join(ROOT, folder), os.path.join(pkg, sub))
    return pkg


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="malletrain-mypy-") as d:
        pkg = link_tree(d)
        out = subprocess.run([sys.executable, "-m", "mypy", "--config-file",
                              os.path.join(ROOT, "pyproject.toml"), "--cache-dir",
                              os.path.join(d, ".mypy_cache"), "-p", "malletrain"],
                             cwd=d, capture_output=True, text=True)
        text = out.stdout + out.stderr
        for sub, folder in MAPPED.items():
            text = text.replace(f"malletrain/{sub}/", f"{folder}/")
        print(text.replace(pkg + "/", "malletrain/"), end="")
        return out.returncode


if __name__ == "__main__":
    sys.exit(main())
