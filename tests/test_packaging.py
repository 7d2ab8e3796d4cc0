"""The folders install under the memrl namespace, editable and as a wheel; nothing installs bare."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LAYERS = ("train", "rollout", "rewards", "envs", "data_gen")
IMPORT_ALL = "import memrl.envs, memrl.rewards, memrl.train, memrl.rollout, memrl.data_gen"


def _python(code: str, cwd: Path, env: dict[str, str] | None = None) -> str:
    out = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, check=True)
    return out.stdout


def test_editable_install_maps_folders_into_namespace(tmp_path: Path) -> None:
    code = IMPORT_ALL + "; import memrl.train as t, memrl.rollout as r; print(t.__file__); print(r.__file__)"
    train_file, rollout_file = _python(code, cwd=tmp_path).split()
    assert Path(train_file) == REPO / "train" / "__init__.py"
    assert Path(rollout_file) == REPO / "rollout" / "__init__.py"


def test_layers_are_not_importable_bare(tmp_path: Path) -> None:
    code = "import importlib.util; print([importlib.util.find_spec(n) is None for n in ('envs', 'train', 'rollout')])"
    assert _python(code, cwd=tmp_path).strip() == "[True, True, True]"


def test_built_wheel_imports_and_ships_recipes(tmp_path: Path) -> None:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(REPO),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("memrl-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert not [n for n in names if n.split("/")[0] in (*LAYERS, "recipes", "tests")]
    assert "memrl/recipes/quickstart.yaml" in names
    assert "memrl/rollout/openai_http.py" in names

    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
        check=True,
        capture_output=True,
    )
    code = (
        IMPORT_ALL + "; import memrl.train as t; from memrl.app.recipe import bundled_recipes; "
        "print(t.__file__); print(sorted(bundled_recipes()))"
    )
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"}
    train_file, recipes = _python(code, cwd=tmp_path, env=env).split("\n", 1)
    assert Path(train_file).is_relative_to(site)
    assert "quickstart" in recipes
