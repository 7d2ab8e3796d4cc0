"""A secret is masked by value, whatever holds it: a variable of any name that fills a URL's credentials
through `${VAR}`, credentials written into a URL on the command line, an env value that is no plain YAML string."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from support import FIXTURES, MemrlCLI, memrl_in_process

from memrl.app.recipe import load_recipe
from memrl.core import secrets
from memrl.core.envrefs import substitute
from memrl.core.runfolder import claim
from memrl.envs.tod.config import TodEvalConfig
from memrl.rollout.config import model_from_spec
from memrl.rollout.serve import free_port

PLANTED = "planted-auth-4f1c2b9e"  # in JUDGE_AUTH: a name that says nothing of a secret
MSTOD = FIXTURES / "mstod"


def _files_holding(root: Path, value: str) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and value.encode() in p.read_bytes()]


def _in_process(argv: list[object]) -> tuple[int, str]:
    """`memrl ARGV` in this process: (exit code, stdout and stderr together)."""
    return memrl_in_process(argv, stdout=True)


@pytest.mark.parametrize(
    ("template", "secret"),
    [
        ("http://user:${JUDGE_AUTH}@host/v1", True),  # userinfo
        ("http://host/v1?auth=${JUDGE_AUTH}", True),  # a query value
        ("http://host/v1?model=m&auth=${JUDGE_AUTH}#top", True),
        ("http://${JUDGE_AUTH}/v1", False),  # a host: not a credential
        ("http://host/${JUDGE_AUTH}/v1", False),
        ("${JUDGE_AUTH}", False),
    ],
)
def test_a_reference_is_secret_by_its_place_in_a_url(template: str, secret: bool) -> None:
    value = f"ref-value-{abs(hash(template))}"
    substitute(template, {"JUDGE_AUTH": value})
    assert (value in secrets.known({}, [])) is secret


def test_url_credentials_are_the_password_and_secret_named_query_values() -> None:
    text = "see http://memrl:p%40ss-word-1@h:80/v1?api_key=k%2Bey-12345678&model=qwen-2.5-7b and https://TOKEN123@gh"
    assert set(secrets.url_credentials(text)) == {
        "p%40ss-word-1", "p@ss-word-1", "k%2Bey-12345678", "k+ey-12345678", "TOKEN123"
    }  # fmt: skip
    argv = ["memrl", "chat", "--endpoint", "http://u:cli-pass-5a1d0c@h/v1", "hi"]
    assert secrets.redact("GET http://u:cli-pass-5a1d0c@h/v1 failed", {}, argv) == "GET http://u:***@h/v1 failed"


def test_a_var_filling_an_endpoint_url_reaches_no_file_line_traceback_or_dry_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, memrl_cli: MemrlCLI
) -> None:
    monkeypatch.setenv("JUDGE_AUTH", PLANTED)
    endpoint = f"http://memrl:${{JUDGE_AUTH}}@127.0.0.1:{free_port()}/v1?auth=${{JUDGE_AUTH}}"
    recipe = tmp_path / "auth.yaml"
    recipe.write_text(
        f"extends: endpoint\nname: auth\nmodels:\n  policy:\n    endpoint: {endpoint}\n    max_retries: 0\n"
        f"    timeout: 5\noutput_dir: {tmp_path / 'run'}\n"
    )
    code, err = memrl_in_process(["run", recipe])
    assert code == 2, err
    assert "/v1?auth=*** is unreachable" in err.strip().splitlines()[-1] and PLANTED not in err

    code, out = _in_process(["launch", recipe, "--ray-address", "http://127.0.0.1:9", "--dry-run"])
    assert code == 0, out
    assert '"JUDGE_AUTH": "***"' in out and PLANTED not in out

    debug = memrl_cli("--debug", "run", recipe, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=120)
    assert debug.returncode != 0 and "Traceback" in debug.stderr, debug.stderr[-2000:]
    assert PLANTED not in debug.stdout + debug.stderr
    assert not _files_holding(tmp_path, PLANTED)


def test_a_stage_config_json_keeps_no_credential_filled_in_or_given_on_the_command_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JUDGE_AUTH", PLANTED)
    recipe = tmp_path / "tod.yaml"
    recipe.write_text(
        f"name: tod\nstages:\n  tod:\n    kind: eval_tod\n    data: {MSTOD}\n    reader_model:\n"
        "      backend: openai\n      model: m\n      endpoint: http://h/v1?auth=${JUDGE_AUTH}\n"
    )
    claim(tmp_path / "from-recipe", load_recipe(recipe).recipe.stages["tod"])
    # `memrl eval tod --reader m@URL ...`: the credentials come from this process's command line.
    spec = "m@http://memrl:cli-pass-9e3b7d@h/v1?token=cli-token-1c5f8a"
    monkeypatch.setattr(sys, "argv", ["memrl", "eval", "tod", "--data", str(MSTOD), "--reader", spec])
    cli = TodEvalConfig(data=MSTOD, reader_model=model_from_spec(spec))
    claim(tmp_path / "from-flags", cli)
    claim(tmp_path / "from-flags", cli)  # a resumption compares the masked setups: the same run
    saved = json.loads((tmp_path / "from-flags" / "config.json").read_text())
    assert saved["reader_model"]["endpoint"] == "http://memrl:***@h/v1?token=***"
    for value in (PLANTED, "cli-pass-9e3b7d", "cli-token-1c5f8a"):
        assert not _files_holding(tmp_path, value), value


def test_an_env_value_that_is_no_plain_yaml_string_is_not_echoed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe = tmp_path / "tok.yaml"
    recipe.write_text("extends: endpoint\nname: tok\nmodels:\n  policy:\n    max_concurrency: ${MY_TOKEN}\n")
    for value, leaked in [("{a: tok-mapping-61b2e0}", "tok-mapping-61b2e0"), ("[tok-flow-83c4d1", "tok-flow-83c4d1")]:
        monkeypatch.setenv("MY_TOKEN", value)
        code, err = memrl_in_process(["recipes", "show", recipe])
        assert code == 2 and "Traceback" not in err, err
        assert "max_concurrency" in err and leaked not in err, err


def test_a_traceback_is_printed_redacted(capsys: pytest.CaptureFixture[str]) -> None:
    """`--debug`, or a bug: the traceback, whichever exception (a YAML ParserError quotes the text it read)."""
    secrets.register(["tb-secret-0a9d4e"])
    assert memrl_in_process(["recipes", "list"])[0] == 0  # typer installs its own hook as a command runs
    try:
        raise RuntimeError("reading [tb-secret-0a9d4e") from KeyError("tb-secret-0a9d4e")
    except RuntimeError as exc:
        sys.excepthook(type(exc), exc, exc.__traceback__)  # what Python calls on the exception main() re-raises
    err = capsys.readouterr().err
    assert "Traceback" in err and "RuntimeError: reading [***" in err and "tb-secret-0a9d4e" not in err
