"""What each dataset builder is told: the config models of `memrl data tod|judger|pahf` and of the recipe stages
`reflection_data` and `generate`. Light on imports, so the CLI can build its flags without loading the builders."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, NonNegativeInt, PositiveInt, model_validator

from memrl.core.schema import FileName, StrictModel
from memrl.envs.collab.config import CollabEvalConfig
from memrl.rollout.config import SamplingConfig


class TodDataConfig(StrictModel):
    sgd_dir: Path = Field(description="SGD folder: schema.json + dialogues_*.json, or train/dev/test of them")
    individuals: PositiveInt = Field(description="individuals (users) to generate")
    tasks_per_individual: PositiveInt = Field(default=6, description="goals per person")
    writer: str = Field(default="template", description="template, or a model: NAME (local) or NAME@URL (endpoint)")
    memory: Literal["template", "llm"] = Field(
        default="template", description="memory units from templates, or from the writer's model"
    )
    seed: int = 0


class JudgerDataConfig(StrictModel):
    tod_dir: Path = Field(description="MS-TOD folder (persona_<id>.json, memory/, schema.json)")
    eval_individuals: PositiveInt | None = Field(default=None, description="individuals held out for eval")
    eval_fraction: float | None = Field(
        default=None, gt=0, lt=1, description="share of individuals held out (default 0.2)"
    )
    seed: int = 0
    schema_file: Path | None = Field(
        default=None,
        description="SGD schema.json, or an SGD folder (its train/dev/test schemas merged); "
        "default: TOD_DIR/schema.json",
    )
    strict: bool = Field(
        default=False, description="fail on the first foreign slot or unreadable file instead of dropping and counting"
    )
    memory_writer: str | None = Field(
        default=None,
        description="MODEL or MODEL@URL: an LLM writes memory from each session (folders without memory/); "
        "default: the deterministic text extractor",
    )

    @model_validator(mode="after")
    def _one_split(self) -> JudgerDataConfig:
        if self.eval_individuals is not None and self.eval_fraction is not None:
            raise ValueError("give eval_individuals or eval_fraction, not both")
        return self


class PahfDataConfig(StrictModel):
    run: Path = Field(description="output folder of `memrl eval pahf --domain shopping`")
    eval_users: NonNegativeInt = Field(default=1, description="users held out for eval (last by name)")


class ReflectionDataConfig(StrictModel):
    """Collab sessions (train and eval users, disjoint) -> reflection datasets in every trainer's format."""

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
    min_success: float = Field(
        default=1.0,
        gt=0,
        le=1,
        description="share of each split's sessions left to run that must finish, else the stage fails and writes "
        "no dataset (a rerun runs the failed ones again)",
    )

    @model_validator(mode="after")
    def _both_or_neither(self) -> ReflectionDataConfig:
        if bool(self.train_sessions) != bool(self.eval_sessions):
            raise ValueError("give both `train_sessions` and `eval_sessions`, or neither")
        return self


class GenerateConfig(StrictModel):
    """One completion per prompt, streamed to a JSONL file; a rerun skips prompts already answered."""

    model: str = Field(description="a key of the recipe's `models`")
    prompts: list[str] = Field(default_factory=list)
    prompts_file: Path | None = Field(default=None, description="JSONL with a 'prompt' field, or plain text lines")
    system: str | None = None
    sampling: SamplingConfig = SamplingConfig()
    output: FileName = "generations.jsonl"

    @model_validator(mode="after")
    def _has_prompts(self) -> GenerateConfig:
        if not self.prompts and self.prompts_file is None:
            raise ValueError("give `prompts` or `prompts_file`")
        return self
