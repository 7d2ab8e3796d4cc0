"""Typed recipe schema. Every model forbids unknown keys, so a typo fails validation instead of being ignored."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, model_validator
from rich.console import Console

from memrl.app.context import LoggingConfig, RunContext
from memrl.app.stages.registry import StageConfig, StageSpec, kind_of
from memrl.core.schema import PlainName, StrictModel, plain_name_problem
from memrl.rollout.config import ModelConfig


def field_at(stage: object, key: str) -> object:
    """A stage's field by dotted key (`env.data`); None where the stage has none."""
    value = stage
    for part in key.split("."):
        value = getattr(value, part, None)
    return value


class Recipe(StrictModel):
    name: PlainName = Field(description="names the run folder (runs/<name>) and the run in logs")
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

    def context(self, run_dir: Path, console: Console) -> RunContext:
        """What every stage of a run in `run_dir` may know of it; `needs` gives one stage what else it needs."""
        stages = {name: stage.kind for name, stage in self.stages.items()}
        return RunContext(self.name, self.seed, run_dir, console, self.models, self.logging, self.data, stages)

    def needs(self, name: str) -> dict[str, StageSpec]:
        """The specs of the stages that stage `name` names in the fields its kind declares it needs."""
        stage = self.stages[name]
        refs = (field_at(stage, key) for key in kind_of(stage).needs)
        return {str(ref): self.stages[str(ref)] for ref in refs if ref is not None and str(ref) in self.stages}

    @model_validator(mode="after")
    def _stage_models_exist(self) -> Recipe:
        for stage_name in self.stages:  # each names its folder in the run folder: `../x` would write outside it
            if problem := plain_name_problem(stage_name):
                raise ValueError(f"stages: stage name {problem}")
        for stage_name, stage in self.stages.items():
            ref = getattr(stage, "model", None)
            if isinstance(ref, str) and ref not in self.models:
                have = ", ".join(self.models) or "none"
                raise ValueError(f"stages.{stage_name}.model: {ref!r} is not a key of `models` (have: {have})")
        order = list(self.stages)
        for stage_name, stage in self.stages.items():
            for key in kind_of(stage).refs:
                ref = field_at(stage, key)
                ref = None if ref is None else str(ref)
                if ref in self.stages and order.index(ref) >= order.index(stage_name):
                    raise ValueError(f"stages.{stage_name}.{key}: stage {ref!r} does not run before {stage_name!r}")
        return self
