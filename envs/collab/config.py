"""Typed config of a multi-session collab evaluation (what `memrl eval collab` builds from its flags)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, PositiveInt

from memrl.core.schema import StrictModel
from memrl.envs.collab.agents import AgentKind
from memrl.envs.collab.prompts import ReplyFormat
from memrl.rollout.config import HFModelConfig, ModelConfig, SamplingConfig

# What may change between a run and its resumption besides how the work runs (runfolder.RUNTIME_KEYS): how much.
RESUMABLE_CHANGES = {"sessions"}


class CollabSampling(StrictModel):
    """Sampling per role. The LLM user samples as the original harness does (temperature 1.0, 1,024 tokens; cut
    replies are counted in the metrics' `truncations`); the other budgets fit each role's JSON on the CPU default
    model: raise them for real models."""

    agent: SamplingConfig = SamplingConfig(temperature=0.7, max_tokens=96, seed=0)
    retrieval: SamplingConfig = SamplingConfig(temperature=0.0, max_tokens=64)
    user: SamplingConfig = SamplingConfig(temperature=1.0, max_tokens=1024, seed=0)
    reflector: SamplingConfig = SamplingConfig(temperature=0.7, max_tokens=192, seed=0)
    judge: SamplingConfig = SamplingConfig(temperature=0.0, max_tokens=128)


class CollabEvalConfig(StrictModel):
    task: str = Field(
        default="arith", description="problem set: arith (shipped), math-500, math-hard, logiqa, mmlu, medqa"
    )
    problems: Path | None = Field(default=None, description="local JSON/JSONL/parquet or cache folder; default: hub")
    split: Literal["train", "eval"] = Field(
        default="eval", description="eval | train: which disjoint half of users and problems"
    )
    eval_problems: PositiveInt = Field(
        default=100, description="problems held out for eval, the rest is train (unused on a release cache's own split)"
    )
    resplit: bool = Field(
        default=False,
        description="merge a release cache's trainset and testset files and hold out --eval-problems of them again "
        "(memrl's earlier behaviour); default: the release's own split, train = trainset, eval = testset",
    )
    profiles: Path | None = Field(
        default=None, description="user profiles file, split in halves by --seed like sampled users; default: sampled"
    )
    users: PositiveInt = Field(default=4, description="simulated users, each with a persona and three preferences")
    sessions: PositiveInt = Field(default=20, description="sessions per user, in order")
    max_turns: PositiveInt = Field(default=10, description="user-agent exchanges per session")
    original_harness: bool = Field(
        default=False,
        description="play the original harness's session rules (agent greets first, stop token only, last said "
        "draft graded, greeting counted in length); see docs/collab.md",
    )
    agent: AgentKind = Field(default=AgentKind.MEMORY, description="memory | none | oracle | history-3 | history-all")
    reply: ReplyFormat = Field(
        default="json", description="the agent's reply: json (the paper's contract) | text (the message alone)"
    )
    preferences: list[str] | None = Field(
        default=None,
        description="sampled users hold only these preference ids (at least three categories); a profiles file "
        "keeps the users whose three preferences are all listed; default: all 20",
    )
    simulator: Literal["rule", "llm"] = Field(default="rule", description="the user simulator: rule (checkers) | llm")
    model: ModelConfig = Field(default=HFModelConfig(backend="hf", model="smollm2"), description="the agent's model")
    user_model: ModelConfig | None = Field(default=None, description="LLM user simulator; default: `model`")
    reflector: ModelConfig | None = Field(default=None, description="session-level reflection; default: `model`")
    judge: ModelConfig | None = Field(default=None, description="grades free-form answers; default: user model")
    sampling: CollabSampling = CollabSampling()
    seed: int = Field(default=0, description="seed of users, problems and sampling")
    workers: PositiveInt | None = Field(
        default=None,
        description="Ray actors; default: min(users, CPUs, 8), or none on a local run whose models are all `hf` (one "
        "worker in this process batches their requests)",
    )
    max_in_flight: PositiveInt = Field(default=32, description="requests in flight per model endpoint, all workers")
    ray_address: str | None = Field(default=None, description="Ray cluster address; default: a local Ray")

    def user_model_or_default(self) -> ModelConfig:
        return self.user_model or self.model

    def reflector_or_default(self) -> ModelConfig:
        return self.reflector or self.model

    def judge_or_default(self) -> ModelConfig:
        return self.judge or self.user_model_or_default()
