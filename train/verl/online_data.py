"""The dataset verl's agent loop trains an online policy on: one parquet row per session, selecting the loop by name.

verl's `RLHFDataset` hands every column of a row to the agent loop its `agent_name` names (`memrl_<world>`: one loop
class, registered under each online world's name), so a row carries all the loop needs: `extra_info.episode` (the
session's JSON spec, `episode_rows`) and `extra_info.settings` (`LoopSettings`: the world, its simulated user, the
reward weights, the reply budget). `prompt` is the policy's context with the opening the row tells (`PolicyView`):
what verl measures to drop over-long prompts (the loop itself prompts with the opening the world actually says). The
LLM user's API key is never written: the loop reads it from MEMRL_USER_API_KEY.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import PositiveInt, SecretStr, SerializeAsAny, model_validator

from memrl.core.schema import StrictModel
from memrl.envs.online import OnlineConfig
from memrl.envs.registry import online
from memrl.rewards.episode import PartWeights
from memrl.rollout.config import OpenAIModelConfig

USER_KEY_ENV = "MEMRL_USER_API_KEY"
TRAIN_FILE, EVAL_FILE = "train.parquet", "eval.parquet"


def agent_name(world: str) -> str:
    """The loop's name in verl's agent-loop registry and the rows' `agent_name`; verl also groups validation metrics
    by it as the rows' `data_source`: val-aux/memrl_<world>/<part>/mean@N."""
    return f"memrl_{world}"


class LoopSettings(StrictModel):
    """What the agent loop needs beyond a row's session: the world and its online config, the reward weights, one
    reply's tokens. `env` and `reward` are read as the world's own types (memrl.envs.registry)."""

    world: str
    env: SerializeAsAny[OnlineConfig]
    reward: SerializeAsAny[PartWeights]
    max_turn_tokens: PositiveInt

    @model_validator(mode="before")
    @classmethod
    def _world_types(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and isinstance(data.get("world"), str):
            entry = online(data["world"])
            data = dict(data)
            for key, model in (("env", entry.config), ("reward", entry.reward)):
                if isinstance(data.get(key), Mapping):
                    data[key] = model.model_validate(data[key])
        return data

    def _with_user_key(self, key: SecretStr | None) -> LoopSettings:
        model = self.env.user_model
        assert isinstance(model, OpenAIModelConfig)
        env = self.env.model_copy(update={"user_model": model.model_copy(update={"api_key": key})})
        return self.model_copy(update={"env": env})

    def public(self) -> LoopSettings:
        """These settings without the LLM user's API key (it would land in the parquet)."""
        model = self.env.user_model
        if not isinstance(model, OpenAIModelConfig) or model.api_key is None:
            return self
        return self._with_user_key(None)

    @classmethod
    def load(cls, raw: str, environ: Mapping[str, str]) -> LoopSettings:
        """A row's settings, the LLM user's API key filled in from MEMRL_USER_API_KEY when it is set."""
        settings = cls.model_validate_json(raw)
        model, key = settings.env.user_model, environ.get(USER_KEY_ENV)
        if not isinstance(model, OpenAIModelConfig) or model.api_key is not None or not key:
            return settings
        return settings._with_user_key(SecretStr(key))

    def user_key(self) -> dict[str, str]:
        """The environment entry that hands the LLM user's API key to the loop, if it has one."""
        model = self.env.user_model
        if isinstance(model, OpenAIModelConfig) and model.api_key is not None:
            return {USER_KEY_ENV: model.api_key.get_secret_value()}
        return {}


def agent_rows(specs: list[str], settings: LoopSettings) -> list[dict[str, Any]]:
    """verl rows for the sessions `specs` (from `episode_rows`), in order."""
    shown = settings.public().model_dump_json()
    name, view = agent_name(settings.world), online(settings.world).view
    rows = []
    for index, spec in enumerate(specs):
        seen = view(spec, settings.max_turn_tokens)
        rows.append(
            {
                "prompt": [*seen.context, *seen.opening],
                "data_source": name,
                "agent_name": name,
                "extra_info": {"index": index, "episode": spec, "settings": shown},
            }
        )
    return rows


def write_rows(rows: list[dict[str, Any]], path: Path) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path
