"""`pull_models`: prepare embedded offline models in the cache."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from memrl.app.context import RunContext
from memrl.app.stages.base import StageKind
from memrl.core import models
from memrl.core.schema import StrictModel


class PullModelsStage(StrictModel):
    """Prepare embedded offline models in the cache."""

    kind: Literal["pull_models"]
    models: list[str] = Field(min_length=1)


def run(stage: PullModelsStage, ctx: RunContext, name: str) -> None:
    for model in stage.models:
        with ctx.console.status(f"preparing {model}"):
            path = models.pull(model)
        ctx.console.print(f"{model}: {path}")


def dry_run(stage: PullModelsStage, ctx: RunContext, name: str) -> list[str]:
    return [f"memrl models pull {' '.join(stage.models)}"]


KIND = StageKind(PullModelsStage, run, dry_run)
