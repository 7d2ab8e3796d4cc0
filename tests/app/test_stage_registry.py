"""One stage registry: the recipe union is built from it, every kind plans a dry run, and the commands generated
from the actions' configs expose exactly their fields as flags."""

from __future__ import annotations

import json
import typing
from pathlib import Path

import pytest
import typer
from pydantic import ValidationError
from support import FIXTURES
from typer.main import get_command

from memrl.app.actions import collab, judger, pahf, tod
from memrl.app.cli.from_config import config_command
from memrl.app.cli.main import app
from memrl.app.config import Recipe
from memrl.app.recipe import load_recipe
from memrl.app.stages.registry import KINDS


def test_the_recipe_schema_accepts_exactly_the_registered_kinds() -> None:
    stages_field = Recipe.model_fields["stages"].annotation
    union = typing.get_args(typing.get_args(stages_field)[1])[0]
    names = {typing.get_args(member.model_fields["kind"].annotation)[0] for member in typing.get_args(union)}
    assert names == set(KINDS)
    for kind in ("tod_data", "judger_data", "pahf_data", "eval_collab", "eval_tod", "eval_pahf"):
        assert kind in KINDS
    with pytest.raises(ValidationError, match=r"union_tag_invalid|does not match any of the expected tags"):
        Recipe.model_validate({"name": "x", "stages": {"a": {"kind": "no_such_kind"}}})


def test_a_stage_may_only_name_an_earlier_stage() -> None:
    stages = {
        "eval": {"kind": "eval_tod", "data": "mstod"},
        "mstod": {"kind": "tod_data", "sgd_dir": "s", "individuals": 2},
    }
    with pytest.raises(ValidationError, match=r"stages\.eval\.data: stage 'mstod' does not run before 'eval'"):
        Recipe.model_validate({"name": "x", "stages": stages})


@pytest.mark.parametrize("recipe", ["tod", "pahf"])
def test_the_flow_recipes_plan_every_stage_wired_to_the_one_before(recipe: str, memrl_cli, tmp_path: Path) -> None:
    result = memrl_cli("run", recipe, "--dry-run", f"output_dir={tmp_path}", cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout + result.stderr
    for name, stage in load_recipe(recipe).recipe.stages.items():
        assert f"stage {name} ({stage.kind})" in out
    if recipe == "tod":
        assert f"memrl data judger --out {tmp_path / 'pairs'} (tod_dir={tmp_path / 'mstod'}" in out
        assert f"judger={tmp_path / 'judger'}" in out and f"split_from={tmp_path / 'pairs'}" in out
    else:
        assert f"memrl data pahf --out {tmp_path / 'writer'} (run={tmp_path / 'eval'}" in out


def _flags(command: typing.Callable[..., None]) -> dict[str, str]:
    probe = typer.Typer()
    probe.command()(command)
    click_command = get_command(probe)
    return {opt: param.help or "" for param in click_command.params for opt in param.opts}


@pytest.mark.parametrize(
    "action", [collab.EVAL_COLLAB, tod.EVAL_TOD, pahf.EVAL_PAHF, tod.TOD_DATA, tod.JUDGER_DATA, judger.EVAL_JUDGER]
)
def test_generated_flags_are_the_config_fields_with_their_descriptions(action) -> None:
    flags = _flags(config_command(action))
    sections = {"sampling"}
    for field, info in action.config.model_fields.items():
        if field in sections:
            assert f"--{field}" not in flags
            continue
        flag = "--" + field.replace("_", "-")
        assert flag in flags, flag
        assert (info.description or "") in flags[flag]
    assert "--out" in flags


def test_a_field_added_to_a_config_becomes_a_flag_and_a_recipe_key(tmp_path: Path) -> None:
    from pydantic import Field

    from memrl.app.actions import Action
    from memrl.core.schema import StrictModel

    class Toy(StrictModel):
        size: int = Field(default=3, description="how many")
        label: str = Field(description="a required label")
        ks: list[int] = Field(default_factory=lambda: [1], description="repeatable")

    seen: list[Toy] = []

    def run(cfg: Toy, out: Path, console: object) -> dict[str, int]:
        seen.append(cfg)
        return {"size": cfg.size}

    action = Action("toy", Toy, run, "A toy action.")
    probe = typer.Typer()
    probe.command()(config_command(action))
    from typer.testing import CliRunner

    result = CliRunner().invoke(probe, ["--label", "x", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"size": 3}
    assert seen[-1] == Toy(size=3, label="x", ks=[1])  # unset flags keep the model's defaults
    result = CliRunner().invoke(
        probe, ["--label", "x", "--size", "5", "--ks", "2", "--ks", "3", "--out", str(tmp_path)]
    )
    assert result.exit_code == 0, result.output
    assert seen[-1] == Toy(size=5, label="x", ks=[2, 3])
    result = CliRunner().invoke(probe, ["--label", "x", "--size", "many", "--out", str(tmp_path)])
    assert result.exit_code != 0


def test_every_eval_and_data_command_keeps_its_name() -> None:
    commands = get_command(app).commands  # type: ignore[attr-defined]
    assert set(commands["eval"].commands) >= {"collab", "tod", "pahf", "judger", "reflector"}
    assert set(commands["data"].commands) >= {"reflection", "tod", "judger", "pahf"}


def test_cli_flags_and_recipe_keys_build_the_same_config(tmp_path: Path) -> None:
    """`memrl eval tod --top-k 2 --retriever bm25` and a stage with `top_k: 2, retriever: bm25` agree."""
    from memrl.app.stages.registry import KINDS

    stage = KINDS["eval_tod"].config.model_validate(
        {"kind": "eval_tod", "data": str(FIXTURES / "mstod"), "top_k": 2, "retriever": "bm25"}
    )
    from memrl.envs.tod.config import TodEvalConfig

    from_stage = TodEvalConfig.model_validate(stage.model_dump(exclude={"kind"}))
    from_flags = TodEvalConfig.model_validate({"data": str(FIXTURES / "mstod"), "top_k": 2, "retriever": "bm25"})
    assert from_stage == from_flags


def test_every_action_is_a_command_and_a_stage_named_by_one_rule() -> None:
    from memrl.app.actions import kind_of
    from memrl.app.cli.commands import COMMANDS, SHAPES

    assert (kind_of("eval tod"), kind_of("data tod"), kind_of("export")) == ("eval_tod", "tod_data", "export")
    faces = {name: kind.action for name, kind in KINDS.items() if kind.action is not None}
    assert set(SHAPES) <= set(COMMANDS) == {action.command for action in faces.values()}
    for name, action in faces.items():
        assert name == action.kind == kind_of(action.command)  # the face's command names its kind by the rule
        assert KINDS[name].config.__doc__ == action.help
        assert COMMANDS[action.command].__doc__ == action.help
    # Every `memrl eval|data` command, generated or hand-written, runs as the stage its words name by the rule.
    root = get_command(app)
    for group in ("eval", "data"):
        for verb in root.commands[group].commands:  # type: ignore[attr-defined]
            assert kind_of(f"{group} {verb}") in KINDS, f"{group} {verb}"


def test_every_world_of_the_registry_has_its_eval_command_and_its_online_stage() -> None:
    """The world registry (memrl.envs.registry) is what `memrl eval <world>` and the `<world>_grpo` kinds stand on."""
    from memrl.envs.registry import WORLDS, online_worlds

    commands = get_command(app).commands["eval"].commands  # type: ignore[attr-defined]
    for name, world in WORLDS.items():
        assert name in commands and KINDS[f"eval_{name}"].action is not None
        assert KINDS[f"eval_{name}"].action.config is world.eval_config  # one config, the world's
    online = {name for name in KINDS if name.endswith("_grpo") and name != "grpo"}
    assert online == {f"{name}_grpo" for name in online_worlds()} == {"collab_grpo", "tod_grpo"}
    tod = KINDS["tod_grpo"]
    assert tod.refs == ("init", "env.data")  # the TOD rows may come from an earlier tod_data stage
    stages = {
        "tod": {"kind": "tod_grpo", "model": "p", "env": {"data": "mstod"}},
        "mstod": {"kind": "tod_data", "sgd_dir": "s", "individuals": 2},
    }
    with pytest.raises(ValidationError, match=r"stages\.tod\.env\.data: stage 'mstod' does not run before 'tod'"):
        Recipe.model_validate({"name": "x", "models": {"p": {"backend": "hf", "model": "m"}}, "stages": stages})
