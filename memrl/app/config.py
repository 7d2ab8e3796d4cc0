"""Typed recipe schema. Every model forbids unknown keys, so a typo fails validation instead of being ignored."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, PositiveInt, model_validator

from memrl.core.schema import StrictModel
from memrl.envs.collab.config import CollabEvalConfig
from memrl.rewards.config import RewardConfig
from memrl.rollout.config import ModelConfig, SamplingConfig
from memrl.train.config import GRPOStage, JudgerStage, SFTStage


class LoggingConfig(StrictModel):
    """Experiment tracking. wandb runs offline unless a recipe asks otherwise."""

    backend: Literal["wandb", "none"] = "wandb"
    mode: Literal["offline", "online", "disabled"] = "offline"
    project: str = "memrl"
    entity: str | None = None


# ---- stages: run in recipe order by `memrl run` -------------------------------------------------------------


class PullModelsStage(StrictModel):
    """Prepare embedded offline models in the cache."""

    kind: Literal["pull_models"]
    models: list[str] = Field(min_length=1)


class GenerateStage(StrictModel):
    """One completion per prompt, streamed to a JSONL file; a rerun skips prompts already answered."""

    kind: Literal["generate"]
    model: str = Field(description="a key of the recipe's `models`")
    prompts: list[str] = Field(default_factory=list)
    prompts_file: Path | None = Field(default=None, description="JSONL with a 'prompt' field, or plain text lines")
    system: str | None = None
    sampling: SamplingConfig = SamplingConfig()
    output: str = "generations.jsonl"

    @model_validator(mode="after")
    def _has_prompts(self) -> GenerateStage:
        if not self.prompts and self.prompts_file is None:
            raise ValueError("give `prompts` or `prompts_file`")
        return self


class ReflectionDataStage(StrictModel):
    """Collab sessions (train and eval users, disjoint) -> reflection datasets in every trainer's format."""

    kind: Literal["reflection_data"]
    collab: CollabEvalConfig = Field(
        default_factory=CollabEvalConfig, description="how sessions are generated; `users` and `split` are set here"
    )
    train_users: PositiveInt = 16
    eval_users: PositiveInt = 8
    gold: Literal["composed", "teacher"] = Field(
        default="composed", description="composed from the enforced preferences, or the run's own reflector"
    )
    train_sessions: list[Path] = Field(default_factory=list, description="use these sessions.jsonl, run nothing")
    eval_sessions: list[Path] = Field(default_factory=list)

    @model_validator(mode="after")
    def _both_or_neither(self) -> ReflectionDataStage:
        if bool(self.train_sessions) != bool(self.eval_sessions):
            raise ValueError("give both `train_sessions` and `eval_sessions`, or neither")
        return self


class ExportStage(StrictModel):
    """A checkpoint -> a standalone HF model folder (LoRA merged, tokenizer, model card)."""

    kind: Literal["export"]
    checkpoint: str = Field(description="a training stage of this recipe, or a checkpoint folder")


class OnlineCheck(StrictModel):
    """Plug each reflector into a collab evaluation and compare it with the first model listed."""

    collab: CollabEvalConfig = Field(default_factory=CollabEvalConfig)


class EvalReflectorStage(StrictModel):
    """Held-out reward of each model (base, SFT, GRPO, ...) on the eval split; writes the run's report.json."""

    kind: Literal["eval_reflector"]
    data: str = Field(description="a reflection_data stage of this recipe, or a dataset folder it wrote")
    models: dict[str, str] = Field(
        min_length=1, description="label -> a recipe model key, a stage of this recipe, or a model folder"
    )
    reward: RewardConfig = RewardConfig()
    sampling: SamplingConfig = SamplingConfig(temperature=0.0, max_tokens=256)
    max_samples: PositiveInt | None = None
    online: OnlineCheck | None = None


class EvalJudgerStage(StrictModel):
    """Recall@k of the gold memories on the eval split: retrieval alone, the judger alone, fused across alpha; AUC."""

    kind: Literal["eval_judger"]
    judger: str | None = Field(
        default=None, description="a judger stage of this recipe or a trained judger folder; null: retrieval only"
    )
    data: str | None = Field(
        default=None, description="judger data folder (its eval/ split) or a stage of this recipe; default: `data`"
    )
    retriever: Literal["dense", "bm25", "hybrid"] = "dense"
    top_units: PositiveInt | None = Field(default=3, description="memory units kept by intent alignment; null: all")
    alpha: float = Field(default=0.5, ge=0, le=1, description="fused = alpha * retrieval + (1 - alpha) * judger")
    alphas: list[Annotated[float, Field(ge=0, le=1)]] = Field(default_factory=lambda: [0.0, 0.25, 0.5, 0.75, 1.0])
    ks: list[PositiveInt] = Field(default_factory=lambda: [1, 3, 5], min_length=1)
    batch_size: PositiveInt = 32
    max_queries: PositiveInt | None = Field(default=None, description="only the first N queries (smoke runs)")


StageConfig = Annotated[
    PullModelsStage
    | GenerateStage
    | ReflectionDataStage
    | SFTStage
    | GRPOStage
    | ExportStage
    | EvalReflectorStage
    | JudgerStage
    | EvalJudgerStage,
    Field(discriminator="kind"),
]


class Recipe(StrictModel):
    name: str
    smoke: list[str] = Field(
        default_factory=list, description="overrides `memrl run --smoke` applies: a tiny model, a few steps"
    )
    description: str = ""
    seed: int = 0
    output_dir: Path | None = Field(default=None, description="defaults to runs/<name>")
    data: str | None = Field(
        default=None, description="dataset folder for the stages that read data and name none (`memrl run R data=DIR`)"
    )
    models: dict[str, ModelConfig] = Field(default_factory=dict)
    logging: LoggingConfig = LoggingConfig()
    stages: dict[str, StageConfig] = Field(default_factory=dict)

    @property
    def run_dir(self) -> Path:
        return self.output_dir or Path("runs") / self.name

    @model_validator(mode="after")
    def _stage_models_exist(self) -> Recipe:
        for stage_name, stage in self.stages.items():
            ref = getattr(stage, "model", None)
            if ref is not None and ref not in self.models:
                have = ", ".join(self.models) or "none"
                raise ValueError(f"stages.{stage_name}.model: {ref!r} is not a key of `models` (have: {have})")
        order = list(self.stages)
        for stage_name, stage in self.stages.items():
            for key in ("data", "init", "checkpoint", "judger"):
                ref = getattr(stage, key, None)
                if ref in self.stages and order.index(ref) >= order.index(stage_name):
                    raise ValueError(f"stages.{stage_name}.{key}: stage {ref!r} does not run before {stage_name!r}")
        return self
