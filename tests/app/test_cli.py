"""Every command documents itself, and the model commands report where things are."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from support import MemrlCLI

COMMANDS = [
    (),
    ("run",),
    ("chat",),
    ("serve",),
    ("recipes",),
    ("recipes", "list"),
    ("recipes", "show"),
    ("models",),
    ("models", "list"),
    ("models", "pull"),
    ("env",),
    ("env", "llamafactory"),
    ("reward",),
    ("reward", "list"),
]


def wide() -> dict[str, str]:
    return {**os.environ, "COLUMNS": "200"}  # wide enough that rich does not wrap paths in tables


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "memrl")
def test_help_at_every_level(command: tuple[str, ...], memrl_cli: MemrlCLI) -> None:
    result = memrl_cli(*command, "--help", env=wide())
    assert result.returncode == 0, result.stderr
    assert "Usage: memrl" in result.stdout
    assert "--help" in result.stdout


def test_models_pull_prints_paths_and_list_shows_them(tiny_qwen2: str, memrl_cli: MemrlCLI) -> None:
    pulled = memrl_cli("models", "pull", "tiny-qwen2", env=wide())
    assert pulled.returncode == 0, pulled.stderr
    assert pulled.stdout.strip() == f"tiny-qwen2: {tiny_qwen2}"
    listing = memrl_cli("models", "list", env=wide()).stdout
    for name in ("smollm2-135m-instruct", "all-minilm-l6-v2", "tiny-qwen2", "tiny-llama"):
        assert name in listing
    assert tiny_qwen2 in listing


def test_recipes_list_shows_bundled_recipes(memrl_cli: MemrlCLI) -> None:
    listing = memrl_cli("recipes", "list", env=wide()).stdout
    assert "quickstart" in listing and "endpoint" in listing


_IMPORTED = """
import sys
from typer.testing import CliRunner
from memrl.app.cli.main import app
result = CliRunner().invoke(app, sys.argv[1:])
assert result.exit_code == 0, result.output
print(" ".join(sorted(m for m in sys.modules if m.startswith("memrl."))))
"""


@pytest.mark.parametrize(
    ("command", "loads_worlds"),
    [(("--help",), False), (("run", "--help"), False), (("eval", "--help"), True), (("data", "tod", "--help"), True)],
)
def test_a_group_imports_its_worlds_only_when_it_is_used(command: tuple[str, ...], loads_worlds: bool) -> None:
    """The groups in `main.LAZY_GROUPS` import their modules (every world's actions) on first use, not at start."""
    modules = subprocess.run(
        [sys.executable, "-c", _IMPORTED, *command], capture_output=True, text=True, check=True
    ).stdout.split()
    assert ("memrl.app.actions.tod" in modules) is loads_worlds
    assert any(m.startswith("memrl.envs.") for m in modules) is loads_worlds
