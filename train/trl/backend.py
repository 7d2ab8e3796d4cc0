"""TRL: a training stage in this process (CPU, one GPU, or one rank of the `accelerate launch` the app starts).

Per stage kind an `InProcessRunner` (memrl.train.registry): `train` returns the stage's `final/`, `what` says what
it trains, in words.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from memrl.train.registry import InProcessRunner
from memrl.train.stage_run import CURVES_FILE, StageRun, sessions

if TYPE_CHECKING:
    from memrl.train.config import GRPOStage, SFTStage
    from memrl.train.online.config import OnlineGRPOStage


def _sft(stage: SFTStage, where: StageRun, base: str, data: Path) -> Path:
    from memrl.train.trl.sft import train_sft

    return train_sft(stage, base, data, where.train_context())


def _grpo(stage: GRPOStage, where: StageRun, base: str, data: Path) -> Path:
    from memrl.train.trl.grpo import train_grpo

    return train_grpo(stage, base, data, where.train_context(), where.console)


def _online(stage: OnlineGRPOStage, where: StageRun, base: str, data: Path) -> Path:
    from memrl.train.trl.online import train_online_grpo

    return train_online_grpo(stage, base, where.train_context())  # plays its own sessions: no data folder


SFT = InProcessRunner(_sft, lambda stage, base, data: f"TRL SFTTrainer on {base}, data {data / 'sft'}")
GRPO = InProcessRunner(
    _grpo, lambda stage, base, data: f"TRL GRPOTrainer from {stage.init or base}, data {data / 'rl'}"
)
ONLINE_GRPO = InProcessRunner(
    _online, lambda stage, base, data: f"TRL GRPOTrainer from {stage.init or base}: {sessions(stage)}", CURVES_FILE
)
