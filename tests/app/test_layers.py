"""The import-linter contracts `make lint` runs: they hold on the tree, and an upward import breaks them."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHECK = [sys.executable, str(ROOT / "tools" / "check_layers.py")]
FOLDERS = ("memrl", "train", "rollout", "rewards", "envs", "data_gen", "recipes", "tools")
CONTRACTS = 7  # layers, the app's own layers, independent worlds, independent trainers, no trainer library below
# train, OpenEnv/verifiers only in integrations, no trainer library in integrations


def _copy_tree(dest: Path) -> Path:
    for folder in FOLDERS:
        shutil.copytree(ROOT / folder, dest / folder, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")
    return dest


def _check(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CHECK, "--root", str(root)], capture_output=True, text=True, timeout=300)


def test_the_tree_keeps_every_contract() -> None:
    result = _check(ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert f"{CONTRACTS} kept, 0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "line", "broken"),
    [
        # rewards reaching up into an environment (the taxonomy once lived there)
        ("rewards/format.py", "from memrl.envs.collab import prompts  # noqa", "Layers"),
        # a lazy import inside a function is still an import
        ("envs/tod/pipeline.py", "def _up():\n    from memrl.train.judger import trainer  # noqa", "Layers"),
        # one world reaching into another
        ("envs/pahf/prompts.py", "from memrl.envs.collab import checkers  # noqa", "worlds"),
        # one trainer's package reaching into another's
        ("train/verl/backend.py", "from memrl.train.trl import common  # noqa", "trainer's package"),
        # an environment driving a trainer, even lazily
        ("envs/collab/session.py", "def _train():\n    import trl  # noqa", "no trainer library"),
        ("data_gen/tod/dataset.py", "from verl.utils import hf_tokenizer  # noqa", "no trainer library"),
        # the integrations sit beside train: neither imports the other
        ("memrl/integrations/worlds.py", "def _up():\n    from memrl.train import config  # noqa", "Layers"),
        ("train/config.py", "def _side():\n    from memrl.integrations import worlds  # noqa", "Layers"),
        # an environment importing an optional extra
        ("envs/collab/session.py", "def _serve():\n    import openenv  # noqa", "Only integrations"),
        # an integration driving a trainer
        ("memrl/integrations/openenv.py", "def _train():\n    import trl  # noqa", "Integrations drive no trainer"),
        # inside the app: the run context reaching for the recipe (the cycle that once made every stage take it)
        ("memrl/app/context.py", "def _up():\n    from memrl.app.config import Recipe  # noqa", "App: cli"),
        # a stage kind reaching up into the runner, or an action into its stage
        ("memrl/app/stages/judger.py", "def _up():\n    from memrl.app import runner  # noqa", "App: cli"),
        ("memrl/app/actions/tod.py", "from memrl.app.stages import base  # noqa", "App: cli"),
    ],
)
def test_an_upward_or_sideways_import_breaks_a_contract(module: str, line: str, broken: str, tmp_path: Path) -> None:
    root = _copy_tree(tmp_path / "repo")
    target = root / module
    target.write_text(target.read_text() + "\n\n" + line + "\n")
    result = _check(root)
    assert result.returncode == 1, result.stdout[-2000:]
    assert f"{CONTRACTS - 1} kept, 1 broken" in result.stdout
    assert broken in result.stdout.split("Broken contracts")[-1]


def test_every_package_folder_is_installed() -> None:
    """A new subpackage missing from pyproject's `packages` works editable and is absent from the wheel."""
    import tomllib

    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(tool["packages"])
    found = set()
    for package, folder in tool["package-dir"].items():
        for init in (ROOT / folder).rglob("__init__.py"):
            found.add(".".join((package, *init.parent.relative_to(ROOT / folder).parts)))
    assert found - listed == set(), f"add to pyproject's packages: {sorted(found - listed)}"
