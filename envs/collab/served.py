"""MultiSessionCollab served to outside trainers (envs/served.py): `memrl world serve collab`, verifiers' collab.

`CollabWorldConfig` is the server's flags; `CollabWorld` draws a user with three preferences and problems of the
task from the seed, and plays one session (`CollabEpisode`) or several with notes carried between them
(`MultiSessionEpisode`) with the rule user or an LLM user. Its reward is collab's GRPO reward for one session and the
share of preferences met in the later sessions for several. The agent's system prompt is memrl's own agent prompt.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from memrl.core.errors import ConfigError
from memrl.core.schema import StrictModel
from memrl.envs.episode import Episode
from memrl.envs.served import Served, no_options
from memrl.rewards.collab_episode import EpisodeRewardWeights, episode_parts
from memrl.rollout.base import ChatBackend, SamplingParams
from memrl.rollout.config import ModelConfig


class CollabWorldConfig(StrictModel):
    """MultiSessionCollab: a user with three preferences, problems of a task, the rule or an LLM user."""

    task: str = Field(default="arith", description="problem task (arith needs no data; others need --problems)")
    problems: Path | None = Field(default=None, description="a local problem file or folder of the task")
    sessions: int = Field(default=1, ge=1, le=50, description="sessions per episode; the notes carry between them")
    reflector: Literal["policy", "oracle", "empty"] = Field(
        default="policy", description="who writes the notes between sessions: policy | oracle | empty"
    )
    user: Literal["rule", "llm"] = Field(default="rule", description="the simulated user: rule | llm")
    user_model: ModelConfig | None = Field(default=None, description="the LLM user's model (with --user llm)")
    max_turns: int = Field(default=10, ge=1, le=100, description="agent replies per session")
    reply_tokens: int = Field(default=256, ge=1, description="the reply budget the agent prompt states")


class CollabWorld:
    name = "collab"

    def __init__(self, cfg: CollabWorldConfig) -> None:
        from memrl.envs.collab.grading import Grader
        from memrl.envs.collab.problems import load_problems

        if cfg.user == "llm" and cfg.user_model is None:
            raise ConfigError("collab: --user llm needs --user-model NAME@URL")
        self.cfg = cfg
        self.grader = Grader()
        self.problems = load_problems(cfg.task, cfg.problems)
        if len(self.problems) < cfg.sessions:
            raise ConfigError(f"collab: task {cfg.task!r} has {len(self.problems)} problems, fewer than {cfg.sessions}")
        self._backend: ChatBackend | None = None
        if cfg.user_model is not None and cfg.user == "llm":
            from memrl.rollout.builder import build_backend

            self._backend = build_backend(cfg.user_model)
        self.weights = EpisodeRewardWeights()

    def episode(self, seed: int, *, reflector: str | None = None, **unknown: Any) -> Episode:
        """`reflector` (policy | oracle | empty) overrides the config's for this episode (several sessions)."""
        from memrl.envs.collab.multi_session import REFLECTORS, MultiSessionEpisode
        from memrl.envs.collab.profiles import sample_profiles
        from memrl.envs.collab.session import CollabEpisode, SessionSpec
        from memrl.envs.collab.user_sim import LLMUserSimulator, RuleUserSimulator, UserSimulator

        no_options(self.name, unknown)
        if reflector is not None and reflector not in REFLECTORS:
            raise ValueError(f"reflector must be one of {', '.join(REFLECTORS)}, not {reflector!r}")
        profile = sample_profiles(1, seed)[0]
        problems = random.Random(seed).sample(self.problems, self.cfg.sessions)
        specs = [SessionSpec(profile, problem, i) for i, problem in enumerate(problems)]
        simulator: UserSimulator = (
            RuleUserSimulator(self.grader, seed)
            if self._backend is None
            else LLMUserSimulator(self._backend, SamplingParams(temperature=1.0, max_tokens=512, seed=seed))
        )
        if self.cfg.sessions == 1:
            return CollabEpisode(specs[0], simulator, self.grader, self.cfg.max_turns)
        return MultiSessionEpisode(
            specs,
            simulator,
            self.grader,
            reflector=reflector or self.cfg.reflector,
            max_turns=self.cfg.max_turns,
            reply_tokens=self.cfg.reply_tokens,
        )

    def reward(self, record: Mapping[str, Any], parts: Mapping[str, float]) -> float:
        """One session: the collab GRPO reward (`EpisodeRewardWeights.total` of its parts); several: the share of
        preferences met in the sessions after the first."""
        if self.cfg.sessions > 1:
            return parts["preference"]
        return self.weights.total(episode_parts(record))

    def close(self) -> None:
        if self._backend is not None:
            self._backend.close()


def system_prompt(reply_tokens: int = 256) -> str:
    """memrl's own agent prompt (no notes, replies in text): the observations of one session carry none."""
    from memrl.envs.collab.prompts import agent_messages

    return agent_messages("none", "", [], reply_tokens, "text")[0]["content"]


SERVED = Served(
    CollabWorldConfig,
    CollabWorld,
    help="MultiSessionCollab: a user with preferences; --sessions N carries the agent's notes between sessions.",
    metrics=("task_success", "user_effort", "length"),
    system=system_prompt,
)
