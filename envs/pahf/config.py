"""Typed config of a PAHF evaluation (what `memrl eval pahf` builds from its flags)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Literal

from pydantic import Field, PositiveInt

from memrl.core.errors import ConfigError
from memrl.core.schema import StrictModel
from memrl.envs.pahf.agent import AgentKind, AgentSampling, Domain
from memrl.envs.pahf.shopping import Style
from memrl.rollout.base import SamplingParams
from memrl.rollout.config import HFModelConfig, ModelConfig, SamplingConfig


class PahfSampling(StrictModel):
    """Sampling per model call: greedy, so a rerun of the same setup says the same things."""

    decision: SamplingConfig = SamplingConfig(temperature=0.0, max_tokens=160)
    summary: SamplingConfig = SamplingConfig(temperature=0.0, max_tokens=96)
    salience: SamplingConfig = SamplingConfig(temperature=0.0, max_tokens=16)
    note: SamplingConfig = SamplingConfig(temperature=0.0, max_tokens=64)
    merge: SamplingConfig = SamplingConfig(temperature=0.0, max_tokens=80)
    user: SamplingConfig = SamplingConfig(temperature=0.0, max_tokens=64)

    def agent(self, seed: int) -> AgentSampling:
        def p(cfg: SamplingConfig) -> SamplingParams:
            return replace(cfg.params(), seed=seed)

        return AgentSampling(p(self.decision), p(self.summary), p(self.salience), p(self.note), p(self.merge))

    def user_params(self, seed: int) -> SamplingParams:
        return replace(self.user.params(), seed=seed)


class PahfEvalConfig(StrictModel):
    domain: Domain = Field(description="shopping | embodied")
    data: Path = Field(description="released layout: a folder holding shopping/ or embodied/, or that folder itself")
    agent: AgentKind = Field(
        default=AgentKind.PAHF,
        description="none | pre (asks before acting) | post (learns from feedback) | pahf (both)",
    )
    memory: Literal["sqlite", "faiss"] = Field(default="sqlite", description="note store: sqlite | faiss")
    users: PositiveInt | None = Field(default=None, description="the first N users (phase-1 order); None: all")
    scenarios: PositiveInt | None = Field(default=None, description="first N scenarios per user per phase")
    passes: PositiveInt = Field(default=1, description="passes over the scenarios of each learning phase")
    tau: float = Field(default=0.8, ge=0.0, le=1.0, description="merge into the nearest note above this cosine")
    top_k: PositiveInt = Field(default=5, description="notes retrieved per task")
    feedback_style: Style = Field(default="minimal", description="minimal | detailed")
    user_sim: Literal["rule", "llm"] = Field(
        default="rule", description="who answers questions (and gives embodied feedback): data rules or an LLM"
    )
    model: ModelConfig = Field(default=HFModelConfig(backend="hf", model="smollm2"), description="the agent's model")
    user_model: ModelConfig | None = Field(default=None, description="LLM persona user; default: `model`")
    writer_model: ModelConfig | None = Field(
        default=None, description="writes memory (salience, note, merge), e.g. a trained reflector; default: `model`"
    )
    embedder: str = Field(default="all-minilm-l6-v2", description="sentence embedder of the note store")
    sampling: PahfSampling = PahfSampling()
    seed: int = Field(default=0, description="seed of sampling and of every random choice")
    workers: PositiveInt | None = Field(
        default=None,
        description="Ray actors; default: min(users, CPUs, 8), or none on a local run whose models are all `hf` (one "
        "worker in this process batches their requests)",
    )
    max_in_flight: PositiveInt = Field(default=32, description="requests in flight per model endpoint")
    ray_address: str | None = Field(default=None, description="Ray cluster address; default: a local Ray")

    def user_model_or_default(self) -> ModelConfig:
        return self.user_model or self.model

    def domain_dir(self) -> Path:
        """`data/<domain>` when it exists, else `data` itself (the domain folder was given)."""
        if not self.data.is_dir():
            raise ConfigError(f"--data {self.data}: not a folder")
        inner = self.data / self.domain
        return inner if inner.is_dir() else self.data
