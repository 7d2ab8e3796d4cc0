"""memrl's worlds by name, as an outside trainer plays them: the served half of each world in the world table.

A world's served half (`Served`, memrl.envs.served; the `served` of its entry in memrl.envs.registry, written in the
world's own package, `envs/<world>/served.py`) is a config and a `ServedWorld` built from it, which builds one
`Episode` (memrl.envs.episode) per seed: every draw the world makes comes from that seed, so one seed and one list of
replies play one episode. The episodes are the worlds' own; nothing here steps a user. `reward` turns a finished
episode (its record and last reward parts) into the one number a trainer's interface carries. Nothing here names a
world: a world registered with a served half is served.

The configs are the flags of `memrl world serve WORLD` and the keyword arguments of
`memrl.integrations.verifiers.load_environment(world=...)`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memrl.core.errors import ConfigError
from memrl.core.schema import StrictModel
from memrl.envs.registry import served_worlds
from memrl.envs.served import Served, ServedWorld

SEEDS = 2**31  # a seed the server draws when a reset names none


def served(name: str) -> Served:
    """The served half of world `name`; one line naming the served worlds otherwise."""
    worlds = served_worlds()
    if name not in worlds:
        raise ConfigError(f"unknown world {name!r} (worlds: {', '.join(worlds)})")
    return worlds[name]


def world_config(name: str) -> type[StrictModel]:
    """The config model of world `name`; one line naming the worlds otherwise."""
    return served(name).config


def build_world(name: str, config: StrictModel | Mapping[str, Any] | None = None) -> ServedWorld:
    """World `name` built from its config (a model, or its fields as a mapping, validated in one line)."""
    half = served(name)
    model = half.config
    if not isinstance(config, model):
        from pydantic import ValidationError

        from memrl.core.schema import describe_error

        try:
            config = model.model_validate(dict(config or {}))
        except ValidationError as exc:
            raise ConfigError(f"world {name}: {describe_error(exc, model)}") from None
    return half.build(config)


def system_prompt(world: str, reply_tokens: int = 256) -> str:
    """A system prompt for an agent that plays world `world` from outside (the observations of one collab session,
    TOD and PAHF carry none), stating the reply budget `reply_tokens` where the world's prompt states one."""
    return served(world).system_prompt(reply_tokens)
