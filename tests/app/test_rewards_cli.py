"""`memrl reward score` through typer's CliRunner on `reward_app`; `memrl reward list` through the CLI."""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path

from support import MemrlCLI
from typer.testing import CliRunner

import memrl.envs.registry  # registers the worlds' episode rewards, as the CLI does)
import memrl.train.rewards  # noqa: F401  (registers next_session, as the CLI does)
from memrl.app.cli.reward import reward_app
from memrl.core.errors import ConfigError
from memrl.rewards.collab_episode import PARTS
from memrl.rewards.config import LengthPenaltyConfig, RewardConfig
from memrl.rewards.registry import REWARDS, listed

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


def test_reward_list_shows_every_reward_with_its_parts_and_needs(memrl_cli: MemrlCLI) -> None:
    listing = memrl_cli("reward", "list", env={**os.environ, "COLUMNS": "200"})
    assert listing.returncode == 0, listing.stderr
    lines = listing.stdout.splitlines()
    assert [[c.strip() for c in line.split("┃")[1:-1]] for line in lines if "┃" in line] == [
        ["name", "parts", "needs", "what"]
    ]
    named: dict[str, list[list[str]]] = {}  # a wrapped row continues on lines with an empty name
    for row in ([c.strip() for c in line.split("│")[1:-1]] for line in lines if "│" in line):
        if row[0]:
            named[row[0]] = [[] for _ in row]
        for column, text in zip(list(named.values())[-1], row, strict=True):
            column += [text] if text else []
    assert list(named) == [entry.name for entry in listed()]  # the reflection reward's parts first
    for name, entry in REWARDS.items():
        assert [" ".join(column) for column in named[name][1:3]] == [", ".join(entry.parts), entry.needs]
    rows = [json.loads(line) for line in memrl_cli("reward", "list", "--json", check=True).stdout.splitlines()]
    names = ["coverage", "format", "length", "next_session", "collab_episode", "tod_episode"]
    assert [r["name"] for r in rows] == names
    assert rows[3]["parts"] == ["outcome"] and rows[4]["parts"] == list(PARTS)
    assert rows[5]["parts"] == ["success", "slot_accuracy", "turns"]


def test_registry_factories_resolve_and_parts_are_what_the_trainers_produce(memrl_cli: MemrlCLI) -> None:
    from memrl.envs.collab.scripted_reader import ScriptedReader
    from memrl.rewards.collab_episode import EpisodeRewardWeights
    from memrl.rewards.config import NextSessionRewardConfig
    from memrl.rewards.registry import reflection_parts
    from memrl.rewards.tod_episode import TodRewardWeights
    from memrl.train.rewards.next_session import NextSessionScorer, OutcomeScorer
    from memrl.train.trl.rewards import episode_funcs, reflection_funcs

    for row in (json.loads(line) for line in memrl_cli("reward", "list", "--json", check=True).stdout.splitlines()):
        module, _, attribute = row["factory"].partition(":")
        assert callable(getattr(importlib.import_module(module), attribute)), row["factory"]
    cfg = RewardConfig(length_penalty=LengthPenaltyConfig(), outcome=NextSessionRewardConfig(agent="scripted"))
    outcome = OutcomeScorer(NextSessionScorer(ScriptedReader()), {})
    parts = reflection_parts(cfg, Path("unread"), shared={"outcome": outcome})
    names = [f.__name__ for f in reflection_funcs(parts)]
    assert names == [p for name in ("coverage", "format", "length", "next_session") for p in REWARDS[name].parts]
    assert [f.__name__ for f in episode_funcs(EpisodeRewardWeights)] == list(REWARDS["collab_episode"].parts)
    assert [f.__name__ for f in episode_funcs(TodRewardWeights)] == list(REWARDS["tod_episode"].parts)
