"""Typed recipe schema. Every model forbids unknown keys, so a typo fails validation instead of being ignored."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, model_validator

from memrl.rollout.config import ModelConfig, SamplingConfig
from memrl.schema import StrictModel


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


StageConfig = Annotated[PullModelsStage | GenerateStage, Field(discriminator="kind")]


class Recipe(StrictModel):
    name: str
    description: str = ""
    seed: int = 0
    output_dir: Path | None = Field(default=None, description="defaults to runs/<name>")
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
        return self
