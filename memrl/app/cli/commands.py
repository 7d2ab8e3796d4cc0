"""The commands generated from the stage kinds' CLI faces (`memrl eval collab|judger|tod|pahf`, `memrl data
tod|judger|pahf`: the actions of `stages.registry.KINDS`), with the few flags that are not plain fields: reply budgets
inside `sampling`, client settings of NAME@URL roles, and the spellings the commands have always had (`--judger
none`, `--top-units 0`, `--reader template`). `install` puts them, with the hand-written commands of their group,
under `memrl eval` and `memrl data`."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import typer
from pydantic import BaseModel

from memrl.app.cli.from_config import Flag, Spec, client_flags, config_command, in_flight, nested_flag
from memrl.app.stages.registry import KINDS
from memrl.core.errors import ConfigError
from memrl.core.files import check_folder
from memrl.rollout.config import model_from_spec


def _judger(spec: Spec, value: str, model: type[BaseModel]) -> None:
    if value.lower() != "none":
        from memrl.rollout.judger.scorer import JudgerInfo, judger_folder

        if Path(value).is_dir():  # a folder holding no judger fails here, not in a worker that dies on it
            JudgerInfo.read(judger_folder(value))
        elif os.path.lexists(value):  # a file, a FIFO, a broken link: say so before the model libraries load
            check_folder(value, ConfigError)
        spec["judger"] = value


def _top_units(spec: Spec, value: int, model: type[BaseModel]) -> None:
    spec["top_units"] = value or None


def _reader(spec: Spec, value: str, model: type[BaseModel]) -> None:
    if value == "template":
        spec["reader"] = "template"
    else:
        spec["reader"], spec["reader_model"] = "llm", model_from_spec(value, in_flight(spec, model))


# How each action's command differs from its config's plain fields (config_command's keyword arguments).
SHAPES: dict[str, dict[str, Any]] = {
    "eval collab": dict(
        flags=[
            nested_flag("max_tokens", int, "agent reply budget in tokens (default 96, sized for the CPU default model)",
                        "sampling.agent.max_tokens"),
            nested_flag("user_max_tokens", int, "LLM user reply budget in tokens (default 1024, as the original)",
                        "sampling.user.max_tokens"),
            nested_flag("reflection_max_tokens", int, "reflection budget in tokens (default 192)",
                        "sampling.reflector.max_tokens"),
            *client_flags(["model", "user_model", "reflector", "judge"]),
        ],
    ),
    "eval tod": dict(
        skip=["judger", "top_units", "reader", "reader_model"],
        rename={"schema_file": "schema"},
        flags=[
            Flag("judger", str, "trained judger folder, or `none` for retrieval alone", _judger),
            Flag("top_units", int, "memory units kept by intent alignment (0: all; default 3)", _top_units),
            Flag("reader", str, "template | MODEL (served locally) | MODEL@URL (an endpoint); default smollm2",
                 _reader),
            nested_flag("max_tokens", int, "reader reply budget in tokens (default 128)", "sampling.reader.max_tokens"),
        ],
    ),
    "eval pahf": dict(
        flags=[nested_flag("max_tokens", int, "decision reply budget in tokens (default 160)",
                           "sampling.decision.max_tokens")],
    ),
    "eval judger": dict(
        skip=["judger", "top_units"],
        flags=[
            Flag("model", str, "a trained judger (stage folder or its final/), or `none` for retrieval alone", _judger),
            Flag("top_units", int, "memory units kept by intent alignment (0: all; default 3)", _top_units),
        ],
    ),
    "data judger": dict(rename={"schema_file": "schema"}),
}  # fmt: skip

COMMANDS: dict[str, Callable[..., None]] = {
    action.command: config_command(action, **SHAPES.get(action.command, {}))
    for action in (kind.action for kind in KINDS.values())
    if action is not None
}

# The order `memrl eval --help` and `memrl data --help` list their commands in; a new one goes last.
LISTED = (
    "eval collab", "eval reflector", "eval judger", "eval tod", "eval pahf",
    "data reflection", "data tod", "data judger", "data pahf",
)  # fmt: skip


def install(app: typer.Typer, group: str, hand_written: Mapping[str, Callable[..., None]]) -> None:
    """Register under `app` (the `memrl GROUP` commands) the generated commands of `group` and `hand_written` (verb ->
    function), in `LISTED` order."""
    every = {c: f for c, f in COMMANDS.items() if c.partition(" ")[0] == group}
    every |= {f"{group} {verb}": f for verb, f in hand_written.items()}
    for command in sorted(every, key=lambda c: LISTED.index(c) if c in LISTED else len(LISTED)):
        app.command(command.partition(" ")[2])(every[command])
