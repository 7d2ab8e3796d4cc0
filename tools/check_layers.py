"""Check pyproject's import-linter contracts (layers, independent worlds) against the package as installed.

pyproject maps the top-level folders (train/, rollout/, ...) into `memrl.*`; grimp reads a package from one folder
tree, so this copies the sources into that layout in a temporary folder and runs `lint-imports` there.

    python tools/check_layers.py [--root DIR]     exit 0: every contract kept; 1: one is broken
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]


def mirror(root: Path, dest: Path) -> Path:
    """Copy each folder of `package-dir` to where its package is installed; returns the `memrl` folder."""
    mapping = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "*.yaml", "*.json")
    for package, folder in sorted(mapping.items(), key=lambda item: item[0].count(".")):
        shutil.copytree(root / folder, dest.joinpath(*package.split(".")), ignore=skip, dirs_exist_ok=True)
    return dest / "memrl"


def check(root: Path) -> int:
    lint = Path(sys.executable).with_name("lint-imports")
    with tempfile.TemporaryDirectory(prefix="memrl-layers-") as tmp:
        mirror(root, Path(tmp))
        env = os.environ | {"PYTHONPATH": tmp}
        argv = [str(lint) if lint.is_file() else "lint-imports", "--no-cache", "--config", str(root / "pyproject.toml")]
        return subprocess.run(argv, cwd=tmp, env=env).returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent, help="the checkout")
    return check(parser.parse_args().root.resolve())


if __name__ == "__main__":
    sys.exit(main())
