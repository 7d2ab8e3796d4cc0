"""Every model a stage calls over HTTP, with the role it plays there: what a run probes before it starts and what
the placement plan and `memrl preflight` name.

A stage's schema holds its endpoint models in a few known places (the reward's judge and outcome agents, the collab
user); any other OpenAI-compatible model found in the stage is reported under its dotted key, so a new stage kind
is covered without a line here.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel

from memrl.core.errors import ConfigError
from memrl.rollout.config import OpenAIModelConfig
from memrl.rollout.probe import Endpoint

M = TypeVar("M", bound=BaseModel)

# Dotted keys of a stage -> the role the model plays there (what placement and the probe call it).
ROLES = {
    "reward.judge.model": "judge",
    "reward.outcome.agent": "outcome agent",
    "reward.outcome.judge": "outcome judge",
    "env.user_model": "user",
    "collab.model": "teacher",  # reflection_data: the model that plays the sessions and writes the gold notes
}


def stage_models(stage: BaseModel) -> dict[str, Any]:
    """Every model config inside `stage` by role, whatever its backend (hf, openai, vllm)."""
    found: dict[str, Any] = {}
    _walk(stage, (), found)
    return found


def stage_endpoints(stage: BaseModel) -> list[Endpoint]:
    """The HTTP models `stage` calls, each with its role, in schema order."""
    return [
        Endpoint(role, model) for role, model in stage_models(stage).items() if isinstance(model, OpenAIModelConfig)
    ]


def _walk(node: BaseModel, path: tuple[str, ...], found: dict[str, Any]) -> None:
    for name in type(node).model_fields:
        value = getattr(node, name)
        key = (*path, name)
        if isinstance(value, BaseModel) and "backend" in type(value).model_fields:
            dotted = ".".join(key)
            found[ROLES.get(dotted, dotted)] = value
        elif isinstance(value, BaseModel):
            _walk(value, key, found)


def per_process(config: M, processes: int, where: str = "") -> M:
    """`config` with the `max_concurrency` of every HTTP model in it divided over `processes` processes that each
    hold their own client (TRL's ranks under accelerate), so that together they keep the recipe's bound, as verl's
    reward and agent-loop workers do. A bound smaller than the processes is refused in one line."""
    if processes <= 1:
        return config
    updates: dict[str, Any] = {}
    for name in type(config).model_fields:
        value, key = getattr(config, name), f"{where}.{name}" if where else name
        if isinstance(value, OpenAIModelConfig):
            each = value.max_concurrency // processes
            if each == 0:
                raise ConfigError(
                    f"{key}.max_concurrency {value.max_concurrency} is fewer requests than the {processes} training "
                    "processes that share it; raise it to at least their number"
                )
            updates[name] = value.model_copy(update={"max_concurrency": each})
        elif isinstance(value, BaseModel):
            divided = per_process(value, processes, key)
            if divided is not value:
                updates[name] = divided
    return config.model_copy(update=updates) if updates else config
