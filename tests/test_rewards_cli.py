"""`memrl reward score` through typer's CliRunner on `reward_app`."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from memrl.app.cli.reward import reward_app
from memrl.core.errors import ConfigError

REFLECTION = {
    "user_preferences_reasoning": "The user asked twice for a different format.",
    "agent_notes": "- Format every answer as a bullet list.\n- Finish each reply with a one-line TL;DR summary.",
}


def write_inputs(tmp_path: Path, reflection: str) -> list[str]:
    (tmp_path / "R.txt").write_text(reflection)
    (tmp_path / "E.txt").write_text("Hold on. Put that in bullet points.\n\nWait. End with a one-line TL;DR.\n")
    return ["score", "--reflection-file", str(tmp_path / "R.txt"), "--enforcements-file", str(tmp_path / "E.txt")]


def test_score_prints_one_json_object(tmp_path: Path, model_cache: object) -> None:
    result = CliRunner().invoke(reward_app, write_inputs(tmp_path, json.dumps(REFLECTION)))
    assert result.exit_code == 0, result.output
    [line] = result.stdout.strip().splitlines()
    out = json.loads(line)
    assert out["score"] == 2.0 and out["coverage"] == 1.0 and out["format"] == 1.0
    assert out["judge"].startswith("offline") and "covered 2/2" in out["reasoning"]
    assert out["judge_failed"] is False and out["covered"] == ["bullets", "tldr"]


def test_plain_notes_and_gold_file(tmp_path: Path, model_cache: object) -> None:
    (tmp_path / "G.json").write_text(json.dumps(REFLECTION))
    args = [*write_inputs(tmp_path, "- Use bullet points in every reply."), "--gold-file", str(tmp_path / "G.json")]
    out = json.loads(CliRunner().invoke(reward_app, args).stdout)
    assert out["format"] == 0.0 and out["coverage"] == 0.5 and 0.0 <= out["score"] <= 2.0
    assert out["missing"] == ["tldr"]


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    args = write_inputs(tmp_path, "{}")
    args[2] = str(tmp_path / "nope.json")
    result = CliRunner().invoke(reward_app, args)
    assert isinstance(result.exception, ConfigError)
    assert str(result.exception) == f"reflection file not found: {tmp_path / 'nope.json'}"
