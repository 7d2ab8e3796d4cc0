"""Typed configs of the reward, as recipes write them. Import-light: no torch, no judge models."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, NonNegativeFloat, NonNegativeInt, PositiveInt, model_validator

from memrl.core import models
from memrl.core.schema import StrictModel
from memrl.rollout.config import ModelConfig, SamplingConfig


def default_cache_dir() -> Path:
    return models.cache_dir() / "judge"


class JudgeConfig(StrictModel):
    """Which judge grades coverage: `offline` (MiniLM + taxonomy, deterministic) or `llm` (any backend)."""

    kind: Literal["offline", "llm"] = "offline"
    model: ModelConfig | None = Field(default=None, description="the judge model; required for kind llm")
    embedding_model: str = Field(default="all-minilm-l6-v2", description="offline judge: sentence embedding model")
    cache_dir: str | None = Field(default=None, description="llm verdict cache; default <memrl cache>/judge")
    cache: bool = True
    concurrency: PositiveInt = Field(default=8, description="llm judge requests in flight at most")
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


class RewardConfig(StrictModel):
    """Total reward = coverage_weight * coverage + format_weight * format - length penalty."""

    judge: JudgeConfig = Field(default_factory=JudgeConfig)
    coverage_weight: float = 1.0
    format_weight: float = 1.0
    length_penalty: LengthPenaltyConfig | None = None
    # Grade a reply with no JSON contract as plain notes (the CLI does); in training such a reply is discarded by
    # the agent, so its notes are "" and coverage is 0.
    plain_text_notes: bool = False
