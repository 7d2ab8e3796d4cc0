"""Bad input gets one line on stderr and a non-zero exit; --debug shows the traceback."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from support import MemrlCLI

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


# ---- hostile input (the whole corpus is tests/app/test_hostile_inputs.py) -------------------------------


def test_item1_files_that_are_not_utf8_text_are_one_line(tmp_path: Path, memrl_cli: MemrlCLI) -> None:
    """The issue's examples through the real entry point: binary and Latin-1 files where text or JSON belongs."""
    binary, latin1 = tmp_path / "binary.bin", tmp_path / "latin1.txt"
    binary.write_bytes(bytes(range(256)))
    latin1.write_bytes("réponse en liste à puces\n".encode("latin-1"))
    sgd = tmp_path / "sgd"
    sgd.mkdir()
    (sgd / "schema.json").write_bytes(bytes(range(256)))
    (sgd / "dialogues_001.json").write_bytes(bytes(range(256)))
    run = tmp_path / "run"
    run.mkdir()
    (run / "recipe.resolved.yaml").write_bytes(bytes(range(256)))
    cases = [
        (("recipes", "show", binary), binary),
        (("collab", "check", "--preference", "direct", "--response-file", latin1), latin1),
        (("reward", "score", "--reflection-file", latin1, "--enforcements-file", binary), latin1),
        (("data", "tod", "--sgd-dir", sgd, "--individuals", "1", "--out", tmp_path / "o"), sgd),
        (("resume", run), run / "recipe.resolved.yaml"),
    ]
    for args, named in cases:
        assert_one_line_error(memrl_cli(*args, cwd=tmp_path), str(named), "not UTF-8 text")


def test_item2_unwritable_output_locations_are_one_line(tmp_path: Path, memrl_cli: MemrlCLI) -> None:
    taken = tmp_path / "taken"
    taken.write_text("kept\n")
    out = memrl_cli("eval", "collab", "--out", taken, cwd=tmp_path)
    assert_one_line_error(out, str(taken), "already exists and is not a folder")
    below = memrl_cli("data", "judger", "--tod-dir", "tests/fixtures/mstod", "--out", taken / "sub", cwd=Path.cwd())
    assert_one_line_error(below, str(taken), "not a folder")
    cache = memrl_cli("models", "pull", "minilm", env={**os.environ, "MEMRL_CACHE": str(taken)}, cwd=tmp_path)
    assert_one_line_error(cache, str(taken), f"(MEMRL_CACHE={taken})")
    assert taken.read_text() == "kept\n"


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("smoke.foo=1", "smoke is a list; 'foo' is not one of its indices"),
        ("smoke.99=1", "'99' is not one of its indices"),
        ("stages.pull.models.x=1", "stages.pull.models is a list; 'x'"),
        ("stages.pull.models.5=1", "'5' is not one of its indices (0..1)"),
        ("stages.pull.models.0.a=1", "stages.pull.models.0 is a value, not a section"),
    ],
)
def test_item4_overrides_into_lists_are_one_line(override: str, fragment: str) -> None:
    from memrl.app.recipe import load_recipe
    from memrl.core.errors import ConfigError

    with pytest.raises(ConfigError, match=re.escape(fragment)):
        load_recipe("quickstart", [override])


def test_item4_override_of_a_list_item_still_works() -> None:
    from memrl.app.recipe import load_recipe

    loaded = load_recipe("quickstart", ["stages.pull.models.1=smollm2"])
    assert loaded.resolved()["stages"]["pull"]["models"][1] == "smollm2"


@pytest.mark.parametrize("port", ["70000", "-1", "0"])
def test_item5_port_out_of_range_is_one_line(port: str, memrl_cli: MemrlCLI) -> None:
    result = memrl_cli("serve", "--port", port, timeout=60)
    assert_one_line_error(result, "--port")
    assert len(result.stderr.strip().splitlines()) == 1


def test_item6_collab_compare_on_a_truncated_or_binary_run(tmp_path: Path, memrl_cli: MemrlCLI) -> None:
    good, truncated, binary = tmp_path / "good", tmp_path / "truncated", tmp_path / "binary"
    for d in (good, truncated, binary):
        d.mkdir()
    (good / "metrics.json").write_text(
        '{"per_session": [{"session": 0, "task_success": 1, "user_effort": 1, "length": 1}]}'
    )
    (truncated / "metrics.json").write_text('{"per_session": [{"sess')
    (binary / "metrics.json").write_bytes(bytes(range(256)))
    for bad, why in ((truncated, "not valid JSON"), (binary, "not UTF-8 text")):
        result = memrl_cli("collab", "compare", "--memory", bad, "--baseline", good, "--out", tmp_path / "o")
        assert_one_line_error(result, str(bad / "metrics.json"), why)
    (binary / "metrics.json").write_text('{"sessions": 3}')
    result = memrl_cli("collab", "compare", "--memory", good, "--baseline", binary, "--out", tmp_path / "o")
    assert_one_line_error(result, "not the metrics of a collab run", "per_session")


def test_item6_data_pahf_on_a_malformed_run(tmp_path: Path, memrl_cli: MemrlCLI) -> None:
    run = tmp_path / "run"
    run.mkdir()
    tasks = run / "tasks.jsonl"
    tasks.write_text('{"key": "a", "user": "u"}\n{"garbage\n{"key": "b"')
    result = memrl_cli("data", "pahf", "--run", run, "--out", tmp_path / "o")
    assert_one_line_error(result, f"{tasks}:2: not valid JSON")
    tasks.write_text('{"key": "a", "user": "u", "product": "p"}\n{"key": "b", "torn')
    result = memrl_cli("data", "pahf", "--run", run, "--out", tmp_path / "o")
    assert_one_line_error(result, f"{tasks}:1: PAHF task record lacks phase, index, pass")
    assert tasks.read_text().endswith('"torn')  # reading a run never truncates it (its torn tail is the user's)


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("eval", "collab", "--bogus"), "No such option: --bogus"),
        (("recipes", "show"), "Missing argument"),
        (("recipes", "shwo"), "No such command 'shwo'"),
        (("chat", "--max-tokens", "0", "hi"), "--max-tokens"),
        (("data", "reflection", "--gold", "silver"), "--gold"),
    ],
)
def test_item11_usage_errors_are_one_line(args: tuple[str, ...], fragment: str, memrl_cli: MemrlCLI) -> None:
    result = memrl_cli(*args, timeout=60)
    assert_one_line_error(result, fragment)
    assert len(result.stderr.strip().splitlines()) == 1 and "╭" not in result.stderr


def test_no_arguments_still_prints_the_help(memrl_cli: MemrlCLI) -> None:
    result = memrl_cli("recipes", timeout=60)
    assert result.returncode == 2 and "list" in result.stdout + result.stderr
    assert "memrl: error" not in result.stderr


def test_debug_shows_the_traceback_of_an_os_error(tmp_path: Path, memrl_cli: MemrlCLI) -> None:
    taken = tmp_path / "taken"
    taken.write_text("x")
    result = memrl_cli("--debug", "eval", "collab", "--out", taken, cwd=tmp_path)
    assert result.returncode != 0 and "Traceback" in result.stderr and "FileExistsError" in result.stderr


def test_the_error_line_hides_secret_values(tmp_path: Path, memrl_cli: MemrlCLI) -> None:
    pytest.importorskip("memrl.core.secrets")
    secret = "sk-hostile-0123456789"
    result = memrl_cli("recipes", "show", tmp_path / secret, env={**os.environ, "OPENAI_API_KEY": secret})
    assert_one_line_error(result, "not found")
    assert secret not in result.stderr


def test_readers_name_the_path_and_the_problem(tmp_path: Path) -> None:
    from memrl.core.errors import ConfigError
    from memrl.core.files import list_dir, read_json, read_jsonl, read_text

    binary, folder, log = tmp_path / "b.json", tmp_path / "d", tmp_path / "log.jsonl"
    binary.write_bytes(b'{"a": "\xff"}')
    folder.mkdir()
    log.write_text('{"a": 1}\n[2]\n')
    with pytest.raises(ConfigError, match=rf"^{binary}: not UTF-8 text \(byte b'\\xff' at offset 7\)$"):
        read_json(binary, ConfigError)
    with pytest.raises(ConfigError, match=rf"^{folder}: a folder, not a file$"):
        read_text(folder, ConfigError)
    with pytest.raises(ConfigError, match=rf"^{binary}: not a folder$"):
        list_dir(binary, ConfigError)
    with pytest.raises(ConfigError, match=rf"^{log}:2: expected a JSON object, got a list$"):
        read_jsonl(log, ConfigError)
    log.write_text('{"a": 1}\n{"b": ')  # a torn last line, as a killed writer leaves it: dropped
    assert read_jsonl(log, ConfigError) == [{"a": 1}]
