"""Bad input gets one line on stderr and a non-zero exit; --debug shows the traceback."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import MemrlCLI

from memrl.rollout.serve import free_port


def assert_one_line_error(result: subprocess.CompletedProcess[str], *fragments: str) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("memrl: error: ")]
    assert errors == lines[-1:], result.stderr  # one error line, and it is the last thing printed
    for fragment in fragments:
        assert fragment in errors[0]


def test_recipe_with_a_typo(tmp_path: Path, memrl_cli: MemrlCLI) -> None:
    typo = tmp_path / "typo.yaml"
    typo.write_text("extends: generate\nname: typo\nstages:\n  generate:\n    sampling:\n      max_tokns: 3\n")
    assert_one_line_error(memrl_cli("recipes", "show", str(typo)), "max_tokns", "did you mean 'max_tokens'")


def test_debug_shows_the_traceback(memrl_cli: MemrlCLI) -> None:
    result = memrl_cli("--debug", "recipes", "show", "generate", "seed=x")
    assert result.returncode != 0
    assert "Traceback" in result.stderr and "ConfigError" in result.stderr


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (("recipes", "show", "no-such-recipe"), ("not found",)),
        (("run", "generate", "stages.generate.model=ghost"), ("'ghost' is not a key",)),
        (("models", "pull", "gpt-17"), ("unknown model 'gpt-17'", "smollm2-135m-instruct")),
        pytest.param(  # slow (~8 s): chat imports torch and transformers before it checks the model
            ("chat", "--model", "/no/such/model/dir", "hi"), ("is not an embedded model",), marks=pytest.mark.slow
        ),
        (("run", "generate", "--stage", "train"), ("no stage named 'train'",)),
        (("serve", "--engine", "tgi"), ("--engine must be",)),
    ],
)
def test_bad_input_is_one_line(
    args: tuple[str, ...], fragments: tuple[str, ...], tmp_path: Path, memrl_cli: MemrlCLI
) -> None:
    result = memrl_cli(*args, cwd=tmp_path)
    assert_one_line_error(result, *fragments)
    if args[0] != "run":
        assert len(result.stderr.strip().splitlines()) == 1


def test_unreachable_endpoint_is_one_line(memrl_cli: MemrlCLI) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    result = memrl_cli("chat", "--endpoint", url, "--retries", "1", "--timeout", "5", "hello")
    assert_one_line_error(result, url, "unreachable", "1 retries")


def test_vllm_backend_without_vllm_is_one_line(tmp_path: Path, memrl_cli: MemrlCLI) -> None:
    recipe = tmp_path / "v.yaml"
    recipe.write_text(
        "extends: generate\nname: v\nmodels:\n  policy:\n    backend: vllm\n    model: tiny-qwen2\n"
        "stages:\n  pull:\n    models: [tiny-qwen2]\n"
    )
    result = memrl_cli("run", str(recipe), f"output_dir={tmp_path / 'out'}", "--stage", "generate", cwd=tmp_path)
    assert_one_line_error(result, "vLLM, which is not installed")
