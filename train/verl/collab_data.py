"""The dataset verl's agent loop trains the collab agent on: one parquet row per session, selecting the loop by name.

verl's `RLHFDataset` hands every column of a row to the agent loop its `agent_name` names (`memrl_collab`), so a row
carries all the loop needs: `extra_info.episode` (the session's JSON spec, `episode_rows`) and `extra_info.settings`
(`LoopSettings`: the simulated user, the reward weights, the reply budget). `prompt` is the policy's context with the
problem as the user's opening: what verl measures to drop over-long prompts (the loop itself prompts with the
opening the user actually says). The LLM user's API key is never written: the loop reads it from MEMRL_USER_API_KEY.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import PositiveInt, SecretStr

from memrl.core.schema import StrictModel
from memrl.envs.collab.rows import row_context
from memrl.rewards.collab_episode import EpisodeRewardWeights
from memrl.rollout.config import OpenAIModelConfig
from memrl.train.online.config import CollabRLConfig

AGENT_NAME = "memrl_collab"  # the loop's name in verl's agent-loop registry, and the rows' `agent_name`
DATA_SOURCE = "memrl_collab"  # verl groups validation metrics by it: val-aux/memrl_collab/<part>/mean@N
USER_KEY_ENV = "MEMRL_USER_API_KEY"
TRAIN_FILE, EVAL_FILE = "train.parquet", "eval.parquet"


class LoopSettings(StrictModel):
    """What the agent loop needs beyond a row's session: the environment, the reward weights, one reply's tokens."""

    env: CollabRLConfig
    reward: EpisodeRewardWeights
    max_turn_tokens: PositiveInt

    def public(self) -> LoopSettings:
        """These settings without the LLM user's API key (it would land in the parquet)."""
        model = self.env.user_model
        if not isinstance(model, OpenAIModelConfig) or model.api_key is None:
            return self
        env = self.env.model_copy(update={"user_model": model.model_copy(update={"api_key": None})})
        return self.model_copy(update={"env": env})

    @classmethod
    def load(cls, raw: str, environ: Mapping[str, str]) -> LoopSettings:
        """A row's settings, the LLM user's API key filled in from MEMRL_USER_API_KEY when it is set."""
        settings = cls.model_validate_json(raw)
        model, key = settings.env.user_model, environ.get(USER_KEY_ENV)
        if not isinstance(model, OpenAIModelConfig) or model.api_key is not None or not key:
            return settings
        env = settings.env.model_copy(update={"user_model": model.model_copy(update={"api_key": SecretStr(key)})})
        return settings.model_copy(update={"env": env})

    def user_key(self) -> dict[str, str]:
        """The environment entry that hands the LLM user's API key to the loop, if it has one."""
        model = self.env.user_model
        if isinstance(model, OpenAIModelConfig) and model.api_key is not None:
            return {USER_KEY_ENV: model.api_key.get_secret_value()}
        return {}


def agent_rows(specs: list[str], settings: LoopSettings) -> list[dict[str, Any]]:
    """verl rows for the sessions `specs` (from `episode_rows`), in order."""
    shown = settings.public().model_dump_json()
    rows = []
    for index, spec in enumerate(specs):
        row = json.loads(spec)
        context = row_context(row, settings.max_turn_tokens)
        opening = {"role": "user", "content": row["problem"]["question"]}
        rows.append(
            {
                "prompt": [*context, opening],
                "data_source": DATA_SOURCE,
                "agent_name": AGENT_NAME,
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
