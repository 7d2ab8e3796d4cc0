"""Typed configs of the reward, as recipes write them. Import-light: no torch, no judge models."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, NonNegativeFloat, NonNegativeInt, PositiveInt, model_validator

from memrl.core import models
from memrl.core.schema import StrictModel
from memrl.rewards.format import ReplyFormat
from memrl.rollout.config import HFModelConfig, ModelConfig, SamplingConfig


def default_cache_dir() -> Path:
    return models.cache_dir() / "judge"


class JudgeConfig(StrictModel):
    """Which judge grades coverage: `offline` (MiniLM + taxonomy, deterministic) or `llm` (any backend).

    An llm judge over an endpoint keeps at most `model.max_concurrency` requests in flight: that one setting.
    """

    kind: Literal["offline", "llm"] = "offline"
    model: ModelConfig | None = Field(default=None, description="the judge model; required for kind llm")
    embedding_model: str = Field(default="all-minilm-l6-v2", description="offline judge: sentence embedding model")
    cache_dir: str | None = Field(default=None, description="llm verdict cache; default <memrl cache>/judge")
    cache: bool = True
    retries: NonNegativeInt = Field(default=2, description="llm judge re-asks after a malformed verdict")
    sampling: SamplingConfig = Field(default_factory=lambda: SamplingConfig(temperature=0.0, max_tokens=256))
    few_shot: bool = Field(default=True, description="llm judge: show one worked example before each item")

    @model_validator(mode="after")
    def _llm_needs_model(self) -> JudgeConfig:
        if self.kind == "llm" and self.model is None:
            raise ValueError("judge kind 'llm' needs a model (judge.model.backend and judge.model.model)")
        return self

    def cache_path(self) -> Path:
        return Path(self.cache_dir).expanduser() if self.cache_dir else default_cache_dir()


class LengthPenaltyConfig(StrictModel):
    """penalty = min(max_penalty, per_token * max(0, tokens - budget)), subtracted from the total.

    Tokens are words plus punctuation marks (tokenizer-free, so the reward does not change with the policy's
    tokenizer); `target` says whether the notes alone or the whole reply are counted.
    """

    budget: PositiveInt = 200
    per_token: NonNegativeFloat = 0.002
    max_penalty: NonNegativeFloat = 0.5
    target: Literal["notes", "completion"] = "notes"


class NextSessionRewardConfig(StrictModel):
    """The next-session outcome reward (memrl.train.rewards.next_session): the reflection's notes go to an agent in
    the user's next session with the rule user; the reward is the share of the user's preferences the agent's replies
    meet, minus the same share in that session played with no notes. Its `weight` joins the total."""

    weight: float = Field(default=1.0, description="weight of the outcome in the total reward")
    agent: ModelConfig | Literal["scripted"] = Field(
        default=HFModelConfig(backend="hf", model="smollm2"),
        description="the agent that reads the notes: a model, or `scripted` (rules of its own, no model: "
        "memrl.envs.collab.scripted_reader)",
    )
    sampling: SamplingConfig = SamplingConfig(temperature=0.0, max_tokens=96, seed=0)
    max_turns: PositiveInt = Field(default=2, description="agent replies per next session")
    reply: ReplyFormat = Field(
        default="json", description="the agent's reply format: json | text (a policy trained with reply: text)"
    )
    problems: Path | None = Field(default=None, description="problem file of the rows' task; default: shipped/hub")
    seed: int = Field(default=0, description="seed of the next problem drawn per row and of the rule user")
    judge: ModelConfig | None = Field(
        default=None, description="LLM judge of judge-only preferences (narrative, intuitive); null: left undecided"
    )
    data: str | None = Field(
        default=None,
        description="reflection_data folder whose train/eval.jsonl name each row's user; default: the stage's data",
    )
    cache_size: NonNegativeInt = Field(default=65536, description="sessions kept in memory by (notes, row); 0: off")
    workers: PositiveInt | None = Field(default=None, description="play the sessions on this many Ray actors")
    ray_address: str | None = Field(default=None, description="Ray cluster of the actors; default: a local Ray")

    @property
    def reader(self) -> str:
        """Who reads the notes, as reports name it: `scripted` or the agent model's name."""
        return self.agent if isinstance(self.agent, str) else self.agent.model


class UnscoredStop(StrictModel):
    """When a GRPO run stops because its rewards are missing: more than `max_share` of a step's samples unscored
    (a failed or unreachable judge, user or outcome agent) for `steps` steps in a row. `max_share: 1` never stops."""

    max_share: float = Field(default=0.5, ge=0, le=1, description="share of a step's samples left without a score")
    steps: PositiveInt = Field(default=3, description="consecutive steps above max_share that stop the run")


class RewardConfig(StrictModel):
    """Total reward = coverage_weight * coverage + format_weight * format - length penalty (+ outcome weight *
    outcome, where `outcome` is set and the trainer's adapter adds it)."""

    judge: JudgeConfig = Field(default_factory=JudgeConfig)
    coverage_weight: float = 1.0
    format_weight: float = 1.0
    length_penalty: LengthPenaltyConfig | None = None
    # Grade a reply with no JSON contract as plain notes (the CLI does); in training such a reply is discarded by
    # the agent, so its notes are "" and coverage is 0.
    plain_text_notes: bool = False
    outcome: NextSessionRewardConfig | None = Field(
        default=None, description="the next-session outcome reward, mixed in"
    )
