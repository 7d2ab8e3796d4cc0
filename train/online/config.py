"""The recipe stage `collab_grpo`: multi-turn GRPO of the agent inside the collab environment (TRL on one node, or
verl on GPU clusters through its agent loop)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, NonNegativeFloat, PositiveFloat, PositiveInt, model_validator

from memrl.core.schema import StrictModel
from memrl.envs.collab.config import CollabEvalConfig
from memrl.envs.collab.prompts import ReplyFormat
from memrl.envs.collab.rows import RowAgent
from memrl.rewards.collab_episode import EpisodeRewardWeights
from memrl.rollout.config import ModelConfig, SamplingConfig
from memrl.train.config import PolicyOptimStage


class CollabRLConfig(StrictModel):
    """The sessions a policy trains on: train-split users and problems (disjoint from `memrl eval collab`'s)."""

    task: str = Field(default="arith", description="problem set: arith (shipped), math-500, logiqa, mmlu, medqa, ...")
    problems: Path | None = Field(default=None, description="local JSON/JSONL/parquet or cache folder; default: hub")
    eval_problems: PositiveInt = Field(default=100, description="problems held out for eval, never trained on")
    resplit: bool = Field(
        default=False, description="as `memrl eval collab --resplit`: set it the same way on both, or they overlap"
    )
    users: PositiveInt = Field(default=8, description="train users, each with a persona and three preferences")
    sessions: PositiveInt = Field(default=4, description="problems per user: rows are users x sessions")
    max_turns: PositiveInt = Field(default=4, description="agent replies per episode")
    agent: RowAgent = Field(
        default="none", description="what the policy knows of the user: nothing, or its stated preferences"
    )
    reply: ReplyFormat = Field(
        default="json", description="how the policy replies: json (the agent's contract) | text (the message alone)"
    )
    preferences: list[str] | None = Field(
        default=None, description="users hold only these preference ids (train and held-out alike); default: all 20"
    )
    simulator: Literal["rule", "llm"] = Field(default="rule", description="the user: rule (checkers) | llm")
    user_model: ModelConfig | None = Field(default=None, description="the LLM user's model (simulator: llm)")
    user_sampling: SamplingConfig = SamplingConfig(temperature=1.0, max_tokens=256, seed=0)
    seed: int = Field(default=0, description="seed of users, problems and the rule user")
    workers: PositiveInt | None = Field(
        default=None, description="step the episodes' users on this many Ray actors; null: in-process"
    )
    ray_address: str | None = Field(default=None, description="Ray cluster of the actors; default: a local Ray")

    @model_validator(mode="after")
    def _user_model_for_llm(self) -> CollabRLConfig:
        if self.simulator == "llm" and self.user_model is None:
            raise ValueError("simulator llm needs a user_model")
        return self

    def eval_config(self) -> CollabEvalConfig:
        """The evaluation config whose train split these rows are drawn from."""
        return CollabEvalConfig(
            task=self.task,
            problems=self.problems,
            split="train",
            eval_problems=self.eval_problems,
            resplit=self.resplit,
            users=self.users,
            sessions=self.sessions,
            seed=self.seed,
            reply=self.reply,
            preferences=self.preferences,
        )


class CollabGRPOStage(PolicyOptimStage):
    """The policy is the agent: each GRPO group plays one session (user, problem, knowledge) `rollouts` times."""

    kind: Literal["collab_grpo"]
    env: CollabRLConfig = Field(default_factory=CollabRLConfig, description="the sessions and the simulated user")
    reward: EpisodeRewardWeights = Field(
        default_factory=EpisodeRewardWeights, description="weights of the reward parts"
    )
    lr: PositiveFloat = 1e-5
    max_steps: PositiveInt = 50
    batch_size: PositiveInt = Field(default=2, description="sessions per step")
    rollouts: PositiveInt = Field(default=4, description="episodes per session (the GRPO group)")
    kl_coef: NonNegativeFloat = Field(default=0.0, description="KL loss coefficient; 0 drops the reference model")
    max_turn_tokens: PositiveInt = Field(default=128, description="tokens of one agent reply")
    max_episode_tokens: PositiveInt = Field(
        default=1024,
        description="tokens of a whole episode after its prompt; an episode that would overrun it is "
        "stopped and gets no reward (counted as episode/over_budget)",
    )

    @property
    def response_budget(self) -> int:
        return self.max_episode_tokens

    @model_validator(mode="after")
    def _one_reply_fits(self) -> CollabGRPOStage:
        if self.max_episode_tokens <= self.max_turn_tokens:
            raise ValueError("max_episode_tokens must exceed max_turn_tokens: no reply would fit")
        return self

    @model_validator(mode="after")
    def _actors_for_trl(self) -> CollabGRPOStage:
        if self.trainer == "verl" and self.env.workers is not None:
            raise ValueError(
                "env.workers is for trainer trl: verl already runs each episode inside its own AgentLoopWorker Ray "
                "actors; remove env.workers"
            )
        return self
