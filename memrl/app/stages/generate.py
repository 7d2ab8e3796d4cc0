"""`generate`: one completion per prompt, streamed to a JSONL file; a rerun skips prompts already answered."""

from __future__ import annotations

from typing import Literal

from memrl.app.context import RunContext
from memrl.app.stages.base import StageKind
from memrl.data_gen.config import GenerateConfig


class GenerateStage(GenerateConfig):
    kind: Literal["generate"]


def run(stage: GenerateStage, ctx: RunContext, name: str) -> None:
    from memrl.data_gen.generate import generate

    out = generate(stage, ctx.backend, ctx.stage_dir(name), ctx.console, name)
    ctx.console.print(f"{name}: {len(out.done)} generations in {out.path}")


def dry_run(stage: GenerateStage, ctx: RunContext, name: str) -> list[str]:
    from memrl.data_gen.generate import read_prompts

    return [f"{len(read_prompts(stage))} prompts to model {stage.model!r}"]


KIND = StageKind(GenerateStage, run, dry_run)
