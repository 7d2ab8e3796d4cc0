"""Every command documents itself, and the model commands report where things are."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

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
]


def memrl(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200"}  # wide enough that rich does not wrap paths in tables
    return subprocess.run([sys.executable, "-m", "memrl", *args], capture_output=True, text=True, env=env)


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "memrl")
def test_help_at_every_level(command: tuple[str, ...]) -> None:
    result = memrl(*command, "--help")
    assert result.returncode == 0, result.stderr
    assert "Usage: memrl" in result.stdout
    assert "--help" in result.stdout


def test_models_pull_prints_paths_and_list_shows_them(tiny_qwen2: str) -> None:
    pulled = memrl("models", "pull", "tiny-qwen2")
    assert pulled.returncode == 0, pulled.stderr
    assert pulled.stdout.strip() == f"tiny-qwen2: {tiny_qwen2}"
    listing = memrl("models", "list").stdout
    for name in ("smollm2-135m-instruct", "all-minilm-l6-v2", "tiny-qwen2", "tiny-llama"):
        assert name in listing
    assert tiny_qwen2 in listing


def test_recipes_list_shows_bundled_recipes() -> None:
    listing = memrl("recipes", "list").stdout
    assert "quickstart" in listing and "endpoint" in listing
