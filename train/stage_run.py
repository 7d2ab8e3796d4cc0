"""What the app tells a trainer's stage runner (`backend` of memrl.train.trl, .verl, .llamafactory) about a run: a
`StageRun`. Each runner runs a training stage and describes that run (`run(stage, where, base, data)`,
`describe(...) -> lines`).

TRL trains in-process (the app spawns the stage under accelerate on several GPUs); verl and LLaMA-Factory run a
command of their own, so `--dry-run` prints exactly what `run` executes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from memrl.train.hf_trainer import TrainContext

if TYPE_CHECKING:
    from rich.console import Console

    from memrl.train.online.config import OnlineGRPOStage

CURVES_FILE = "training_curves.png"


@dataclass(frozen=True)
class StageRun:
    """Where a stage writes, how its run is named and logged, and the run's other stages (no RunContext here)."""

    out_dir: Path
    stage: str
    recipe: str
    project: str
    wandb: bool  # recipe.logging: wandb on (offline or online), else console and file loggers only
    seed: int
    planned: frozenset[str]  # the folders of this run's stages: a stage not run yet is named by its plan
    console: Console

    @property
    def experiment(self) -> str:
        return f"{self.recipe}-{self.stage}"

    @property
    def logger(self) -> Literal["wandb", "console"]:
        return "wandb" if self.wandb else "console"

    @property
    def report_to(self) -> str:
        return "wandb" if self.wandb else "none"

    def train_context(self) -> TrainContext:
        return TrainContext(self.out_dir, self.stage, self.seed, self.report_to, self.experiment)


def sessions(stage: OnlineGRPOStage) -> str:
    """What an online GRPO stage plays, in words (both backends' description)."""
    return f"{stage.rollouts} episodes per session {stage.env.plays()}"
