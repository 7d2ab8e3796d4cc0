"""Secrets are masked by value wherever they land: error lines, logs, consoles, dry runs and saved recipes."""

from __future__ import annotations

import io
import json
import logging
import os
from pathlib import Path

import pytest
from rich.console import Console
from support import MemrlCLI

from memrl.app.launch import describe, plan
from memrl.app.recipe import load_recipe
from memrl.core import secrets
from memrl.core.envrefs import register_secrets, substitute
from memrl.core.errors import BackendError
from memrl.rollout.serve import free_port

CRED = "sk-judge-cred-7d1e9b"


def _files_hold(root: Path, value: str) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and value.encode() in p.read_bytes()]


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("OPENAI_API_KEY", True),
        ("api_key", True),
        ("hfToken", True),
        ("DB_PASSWORD", True),
        ("client_secret", True),
        ("JUDGE_CRED", True),
        ("--api-key", True),
        ("max_tokens", False),
        ("TOKENIZERS_PARALLELISM", False),
        ("RAY_AUTH_MODE", False),
        ("endpoint", False),
        ("PWD", False),
        ("OLDPWD", False),
    ],
)
def test_secret_names_go_by_whole_words(name: str, secret: bool) -> None:
    assert secrets.is_secret_name(name) is secret


def test_redact_masks_by_role_by_name_and_by_flag() -> None:
    environ = {"PLAIN_HOLDER": "value-of-a-role-field", "NAMED_TOKEN": "value-of-a-named-var", "UNSET_DEFAULT": "x"}
    raw = {"models": [{"api_key": "${PLAIN_HOLDER}", "endpoint": "http://h/v1?t=${NAMED_TOKEN}"}], "seed": 12345678}
    register_secrets(raw, environ)  # the field's role: PLAIN_HOLDER is a secret whatever it is called
    assert substitute(raw["models"][0]["endpoint"], environ) == "http://h/v1?t=value-of-a-named-var"  # by name
    argv = ["memrl", "chat", "--api-key", "value-from-a-flag", "--hf-token=value-of-an-equals-flag"]
    text = (
        "a value-of-a-role-field b http://h/v1?t=value-of-a-named-var c value-from-a-flag d value-of-an-equals-flag "
        "e 12345678 f " + json.dumps({"k": "value-of-a-role-field"})
    )
    assert secrets.redact(text, {}, argv) == 'a *** b http://h/v1?t=*** c *** d *** e 12345678 f {"k": "***"}'
    # Placeholders are not secrets: a default such as EMPTY must not garble every message that says "EMPTY".
    secrets.register(["EMPTY", "", None])
    assert secrets.redact("EMPTY") == "EMPTY"


def test_launch_dry_run_masks_a_secret_under_any_variable_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`api_key: ${JUDGE_CRED}` showed "JUDGE_CRED": "sk-..." in the dry run's runtime_env."""
    monkeypatch.setenv("JUDGE_CRED", CRED)
    monkeypatch.setenv("MEMRL_NOTE", f"see http://judge/v1?key={CRED}")  # a plain name holding the secret
    recipe = tmp_path / "cred.yaml"
    recipe.write_text(
        "extends: endpoint\nname: cred\nmodels:\n  policy:\n    api_key: ${JUDGE_CRED}\n"
        f"output_dir: {tmp_path / 'run'}\n"
    )
    loaded = load_recipe(recipe)
    lines: list[str] = []
    describe(plan(loaded, "http://127.0.0.1:9", working_dir=tmp_path), "http://127.0.0.1:9", lines.append)
    out = "\n".join(lines)
    env_vars = json.loads(next(line for line in lines if "runtime_env: " in line).split("runtime_env: ", 1)[1])[
        "env_vars"
    ]
    assert env_vars["JUDGE_CRED"] == "***"
    assert env_vars["MEMRL_NOTE"] == "see http://judge/v1?key=***"
    assert CRED not in out
    loaded.save(tmp_path / "saved")
    assert not _files_hold(tmp_path, CRED)


def test_errors_logs_and_the_run_console_mask_registered_secrets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("JUDGE_CRED", CRED)
    recipe = tmp_path / "cred.yaml"
    recipe.write_text("extends: endpoint\nname: cred\nmodels:\n  policy:\n    api_key: ${JUDGE_CRED}\n")
    loaded = load_recipe(recipe)
    assert str(BackendError(f"endpoint http://h/v1?key={CRED} is unreachable")) == (
        "endpoint http://h/v1?key=*** is unreachable"
    )
    out = io.StringIO()
    ctx = loaded.recipe.context(tmp_path, Console(file=out, width=200))
    ctx.console.print(f"calling http://h/v1?key={CRED}")
    with caplog.at_level(logging.INFO):
        logging.getLogger("memrl.test").info("key is %s", CRED)
        logging.getLogger("memrl.test").info("plain %s", "args stay")
    assert out.getvalue().strip() == "calling http://h/v1?key=***"
    assert [r.getMessage() for r in caplog.records] == ["key is ***", "plain args stay"]
    assert caplog.records[1].args == ("args stay",)  # records without a secret are left as they were


def test_secret_in_an_endpoint_url_is_not_printed(tmp_path: Path, memrl_cli: MemrlCLI) -> None:
    """`endpoint: ...?key=${OPENAI_API_KEY}` printed the key in the "unreachable" error line."""
    key = "sk-url-secret-1f9c3a"
    recipe = tmp_path / "url.yaml"
    recipe.write_text(
        "extends: endpoint\nname: url\nmodels:\n  policy:\n"
        f"    endpoint: http://127.0.0.1:{free_port()}/v1?key=${{OPENAI_API_KEY}}\n"
        "    max_retries: 0\n    timeout: 5\n"
    )
    result = memrl_cli(
        "run", recipe, f"output_dir={tmp_path / 'run'}", cwd=tmp_path, env={**os.environ, "OPENAI_API_KEY": key}
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "memrl: error: endpoint http://127.0.0.1:" in result.stderr
    assert "/v1?key=*** is unreachable" in result.stderr
    assert key not in result.stdout + result.stderr
    assert not _files_hold(tmp_path, key)


def test_a_key_given_as_a_flag_is_not_printed(memrl_cli: MemrlCLI) -> None:
    key = "sk-flag-secret-8e2d"
    url = f"http://127.0.0.1:{free_port()}/v1?key={key}"
    result = memrl_cli("chat", "--endpoint", url, "--api-key", key, "--retries", "0", "--timeout", "5", "hi")
    assert result.returncode == 2, result.stderr[-2000:]
    assert "?key=*** is unreachable" in result.stderr
    assert key not in result.stdout + result.stderr
